//! cluster_names: the Envoy cluster names the xDS translator creates and the filter names
//! in `x-halo-route` (spec: Request path, steps 6 and 10).
//!
//! Both sides call these functions, so they cannot drift. One aggregate cluster exists
//! per route, alias and first pick; its name is what the filter sets in `x-halo-route`:
//!
//! | route the alias comes from         | aggregate cluster name                  |
//! |------------------------------------|-----------------------------------------|
//! | the Gateway's `models`             | `<alias>-<i>`                           |
//! | experiment variant's `routes`      | `x~<experiment>~<variant>~<alias>-<i>`  |
//! | traffic toggle's `routes`          | `g~<toggle>~<alias>-<i>`                |
//!
//! `i` is the first pick's index in the route as written in policy
//! ([`crate::route::OrderedTarget::index`]). Policy names are lowercase letters, digits,
//! `-` and `.`, so `~` never occurs inside one and the parts cannot run together; the
//! trailing `-<digits>` is unambiguous because it is always last.
//!
//! A route whose targets cannot all serve every request (say Bedrock first, Anthropic
//! second: Bedrock has no count_tokens, and only Anthropic speaks openai-responses) also
//! gets, for each set of targets some [`CallClass`] can use when that is not all of them,
//! aggregates that walk only those: `<aggregate>~only-<i>.<j>...` with the targets'
//! indices (for example `opus-1~only-1`), so a failover never lands on a target that would
//! have to refuse the call. Classes that can use the same targets share the aggregates.
//!
//! Each target gets one sub-cluster (shared by every aggregate that lists it, so its
//! breaker sees all its traffic): `t~<upstream>~<model slug>~<hash8>`, where the slug is
//! the model id with every character outside `[A-Za-z0-9._-]` replaced by `_` and hash8
//! the first 8 hex digits of sha256 over `upstream \n model \n timeoutSeconds`, so two
//! targets differing only in a character the slug drops, or in their timeout, stay apart.

use sha2::{Digest, Sha256};

use crate::admit::Operation;
use crate::decide::{Decision, RouteSource};
use crate::route::{can_serve, route_order};
use crate::snapshot::{Routes, Snapshot};
use crate::types::{Target, UpstreamKind, WireProtocol};

/// Where an alias's target list comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteScope<'a> {
    /// `Gateway.models`.
    Gateway,
    /// A traffic-axis experiment variant's `routes`.
    Variant {
        experiment: &'a str,
        variant: &'a str,
    },
    /// A traffic toggle's `routes`.
    Toggle { toggle: &'a str },
}

/// The aggregate cluster for `alias` in `scope` whose first pick is target `first_pick`
/// (its index in the route as written). The filter sets this in `x-halo-route`.
pub fn aggregate_cluster(scope: RouteScope<'_>, alias: &str, first_pick: usize) -> String {
    match scope {
        RouteScope::Gateway => format!("{alias}-{first_pick}"),
        RouteScope::Variant {
            experiment,
            variant,
        } => format!("x~{experiment}~{variant}~{alias}-{first_pick}"),
        RouteScope::Toggle { toggle } => format!("g~{toggle}~{alias}-{first_pick}"),
    }
}

/// The scope of the route a decision took (its `source`, toggle and experiment).
pub fn decision_scope(decision: &Decision) -> RouteScope<'_> {
    match (decision.source, &decision.toggle, &decision.experiment) {
        (RouteSource::Experiment, _, Some(a)) => RouteScope::Variant {
            experiment: &a.experiment,
            variant: &a.variant,
        },
        (RouteSource::Toggle, Some(t), _) => RouteScope::Toggle { toggle: t },
        _ => RouteScope::Gateway,
    }
}

/// Every route table of `snap` with its scope: the gateway's models, each experiment
/// variant's routes, each toggle's routes. Both the xDS translator and the standalone
/// bootstrap build one aggregate per (scope, alias, first pick) from this.
pub fn scoped_routes(snap: &Snapshot) -> Vec<(RouteScope<'_>, &Routes)> {
    let mut scopes: Vec<(RouteScope<'_>, &Routes)> = vec![(RouteScope::Gateway, &snap.models)];
    for e in &snap.experiments {
        for v in &e.variants {
            let scope = RouteScope::Variant {
                experiment: &e.name,
                variant: &v.name,
            };
            scopes.push((scope, &v.routes));
        }
    }
    for t in &snap.toggles {
        scopes.push((RouteScope::Toggle { toggle: &t.name }, &t.routes));
    }
    scopes
}

/// For each target index i of `route`: the sub-cluster names in failover order when i is
/// picked first: i, the rest of its tier in policy order, then later tiers in policy
/// order. Earlier tiers are left out: the filter only picks a later tier first when the
/// earlier ones cannot serve the request. A target listed twice appears once.
pub fn failover_orders(route: &[Target], alias: &str) -> Vec<(usize, Vec<String>)> {
    failover_orders_where(route, alias, &vec![true; route.len()])
}

/// [`failover_orders`] over the targets whose `keep` is true only (first picks included).
fn failover_orders_where(
    route: &[Target],
    alias: &str,
    keep: &[bool],
) -> Vec<(usize, Vec<String>)> {
    (0..route.len())
        .filter(|&i| keep.get(i).copied().unwrap_or(false))
        .map(|i| {
            let names = failover_indices(route, alias, keep, i)
                .into_iter()
                .map(|j| target_cluster(&route[j]))
                .collect();
            (i, names)
        })
        .collect()
}

/// The failover order of the aggregate led by `first_pick` over the targets whose `keep`
/// is true, as indices into `route`: the order Envoy walks, attempt k on the k-th (the
/// filter's breakers read which target each attempt went to from it). A target listed
/// twice appears once, at its first place.
pub fn failover_indices(
    route: &[Target],
    alias: &str,
    keep: &[bool],
    first_pick: usize,
) -> Vec<usize> {
    let Some(first) = route.get(first_pick) else {
        return Vec::new();
    };
    let kept = |i: usize| keep.get(i).copied().unwrap_or(false);
    let mut order = vec![first_pick];
    for o in route_order(route, None, alias) {
        if o.index != first_pick
            && kept(o.index)
            && o.target.priority >= first.priority
            && !order.iter().any(|&j| same_cluster(&route[j], o.target))
        {
            order.push(o.index);
        }
    }
    order
}

/// What decides which targets can serve a call: the client's wire, and whether the call
/// is a count_tokens (Bedrock and Vertex have none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallClass {
    pub wire: WireProtocol,
    pub count_tokens: bool,
}

impl CallClass {
    /// Every class, in a fixed order.
    pub const ALL: [CallClass; 8] = {
        use WireProtocol as W;
        const fn c(wire: WireProtocol, count_tokens: bool) -> CallClass {
            CallClass { wire, count_tokens }
        }
        [
            c(W::AnthropicMessages, false),
            c(W::AnthropicMessages, true),
            c(W::OpenaiResponses, false),
            c(W::OpenaiResponses, true),
            c(W::BedrockInvoke, false),
            c(W::BedrockInvoke, true),
            c(W::Gemini, false),
            c(W::Gemini, true),
        ]
    };

    /// The class of a call admit accepted.
    pub fn of(wire: WireProtocol, operation: Operation) -> CallClass {
        CallClass {
            wire,
            count_tokens: operation == Operation::CountTokens,
        }
    }

    /// Whether `target` can serve calls of this class: its upstream kind speaks the wire,
    /// and has a count_tokens when the call is one.
    pub fn serves(self, snap: &Snapshot, target: &Target) -> bool {
        can_serve(snap, target, self.wire)
            && !(self.count_tokens
                && snap.upstreams.get(&target.upstream).is_some_and(|u| {
                    matches!(u.kind, UpstreamKind::Bedrock | UpstreamKind::Vertex)
                }))
    }
}

/// Every aggregate cluster of `route` (the alias `alias` in `scope`): (name, first pick,
/// sub-clusters in failover order). The untagged ones walk every target; for each set of
/// targets a [`CallClass`] can use, when that is some but not all of them,
/// `<name>~only-<indices>` ones walk only those. The xDS translator and the standalone
/// bootstrap render exactly these.
pub fn route_aggregates(
    snap: &Snapshot,
    scope: RouteScope<'_>,
    alias: &str,
    route: &[Target],
) -> Vec<(String, usize, Vec<String>)> {
    let mut out: Vec<(String, usize, Vec<String>)> = failover_orders(route, alias)
        .into_iter()
        .map(|(i, names)| (aggregate_cluster(scope, alias, i), i, names))
        .collect();
    let mut subsets: Vec<Vec<bool>> = Vec::new();
    for class in CallClass::ALL {
        let keep: Vec<bool> = route.iter().map(|t| class.serves(snap, t)).collect();
        if keep.iter().all(|k| *k) || !keep.iter().any(|k| *k) || subsets.contains(&keep) {
            continue;
        }
        for (i, names) in failover_orders_where(route, alias, &keep) {
            let name = format!(
                "{}~{}",
                aggregate_cluster(scope, alias, i),
                subset_tag(&keep)
            );
            out.push((name, i, names));
        }
        subsets.push(keep);
    }
    out
}

/// `only-<i>.<j>...`: the indices of the kept targets.
fn subset_tag(keep: &[bool]) -> String {
    let indices: Vec<String> = keep
        .iter()
        .enumerate()
        .filter(|(_, k)| **k)
        .map(|(i, _)| i.to_string())
        .collect();
    format!("only-{}", indices.join("."))
}

/// The aggregate the filter names for a call of `class` to `alias` in `scope` whose first
/// pick is `first_pick`: one of [`route_aggregates`].
pub fn call_aggregate(
    snap: &Snapshot,
    scope: RouteScope<'_>,
    alias: &str,
    route: &[Target],
    first_pick: usize,
    class: CallClass,
) -> String {
    let name = aggregate_cluster(scope, alias, first_pick);
    let keep: Vec<bool> = route.iter().map(|t| class.serves(snap, t)).collect();
    if keep.iter().all(|k| *k) {
        name
    } else {
        format!("{name}~{}", subset_tag(&keep))
    }
}

/// Whether `a` and `b` have one sub-cluster ([`target_cluster`] hashes exactly these).
fn same_cluster(a: &Target, b: &Target) -> bool {
    a.upstream == b.upstream && a.model == b.model && a.timeout_seconds == b.timeout_seconds
}

/// The one-endpoint sub-cluster of `target`.
pub fn target_cluster(target: &Target) -> String {
    let slug: String = target
        .model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let timeout = target
        .timeout_seconds
        .map(|t| t.to_string())
        .unwrap_or_default();
    let digest = Sha256::digest(format!("{}\n{}\n{timeout}", target.upstream, target.model));
    let hash8 = hex::encode(&digest[..4]);
    format!("t~{}~{slug}~{hash8}", target.upstream)
}

/// The key of a target endpoint's `filter_metadata.halo` that holds [`EndpointFacts`]
/// as one JSON string.
pub const ENDPOINT_FACTS_KEY: &str = "attempt";

/// What the filter's per-attempt stage needs to know about the endpoint Envoy picked,
/// written by both renderers into the endpoint metadata under [`ENDPOINT_FACTS_KEY`].
///
/// One JSON string rather than one metadata key per field because each key is a separate
/// property call out of the wasm VM, and each call costs about a microsecond of host
/// plumbing on every attempt; the separate keys stay for operators and Envoy's formatters.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointFacts {
    /// The target's model id.
    pub model: String,
    /// The upstream's kind (`anthropic`, `bedrock`, ...).
    pub kind: String,
    /// The host Envoy's `auto_host_rewrite` writes after the upstream filters.
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
}

impl EndpointFacts {
    /// The facts of a target of `upstream` serving `model`, whose URL's host is `host`:
    /// the gateway plan writes them on the target's endpoint; a shadow job is built from
    /// them as an attempt on that endpoint would be.
    pub fn of(upstream: &crate::types::Upstream, model: &str, host: &str) -> EndpointFacts {
        EndpointFacts {
            model: model.to_string(),
            kind: upstream.kind.as_str().to_string(),
            host: host.to_string(),
            region: upstream.region.clone(),
            project: upstream.project.clone(),
            api_version: upstream.api_version.clone(),
        }
    }

    /// The metadata value.
    pub fn encode(&self) -> String {
        // A struct of strings always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Read a value written by [`EndpointFacts::encode`]; `None` for anything else.
    pub fn decode(value: &[u8]) -> Option<EndpointFacts> {
        serde_json::from_slice(value).ok()
    }

    /// How [`EndpointFacts::encode`]'s value starts: its model and kind, the two facts an
    /// attempt that passes a request on unchanged depends on. The per-attempt stage
    /// compares this with the endpoint's value instead of decoding it on the common first
    /// attempt. If the stage's plan ever reads another field to decide whether to change
    /// a request, that field belongs here too (halo-filter's `attempt` tests check the
    /// shortcut against the plan).
    pub fn identity(&self) -> String {
        let mut out = Vec::new();
        self.write_identity(&mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// [`EndpointFacts::identity`], appended to `out`.
    pub fn write_identity(&self, out: &mut Vec<u8>) {
        // The same serializer and field order as `encode`; a test holds them together.
        // Writing a string into a Vec cannot fail.
        out.extend_from_slice(br#"{"model":"#);
        let _ = serde_json::to_writer(&mut *out, &self.model);
        out.extend_from_slice(br#","kind":"#);
        let _ = serde_json::to_writer(&mut *out, &self.kind);
        out.push(b',');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(upstream: &str, model: &str, timeout: Option<u32>) -> Target {
        Target {
            upstream: upstream.into(),
            model: model.into(),
            weight: None,
            priority: 0,
            timeout_seconds: timeout,
        }
    }

    #[test]
    fn aggregate_names_per_scope() {
        assert_eq!(aggregate_cluster(RouteScope::Gateway, "opus", 2), "opus-2");
        assert_eq!(
            aggregate_cluster(
                RouteScope::Variant {
                    experiment: "e1",
                    variant: "treatment"
                },
                "opus",
                0
            ),
            "x~e1~treatment~opus-0"
        );
        assert_eq!(
            aggregate_cluster(RouteScope::Toggle { toggle: "t.x" }, "a-1", 10),
            "g~t.x~a-1-10"
        );
    }

    #[test]
    fn a_class_that_cannot_use_every_target_gets_aggregates_that_skip_the_others() {
        let doc = serde_json::json!({
            "schema": 1, "org": "o", "protocols": {}, "rings": [], "experiments": [], "toggles": [],
            "upstreams": {
                "bedrock": {"url": "https://bedrock-runtime.us-east-1.amazonaws.com", "kind": "bedrock", "region": "us-east-1"},
                "anthropic": {"url": "https://api.anthropic.com", "kind": "anthropic"},
            },
            "models": {"opus": [
                {"upstream": "bedrock", "model": "b"},
                {"upstream": "anthropic", "model": "a", "priority": 1},
            ]},
        });
        let snap = Snapshot::from_bytes(doc.to_string().as_bytes()).expect("snapshot");
        let route = &snap.models["opus"];
        let (b, a) = (target_cluster(&route[0]), target_cluster(&route[1]));
        let aggs = route_aggregates(&snap, RouteScope::Gateway, "opus", route);
        let find = |name: &str| {
            aggs.iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, i, c)| (*i, c.clone()))
        };
        // Messages: both serve; Bedrock first, Anthropic after it.
        assert_eq!(find("opus-0"), Some((0, vec![b.clone(), a.clone()])));
        // count_tokens: Bedrock has none, so its aggregate walks Anthropic only.
        assert_eq!(find("opus-1~only-1"), Some((1, vec![a.clone()])));
        assert_eq!(find("opus-0~only-1"), None);
        // openai-responses can use Anthropic only too: the same aggregate. gemini: nobody.
        assert_eq!(aggs.len(), 3, "{aggs:?}");
        // The filter names the same ones.
        let messages = CallClass::of(WireProtocol::AnthropicMessages, Operation::Messages);
        let count = CallClass::of(WireProtocol::AnthropicMessages, Operation::CountTokens);
        assert_eq!(
            call_aggregate(&snap, RouteScope::Gateway, "opus", route, 0, messages),
            "opus-0"
        );
        assert_eq!(
            call_aggregate(&snap, RouteScope::Gateway, "opus", route, 1, count),
            "opus-1~only-1"
        );
    }

    #[test]
    fn target_names_are_readable_stable_and_distinct() {
        let arn = "arn:aws:bedrock:us-east-1:1:inference-profile/us.anthropic.claude";
        let a = target_cluster(&target("bedrock", arn, None));
        assert!(a.starts_with("t~bedrock~arn_aws_bedrock_us-east-1_1_inference-profile_us."));
        assert_eq!(a, target_cluster(&target("bedrock", arn, None)));
        // Same slug, different model; same model, different timeout: different names.
        assert_ne!(
            target_cluster(&target("u", "a:b", None)),
            target_cluster(&target("u", "a/b", None))
        );
        assert_ne!(
            target_cluster(&target("u", "m", None)),
            target_cluster(&target("u", "m", Some(30)))
        );
        assert_eq!(
            target_cluster(&target("anthropic", "claude-opus-4", None)),
            format!(
                "t~anthropic~claude-opus-4~{}",
                &hex::encode(Sha256::digest("anthropic\nclaude-opus-4\n"))[..8]
            )
        );
    }

    #[test]
    fn endpoint_facts_round_trip_and_refuse_anything_else() {
        let facts = EndpointFacts {
            model: "us.anthropic.claude:0".into(),
            kind: "bedrock".into(),
            host: "bedrock-runtime.us-east-1.amazonaws.com".into(),
            region: Some("us-east-1".into()),
            project: None,
            api_version: None,
        };
        let encoded = facts.encode();
        assert!(!encoded.contains("project"), "absent fields are left out");
        assert_eq!(EndpointFacts::decode(encoded.as_bytes()), Some(facts));
        for bad in [
            &b""[..],
            b"{}",
            b"{\"model\":\"m\",\"kind\":\"k\",\"host\":\"h\",\"x\":1}",
        ] {
            assert_eq!(EndpointFacts::decode(bad), None);
        }
    }

    #[test]
    fn the_identity_is_how_the_value_starts_and_names_one_model_and_kind() {
        let facts = |model: &str, kind: &str| EndpointFacts {
            model: model.into(),
            kind: kind.into(),
            host: "h".into(),
            region: Some("r".into()),
            ..EndpointFacts::default()
        };
        let all = [
            facts("m", "anthropic"),
            facts("m", "bedrock"),
            facts("m2", "anthropic"),
            facts(r#"m","kind":"bedrock"#, "anthropic"),
            facts("", "anthropic"),
        ];
        for a in &all {
            for b in &all {
                let same = a.model == b.model && a.kind == b.kind;
                assert_eq!(b.encode().starts_with(&a.identity()), same, "{a:?} / {b:?}");
            }
        }
    }
}
