//! The kill switch as the controller trips it, and what became of a rollback's kill.
//!
//! The switch itself is halo-server's (ADR-0009: the append-only killswitch.jsonl and the
//! signed list); the controller reaches it through [`KillPort`], so the in-process
//! controller calls the server's switch and `halo controller run` writes the data dir.

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct KillError(pub String);

/// The kill switch the controller trips on a gateway-evidenced rollback.
pub trait KillPort: Send + Sync {
    /// Whether the experiment is killed now (a killed experiment is held, not evaluated).
    fn is_killed<'a>(&'a self, experiment: &'a str) -> BoxFuture<'a, Result<bool, KillError>>;
    /// Kill the experiment with a reason; returns once the kill is durable.
    fn kill<'a>(
        &'a self,
        experiment: &'a str,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), KillError>>;
    /// Whether gateways read what [`KillPort::kill`] writes (a halo-server with a kill
    /// key serves it). `halo controller run` writes the data dir and is served only when
    /// the operator says so with `--killswitch-served`.
    fn served(&self) -> bool;
}

/// What happened to a rollback's kill (`killOutcome` in the state, the PR and the
/// notification).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KillOutcome {
    /// Tripped, and gateways read the list: traffic is back on control.
    Killed,
    /// Written to the data dir, but no halo-server is known to serve it.
    KillWritten,
    /// The switch refused or could not be reached.
    KillFailed,
    /// The deciding evidence was not gateway-sourced: a human decides on the PR.
    NotGatewayEvidence,
    /// No kill key: nothing reads a kill list, so none was written.
    NotEnforced,
}

impl KillOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            KillOutcome::Killed => "killed",
            KillOutcome::KillWritten => "kill_written",
            KillOutcome::KillFailed => "kill_failed",
            KillOutcome::NotGatewayEvidence => "not_gateway_evidence",
            KillOutcome::NotEnforced => "not_enforced",
        }
    }

    /// Whether traffic is known to be back on control.
    pub fn enforced(self) -> bool {
        self == KillOutcome::Killed
    }

    /// What humans read about it, in the PR and the notification.
    pub fn describe(self) -> &'static str {
        match self {
            KillOutcome::Killed => {
                "Rollback enforced: the kill switch was tripped and every gateway routes this \
                 experiment's users to control. Merge this PR to make the pause durable."
            }
            KillOutcome::KillWritten => {
                "Kill written to the data dir, but it is enforced only if a halo-server with a \
                 kill key serves that data dir (--killswitch-served was not given). Merge this \
                 PR urgently."
            }
            KillOutcome::KillFailed => {
                "Rollback NOT enforced: tripping the kill switch failed. Merge this PR urgently."
            }
            KillOutcome::NotGatewayEvidence => {
                "Not killed: the deciding evidence is not gateway-sourced (CLI telemetry can be \
                 forged, eval scores are opinion). A human decides: merge this PR to pause."
            }
            KillOutcome::NotEnforced => {
                "Rollback NOT enforced: halo-server has no kill key (--killswitch-key-file), so \
                 no kill list is served. Merge this PR urgently."
            }
        }
    }
}
