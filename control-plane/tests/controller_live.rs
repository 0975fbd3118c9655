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
use halo_server::killswitch::Target;
use support::controller::{
    EXP, OTLP_GATEWAY_TOKEN, WEBHOOK_SECRET, git, policy_repo, post_breach, remote_branches,
    webhook,
};
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
    let ks = running.state.killswitch.as_ref().unwrap();
    ks.state().await.is_killed(Target::Experiment, EXP)
}

/// One tick; returns the controller's status after it (for failure messages).
async fn tick(server: &Server) -> String {
    let c = server.running.as_ref().unwrap().controller.clone().unwrap();
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
    let branches = remote_branches(&bare);
    assert!(
        branches.contains(&format!("halo-controller/{EXP}/run-1-rollback")),
        "{branches}"
    );
    let paused = git(
        &bare,
        &[
            "show",
            &format!("halo-controller/{EXP}/run-1-rollback:experiments/{EXP}.yaml"),
        ],
    );
    assert!(paused.contains("\nstatus: paused\n"), "{paused}");
    let msgs = hook.lock().unwrap().clone();
    assert_eq!(msgs.len(), 1, "one signed message: {msgs:?}");
    assert_eq!(msgs[0]["event"], "rollback");
    assert_eq!(msgs[0]["killOutcome"], "killed");

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
    assert!(
        remote_branches(&bare).contains(&format!("halo-controller/{EXP}/run-1-rollback")),
        "the pause PR is still opened: {status}"
    );
    let msgs = hook.lock().unwrap().clone();
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(msgs[0]["killOutcome"], "not_gateway_evidence");
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
