//! route: the failover order of an alias's targets (spec: Request path, step 6; Model
//! routes and failover).
//!
//! Targets are grouped into priority tiers, lowest first. Within a tier the weighted pick
//! (assign, salt `route:<alias>`, keyed by the sticky user + session key) goes first so a
//! session stays on one target and its prompt cache stays warm; the rest of the tier
//! follows in policy order, then the later tiers the same way. Without a key (no user) each
//! tier stays in policy order. The first entry is the target hit when everything is
//! healthy; Envoy walks the rest on failure.

use serde::Serialize;

use crate::assign;
use crate::snapshot::Snapshot;
use crate::types::{Harness, Target, WireProtocol};

/// One target in failover order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderedTarget<'a> {
    pub target: &'a Target,
    /// Its position in the route as written in policy.
    pub index: usize,
    /// The target hit when healthy (only the first entry).
    pub first_pick: bool,
}

/// The failover order of `targets` (an alias's route) for the sticky key `pick_key`
/// (from [`assign::sticky_key`]; `None` keeps policy order within each tier).
pub fn route_order<'a>(
    targets: &'a [Target],
    pick_key: Option<&str>,
    alias: &str,
) -> Vec<OrderedTarget<'a>> {
    let mut tiers: Vec<u32> = targets.iter().map(|t| t.priority).collect();
    tiers.sort_unstable();
    tiers.dedup();

    let mut order: Vec<usize> = Vec::with_capacity(targets.len());
    for tier in tiers {
        let members: Vec<usize> = (0..targets.len())
            .filter(|&i| targets[i].priority == tier)
            .collect();
        let picked = pick_key.and_then(|key| {
            let weights: Vec<u32> = members
                .iter()
                .map(|&i| targets[i].effective_weight())
                .collect();
            assign::route_pick(alias, key, &weights).map(|p| members[p])
        });
        order.extend(picked);
        order.extend(members.into_iter().filter(|&i| Some(i) != picked));
    }

    order
        .into_iter()
        .enumerate()
        .map(|(position, index)| OrderedTarget {
            target: &targets[index],
            index,
            first_pick: position == 0,
        })
        .collect()
}

/// Whether `target` can serve a client speaking `wire`. A target whose upstream is not in
/// the snapshot serves nobody.
pub fn can_serve(snap: &Snapshot, target: &Target, wire: WireProtocol) -> bool {
    snap.upstreams
        .get(&target.upstream)
        .is_some_and(|u| u.kind.serves(wire))
}

/// The harnesses that skip `target` because its upstream kind cannot serve the wire they
/// speak to this gateway (the NOTES column of `halo gateway routes`), in
/// [`Harness::ALL`] order.
pub fn skipped_by(snap: &Snapshot, target: &Target) -> Vec<Harness> {
    Harness::ALL
        .into_iter()
        .filter(|&h| {
            let wire = snap
                .protocols
                .get(&h)
                .copied()
                .unwrap_or_else(|| h.default_protocol());
            !can_serve(snap, target, wire)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testkit::*;

    fn indexes(order: &[OrderedTarget<'_>]) -> Vec<usize> {
        order.iter().map(|o| o.index).collect()
    }

    fn user_key(pred: impl Fn(&str) -> bool) -> String {
        (0..100_000)
            .map(|n| assign::sticky_key(&format!("user{n}@acme.com"), "s-1"))
            .find(|k| pred(k))
            .expect("some user satisfies the predicate")
    }

    /// Policy order: tier 1 first, then tier 0 (two weighted), then tier 0 again, tier 2.
    fn mixed() -> Vec<Target> {
        vec![
            weighted("anthropic", "p1-a", 1, 1),
            weighted("anthropic", "p0-a", 90, 0),
            weighted("bedrock", "p0-b", 10, 0),
            weighted("bedrock", "p2-a", 1, 2),
            weighted("anthropic", "p1-b", 1, 1),
        ]
    }

    #[test]
    fn tiers_ascending_and_policy_order_without_a_key() {
        let targets = mixed();
        let order = route_order(&targets, None, "default");
        assert_eq!(indexes(&order), vec![1, 2, 0, 4, 3]);
        assert!(order[0].first_pick);
        assert!(order[1..].iter().all(|o| !o.first_pick));
        assert_eq!(order[0].target.model, "p0-a");
    }

    #[test]
    fn the_weighted_pick_leads_its_tier_and_the_rest_follow_in_policy_order() {
        let targets = mixed();
        // Tier 0 weights are [90, 10] over indexes [1, 2].
        let minority = user_key(|k| assign::route_pick("default", k, &[90, 10]) == Some(1));
        let majority = user_key(|k| assign::route_pick("default", k, &[90, 10]) == Some(0));
        let order = route_order(&targets, Some(&minority), "default");
        assert_eq!(&indexes(&order)[..2], &[2, 1]);
        assert!(order[0].first_pick && order[0].target.model == "p0-b");
        assert_eq!(
            indexes(&route_order(&targets, Some(&majority), "default"))[..2],
            [1, 2]
        );
        // Tier 1 [0, 4] has its own pick with the same salt and key.
        let tier1 = match assign::route_pick("default", &minority, &[1, 1]) {
            Some(0) => [0, 4],
            _ => [4, 0],
        };
        assert_eq!(indexes(&order)[2..4], tier1);
        assert_eq!(indexes(&order)[4], 3);
    }

    #[test]
    fn the_pick_is_sticky_per_user_and_session_and_salted_by_alias() {
        let targets: Vec<Target> = (0..4)
            .map(|i| weighted("anthropic", &format!("m{i}"), 1, 0))
            .collect();
        let key = assign::sticky_key("alice@acme.com", "s-42");
        let first = route_order(&targets, Some(&key), "default")[0].index;
        for _ in 0..10 {
            assert_eq!(route_order(&targets, Some(&key), "default")[0].index, first);
        }
        assert_eq!(
            Some(first),
            assign::route_pick("default", &key, &[1, 1, 1, 1])
        );
        let other = assign::route_pick("opus", &key, &[1, 1, 1, 1]);
        assert_eq!(
            route_order(&targets, Some(&key), "opus")[0].index,
            other.unwrap_or(0)
        );
        // Different sessions of one user spread over the targets.
        let firsts: std::collections::BTreeSet<usize> = (0..50)
            .map(|s| {
                let k = assign::sticky_key("alice@acme.com", &format!("s-{s}"));
                route_order(&targets, Some(&k), "default")[0].index
            })
            .collect();
        assert!(firsts.len() > 1, "sessions must not all land on one target");
    }

    #[test]
    fn unweighted_targets_count_as_weight_one_and_empty_routes_are_empty() {
        let targets = vec![target("anthropic", "a"), target("bedrock", "b")];
        let key = user_key(|k| assign::route_pick("x", k, &[1, 1]) == Some(1));
        assert_eq!(indexes(&route_order(&targets, Some(&key), "x")), vec![1, 0]);
        assert!(route_order(&[], Some(&key), "x").is_empty());
    }

    #[test]
    fn skipped_by_names_the_harnesses_a_kind_cannot_serve() {
        let snap = SnapBuilder::new().build();
        let t = |up: &str| target(up, "m");
        assert_eq!(skipped_by(&snap, &t("anthropic")), vec![Harness::GeminiCli]);
        assert_eq!(
            skipped_by(&snap, &t("bedrock")),
            vec![Harness::Codex, Harness::GeminiCli]
        );
        assert_eq!(
            skipped_by(&snap, &t("gemini")),
            vec![Harness::ClaudeCode, Harness::Codex]
        );
        assert_eq!(skipped_by(&snap, &t("missing")), Harness::ALL.to_vec());
        // The wires follow Gateway.protocols: codex speaking anthropic-messages can use bedrock.
        let mut snap = snap;
        snap.protocols
            .insert(Harness::Codex, WireProtocol::AnthropicMessages);
        assert_eq!(skipped_by(&snap, &t("bedrock")), vec![Harness::GeminiCli]);
        assert!(can_serve(&snap, &t("bedrock"), WireProtocol::BedrockInvoke));
        assert!(!can_serve(
            &snap,
            &t("azure"),
            WireProtocol::AnthropicMessages
        ));
    }
}
