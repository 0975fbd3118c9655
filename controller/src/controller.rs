//! The loop: every interval, one tick over the running experiments of the policy served
//! now; each verdict that is not `continue` becomes an action, done at most once per run.
//!
//! A tick (steps 1-10 of the controller loop in the design):
//! - ends the runs of experiments that are no longer running, starts runs for new ones;
//! - skips experiments a Rollout owns (the rollout drives them);
//! - finishes an action already decided in this run (steps not yet recorded), and never
//!   evaluates that run again;
//! - holds a killed experiment (its evidence is all control) and tells humans once;
//! - otherwise reads the evidence, decides, and acts:
//!   rollback = kill (gateway evidence only) -> pause PR -> notify, each even if the one
//!   before failed; promote or expired = concluding PR -> notify.
//!
//! Time is passed in ([`Controller::tick`] takes `now`), so tests drive it tick by tick.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use halo_policy::types::{Experiment, ExperimentStatus, Kind, Org, RolloutStatus};
use serde::Serialize;
use time::OffsetDateTime;

use crate::decide::{self, Decision, Inputs, Row, Verdict};
use crate::drive::RolloutReport;
use crate::evidence::EvidencePort;
use crate::kill::{KillOutcome, KillPort};
use crate::notify::{Message, Notifier};
use crate::pr::{Edit, PrRequest, PullRequests};
use crate::state::{ActionState, Event, StateError, StateLog, rfc3339};

/// The default interval between ticks.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// The shortest interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_secs(60);
/// The first retry after a failed tick; doubled per failure, up to the interval.
pub const FIRST_RETRY: Duration = Duration::from_secs(15);
/// One tick's time budget.
pub const TICK_BUDGET: Duration = Duration::from_secs(120);

/// The delay before the next tick after `failures` failed ticks in a row.
pub fn next_delay(interval: Duration, failures: u32) -> Duration {
    if failures == 0 {
        return interval;
    }
    let factor = 1u32.checked_shl(failures - 1).unwrap_or(u32::MAX);
    FIRST_RETRY.saturating_mul(factor).min(interval)
}

/// Check an interval against the minimum.
pub fn check_interval(interval: Duration) -> Result<Duration, String> {
    if interval < MIN_INTERVAL {
        return Err(format!(
            "the controller interval must be at least {} s, got {} s",
            MIN_INTERVAL.as_secs(),
            interval.as_secs()
        ));
    }
    Ok(interval)
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

/// The policy served now (halo-server's, not the one the controller started with).
pub trait PolicyPort: Send + Sync {
    fn current(&self) -> BoxFuture<'_, Result<Arc<Org>, PolicyError>>;
}

#[derive(Debug, thiserror::Error)]
pub enum TickError {
    #[error("policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("controller state: {0}")]
    State(#[from] StateError),
    #[error("the tick ran past its {} s budget", TICK_BUDGET.as_secs())]
    Budget,
    #[error("{failed} of the experiments failed: {first}")]
    Experiments { failed: usize, first: String },
}

/// Counters for /metrics.
#[derive(Debug, Default)]
pub struct Counters {
    pub ticks: AtomicU64,
    pub tick_failures: AtomicU64,
    pub verdicts: [AtomicU64; 4],
    pub actions: [AtomicU64; 4],
}

fn index(d: Decision) -> usize {
    match d {
        Decision::Continue => 0,
        Decision::Rollback => 1,
        Decision::Promote => 2,
        Decision::Expired => 3,
    }
}

/// The decisions in counter order.
pub const DECISIONS: [Decision; 4] = [
    Decision::Continue,
    Decision::Rollback,
    Decision::Promote,
    Decision::Expired,
];

impl Counters {
    pub fn verdicts(&self, d: Decision) -> u64 {
        self.verdicts[index(d)].load(Ordering::Relaxed)
    }
    pub fn actions(&self, d: Decision) -> u64 {
        self.actions[index(d)].load(Ordering::Relaxed)
    }
}

/// What one experiment looked like at the last tick (for status and the API).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExperimentReport {
    pub run: u64,
    /// evaluated, held (killed), acted (an action was decided this run), rollout (skipped),
    /// failed.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<ActionState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Distinct units with evidence this run, per variant (who was assigned and called).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub units: BTreeMap<String, u64>,
    /// What the experiment's calls cost this run, in USD (calls without a price count 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spend_usd: Option<f64>,
}

/// The controller's state for `halo controller status` and the API.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_tick: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub experiments: BTreeMap<String, ExperimentReport>,
    /// The running rollouts (step 11).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rollouts: BTreeMap<String, RolloutReport>,
}

/// The file the status is written to after every tick, beside the state file.
pub const STATUS_FILE: &str = "controller-status.json";

/// The controller: its ports and its state.
pub struct Controller {
    pub policy: Arc<dyn PolicyPort>,
    pub evidence: Arc<dyn EvidencePort>,
    /// None: no kill key, so a rollback is reported as not enforced.
    pub kill: Option<Arc<dyn KillPort>>,
    pub pulls: Arc<dyn PullRequests>,
    /// None: nobody to tell (the PR is the only output).
    pub notifier: Option<Arc<dyn Notifier>>,
    state: tokio::sync::Mutex<StateLog>,
    status: Mutex<Status>,
    history: Mutex<crate::history::History>,
    status_path: Option<std::path::PathBuf>,
    /// Where controller-state.jsonl, the status and `rollouts/` live.
    data_dir: std::path::PathBuf,
    pub counters: Counters,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller").finish_non_exhaustive()
    }
}

impl Controller {
    /// A controller whose state lives in `data_dir` (controller-state.jsonl and
    /// controller-status.json).
    pub fn open(
        data_dir: &std::path::Path,
        policy: Arc<dyn PolicyPort>,
        evidence: Arc<dyn EvidencePort>,
        kill: Option<Arc<dyn KillPort>>,
        pulls: Arc<dyn PullRequests>,
        notifier: Option<Arc<dyn Notifier>>,
    ) -> Result<Controller, StateError> {
        Ok(Controller {
            policy,
            evidence,
            kill,
            pulls,
            notifier,
            state: tokio::sync::Mutex::new(StateLog::open(data_dir)?),
            status: Mutex::new(Status::default()),
            history: Mutex::new(crate::history::History::load(data_dir)),
            status_path: Some(data_dir.join(STATUS_FILE)),
            data_dir: data_dir.to_path_buf(),
            counters: Counters::default(),
        })
    }

    /// The data dir the controller's state lives in.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    /// The status as of the last tick.
    pub fn status(&self) -> Status {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `experiment`'s evidence table at each tick of its current run, oldest first.
    pub fn history(&self, experiment: &str) -> Vec<crate::history::Point> {
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .points(experiment)
    }

    /// Run ticks until `shutdown` resolves: every `interval`, sooner after a failure.
    pub async fn run(&self, interval: Duration, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut failures = 0u32;
        loop {
            match self.tick_within_budget(OffsetDateTime::now_utc()).await {
                Ok(()) => failures = 0,
                Err(e) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(error = %e, failures, "controller tick failed");
                }
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(next_delay(interval, failures)) => {}
            }
        }
    }

    /// One tick, cut off at [`TICK_BUDGET`].
    pub async fn tick_within_budget(&self, now: OffsetDateTime) -> Result<(), TickError> {
        let result = match tokio::time::timeout(TICK_BUDGET, self.tick(now)).await {
            Ok(r) => r,
            Err(_) => Err(TickError::Budget),
        };
        if let Err(e) = &result {
            self.counters.tick_failures.fetch_add(1, Ordering::Relaxed);
            let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
            status.last_error = Some(e.to_string());
        }
        result
    }

    /// One tick at `now`.
    pub async fn tick(&self, now: OffsetDateTime) -> Result<(), TickError> {
        self.counters.ticks.fetch_add(1, Ordering::Relaxed);
        let org = self.policy.current().await?;
        let mut log = self.state.lock().await;
        // Runs end when the experiment stops running (or leaves the policy).
        let ended: Vec<(String, u64)> = log
            .state()
            .experiments
            .iter()
            .filter(|(name, e)| {
                e.open
                    && org
                        .experiments
                        .get(*name)
                        .is_none_or(|x| x.status != ExperimentStatus::Running)
            })
            .map(|(n, e)| (n.clone(), e.run))
            .collect();
        for (name, run) in ended {
            log.append(now, &name, run, Event::RunEnded)?;
        }
        let mut reports = BTreeMap::new();
        let mut failed = Vec::new();
        for exp in org
            .experiments
            .values()
            .filter(|e| e.status == ExperimentStatus::Running)
        {
            let report = match self.experiment(&org, exp, &mut log, now).await {
                Ok(r) => r,
                Err(e) => {
                    failed.push(format!("{}: {e}", exp.name));
                    ExperimentReport {
                        run: log.state().open_run(&exp.name).map_or(0, |e| e.run),
                        state: "failed".to_string(),
                        verdict: None,
                        action: log
                            .state()
                            .open_run(&exp.name)
                            .and_then(|e| e.action.clone()),
                        error: Some(e),
                        units: BTreeMap::new(),
                        spend_usd: None,
                    }
                }
            };
            reports.insert(exp.name.clone(), report);
        }
        drop(log);
        // Step 11: the running rollouts.
        let mut rollouts = BTreeMap::new();
        for r in org
            .rollouts
            .values()
            .filter(|r| r.status == RolloutStatus::Running)
        {
            let report = match self.drive(&org, r, now).await {
                Ok(report) => report,
                Err(e) => {
                    failed.push(format!("rollout {}: {e}", r.name));
                    RolloutReport::failed(r, e)
                }
            };
            rollouts.insert(r.name.clone(), report);
        }
        {
            let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
            history.retain(|name| reports.contains_key(name));
            for (name, report) in &reports {
                if let Some(v) = &report.verdict {
                    history.push(
                        name,
                        crate::history::Point {
                            at: rfc3339(now),
                            run: report.run,
                            rows: v.table.clone(),
                        },
                    );
                }
            }
            history.save(&self.data_dir);
        }
        let status = Status {
            last_tick: Some(rfc3339(now)),
            last_error: failed.first().cloned(),
            experiments: reports,
            rollouts,
        };
        self.publish(status);
        if let Some(first) = failed.first() {
            return Err(TickError::Experiments {
                failed: failed.len(),
                first: first.clone(),
            });
        }
        Ok(())
    }

    fn publish(&self, status: Status) {
        if let Some(path) = &self.status_path {
            match serde_json::to_vec_pretty(&status) {
                Ok(bytes) => {
                    if let Err(e) = halo_fsutil::write_atomic(path, &bytes, 0o644) {
                        tracing::warn!(error = %e, "cannot write the controller status");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot encode the controller status"),
            }
        }
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = status;
    }

    /// One running experiment; an `Err` is a message for the tick's failure.
    async fn experiment(
        &self,
        org: &Org,
        exp: &Experiment,
        log: &mut StateLog,
        now: OffsetDateTime,
    ) -> Result<ExperimentReport, String> {
        let name = exp.name.as_str();
        let report = |run, state: &str, verdict, action| ExperimentReport {
            run,
            state: state.to_string(),
            verdict,
            action,
            error: None,
            units: BTreeMap::new(),
            spend_usd: None,
        };
        if rollout_owned(org, name) {
            return Ok(report(0, "rollout", None, None));
        }
        if log.state().open_run(name).is_none() {
            let run = log.state().next_run(name);
            log.append(now, name, run, Event::RunStarted)
                .map_err(|e| e.to_string())?;
        }
        let Some(current) = log.state().open_run(name).cloned() else {
            return Err("the run was not recorded".to_string());
        };
        let run = current.run;

        // An action decided in this run: finish its steps, evaluate no more.
        if let Some(action) = current.action {
            self.finish(org, exp, run, action, log, now).await?;
            let action = log.state().open_run(name).and_then(|e| e.action.clone());
            return Ok(report(run, "acted", None, action));
        }

        // Killed: its evidence is all control. Hold it; tell humans once per run.
        if let Some(kill) = &self.kill
            && kill.is_killed(name).await.map_err(|e| e.to_string())?
        {
            if !current.held_notified {
                let mut msg = Message::decision(name, run, Decision::Continue, "");
                msg.event = "held".to_string();
                msg.reason = "the experiment is killed, so it is not evaluated (its users are all on control)".to_string();
                msg.text = format!(
                    "Experiment {name} is killed and held: the controller does not evaluate it. \
                     Unkill it (halo experiments unkill {name}) before resuming, or conclude it in policy."
                );
                self.send(&msg).await?;
                log.append(now, name, run, Event::HeldNotified)
                    .map_err(|e| e.to_string())?;
            }
            return Ok(report(run, "held", None, None));
        }

        // Evidence and verdict.
        let mut samples = BTreeMap::new();
        for metric in decide::metric_names(exp) {
            let s = self
                .evidence
                .samples(name, &metric, current.run_started)
                .await
                .map_err(|e| e.to_string())?;
            samples.insert(metric, s);
        }
        let spend_usd = self
            .evidence
            .spend_usd(name, current.run_started)
            .await
            .map_err(|e| e.to_string())?;
        let verdict = decide::decide(&Inputs {
            experiment: exp,
            samples: &samples,
            spend_usd,
            run_started: current.run_started,
            now,
        });
        let mut units: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
        for s in samples.values().flatten() {
            units.entry(&s.variant).or_default().insert(&s.unit);
        }
        let units: BTreeMap<String, u64> = units
            .into_iter()
            .map(|(v, u)| (v.to_string(), u.len() as u64))
            .collect();
        let report = |run, state: &str, verdict, action| ExperimentReport {
            units: units.clone(),
            spend_usd: Some(spend_usd),
            ..report(run, state, verdict, action)
        };
        self.counters.verdicts[index(verdict.decision)].fetch_add(1, Ordering::Relaxed);
        if verdict.decision == Decision::Continue {
            return Ok(report(run, "evaluated", Some(verdict), None));
        }
        self.counters.actions[index(verdict.decision)].fetch_add(1, Ordering::Relaxed);
        log.append(
            now,
            name,
            run,
            Event::Decided {
                verdict: Box::new(verdict.clone()),
            },
        )
        .map_err(|e| e.to_string())?;
        let Some(action) = log.state().open_run(name).and_then(|e| e.action.clone()) else {
            return Err("the decision was not recorded".to_string());
        };
        self.finish(org, exp, run, action, log, now).await?;
        let action = log.state().open_run(name).and_then(|e| e.action.clone());
        Ok(report(run, "acted", Some(verdict), action))
    }

    /// Do the steps of a decided action not yet recorded: kill (rollback only), PR,
    /// notification. Each later step runs even if an earlier one failed; a failed PR or
    /// notification fails the tick, so the next (sooner) tick retries just that step.
    async fn finish(
        &self,
        org: &Org,
        exp: &Experiment,
        run: u64,
        mut action: ActionState,
        log: &mut StateLog,
        now: OffsetDateTime,
    ) -> Result<(), String> {
        let name = exp.name.as_str();
        let rollback = action.decision == Decision::Rollback;
        if rollback && action.kill_outcome.is_none() {
            let gateway = action
                .verdict
                .deciding
                .as_ref()
                .is_some_and(|d| d.is_gateway_only());
            let reason = format!("halo controller rollback: {}", action.verdict.reason);
            let outcome = self.trip(name, gateway, &reason).await;
            log.append(now, name, run, Event::Kill { outcome })
                .map_err(|e| e.to_string())?;
            action.kill_outcome = Some(outcome);
        }
        let mut errors = Vec::new();
        if action.pull_request.is_none() {
            match self.open_pr(org, exp, run, &action).await {
                Ok(url) => {
                    log.append(now, name, run, Event::PullRequest { url: url.clone() })
                        .map_err(|e| e.to_string())?;
                    action.pull_request = Some(url);
                }
                Err(e) => errors.push(format!("pull request: {e}")),
            }
        }
        if !action.notified {
            let msg = action_message(name, run, &action, errors.first().map(String::as_str));
            match self.send(&msg).await {
                Ok(()) => {
                    log.append(now, name, run, Event::Notified)
                        .map_err(|e| e.to_string())?;
                }
                Err(e) => errors.push(e),
            }
        }
        match errors.first() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Trip the kill switch for a rollback, if the evidence allows (`gateway`: the
    /// deciding evidence is gateway-sourced alone) and a key exists.
    pub(crate) async fn trip(&self, name: &str, gateway: bool, reason: &str) -> KillOutcome {
        if !gateway {
            return KillOutcome::NotGatewayEvidence;
        }
        let Some(kill) = &self.kill else {
            return KillOutcome::NotEnforced;
        };
        match kill.kill(name, reason).await {
            Ok(()) if kill.served() => KillOutcome::Killed,
            Ok(()) => KillOutcome::KillWritten,
            Err(e) => {
                tracing::error!(experiment = name, error = %e, "the controller could not trip the kill switch");
                KillOutcome::KillFailed
            }
        }
    }

    async fn open_pr(
        &self,
        org: &Org,
        exp: &Experiment,
        run: u64,
        action: &ActionState,
    ) -> Result<String, String> {
        let name = exp.name.as_str();
        let file = org
            .source(Kind::Experiment, name)
            .map(|s| std::path::PathBuf::from(&s.file))
            .ok_or_else(|| format!("the policy does not say which file holds experiment {name}"))?;
        let (status, title) = match action.decision {
            Decision::Rollback => (
                ExperimentStatus::Paused,
                format!("Pause experiment {name}: rollback"),
            ),
            Decision::Promote => (
                ExperimentStatus::Concluded,
                format!(
                    "Conclude experiment {name}: promote {}",
                    action
                        .verdict
                        .deciding
                        .as_ref()
                        .map_or("the treatment", |d| d.variant.as_str())
                ),
            ),
            _ => (
                ExperimentStatus::Concluded,
                format!("Conclude experiment {name}: expired"),
            ),
        };
        let request = PrRequest {
            edits: vec![Edit::experiment_status(file, name, status)],
            branch: format!(
                "halo-controller/{name}/run-{run}-{}",
                action.decision.as_str()
            ),
            title,
            body: pr_body(name, run, action),
        };
        self.pulls.open(&request).await.map_err(|e| e.to_string())
    }

    pub(crate) async fn send(&self, msg: &Message) -> Result<(), String> {
        match &self.notifier {
            Some(n) => n
                .notify(msg)
                .await
                .map_err(|e| format!("notification: {e}")),
            None => {
                tracing::info!(experiment = %msg.experiment, event = %msg.event, "controller event (no notifier configured)");
                Ok(())
            }
        }
    }
}

/// An experiment that backs an active Rollout is the rollout's to drive.
pub fn rollout_owned(org: &Org, experiment: &str) -> bool {
    org.rollouts.values().any(|r| {
        r.experiment == experiment
            && matches!(
                r.status,
                RolloutStatus::Pending | RolloutStatus::Running | RolloutStatus::Paused
            )
    })
}

/// The evidence table in Markdown.
pub fn evidence_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| metric | variant | n | estimate | treatment - control (always valid) | verdict |\n\
         |---|---|---:|---:|---|---|\n",
    );
    for r in rows {
        let interval = r.interval.map_or("-".to_string(), |iv| {
            format!("{:+.4} [{:+.4}, {:+.4}]", iv.estimate, iv.low, iv.high)
        });
        out.push_str(&format!(
            "| {} | {} | {} | {:.4} | {} | {} |\n",
            r.metric, r.variant, r.n, r.estimate, interval, r.verdict
        ));
    }
    out
}

fn pr_body(name: &str, run: u64, action: &ActionState) -> String {
    let mut body = format!(
        "The halo controller decided **{}** for experiment `{name}` (run {run}).\n\n{}\n\n",
        action.decision.as_str(),
        action.verdict.reason
    );
    if let Some(outcome) = action.kill_outcome {
        body.push_str(&format!(
            "killOutcome: `{}`. {}\n\n",
            outcome.as_str(),
            outcome.describe()
        ));
    }
    body.push_str(&evidence_table(&action.verdict.table));
    body.push_str("\nOpened by the halo controller; nothing merges automatically.\n");
    body
}

fn action_message(name: &str, run: u64, action: &ActionState, pr_error: Option<&str>) -> Message {
    let mut msg = Message::decision(name, run, action.decision, &action.verdict.reason);
    msg.kill_outcome = action.kill_outcome;
    msg.enforced = action.kill_outcome.map(KillOutcome::enforced);
    msg.pull_request = action.pull_request.clone();
    msg.table = action.verdict.table.clone();
    let mut text = format!(
        "Experiment {name}: {} ({}).",
        action.decision.as_str(),
        action.verdict.reason
    );
    text.push_str(&crate::notify::outcome_text(
        action.kill_outcome,
        action.pull_request.as_deref(),
        pr_error,
    ));
    msg.text = text;
    msg
}
