//! `halo evidence query` against a real halo-server on loopback whose gateway receiver
//! got OTLP records: the per-variant table (n, mean, interval) and `--json`.

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
