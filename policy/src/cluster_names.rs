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
//! Each target gets one sub-cluster (shared by every aggregate that lists it, so its
//! breaker sees all its traffic): `t~<upstream>~<model slug>~<hash8>`, where the slug is
//! the model id with every character outside `[A-Za-z0-9._-]` replaced by `_` and hash8
//! the first 8 hex digits of sha256 over `upstream \n model \n timeoutSeconds`, so two
//! targets differing only in a character the slug drops, or in their timeout, stay apart.

use sha2::{Digest, Sha256};

use crate::decide::{Decision, RouteSource};
use crate::route::route_order;
use crate::snapshot::{Routes, Snapshot};
use crate::types::Target;

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
    let policy_order = route_order(route, None, alias);
    (0..route.len())
        .map(|i| {
            let tier = route[i].priority;
            let mut names = vec![target_cluster(&route[i])];
            for o in &policy_order {
                let name = target_cluster(o.target);
                if o.index != i && o.target.priority >= tier && !names.contains(&name) {
                    names.push(name);
                }
            }
            (i, names)
        })
        .collect()
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
}
