//! `halo kill`, `halo unkill` and `halo killswitch status` against a real halo-server on
//! loopback, authenticated by a JWT from the fake OIDC issuer.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../server/tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};

use support::{Env, serve};

const HALO: &str = env!("CARGO_BIN_EXE_halo-e2e-cli");

async fn halo(args: Vec<String>, token: Option<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(HALO);
        cmd.args(&args)
            .env_remove("HALO_TOKEN")
            .env_remove("HALO_SERVER_URL");
        if let Some(t) = token {
            cmd.env("HALO_TOKEN", t);
        }
        cmd.output().unwrap()
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_unkill_and_status_through_the_api() {
    let env = Env::new().await;
    let server = serve(&env.settings()).await;
    let admin = env.admin_token();
    let base = server.base.clone();

    let out = halo(
        args(&[
            "kill",
            "experiment",
            "gpt-shadow",
            "--reason",
            "cost spike",
            "--server",
            &base,
        ]),
        Some(admin.clone()),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("experiment gpt-shadow is killed"),
        "{stdout}"
    );

    // The token may come from a file too.
    let token_file = env.path("admin.jwt");
    std::fs::write(&token_file, &admin).unwrap();
    let out = halo(
        args(&[
            "killswitch",
            "status",
            "--server",
            &base,
            "--token-file",
            token_file.to_str().unwrap(),
        ]),
        None,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("gpt-shadow"), "{stdout}");
    assert!(stdout.contains("alice@acme.com"), "{stdout}");
    assert!(stdout.contains("cost spike"), "{stdout}");

    // An unknown name: the server's 404 and its message reach the user, exit 1.
    let out = halo(
        args(&[
            "kill",
            "toggle",
            "no-such-toggle",
            "--reason",
            "x",
            "--server",
            &base,
        ]),
        Some(admin.clone()),
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("404 unknown_name"), "{stderr}");
    assert!(stderr.contains("no-such-toggle"), "{stderr}");

    // A non-admin is refused with 403.
    let out = halo(
        args(&[
            "unkill",
            "experiment",
            "gpt-shadow",
            "--reason",
            "x",
            "--server",
            &base,
        ]),
        Some(env.user_token()),
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("403"));

    let out = halo(
        args(&[
            "unkill",
            "experiment",
            "gpt-shadow",
            "--reason",
            "fixed",
            "--server",
            &base,
        ]),
        Some(admin.clone()),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("is not killed"));
    let out = halo(
        args(&["killswitch", "status", "--server", &base]),
        Some(admin.clone()),
    )
    .await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing is killed"));

    // --reason is required by the CLI itself (clap usage error, exit 2).
    let out = halo(
        args(&["kill", "experiment", "gpt-shadow", "--server", &base]),
        Some(admin),
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    server.stop().await;
}

/// `halo controller run`'s flags (ADR-0009 TestControllerRunFlags): the loop's interval
/// bound, the webhook's secret, the data dir required, and the warning that a kill
/// written without `--killswitch-served` is not known to be enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_controller_run_flags() {
    let env = Env::new().await;
    let (policy, data) = (env.path("policy"), env.path("data"));
    let (policy, data) = (policy.to_str().unwrap(), data.to_str().unwrap());
    let run = |extra: &[&str]| {
        let mut a = args(&["controller", "run", "--policy-dir", policy]);
        a.extend(args(extra));
        halo(a, None)
    };

    let out = run(&["--data-dir", data, "--interval", "30s", "--once"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--interval"), "{stderr}");
    assert!(stderr.contains("at least"), "{stderr}");

    let out = run(&["--data-dir", data, "--webhook-url", "http://127.0.0.1:9/h"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--webhook-secret-file"), "{stderr}");

    let out = run(&["--once"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--data-dir"), "{stderr}");

    // One tick on the example policy: its running experiments name session metrics the
    // gateway's store lacks, so the tick fails (exit 1) and says why; it still warned
    // that kills would not be served.
    let out = run(&["--data-dir", data, "--once"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--killswitch-served"), "{stderr}");
}

/// `halo controller run` beside a halo-server that serves the same data dir: on gateway
/// evidence of a breach it appends the kill to the data dir's kill log, and the server
/// (which runs no controller) follows the log and serves the kill; the pause PR is pushed
/// and the signed webhook arrives; the next run repeats nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_run_kills_through_the_data_dir_a_halo_server_serves() {
    use halo_evidence::Source;
    use halo_killswitch::Target;
    use support::controller::{
        EXP, OTLP_GATEWAY_TOKEN, WEBHOOK_SECRET, assert_one_rollback, policy_repo, post_breach,
        webhook,
    };

    let env = Env::new().await;
    let bare = policy_repo(&env);
    let (hook, got) = webhook().await;
    std::fs::write(env.path("otlp-gateway.token"), OTLP_GATEWAY_TOKEN).unwrap();
    std::fs::write(env.path("webhook.secret"), WEBHOOK_SECRET).unwrap();
    let mut settings = env.settings();
    settings.evidence.gateway_listen = Some("127.0.0.1:0".parse().unwrap());
    settings.evidence.gateway_token_file = Some(env.path("otlp-gateway.token"));
    let server = serve(&settings).await;
    let switch = server.killswitch();
    let p = |name: &str| env.path(name).to_str().unwrap().to_string();
    let run = || {
        halo(
            args(&[
                "controller",
                "run",
                "--once",
                "--killswitch-served",
                "--policy-dir",
                &p("policy"),
                "--data-dir",
                &p("data"),
                "--gh",
                &p("gh"),
                "--webhook-url",
                &hook,
                "--webhook-secret-file",
                &p("webhook.secret"),
            ]),
            None,
        )
    };

    let out = run().await;
    assert!(out.status.success(), "{out:?}");
    post_breach(&server, Source::Gateway).await;
    let out = run().await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains(EXP) && stdout.contains("killed"),
        "{stdout}"
    );

    // The serving halo-server picks the kill up from its data dir (bounded poll).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !switch.state().await.is_killed(Target::Experiment, EXP) {
        assert!(
            std::time::Instant::now() < deadline,
            "halo-server never served the kill halo controller run wrote"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let kills = env.log_lines("killswitch.jsonl");
    assert_eq!(kills.len(), 1, "{kills:?}");
    assert_eq!(kills[0]["actor"], "halo-controller");
    assert_eq!(kills[0]["seq"], 1);
    let audit = env.log_lines("audit.jsonl");
    assert!(
        audit.iter().any(|a| a["actor"] == "halo-controller"),
        "{audit:?}"
    );
    assert_one_rollback(&bare, &got, EXP, "killed");

    // Killed means held: another run acts on nothing.
    let out = run().await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(env.log_lines("killswitch.jsonl").len(), 1);
    assert_eq!(got.lock().unwrap().len(), 1);
    server.stop().await;
}
