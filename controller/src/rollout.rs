//! A rollout's next move for its current step: pure, no I/O, the time passed in. Step 11
//! of the controller loop (spec: halos-low-level-design.md, "Controller loop"; the Rollout
//! document in "Data model"). What happened before is [`crate::rollout_state`]'s chain.
//!
//! For the current step, in this order:
//! 1. the backing experiment's guardrails breached ([`crate::decide`]'s rollback verdict):
//!    the step's `onFailure` (rollback or pause), at any time, since the confidence
//!    sequence is valid at every look;
//! 2. a gate outside its bound, once the step's cohort has the sample floor: `onFailure`,
//!    at any time (a step that hurts people is not left to finish its bake);
//! 3. the bake not over: hold, with the time left;
//! 4. a gate without the sample floor: hold (a step never advances on no evidence);
//! 5. every gate within its bound: advance to the next step, or complete after the last.
//!
//! A gate's value is the mean, over the units of the step's cohort (the backing
//! experiment's treatment variants), of each unit's value of the metric: each unit's
//! error rate, each unit's p95 latency. One heavy user cannot move it more than any
//! other, as with the guardrails' per-unit samples.

use std::collections::{BTreeMap, BTreeSet};

use halo_policy::types::{Axis, CONTROL_VARIANT, Experiment, Gate, OnFailure, Rollout};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::decide::{Decision, Verdict};
use crate::evidence::{Sample, Source};
use crate::stats::MIN_ARM_SAMPLES;

/// What the rollout should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "move", rename_all = "snake_case")]
pub enum Move {
    /// Wait: the bake is not over, or a gate lacks evidence.
    Hold,
    /// Open the PR that moves the rollout to step `to`.
    Advance { to: u32 },
    /// The last step passed: open the PR that concludes the rollout.
    Complete,
    /// Halt, return to the baseline (kill the experiment first on gateway evidence).
    Rollback,
    /// Halt where it is; a human decides.
    Pause,
}

impl Move {
    pub fn as_str(self) -> &'static str {
        match self {
            Move::Hold => "hold",
            Move::Advance { .. } => "advance",
            Move::Complete => "complete",
            Move::Rollback => "rollback",
            Move::Pause => "pause",
        }
    }

    /// Rollback and pause end the rollout's progress until a human acts.
    pub fn halts(self) -> bool {
        matches!(self, Move::Rollback | Move::Pause)
    }
}

/// How one gate reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateState {
    Pass,
    Fail,
    /// Fewer units than the sample floor: neither pass nor fail.
    NoEvidence,
}

/// One gate against its bound, for the status and the pull request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GateReading {
    pub metric: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// The cohort's mean of per-unit values; none without samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// Units in the step's cohort.
    pub n: u64,
    pub state: GateState,
    /// Who stamped the samples (only gateway evidence may kill).
    pub sources: BTreeSet<Source>,
}

/// The evaluation of one rollout at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Evaluation {
    /// The step evaluated (the policy's `step`).
    pub step: u32,
    pub action: Move,
    /// One sentence for humans.
    pub reason: String,
    pub gates: Vec<GateReading>,
    /// Seconds of bake left (zero once it is over).
    pub bake_left_seconds: u64,
    /// The sources of the evidence that decided a rollback or pause.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub deciding_sources: BTreeSet<Source>,
}

impl Evaluation {
    /// Whether this evaluation may trip the kill switch: a rollback of a traffic-axis
    /// rollout decided on gateway evidence alone (ADR-0009: CLI telemetry can be forged,
    /// eval scores are opinion; mixed evidence is not gateway evidence).
    pub fn may_kill(&self, axis: Axis) -> bool {
        self.action == Move::Rollback
            && axis == Axis::Traffic
            && !self.deciding_sources.is_empty()
            && self.deciding_sources.iter().all(|s| *s == Source::Gateway)
    }
}

/// Why a rollout cannot be evaluated: the policy names something that is not there.
/// Validation refuses these documents, so this is a policy served mid-edit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RolloutError {
    #[error("rollout {rollout}: step {step} does not exist (it has {steps} steps)")]
    NoSuchStep {
        rollout: String,
        step: u32,
        steps: usize,
    },
    #[error("rollout {rollout}: step {step}'s bake {bake:?} is not a duration such as 30m or 24h")]
    BadBake {
        rollout: String,
        step: u32,
        bake: String,
    },
}

/// Everything one evaluation needs.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub rollout: &'a Rollout,
    /// The backing experiment (its variants say which units are the step's cohort; its
    /// `minSamples` raises the gates' floor).
    pub experiment: &'a Experiment,
    /// When the controller first saw the policy at this step: the bake runs from here.
    pub step_started: OffsetDateTime,
    pub now: OffsetDateTime,
    /// Per gate metric, every (variant, unit) value since the step started.
    pub samples: &'a BTreeMap<String, Vec<Sample>>,
    /// The backing experiment's verdict this tick, if it was evaluated.
    pub guardrails: Option<&'a Verdict>,
}

/// How long a step bakes.
pub fn bake(rollout: &Rollout, step: u32) -> Result<std::time::Duration, RolloutError> {
    let s = current_step(rollout, step)?;
    humantime::parse_duration(s.bake.trim()).map_err(|_| RolloutError::BadBake {
        rollout: rollout.name.clone(),
        step,
        bake: s.bake.clone(),
    })
}

fn current_step(
    rollout: &Rollout,
    step: u32,
) -> Result<&halo_policy::types::RolloutStep, RolloutError> {
    rollout
        .steps
        .get(step as usize)
        .ok_or_else(|| RolloutError::NoSuchStep {
            rollout: rollout.name.clone(),
            step,
            steps: rollout.steps.len(),
        })
}

/// Read one gate from the cohort's samples.
pub fn read_gate(gate: &Gate, experiment: &Experiment, samples: &[Sample]) -> GateReading {
    let floor = experiment
        .stopping
        .as_ref()
        .and_then(|s| s.min_samples)
        .unwrap_or(0)
        .max(MIN_ARM_SAMPLES);
    let treatment: BTreeSet<&str> = experiment
        .variants
        .iter()
        .map(|v| v.name.as_str())
        .filter(|v| *v != CONTROL_VARIANT)
        .collect();
    let mut sum = 0.0;
    let mut n = 0u64;
    let mut sources = BTreeSet::new();
    for s in samples {
        // A NaN would poison the mean; a sample of another arm is not the cohort's.
        if s.value.is_finite() && treatment.contains(s.variant.as_str()) {
            sum += s.value;
            n += 1;
            sources.insert(s.source);
        }
    }
    let value = (n > 0).then(|| sum / n as f64);
    let state = match value {
        Some(_) if n < floor => GateState::NoEvidence,
        Some(v) if gate.max.is_some_and(|max| v > max) || gate.min.is_some_and(|min| v < min) => {
            GateState::Fail
        }
        Some(_) => GateState::Pass,
        None => GateState::NoEvidence,
    };
    GateReading {
        metric: gate.metric.clone(),
        max: gate.max,
        min: gate.min,
        value,
        n,
        state,
        sources,
    }
}

/// Decide the rollout's move for its current step (see the module doc for the order).
pub fn evaluate(inputs: &Inputs<'_>) -> Result<Evaluation, RolloutError> {
    let rollout = inputs.rollout;
    let step_no = rollout.step;
    let step = current_step(rollout, step_no)?;
    let bake = bake(rollout, step_no)?;
    let baked = (inputs.now - inputs.step_started).max(time::Duration::ZERO);
    let bake_left = time::Duration::try_from(bake)
        .unwrap_or(time::Duration::MAX)
        .saturating_sub(baked)
        .max(time::Duration::ZERO);
    let empty = Vec::new();
    let gates: Vec<GateReading> = step
        .gates
        .iter()
        .map(|g| {
            let samples = inputs.samples.get(&g.metric).unwrap_or(&empty);
            read_gate(g, inputs.experiment, samples)
        })
        .collect();
    let on_failure = match step.on_failure {
        OnFailure::Rollback => Move::Rollback,
        OnFailure::Pause => Move::Pause,
    };
    let done = |action: Move, reason: String, deciding_sources: BTreeSet<Source>| Evaluation {
        step: step_no,
        action,
        reason,
        gates: gates.clone(),
        bake_left_seconds: bake_left.whole_seconds().max(0) as u64,
        deciding_sources,
    };

    // 1. The backing experiment's guardrails.
    if let Some(v) = inputs.guardrails
        && v.decision == Decision::Rollback
    {
        let sources = v
            .deciding
            .as_ref()
            .map(|d| d.sources.clone())
            .unwrap_or_default();
        return Ok(done(
            on_failure,
            format!(
                "step {step_no}: the experiment's guardrail failed: {}",
                v.reason
            ),
            sources,
        ));
    }
    // 2. A gate outside its bound.
    if let Some(g) = gates.iter().find(|g| g.state == GateState::Fail) {
        let reason = format!(
            "step {step_no}: gate {} reads {:.4} over {} units, outside {}",
            g.metric,
            g.value.unwrap_or(f64::NAN),
            g.n,
            bounds(g.min, g.max)
        );
        return Ok(done(on_failure, reason, g.sources.clone()));
    }
    // 3. The bake.
    if bake_left > time::Duration::ZERO {
        let left = std::time::Duration::from_secs(bake_left.whole_seconds().max(0) as u64);
        let reason = format!(
            "step {step_no} bakes for {} more",
            humantime::format_duration(left)
        );
        return Ok(done(Move::Hold, reason, BTreeSet::new()));
    }
    // 4. Evidence for every gate.
    if let Some(g) = gates.iter().find(|g| g.state == GateState::NoEvidence) {
        let reason = format!(
            "step {step_no}: gate {} has {} units in the step's cohort, fewer than the floor",
            g.metric, g.n
        );
        return Ok(done(Move::Hold, reason, BTreeSet::new()));
    }
    // 5. Every gate holds.
    let next = step_no + 1;
    if (next as usize) < rollout.steps.len() {
        Ok(done(
            Move::Advance { to: next },
            format!("step {step_no} baked and every gate holds: on to step {next}"),
            BTreeSet::new(),
        ))
    } else {
        Ok(done(
            Move::Complete,
            format!("the last step ({step_no}) baked and every gate holds"),
            BTreeSet::new(),
        ))
    }
}

fn bounds(min: Option<f64>, max: Option<f64>) -> String {
    match (min, max) {
        (Some(min), Some(max)) => format!("[{min}, {max}]"),
        (Some(min), None) => format!("min {min}"),
        (None, Some(max)) => format!("max {max}"),
        (None, None) => "no bound".into(),
    }
}
