//! The controller assembled from its settings and its ports, as halo-server's
//! `--controller` and `halo controller run` both run it (spec: low-level design
//! "Controller loop"): pull requests by git and gh on a local clone of the policy repo,
//! the signed webhook, the evidence store, and one of two kill ports:
//! - [`ServerKill`]: a halo-server's own switch (served), through the same
//!   append-then-apply and the same fail-closed audit as an admin's kill (ADR-0009), with
//!   actor [`CONTROLLER_ACTOR`];
//! - [`DataDirKill`]: the kill log of a data dir that a halo-server may serve
//!   (`halo controller run`).
//!
//! The policy port is the caller's: halo-server passes the policy it serves now;
//! `halo controller run` passes [`DirPolicy`], the directory read again every tick.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use halo_killswitch::{Action, CONTROLLER_ACTOR, Change, KillSwitch, Target, audit_kill};
use halo_store::LogStore;

use crate::controller::{Controller, PolicyError, PolicyPort};
use crate::evidence_store::StoreEvidence;
use crate::kill::{KillError, KillPort};
use crate::notify::{Format, Notifier, NotifyError, Webhook};
use crate::pr::GitWriter;
use crate::state::StateError;

/// Why the controller could not be assembled; each names the setting or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum AssembleError {
    #[error("--controller-webhook-url {url:?}: {message}")]
    WebhookUrl { url: String, message: String },
    #[error("reading {}: {source}", path.display())]
    ReadSecret {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the controller webhook: {0}")]
    Webhook(NotifyError),
    #[error("opening the controller state: {0}")]
    State(StateError),
}

/// The controller settings, resolved from halo-server's `--controller*` flags
/// and `halo controller run`'s (halo-server's `config::Flags` documents each).
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerSettings {
    pub enabled: bool,
    pub interval: Duration,
    /// A local clone of the policy repo PRs are made from [default: the policy dir].
    pub policy_repo: Option<PathBuf>,
    pub base_branch: String,
    pub webhook_url: Option<String>,
    pub webhook_secret_file: Option<PathBuf>,
    pub webhook_slack: bool,
    /// The gh program [default: gh on PATH].
    pub gh: Option<PathBuf>,
}

/// The branch controller PRs target by default.
pub const DEFAULT_BASE_BRANCH: &str = "main";

impl Default for ControllerSettings {
    fn default() -> Self {
        ControllerSettings {
            enabled: false,
            interval: crate::controller::DEFAULT_INTERVAL,
            policy_repo: None,
            base_branch: DEFAULT_BASE_BRANCH.to_string(),
            webhook_url: None,
            webhook_secret_file: None,
            webhook_slack: false,
            gh: None,
        }
    }
}

impl ControllerSettings {
    /// What the flags require of each other (files are read by [`assemble`]).
    pub fn check(&self, data_dir: bool) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        crate::controller::check_interval(self.interval)
            .map_err(|e| format!("--controller-interval: {e}"))?;
        if !data_dir {
            return Err(
                "--controller requires --data-dir (controller-state.jsonl records each action so it happens once)".into(),
            );
        }
        if self.webhook_url.is_some() != self.webhook_secret_file.is_some() {
            return Err(
                "--controller-webhook-url and --controller-webhook-secret-file go together (receivers verify the signature)".into(),
            );
        }
        Ok(())
    }
}

/// The controller from its settings and its four parts: halo-server's `--controller` and
/// `halo controller run` both build it here, so the loop and its flags are one.
pub fn assemble(
    c: &ControllerSettings,
    data_dir: &Path,
    policy_dir: &Path,
    policy: Arc<dyn PolicyPort>,
    evidence: Arc<dyn halo_evidence::Store>,
    kill: Option<Arc<dyn KillPort>>,
) -> Result<Controller, AssembleError> {
    let repo = c
        .policy_repo
        .clone()
        .unwrap_or_else(|| policy_dir.to_path_buf());
    let mut pulls = GitWriter::new(repo.clone(), &c.base_branch);
    if let Some(gh) = &c.gh {
        pulls.gh = gh.clone().into_os_string();
    }
    // The policy dir may be a folder of the repo: PR edits name files inside it.
    if let (Ok(dir), Ok(root)) = (
        std::fs::canonicalize(policy_dir),
        std::fs::canonicalize(&repo),
    ) && let Ok(sub) = dir.strip_prefix(&root)
    {
        pulls.policy_subdir = sub.to_path_buf();
    }
    let notifier: Option<Arc<dyn Notifier>> = match (&c.webhook_url, &c.webhook_secret_file) {
        (Some(url), Some(file)) => {
            let url = reqwest::Url::parse(url).map_err(|e| AssembleError::WebhookUrl {
                url: url.clone(),
                message: e.to_string(),
            })?;
            let secret =
                std::fs::read_to_string(file).map_err(|source| AssembleError::ReadSecret {
                    path: file.clone(),
                    source,
                })?;
            let format = if c.webhook_slack {
                Format::Slack
            } else {
                Format::Generic
            };
            Some(Arc::new(
                Webhook::new(url, secret.trim().as_bytes().to_vec(), format)
                    .map_err(AssembleError::Webhook)?,
            ))
        }
        _ => None,
    };
    Controller::open(
        data_dir,
        policy,
        Arc::new(StoreEvidence(evidence)),
        kill,
        Arc::new(pulls),
        notifier,
    )
    .map_err(AssembleError::State)
}

/// The policy in a directory, read again at every tick (`halo controller run`): what the
/// halo-server serving that directory serves, give or take its reload interval. A
/// directory that does not validate fails the tick (retried sooner), never acts.
pub struct DirPolicy(pub PathBuf);

impl PolicyPort for DirPolicy {
    fn current(&self) -> BoxFuture<'_, Result<Arc<halo_policy::Org>, PolicyError>> {
        let dir = self.0.clone();
        Box::pin(async move {
            let loaded = tokio::task::spawn_blocking(move || halo_policy::load::load_checked(&dir))
                .await
                .map_err(|e| PolicyError(e.to_string()))?;
            match loaded {
                Ok((org, _)) => Ok(Arc::new(org)),
                Err(problems) => Err(PolicyError(problems.join("; "))),
            }
        })
    }
}

/// This server's switch, as the controller trips it. Only built when the server has a
/// kill key, so what it writes is served.
pub struct ServerKill {
    pub switch: Arc<KillSwitch>,
    pub store: Arc<dyn LogStore>,
}

impl KillPort for ServerKill {
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
                    CONTROLLER_ACTOR,
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

/// The kill switch as `halo controller run` trips it: records appended to the kill log in
/// a data dir (the same append, lock and audit as halo-server's), read by the halo-server
/// that serves that dir within [`halo_killswitch::FOLLOW_EVERY`]. Whether one does is
/// the operator's word (`--killswitch-served`): without it a kill is reported
/// `kill_written`, never `killed`.
pub struct DataDirKill {
    pub store: Arc<dyn LogStore>,
    pub served: bool,
}

impl KillPort for DataDirKill {
    fn is_killed<'a>(&'a self, experiment: &'a str) -> BoxFuture<'a, Result<bool, KillError>> {
        Box::pin(async move {
            let store = Arc::clone(&self.store);
            let state =
                tokio::task::spawn_blocking(move || halo_killswitch::load_state(store.as_ref()))
                    .await
                    .map_err(|e| KillError(e.to_string()))?
                    .map_err(|e| KillError(e.to_string()))?;
            Ok(state.is_killed(Target::Experiment, experiment))
        })
    }

    fn kill<'a>(
        &'a self,
        experiment: &'a str,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), KillError>> {
        Box::pin(async move {
            let store = Arc::clone(&self.store);
            let (name, reason) = (experiment.to_string(), reason.to_string());
            tokio::task::spawn_blocking(move || {
                let (rec, _) = halo_killswitch::append_record(store.as_ref(), |seq| {
                    halo_killswitch::KillRecord {
                        seq,
                        at: halo_killswitch::now_rfc3339(),
                        actor: CONTROLLER_ACTOR.to_string(),
                        action: Action::Kill,
                        target: Target::Experiment,
                        name,
                        reason,
                    }
                })
                .map_err(|e| KillError(e.to_string()))?;
                if let Err(e) = audit_kill(store.as_ref(), &rec) {
                    // Fail safe, as on the server: the kill stands.
                    tracing::error!(error = %e, "controller kill written, audit append failed");
                }
                Ok(())
            })
            .await
            .map_err(|e| KillError(e.to_string()))?
        })
    }

    fn served(&self) -> bool {
        self.served
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;
    use halo_store::{Log, MemoryStore};

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
        assert_eq!(audit[0]["actor"], CONTROLLER_ACTOR);
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
