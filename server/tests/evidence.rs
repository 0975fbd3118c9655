//! The evidence receivers in-process: tokens per trust zone, the source stamped by the
//! receiver, refusals that store nothing, /metrics per source, and the samples query.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use halo_evidence::otlp;
use halo_evidence::{Record, Source};
use halo_server::evidence::{EvidenceSettings, Receivers};
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message as _;
use serde_json::json;
use support::{Env, Server, serve};

const OTLP_GATEWAY_TOKEN: &str = "9b8e7d1c2a3f40516e7d8c9b0a1f2e3d4c5b6a79808f7e6d5c4b3a2910f8e7d6";
const OTLP_EVAL_TOKEN: &str = "1a2b3c4d5e6f70819a2b3c4d5e6f7081a9b8c7d6e5f4031201f2e3d4c5b6a798";

/// The evidence store behind the receivers: every test body runs against both.
#[derive(Debug, Clone, Copy)]
enum Backend {
    /// The embedded default: evidence.db in the data dir.
    Sqlite,
    /// A fresh database of the test process's real PostgreSQL.
    Postgres,
}

fn evidence_settings(env: &Env, backend: Backend) -> EvidenceSettings {
    std::fs::write(env.path("otlp-gateway.token"), OTLP_GATEWAY_TOKEN).unwrap();
    std::fs::write(env.path("otlp-eval.token"), OTLP_EVAL_TOKEN).unwrap();
    let postgres_file = match backend {
        Backend::Sqlite => None,
        Backend::Postgres => {
            let file = env.path("evidence-postgres");
            std::fs::write(&file, halo_testkit::postgres::database()).unwrap();
            Some(file)
        }
    };
    EvidenceSettings {
        cli_listen: Some("127.0.0.1:0".parse().unwrap()),
        gateway_listen: Some("127.0.0.1:0".parse().unwrap()),
        gateway_token_file: Some(env.path("otlp-gateway.token")),
        eval_listen: Some("127.0.0.1:0".parse().unwrap()),
        eval_token_file: Some(env.path("otlp-eval.token")),
        max_batch_bytes: 64 * 1024,
        postgres_file,
        ..EvidenceSettings::default()
    }
}

async fn start(env: &Env, backend: Backend) -> Server {
    let mut settings = env.settings_without_kill_switch();
    settings.evidence = evidence_settings(env, backend);
    serve(&settings).await
}

fn receivers(server: &Server) -> &Receivers {
    server
        .running
        .as_ref()
        .expect("running")
        .evidence
        .as_ref()
        .expect("receivers configured")
}

/// One test per backend for each body.
macro_rules! both_backends {
    ($body:ident: $sqlite:ident, $postgres:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $sqlite() {
            $body(Backend::Sqlite).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $postgres() {
            $body(Backend::Postgres).await;
        }
    };
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn rec(variant: &str, unit: u32, status: u16) -> Record {
    Record {
        time_unix_ms: now_ms() - 1000,
        ring: "early".into(),
        experiment: "sonnet-canary".into(),
        variant: variant.into(),
        alias: "sonnet".into(),
        upstream: "anthropic-direct".into(),
        model: "claude-sonnet-4-5-20250929".into(),
        target: "t0".into(),
        attempts: 1,
        status,
        ttfb_ms: Some(120.0),
        duration_ms: Some(900.0),
        input_tokens: Some(100),
        output_tokens: Some(50),
        cost_usd: Some(0.001),
        complete: true,
        unit: format!("{unit:016x}"),
        ..Record::default()
    }
}

async fn grpc(
    addr: std::net::SocketAddr,
    token: Option<&str>,
    records: &[Record],
) -> Result<(), tonic::Status> {
    let mut client = LogsServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let mut req = tonic::Request::new(otlp::request(records));
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    client.export(req).await.map(|_| ())
}

async fn http(
    addr: std::net::SocketAddr,
    token: Option<&str>,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    http_as(addr, token, "application/x-protobuf", body).await
}

async fn http_as(
    addr: std::net::SocketAddr,
    token: Option<&str>,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new()
        .post(format!("http://{addr}/v1/logs"))
        .header("content-type", content_type)
        .body(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("send");
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(serde_json::Value::Null);
    (status, body)
}

/// The store's blocking calls, off the async threads (PostgreSQL's client blocks).
fn count(r: &Receivers) -> u64 {
    tokio::task::block_in_place(|| r.evidence.store.count().expect("count"))
}

both_backends!(gateway_receiver_requires_its_token_and_stamps_gateway: gateway_token_sqlite, gateway_token_postgres);

async fn gateway_receiver_requires_its_token_and_stamps_gateway(backend: Backend) {
    let env = Env::new().await;
    let server = start(&env, backend).await;
    let receivers = receivers(&server);
    let gw = receivers.addr(Source::Gateway).expect("gateway addr");
    let batch = [rec("control", 1, 200), rec("treatment", 2, 503)];

    let err = grpc(gw, None, &batch).await.expect_err("no token");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let err = grpc(gw, Some(OTLP_EVAL_TOKEN), &batch)
        .await
        .expect_err("the eval token is not the gateway's");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let (status, body) = http(gw, None, otlp::request(&batch).encode_to_vec()).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"], "authentication_error");
    assert_eq!(count(receivers), 0, "nothing stored from refused batches");

    grpc(gw, Some(OTLP_GATEWAY_TOKEN), &batch)
        .await
        .expect("accepted");
    assert_eq!(count(receivers), 2);
    let (status, _) = http(
        gw,
        Some(OTLP_GATEWAY_TOKEN),
        otlp::request(&[rec("control", 3, 200)]).encode_to_vec(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(count(receivers), 3);

    // The samples query through the admin API: per variant n, mean, interval.
    let admin = env.admin_token();
    let r = server
        .get(
            "/api/v1/evidence/samples?experiment=sonnet-canary&metric=error_rate&since=1h",
            Some(&admin),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["samples"], 3);
    let variants = r.body["variants"].as_array().expect("variants");
    assert_eq!(variants[0]["variant"], "control");
    assert_eq!(variants[0]["n"], 2);
    assert_eq!(variants[0]["mean"], 0.0);
    assert_eq!(variants[1]["variant"], "treatment");
    assert_eq!(variants[1]["mean"], 1.0);
    // Admin auth as the other admin routes; strict parameters.
    let r = server
        .get(
            "/api/v1/evidence/samples?experiment=sonnet-canary&metric=error_rate",
            Some(&env.user_token()),
        )
        .await;
    assert_eq!(r.status, 403);
    let r = server
        .get(
            "/api/v1/evidence/samples?experiment=sonnet-canary&metric=p99",
            Some(&admin),
        )
        .await;
    assert_eq!(
        (r.status, r.body["error"].as_str()),
        (400, Some("unknown_metric"))
    );

    let m = reqwest::get(format!("{}/metrics", server.admin_base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        m.contains("halo_server_evidence_records_total{outcome=\"stored\",source=\"gateway\"} 3"),
        "{m}"
    );
    assert!(
        m.contains(
            "halo_server_evidence_records_total{outcome=\"refused_batches\",source=\"gateway\"} 3"
        ),
        "{m}"
    );
    server.stop().await;
}

both_backends!(a_cli_record_cannot_claim_the_gateway_source: cli_source_sqlite, cli_source_postgres);

async fn a_cli_record_cannot_claim_the_gateway_source(backend: Backend) {
    let env = Env::new().await;
    let server = start(&env, backend).await;
    let receivers = receivers(&server);
    let cli = receivers.addr(Source::Cli).expect("cli addr");
    let mut req = otlp::request(&[rec("control", 1, 200)]);
    req.resource_logs[0].scope_logs[0].log_records[0]
        .attributes
        .push(KeyValue {
            key: "halo.source".into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue("gateway".into())),
            }),
            ..Default::default()
        });
    let (status, _) = http(cli, None, req.encode_to_vec()).await;
    assert_eq!(status, 200, "the CLI receiver's token is optional");
    let samples = tokio::task::block_in_place(|| {
        receivers
            .evidence
            .store
            .samples(&halo_evidence::SampleQuery {
                experiment: "sonnet-canary".into(),
                metric: halo_evidence::Metric::ErrorRate,
                since_unix_ms: 0,
                until_unix_ms: i64::MAX,
            })
            .expect("samples")
    });
    assert_eq!(samples.len(), 1);
    assert_eq!(samples[0].source, Source::Cli);
    server.stop().await;
}

/// OTLP/HTTP's JSON encoding, which Gemini CLI's exporter sends (seen with Gemini CLI
/// 0.61.0: `POST <endpoint>/v1/logs`, `content-type: application/json`, chunked): a record
/// is stored as from protobuf, a harness's own event (no `halo.unit`) is counted as
/// ignored, and malformed JSON is a 400 naming the encoding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receivers_take_otlp_json_as_gemini_cli_sends_it() {
    let env = Env::new().await;
    let server = start(&env, Backend::Sqlite).await;
    let receivers = receivers(&server);
    let cli = receivers.addr(Source::Cli).expect("cli addr");
    let json = serde_json::to_vec(&otlp::request(&[rec("control", 1, 200)])).unwrap();
    let (status, body) = http_as(cli, None, "application/json", json).await;
    assert_eq!((status, body), (200, json!({})));
    assert_eq!(count(receivers), 1);

    // Shaped as the JavaScript exporter writes it: nanoseconds and 64-bit integers as
    // strings, an event of the harness's own.
    let event = json!({"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "gemini-cli"}}]},
        "scopeLogs": [{"scope": {"name": "gemini-cli"}, "logRecords": [{
            "timeUnixNano": "1764673200000000000",
            "observedTimeUnixNano": "1764673200000000000",
            "severityNumber": 9,
            "body": {"stringValue": "API response from gemini-2.5-pro."},
            "attributes": [
                {"key": "event.name", "value": {"stringValue": "gemini_cli.api_response"}},
                {"key": "duration_ms", "value": {"intValue": "812"}},
                {"key": "input_token_count", "value": {"intValue": 1200}}
            ],
            "droppedAttributesCount": 0
        }]}]
    }]});
    let (status, _) = http_as(
        cli,
        None,
        "application/json; charset=utf-8",
        serde_json::to_vec(&event).unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    let metrics = &receivers.evidence.metrics;
    assert_eq!(metrics.get("ignored", Source::Cli), 1);
    assert_eq!(count(receivers), 1, "a harness's own event is not evidence");

    let (status, body) = http_as(
        cli,
        None,
        "application/json",
        b"{\"resourceLogs\": [".to_vec(),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("malformed_json"))
    );
    let (status, body) = http_as(cli, None, "text/plain", b"hello".to_vec()).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (415, Some("unsupported_media_type"))
    );

    // Its metrics and traces, exported to the same endpoint: acknowledged, dropped,
    // counted (a 404 prints an exporter error in the developer's terminal).
    for signal in ["metrics", "traces"] {
        let r = reqwest::Client::new()
            .post(format!("http://{cli}/v1/{signal}"))
            .header("content-type", "application/json")
            .body(r#"{"resourceMetrics": []}"#)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 200, "{signal}");
    }
    assert_eq!(metrics.get("ignored_batches", Source::Cli), 2);
    assert_eq!(count(receivers), 1);
    server.stop().await;
}

both_backends!(bad_batches_are_refused_whole: bad_batches_sqlite, bad_batches_postgres);

async fn bad_batches_are_refused_whole(backend: Backend) {
    let env = Env::new().await;
    let server = start(&env, backend).await;
    let receivers = receivers(&server);
    let eval = receivers.addr(Source::Eval).expect("eval addr");
    let t = Some(OTLP_EVAL_TOKEN);

    // Oversized: 413 over HTTP, OUT_OF_RANGE over gRPC (tonic's decode limit).
    let many: Vec<Record> = (0..2000).map(|i| rec("control", i, 200)).collect();
    let (status, body) = http(eval, t, otlp::request(&many).encode_to_vec()).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (413, Some("batch_too_large"))
    );
    let err = grpc(eval, t, &many).await.expect_err("too large");
    assert_eq!(err.code(), tonic::Code::OutOfRange);

    // Malformed protobuf: 400.
    let (status, body) = http(eval, t, b"\xff\xff\xff\xff not protobuf".to_vec()).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("malformed_protobuf"))
    );

    // One bad record (a raw subject as the unit) refuses the whole batch.
    let mut bad = rec("control", 2, 200);
    bad.unit = "dave@acme.com".into();
    let (status, body) = http(
        eval,
        t,
        otlp::request(&[rec("control", 1, 200), bad.clone()]).encode_to_vec(),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("malformed_record"))
    );
    assert!(!body.to_string().contains("dave"), "{body}");
    let err = grpc(eval, t, &[rec("control", 1, 200), bad])
        .await
        .expect_err("bad record");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(count(receivers), 0, "nothing half-stored");

    grpc(eval, t, &[rec("control", 1, 200)]).await.expect("ok");
    assert_eq!(count(receivers), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eval_token_must_differ_from_the_gateway_token() {
    let env = Env::new().await;
    let data = env.path("data");
    let mut e = evidence_settings(&env, Backend::Sqlite);
    e.eval_token_file = e.gateway_token_file.clone();
    let err = halo_server::evidence::start(&e, Some(&data))
        .await
        .expect_err("same token");
    assert!(err.to_string().contains("must differ"), "{err}");
    // The gateway receiver cannot run without its token.
    let mut e = evidence_settings(&env, Backend::Sqlite);
    e.gateway_token_file = None;
    let err = halo_server::evidence::start(&e, Some(&data))
        .await
        .expect_err("no token");
    assert!(
        err.to_string().contains("--otlp-gateway-token-file"),
        "{err}"
    );
    // A weak token is refused like the gateway token.
    std::fs::write(env.path("weak.token"), "password-password-password-12345").unwrap();
    let mut e = evidence_settings(&env, Backend::Sqlite);
    e.gateway_token_file = Some(env.path("weak.token"));
    let err = halo_server::evidence::start(&e, Some(&data))
        .await
        .expect_err("weak");
    assert!(
        format!("{err:#}").contains("openssl rand -hex 32"),
        "{err:#}"
    );
}
