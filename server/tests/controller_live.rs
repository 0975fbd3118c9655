//! `halo-server --controller` in-process, fed by OTLP records posted to its own receivers
//! as the filter will export them: a treatment answering 500 to 30% of calls is rolled
//! back. On gateway evidence the kill is tripped (served by this server), the pause PR
//! is pushed to a bare repo and a signed webhook arrives; on CLI evidence the PR and the
//! webhook come but no kill. Ticks are driven by the test (the loop's interval is at
//! least a minute); the loop runs too, and the action still happens once. And a restart
//! mid-bake: the example's traffic rollout keeps the bake it started before.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::{Arc, Mutex};

use halo_evidence::Source;
use halo_killswitch::Target;
use serde_json::json;
use support::controller::{
    EXP, OTLP_GATEWAY_TOKEN, WEBHOOK_SECRET, assert_one_rollback, git, git_remote, policy_repo,
    post_breach, remote_branches, webhook,
};
use support::gateway::{Live, LiveGateway, ask_raw, start_live_with};
use support::{Env, Server, serve};

async fn start(
    env: &Env,
) -> (
    Server,
    std::path::PathBuf,
    Arc<Mutex<Vec<serde_json::Value>>>,
) {
    let bare = policy_repo(env);
    let (hook, got) = webhook().await;
    std::fs::write(env.path("otlp-gateway.token"), OTLP_GATEWAY_TOKEN).unwrap();
    std::fs::write(env.path("webhook.secret"), WEBHOOK_SECRET).unwrap();
    let mut settings = env.settings();
    settings.evidence.gateway_listen = Some("127.0.0.1:0".parse().unwrap());
    settings.evidence.gateway_token_file = Some(env.path("otlp-gateway.token"));
    settings.evidence.cli_listen = Some("127.0.0.1:0".parse().unwrap());
    settings.controller.enabled = true;
    settings.controller.gh = Some(env.path("gh"));
    settings.controller.webhook_url = Some(hook);
    settings.controller.webhook_secret_file = Some(env.path("webhook.secret"));
    (serve(&settings).await, bare, got)
}

async fn killed(server: &Server) -> bool {
    let running = server.running.as_ref().unwrap();
    let ks = running.killswitch().unwrap();
    ks.state().await.is_killed(Target::Experiment, EXP)
}

/// One tick, failed or not; the controller's status after it (for failure messages).
async fn tick_status(server: &Server) -> String {
    let c = server.controller();
    let _ = c.tick_within_budget(time::OffsetDateTime::now_utc()).await;
    serde_json::to_string_pretty(&c.status()).unwrap()
}

/// One tick; returns the controller's status after it (for failure messages).
async fn tick(server: &Server) -> String {
    let c = server.controller();
    c.tick_within_budget(time::OffsetDateTime::now_utc())
        .await
        .expect("the tick succeeds");
    serde_json::to_string_pretty(&c.status()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_evidence_of_a_breach_trips_the_kill_pr_and_webhook() {
    let env = Env::new().await;
    let (server, bare, hook) = start(&env).await;
    tick(&server).await;
    assert!(!killed(&server).await, "no evidence, no verdict");

    post_breach(&server, Source::Gateway).await;
    tick(&server).await;
    assert!(
        killed(&server).await,
        "the kill is tripped on gateway evidence"
    );
    assert_one_rollback(&bare, &hook, EXP, "killed");

    // Another tick repeats nothing; the state is in the API and the counters in /metrics.
    tick(&server).await;
    assert_eq!(hook.lock().unwrap().len(), 1);
    let r = server
        .get("/api/v1/controller/status", Some(&env.admin_token()))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.body["experiments"][EXP]["action"]["killOutcome"],
        "killed"
    );
    let m = reqwest::get(format!("{}/metrics", server.admin_base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("halo_controller_actions_total{decision=\"rollback\"} 1"),
        "{m}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_evidence_of_a_breach_opens_the_pr_without_a_kill() {
    let env = Env::new().await;
    let (server, bare, hook) = start(&env).await;
    post_breach(&server, Source::Cli).await;
    let status = tick(&server).await;
    assert!(!killed(&server).await, "CLI evidence never kills");
    assert_eq!(hook.lock().unwrap().len(), 1, "{status}");
    assert_one_rollback(&bare, &hook, EXP, "not_gateway_evidence");
    server.stop().await;
}

/// A halo-server restart mid-bake resumes the rollout's bake where it was: the step's
/// start is the state file's, not the new process's (#23).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_bake_resumes_the_rollouts_bake() {
    let env = Env::new().await;
    env.pause_experiments(&["claude-opus-default", "gpt-shadow"]);
    std::fs::write(env.path("otlp-gateway.token"), OTLP_GATEWAY_TOKEN).unwrap();
    let mut settings = env.settings();
    settings.evidence.gateway_listen = Some("127.0.0.1:0".parse().unwrap());
    settings.evidence.gateway_token_file = Some(env.path("otlp-gateway.token"));
    settings.controller.enabled = true;
    let rollout = |server: &Server| {
        let server = server.base.clone();
        let token = env.admin_token();
        async move {
            let r = reqwest::Client::new()
                .get(format!("{server}/api/v1/rollouts/sonnet-bedrock"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.json::<serde_json::Value>().await.unwrap()
        }
    };

    let server = serve(&settings).await;
    tick(&server).await;
    let first = rollout(&server).await;
    let started = first["chain"]["state"]["stepStarted"].clone();
    assert!(started.is_string(), "{first}");
    assert_eq!(first["controller"]["state"], "evaluated", "{first}");
    server.stop().await;

    let server = serve(&settings).await;
    tick(&server).await;
    let second = rollout(&server).await;
    assert_eq!(
        second["chain"]["state"]["stepStarted"], started,
        "the bake runs from the first start: {second}"
    );
    assert_eq!(
        second["chain"]["records"], 1,
        "no second step_started: {second}"
    );
    let left = |v: &serde_json::Value| {
        v["controller"]["evaluation"]["bakeLeftSeconds"]
            .as_u64()
            .unwrap()
    };
    assert!(left(&second) <= left(&first), "{first} then {second}");
    server.stop().await;
}

/// A canary on `haiku` (prov-a for control, prov-b for the canary), half of the canary
/// ring each, judged on the error rate.
const HAIKU_CANARY: &str = r#"apiVersion: halos.dev/v1
kind: Experiment
name: haiku-canary
type: canary
axis: traffic
status: running
rings: [canary]
salt: haiku-canary-live
variants:
  - name: control
    weight: 50
  - name: canary
    weight: 50
    routes:
      haiku:
        targets:
          - {upstream: prov-b, model: haiku-canary-model}
metrics:
  primary: {name: halo.api.error_rate, direction: decrease}
  guardrails:
    - {name: halo.api.error_rate, direction: decrease, threshold: 0.02}
stopping: {minSamples: 100, maxDays: 14, alpha: 0.05}
"#;

/// The whole loop through a real Envoy (issue #22, "Checked live"): halo-server serves
/// the policy over xDS and receives Envoy's evidence on its gateway receiver; the canary's
/// provider answers 500 to 30% of calls. The controller finds the breach on gateway
/// evidence, trips the kill, the canary's users are routed to control by the same Envoy,
/// the pause PR is in the bare repo and the signed webhook arrived. A restart of
/// halo-server repeats nothing. Prints the times from breach onset to the kill and from
/// the kill to Envoy routing control (BENCHMARKS.md).
/// halo-server (controller, gateway receiver, kill key, webhook, recording gh) serving
/// [`HAIKU_CANARY`] over xDS to a real Envoy whose providers fail as given; the policy
/// dir a clone of the returned bare repo; the run started by a first tick.
async fn live_canary(
    env: &Env,
    a_fails_in_10: usize,
    b_fails_in_10: usize,
) -> (
    LiveGateway,
    halo_server::config::Settings,
    std::path::PathBuf,
    Arc<Mutex<Vec<serde_json::Value>>>,
) {
    live_policy(
        env,
        Live {
            files: vec![("experiments/haiku-canary.yaml", HAIKU_CANARY.to_string())],
            a_fails_in_10,
            b_fails_in_10,
            ..Live::default()
        },
    )
    .await
}

/// [`live_canary`] with the policy files and providers of `live` (its gateway file gets
/// the evidence export to the server's receiver).
async fn live_policy(
    env: &Env,
    mut live: Live,
) -> (
    LiveGateway,
    halo_server::config::Settings,
    std::path::PathBuf,
    Arc<Mutex<Vec<serde_json::Value>>>,
) {
    std::fs::write(env.path("otlp-gateway.token"), OTLP_GATEWAY_TOKEN).unwrap();
    std::fs::write(env.path("webhook.secret"), WEBHOOK_SECRET).unwrap();
    let (hook, got) = webhook().await;
    let receiver = halo_testkit::free_port();
    let mut settings = env.settings();
    settings.evidence.gateway_listen = Some(format!("127.0.0.1:{receiver}").parse().unwrap());
    settings.evidence.gateway_token_file = Some(env.path("otlp-gateway.token"));
    settings.controller.enabled = true;
    settings.controller.gh = Some(env.path("gh"));
    settings.controller.webhook_url = Some(hook);
    settings.controller.webhook_secret_file = Some(env.path("webhook.secret"));
    live.gateway_file = json!({"evidence": {"url": format!("http://127.0.0.1:{receiver}")}});
    let live = start_live_with(env, settings.clone(), live).await;
    let bare = git_remote(env);
    tick(&live.server).await; // the run starts
    (live, settings, bare, got)
}

/// A token of the canary ring for user `i` (each user its own unit).
fn canary_ring_token(env: &Env, i: usize) -> String {
    env.issuer.mint(json!({
        "aud": "api://halos", "sub": format!("u-{i}"), "email": format!("dev{i}@acme.com"),
        "email_verified": true, "groups": ["halos-canary"],
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_a_breach_on_gateway_evidence_is_killed_and_envoy_routes_control() {
    const CALLS: usize = 400;
    let env = Env::new().await;
    let (live, settings, bare, got) = live_canary(&env, 0, 3).await;
    let running = live.server.running.as_ref().unwrap();
    let controller = running.controller.clone().unwrap();
    let switch = running.killswitch().cloned().unwrap();
    let killed = || async {
        switch
            .state()
            .await
            .is_killed(Target::Experiment, "haiku-canary")
    };

    // The breach: up to CALLS users of the canary ring.
    let token = |i: usize| canary_ring_token(&env, i);
    // Ticks while the calls go on (every 40 calls; the loop's real interval is a minute or
    // more), then until the kill (bounded): Envoy's logger flushes every second.
    let onset = std::time::Instant::now();
    let (mut canary, mut failed, mut canary_token, mut sent) = (0, 0, None, 0);
    while sent < CALLS && !killed().await {
        let t = token(sent);
        let (status, body) = ask_raw(&live.client, live.port, &t).await.unwrap();
        sent += 1;
        if status != 200 {
            failed += 1;
        } else if body["provider"] == "prov-b" {
            canary += 1;
            canary_token.get_or_insert(t);
        }
        if sent % 40 == 0 {
            tick_status(&live.server).await;
        }
    }
    let sending = onset.elapsed();
    assert!(
        canary > 20 && failed > 5,
        "{canary} canary answers, {failed} failures"
    );
    let canary_token = canary_token.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !killed().await {
        let status = tick_status(&live.server).await;
        assert!(
            std::time::Instant::now() < deadline,
            "no kill 30 s after the breach: {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let to_kill = onset.elapsed();
    let to_control = live.until(&canary_token, "prov-a", "haiku-model").await;
    eprintln!(
        "{sent} calls ({canary} answered by the canary, {failed} failed) at {:.0}/s, a tick every 40 calls; breach onset to kill {to_kill:?}; kill to Envoy routing control {to_control:?}",
        sent as f64 / sending.as_secs_f64()
    );
    let status = controller.status();
    let action = &status.experiments["haiku-canary"].action;
    let action = serde_json::to_value(action).unwrap();
    assert_eq!(action["killOutcome"], "killed", "{action}");
    assert_one_rollback(&bare, &got, "haiku-canary", "killed");

    // A restart repeats nothing: the same data dir, one more tick.
    let LiveGateway { server, envoy, .. } = live;
    server.stop().await;
    let server = serve(&settings).await;
    tick_status(&server).await;
    assert_eq!(got.lock().unwrap().len(), 1, "no second message");
    assert_eq!(env.log_lines("killswitch.jsonl").len(), 1, "no second kill");
    server.stop().await;
    drop(envoy);
}

/// The same loop through Envoy with a better treatment (control's provider fails 30% of
/// calls, the canary's none): after `minSamples` per arm the controller opens the promote
/// PR and notifies; nothing is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_a_better_treatment_is_promoted_after_min_samples() {
    const CALLS: usize = 1200;
    let env = Env::new().await;
    let (live, _, bare, got) = live_canary(&env, 3, 0).await;
    let controller = live.server.controller();
    let decided = || {
        controller
            .status()
            .experiments
            .get("haiku-canary")
            .and_then(|e| e.action.clone())
    };
    let mut sent = 0;
    while sent < CALLS && decided().is_none() {
        let t = canary_ring_token(&env, sent);
        ask_raw(&live.client, live.port, &t).await.unwrap();
        sent += 1;
        if sent % 100 == 0 {
            tick_status(&live.server).await;
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while decided().is_none() {
        let status = tick_status(&live.server).await;
        assert!(
            std::time::Instant::now() < deadline,
            "no decision after {sent} calls: {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let action = serde_json::to_value(decided()).unwrap();
    eprintln!("promoted after {sent} calls: {action}");
    assert_eq!(action["verdict"]["decision"], "promote", "{action}");
    assert!(action["killOutcome"].is_null(), "{action}");
    assert!(
        remote_branches(&bare).contains("halo-controller/haiku-canary/run-1-promote"),
        "the promote PR's branch is pushed: {}",
        remote_branches(&bare)
    );
    let msgs = got.lock().unwrap().clone();
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(msgs[0]["event"], "promote");
    assert_eq!(env.log_lines("killswitch.jsonl").len(), 0, "nothing killed");
}

/// The backing experiment for [`HAIKU_ROLLOUT`]: [`HAIKU_CANARY`] with a gate floor of 40.
fn rollout_files() -> Vec<(&'static str, String)> {
    vec![
        (
            "experiments/haiku-canary.yaml",
            // The experiment's own split (90/10) is not what routes while the rollout runs:
            // the step's percent (50) and then the whole ring do.
            HAIKU_CANARY
                .replace("minSamples: 100", "minSamples: 40")
                .replace("rings: [canary]", "rings: [canary, general]")
                .replace(
                    "  - name: control\n    weight: 50\n  - name: canary\n    weight: 50\n",
                    "  - name: control\n    weight: 90\n  - name: canary\n    weight: 10\n",
                ),
        ),
        ("rollouts/haiku-b.yaml", HAIKU_ROLLOUT.to_string()),
    ]
}

/// Move `haiku` to prov-b over two rings in two steps (half the canary ring, then the
/// general ring whole), gated on the error rate and the latency of the step's cohort.
const HAIKU_ROLLOUT: &str = r#"apiVersion: halos.dev/v1
kind: Rollout
name: haiku-b
axis: traffic
status: running
step: 0
experiment: haiku-canary
change:
  alias:
    name: haiku
    route:
      targets:
        - {upstream: prov-b, model: haiku-canary-model}
steps:
  - strategy: canary
    ring: canary
    percent: 50
    bake: 1m
    gates:
      - {metric: halo.api.error_rate, max: 0.05}
      - {metric: halo.latency.p95, max: 150}
    onFailure: rollback
  - strategy: ring
    ring: general
    bake: 1m
    gates:
      - {metric: halo.api.error_rate, max: 0.05}
    onFailure: rollback
"#;

/// What `n` calls of new canary-ring users got.
#[derive(Default)]
struct Calls {
    /// A token the change (prov-b) answered.
    canary: Option<String>,
    /// A token control (prov-a) answered.
    control: Option<String>,
    /// How many the change answered.
    on_change: usize,
}

/// Send `n` calls of new canary-ring users from `first`.
async fn calls(env: &Env, live: &LiveGateway, first: usize, n: usize) -> Calls {
    calls_of(live, (first..first + n).map(|i| canary_ring_token(env, i))).await
}

/// A token of a user in no group (acme-corp's rings: early for 10% of them, else general).
fn ungrouped_token(env: &Env, i: usize) -> String {
    env.issuer.mint(json!({
        "aud": "api://halos", "sub": format!("g-{i}"), "email": format!("gen{i}@acme.com"),
        "email_verified": true, "groups": [],
    }))
}

/// One call per token.
async fn calls_of(live: &LiveGateway, tokens: impl Iterator<Item = String>) -> Calls {
    let mut got = Calls::default();
    for t in tokens {
        let (status, body) = ask_raw(&live.client, live.port, &t).await.unwrap();
        if status == 200 && body["provider"] == "prov-b" && body["model"] == "haiku-canary-model" {
            got.on_change += 1;
            got.canary.get_or_insert(t);
        } else if status == 200 && body["provider"] == "prov-a" {
            got.control.get_or_insert(t);
        }
    }
    got
}

/// Tick at `now + ahead` until `done` (bounded; Envoy's logger flushes every second).
async fn tick_until<F: std::future::Future<Output = bool>>(
    live: &LiveGateway,
    ahead: time::Duration,
    what: &str,
    done: impl Fn() -> F,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let c = live.server.controller();
    while !done().await {
        let _ = c
            .tick_within_budget(time::OffsetDateTime::now_utc() + ahead)
            .await;
        assert!(
            std::time::Instant::now() < deadline,
            "never {what}: {}",
            serde_json::to_string_pretty(&c.status()).unwrap()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A traffic rollout through a real Envoy (issue #23, "Checked live"): step 0 bakes on
/// Envoy's own evidence, its gates pass, the advance PR is pushed; the PR merged (the
/// policy dir's `step:` edited), step 1 bakes on its own cohort and the complete PR
/// follows. Nothing is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_a_traffic_rollout_advances_step_by_step_and_completes() {
    let env = Env::new().await;
    let (live, _, bare, got) = live_policy(
        &env,
        Live {
            files: rollout_files(),
            ..Live::default()
        },
    )
    .await;
    let bake = time::Duration::minutes(2);
    let has_branch = |b: &str| remote_branches(&bare).lines().any(|l| l == b);

    // Step 0 routes its percent (50) of the canary ring to the change, not the
    // experiment's 10: 120 users land near 60 (below 36 has odds under 1e-5 at 50%,
    // above 24 has odds under 1e-4 at 10%).
    let step0 = calls(&env, &live, 0, 120).await;
    step0.canary.as_ref().expect("a canary answer");
    let on_b = step0.on_change;
    assert!((36..=84).contains(&on_b), "{on_b} of 120 at step 0 (50%)");
    // The general ring is not in step 0's cohort.
    let general0 = calls_of(&live, (0..40).map(|i| ungrouped_token(&env, i))).await;
    assert_eq!(general0.on_change, 0, "the general ring at step 0");
    tick_until(&live, bake, "advanced from step 0", || async {
        has_branch("halo-controller/rollout-haiku-b/step-0-advance")
    })
    .await;
    let pr = git(
        &bare,
        &[
            "show",
            "halo-controller/rollout-haiku-b/step-0-advance:rollouts/haiku-b.yaml",
        ],
    );
    assert!(pr.contains("\nstep: 1\n"), "{pr}");

    // The PR merged: the served policy is at step 1, which bakes on its own cohort.
    let file = env.path("policy").join("rollouts/haiku-b.yaml");
    std::fs::write(&file, pr).unwrap();
    let running = live.server.running.as_ref().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while running.policy_now().org.rollouts["haiku-b"].step != 1 {
        assert!(std::time::Instant::now() < deadline, "step 1 never served");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Step 1 takes the canary ring whole: a user control answered at step 0 moves to
    // the change once Envoy has the new policy, and so does every new user of the ring.
    let was_control = step0.control.expect("a control answer at step 0");
    live.until(&was_control, "prov-b", "haiku-canary-model")
        .await;
    tick_status(&live.server).await; // step 1 starts now
    let step1 = calls(&env, &live, 1000, 120).await;
    assert_eq!(
        step1.on_change, 120,
        "the canary ring keeps the change, whole"
    );
    // Step 1 adds the general ring whole: the ungrouped users not in early's 10% (36 of
    // 40 expected; fewer than 25 has odds under 1e-6).
    let general1 = calls_of(&live, (0..40).map(|i| ungrouped_token(&env, i))).await;
    assert!(
        general1.on_change >= 25,
        "{} of 40 ungrouped users on the change at step 1",
        general1.on_change
    );
    tick_until(&live, bake, "completed at step 1", || async {
        has_branch("halo-controller/rollout-haiku-b/step-1-complete")
    })
    .await;
    let events: Vec<_> = got
        .lock()
        .unwrap()
        .iter()
        .map(|m| m["event"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(events, ["rollout_advance", "rollout_complete"]);
    assert_eq!(env.log_lines("killswitch.jsonl").len(), 0, "nothing killed");
}

/// The same rollout with prov-b answering 250 ms late: the latency gate fails during the
/// bake, the rollout rolls back, the kill is tripped on gateway evidence and the same
/// Envoy routes the canary's users to control; the PR to the baseline is pushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_a_slow_step_rolls_back_kills_and_envoy_routes_control() {
    let env = Env::new().await;
    let (live, _, bare, got) = live_policy(
        &env,
        Live {
            files: rollout_files(),
            b_delay: std::time::Duration::from_millis(250),
            ..Live::default()
        },
    )
    .await;
    let switch = live.server.killswitch();
    let canary = calls(&env, &live, 0, 120)
        .await
        .canary
        .expect("a canary answer");
    tick_until(&live, time::Duration::ZERO, "rolled back", || async {
        switch
            .state()
            .await
            .is_killed(Target::Experiment, "haiku-canary")
    })
    .await;
    let to_control = live.until(&canary, "prov-a", "haiku-model").await;
    eprintln!("rollout kill to Envoy routing control {to_control:?}");
    assert!(
        remote_branches(&bare)
            .lines()
            .any(|l| l == "halo-controller/rollout-haiku-b/step-0-rollback"),
        "{}",
        remote_branches(&bare)
    );
    let msgs = got.lock().unwrap().clone();
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(msgs[0]["event"], "rollout_rollback");
    assert_eq!(msgs[0]["killOutcome"], "killed");
}
