//! The verdict for one running experiment, from its evidence: pure, no I/O, no clock
//! (the time is passed in). Steps 5-8 of the controller loop, in order:
//!
//! 1. guardrails, each at alpha / (guardrails x treatment arms): any breach is rollback,
//!    at any sample size (the sequence stays valid at every look);
//! 2. budgets: past `maxDays` since the run started, or past `maxSpendUSD`, is expired;
//! 3. fewer than `minSamples` in any arm is continue;
//! 4. the primary metric at alpha / treatment arms: a significant regression is rollback,
//!    a significant improvement with every guardrail holding is promote.
//!
//! The verdict carries the evidence table (per metric and variant: n, estimate, interval,
//! verdict) the pull request and the notification show, and the sources of the evidence
//! that decided a rollback: the kill may only be tripped on gateway evidence.

use std::collections::{BTreeMap, BTreeSet};

use halo_policy::types::{CONTROL_VARIANT, Direction, Experiment, Metric};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::evidence::{Sample, Source};
use crate::stats::{self, Arm, Better, GuardrailVerdict, Interval, PrimaryVerdict};

/// Significance level when the experiment names none.
pub const DEFAULT_ALPHA: f64 = 0.05;

/// What the controller should do with an experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Continue,
    Rollback,
    Promote,
    Expired,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Continue => "continue",
            Decision::Rollback => "rollback",
            Decision::Promote => "promote",
            Decision::Expired => "expired",
        }
    }
}

/// The metric role in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Guardrail,
    Primary,
}

/// One line of the evidence table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Row {
    pub metric: String,
    pub role: Role,
    pub variant: String,
    pub n: u64,
    /// The arm's mean.
    pub estimate: f64,
    /// Treatment - control, always valid; none for control or below the sample floor.
    pub interval: Option<Interval>,
    pub verdict: String,
}

/// The metric and arm that decided a rollback or promotion, and where its samples came
/// from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Deciding {
    pub metric: String,
    pub variant: String,
    pub sources: BTreeSet<Source>,
}

impl Deciding {
    /// Only evidence stamped by the gateway receiver may trip the kill switch: CLI
    /// telemetry can be forged and eval scores are opinion (ADR-0009 addendum). Mixed
    /// evidence is not gateway evidence.
    pub fn is_gateway_only(&self) -> bool {
        !self.sources.is_empty() && self.sources.iter().all(|s| *s == Source::Gateway)
    }
}

/// A verdict with its reasons.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Verdict {
    pub decision: Decision,
    /// One sentence for humans.
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deciding: Option<Deciding>,
    pub table: Vec<Row>,
    /// Samples per arm (the smallest over the metrics), for status.
    pub samples: BTreeMap<String, u64>,
}

/// Everything one evaluation needs.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub experiment: &'a Experiment,
    /// Samples per metric name (guardrails and primary).
    pub samples: &'a BTreeMap<String, Vec<Sample>>,
    pub spend_usd: f64,
    pub run_started: OffsetDateTime,
    pub now: OffsetDateTime,
}

/// The metric names the experiment needs evidence for, guardrails first.
pub fn metric_names(experiment: &Experiment) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    if let Some(m) = &experiment.metrics {
        for g in &m.guardrails {
            if !names.contains(&g.name) {
                names.push(g.name.clone());
            }
        }
        if let Some(p) = &m.primary
            && !names.contains(&p.name)
        {
            names.push(p.name.clone());
        }
    }
    names
}

/// Per-variant arms of one metric, and the sources seen per variant. Non-finite values
/// are dropped (a NaN would poison every running sum).
struct Arms {
    arms: BTreeMap<String, Arm>,
    sources: BTreeMap<String, BTreeSet<Source>>,
}

fn arms(experiment: &Experiment, samples: &[Sample]) -> Arms {
    let mut arms: BTreeMap<String, Arm> = experiment
        .variants
        .iter()
        .map(|v| (v.name.clone(), Arm::default()))
        .collect();
    let mut sources: BTreeMap<String, BTreeSet<Source>> = BTreeMap::new();
    for s in samples {
        if !s.value.is_finite() {
            continue;
        }
        if let Some(arm) = arms.get_mut(&s.variant) {
            arm.push(s.value);
            sources
                .entry(s.variant.clone())
                .or_default()
                .insert(s.source);
        }
    }
    Arms { arms, sources }
}

fn better(metric: &Metric, default: Better) -> Better {
    match metric.direction {
        Some(Direction::Increase) => Better::Higher,
        Some(Direction::Decrease) => Better::Lower,
        None => default,
    }
}

fn deciding(metric: &str, variant: &str, arms: &Arms) -> Deciding {
    let mut sources = BTreeSet::new();
    for v in [CONTROL_VARIANT, variant] {
        if let Some(s) = arms.sources.get(v) {
            sources.extend(s.iter().copied());
        }
    }
    Deciding {
        metric: metric.to_string(),
        variant: variant.to_string(),
        sources,
    }
}

/// Decide one experiment (see the module doc for the order of the steps).
pub fn decide(inputs: &Inputs<'_>) -> Verdict {
    let exp = inputs.experiment;
    let alpha = exp
        .stopping
        .as_ref()
        .and_then(|s| s.alpha)
        .filter(|a| *a > 0.0 && *a < 1.0)
        .unwrap_or(DEFAULT_ALPHA);
    let treatments: Vec<&str> = exp
        .variants
        .iter()
        .map(|v| v.name.as_str())
        .filter(|n| *n != CONTROL_VARIANT)
        .collect();
    let k = treatments.len().max(1) as f64;
    let empty = Vec::new();
    let samples_of = |name: &str| inputs.samples.get(name).unwrap_or(&empty);
    let guardrails: &[Metric] = exp
        .metrics
        .as_ref()
        .map(|m| m.guardrails.as_slice())
        .unwrap_or(&[]);
    let mut table = Vec::new();
    let mut samples: BTreeMap<String, u64> = BTreeMap::new();
    let mut note_samples = |arms: &Arms| {
        for (v, a) in &arms.arms {
            let e = samples.entry(v.clone()).or_insert(a.n);
            *e = (*e).min(a.n);
        }
    };

    // 1. Guardrails.
    let alpha_g = alpha / (guardrails.len().max(1) as f64 * k);
    let mut breach: Option<(Deciding, String)> = None;
    let mut all_holding = true;
    for g in guardrails {
        let arms = arms(exp, samples_of(&g.name));
        note_samples(&arms);
        let control = arms.arms.get(CONTROL_VARIANT).copied().unwrap_or_default();
        push_control_row(&mut table, &g.name, Role::Guardrail, &control);
        for t in &treatments {
            let arm = arms.arms.get(*t).copied().unwrap_or_default();
            let tolerance = g.threshold.unwrap_or(0.0);
            let (verdict, interval) =
                stats::guardrail(&control, &arm, better(g, Better::Lower), tolerance, alpha_g);
            all_holding &= verdict == GuardrailVerdict::Holding;
            let word = match verdict {
                GuardrailVerdict::Insufficient => "insufficient",
                GuardrailVerdict::Holding => "holding",
                GuardrailVerdict::Breached => "breached",
            };
            table.push(Row {
                metric: g.name.clone(),
                role: Role::Guardrail,
                variant: t.to_string(),
                n: arm.n,
                estimate: arm.mean,
                interval,
                verdict: word.to_string(),
            });
            if verdict == GuardrailVerdict::Breached && breach.is_none() {
                breach = Some((
                    deciding(&g.name, t, &arms),
                    format!(
                        "guardrail {} breached by {t} (tolerance {:.0}%, alpha {alpha_g:.4})",
                        g.name,
                        tolerance * 100.0
                    ),
                ));
            }
        }
    }

    // The primary metric's rows are in every verdict's table.
    let primary = exp.metrics.as_ref().and_then(|m| m.primary.as_ref());
    let alpha_p = alpha / k;
    let mut primary_results: Vec<(&str, PrimaryVerdict)> = Vec::new();
    let mut primary_arms = None;
    if let Some(p) = primary {
        let arms = arms(exp, samples_of(&p.name));
        note_samples(&arms);
        let control = arms.arms.get(CONTROL_VARIANT).copied().unwrap_or_default();
        push_control_row(&mut table, &p.name, Role::Primary, &control);
        for t in &treatments {
            let arm = arms.arms.get(*t).copied().unwrap_or_default();
            let (verdict, interval) =
                stats::primary(&control, &arm, better(p, Better::Higher), alpha_p);
            let word = match verdict {
                PrimaryVerdict::Insufficient => "insufficient",
                PrimaryVerdict::Inconclusive => "inconclusive",
                PrimaryVerdict::Improved => "improved",
                PrimaryVerdict::Regressed => "regressed",
            };
            table.push(Row {
                metric: p.name.clone(),
                role: Role::Primary,
                variant: t.to_string(),
                n: arm.n,
                estimate: arm.mean,
                interval,
                verdict: word.to_string(),
            });
            primary_results.push((t, verdict));
        }
        primary_arms = Some(arms);
    }
    let verdict = |decision, reason: String, deciding| Verdict {
        decision,
        reason,
        deciding,
        table: table.clone(),
        samples: samples.clone(),
    };

    if let Some((d, reason)) = breach {
        return verdict(Decision::Rollback, reason, Some(d));
    }

    // 2. Budgets.
    let stopping = exp.stopping.as_ref();
    if let Some(days) = stopping.and_then(|s| s.max_days) {
        let limit = time::Duration::days(i64::from(days));
        if inputs.now - inputs.run_started > limit {
            return verdict(
                Decision::Expired,
                format!(
                    "maxDays {days} passed (the run started {})",
                    inputs.run_started
                ),
                None,
            );
        }
    }
    if let Some(max) = stopping.and_then(|s| s.max_spend_usd)
        && inputs.spend_usd > max
    {
        return verdict(
            Decision::Expired,
            format!("spent {:.2} USD, past maxSpendUSD {max}", inputs.spend_usd),
            None,
        );
    }

    // 3. Sample floor.
    let floor = stopping
        .and_then(|s| s.min_samples)
        .unwrap_or(0)
        .max(stats::MIN_ARM_SAMPLES);
    if let Some((v, n)) = samples.iter().find(|(_, n)| **n < floor) {
        return verdict(
            Decision::Continue,
            format!("{v} has {n} samples, fewer than the {floor} every arm needs"),
            None,
        );
    }

    // 4. Primary.
    let (Some(p), Some(arms)) = (primary, primary_arms.as_ref()) else {
        return verdict(
            Decision::Continue,
            "no primary metric: only guardrails are watched".to_string(),
            None,
        );
    };
    if let Some((t, _)) = primary_results
        .iter()
        .find(|(_, v)| *v == PrimaryVerdict::Regressed)
    {
        return verdict(
            Decision::Rollback,
            format!(
                "primary metric {} regressed in {t} (alpha {alpha_p:.4})",
                p.name
            ),
            Some(deciding(&p.name, t, arms)),
        );
    }
    let improved: Vec<&str> = primary_results
        .iter()
        .filter(|(_, v)| *v == PrimaryVerdict::Improved)
        .map(|(t, _)| *t)
        .collect();
    if let Some(best) = best_of(&improved, arms, better(p, Better::Higher)) {
        if all_holding {
            return verdict(
                Decision::Promote,
                format!(
                    "primary metric {} improved in {best} and every guardrail holds",
                    p.name
                ),
                Some(deciding(&p.name, best, arms)),
            );
        }
        return verdict(
            Decision::Continue,
            format!(
                "{best} improved {} but a guardrail has too few samples yet",
                p.name
            ),
            None,
        );
    }
    verdict(
        Decision::Continue,
        format!("primary metric {} is inconclusive", p.name),
        None,
    )
}

fn push_control_row(table: &mut Vec<Row>, metric: &str, role: Role, control: &Arm) {
    table.push(Row {
        metric: metric.to_string(),
        role,
        variant: CONTROL_VARIANT.to_string(),
        n: control.n,
        estimate: control.mean,
        interval: None,
        verdict: "baseline".to_string(),
    });
}

/// Of several improved arms, the one with the best mean.
fn best_of<'a>(improved: &[&'a str], arms: &Arms, better: Better) -> Option<&'a str> {
    let mean = |v: &str| arms.arms.get(v).map(|a| a.mean).unwrap_or(0.0);
    improved.iter().copied().max_by(|a, b| {
        let (ma, mb) = (mean(a), mean(b));
        let ord = ma.partial_cmp(&mb).unwrap_or(std::cmp::Ordering::Equal);
        if better == Better::Higher {
            ord
        } else {
            ord.reverse()
        }
    })
}
