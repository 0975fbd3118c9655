//! The mirror service as it is deployed, for the treatments whose credential is not a key
//! (issue #24): the halo-server binary, with an AWS key pair in its environment and the
//! SDS file halo-credentials keeps fresh, serves a real Envoy over xDS and mirrors its
//! shadow jobs. A Bedrock treatment's copy must carry a SigV4 signature the fake Bedrock
//! verifies with the AWS SDK's signer; a Vertex treatment's copy the Google token the
//! fake Google issued. Both answers are recorded as evidence for the treatment, source
//! shadow, with the tokens the targets reported.
//!
//! A subprocess, not halo-server in-process: the AWS key pair is read from the process
//! environment, as the gateway's Envoy reads it.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use halo_credentials::google::TokenSource;
use halo_credentials::refresh::Policy;
use halo_credentials::run::{Refresher, SystemClock};
use halo_credentials::sds::{self, SdsFile};
use halo_evidence::{Metric, SampleQuery};
use halo_testkit::envoy::{Envoy, aws_chain_env};
use halo_testkit::free_port;
use halo_testkit::google::{FakeGoogle, FakeVertex, SA_KEY_PEM, VERTEX_USAGE, write_key_file};
use halo_testkit::provider::{Sigv4Key, WireProvider};
use halo_testkit::tls::TestCa;
use serde_json::{Value, json};

use support::Env;

const BIN: &str = env!("CARGO_BIN_EXE_halo-server");
const ACCESS_KEY: &str = "AKIDHALOSHADOW00";
const SECRET_KEY: &str = "halo/shadow/secret+key/000000000000000000";
const SHADOW_TOKEN: &str = "5ad0f00d1b2d8046af13ce97b0d24e6c58a7f31d9e0b6c24f8a5173d0e9c6b12";
const BEDROCK_MODEL: &str =
    "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/shadowhaiku";
const VERTEX_MODEL: &str = "claude-opus-4-1@20250805";
/// How long a mirrored copy may take to arrive and be recorded.
const ARRIVAL: Duration = Duration::from_secs(20);

/// haiku and opus answered by anthropic (the live calls); a shadow experiment on each, for
/// the canary ring, sends every step of a sampled canary caller to bedrock (haiku) or to
/// vertex (opus) as well. Both credentialed targets are https, as policy validation wants.
fn gateway_yaml(anthropic: &str, bedrock: &str, vertex: &str) -> String {
    format!(
        r#"apiVersion: halos.dev/v1
kind: Gateway
baseURL: https://gw.test
protocols:
  claude-code: anthropic-messages
  codex: openai-responses
  gemini-cli: gemini
upstreams:
  anthropic: {{url: "{anthropic}", kind: anthropic}}
  bedrock: {{url: "{bedrock}", kind: bedrock, region: us-east-1}}
  vertex: {{url: "{vertex}", kind: vertex, project: acme-ai-prod, region: us-east5}}
models:
  haiku: {{targets: [{{upstream: anthropic, model: claude-haiku-live}}]}}
  opus: {{targets: [{{upstream: anthropic, model: claude-opus-live}}]}}
  # The aliases the example profiles name (kept from acme-corp).
  default: {{targets: [{{upstream: anthropic, model: m}}]}}
  sonnet: {{targets: [{{upstream: anthropic, model: m}}]}}
  gpt: {{targets: [{{upstream: anthropic, model: m}}]}}
  gemini-pro: {{targets: [{{upstream: anthropic, model: m}}]}}
"#
    )
}

fn experiment(name: &str, alias: &str, upstream: &str, model: &str) -> String {
    format!(
        r#"apiVersion: halos.dev/v1
kind: Experiment
name: {name}
type: shadow
axis: traffic
status: running
rings: [canary]
salt: {name}-salt
variants:
  - name: control
    weight: 1
  - name: treatment
    weight: 99
    routes:
      {alias}:
        upstream: {upstream}
        model: "{model}"
shadow:
  turns: all
metrics:
  primary:
    name: halo.error_rate
    direction: decrease
stopping:
  minSamples: 10
  maxDays: 7
  maxSpendUSD: 10
"#
    )
}

/// The halo-server binary, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start the binary with `args` and `env`, and wait (bounded) for its readiness line.
fn start_server(args: &[String], env: &[(&str, Option<&str>)]) -> Server {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (name, value) in env {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    let mut child = cmd.spawn().expect("halo-server starts");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        // Keep reading so the child never blocks on a full pipe.
        for _ in lines {}
    });
    let server = Server(child);
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("halo-server's readiness line");
    assert!(line.starts_with("halo-server listening"), "{line}");
    server
}

async fn ask(client: &reqwest::Client, port: u16, token: &str, alias: &str) -> (u16, Value) {
    let r = client
        .post(format!("http://127.0.0.1:{port}/v1/messages"))
        .bearer_auth(token)
        .json(&json!({"model": alias, "max_tokens": 5,
                      "messages": [{"role": "user", "content": "write a test"}]}))
        .send()
        .await
        .expect("the gateway answers");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The treatment's samples of `metric` for `experiment`, once there are any (bounded).
fn samples(data: &std::path::Path, experiment: &str, metric: Metric) -> Vec<halo_evidence::Sample> {
    let store = halo_evidence::open::open_store(None, Some(data)).expect("store");
    let query = SampleQuery {
        experiment: experiment.into(),
        metric,
        since_unix_ms: 0,
        until_unix_ms: i64::MAX,
    };
    let deadline = Instant::now() + ARRIVAL;
    loop {
        let samples = store.samples(&query).expect("samples");
        if !samples.is_empty() {
            return samples;
        }
        assert!(
            Instant::now() < deadline,
            "no shadow evidence recorded for {experiment}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_and_vertex_treatments_are_signed_sent_and_recorded_by_the_binary() {
    let env = Env::new().await;
    let anthropic = WireProvider::start(true).await.expect("anthropic");
    let bedrock = WireProvider::start_with(
        true,
        Some(Sigv4Key {
            region: Some("us-east-1".into()),
            access_key: ACCESS_KEY.into(),
            secret_key: SECRET_KEY.into(),
        }),
    )
    .await
    .expect("bedrock");
    let google = FakeGoogle::start(3600).await;
    let vertex = FakeVertex::start(&google).await;
    // https fronts from a CA of this test, which the gateway settings' upstreamCaFile
    // names (with the identity provider's): halo-server must verify the targets with it.
    let ca = TestCa::new("shadow targets");
    let bedrock_tls = ca.front(&bedrock.url(), &["127.0.0.1"]).await;
    let vertex_tls = ca
        .front(&format!("http://127.0.0.1:{}", vertex.port), &["127.0.0.1"])
        .await;
    let trust = env.path("upstream-ca.pem");
    std::fs::write(
        &trust,
        std::fs::read_to_string(env.path("oidc-ca.pem")).expect("oidc CA")
            + &std::fs::read_to_string(ca.ca_file()).expect("test CA"),
    )
    .expect("CA bundle");

    // The Google token as halo-credentials publishes it for the gateway's Envoy.
    std::fs::create_dir(env.path("sds")).expect("sds dir");
    let sds_path = env.path("sds/vertex.json");
    let key = write_key_file(env.dir.path(), &google.token_uri(), SA_KEY_PEM);
    let mut refresher = Refresher::new(
        TokenSource::KeyFile(key),
        SdsFile::new(&sds_path, "halo-vertex-token", sds::Value::Bearer).expect("sds"),
        Policy::default(),
        SystemClock,
    )
    .expect("refresher");
    refresher.attempt().await.expect("a token is published");

    // acme-corp's identity, rings and profiles; this test's gateway and experiments.
    let policy = env.path("policy");
    for dir in ["experiments", "toggles", "rollouts"] {
        let _ = std::fs::remove_dir_all(policy.join(dir));
    }
    std::fs::write(
        policy.join("gateway.yaml"),
        gateway_yaml(
            &anthropic.url(),
            &bedrock_tls.url("127.0.0.1"),
            &vertex_tls.url("127.0.0.1"),
        ),
    )
    .expect("gateway.yaml");
    std::fs::create_dir(policy.join("experiments")).expect("experiments dir");
    for (name, alias, upstream, model) in [
        ("haiku-bedrock-shadow", "haiku", "bedrock", BEDROCK_MODEL),
        ("opus-vertex-shadow", "opus", "vertex", VERTEX_MODEL),
    ] {
        std::fs::write(
            policy.join(format!("experiments/{name}.yaml")),
            experiment(name, alias, upstream, model),
        )
        .expect("experiment");
    }
    let snap = match halo_xds::source::load_policy(&policy) {
        Ok(snap) => snap,
        Err(problems) => panic!("test policy invalid: {problems:#?}"),
    };
    // A canary developer both experiments sample.
    let sampled = |user: &str| {
        ["haiku-bedrock-shadow", "opus-vertex-shadow"]
            .iter()
            .all(|name| {
                let experiment = snap.experiment(name).expect("experiment");
                halo_policy::decide::assigned_variant(experiment, user) == Some(1)
            })
    };
    let user = (0..1000)
        .map(|i| format!("dev{i}@acme.com"))
        .find(|u| sampled(u))
        .expect("a sampled user");

    // The gateway settings halo-server serves: the loopback fakes may receive a signature
    // and a token, as an operator would list them; the token file the Envoy reads.
    let listen = free_port();
    let gateway_file = env.path("xds-gateway.json");
    std::fs::write(
        &gateway_file,
        json!({
            "listenAddress": "127.0.0.1", "listenPort": listen,
            "wasmPath": halo_testkit::filter_module().display().to_string(),
            "upstreamCaFile": trust.display().to_string(),
            "signHosts": ["127.0.0.1"],
            "upstreamHosts": ["127.0.0.1"],
            "vertexTokenSds": sds_path.display().to_string(),
        })
        .to_string(),
    )
    .expect("gateway file");
    std::fs::write(env.path("shadow.token"), SHADOW_TOKEN).expect("shadow token");
    let (xds, shadow, admin) = (free_port(), free_port(), free_port());
    let data = env.path("data");
    let path = |name: &str| env.path(name).display().to_string();
    let args: Vec<String> = [
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
        "--admin-listen",
        &format!("127.0.0.1:{admin}"),
        "--policy-dir",
        &path("policy"),
        "--data-dir",
        &path("data"),
        "--oidc-ca-file",
        &path("oidc-ca.pem"),
        "--xds-listen",
        &format!("127.0.0.1:{xds}"),
        "--xds-gateway-file",
        &path("xds-gateway.json"),
        "--shadow-listen",
        &format!("127.0.0.1:{shadow}"),
        "--shadow-token-file",
        &path("shadow.token"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Exactly this key pair, and none of the rest of the AWS chain.
    let server_env = aws_chain_env(Some((ACCESS_KEY, SECRET_KEY)));
    let _server = tokio::task::block_in_place(|| start_server(&args, &server_env));
    let envoy_admin = free_port();
    let yaml =
        halo_envoy_config::ads::AdsBootstrap::loopback("halo-gateway", xds, envoy_admin).render();
    // The gateway signs no call itself here (control's target is anthropic): no AWS chain.
    let envoy = tokio::task::block_in_place(|| {
        Envoy::start_with_env(&yaml, envoy_admin, &aws_chain_env(None))
    });
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");

    // Ready when a caller no experiment enrolls (not in the canary ring) is answered.
    let outsider = env.user_token();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ask(&client, listen, &outsider, "haiku").await.0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the gateway never answered; Envoy log:\n{}",
            envoy.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A canary developer's haiku call and opus call, each answered by control's target.
    let canary = env.issuer.mint(json!({
        "aud": "api://halos", "sub": "u-canary", "email": user,
        "email_verified": true, "groups": ["halos-canary"],
    }));
    for (alias, live) in [("haiku", "claude-haiku-live"), ("opus", "claude-opus-live")] {
        let (status, answer) = ask(&client, listen, &canary, alias).await;
        assert_eq!(status, 200, "{answer}");
        let answered = anthropic
            .received()
            .iter()
            .any(|r| r.model().as_deref() == Some(live));
        assert!(answered, "{alias}: control's target did not answer");
    }

    // Bedrock got the copy, signed: the fake verifies every signature with the AWS SDK's
    // signer and answers 403 (no usage) otherwise; the answers by status are checked on
    // halo-server's metrics below.
    let errors = samples(&data, "haiku-bedrock-shadow", Metric::ErrorRate);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].variant, "treatment");
    assert_eq!(errors[0].source, halo_evidence::Source::Shadow);
    assert_eq!(errors[0].value, 0.0, "the signed copy was refused");
    let copies = bedrock.received();
    assert_eq!(copies.len(), 1, "{copies:?}");
    let copy = &copies[0];
    assert_eq!(copy.model().as_deref(), Some(BEDROCK_MODEL));
    assert!(copy.path.ends_with("/invoke"), "{}", copy.path);
    assert!(
        copy.header("authorization")
            .is_some_and(|a| a.starts_with("AWS4-HMAC-SHA256 Credential=AKIDHALOSHADOW00/")),
        "{:?}",
        copy.header("authorization")
    );
    // Nothing of the caller's: the client's token went to neither copy.
    for (name, value) in &copy.headers {
        assert!(
            !value.contains(&canary),
            "{name} carries the caller's token"
        );
    }
    let (input, output) = copy.usage().expect("the fake's usage");
    let tokens = samples(&data, "haiku-bedrock-shadow", Metric::Tokens);
    assert_eq!(tokens[0].value, (input + output) as f64, "{tokens:?}");

    // Vertex got the copy with the Google token from the SDS file.
    let errors = samples(&data, "opus-vertex-shadow", Metric::ErrorRate);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].variant, "treatment");
    assert_eq!(errors[0].value, 0.0, "the copy was refused");
    let calls = vertex.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    // The path as the gateway's own attempt sends it (the model id percent-encoded).
    assert_eq!(
        calls[0].path,
        "/v1/projects/acme-ai-prod/locations/us-east5/publishers/anthropic/models/claude-opus-4-1%4020250805:rawPredict"
    );
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(format!("Bearer {}", halo_testkit::google::token_name(1)).as_str())
    );
    let tokens = samples(&data, "opus-vertex-shadow", Metric::Tokens);
    assert_eq!(
        tokens[0].value,
        (VERTEX_USAGE.0 + VERTEX_USAGE.1) as f64,
        "{tokens:?}"
    );

    // Each copy went over TLS the mirror verified against upstreamCaFile.
    assert_eq!(bedrock_tls.refused() + vertex_tls.refused(), 0);

    // halo-server's own count: both jobs recorded, nothing refused for a credential.
    let metrics = client
        .get(format!("http://127.0.0.1:{admin}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics.contains("halo_server_shadow_jobs_total{outcome=\"recorded\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("halo_server_shadow_answers_total{status=\"200\"} 2"),
        "{metrics}"
    );
    assert!(!metrics.contains("outcome=\"key_missing\""), "{metrics}");
}
