//! Step 11 of the controller loop: drive each running Rollout one tick (spec:
//! halos-low-level-design.md, "Controller loop" 11). The decision is
//! [`crate::rollout::evaluate`]'s (pure); this module reads its inputs and carries out its
//! move, recording each transition in the rollout's hash chain
//! ([`crate::rollout_state`]) so that every action happens at most once:
//!
//! - a chain that does not verify is never acted on: the rollout is reported `refused`
//!   and held until an operator repairs or removes the file;
//! - the first tick at a policy step records `step_started` (the bake runs from there, so
//!   a restart mid-bake resumes it);
//! - a move decided at this step is finished, never decided again: rollback (traffic axis:
//!   the kill switch first, on gateway evidence only) -> PR -> notify; pause -> PR ->
//!   notify; advance and complete -> PR -> notify. Each step runs even if the one before
//!   failed; a failed PR or notification fails the tick so the next (sooner) tick retries
//!   just that step;
//! - a rollout halted by rollback or pause stays halted until the policy moves it (a
//!   human merges the PR, or edits the rollout's `step` or `status`).
//!
//! The PRs edit the policy as a human would: advance sets the rollout's `step`, complete
//! sets `status: complete`, pause `status: paused`, rollback `status: rolled-back` and
//! pauses the backing experiment (so its treatment stops even where the kill switch was
//! not enforced), the body naming the baseline to return to.

use std::collections::BTreeMap;

use halo_policy::types::{Axis, Experiment, Kind, Org, Rollout};
use serde::Serialize;
use time::OffsetDateTime;

use crate::controller::Controller;
use crate::decide::{self, Inputs as DecideInputs};
use crate::kill::KillOutcome;
use crate::notify::Message;
use crate::pr::{Edit, PrRequest};
use crate::rollout::{self, Evaluation, GateReading, Move};
use crate::rollout_state::{self, Chain, Event, StepAction};

/// What one rollout looked like at the last tick (for status and the API).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutReport {
    /// The policy's step.
    pub step: u32,
    /// evaluated (holding), acted (a move decided at this step), halted (rollback or
    /// pause decided: waiting for a human), refused (the state file does not verify),
    /// failed.
    pub state: String,
    /// This tick's evaluation, when the rollout was evaluated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<Evaluation>,
    /// The move decided at this step and its actions so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<StepAction>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub step_started: Option<OffsetDateTime>,
    /// Whether the state file's hash chain verified, its records and its head hash.
    pub chain_verified: bool,
    pub records: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RolloutReport {
    fn of(rollout: &Rollout, chain: &Chain, state: &str) -> RolloutReport {
        RolloutReport {
            step: rollout.step,
            state: state.to_string(),
            evaluation: None,
            action: chain
                .state()
                .action
                .clone()
                .filter(|a| a.step == rollout.step),
            step_started: chain.state().step_started,
            chain_verified: true,
            records: chain.records().len(),
            head: chain.head().map(str::to_string),
            error: None,
        }
    }

    pub(crate) fn failed(rollout: &Rollout, error: String) -> RolloutReport {
        RolloutReport {
            step: rollout.step,
            state: "failed".to_string(),
            evaluation: None,
            action: None,
            step_started: None,
            chain_verified: true,
            records: 0,
            head: None,
            error: Some(error),
        }
    }
}

impl Controller {
    /// One running rollout at `now`; an `Err` is a message for the tick's failure.
    pub(crate) async fn drive(
        &self,
        org: &Org,
        rollout: &Rollout,
        now: OffsetDateTime,
    ) -> Result<RolloutReport, String> {
        let name = rollout.name.as_str();
        let mut chain = match rollout_state::load(self.data_dir(), name) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(rollout = name, error = %e, "rollout state refused; the rollout is held");
                return Ok(RolloutReport {
                    step: rollout.step,
                    state: "refused".to_string(),
                    evaluation: None,
                    action: None,
                    step_started: None,
                    chain_verified: false,
                    records: 0,
                    head: None,
                    error: Some(e.to_string()),
                });
            }
        };
        if chain.state().step != Some(rollout.step) {
            chain
                .append(now, Event::StepStarted { step: rollout.step })
                .map_err(|e| e.to_string())?;
        }
        let experiment = org.experiments.get(&rollout.experiment).ok_or_else(|| {
            format!(
                "rollout {name} names experiment {} which the policy does not have",
                rollout.experiment
            )
        })?;

        // A move decided at this step: finish it, decide no more.
        if let Some(action) = chain
            .state()
            .action
            .clone()
            .filter(|a| a.step == rollout.step)
        {
            let halts = action.evaluation.action.halts();
            self.finish_rollout(org, rollout, experiment, &mut chain, action, now)
                .await?;
            let state = if halts { "halted" } else { "acted" };
            return Ok(RolloutReport::of(rollout, &chain, state));
        }

        let step_started = chain.state().step_started.unwrap_or(now);
        let evaluation = self
            .evaluate_rollout(rollout, experiment, step_started, now)
            .await?;
        if evaluation.action == Move::Hold {
            let mut report = RolloutReport::of(rollout, &chain, "evaluated");
            report.evaluation = Some(evaluation);
            return Ok(report);
        }
        chain
            .append(
                now,
                Event::Decided {
                    step: rollout.step,
                    evaluation: Box::new(evaluation.clone()),
                },
            )
            .map_err(|e| e.to_string())?;
        let Some(action) = chain.state().action.clone() else {
            return Err("the decision was not recorded".to_string());
        };
        let halts = evaluation.action.halts();
        self.finish_rollout(org, rollout, experiment, &mut chain, action, now)
            .await?;
        let mut report = RolloutReport::of(rollout, &chain, if halts { "halted" } else { "acted" });
        report.evaluation = Some(evaluation);
        Ok(report)
    }

    /// Read the step's gates and the backing experiment's guardrails since the step
    /// started, and evaluate.
    async fn evaluate_rollout(
        &self,
        rollout: &Rollout,
        experiment: &Experiment,
        step_started: OffsetDateTime,
        now: OffsetDateTime,
    ) -> Result<Evaluation, String> {
        let exp = rollout.experiment.as_str();
        let step = rollout.steps.get(rollout.step as usize).ok_or_else(|| {
            rollout::RolloutError::NoSuchStep {
                rollout: rollout.name.clone(),
                step: rollout.step,
                steps: rollout.steps.len(),
            }
            .to_string()
        })?;
        let mut metrics: Vec<String> = decide::metric_names(experiment);
        for g in &step.gates {
            if !metrics.contains(&g.metric) {
                metrics.push(g.metric.clone());
            }
        }
        let mut samples = BTreeMap::new();
        for metric in metrics {
            let s = self
                .evidence
                .samples(exp, &metric, step_started)
                .await
                .map_err(|e| e.to_string())?;
            samples.insert(metric, s);
        }
        let spend_usd = self
            .evidence
            .spend_usd(exp, step_started)
            .await
            .map_err(|e| e.to_string())?;
        let guardrails = decide::decide(&DecideInputs {
            experiment,
            samples: &samples,
            spend_usd,
            run_started: step_started,
            now,
        });
        rollout::evaluate(&rollout::Inputs {
            rollout,
            experiment,
            step_started,
            now,
            samples: &samples,
            guardrails: Some(&guardrails),
        })
        .map_err(|e| e.to_string())
    }

    /// The decided move's steps not yet recorded: kill (traffic rollback), PR, notify.
    async fn finish_rollout(
        &self,
        org: &Org,
        rollout: &Rollout,
        experiment: &Experiment,
        chain: &mut Chain,
        mut action: StepAction,
        now: OffsetDateTime,
    ) -> Result<(), String> {
        let step = action.step;
        let mv = action.evaluation.action;
        if mv == Move::Rollback && rollout.axis == Axis::Traffic && action.kill_outcome.is_none() {
            let reason = format!(
                "halo controller: rollout {} rolled back: {}",
                rollout.name, action.evaluation.reason
            );
            let outcome = self
                .trip(
                    &experiment.name,
                    action.evaluation.may_kill(rollout.axis),
                    &reason,
                )
                .await;
            chain
                .append(now, Event::Kill { step, outcome })
                .map_err(|e| e.to_string())?;
            action.kill_outcome = Some(outcome);
        }
        let mut errors = Vec::new();
        if action.pull_request.is_none() {
            match self.rollout_pr(org, rollout, experiment, &action) {
                Ok(request) => match self.pulls.open(&request).await {
                    Ok(url) => {
                        chain
                            .append(
                                now,
                                Event::PullRequest {
                                    step,
                                    url: url.clone(),
                                },
                            )
                            .map_err(|e| e.to_string())?;
                        action.pull_request = Some(url);
                    }
                    Err(e) => errors.push(format!("pull request: {e}")),
                },
                Err(e) => errors.push(format!("pull request: {e}")),
            }
        }
        if !action.notified {
            let msg = rollout_message(rollout, &action, errors.first().map(String::as_str));
            match self.send(&msg).await {
                Ok(()) => chain
                    .append(now, Event::Notified { step })
                    .map_err(|e| e.to_string())?,
                Err(e) => errors.push(e),
            }
        }
        match errors.first() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn rollout_pr(
        &self,
        org: &Org,
        rollout: &Rollout,
        experiment: &Experiment,
        action: &StepAction,
    ) -> Result<PrRequest, String> {
        let name = rollout.name.as_str();
        let file_of = |kind: Kind, doc: &str| {
            org.source(kind, doc)
                .map(|s| std::path::PathBuf::from(&s.file))
                .ok_or_else(|| format!("the policy does not say which file holds {doc}"))
        };
        let rollout_file = file_of(Kind::Rollout, name)?;
        let step = action.step;
        let (edits, title) = match action.evaluation.action {
            Move::Advance { to } => {
                let target = rollout.steps.get(to as usize);
                let cohort = target.map_or(String::new(), |s| match s.percent {
                    Some(p) => format!(" ({} ring, {p}%)", s.ring),
                    None => format!(" ({} ring)", s.ring),
                });
                (
                    vec![Edit::rollout(rollout_file, name, "step", to.to_string())],
                    format!("Rollout {name}: advance to step {to}{cohort}"),
                )
            }
            Move::Complete => (
                vec![Edit::rollout(
                    rollout_file,
                    name,
                    "status",
                    "complete".into(),
                )],
                format!("Rollout {name}: complete"),
            ),
            Move::Pause => (
                vec![Edit::rollout(rollout_file, name, "status", "paused".into())],
                format!("Rollout {name}: pause at step {step}"),
            ),
            Move::Rollback => (
                vec![
                    Edit::rollout(rollout_file, name, "status", "rolled-back".into()),
                    Edit::experiment_status(
                        file_of(Kind::Experiment, &experiment.name)?,
                        &experiment.name,
                        halo_policy::types::ExperimentStatus::Paused,
                    ),
                ],
                format!("Roll back rollout {name} at step {step}"),
            ),
            Move::Hold => return Err("a hold opens no pull request".to_string()),
        };
        Ok(PrRequest {
            edits,
            branch: format!(
                "halo-controller/rollout-{name}/step-{step}-{}",
                action.evaluation.action.as_str()
            ),
            title,
            body: rollout_pr_body(rollout, action),
        })
    }
}

/// The gates against their bounds, in Markdown.
pub fn gate_table(gates: &[GateReading]) -> String {
    let mut out = String::from(
        "| gate | bound | value | units | state | evidence |\n|---|---|---:|---:|---|---|\n",
    );
    for g in gates {
        let bound = match (g.min, g.max) {
            (Some(min), Some(max)) => format!("[{min}, {max}]"),
            (Some(min), None) => format!(">= {min}"),
            (None, Some(max)) => format!("<= {max}"),
            (None, None) => "-".to_string(),
        };
        let value = g.value.map_or("-".to_string(), |v| format!("{v:.4}"));
        let sources: Vec<&str> = g.sources.iter().map(|s| s.as_str()).collect();
        out.push_str(&format!(
            "| {} | {bound} | {value} | {} | {:?} | {} |\n",
            g.metric,
            g.n,
            g.state,
            if sources.is_empty() {
                "-".to_string()
            } else {
                sources.join(", ")
            }
        ));
    }
    out
}

fn rollout_pr_body(rollout: &Rollout, action: &StepAction) -> String {
    let e = &action.evaluation;
    let mut body = format!(
        "The halo controller decided **{}** for rollout `{}` at step {} ({} axis, experiment `{}`).\n\n{}\n\n",
        e.action.as_str(),
        rollout.name,
        action.step,
        match rollout.axis {
            Axis::Traffic => "traffic",
            Axis::Client => "client",
        },
        rollout.experiment,
        e.reason
    );
    if e.action == Move::Rollback {
        match rollout.baseline.as_ref().and_then(|b| b.release.as_deref()) {
            Some(release) => body.push_str(&format!(
                "Rolls back to the baseline release `{release}`: the rollout is marked rolled-back and its experiment paused.\n\n"
            )),
            None => body.push_str(
                "Rolls back to the baseline (the policy's own routes and releases): the rollout is marked rolled-back and its experiment paused.\n\n",
            ),
        }
    }
    if let Some(outcome) = action.kill_outcome {
        body.push_str(&format!(
            "killOutcome: `{}`. {}\n\n",
            outcome.as_str(),
            outcome.describe()
        ));
    }
    body.push_str(&gate_table(&e.gates));
    body.push_str("\nOpened by the halo controller; nothing merges automatically.\n");
    body
}

fn rollout_message(rollout: &Rollout, action: &StepAction, pr_error: Option<&str>) -> Message {
    let e = &action.evaluation;
    let mut msg = Message {
        experiment: rollout.experiment.clone(),
        run: 0,
        event: format!("rollout_{}", e.action.as_str()),
        reason: e.reason.clone(),
        kill_outcome: action.kill_outcome,
        enforced: action.kill_outcome.map(KillOutcome::enforced),
        pull_request: action.pull_request.clone(),
        table: Vec::new(),
        text: String::new(),
        rollout: Some(rollout.name.clone()),
        step: Some(action.step),
        gates: e.gates.clone(),
    };
    let mut text = format!(
        "Rollout {} step {}: {} ({}).",
        rollout.name,
        action.step,
        e.action.as_str(),
        e.reason
    );
    text.push_str(&crate::notify::outcome_text(
        action.kill_outcome,
        action.pull_request.as_deref(),
        pr_error,
    ));
    msg.text = text;
    msg
}
