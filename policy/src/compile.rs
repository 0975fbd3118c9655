//! compile: a validated [`Org`] -> the [`Snapshot`] the traffic plane consumes.
//!
//! Deterministic: the same policy gives the same bytes, whatever the file layout or the
//! order documents were read in, because every collection is sorted here.

use std::collections::BTreeMap;

use crate::snapshot::{
    Routes, SNAPSHOT_SCHEMA, Snapshot, SnapshotExperiment, SnapshotRing, SnapshotToggle,
    SnapshotVariant,
};
use crate::types::{Axis, ExperimentStatus, ExperimentType, Harness, ModelRoute, Org, ShadowTurns};

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
            let mut rings = e.rings.clone();
            rings.sort();
            rings.dedup();
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
                    .map(|v| SnapshotVariant {
                        name: v.name.clone(),
                        weight: v.weight,
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
    }
}

fn normalize(routes: &BTreeMap<String, ModelRoute>) -> Routes {
    routes
        .iter()
        .map(|(alias, route)| (alias.clone(), route.normalized_targets()))
        .collect()
}
