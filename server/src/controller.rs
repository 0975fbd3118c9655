//! `halo-server --controller`: halo-controller's loop in this process, on this server's
//! ports (spec: low-level design "Controller loop"):
//! - the policy: [`ServedPolicy`], the policy the server serves *now* (its PolicySource's
//!   latest accepted state), so an edit to the policy dir reaches the next tick;
//! - the evidence: the store the receivers write ([`halo_controller::evidence_store`]);
//! - the kill switch: [`ServerKill`], this server's switch, only with a kill key. A
//!   controller kill goes through the same append-then-apply and the same fail-closed
//!   audit as an admin's (ADR-0009), with actor `halo-controller`;
//! - pull requests: git and gh on a local clone of the policy repo; notifications: the
//!   signed webhook.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures_util::future::BoxFuture;
use halo_controller::controller::{Controller, PolicyError, PolicySource};
use halo_controller::kill::{KillError, KillSwitch as ControllerKill};
use halo_controller::notify::{Format, Notifier, Webhook};
use halo_controller::pr::GitWriter;
use halo_xds::source::Served;

use crate::api::audit_kill;
use crate::killswitch::{Action, Change, KillSwitch, Target};
use crate::store::Store;

/// The actor the kill log and the audit log name for controller kills.
pub const ACTOR: &str = "halo-controller";

/// The controller settings, resolved from halo-server's `--controller*` flags
/// ([`crate::config::Flags`] documents each).
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
            interval: halo_controller::controller::DEFAULT_INTERVAL,
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
    /// What the flags require of each other (files are read by [`build`]).
    pub fn check(&self, data_dir: bool) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        halo_controller::controller::check_interval(self.interval)
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

/// The policy this server serves now, as the controller reads it each tick.
pub struct ServedPolicy(pub tokio::sync::watch::Receiver<Arc<Served>>);

impl PolicySource for ServedPolicy {
    fn current(&self) -> BoxFuture<'_, Result<Arc<halo_policy::Org>, PolicyError>> {
        let org = Arc::new(self.0.borrow().org.clone());
        Box::pin(async move { Ok(org) })
    }
}

/// The controller on this server's ports; `None` unless `--controller`.
pub fn build(
    settings: &crate::config::Settings,
    policy: tokio::sync::watch::Receiver<Arc<Served>>,
    evidence: Option<Arc<dyn halo_evidence::Store>>,
    kill: Option<ServerKill>,
) -> anyhow::Result<Option<Arc<Controller>>> {
    let c = &settings.controller;
    if !c.enabled {
        return Ok(None);
    }
    let data_dir = settings
        .data_dir
        .as_deref()
        .context("--controller requires --data-dir")?;
    let evidence = evidence.context(
        "--controller reads the evidence store: configure a receiver (--otlp-gateway-listen)",
    )?;
    let controller = assemble(
        c,
        data_dir,
        &settings.policy_dir,
        Arc::new(ServedPolicy(policy)),
        evidence,
        kill.map(|k| Arc::new(k) as Arc<dyn ControllerKill>),
    )?;
    Ok(Some(Arc::new(controller)))
}

/// The controller from its settings and its four parts: halo-server's `--controller` and
/// `halo controller run` both build it here, so the loop and its flags are one.
pub fn assemble(
    c: &ControllerSettings,
    data_dir: &Path,
    policy_dir: &Path,
    policy: Arc<dyn PolicySource>,
    evidence: Arc<dyn halo_evidence::Store>,
    kill: Option<Arc<dyn ControllerKill>>,
) -> anyhow::Result<Controller> {
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
            let url = reqwest::Url::parse(url)
                .with_context(|| format!("--controller-webhook-url {url:?}"))?;
            let secret = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            let format = if c.webhook_slack {
                Format::Slack
            } else {
                Format::Generic
            };
            Some(Arc::new(
                Webhook::new(url, secret.trim().as_bytes().to_vec(), format)
                    .context("the controller webhook")?,
            ))
        }
        _ => None,
    };
    Controller::open(
        data_dir,
        policy,
        Arc::new(halo_controller::evidence_store::StoreEvidence(evidence)),
        kill,
        Arc::new(pulls),
        notifier,
    )
    .context("opening the controller state")
}

/// The policy in a directory, read again at every tick (`halo controller run`): what the
/// halo-server serving that directory serves, give or take its reload interval. A
/// directory that does not validate fails the tick (retried sooner), never acts.
pub struct DirPolicy(pub PathBuf);

impl PolicySource for DirPolicy {
    fn current(&self) -> BoxFuture<'_, Result<Arc<halo_policy::Org>, PolicyError>> {
        let dir = self.0.clone();
        Box::pin(async move {
            let loaded = tokio::task::spawn_blocking(move || halo_xds::source::load_org(&dir))
                .await
                .map_err(|e| PolicyError(e.to_string()))?;
            match loaded {
                Ok((org, _)) => Ok(Arc::new(org)),
                Err(problems) => Err(PolicyError(problems.join("; "))),
            }
        })
    }
}

/// The controller's counters in Prometheus text.
pub fn render_prometheus(c: &Controller) -> String {
    use halo_controller::controller::DECISIONS;
    use std::fmt::Write as _;
    use std::sync::atomic::Ordering;
    let n = &c.counters;
    let mut out = format!(
        "# HELP halo_controller_ticks_total Controller ticks run.\n# TYPE halo_controller_ticks_total counter\nhalo_controller_ticks_total {}\n\
         # HELP halo_controller_tick_failures_total Controller ticks that failed (retried sooner).\n# TYPE halo_controller_tick_failures_total counter\nhalo_controller_tick_failures_total {}\n\
         # HELP halo_controller_verdicts_total Verdicts by decision.\n# TYPE halo_controller_verdicts_total counter\n",
        n.ticks.load(Ordering::Relaxed),
        n.tick_failures.load(Ordering::Relaxed)
    );
    for d in DECISIONS {
        let _ = writeln!(
            out,
            "halo_controller_verdicts_total{{decision=\"{}\"}} {}",
            d.as_str(),
            n.verdicts(d)
        );
    }
    out.push_str("# HELP halo_controller_actions_total Actions decided (each once per experiment run).\n# TYPE halo_controller_actions_total counter\n");
    for d in DECISIONS.into_iter().skip(1) {
        let _ = writeln!(
            out,
            "halo_controller_actions_total{{decision=\"{}\"}} {}",
            d.as_str(),
            n.actions(d)
        );
    }
    out
}

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

/// The kill switch as `halo controller run` trips it: records appended to the kill log in
/// a data dir (the same append, lock and audit as halo-server's), read by the halo-server
/// that serves that dir within [`crate::killswitch::FOLLOW_EVERY`]. Whether one does is
/// the operator's word (`--killswitch-served`): without it a kill is reported
/// `kill_written`, never `killed`.
pub struct DataDirKill {
    pub store: Arc<dyn Store>,
    pub served: bool,
}

impl ControllerKill for DataDirKill {
    fn is_killed<'a>(&'a self, experiment: &'a str) -> BoxFuture<'a, Result<bool, KillError>> {
        Box::pin(async move {
            let store = Arc::clone(&self.store);
            let state =
                tokio::task::spawn_blocking(move || crate::killswitch::load_state(store.as_ref()))
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
                let (rec, _) = crate::killswitch::append_record(store.as_ref(), |seq| {
                    crate::killswitch::KillRecord {
                        seq,
                        at: crate::killswitch::now_rfc3339(),
                        actor: ACTOR.to_string(),
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
