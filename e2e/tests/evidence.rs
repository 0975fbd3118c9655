//! Evidence end to end, in both gateway modes (the build `HALO_FILTER` selects;
//! scripts/test.sh runs this binary with both): the filter accounts each decided model
//! call, Envoy's OpenTelemetry access logger sends one OTLP record per call to a real
//! halo-server gateway receiver (its embedded store), with the gateway token as gRPC
//! metadata. A JSON call, an SSE call, a Bedrock event-stream call, Bedrock Converse calls
//! (JSON and converse-stream) and a failover call each land as exactly one record with the tokens the client saw, the cost from the
//! policy's prices and the attempts Envoy made; Envoy's Prometheus counts the same
//! tokens and cost by ring, variant and upstream. The same scenario runs against a
//! standalone bootstrap (`halo envoy bootstrap --evidence-url`) and against an Envoy fed
//! over xDS by halo-server, whose gateway file names its own receiver (`evidence.url`)
//! and whose `--otlp-gateway-token-file` supplies the token.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use base64::Engine as _;
use halo_e2e::*;
use halo_evidence::Source;
use halo_providers::eventstream::Decoder;
use halo_server::evidence::EvidenceSettings;
use halo_testkit::provider::WireProvider;
use halo_testkit::wait_until;
use serde_json::{Value, json};

const GATEWAY_TOKEN: &str = "5f0e1d2c3b4a59687766554433221100ffeeddccbbaa99887766554433221100";
const USER: &str = "erin@acme.test";

/// USD per million tokens of the served models (upstream wire); `opus` on bedrock has
/// no price, so its cost is unknown.
const SONNET: (f64, f64) = (3.0, 15.0);
/// The same of the model the Bedrock Converse calls are served by (upstream converse).
const HAIKU: (f64, f64) = (1.0, 5.0);

/// One stored record, as the store's table holds it.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    source: String,
    ring: String,
    alias: String,
    upstream: String,
    model: String,
    target: String,
    attempts: i64,
    status: i64,
    ttfb_ms: Option<f64>,
    duration_ms: Option<f64>,
    input: Option<i64>,
    output: Option<i64>,
    cost: Option<f64>,
    complete: bool,
    unit: String,
}

fn rows(db: &std::path::Path) -> Vec<Row> {
    let Ok(conn) =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
    else {
        return Vec::new();
    };
    let Ok(mut q) = conn.prepare(
        "SELECT source, ring, alias, upstream, model, target, attempts, status, ttfb_ms, \
         duration_ms, input_tokens, output_tokens, cost_usd, complete, unit FROM evidence ORDER BY id",
    ) else {
        return Vec::new();
    };
    q.query_map([], |r| {
        Ok(Row {
            source: r.get(0)?,
            ring: r.get(1)?,
            alias: r.get(2)?,
            upstream: r.get(3)?,
            model: r.get(4)?,
            target: r.get(5)?,
            attempts: r.get(6)?,
            status: r.get(7)?,
            ttfb_ms: r.get(8)?,
            duration_ms: r.get(9)?,
            input: r.get(10)?,
            output: r.get(11)?,
            cost: r.get(12)?,
            complete: r.get::<_, i64>(13)? != 0,
            unit: r.get(14)?,
        })
    })
    .map(|it| it.filter_map(Result::ok).collect())
    .unwrap_or_default()
}

/// The record of the call to `alias`, once it is stored (exactly one).
fn record(db: &std::path::Path, alias: &str) -> Row {
    let found = wait_until(
        &format!("the record of the {alias} call"),
        Duration::from_secs(20),
        || {
            let of: Vec<Row> = rows(db).into_iter().filter(|r| r.alias == alias).collect();
            (!of.is_empty()).then_some(of)
        },
    );
    assert_eq!(found.len(), 1, "one record per call: {found:?}");
    found.into_iter().next().expect("one")
}

/// Anthropic usage (input, output) of an SSE answer: message_start's input,
/// message_delta's output.
fn sse_usage(text: &str) -> (i64, i64) {
    let mut usage = (0, 0);
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
        usage = event_usage(&v, usage);
    }
    usage
}

fn event_usage(v: &Value, (input, output): (i64, i64)) -> (i64, i64) {
    let start = &v["message"]["usage"];
    let delta = &v["usage"];
    (
        start["input_tokens"].as_i64().unwrap_or(input),
        delta["output_tokens"]
            .as_i64()
            .or(start["output_tokens"].as_i64())
            .unwrap_or(output),
    )
}

/// Bedrock Converse usage (input, output) of a converse-stream answer: its `metadata`
/// event.
fn converse_stream_usage(bytes: &[u8]) -> (i64, i64) {
    let mut decoder = Decoder::new();
    let frames = decoder.feed(bytes).expect("an event stream");
    let metadata = frames
        .iter()
        .find(|f| f.header(":event-type") == Some("metadata"))
        .expect("a metadata event");
    let v: Value = serde_json::from_slice(&metadata.payload).expect("metadata json");
    converse_usage(&v["usage"])
}

fn converse_usage(u: &Value) -> (i64, i64) {
    (
        u["inputTokens"].as_i64().expect("inputTokens"),
        u["outputTokens"].as_i64().expect("outputTokens"),
    )
}

/// The same of an AWS event stream answer (Anthropic events in `chunk` frames).
fn event_stream_usage(bytes: &[u8]) -> (i64, i64) {
    let mut decoder = Decoder::new();
    let mut usage = (0, 0);
    for frame in decoder.feed(bytes).expect("an event stream") {
        let chunk: Value = serde_json::from_slice(&frame.payload).expect("chunk json");
        let event = base64::engine::general_purpose::STANDARD
            .decode(chunk["bytes"].as_str().expect("bytes"))
            .expect("base64");
        usage = event_usage(&serde_json::from_slice(&event).expect("event"), usage);
    }
    usage
}

fn cost((input, output): (i64, i64), (pin, pout): (f64, f64)) -> f64 {
    (input as f64 * pin + output as f64 * pout) / 1e6
}

fn assert_served(r: &Row, alias: &str, model: &str, usage: (i64, i64), attempts: i64) {
    assert_eq!(r.source, "gateway", "stamped by the receiver");
    assert_eq!((r.ring.as_str(), r.alias.as_str()), ("general", alias));
    assert_eq!((r.upstream.as_str(), r.model.as_str()), ("wire", model));
    assert!(r.target.starts_with("t~wire~"), "{r:?}");
    assert_eq!((r.status, r.attempts), (200, attempts), "{r:?}");
    assert_eq!((r.input, r.output), (Some(usage.0), Some(usage.1)), "{r:?}");
    assert!(r.complete, "{r:?}");
    assert!(r.ttfb_ms.is_some() && r.duration_ms.is_some(), "{r:?}");
    assert_eq!(r.unit.len(), 32);
    assert!(!r.unit.contains("erin"), "never the subject");
}

/// The test policy as a policy directory (what halo-server serves; the standalone
/// gateway gets the same directory compiled), written as a real one must be (https
/// issuer and upstreams); [`loopback`] points them at this test's fakes after validation,
/// as halo-demo does. `opus` on bedrock has no price, `fo` fails over from a target
/// answering 503.
fn write_policy(dir: &std::path::Path) {
    let files = [
        (
            "halos.yaml",
            format!(
                "apiVersion: halos.dev/v1\norg: test-org\nidentity:\n  issuer: https://issuer.invalid\n  clientID: evidence-tests\n  audience: {AUDIENCE}\n  adminGroups: [admins]\n  claims: {{user: email, groups: groups}}\n"
            ),
        ),
        (
            "gateway.yaml",
            format!(
                "apiVersion: halos.dev/v1\nkind: Gateway\nbaseURL: https://gateway.invalid\n\
                 protocols: {{claude-code: anthropic-messages, codex: openai-responses, gemini-cli: gemini}}\n\
                 upstreams:\n  wire: {{url: \"https://wire.invalid\", kind: anthropic}}\n\
                 \x20 bedrock: {{url: \"https://bedrock.invalid\", kind: bedrock}}\n  down: {{url: \"https://down.invalid\", kind: anthropic}}\n\
                 \x20 converse: {{url: \"https://converse.invalid\", kind: bedrock}}\n\
                 models:\n  sonnet: {{upstream: wire, model: claude-sonnet-4-5}}\n  stream: {{upstream: wire, model: claude-sonnet-4-5}}\n\
                 \x20 opus: {{upstream: bedrock, model: anthropic.claude-opus-4-1}}\n  after: {{upstream: wire, model: claude-sonnet-4-5}}\n\
                 \x20 conv: {{upstream: converse, model: anthropic.claude-haiku-4-5}}\n  convs: {{upstream: converse, model: anthropic.claude-haiku-4-5}}\n\
                 \x20 fo:\n    targets:\n      - {{upstream: down, model: claude-sonnet-4-5}}\n      - {{upstream: wire, model: claude-sonnet-4-5, priority: 1}}\n\
                 prices:\n  wire:\n    claude-sonnet-4-5: {{input: {}, output: {}}}\n\
                 \x20 converse:\n    anthropic.claude-haiku-4-5: {{input: {}, output: {}}}\n",
                SONNET.0, SONNET.1, HAIKU.0, HAIKU.1
            ),
        ),
        (
            "rings.yaml",
            "apiVersion: halos.dev/v1\nkind: Ring\nname: general\norder: 9\nprofile: dev\nmembership:\n  default: true\n".to_string(),
        ),
        (
            "profile.yaml",
            "apiVersion: halos.dev/v1\nkind: Profile\nname: dev\nmodels: [sonnet, stream, opus, after, fo, conv, convs]\n".to_string(),
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).expect("write a policy file");
    }
}

/// The compiled policy pointed at this test's fakes: the issuer, and each upstream at
/// the fake provider of its name (`down` answers 503, the others are the wire provider).
fn loopback(issuer: &str, wire: &str, down: &str) -> halo_xds::source::Transform {
    let (issuer, wire, down) = (issuer.to_string(), wire.to_string(), down.to_string());
    std::sync::Arc::new(move |mut snap: halo_policy::Snapshot| {
        if let Some(id) = snap.identity.as_mut() {
            id.issuer = issuer.clone();
        }
        for (name, u) in &mut snap.upstreams {
            u.url = if name == "down" {
                down.clone()
            } else {
                wire.clone()
            };
        }
        snap
    })
}

/// What both modes share: the receiver's token file, the fake issuer and providers, the
/// policy directory and the transform pointing it at them.
struct Fixture {
    dir: tempfile::TempDir,
    token_file: std::path::PathBuf,
    policy: std::path::PathBuf,
    loopback: halo_xds::source::Transform,
    issuer: Issuer,
    _wire: WireProvider,
    down: Provider,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("otlp-gateway.token");
    std::fs::write(&token_file, GATEWAY_TOKEN).expect("token file");
    let issuer = Issuer::start().await;
    let wire = WireProvider::start(false).await.expect("wire provider");
    let down = Provider::behaving("down", Behaviour::Status(503)).await;
    let policy = dir.path().join("policy");
    std::fs::create_dir(&policy).expect("policy dir");
    std::fs::create_dir(dir.path().join("data")).expect("data dir");
    write_policy(&policy);
    Fixture {
        loopback: loopback(&issuer.url, &wire.url(), &down.url),
        dir,
        token_file,
        policy,
        issuer,
        _wire: wire,
        down,
    }
}

impl Fixture {
    /// The policy as the gateway serves it.
    fn snapshot(&self) -> halo_policy::Snapshot {
        (self.loopback)(halo_xds::source::load_policy(&self.policy).expect("the test policy"))
    }
}

/// A standalone gateway exporting to an in-process gateway receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_each_decided_call_is_one_record_at_the_gateway_receiver_and_counted() {
    let f = fixture().await;
    let data = f.dir.path().join("data");
    let settings = EvidenceSettings {
        gateway_listen: Some("127.0.0.1:0".parse().expect("addr")),
        gateway_token_file: Some(f.token_file.clone()),
        ..EvidenceSettings::default()
    };
    let receivers = halo_server::evidence::start(&settings, Some(&data))
        .await
        .expect("receivers")
        .expect("a receiver");
    let receiver = receivers.addr(Source::Gateway).expect("gateway receiver");
    let gw = tokio::task::block_in_place(|| {
        Gateway::start(
            f.snapshot(),
            GatewayOptions {
                evidence: Some(halo_envoy_config::evidence::Export {
                    url: format!("http://{receiver}"),
                    token_file: None,
                    token: GATEWAY_TOKEN.into(),
                }),
                ..GatewayOptions::default()
            },
        )
    });
    scenario(&f, &gw, &data.join("evidence.db")).await;
    receivers.shutdown().await;
}

/// halo-server serving xDS and its own gateway receiver; its gateway file says where
/// evidence goes, its receiver's token file supplies the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_xds_each_decided_call_is_one_record_at_halo_servers_receiver_and_counted() {
    let f = fixture().await;
    let data = f.dir.path().join("data");
    let receiver = format!("127.0.0.1:{}", halo_testkit::free_port());
    let listen_port = halo_testkit::free_port();
    let gateway_file = f.dir.path().join("xds-gateway.yaml");
    std::fs::write(
        &gateway_file,
        format!(
            "listenAddress: 127.0.0.1\nlistenPort: {listen_port}\nwasmPath: {}\nupstreamHosts: [127.0.0.1]\nevidence: {{url: \"http://{receiver}\"}}\n",
            halo_testkit::filter_module().display()
        ),
    )
    .expect("gateway file");
    let settings = halo_server::config::Settings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        admin_listen: "127.0.0.1:0".parse().expect("addr"),
        policy_dir: f.policy.clone(),
        data_dir: Some(data.clone()),
        killswitch_key_file: None,
        gateway_token_file: None,
        token_file: None,
        device_ttl: Duration::from_secs(3600),
        enrollment_ttl: Duration::from_secs(3600),
        oidc_ca_file: None,
        max_body_bytes: 4096,
        xds_listen: Some("127.0.0.1:0".parse().expect("addr")),
        xds_gateway_file: Some(gateway_file),
        evidence: EvidenceSettings {
            gateway_listen: Some(receiver.parse().expect("addr")),
            gateway_token_file: Some(f.token_file.clone()),
            ..EvidenceSettings::default()
        },
        shadow: Default::default(),
        budget: Default::default(),
        console_url: None,
        controller: Default::default(),
    };
    let server = halo_server::server::start_with(
        &settings,
        halo_server::xds::XdsOptions {
            gateway: None,
            transform: Some(f.loopback.clone()),
        },
    )
    .await
    .expect("halo-server starts");
    let ads = server.xds.as_ref().expect("xDS host").addr.port();
    let gw = halo_e2e::xds::gateway_of(ads, listen_port, &f.snapshot()).await;
    scenario(&f, &gw, &data.join("evidence.db")).await;
    server.shutdown().await;
}

/// The calls and what each must leave: one record per decided call in the store at
/// `db`, and the same tokens and cost in Envoy's Prometheus.
async fn scenario(f: &Fixture, gw: &Gateway, db: &std::path::Path) {
    let auth = bearer(&f.issuer.token(USER, &[]));
    let headers = [("authorization", auth.as_str())];
    let content = "one two three four five";

    // A JSON answer.
    let body = json!({"model": "sonnet", "max_tokens": 64, "messages": [{"role": "user", "content": content}]});
    let a = gw.post("/v1/messages", &headers, &body).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let u = &a.json()["usage"];
    let json_usage = (
        u["input_tokens"].as_i64().expect("input"),
        u["output_tokens"].as_i64().expect("output"),
    );
    let r = record(db, "sonnet");
    assert_served(&r, "sonnet", "claude-sonnet-4-5", json_usage, 1);
    let want = cost(json_usage, SONNET);
    assert!(r.cost.is_some_and(|c| (c - want).abs() < 1e-12), "{r:?}");

    // An SSE answer: usage from message_start and message_delta.
    let body = json!({"model": "stream", "max_tokens": 64, "stream": true,
                      "messages": [{"role": "user", "content": content}]});
    let a = gw.post("/v1/messages", &headers, &body).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let sse = sse_usage(&a.text());
    assert!(sse.1 > 1, "the final output count: {sse:?}");
    let r = record(db, "stream");
    assert_served(&r, "stream", "claude-sonnet-4-5", sse, 1);
    assert!(
        r.cost
            .is_some_and(|c| (c - cost(sse, SONNET)).abs() < 1e-12)
    );

    // A Bedrock event stream, passed to the Bedrock client as it is: its model has no
    // price, so its cost is unknown (never 0).
    let body = json!({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64,
                      "messages": [{"role": "user", "content": content}]});
    let a = gw
        .post("/model/opus/invoke-with-response-stream", &headers, &body)
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(
        a.header("content-type"),
        Some("application/vnd.amazon.eventstream")
    );
    let es = event_stream_usage(&a.body);
    let r = record(db, "opus");
    assert_eq!(
        (r.upstream.as_str(), r.model.as_str()),
        ("bedrock", "anthropic.claude-opus-4-1")
    );
    assert_eq!(
        (r.input, r.output, r.complete),
        (Some(es.0), Some(es.1), true)
    );
    assert_eq!(r.cost, None, "no price: unknown");

    // Bedrock Converse, JSON and event stream (usage in camelCase; converse-stream's in
    // its `metadata` event).
    let body = json!({"messages": [{"role": "user", "content": [{"text": content}]}],
                      "inferenceConfig": {"maxTokens": 64}});
    let a = gw.post("/model/conv/converse", &headers, &body).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let conv = converse_usage(&a.json()["usage"]);
    let r = record(db, "conv");
    assert_eq!(
        (r.upstream.as_str(), r.model.as_str(), r.status, r.complete),
        ("converse", "anthropic.claude-haiku-4-5", 200, true)
    );
    assert_eq!((r.input, r.output), (Some(conv.0), Some(conv.1)), "{r:?}");
    assert!(
        r.cost
            .is_some_and(|c| (c - cost(conv, HAIKU)).abs() < 1e-12)
    );
    let a = gw
        .post("/model/convs/converse-stream", &headers, &body)
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let convs = converse_stream_usage(&a.body);
    assert!(convs.1 > 1, "{convs:?}");
    let r = record(db, "convs");
    assert_eq!(
        (r.input, r.output, r.complete),
        (Some(convs.0), Some(convs.1), true),
        "{r:?}"
    );
    assert!(
        r.cost
            .is_some_and(|c| (c - cost(convs, HAIKU)).abs() < 1e-12)
    );

    // Failover: the first target answers 503, Envoy's second attempt is served.
    let body = json!({"model": "fo", "max_tokens": 64, "messages": [{"role": "user", "content": content}]});
    let a = gw.post("/v1/messages", &headers, &body).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(
        f.down.count(),
        1,
        "the first attempt went to the failing target"
    );
    let u = &a.json()["usage"];
    let fo_usage = (
        u["input_tokens"].as_i64().expect("input"),
        u["output_tokens"].as_i64().expect("output"),
    );
    let r = record(db, "fo");
    assert_served(&r, "fo", "claude-sonnet-4-5", fo_usage, 2);

    // One record per call, nothing else: a refusal is not evidence (Envoy logs in order,
    // so once the next call's record is in, the refusal's would be too).
    let refused = gw.post("/v1/messages", &[], &body).await;
    assert_eq!(refused.status, 401);
    let body = json!({"model": "after", "max_tokens": 64, "messages": [{"role": "user", "content": content}]});
    assert_eq!(gw.post("/v1/messages", &headers, &body).await.status, 200);
    record(db, "after");
    assert_eq!(rows(db).len(), 7);
    let after = rows(db).into_iter().last().expect("after");
    let after_usage = (after.input.expect("input"), after.output.expect("output"));

    // Envoy's Prometheus: the same tokens and cost, by ring, variant and upstream (the
    // native build hands its counts over once a second).
    let wire_input = json_usage.0 + sse.0 + fo_usage.0 + after_usage.0;
    let series = "halo_tokens{halo_ring=\"general\",halo_variant=\"none\",halo_upstream=\"wire\",halo_kind=\"input\"}";
    wait_until("the token counters", Duration::from_secs(10), || {
        (gw.prometheus_sum(series) == u64::try_from(wire_input).ok()?).then_some(())
    });
    let micros = ((cost(json_usage, SONNET) * 1e6).round()
        + (cost(sse, SONNET) * 1e6).round()
        + (cost(fo_usage, SONNET) * 1e6).round()
        + (cost(after_usage, SONNET) * 1e6).round()) as u64;
    assert_eq!(
        gw.prometheus_sum(
            "halo_cost_micro_usd{halo_ring=\"general\",halo_variant=\"none\",halo_upstream=\"wire\"}"
        ),
        micros
    );
    assert_eq!(
        gw.prometheus_sum("halo_cost_micro_usd{halo_ring=\"general\",halo_variant=\"none\",halo_upstream=\"bedrock\"}"),
        0,
        "an unknown cost adds nothing"
    );
    let converse_micros =
        ((cost(conv, HAIKU) * 1e6).round() + (cost(convs, HAIKU) * 1e6).round()) as u64;
    assert_eq!(
        gw.prometheus_sum("halo_cost_micro_usd{halo_ring=\"general\",halo_variant=\"none\",halo_upstream=\"converse\"}"),
        converse_micros
    );
}
