//! The compiled snapshot: the JSON document the filter, the xDS translator and
//! `halo gateway routes` consume.
//!
//! It holds only what the traffic plane needs, with every route normalized to a list of
//! targets: the identity provider, the wires, the upstreams, the alias routes, the rings in
//! resolution order, the running experiments, the traffic toggles and the price table. Profiles,
//! client toggles and rollouts stay in the policy repo (halod gets its part through signed
//! releases). Its bytes are deterministic and their sha256 is the snapshot's version.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::types::{
    Axis, Budget, BudgetService, ExperimentStatus, ExperimentType, Harness, Identity, Membership,
    Price, ShadowTurns, Target, ToggleRule, Upstream, WireProtocol,
};

/// Format version of the snapshot document; bumped on an incompatible change.
pub const SNAPSHOT_SCHEMA: u32 = 1;

/// Routes by alias, each a list of targets in policy order.
pub type Routes = BTreeMap<String, Vec<Target>>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Snapshot {
    pub schema: u32,
    pub org: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
    /// The wire each harness speaks (all three harnesses present).
    pub protocols: BTreeMap<Harness, WireProtocol>,
    pub upstreams: BTreeMap<String, Upstream>,
    /// The Gateway's alias routes.
    pub models: Routes,
    /// Rings in resolution order.
    pub rings: Vec<SnapshotRing>,
    /// Running experiments, by name. The kill list turns some into `paused`.
    pub experiments: Vec<SnapshotExperiment>,
    /// Traffic toggles, by name. The kill list removes some.
    pub toggles: Vec<SnapshotToggle>,
    /// The Gateway's price table (upstream -> model -> price), for the cost of each call
    /// the gateway accounts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, BTreeMap<String, Price>>,
    /// The Gateway's budgets by name ([`crate::budgets`]): the filter names the ones that
    /// apply to a call, halo-server's rate-limit service counts and checks them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub budgets: BTreeMap<String, Budget>,
    /// The gateway's behaviour towards the budget service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_service: Option<BudgetService>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SnapshotRing {
    pub name: String,
    pub order: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    pub membership: Membership,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SnapshotExperiment {
    pub name: String,
    #[serde(rename = "type")]
    pub experiment_type: ExperimentType,
    pub axis: Axis,
    pub status: ExperimentStatus,
    pub rings: Vec<String>,
    pub salt: String,
    pub variants: Vec<SnapshotVariant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow_turns: Option<ShadowTurns>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SnapshotVariant {
    pub name: String,
    pub weight: u32,
    /// Traffic axis: the aliases this variant routes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub routes: Routes,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SnapshotToggle {
    pub name: String,
    pub default: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<ToggleRule>,
    pub routes: Routes,
}

/// Errors reading a snapshot document.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot is not valid JSON for schema {SNAPSHOT_SCHEMA}: {0}")]
    Decode(String),
    #[error("snapshot schema {found} is not supported (this build reads {SNAPSHOT_SCHEMA})")]
    Schema { found: u32 },
}

impl Snapshot {
    /// The canonical bytes: pretty JSON with sorted map keys and a trailing newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing these types cannot fail: every map key is a string.
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Decode a snapshot strictly; an unknown field or another schema is an error.
    pub fn from_bytes(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let snap: Snapshot = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            SnapshotError::Decode(format!("{path}: {}", e.into_inner()))
        })?;
        if snap.schema != SNAPSHOT_SCHEMA {
            return Err(SnapshotError::Schema { found: snap.schema });
        }
        Ok(snap)
    }

    /// The version of these bytes: lowercase hex sha256.
    pub fn version_of(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    /// This snapshot's version (sha256 of its canonical bytes).
    pub fn version(&self) -> String {
        Snapshot::version_of(&self.to_bytes())
    }

    /// The price of `model` on `upstream`, when the price table has one.
    pub fn price(&self, upstream: &str, model: &str) -> Option<&Price> {
        self.prices.get(upstream)?.get(model)
    }

    /// The experiment of this name, if it is in the snapshot.
    pub fn experiment(&self, name: &str) -> Option<&SnapshotExperiment> {
        self.experiments.iter().find(|e| e.name == name)
    }
}
