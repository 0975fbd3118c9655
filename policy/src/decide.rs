//! decide: who the caller is in policy terms (ring, toggle, experiment, variant, shadow)
//! and which targets serve the alias they asked for (spec: Request path, step 5).
//!
//! Everything reads the compiled [`Snapshot`] after the kill list was applied, and only the
//! verified subject: never a client header. The order is:
//!
//! 1. Ring: the first ring (in resolution order) the subject is in; see [`resolve_ring`].
//! 2. Gateway route for the alias.
//! 3. Traffic toggles: the first by name that is on for the subject and routes the alias
//!    replaces the route.
//! 4. Traffic experiments (ab, canary) that are running, enroll the ring and have a variant
//!    routing the alias "concern" the request. The first by name whose assigned variant
//!    routes the alias replaces the route and is attributed. When none routes (the subject
//!    is in a control arm everywhere), the first concerning experiment by name is
//!    attributed without routing: that request is its control evidence. An experiment
//!    with no variant for this alias is never attributed, so canaries on different aliases
//!    each claim only their own alias.
//! 5. Otherwise the first running client-axis experiment by name enrolling the ring is
//!    attributed (its variant changes the harness on the machine, so every request is its
//!    evidence); it never routes.
//! 6. Shadow: the first running shadow experiment by name enrolling the ring whose assigned
//!    variant routes the alias names the mirror targets. Weights sample who is mirrored: a
//!    subject assigned a variant without routes (control) is not mirrored. Shadow never
//!    changes the route and is not the attributed experiment: the served answer is not
//!    its treatment.
//!
//! Experiments whose status is not `running` (a kill sets `paused`) are ignored entirely.
//! Anonymous callers (allowAnonymous) get ring `unknown` and the gateway route only.
//!
//! "First by name" and "first in resolution order" are computed as minimums, so the answer
//! does not depend on how the snapshot's lists happen to be ordered.

use serde::Serialize;

use crate::assign;
use crate::snapshot::{
    Routes, Snapshot, SnapshotExperiment, SnapshotRing, SnapshotToggle, SnapshotVariant,
};
use crate::types::{
    Axis, Effect, ExperimentStatus, ExperimentType, ShadowTurns, Target, ToggleRule,
};

/// The ring name stamped when the caller is anonymous or matches no ring.
pub const UNKNOWN_RING: &str = "unknown";

/// A verified identity: the user claim and the groups claim, as the verifier returned them.
/// Matching is exact (no case folding): the IdP's spelling is the identity.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Subject {
    pub user: String,
    pub groups: Vec<String>,
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Verified(Subject),
    /// Verification failed and allowAnonymous downgraded it: ring `unknown`, no toggles,
    /// no experiments, gateway routing.
    Anonymous,
}

/// The experiment a request counts for, and its arm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Attribution {
    pub experiment: String,
    pub variant: String,
    pub axis: Axis,
    /// Whether this experiment's variant chose the targets.
    pub routed: bool,
}

/// Where a copy of this request is mirrored (shadow experiments).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShadowMirror {
    pub experiment: String,
    pub variant: String,
    /// The shadow variant's targets for this alias.
    pub targets: Vec<Target>,
    /// Which steps of a session are mirrored.
    pub turns: ShadowTurns,
}

/// Which layer chose the targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouteSource {
    Gateway,
    Toggle,
    Experiment,
}

impl RouteSource {
    /// The name metrics and logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteSource::Gateway => "gateway",
            RouteSource::Toggle => "toggle",
            RouteSource::Experiment => "experiment",
        }
    }
}

/// The per-request decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub alias: String,
    /// The resolved ring, or [`UNKNOWN_RING`].
    pub ring: String,
    /// The ring's pinned release, if any (stamped as x-halo-release).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    /// The traffic toggle whose route this request takes; `None` when no toggle applies
    /// or an experiment variant overrode it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub toggle: Option<String>,
    /// The experiment and variant this request counts for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experiment: Option<Attribution>,
    /// Where a copy is mirrored, if a shadow experiment samples this subject.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowMirror>,
    /// Which layer chose `targets`.
    pub source: RouteSource,
    /// The alias's targets in policy order (empty when nothing routes the alias).
    pub targets: Vec<Target>,
}

impl Subject {
    pub fn new(user: impl Into<String>, groups: &[&str]) -> Subject {
        Subject {
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    fn in_any_group(&self, groups: &[String]) -> bool {
        self.groups.iter().any(|g| groups.contains(g))
    }
}

/// The subject's ring: the first ring in resolution order whose users or groups name the
/// subject, or whose `percent` takes the user (opt-in rings match only explicit users and
/// groups); otherwise the ring marked `default`; otherwise none.
pub fn resolve_ring<'a>(snap: &'a Snapshot, subject: &Subject) -> Option<&'a SnapshotRing> {
    let matches = |ring: &SnapshotRing| {
        let m = &ring.membership;
        m.users.contains(&subject.user)
            || subject.in_any_group(&m.groups)
            || (!m.opt_in
                && m.percent
                    .is_some_and(|p| assign::in_ring_percent(&ring.name, &subject.user, p)))
    };
    snap.rings
        .iter()
        .filter(|r| matches(r))
        .min_by(|a, b| ring_order(a, b))
        .or_else(|| {
            snap.rings
                .iter()
                .filter(|r| r.membership.default)
                .min_by(|a, b| ring_order(a, b))
        })
}

fn ring_order(a: &SnapshotRing, b: &SnapshotRing) -> std::cmp::Ordering {
    a.order.cmp(&b.order).then_with(|| a.name.cmp(&b.name))
}

/// Whether a traffic toggle is on for the subject in `ring`: the first rule all of whose
/// stated conditions hold decides by its effect; with no matching rule, the default.
pub fn toggle_is_on(toggle: &SnapshotToggle, subject: &Subject, ring: Option<&str>) -> bool {
    rules_decide(&toggle.name, toggle.default, &toggle.rules, subject, ring)
}

/// Whether a client toggle (as a release manifest carries it) is on for the subject in
/// `ring`. halod evaluates client toggles on the device with the very rule the gateway
/// uses for traffic toggles.
pub fn client_toggle_is_on(toggle: &crate::Toggle, subject: &Subject, ring: Option<&str>) -> bool {
    rules_decide(&toggle.name, toggle.default, &toggle.rules, subject, ring)
}

/// The toggle rule: the first rule all of whose stated conditions hold decides by its
/// effect; with no matching rule, `default`.
pub fn rules_decide(
    name: &str,
    default: bool,
    rules: &[ToggleRule],
    subject: &Subject,
    ring: Option<&str>,
) -> bool {
    rules
        .iter()
        .find(|rule| rule_matches(rule, name, subject, ring))
        .map_or(default, |rule| rule.effect == Effect::On)
}

fn rule_matches(rule: &ToggleRule, toggle: &str, subject: &Subject, ring: Option<&str>) -> bool {
    let ring_ok = rule.rings.is_empty() || ring.is_some_and(|r| rule.rings.iter().any(|x| x == r));
    let groups_ok = rule.groups.is_empty() || subject.in_any_group(&rule.groups);
    let users_ok = rule.users.is_empty() || rule.users.contains(&subject.user);
    let percent_ok = rule
        .percent
        .is_none_or(|p| assign::in_toggle_percent(toggle, &subject.user, p));
    ring_ok && groups_ok && users_ok && percent_ok
}

/// The variant index the subject is assigned in `experiment` (same hash as halod's).
pub fn assigned_variant(experiment: &SnapshotExperiment, user: &str) -> Option<usize> {
    let weights: Vec<u32> = experiment.variants.iter().map(|v| v.weight).collect();
    assign::variant(&experiment.salt, user, &weights)
}

/// The variant the user is assigned in `experiment`, if its weights assign any.
fn variant_for<'e>(experiment: &'e SnapshotExperiment, user: &str) -> Option<&'e SnapshotVariant> {
    assigned_variant(experiment, user).and_then(|i| experiment.variants.get(i))
}

fn routes_alias<'r>(routes: &'r Routes, alias: &str) -> Option<&'r Vec<Target>> {
    routes.get(alias).filter(|targets| !targets.is_empty())
}

/// Decide ring, toggle, experiment, shadow and targets for one request for `alias`.
pub fn decide(snap: &Snapshot, caller: &Caller, alias: &str) -> Decision {
    let gateway_targets = snap.models.get(alias).cloned().unwrap_or_default();
    let subject = match caller {
        Caller::Verified(subject) => subject,
        Caller::Anonymous => {
            return Decision {
                alias: alias.to_string(),
                ring: UNKNOWN_RING.to_string(),
                release: None,
                toggle: None,
                experiment: None,
                shadow: None,
                source: RouteSource::Gateway,
                targets: gateway_targets,
            };
        }
    };

    let ring = resolve_ring(snap, subject);
    let ring_name = ring.map(|r| r.name.as_str());
    let mut decision = Decision {
        alias: alias.to_string(),
        ring: ring_name.unwrap_or(UNKNOWN_RING).to_string(),
        release: ring.and_then(|r| r.release.clone()),
        toggle: None,
        experiment: None,
        shadow: None,
        source: RouteSource::Gateway,
        targets: gateway_targets,
    };

    // Traffic toggles: the first by name that routes this alias and is on.
    let toggle = snap
        .toggles
        .iter()
        .filter(|t| routes_alias(&t.routes, alias).is_some())
        .filter(|t| toggle_is_on(t, subject, ring_name))
        .min_by(|a, b| a.name.cmp(&b.name));
    if let Some(toggle) = toggle
        && let Some(targets) = routes_alias(&toggle.routes, alias)
    {
        decision.toggle = Some(toggle.name.clone());
        decision.source = RouteSource::Toggle;
        decision.targets = targets.clone();
    }

    let Some(ring_name) = ring_name else {
        // No ring, no enrollment: experiments all enroll by ring.
        return decision;
    };
    let enrolled = |e: &&SnapshotExperiment| {
        e.status == ExperimentStatus::Running && e.rings.iter().any(|r| r == ring_name)
    };

    // Traffic experiments that concern this alias, with the subject's variant.
    let mut concerning: Vec<_> = snap
        .experiments
        .iter()
        .filter(enrolled)
        .filter(|e| e.axis == Axis::Traffic)
        .filter(|e| {
            matches!(
                e.experiment_type,
                ExperimentType::Ab | ExperimentType::Canary
            )
        })
        .filter(|e| {
            e.variants
                .iter()
                .any(|v| routes_alias(&v.routes, alias).is_some())
        })
        .filter_map(|e| variant_for(e, &subject.user).map(|v| (e, v)))
        .collect();
    concerning.sort_by(|(a, _), (b, _)| a.name.cmp(&b.name));
    let routing = concerning
        .iter()
        .find_map(|(e, v)| routes_alias(&v.routes, alias).map(|targets| (e, v, targets)));
    if let Some((experiment, variant, targets)) = routing {
        decision.toggle = None;
        decision.source = RouteSource::Experiment;
        decision.targets = targets.clone();
        decision.experiment = Some(Attribution {
            experiment: experiment.name.clone(),
            variant: variant.name.clone(),
            axis: Axis::Traffic,
            routed: true,
        });
    } else if let Some((experiment, variant)) = concerning.first() {
        decision.experiment = Some(Attribution {
            experiment: experiment.name.clone(),
            variant: variant.name.clone(),
            axis: Axis::Traffic,
            routed: false,
        });
    } else if let Some((experiment, variant)) = snap
        .experiments
        .iter()
        .filter(enrolled)
        .filter(|e| e.axis == Axis::Client && e.experiment_type != ExperimentType::Shadow)
        .filter_map(|e| variant_for(e, &subject.user).map(|v| (e, v)))
        .min_by(|(a, _), (b, _)| a.name.cmp(&b.name))
    {
        decision.experiment = Some(Attribution {
            experiment: experiment.name.clone(),
            variant: variant.name.clone(),
            axis: Axis::Client,
            routed: false,
        });
    }

    decision.shadow = snap
        .experiments
        .iter()
        .filter(enrolled)
        .filter(|e| e.experiment_type == ExperimentType::Shadow)
        .filter_map(|e| {
            let variant = variant_for(e, &subject.user)?;
            let targets = routes_alias(&variant.routes, alias)?;
            Some((e, variant, targets))
        })
        .min_by(|(a, ..), (b, ..)| a.name.cmp(&b.name))
        .map(|(e, variant, targets)| ShadowMirror {
            experiment: e.name.clone(),
            variant: variant.name.clone(),
            targets: targets.clone(),
            turns: e.shadow_turns.unwrap_or_default(),
        });

    decision
}

/// A snapshot builder for tests across the crate (decide, admit, route).
#[cfg(test)]
pub(crate) mod testkit {
    use std::collections::BTreeMap;

    use crate::snapshot::{
        SNAPSHOT_SCHEMA, Snapshot, SnapshotExperiment, SnapshotRing, SnapshotToggle,
        SnapshotVariant,
    };
    use crate::types::{
        Axis, Effect, ExperimentStatus, ExperimentType, Harness, Membership, ShadowTurns, Target,
        ToggleRule, Upstream, UpstreamKind,
    };

    /// A variant for [`SnapBuilder::experiment`]: (name, weight, routes by alias).
    pub type VariantSpec<'a> = (&'a str, u32, Vec<(&'a str, Vec<Target>)>);

    pub fn target(upstream: &str, model: &str) -> Target {
        Target {
            upstream: upstream.into(),
            model: model.into(),
            ..Target::default()
        }
    }

    pub fn weighted(upstream: &str, model: &str, weight: u32, priority: u32) -> Target {
        Target {
            upstream: upstream.into(),
            model: model.into(),
            weight: Some(weight),
            priority,
            timeout_seconds: None,
        }
    }

    pub fn rule(effect: Effect) -> ToggleRule {
        ToggleRule {
            rings: vec![],
            groups: vec![],
            users: vec![],
            percent: None,
            effect,
        }
    }

    pub fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    /// Starts with upstreams `anthropic` (anthropic), `bedrock` (bedrock), `gemini`
    /// (gemini), `azure` (azure-openai), default wires, and alias `sonnet` ->
    /// anthropic/claude-sonnet.
    pub struct SnapBuilder {
        pub snap: Snapshot,
    }

    impl SnapBuilder {
        pub fn new() -> SnapBuilder {
            let upstream = |kind| Upstream {
                url: "https://upstream.example".into(),
                kind,
                region: None,
                project: None,
                api_version: None,
                credential: None,
            };
            let snap = Snapshot {
                schema: SNAPSHOT_SCHEMA,
                org: "acme".into(),
                identity: None,
                protocols: Harness::ALL
                    .into_iter()
                    .map(|h| (h, h.default_protocol()))
                    .collect(),
                upstreams: BTreeMap::from([
                    ("anthropic".into(), upstream(UpstreamKind::Anthropic)),
                    ("bedrock".into(), upstream(UpstreamKind::Bedrock)),
                    ("gemini".into(), upstream(UpstreamKind::Gemini)),
                    ("azure".into(), upstream(UpstreamKind::AzureOpenai)),
                ]),
                models: BTreeMap::from([(
                    "sonnet".into(),
                    vec![target("anthropic", "claude-sonnet")],
                )]),
                rings: vec![],
                experiments: vec![],
                toggles: vec![],
                prices: Default::default(),
                budgets: Default::default(),
                budget_service: None,
            };
            SnapBuilder { snap }
        }

        pub fn model(mut self, alias: &str, targets: Vec<Target>) -> Self {
            self.snap.models.insert(alias.into(), targets);
            self
        }

        pub fn ring(mut self, name: &str, order: u32, membership: Membership) -> Self {
            self.snap.rings.push(SnapshotRing {
                name: name.into(),
                order,
                release: None,
                membership,
            });
            self
        }

        pub fn toggle(
            mut self,
            name: &str,
            default: bool,
            rules: Vec<ToggleRule>,
            routes: &[(&str, Vec<Target>)],
        ) -> Self {
            self.snap.toggles.push(SnapshotToggle {
                name: name.into(),
                default,
                rules,
                routes: routes
                    .iter()
                    .map(|(a, t)| (a.to_string(), t.clone()))
                    .collect(),
            });
            self
        }

        /// A running experiment; variants are (name, weight, routes).
        pub fn experiment(
            mut self,
            name: &str,
            experiment_type: ExperimentType,
            axis: Axis,
            rings: &[&str],
            variants: Vec<VariantSpec<'_>>,
        ) -> Self {
            self.snap.experiments.push(SnapshotExperiment {
                name: name.into(),
                experiment_type,
                axis,
                status: ExperimentStatus::Running,
                rings: strings(rings),
                salt: format!("{name}-salt"),
                variants: variants
                    .into_iter()
                    .map(|(n, weight, routes)| SnapshotVariant {
                        name: n.into(),
                        weight,
                        routes: routes
                            .into_iter()
                            .map(|(a, t)| (a.to_string(), t))
                            .collect(),
                    })
                    .collect(),
                shadow_turns: (experiment_type == ExperimentType::Shadow)
                    .then_some(ShadowTurns::First),
            });
            self
        }

        pub fn build(self) -> Snapshot {
            self.snap
        }
    }

    pub fn members(users: &[&str], groups: &[&str]) -> Membership {
        Membership {
            users: strings(users),
            groups: strings(groups),
            ..Membership::default()
        }
    }

    pub fn percent(p: u32) -> Membership {
        Membership {
            percent: Some(p),
            ..Membership::default()
        }
    }

    pub fn default_ring() -> Membership {
        Membership {
            default: true,
            ..Membership::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testkit::*;
    use super::*;
    use crate::types::{ExperimentStatus, Membership};

    fn alice() -> Caller {
        Caller::Verified(Subject::new("alice@acme.com", &["eng"]))
    }

    fn user(name: &str) -> Subject {
        Subject::new(name, &[])
    }

    /// The first user (user0@acme.com, user1@…) for whom `pred` holds.
    fn find_user(pred: impl Fn(&str) -> bool) -> String {
        (0..100_000)
            .map(|n| format!("user{n}@acme.com"))
            .find(|u| pred(u))
            .expect("some user satisfies the predicate")
    }

    fn rings() -> Snapshot {
        SnapBuilder::new()
            .ring("dogfood", 0, members(&["alice@acme.com"], &["halos-team"]))
            .ring("canary", 1, percent(10))
            .ring(
                "beta",
                2,
                Membership {
                    opt_in: true,
                    percent: Some(100),
                    ..members(&["bob@acme.com"], &[])
                },
            )
            .ring("stable", 3, default_ring())
            .build()
    }

    fn ring_of(snap: &Snapshot, subject: &Subject) -> Option<String> {
        resolve_ring(snap, subject).map(|r| r.name.clone())
    }

    #[test]
    fn ring_by_user_then_group_then_percent_then_default() {
        let snap = rings();
        assert_eq!(
            ring_of(&snap, &user("alice@acme.com")).as_deref(),
            Some("dogfood")
        );
        let member = Subject::new("zed@acme.com", &["sales", "halos-team"]);
        assert_eq!(ring_of(&snap, &member).as_deref(), Some("dogfood"));
        let in_canary = find_user(|u| assign::in_ring_percent("canary", u, 10));
        assert_eq!(ring_of(&snap, &user(&in_canary)).as_deref(), Some("canary"));
        let out = find_user(|u| !assign::in_ring_percent("canary", u, 10));
        assert_eq!(ring_of(&snap, &user(&out)).as_deref(), Some("stable"));
    }

    #[test]
    fn an_earlier_ring_wins_over_a_later_explicit_membership() {
        let snap = SnapBuilder::new()
            .ring("late", 5, members(&["alice@acme.com"], &[]))
            .ring("early", 1, members(&[], &["eng"]))
            .build();
        // Listed late-first: resolution follows `order`, not the list.
        let alice = Subject::new("alice@acme.com", &["eng"]);
        assert_eq!(ring_of(&snap, &alice).as_deref(), Some("early"));
    }

    #[test]
    fn opt_in_rings_take_only_explicit_members() {
        let snap = rings();
        // beta is opt-in with percent 100: bob (listed) is in, everyone else falls through.
        assert_eq!(
            ring_of(&snap, &user("bob@acme.com")).as_deref(),
            Some("beta")
        );
        let out = find_user(|u| !assign::in_ring_percent("canary", u, 10));
        assert_eq!(ring_of(&snap, &user(&out)).as_deref(), Some("stable"));
    }

    #[test]
    fn no_matching_ring_and_no_default_is_unknown() {
        let snap = SnapBuilder::new()
            .ring("dogfood", 0, members(&["alice@acme.com"], &[]))
            .build();
        assert!(resolve_ring(&snap, &user("bob@acme.com")).is_none());
        let d = decide(&snap, &Caller::Verified(user("bob@acme.com")), "sonnet");
        assert_eq!(d.ring, UNKNOWN_RING);
        assert_eq!(d.targets, vec![target("anthropic", "claude-sonnet")]);
    }

    #[test]
    fn gateway_route_and_ring_release() {
        let mut snap = rings();
        snap.rings[0].release = Some("sha256:abc".into());
        let d = decide(&snap, &alice(), "sonnet");
        assert_eq!(d.ring, "dogfood");
        assert_eq!(d.release.as_deref(), Some("sha256:abc"));
        assert_eq!(d.source, RouteSource::Gateway);
        assert_eq!(d.targets, vec![target("anthropic", "claude-sonnet")]);
        assert_eq!((d.toggle, d.experiment, d.shadow), (None, None, None));
        // An alias nothing routes has no targets.
        assert!(decide(&snap, &alice(), "nope").targets.is_empty());
    }

    fn fast() -> Vec<Target> {
        vec![target("bedrock", "fast-sonnet")]
    }

    #[test]
    fn toggle_rules_first_match_decides() {
        let off_for_alice = ToggleRule {
            users: strings(&["alice@acme.com"]),
            ..rule(Effect::Off)
        };
        let on_for_eng = ToggleRule {
            groups: strings(&["eng"]),
            ..rule(Effect::On)
        };
        let snap = SnapBuilder::new()
            .ring("all", 0, default_ring())
            .toggle(
                "fast",
                false,
                vec![off_for_alice, on_for_eng],
                &[("sonnet", fast())],
            )
            .build();
        // alice is in eng, but the first rule (off for alice) decides.
        let d = decide(&snap, &alice(), "sonnet");
        assert_eq!(d.toggle, None);
        assert_eq!(d.targets, vec![target("anthropic", "claude-sonnet")]);
        // carol in eng: the second rule turns it on.
        let carol = Caller::Verified(Subject::new("carol@acme.com", &["eng"]));
        let d = decide(&snap, &carol, "sonnet");
        assert_eq!(d.toggle.as_deref(), Some("fast"));
        assert_eq!(d.source, RouteSource::Toggle);
        assert_eq!(d.targets, fast());
        // dave matches no rule: the default (off).
        let d = decide(&snap, &Caller::Verified(user("dave@acme.com")), "sonnet");
        assert_eq!(d.toggle, None);
    }

    #[test]
    fn toggle_rule_needs_every_stated_condition() {
        let snap = SnapBuilder::new()
            .ring(
                "dogfood",
                0,
                members(&["alice@acme.com", "bob@acme.com"], &[]),
            )
            .ring("stable", 1, default_ring())
            .toggle(
                "fast",
                false,
                vec![ToggleRule {
                    rings: strings(&["dogfood"]),
                    groups: strings(&["eng"]),
                    ..rule(Effect::On)
                }],
                &[("sonnet", fast())],
            )
            .build();
        let t = &snap.toggles[0];
        let eng = Subject::new("alice@acme.com", &["eng"]);
        let not_eng = Subject::new("bob@acme.com", &["sales"]);
        let eng_stable = Subject::new("carol@acme.com", &["eng"]);
        assert!(toggle_is_on(t, &eng, Some("dogfood")));
        assert!(!toggle_is_on(t, &not_eng, Some("dogfood")), "group missing");
        assert!(
            !toggle_is_on(t, &eng_stable, Some("stable")),
            "ring missing"
        );
        assert!(
            !toggle_is_on(t, &eng, None),
            "no ring never matches a ring condition"
        );
        assert_eq!(
            decide(&snap, &Caller::Verified(eng), "sonnet").targets,
            fast()
        );
        let d = decide(&snap, &Caller::Verified(eng_stable), "sonnet");
        assert_eq!(d.targets, vec![target("anthropic", "claude-sonnet")]);
    }

    #[test]
    fn toggle_percent_uses_the_toggle_salt_and_default_applies_when_no_rule_matches() {
        let snap = SnapBuilder::new()
            .toggle(
                "fast",
                true,
                vec![ToggleRule {
                    percent: Some(30),
                    ..rule(Effect::Off)
                }],
                &[("sonnet", fast())],
            )
            .build();
        let t = &snap.toggles[0];
        let inside = find_user(|u| assign::in_toggle_percent("fast", u, 30));
        let outside = find_user(|u| !assign::in_toggle_percent("fast", u, 30));
        assert!(
            !toggle_is_on(t, &user(&inside), None),
            "the 30% rule turns it off"
        );
        assert!(
            toggle_is_on(t, &user(&outside), None),
            "default on for the rest"
        );
        // A rule with no conditions matches everyone.
        let mut always_off = t.clone();
        always_off.rules = vec![rule(Effect::Off)];
        assert!(!toggle_is_on(&always_off, &user(&outside), None));
    }

    #[test]
    fn first_toggle_by_name_that_routes_the_alias_wins() {
        let snap = SnapBuilder::new()
            .toggle(
                "zeta",
                true,
                vec![],
                &[("sonnet", vec![target("bedrock", "z")])],
            )
            .toggle(
                "alpha",
                true,
                vec![],
                &[("sonnet", vec![target("bedrock", "a")])],
            )
            .toggle(
                "aaa-off",
                false,
                vec![],
                &[("sonnet", vec![target("bedrock", "off")])],
            )
            .toggle(
                "aa-other",
                true,
                vec![],
                &[("opus", vec![target("bedrock", "o")])],
            )
            .build();
        let d = decide(&snap, &alice(), "sonnet");
        // aa-other does not route sonnet; aaa-off is off; alpha < zeta.
        assert_eq!(d.toggle.as_deref(), Some("alpha"));
        assert_eq!(d.targets, vec![target("bedrock", "a")]);
    }

    fn canary_snap(treatment_weight: u32) -> Snapshot {
        SnapBuilder::new()
            .ring("all", 0, default_ring())
            .toggle("fast", true, vec![], &[("sonnet", fast())])
            .experiment(
                "sonnet-canary",
                ExperimentType::Canary,
                Axis::Traffic,
                &["all"],
                vec![
                    ("control", 100 - treatment_weight, vec![]),
                    (
                        "treatment",
                        treatment_weight,
                        vec![("sonnet", vec![target("bedrock", "next")])],
                    ),
                ],
            )
            .build()
    }

    #[test]
    fn experiment_variant_overrides_the_toggle() {
        let d = decide(&canary_snap(100), &alice(), "sonnet");
        assert_eq!(d.source, RouteSource::Experiment);
        assert_eq!(d.targets, vec![target("bedrock", "next")]);
        assert_eq!(d.toggle, None, "the toggle's route was overridden");
        let a = d.experiment.expect("attributed");
        assert_eq!(
            (a.experiment.as_str(), a.variant.as_str()),
            ("sonnet-canary", "treatment")
        );
        assert!(a.routed);
        assert_eq!(a.axis, Axis::Traffic);
    }

    #[test]
    fn control_keeps_the_toggle_route_but_is_attributed() {
        let d = decide(&canary_snap(0), &alice(), "sonnet");
        assert_eq!(d.source, RouteSource::Toggle);
        assert_eq!(d.targets, fast());
        assert_eq!(d.toggle.as_deref(), Some("fast"));
        let a = d.experiment.expect("control is still attributed");
        assert_eq!(
            (a.experiment.as_str(), a.variant.as_str()),
            ("sonnet-canary", "control")
        );
        assert!(!a.routed);
    }

    #[test]
    fn variant_follows_assign_with_the_experiment_salt() {
        let snap = canary_snap(30);
        let weights = [70, 30];
        let treated = find_user(|u| assign::variant("sonnet-canary-salt", u, &weights) == Some(1));
        let control = find_user(|u| assign::variant("sonnet-canary-salt", u, &weights) == Some(0));
        let d = decide(&snap, &Caller::Verified(user(&treated)), "sonnet");
        assert_eq!(
            d.experiment.map(|a| a.variant).as_deref(),
            Some("treatment")
        );
        let d = decide(&snap, &Caller::Verified(user(&control)), "sonnet");
        assert_eq!(d.experiment.map(|a| a.variant).as_deref(), Some("control"));
    }

    #[test]
    fn an_experiment_on_another_alias_is_not_attributed() {
        let d = decide(&canary_snap(100), &alice(), "opus");
        assert_eq!(d.experiment, None);
        assert_eq!(d.source, RouteSource::Gateway);
    }

    #[test]
    fn first_routing_experiment_by_name_wins_and_control_elsewhere_yields() {
        let snap = SnapBuilder::new()
            .ring("all", 0, default_ring())
            .experiment(
                "b-routes",
                ExperimentType::Ab,
                Axis::Traffic,
                &["all"],
                vec![(
                    "treatment",
                    1,
                    vec![("sonnet", vec![target("bedrock", "b")])],
                )],
            )
            .experiment(
                "c-routes",
                ExperimentType::Ab,
                Axis::Traffic,
                &["all"],
                vec![(
                    "treatment",
                    1,
                    vec![("sonnet", vec![target("bedrock", "c")])],
                )],
            )
            .experiment(
                "a-control",
                ExperimentType::Ab,
                Axis::Traffic,
                &["all"],
                vec![
                    ("control", 1, vec![]),
                    (
                        "treatment",
                        0,
                        vec![("sonnet", vec![target("bedrock", "a")])],
                    ),
                ],
            )
            .build();
        let d = decide(&snap, &alice(), "sonnet");
        // a-control is first by name but alice is in its control arm: b-routes routes.
        assert_eq!(d.targets, vec![target("bedrock", "b")]);
        assert_eq!(
            d.experiment.map(|a| a.experiment).as_deref(),
            Some("b-routes")
        );
    }

    #[test]
    fn when_no_experiment_routes_the_first_concerned_by_name_is_attributed() {
        let control_only = |name| {
            (
                name,
                vec![
                    ("control", 1, vec![]),
                    (
                        "treatment",
                        0,
                        vec![("sonnet", vec![target("bedrock", name)])],
                    ),
                ],
            )
        };
        let (n1, v1) = control_only("zz");
        let (n2, v2) = control_only("mm");
        let snap = SnapBuilder::new()
            .ring("all", 0, default_ring())
            .experiment(n1, ExperimentType::Ab, Axis::Traffic, &["all"], v1)
            .experiment(n2, ExperimentType::Ab, Axis::Traffic, &["all"], v2)
            .build();
        let d = decide(&snap, &alice(), "sonnet");
        let a = d.experiment.expect("attributed");
        assert_eq!(
            (a.experiment.as_str(), a.variant.as_str(), a.routed),
            ("mm", "control", false)
        );
        assert_eq!(d.source, RouteSource::Gateway);
    }

    #[test]
    fn paused_experiments_are_ignored_entirely() {
        let mut snap = canary_snap(100);
        snap.experiments[0].status = ExperimentStatus::Paused;
        let d = decide(&snap, &alice(), "sonnet");
        assert_eq!(d.experiment, None);
        assert_eq!(d.targets, fast(), "back to the toggle route");
        assert_eq!(d.source, RouteSource::Toggle);
    }

    #[test]
    fn experiments_need_the_ring_enrolled() {
        let mut snap = canary_snap(100);
        snap.experiments[0].rings = strings(&["dogfood"]);
        let d = decide(&snap, &alice(), "sonnet");
        assert_eq!(d.experiment, None);
        assert_eq!(d.targets, fast());
    }

    #[test]
    fn client_axis_is_attributed_but_never_routes() {
        let snap = SnapBuilder::new()
            .ring("all", 0, default_ring())
            .experiment(
                "prompt-style",
                ExperimentType::Ab,
                Axis::Client,
                &["all"],
                vec![("control", 0, vec![]), ("terse", 1, vec![])],
            )
            .build();
        let d = decide(&snap, &alice(), "sonnet");
        assert_eq!(d.source, RouteSource::Gateway);
        assert_eq!(d.targets, vec![target("anthropic", "claude-sonnet")]);
        let a = d.experiment.expect("client experiment attributed");
        assert_eq!(
            (a.experiment.as_str(), a.variant.as_str()),
            ("prompt-style", "terse")
        );
        assert_eq!((a.axis, a.routed), (Axis::Client, false));
    }

    #[test]
    fn a_traffic_attribution_takes_precedence_over_a_client_one() {
        let mut snap = canary_snap(0);
        snap.experiments.extend(
            SnapBuilder::new()
                .experiment(
                    "a-client",
                    ExperimentType::Ab,
                    Axis::Client,
                    &["all"],
                    vec![("x", 1, vec![])],
                )
                .build()
                .experiments,
        );
        let d = decide(&snap, &alice(), "sonnet");
        assert_eq!(
            d.experiment.map(|a| a.experiment).as_deref(),
            Some("sonnet-canary")
        );
    }

    fn shadow_snap(mirror_weight: u32) -> Snapshot {
        let mut snap = SnapBuilder::new()
            .ring("all", 0, default_ring())
            .experiment(
                "sonnet-shadow",
                ExperimentType::Shadow,
                Axis::Traffic,
                &["all"],
                vec![
                    ("control", 100 - mirror_weight, vec![]),
                    (
                        "candidate",
                        mirror_weight,
                        vec![("sonnet", vec![target("bedrock", "candidate")])],
                    ),
                ],
            )
            .build();
        snap.experiments[0].shadow_turns = Some(ShadowTurns::All);
        snap
    }

    #[test]
    fn shadow_mirrors_without_routing_or_attribution() {
        let d = decide(&shadow_snap(100), &alice(), "sonnet");
        assert_eq!(d.targets, vec![target("anthropic", "claude-sonnet")]);
        assert_eq!(d.source, RouteSource::Gateway);
        assert_eq!(d.experiment, None);
        let m = d.shadow.expect("mirrored");
        assert_eq!(m.experiment, "sonnet-shadow");
        assert_eq!(m.variant, "candidate");
        assert_eq!(m.targets, vec![target("bedrock", "candidate")]);
        assert_eq!(m.turns, ShadowTurns::All);
        // Not for another alias, not for control, not when paused.
        assert_eq!(decide(&shadow_snap(100), &alice(), "opus").shadow, None);
        assert_eq!(decide(&shadow_snap(0), &alice(), "sonnet").shadow, None);
        let mut paused = shadow_snap(100);
        paused.experiments[0].status = ExperimentStatus::Paused;
        assert_eq!(decide(&paused, &alice(), "sonnet").shadow, None);
    }

    #[test]
    fn anonymous_gets_unknown_ring_and_gateway_route_only() {
        let mut snap = canary_snap(100);
        snap.experiments.extend(shadow_snap(100).experiments);
        let d = decide(&snap, &Caller::Anonymous, "sonnet");
        assert_eq!(d.ring, UNKNOWN_RING);
        assert_eq!(d.targets, vec![target("anthropic", "claude-sonnet")]);
        assert_eq!(d.source, RouteSource::Gateway);
        assert_eq!(
            (d.toggle, d.experiment, d.shadow, d.release),
            (None, None, None, None)
        );
    }

    #[test]
    fn the_order_of_the_snapshot_lists_does_not_change_the_decision() {
        let snap = SnapBuilder::new()
            .ring("all", 0, default_ring())
            .toggle(
                "t1",
                true,
                vec![],
                &[("sonnet", vec![target("bedrock", "t1")])],
            )
            .toggle(
                "t2",
                true,
                vec![],
                &[("sonnet", vec![target("bedrock", "t2")])],
            )
            .experiment(
                "e1",
                ExperimentType::Ab,
                Axis::Traffic,
                &["all"],
                vec![("control", 1, vec![]), ("t", 0, vec![("sonnet", fast())])],
            )
            .experiment(
                "e2",
                ExperimentType::Ab,
                Axis::Traffic,
                &["all"],
                vec![("control", 1, vec![]), ("t", 0, vec![("sonnet", fast())])],
            )
            .build();
        let mut reversed = snap.clone();
        reversed.toggles.reverse();
        reversed.experiments.reverse();
        let a = decide(&snap, &alice(), "sonnet");
        assert_eq!(a, decide(&reversed, &alice(), "sonnet"));
        assert_eq!(a.toggle.as_deref(), Some("t1"));
        assert_eq!(a.experiment.map(|x| x.experiment).as_deref(), Some("e1"));
    }
}
