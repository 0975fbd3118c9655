//! The rollout's pure evaluation and its hash-chained state file, on the example policy's
//! two rollouts (examples/acme-corp/rollouts): a traffic rollout (sonnet-bedrock, backed by
//! sonnet-bedrock-canary) and a client rollout (harness-upgrade).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use halo_controller::decide::{Deciding, Decision, Verdict};
use halo_controller::evidence::{Sample, Source};
use halo_controller::kill::KillOutcome;
use halo_controller::rollout::{self, Evaluation, GateState, Inputs, Move};
use halo_controller::rollout_state::{self, ChainError, Event};
use halo_policy::types::{Axis, Org};
use time::{Duration, OffsetDateTime, macros::datetime};

const T0: OffsetDateTime = datetime!(2026-12-01 12:00 UTC);
const ERROR_RATE: &str = "halo.api.error_rate";
const P95: &str = "halo.latency.p95";

fn org() -> Org {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp");
    halo_policy::load::load_dir(&dir).expect("the example policy loads")
}

/// `n` units of `variant`, each with `value`.
fn units(variant: &str, n: usize, value: f64, source: Source) -> Vec<Sample> {
    (0..n)
        .map(|i| Sample {
            variant: variant.into(),
            unit: format!("{variant}-u{i}"),
            value,
            source,
        })
        .collect()
}

/// The traffic rollout at `step`, its experiment's floor lowered to 40 units per arm.
struct Traffic {
    org: Org,
}

impl Traffic {
    fn at(step: u32) -> Traffic {
        let mut org = org();
        org.rollouts.get_mut("sonnet-bedrock").unwrap().step = step;
        let exp = org.experiments.get_mut("sonnet-bedrock-canary").unwrap();
        exp.stopping.as_mut().unwrap().min_samples = Some(40);
        Traffic { org }
    }

    fn eval(
        &self,
        since_start: Duration,
        samples: &BTreeMap<String, Vec<Sample>>,
        guardrails: Option<&Verdict>,
    ) -> Evaluation {
        rollout::evaluate(&Inputs {
            rollout: &self.org.rollouts["sonnet-bedrock"],
            experiment: &self.org.experiments["sonnet-bedrock-canary"],
            step_started: T0,
            now: T0 + since_start,
            samples,
            guardrails,
        })
        .expect("evaluates")
    }
}

/// Gate samples for step 0 (error rate at most 0.02, p95 at most 8000 ms): the treatment
/// arm ("canary") at the given values, control far worse (it must not count).
fn step0_samples(
    error_rate: f64,
    p95: f64,
    n: usize,
    source: Source,
) -> BTreeMap<String, Vec<Sample>> {
    let mut err = units("canary", n, error_rate, source);
    err.extend(units("control", n, 0.9, source));
    let mut lat = units("canary", n, p95, source);
    lat.extend(units("control", n, 60_000.0, source));
    BTreeMap::from([(ERROR_RATE.to_string(), err), (P95.to_string(), lat)])
}

#[test]
fn a_step_holds_while_it_bakes_then_advances_when_its_gates_hold() {
    let t = Traffic::at(0);
    // 1/64: exact in binary, so the mean is too.
    let good = step0_samples(0.015625, 5000.0, 50, Source::Gateway);
    // Step 0 bakes 30m.
    let e = t.eval(Duration::minutes(10), &good, None);
    assert_eq!(e.action, Move::Hold, "{e:?}");
    assert_eq!(e.bake_left_seconds, 20 * 60);
    assert!(e.reason.contains("20m"), "{}", e.reason);
    assert!(
        e.gates.iter().all(|g| g.state == GateState::Pass),
        "{:?}",
        e.gates
    );

    let e = t.eval(Duration::minutes(30), &good, None);
    assert_eq!(e.action, Move::Advance { to: 1 }, "{e:?}");
    assert_eq!(e.bake_left_seconds, 0);
    // Only the treatment arm counts: control's 0.9 error rate is not the cohort's.
    let err = e.gates.iter().find(|g| g.metric == ERROR_RATE).unwrap();
    assert_eq!((err.value, err.n), (Some(0.015625), 50));
}

#[test]
fn the_last_step_completes() {
    let t = Traffic::at(3);
    let mut samples = step0_samples(0.005, 5000.0, 50, Source::Gateway);
    samples.remove(P95);
    let e = t.eval(Duration::hours(72), &samples, None);
    assert_eq!(e.action, Move::Complete, "{e:?}");
}

#[test]
fn a_gate_without_the_sample_floor_holds_after_the_bake_and_never_fails() {
    let t = Traffic::at(0);
    // 39 units of a terrible error rate: under the floor of 40, neither pass nor fail.
    let few = step0_samples(0.5, 5000.0, 39, Source::Gateway);
    let e = t.eval(Duration::hours(1), &few, None);
    assert_eq!(e.action, Move::Hold, "{e:?}");
    assert!(e.gates.iter().all(|g| g.state == GateState::NoEvidence));
    assert!(e.reason.contains("fewer than the floor"), "{}", e.reason);
    // No samples at all: the same.
    let e = t.eval(Duration::hours(1), &BTreeMap::new(), None);
    assert_eq!(e.action, Move::Hold);
}

#[test]
fn a_failing_gate_rolls_back_during_the_bake_and_only_gateway_evidence_may_kill() {
    let t = Traffic::at(0);
    let bad = step0_samples(0.05, 5000.0, 50, Source::Gateway);
    let e = t.eval(Duration::minutes(5), &bad, None);
    assert_eq!(e.action, Move::Rollback, "{e:?}");
    assert!(e.reason.contains(ERROR_RATE), "{}", e.reason);
    assert_eq!(e.deciding_sources, BTreeSet::from([Source::Gateway]));
    assert!(e.may_kill(Axis::Traffic));
    // A client rollout never kills; neither does CLI-sourced evidence.
    assert!(!e.may_kill(Axis::Client));
    let cli = step0_samples(0.05, 5000.0, 50, Source::Cli);
    let e = t.eval(Duration::minutes(5), &cli, None);
    assert_eq!(e.action, Move::Rollback);
    assert!(!e.may_kill(Axis::Traffic), "{e:?}");
}

#[test]
fn a_min_bound_fails_below_it_and_pause_steps_pause() {
    // Step 2: error rate at most 0.01 and accepted edits at least 0.6, onFailure rollback.
    let t = Traffic::at(2);
    let mut samples = BTreeMap::new();
    samples.insert(
        ERROR_RATE.to_string(),
        units("canary", 50, 0.0, Source::Gateway),
    );
    samples.insert(
        "halo.session.accepted_edits".to_string(),
        units("canary", 50, 0.4, Source::Cli),
    );
    let e = t.eval(Duration::hours(30), &samples, None);
    assert_eq!(e.action, Move::Rollback);
    assert!(e.reason.contains("min 0.6"), "{}", e.reason);
    assert!(!e.may_kill(Axis::Traffic), "CLI evidence decided: {e:?}");

    // Step 3 pauses (a human decides at the widest step).
    let t = Traffic::at(3);
    let samples = BTreeMap::from([(
        ERROR_RATE.to_string(),
        units("canary", 50, 0.2, Source::Gateway),
    )]);
    let e = t.eval(Duration::hours(1), &samples, None);
    assert_eq!(e.action, Move::Pause);
    assert!(e.action.halts());
    assert!(!e.may_kill(Axis::Traffic), "a pause never kills");
}

#[test]
fn a_guardrail_breach_of_the_backing_experiment_is_the_steps_failure() {
    let t = Traffic::at(0);
    let good = step0_samples(0.01, 5000.0, 50, Source::Gateway);
    let breach = Verdict {
        decision: Decision::Rollback,
        reason: "halo.latency.p95 regressed".into(),
        deciding: Some(Deciding {
            metric: P95.into(),
            variant: "canary".into(),
            sources: BTreeSet::from([Source::Gateway]),
        }),
        table: Vec::new(),
        samples: BTreeMap::new(),
    };
    let e = t.eval(Duration::minutes(1), &good, Some(&breach));
    assert_eq!(e.action, Move::Rollback, "{e:?}");
    assert!(e.reason.contains("guardrail"), "{}", e.reason);
    assert!(e.may_kill(Axis::Traffic));
    // A continue verdict changes nothing.
    let cont = Verdict {
        decision: Decision::Continue,
        deciding: None,
        ..breach
    };
    assert_eq!(
        t.eval(Duration::minutes(1), &good, Some(&cont)).action,
        Move::Hold
    );
}

#[test]
fn a_step_the_policy_does_not_have_is_an_error() {
    let t = Traffic::at(7);
    let err = rollout::evaluate(&Inputs {
        rollout: &t.org.rollouts["sonnet-bedrock"],
        experiment: &t.org.experiments["sonnet-bedrock-canary"],
        step_started: T0,
        now: T0,
        samples: &BTreeMap::new(),
        guardrails: None,
    })
    .unwrap_err();
    assert!(err.to_string().contains("step 7 does not exist"), "{err}");
}

// --- the state file -------------------------------------------------------------------

fn evaluation(action: Move) -> Box<Evaluation> {
    Box::new(Evaluation {
        step: 0,
        action,
        reason: "because".into(),
        gates: Vec::new(),
        bake_left_seconds: 0,
        deciding_sources: BTreeSet::from([Source::Gateway]),
    })
}

/// A chain with a started step, a rollback decided and its kill and PR recorded.
fn written(data: &Path) {
    let mut chain = rollout_state::load(data, "sonnet-bedrock").unwrap();
    chain.append(T0, Event::StepStarted { step: 0 }).unwrap();
    chain
        .append(
            T0 + Duration::minutes(5),
            Event::Decided {
                step: 0,
                evaluation: evaluation(Move::Rollback),
            },
        )
        .unwrap();
    chain
        .append(
            T0 + Duration::minutes(5),
            Event::Kill {
                step: 0,
                outcome: KillOutcome::Killed,
            },
        )
        .unwrap();
    chain
        .append(
            T0 + Duration::minutes(6),
            Event::PullRequest {
                step: 0,
                url: "https://example.invalid/pr/1".into(),
            },
        )
        .unwrap();
}

fn file(data: &Path) -> std::path::PathBuf {
    data.join("rollouts/sonnet-bedrock.json")
}

#[test]
fn the_chain_survives_a_restart_with_its_bake_clock_and_actions() {
    let data = tempfile::tempdir().unwrap();
    written(data.path());
    let chain = rollout_state::load(data.path(), "sonnet-bedrock").unwrap();
    let s = chain.state();
    assert_eq!(s.step, Some(0));
    assert_eq!(s.step_started, Some(T0), "the bake resumes where it was");
    assert!(s.halted());
    assert_eq!(s.decided(0), Some(Move::Rollback));
    let a = s.action.as_ref().unwrap();
    assert_eq!(a.kill_outcome, Some(KillOutcome::Killed));
    assert_eq!(
        a.pull_request.as_deref(),
        Some("https://example.invalid/pr/1")
    );
    assert!(!a.notified, "the notification is the step still to do");
    assert_eq!(chain.records().len(), 4);
    assert!(chain.head().unwrap().starts_with("sha256:"));

    // A new step (a human merged the advance) starts a new bake and clears the halt.
    let mut chain = chain;
    chain
        .append(T0 + Duration::hours(2), Event::StepStarted { step: 1 })
        .unwrap();
    let chain = rollout_state::load(data.path(), "sonnet-bedrock").unwrap();
    assert_eq!(chain.state().step, Some(1));
    assert!(!chain.state().halted());
    assert_eq!(chain.state().decided(1), None);
}

/// Edit the file's records as the JSON text they were written as (the others keep
/// their bytes) and expect `load` to refuse it.
fn tamper(edit: impl FnOnce(&mut Vec<String>)) -> ChainError {
    let data = tempfile::tempdir().unwrap();
    written(data.path());
    let path = file(data.path());
    let mut doc: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    #[derive(serde::Deserialize)]
    struct Raw {
        records: Vec<Box<serde_json::value::RawValue>>,
    }
    let raw: Raw = serde_json::from_str(&text).unwrap();
    let mut records: Vec<String> = raw.records.iter().map(|r| r.get().to_string()).collect();
    edit(&mut records);
    doc.remove("records");
    let head = doc.get("head").cloned().unwrap_or_default();
    let file = format!(
        "{{\"rollout\": {}, \"records\": [{}], \"head\": {}}}",
        doc["rollout"],
        records.join(","),
        head
    );
    std::fs::write(&path, file).unwrap();
    rollout_state::load(data.path(), "sonnet-bedrock").unwrap_err()
}

#[test]
fn an_edited_record_is_refused() {
    let err = tamper(|r| r[1] = r[1].replace("\"move\":\"rollback\"", "\"move\":\"pause\""));
    assert!(matches!(err, ChainError::Broken { seq: 2, .. }), "{err}");
    assert!(
        err.to_string().contains("held until the file is repaired"),
        "{err}"
    );
}

#[test]
fn an_edited_last_record_is_refused() {
    let err = tamper(|r| r[3] = r[3].replace("example.invalid", "evil.invalid"));
    assert!(matches!(err, ChainError::Broken { seq: 3, .. }), "{err}");
}

#[test]
fn a_record_removed_from_the_middle_or_reordered_is_refused() {
    let err = tamper(|r| {
        r.remove(1);
    });
    assert!(matches!(err, ChainError::Broken { seq: 1, .. }), "{err}");
    let err = tamper(|r| r.swap(1, 2));
    assert!(matches!(err, ChainError::Broken { seq: 1, .. }), "{err}");
}

#[test]
fn a_cut_file_or_an_unknown_field_is_refused_by_name() {
    let data = tempfile::tempdir().unwrap();
    written(data.path());
    let path = file(data.path());
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = rollout_state::load(data.path(), "sonnet-bedrock").unwrap_err();
    assert!(matches!(err, ChainError::Malformed { .. }), "{err}");
    assert!(err.to_string().contains("sonnet-bedrock.json"), "{err}");

    let err = tamper(|r| r[0] = r[0].replacen('{', "{\"extra\":1,", 1));
    assert!(matches!(err, ChainError::Malformed { .. }), "{err}");
    assert!(err.to_string().contains("records[0]"), "{err}");
}

#[test]
fn another_rollouts_file_and_a_path_like_name_are_refused() {
    let data = tempfile::tempdir().unwrap();
    written(data.path());
    std::fs::copy(
        file(data.path()),
        data.path().join("rollouts/harness-upgrade.json"),
    )
    .unwrap();
    let err = rollout_state::load(data.path(), "harness-upgrade").unwrap_err();
    assert!(err.to_string().contains("sonnet-bedrock"), "{err}");
    let err = rollout_state::load(data.path(), "../etc").unwrap_err();
    assert!(matches!(err, ChainError::BadName(_)), "{err}");
}

#[test]
fn a_failed_write_leaves_the_chain_in_memory_as_it_was() {
    let data = tempfile::tempdir().unwrap();
    written(data.path());
    let mut chain = rollout_state::load(data.path(), "sonnet-bedrock").unwrap();
    // A non-empty folder where the file goes: the rename fails (for root too).
    let path = file(data.path());
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir_all(path.join("in-the-way")).unwrap();
    let err = chain
        .append(T0 + Duration::hours(1), Event::Notified { step: 0 })
        .unwrap_err();
    assert!(matches!(err, ChainError::Write(_)), "{err}");
    assert_eq!(chain.records().len(), 4);
    assert!(!chain.state().action.as_ref().unwrap().notified);
}

// ---------------------------------------------------------------------------------------
// The driver (step 11 of the tick): the example's traffic rollout against a real git repo
// with a bare remote, a recording gh, a webhook receiver and a kill-switch stand-in.

mod common;

use std::sync::atomic::Ordering;

use common::{Rig, samples};
use halo_controller::controller::Controller;

const ROLLOUT: &str = "sonnet-bedrock";
const BACKING: &str = "sonnet-bedrock-canary";

/// Serve the traffic rollout at `step` (as after a human merged the advance PR), its
/// experiment's floor lowered to 40 units per arm. The repo says the same step.
fn serve_step(rig: &Rig, step: u32) {
    let path = "rollouts/sonnet-bedrock.yaml";
    let now = rig.served.0.lock().unwrap().rollouts[ROLLOUT].step;
    if now != step {
        rig.repo
            .edit(path, &format!("\nstep: {now}"), &format!("\nstep: {step}"));
    }
    let mut g = rig.served.0.lock().unwrap();
    let mut org = (**g).clone();
    org.rollouts.get_mut(ROLLOUT).unwrap().step = step;
    let exp = org.experiments.get_mut(BACKING).unwrap();
    exp.stopping.as_mut().unwrap().min_samples = Some(40);
    *g = std::sync::Arc::new(org);
}

/// Gate evidence for the canary arm: every unit at `error_rate` and 5 s p95.
fn gate_evidence(rig: &Rig, error_rate: f64, source: Source) {
    let arms = &["control", "canary"];
    rig.evidence.set(
        BACKING,
        ERROR_RATE,
        samples(arms, 50, source, |v, _| {
            if v == "canary" { error_rate } else { 0.0 }
        }),
    );
    rig.evidence
        .set(BACKING, P95, samples(arms, 50, source, |_, _| 5000.0));
}

async fn tick_at(c: &Controller, at: OffsetDateTime) -> Result<(), String> {
    c.tick_within_budget(at).await.map_err(|e| e.to_string())
}

fn report(c: &Controller) -> halo_controller::drive::RolloutReport {
    c.status().rollouts[ROLLOUT].clone()
}

#[tokio::test]
async fn a_traffic_rollout_bakes_then_opens_one_advance_pr_per_step() {
    let rig = Rig::new().await;
    serve_step(&rig, 0);
    gate_evidence(&rig, 0.015625, Source::Gateway);
    let c = rig.controller(true);

    // Step 0 bakes 30 minutes from the first tick that saw it.
    tick_at(&c, T0).await.unwrap();
    let r = report(&c);
    assert_eq!(r.state, "evaluated", "{r:?}");
    assert_eq!(r.evaluation.as_ref().unwrap().action, Move::Hold);
    assert_eq!(r.step_started, Some(T0));
    assert!(r.chain_verified);

    // A restart mid-bake resumes the bake where it was (the chain holds its start).
    let c = rig.controller(true);
    tick_at(&c, T0 + Duration::minutes(20)).await.unwrap();
    assert_eq!(report(&c).evaluation.unwrap().bake_left_seconds, 10 * 60);

    tick_at(&c, T0 + Duration::minutes(31)).await.unwrap();
    let r = report(&c);
    assert_eq!(r.state, "acted", "{r:?}");
    let action = r.action.unwrap();
    assert_eq!(action.evaluation.action, Move::Advance { to: 1 });
    let url = action.pull_request.expect("the advance PR");
    assert!(action.notified);
    let branch = "halo-controller/rollout-sonnet-bedrock/step-0-advance";
    assert!(rig.repo.remote_branches().contains(&branch.to_string()));
    let file = rig.repo.remote_file(branch, "rollouts/sonnet-bedrock.yaml");
    assert!(file.contains("\nstep: 1"), "{file}");
    let calls = rig.repo.gh_calls();
    assert_eq!(calls.len(), 1);
    assert!(
        calls[0]
            .1
            .contains("| halo.api.error_rate | <= 0.02 | 0.0156 | 50 |"),
        "{}",
        calls[0].1
    );
    let messages = rig.receiver.messages();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0]["event"], "rollout_advance");
    assert_eq!(messages[0]["rollout"], ROLLOUT);
    assert_eq!(messages[0]["pullRequest"], url.as_str());
    assert!(rig.kills.killed.lock().unwrap().is_empty());

    // Decided once per step: later ticks at step 0 open nothing more.
    tick_at(&c, T0 + Duration::minutes(40)).await.unwrap();
    assert_eq!(rig.repo.gh_calls().len(), 1);
    assert_eq!(rig.receiver.messages().len(), 1);

    // The human merges: step 1 bakes 24 h from the tick that first sees it, then advances.
    serve_step(&rig, 1);
    let t1 = T0 + Duration::hours(1);
    tick_at(&c, t1).await.unwrap();
    assert_eq!(report(&c).state, "evaluated");
    tick_at(&c, t1 + Duration::hours(24)).await.unwrap();
    let r = report(&c);
    assert_eq!(r.action.unwrap().evaluation.action, Move::Advance { to: 2 });
    assert_eq!(rig.repo.gh_calls().len(), 2);
    let file = rig.repo.remote_file(
        "halo-controller/rollout-sonnet-bedrock/step-1-advance",
        "rollouts/sonnet-bedrock.yaml",
    );
    assert!(file.contains("\nstep: 2"), "{file}");
    assert!(file.contains("\nstatus: running"), "{file}");
}

#[tokio::test]
async fn a_failing_gate_on_gateway_evidence_rolls_back_kills_once_and_prs_to_the_baseline() {
    let rig = Rig::new().await;
    serve_step(&rig, 0);
    gate_evidence(&rig, 0.25, Source::Gateway);
    let c = rig.controller(true);
    // Mid-bake: a step that hurts people is not left to finish its bake.
    tick_at(&c, T0).await.unwrap();
    let r = report(&c);
    assert_eq!(r.state, "halted", "{r:?}");
    let action = r.action.unwrap();
    assert_eq!(action.evaluation.action, Move::Rollback);
    assert_eq!(action.kill_outcome, Some(KillOutcome::Killed));
    assert!(rig.kills.killed.lock().unwrap().contains(BACKING));
    let branch = "halo-controller/rollout-sonnet-bedrock/step-0-rollback";
    let file = rig.repo.remote_file(branch, "rollouts/sonnet-bedrock.yaml");
    assert!(file.contains("\nstatus: rolled-back"), "{file}");
    let exp = rig
        .repo
        .remote_file(branch, "experiments/sonnet-bedrock-canary.yaml");
    assert!(exp.contains("\nstatus: paused"), "{exp}");
    let messages = rig.receiver.messages();
    assert_eq!(messages[0]["event"], "rollout_rollback");
    assert_eq!(messages[0]["killOutcome"], "killed");

    // Halted: later ticks repeat nothing (one kill, one PR, one message).
    tick_at(&c, T0 + Duration::minutes(5)).await.unwrap();
    let c = rig.controller(true);
    tick_at(&c, T0 + Duration::minutes(10)).await.unwrap();
    assert_eq!(report(&c).state, "halted");
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 1);
    assert_eq!(rig.repo.gh_calls().len(), 1);
    assert_eq!(rig.receiver.messages().len(), 1);
}

#[tokio::test]
async fn a_failing_gate_on_cli_evidence_rolls_back_without_a_kill() {
    let rig = Rig::new().await;
    serve_step(&rig, 0);
    gate_evidence(&rig, 0.25, Source::Cli);
    let c = rig.controller(true);
    tick_at(&c, T0).await.unwrap();
    let action = report(&c).action.unwrap();
    assert_eq!(action.evaluation.action, Move::Rollback);
    assert_eq!(action.kill_outcome, Some(KillOutcome::NotGatewayEvidence));
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 0);
    assert!(action.pull_request.is_some());
    assert_eq!(
        rig.receiver.messages()[0]["killOutcome"],
        "not_gateway_evidence"
    );
}

#[tokio::test]
async fn a_tampered_state_file_is_refused_reported_and_nothing_is_done() {
    let rig = Rig::new().await;
    serve_step(&rig, 0);
    gate_evidence(&rig, 0.015625, Source::Gateway);
    let c = rig.controller(true);
    tick_at(&c, T0).await.unwrap();
    // Move the bake's start back a day: the chain no longer verifies.
    let path = rig.data.path().join("rollouts/sonnet-bedrock.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["records"][0]["at"] = serde_json::json!("2026-11-30T12:00:00Z");
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();

    // Even with a failing gate, a refused chain is never acted on.
    gate_evidence(&rig, 0.25, Source::Gateway);
    tick_at(&c, T0 + Duration::hours(2)).await.unwrap();
    let r = report(&c);
    assert_eq!(r.state, "refused", "{r:?}");
    assert!(!r.chain_verified);
    assert!(r.error.unwrap().contains("does not verify"));
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 0);
    assert!(rig.repo.gh_calls().is_empty());
    assert!(rig.receiver.messages().is_empty());
}

/// The client rollout (harness-upgrade, carried by engineering-next-canary to devices
/// through halod's variant channels): its gates read CLI evidence, which may roll back
/// but never kill; passing gates advance it like a traffic rollout.
#[tokio::test]
async fn a_client_rollout_advances_on_cli_evidence_and_rolls_back_without_a_kill() {
    const CLIENT: &str = "harness-upgrade";
    const CRASHES: &str = "halo.client.crash_rate";
    let rig = Rig::new().await;
    rig.repo.edit(
        "rollouts/harness-upgrade.yaml",
        "\nstatus: pending",
        "\nstatus: running",
    );
    {
        let mut g = rig.served.0.lock().unwrap();
        let mut org = (**g).clone();
        org.rollouts.get_mut(CLIENT).unwrap().status = halo_policy::types::RolloutStatus::Running;
        let exp = org.experiments.get_mut("engineering-next-canary").unwrap();
        exp.stopping.as_mut().unwrap().min_samples = Some(40);
        *g = std::sync::Arc::new(org);
    }
    let crashes = |rate: f64| {
        samples(&["control", "next"], 50, Source::Cli, |v, _| {
            if v == "next" { rate } else { 0.0 }
        })
    };
    rig.evidence
        .set("engineering-next-canary", CRASHES, crashes(0.001));
    let c = rig.controller(true);
    tick_at(&c, T0).await.unwrap();
    assert_eq!(c.status().rollouts[CLIENT].state, "evaluated");
    tick_at(&c, T0 + Duration::minutes(31)).await.unwrap();
    let r = c.status().rollouts[CLIENT].clone();
    assert_eq!(r.action.unwrap().evaluation.action, Move::Advance { to: 1 });
    let file = rig.repo.remote_file(
        "halo-controller/rollout-harness-upgrade/step-0-advance",
        "rollouts/harness-upgrade.yaml",
    );
    assert!(file.contains("\nstep: 1"), "{file}");

    // Step 1 (the whole canary ring): crashes rise past 0.5%, CLI evidence: rollback,
    // a PR, no kill.
    {
        let mut g = rig.served.0.lock().unwrap();
        let mut org = (**g).clone();
        org.rollouts.get_mut(CLIENT).unwrap().step = 1;
        *g = std::sync::Arc::new(org);
    }
    rig.repo
        .edit("rollouts/harness-upgrade.yaml", "\nstep: 0", "\nstep: 1");
    rig.evidence
        .set("engineering-next-canary", CRASHES, crashes(0.02));
    tick_at(&c, T0 + Duration::hours(1)).await.unwrap();
    let r = c.status().rollouts[CLIENT].clone();
    assert_eq!(r.state, "halted", "{r:?}");
    let action = r.action.unwrap();
    assert_eq!(action.evaluation.action, Move::Rollback);
    assert_eq!(
        action.kill_outcome, None,
        "a client rollout never trips the kill switch"
    );
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 0);
    let file = rig.repo.remote_file(
        "halo-controller/rollout-harness-upgrade/step-1-rollback",
        "rollouts/harness-upgrade.yaml",
    );
    assert!(file.contains("\nstatus: rolled-back"), "{file}");
    let pr = rig.repo.gh_calls().last().unwrap().1.clone();
    assert!(
        pr.contains("sha256:d063e13db7422cccb7334868ec42c9870ba7402f27871756848231c8619daed3"),
        "the PR names the baseline release: {pr}"
    );
}
