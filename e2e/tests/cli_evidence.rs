//! The CLI's views of a real halo-server on loopback: `halo evidence query` after its
//! gateway receiver got OTLP records (the per-variant table: source, n, mean, interval;
//! and `--json`) and after its mirror service recorded a shadow job (the shadow variant's
//! row, source shadow), and `halo controller status` / `halo rollout status` after a controller tick.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../server/tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};

use halo_evidence::{Record, otlp};
use prost::Message as _;
use support::{Env, serve};

const HALO: &str = env!("CARGO_BIN_EXE_halo-e2e-cli");
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
    assert_eq!(
        &rows[0][..4],
        ["control", "gateway", "2", "0.000000"],
        "{stdout}"
    );
    assert_eq!(
        &rows[1][..4],
        ["treatment", "gateway", "2", "0.500000"],
        "{stdout}"
    );

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

/// `halo evidence query` shows a shadow variant: halo-server runs only the mirror service
/// (no evidence receiver), takes a job for acme-corp's `gpt-shadow` as the filter sends it,
/// sends it to the treatment's target (a provider speaking the Responses wire) and records
/// the answer; the CLI's table has the `gpt-5-1` row with source `shadow`, apart from any
/// live evidence of the experiment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_query_shows_the_shadow_variant() {
    const SHADOW_TOKEN: &str = "5d2c8e1f0a9b47366c5e4d3b2a1f0e9d8c7b6a5f4e3d2c1b0a99887766554433";
    let env = Env::new().await;
    let wire = halo_testkit::provider::WireProvider::start(true)
        .await
        .unwrap();
    let token_file = env.path("shadow.token");
    std::fs::write(&token_file, SHADOW_TOKEN).unwrap();
    let mut settings = env.settings_without_kill_switch();
    settings.shadow = halo_server::shadow::ShadowSettings {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        token_file: Some(token_file),
        ..Default::default()
    };
    // The policy as written (https upstreams), its openai upstream pointed at the fake
    // (which takes no key) after validation, as halo-demo does: the served policy is the
    // xDS host's.
    settings.xds_listen = Some("127.0.0.1:0".parse().unwrap());
    let url = wire.url();
    let transform: halo_xds::source::Transform =
        std::sync::Arc::new(move |mut snap: halo_policy::Snapshot| {
            if let Some(u) = snap.upstreams.get_mut("openai") {
                u.url = url.clone();
                u.credential = None;
            }
            snap
        });
    let running = halo_server::server::start_with(
        &settings,
        halo_server::xds::XdsOptions {
            gateway: None,
            transform: Some(transform),
        },
    )
    .await
    .unwrap();
    let server = support::Server {
        base: format!("http://{}", running.api_addr),
        admin_base: format!("http://{}", running.admin_addr),
        running: Some(running),
        http: reqwest::Client::new(),
    };
    let mirror = server.running.as_ref().unwrap().shadow.as_ref().unwrap();

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let job = serde_json::json!({
        "builtUnixMs": now, "ring": "canary", "experiment": "gpt-shadow",
        "variant": "gpt-5-1", "alias": "gpt", "unit": "00000000000000a1",
        "upstream": "openai", "model": "gpt-5.1-codex", "method": "POST",
        "path": "/v1/responses", "stream": false,
        "headers": [["content-type", "application/json"]],
        "body": {"model": "gpt-5.1-codex", "input": "write a test"},
    });
    let resp = reqwest::Client::new()
        .post(format!("http://{}/mirror", mirror.addr))
        .bearer_auth(SHADOW_TOKEN)
        .json(&job)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while mirror.metrics.jobs("recorded") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the job was not recorded"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        wire.received()
            .iter()
            .any(|r| r.model().as_deref() == Some("gpt-5.1-codex")),
        "the treatment's target got the copy"
    );

    let args: Vec<String> = [
        "evidence",
        "query",
        "--experiment",
        "gpt-shadow",
        "--metric",
        "error_rate",
        "--since",
        "1h",
        "--server",
        &server.base,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = halo(args.clone(), env.admin_token()).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 sample(s)"), "{stdout}");
    let header = stdout.lines().find(|l| l.starts_with("VARIANT")).unwrap();
    assert_eq!(
        header.split_whitespace().take(3).collect::<Vec<_>>(),
        ["VARIANT", "SOURCE", "N"],
        "{stdout}"
    );
    let row: Vec<&str> = stdout
        .lines()
        .find(|l| l.starts_with("gpt-5-1"))
        .unwrap_or_else(|| panic!("a row for the shadow variant: {stdout}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..4],
        ["gpt-5-1", "shadow", "1", "0.000000"],
        "{stdout}"
    );

    let mut json_args = args;
    json_args.push("--json".into());
    let out = halo(json_args, env.admin_token()).await;
    let body: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["variants"][0]["variant"], "gpt-5-1");
    assert_eq!(body["variants"][0]["source"], "shadow");
    server.stop().await;
}
