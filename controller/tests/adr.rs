//! The controller rows of ADR-0009's implementation table, each a named test, plus the
//! loop's other promises (promote, expiry, rollouts skipped, runs). Real git with a bare
//! remote, a recording gh, a real HTTP receiver verifying signatures, the real state file;
//! the evidence store and the kill switch are stand-ins behind the crate's ports.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;

use common::*;
use halo_controller::controller::{Controller, FIRST_RETRY, check_interval, next_delay};
use halo_controller::evidence::Source;
use halo_controller::kill::KillOutcome;
use halo_controller::notify::{self, VerifyError};
use halo_controller::state::STATE_FILE;
use halo_policy::types::ExperimentStatus;
use time::OffsetDateTime;

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

fn state_lines(rig: &Rig) -> Vec<serde_json::Value> {
    std::fs::read_to_string(rig.data.path().join(STATE_FILE))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn events(rig: &Rig, kind: &str) -> usize {
    state_lines(rig)
        .iter()
        .filter(|r| r["experiment"] == EXP && r["event"]["kind"] == kind)
        .count()
}

fn pause_branch() -> String {
    format!("halo-controller/{EXP}/run-1-rollback")
}

async fn tick(c: &Controller) -> Result<(), String> {
    c.tick_within_budget(now()).await.map_err(|e| e.to_string())
}

#[tokio::test]
async fn test_rollback_survives_restart_and_failures() {
    let rig = Rig::new().await;
    breach(&rig.evidence, Source::Gateway);
    // First tick: the kill works, gh and the webhook fail.
    rig.repo.set_gh_failing(true);
    rig.receiver.fail_first.store(1000, Ordering::SeqCst);
    let err = tick(&rig.controller(true)).await.unwrap_err();
    assert!(err.contains("pull request"), "{err}");
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 1);
    assert!(rig.kills.killed.lock().unwrap().contains(EXP));
    assert_eq!(events(&rig, "decided"), 1);
    assert_eq!(events(&rig, "kill"), 1);
    assert_eq!(events(&rig, "pull_request"), 0);
    assert_eq!(events(&rig, "notified"), 0);
    assert!(rig.repo.gh_calls().is_empty());

    // Restart, gh recovered, webhook still down: the PR is opened, the kill not repeated.
    rig.repo.set_gh_failing(false);
    let err = tick(&rig.controller(true)).await.unwrap_err();
    assert!(err.contains("notification"), "{err}");
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 1);
    assert_eq!(rig.repo.gh_calls().len(), 1);
    assert!(rig.repo.remote_branches().contains(&pause_branch()));

    // Restart, everything up: notified once; nothing else repeats.
    rig.receiver.fail_first.store(0, Ordering::SeqCst);
    tick(&rig.controller(true)).await.unwrap();
    for _ in 0..2 {
        tick(&rig.controller(true)).await.unwrap();
    }
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 1);
    assert_eq!(rig.repo.gh_calls().len(), 1);
    let msgs = rig.receiver.messages();
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(msgs[0]["event"], "rollback");
    assert_eq!(msgs[0]["killOutcome"], "killed");
    assert_eq!(msgs[0]["enforced"], true);
    assert_eq!(
        msgs[0]["pullRequest"],
        "https://github.example/acme/policy/pull/1"
    );
    assert_eq!(events(&rig, "decided"), 1);
    assert_eq!(events(&rig, "kill"), 1);
    assert_eq!(events(&rig, "pull_request"), 1);
    assert_eq!(events(&rig, "notified"), 1);
    // The pause PR: status paused on its own branch, the evidence table in the body.
    let file = rig
        .repo
        .remote_file(&pause_branch(), &format!("experiments/{EXP}.yaml"));
    assert!(file.contains("\nstatus: paused\n"), "{file}");
    let main = rig
        .repo
        .remote_file("main", &format!("experiments/{EXP}.yaml"));
    assert!(
        main.contains("\nstatus: running\n"),
        "nothing merges: {main}"
    );
    let (args, body) = &rig.repo.gh_calls()[0];
    assert!(args.windows(2).any(|w| w == ["--base", "main"]), "{args:?}");
    assert!(
        body.contains("| halo.api.error_rate | opus-default | 400 |"),
        "{body}"
    );
    assert!(body.contains("breached"), "{body}");
    assert!(body.contains("killOutcome: `killed`"), "{body}");
}

#[tokio::test]
async fn test_rollback_kill_failure_still_notifies() {
    let rig = Rig::new().await;
    breach(&rig.evidence, Source::Gateway);
    rig.kills.failing.store(true, Ordering::SeqCst);
    tick(&rig.controller(true)).await.unwrap();
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 1);
    let msgs = rig.receiver.messages();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0]["killOutcome"], "kill_failed");
    assert_eq!(msgs[0]["enforced"], false);
    assert!(
        msgs[0]["text"]
            .as_str()
            .unwrap()
            .contains("Merge this PR urgently")
    );
    let calls = rig.repo.gh_calls();
    assert_eq!(calls.len(), 1);
    assert!(calls[0].1.contains("kill_failed"), "{}", calls[0].1);
    // A failed kill is not retried by later ticks: humans have the PR.
    tick(&rig.controller(true)).await.unwrap();
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn test_rollback_on_non_gateway_evidence_does_not_kill() {
    let rig = Rig::new().await;
    breach(&rig.evidence, Source::Cli);
    tick(&rig.controller(true)).await.unwrap();
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 0);
    assert!(rig.kills.killed.lock().unwrap().is_empty());
    let msgs = rig.receiver.messages();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0]["event"], "rollback");
    assert_eq!(msgs[0]["killOutcome"], "not_gateway_evidence");
    assert_eq!(msgs[0]["enforced"], false);
    assert_eq!(rig.repo.gh_calls().len(), 1, "the pause PR is still opened");
}

#[tokio::test]
async fn test_eval_evidence_never_kills() {
    // Eval alone, and eval mixed into gateway evidence: neither trips the kill.
    for mixed in [false, true] {
        let rig = Rig::new().await;
        let mut s = samples(&["control", TREATMENT], 400, Source::Eval, |v, i| {
            rate(i, if v == "control" { 0.02 } else { 0.30 })
        });
        if mixed {
            for (i, x) in s.iter_mut().enumerate() {
                if i % 2 == 0 {
                    x.source = Source::Gateway;
                }
            }
        }
        rig.evidence.set(EXP, ERRORS, s);
        tick(&rig.controller(true)).await.unwrap();
        assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 0, "mixed={mixed}");
        let msgs = rig.receiver.messages();
        assert_eq!(
            msgs[0]["killOutcome"], "not_gateway_evidence",
            "mixed={mixed}"
        );
    }
}

#[test]
fn test_kill_outcome_wording() {
    let all = [
        (KillOutcome::Killed, "killed", true),
        (KillOutcome::KillWritten, "kill_written", false),
        (KillOutcome::KillFailed, "kill_failed", false),
        (
            KillOutcome::NotGatewayEvidence,
            "not_gateway_evidence",
            false,
        ),
        (KillOutcome::NotEnforced, "not_enforced", false),
    ];
    for (outcome, word, enforced) in all {
        assert_eq!(outcome.as_str(), word);
        assert_eq!(serde_json::to_value(outcome).unwrap(), word);
        assert_eq!(outcome.enforced(), enforced, "{word}");
        let text = outcome.describe();
        // Only an enforced kill may say so; every other outcome asks for the PR.
        if enforced {
            assert!(text.starts_with("Rollback enforced"), "{text}");
        } else {
            assert!(!text.starts_with("Rollback enforced"), "{text}");
            assert!(text.to_lowercase().contains("merge this pr"), "{text}");
        }
    }
    assert!(KillOutcome::NotEnforced.describe().contains("no kill key"));
    assert!(KillOutcome::NotEnforced.describe().contains("urgently"));
    assert!(KillOutcome::KillFailed.describe().contains("urgently"));
    assert!(
        KillOutcome::KillWritten
            .describe()
            .contains("--killswitch-served")
    );
    assert!(
        KillOutcome::NotGatewayEvidence
            .describe()
            .contains("not gateway-sourced")
    );
}

#[tokio::test]
async fn test_rollback_kill_not_enforced() {
    let rig = Rig::new().await;
    breach(&rig.evidence, Source::Gateway);
    tick(&rig.controller(false)).await.unwrap();
    let msgs = rig.receiver.messages();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0]["killOutcome"], "not_enforced");
    assert_eq!(msgs[0]["enforced"], false);
    let text = msgs[0]["text"].as_str().unwrap();
    assert!(
        text.contains("NOT enforced") && text.contains("urgently"),
        "{text}"
    );
    let (_, body) = &rig.repo.gh_calls()[0];
    assert!(
        body.contains("not_enforced") && body.contains("urgently"),
        "{body}"
    );
    // Written but not served (halo controller run without --killswitch-served).
    let rig = Rig::new().await;
    breach(&rig.evidence, Source::Gateway);
    rig.kills.not_served.store(true, Ordering::SeqCst);
    tick(&rig.controller(true)).await.unwrap();
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 1);
    assert_eq!(rig.receiver.messages()[0]["killOutcome"], "kill_written");
    assert_eq!(rig.receiver.messages()[0]["enforced"], false);
}

#[tokio::test]
async fn test_killed_experiment_is_held() {
    let rig = Rig::new().await;
    breach(&rig.evidence, Source::Gateway);
    rig.kills.killed.lock().unwrap().insert(EXP.to_string());
    for _ in 0..3 {
        tick(&rig.controller(true)).await.unwrap();
    }
    assert_eq!(
        rig.evidence.reads_of(EXP),
        0,
        "a killed experiment is not evaluated"
    );
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 0);
    assert!(rig.repo.gh_calls().is_empty());
    let msgs = rig.receiver.messages();
    assert_eq!(msgs.len(), 1, "humans are told once: {msgs:?}");
    assert_eq!(msgs[0]["event"], "held");
    assert!(msgs[0]["text"].as_str().unwrap().contains("nkill"));
    let c = rig.controller(true);
    tick(&c).await.unwrap();
    assert_eq!(c.status().experiments[EXP].state, "held");
    // Unkilled: evaluated again (and the breach is acted on).
    rig.kills.killed.lock().unwrap().clear();
    tick(&c).await.unwrap();
    assert!(rig.evidence.reads_of(EXP) > 0);
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn test_no_evaluation_after_rollback() {
    // No key: the experiment is not killed, yet its run is never evaluated again.
    let rig = Rig::new().await;
    breach(&rig.evidence, Source::Gateway);
    let c = rig.controller(false);
    tick(&c).await.unwrap();
    let reads = rig.evidence.reads_of(EXP);
    assert!(reads > 0);
    for _ in 0..3 {
        tick(&c).await.unwrap();
    }
    assert_eq!(rig.evidence.reads_of(EXP), reads);
    assert_eq!(events(&rig, "decided"), 1);
    assert_eq!(rig.receiver.messages().len(), 1);
    assert_eq!(c.status().experiments[EXP].state, "acted");
    // Paused in policy (the PR merged), then running again: a new run, evaluated again.
    rig.served.set_status(EXP, ExperimentStatus::Paused);
    tick(&c).await.unwrap();
    assert_eq!(events(&rig, "run_ended"), 1);
    rig.served.set_status(EXP, ExperimentStatus::Running);
    tick(&c).await.unwrap();
    assert!(rig.evidence.reads_of(EXP) > reads);
    assert_eq!(c.status().experiments[EXP].run, 2);
}

#[tokio::test]
async fn test_webhook_signature() {
    // A fixed vector, computed independently (Python's hmac module).
    assert_eq!(
        notify::sign(b"key", 1_700_000_000, br#"{"a":1}"#),
        "sha256=a438e398bfafc57e4396bb7fc2304422f0f768e965d073ca313cb52e22e6ad03"
    );
    // On the wire: the receiver verified every request it recorded; retried after 503s.
    let rx = receiver().await;
    rx.fail_first.store(2, Ordering::SeqCst);
    let hook = rx.webhook(notify::Format::Generic);
    let mut msg =
        notify::Message::decision(EXP, 1, halo_controller::decide::Decision::Promote, "better");
    msg.text = "hello".to_string();
    use halo_controller::notify::Notifier;
    hook.notify(&msg).await.unwrap();
    assert_eq!(rx.requests.load(Ordering::SeqCst), 3);
    let got = rx.messages();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["experiment"], EXP);
    assert_eq!(got[0]["event"], "promote");
    // Slack-compatible payload: just text.
    let slack = rx.webhook(notify::Format::Slack);
    slack.notify(&msg).await.unwrap();
    assert_eq!(rx.messages()[1], serde_json::json!({"text": "hello"}));
    // A refusal other than 429/5xx is not retried.
    let bad = {
        let mut w = halo_controller::notify::Webhook::new(
            rx.url.parse().unwrap(),
            b"wrong secret".to_vec(),
            notify::Format::Generic,
        )
        .unwrap();
        w.attempts = 3;
        w
    };
    let before = rx.requests.load(Ordering::SeqCst);
    let err = bad.notify(&msg).await.unwrap_err().to_string();
    assert!(err.contains("401"), "{err}");
    assert_eq!(rx.requests.load(Ordering::SeqCst), before + 1);
}

#[test]
fn test_webhook_verify() {
    let body = br#"{"experiment":"e"}"#;
    let t = 1_700_000_000i64;
    let sig = notify::sign(SECRET, t, body);
    let ts = t.to_string();
    let v = |ts: Option<&str>, sig: Option<&str>, body: &[u8], now: i64| {
        notify::verify(SECRET, ts, sig, body, now)
    };
    assert_eq!(v(Some(&ts), Some(&sig), body, t), Ok(()));
    assert_eq!(v(Some(&ts), Some(&sig), body, t + 300), Ok(()));
    assert_eq!(v(Some(&ts), Some(&sig), body, t - 300), Ok(()));
    assert_eq!(
        v(Some(&ts), Some(&sig), body, t + 301),
        Err(VerifyError::Skew { seconds: 301 })
    );
    assert_eq!(
        v(Some(&ts), Some(&sig), body, t - 301),
        Err(VerifyError::Skew { seconds: -301 })
    );
    assert_eq!(
        v(Some(&ts), Some(&sig), b"{}", t),
        Err(VerifyError::Mismatch)
    );
    // The timestamp is signed: moving it breaks the signature.
    let later = (t + 10).to_string();
    assert_eq!(
        v(Some(&later), Some(&sig), body, t),
        Err(VerifyError::Mismatch)
    );
    assert_eq!(
        notify::verify(b"other", Some(&ts), Some(&sig), body, t),
        Err(VerifyError::Mismatch)
    );
    assert_eq!(v(None, Some(&sig), body, t), Err(VerifyError::BadTimestamp));
    assert_eq!(
        v(Some("soon"), Some(&sig), body, t),
        Err(VerifyError::BadTimestamp)
    );
    assert_eq!(
        v(Some(&ts), None, body, t),
        Err(VerifyError::BadSignatureHeader)
    );
    assert_eq!(
        v(Some(&ts), Some(sig.trim_start_matches("sha256=")), body, t),
        Err(VerifyError::BadSignatureHeader)
    );
}

#[tokio::test]
async fn promote_after_min_samples_opens_a_concluding_pr() {
    let rig = Rig::new().await;
    let both = ["control", TREATMENT];
    // Guardrails hold (same cost and error rate), edits clearly up.
    rig.evidence.set(
        EXP,
        ERRORS,
        samples(&both, 600, Source::Gateway, |_, i| rate(i, 0.02)),
    );
    rig.evidence.set(
        EXP,
        COST,
        samples(&both, 600, Source::Gateway, |_, i| {
            1.0 + (i % 7) as f64 * 0.1
        }),
    );
    rig.evidence.set(
        EXP,
        EDITS,
        samples(&both, 600, Source::Cli, |v, i| {
            (i % 10) as f64 + if v == "control" { 10.0 } else { 14.0 }
        }),
    );
    tick(&rig.controller(true)).await.unwrap();
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 0);
    let branch = format!("halo-controller/{EXP}/run-1-promote");
    let file = rig
        .repo
        .remote_file(&branch, &format!("experiments/{EXP}.yaml"));
    assert!(file.contains("\nstatus: concluded\n"), "{file}");
    let msgs = rig.receiver.messages();
    assert_eq!(msgs[0]["event"], "promote");
    assert!(msgs[0].get("killOutcome").is_none());
    // Below minSamples (500 per arm), the same effect only continues.
    let rig = Rig::new().await;
    rig.evidence.set(
        EXP,
        ERRORS,
        samples(&both, 100, Source::Gateway, |_, i| rate(i, 0.02)),
    );
    rig.evidence.set(
        EXP,
        COST,
        samples(&both, 100, Source::Gateway, |_, i| {
            1.0 + (i % 7) as f64 * 0.1
        }),
    );
    rig.evidence.set(
        EXP,
        EDITS,
        samples(&both, 100, Source::Cli, |v, i| {
            (i % 10) as f64 + if v == "control" { 10.0 } else { 14.0 }
        }),
    );
    let c = rig.controller(true);
    tick(&c).await.unwrap();
    assert!(rig.repo.gh_calls().is_empty());
    let verdict = c.status().experiments[EXP].verdict.clone().unwrap();
    assert_eq!(
        verdict.decision,
        halo_controller::decide::Decision::Continue
    );
    assert_eq!(verdict.samples[TREATMENT], 100);
}

#[tokio::test]
async fn spend_past_the_budget_expires_the_experiment() {
    let rig = Rig::new().await;
    *rig.evidence.spend.lock().unwrap() = 5000.01;
    tick(&rig.controller(true)).await.unwrap();
    let branch = format!("halo-controller/{EXP}/run-1-expired");
    let file = rig
        .repo
        .remote_file(&branch, &format!("experiments/{EXP}.yaml"));
    assert!(file.contains("\nstatus: concluded\n"), "{file}");
    assert!(
        rig.receiver
            .messages()
            .iter()
            .any(|m| m["event"] == "expired" && m["experiment"] == EXP)
    );
}

/// ADR-0009 TestRolloutBreachKillsOnce: an experiment a Rollout owns is not evaluated by
/// the experiment loop; its rollout is, and a breach on gateway evidence kills it once.
#[tokio::test]
async fn rollout_owned_experiments_are_left_to_their_rollout_which_kills_once() {
    let rig = Rig::new().await;
    rig.evidence.set(
        "sonnet-bedrock-canary",
        ERRORS,
        samples(&["control", "canary"], 400, Source::Gateway, |v, i| {
            rate(i, if v == "control" { 0.02 } else { 0.30 })
        }),
    );
    let c = rig.controller(true);
    tick(&c).await.unwrap();
    tick(&c).await.unwrap();
    let status = c.status();
    assert_eq!(status.experiments["sonnet-bedrock-canary"].state, "rollout");
    assert_eq!(status.rollouts["sonnet-bedrock"].state, "halted");
    assert_eq!(rig.kills.calls.load(Ordering::SeqCst), 1);
    assert!(
        rig.kills
            .killed
            .lock()
            .unwrap()
            .contains("sonnet-bedrock-canary")
    );
}

#[test]
fn failed_ticks_retry_sooner_up_to_the_interval() {
    let five = std::time::Duration::from_secs(300);
    assert_eq!(next_delay(five, 0), five);
    assert_eq!(next_delay(five, 1), FIRST_RETRY);
    assert_eq!(next_delay(five, 2), FIRST_RETRY * 2);
    assert_eq!(next_delay(five, 4), FIRST_RETRY * 8);
    assert_eq!(next_delay(five, 5), FIRST_RETRY * 16);
    assert_eq!(next_delay(five, 6), five);
    assert_eq!(next_delay(five, 40), five);
    assert!(check_interval(std::time::Duration::from_secs(59)).is_err());
    assert!(check_interval(std::time::Duration::from_secs(60)).is_ok());
}
