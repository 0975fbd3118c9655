//! The CLI's views of a real halo-server on loopback: `halo evidence query` after its
//! gateway receiver got OTLP records (the per-variant table: n, mean, interval; and
//! `--json`), and `halo controller status` / `halo rollout status` after a controller tick.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../control-plane/tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};

use halo_evidence::{Record, otlp};
use prost::Message as _;
use support::{Env, serve};

const HALO: &str = env!("CARGO_BIN_EXE_halo");
const OTLP_GATEWAY_TOKEN: &str = "9b8e7d1c2a3f40516e7d8c9b0a1f2e3d4c5b6a79808f7e6d5c4b3a2910f8e7d6";

async fn halo(args: Vec<String>, token: String) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(HALO)
            .args(&args)
            .env_remove("HALO_SERVER_URL")
            .env("HALO_TOKEN", token)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn record(variant: &str, unit: u32, status: u16) -> Record {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    Record {
        time_unix_ms: now - 1000,
        experiment: "sonnet-canary".into(),
        variant: variant.into(),
        status,
        attempts: 1,
        complete: true,
        unit: format!("{unit:016x}"),
        ..Record::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_query_prints_the_per_variant_summary() {
    let env = Env::new().await;
    let token = env.path("otlp-gateway.token");
    std::fs::write(&token, OTLP_GATEWAY_TOKEN).unwrap();
    let mut settings = env.settings_without_kill_switch();
    settings.evidence.gateway_listen = Some("127.0.0.1:0".parse().unwrap());
    settings.evidence.gateway_token_file = Some(token);
    let server = serve(&settings).await;
    let receivers = server.running.as_ref().unwrap().evidence.as_ref().unwrap();
    let gateway = receivers.addr(halo_evidence::Source::Gateway).unwrap();
    let batch = [
        record("control", 1, 200),
        record("control", 2, 200),
        record("treatment", 3, 503),
        record("treatment", 4, 200),
    ];
    let resp = reqwest::Client::new()
        .post(format!("http://{gateway}/v1/logs"))
        .bearer_auth(OTLP_GATEWAY_TOKEN)
        .header("content-type", "application/x-protobuf")
        .body(otlp::request(&batch).encode_to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let base = server.base.clone();
    let query = |extra: &[&str]| {
        let mut a: Vec<String> = [
            "evidence",
            "query",
            "--experiment",
            "sonnet-canary",
            "--metric",
            "error_rate",
            "--since",
            "1h",
            "--server",
            &base,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let out = halo(query(&[]), env.admin_token()).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("4 sample(s)"), "{stdout}");
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|w: &Vec<&str>| matches!(w.first(), Some(&"control" | &"treatment")))
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert_eq!(&rows[0][..3], ["control", "2", "0.000000"], "{stdout}");
    assert_eq!(&rows[1][..3], ["treatment", "2", "0.500000"], "{stdout}");

    let out = halo(query(&["--json"]), env.admin_token()).await;
    let body: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["variants"][1]["variant"], "treatment");
    assert_eq!(body["variants"][1]["n"], 2);

    // A user who is not an admin is refused, and says so.
    let out = halo(query(&[]), env.user_token()).await;
    assert!(!out.status.success());
    server.stop().await;
}

/// `halo controller status` and `halo rollout status` against a halo-server running the
/// controller, after one tick: the example's traffic rollout (sonnet-bedrock, step 1)
/// baking, its state file's chain verified; an unknown rollout is a clear refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_and_rollout_status_print_the_last_tick() {
    let env = Env::new().await;
    env.pause_experiments(&["claude-opus-default", "gpt-shadow"]);
    let token = env.path("otlp-gateway.token");
    std::fs::write(&token, OTLP_GATEWAY_TOKEN).unwrap();
    let mut settings = env.settings();
    settings.evidence.gateway_listen = Some("127.0.0.1:0".parse().unwrap());
    settings.evidence.gateway_token_file = Some(token);
    settings.controller.enabled = true;
    let server = serve(&settings).await;
    let controller = server.controller();
    controller
        .tick_within_budget(time::OffsetDateTime::now_utc())
        .await
        .expect("the tick succeeds");

    let base = server.base.clone();
    let args = |a: &[&str]| -> Vec<String> {
        a.iter()
            .map(|s| s.to_string())
            .chain(["--server".to_string(), base.clone()])
            .collect()
    };
    let out = halo(
        args(&["rollout", "status", "sonnet-bedrock"]),
        env.admin_token(),
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("traffic axis, experiment sonnet-bedrock-canary"),
        "{stdout}"
    );
    assert!(stdout.contains("chain verified, 1 record(s)"), "{stdout}");
    assert!(
        stdout.contains("* 1"),
        "the current step is marked: {stdout}"
    );
    // The server's own loop ticked first, a moment earlier: about 24 h left.
    assert!(stdout.contains("bake left: 86"), "{stdout}");
    assert!(stdout.contains("halo.api.error_rate"), "{stdout}");

    let out = halo(
        args(&["rollout", "status", "sonnet-bedrock", "--json"]),
        env.admin_token(),
    )
    .await;
    let body: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["chain"]["verified"], true);
    assert_eq!(body["controller"]["state"], "evaluated");
    assert_eq!(body["controller"]["evaluation"]["action"]["move"], "hold");
    assert_eq!(body["rollout"]["steps"][1]["ring"], "canary");

    let out = halo(args(&["controller", "status"]), env.admin_token()).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("sonnet-bedrock "))
        .unwrap_or_else(|| panic!("a line for the rollout: {stdout}"));
    assert!(
        line.contains("evaluated") && line.contains("hold"),
        "{line}"
    );

    let out = halo(
        args(&["rollout", "status", "no-such-rollout"]),
        env.admin_token(),
    )
    .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown_name") || stderr.contains("no rollout named"),
        "{stderr}"
    );
    server.stop().await;
}
