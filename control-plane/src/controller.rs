//! The in-process controller's kill switch: halo-controller's [`KillSwitch`] port onto
//! this server's switch. A controller kill goes through the same append-then-apply and
//! the same fail-closed audit as an admin's (ADR-0009), with actor `halo-controller`.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use halo_controller::kill::{KillError, KillSwitch as ControllerKill};

use crate::api::audit_kill;
use crate::killswitch::{Action, Change, KillSwitch, Target};
use crate::store::Store;

/// The actor the kill log and the audit log name for controller kills.
pub const ACTOR: &str = "halo-controller";

/// This server's switch, as the controller trips it. Only built when the server has a
/// kill key, so what it writes is served.
pub struct ServerKill {
    pub switch: Arc<KillSwitch>,
    pub store: Arc<dyn Store>,
}

impl ControllerKill for ServerKill {
    fn is_killed<'a>(&'a self, experiment: &'a str) -> BoxFuture<'a, Result<bool, KillError>> {
        Box::pin(async move {
            Ok(self
                .switch
                .state()
                .await
                .is_killed(Target::Experiment, experiment))
        })
    }

    fn kill<'a>(
        &'a self,
        experiment: &'a str,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), KillError>> {
        Box::pin(async move {
            let store = Arc::clone(&self.store);
            let change = self
                .switch
                .change(
                    ACTOR,
                    Action::Kill,
                    Target::Experiment,
                    experiment,
                    reason,
                    |rec| audit_kill(store.as_ref(), rec),
                )
                .await
                .map_err(|e| KillError(e.to_string()))?;
            if let Change::AuditFailed { audit_error, .. } = change {
                // Fail safe: the kill stands (it only moves users to control).
                tracing::error!(error = %audit_error, "controller kill applied, audit append failed");
            }
            Ok(())
        })
    }

    fn served(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Log, MemoryStore};
    use ed25519_dalek::SigningKey;

    #[tokio::test]
    async fn a_controller_kill_is_logged_audited_and_signed() {
        let store = Arc::new(MemoryStore::default());
        let switch = KillSwitch::open(store.clone(), SigningKey::from_bytes(&[9u8; 32])).unwrap();
        let kill = ServerKill {
            switch: switch.clone(),
            store: store.clone(),
        };
        assert!(!kill.is_killed("exp").await.unwrap());
        kill.kill("exp", "guardrail breached").await.unwrap();
        assert!(kill.is_killed("exp").await.unwrap());
        let audit = store.read_all(Log::Audit).unwrap();
        assert_eq!(audit.len(), 1);
        assert_eq!(audit[0]["actor"], ACTOR);
        assert_eq!(audit[0]["action"], "kill");
        let kills = store.read_all(Log::Killswitch).unwrap();
        assert_eq!(kills[0]["reason"], "guardrail breached");
        // A failing kill log is the controller's kill_failed.
        store.set_failing(Log::Killswitch, true);
        assert!(kill.kill("other", "why").await.is_err());
        assert!(!kill.is_killed("other").await.unwrap());
        // A failing audit log leaves the kill applied (fail safe).
        store.set_failing(Log::Killswitch, false);
        store.set_failing(Log::Audit, true);
        kill.kill("third", "why").await.unwrap();
        assert!(kill.is_killed("third").await.unwrap());
    }
}
