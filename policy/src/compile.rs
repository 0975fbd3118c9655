//! compile: a validated [`Org`] -> the [`Snapshot`] the traffic plane consumes.
//!
//! Deterministic: the same policy gives the same bytes, whatever the file layout or the
//! order documents were read in, because every collection is sorted here.
//!
//! A running, paused or complete Rollout decides its backing experiment's cohort: the compiled
//! experiment enrolls the rings of the steps reached so far and gives the current step's
//! `percent` (the whole ring without one) to the treatment ([`rollout_cohort`]). So the
//! advance PR, which sets `step:` only, is what widens the change, and the rollout's steps
//! are the one description of who gets it; the experiment's own `rings` bound them
//! (validated) and its weights apply while no rollout drives it.

use std::collections::BTreeMap;

use crate::snapshot::{
    Routes, SNAPSHOT_SCHEMA, Snapshot, SnapshotExperiment, SnapshotRing, SnapshotToggle,
    SnapshotVariant,
};
use crate::types::{
    Axis, CONTROL_VARIANT, Experiment, ExperimentStatus, ExperimentType, Harness, ModelRoute, Org,
    Rollout, RolloutStatus, ShadowTurns,
};

/// Who a rollout's backing experiment enrolls at the rollout's current step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cohort {
    /// The rings of steps `0..=step`, sorted: a ring a step reached keeps the change.
    pub rings: Vec<String>,
    /// The treatment's share of those rings: the current step's `percent`, else 100.
    pub percent: u32,
}

/// The cohort `rollout` routes to its change now: at its current step while running or
/// paused, at its last step once complete (the change stays where the rollout took it
/// until a human moves it into the Gateway's route or the ring's release and concludes
/// the experiment), and `None` when pending (not started), rolled back (its experiment is
/// paused, so control) or at a step that does not exist. Validation makes the one split
/// per experiment able to carry every step (no step narrows a ring an earlier one took
/// whole).
pub fn rollout_cohort(rollout: &Rollout) -> Option<Cohort> {
    let last = match rollout.status {
        RolloutStatus::Running | RolloutStatus::Paused => rollout.step as usize,
        RolloutStatus::Complete => rollout.steps.len().checked_sub(1)?,
        RolloutStatus::Pending | RolloutStatus::RolledBack => return None,
    };
    let reached = rollout.steps.get(..=last)?;
    let mut rings: Vec<String> = reached.iter().map(|s| s.ring.clone()).collect();
    rings.sort();
    rings.dedup();
    let percent = reached.last()?.percent.unwrap_or(100).min(100);
    Some(Cohort { rings, percent })
}

/// Who `experiment` enrolls and how it splits them, as served: its rings and its variants'
/// weights (in variant order), or those a rollout driving it sets. The snapshot and the
/// client releases (halod's channels) both read this.
pub fn enrollment(org: &Org, experiment: &Experiment) -> (Vec<String>, Vec<u32>) {
    // An active rollout (validation allows one) before a complete one left in the repo.
    let backing = || {
        org.rollouts
            .values()
            .filter(|r| r.experiment == experiment.name)
    };
    let cohort = backing()
        .filter(|r| r.status != RolloutStatus::Complete)
        .find_map(rollout_cohort)
        .or_else(|| backing().find_map(rollout_cohort));
    let (mut rings, weights) = match &cohort {
        Some(c) => apply_cohort(experiment, c),
        None => (
            experiment.rings.clone(),
            experiment.variants.iter().map(|v| v.weight).collect(),
        ),
    };
    rings.sort();
    rings.dedup();
    (rings, weights)
}

/// The experiment's rings and variant weights as a cohort sets them: control gets
/// `100 - percent`, the treatment (validation allows one) `percent`.
fn apply_cohort(experiment: &Experiment, cohort: &Cohort) -> (Vec<String>, Vec<u32>) {
    let weights = experiment
        .variants
        .iter()
        .map(|v| {
            if v.name == CONTROL_VARIANT {
                100 - cohort.percent
            } else {
                cohort.percent
            }
        })
        .collect();
    (cohort.rings.clone(), weights)
}

/// Compile a policy. The caller validates first: compile does not re-check references,
/// and a route that does not resolve simply has no targets.
pub fn compile(org: &Org) -> Snapshot {
    let gateway = &org.gateway;
    let protocols = Harness::ALL
        .into_iter()
        .map(|h| (h, gateway.protocol(h)))
        .collect();

    let rings = org
        .rings_in_order()
        .into_iter()
        .map(|r| SnapshotRing {
            name: r.name.clone(),
            order: r.order,
            release: r.release.clone(),
            membership: r.membership.clone(),
        })
        .collect();

    // Only running experiments can affect a request; a kill can only pause them, never
    // start a draft, so nothing else needs to ship.
    let experiments = org
        .experiments
        .values()
        .filter(|e| e.status == ExperimentStatus::Running)
        .map(|e| {
            let (rings, weights) = enrollment(org, e);
            SnapshotExperiment {
                name: e.name.clone(),
                experiment_type: e.experiment_type,
                axis: e.axis,
                status: e.status,
                rings,
                salt: e.salt.clone(),
                variants: e
                    .variants
                    .iter()
                    .zip(weights)
                    .map(|(v, weight)| SnapshotVariant {
                        name: v.name.clone(),
                        weight,
                        routes: normalize(&v.routes),
                    })
                    .collect(),
                shadow_turns: (e.experiment_type == ExperimentType::Shadow).then(|| {
                    e.shadow
                        .as_ref()
                        .map(|s| s.turns)
                        .unwrap_or(ShadowTurns::First)
                }),
            }
        })
        .collect();

    let toggles = org
        .toggles
        .values()
        .filter(|t| t.axis == Axis::Traffic)
        .map(|t| SnapshotToggle {
            name: t.name.clone(),
            default: t.default,
            rules: t.rules.clone(),
            routes: t
                .traffic
                .as_ref()
                .map(|tr| normalize(&tr.routes))
                .unwrap_or_default(),
        })
        .collect();

    Snapshot {
        schema: SNAPSHOT_SCHEMA,
        org: org.root.org.clone(),
        identity: org.root.identity.clone(),
        protocols,
        upstreams: gateway.upstreams.clone(),
        models: normalize(&gateway.models),
        rings,
        experiments,
        toggles,
        prices: gateway.prices.clone(),
        budgets: gateway.budgets.clone(),
        budget_service: gateway.budget_service,
    }
}

fn normalize(routes: &BTreeMap<String, ModelRoute>) -> Routes {
    routes
        .iter()
        .map(|(alias, route)| (alias.clone(), route.normalized_targets()))
        .collect()
}
