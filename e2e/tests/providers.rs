//! Providers through the real gateway (issue 8): the standalone bootstrap rendered from a
//! policy, a real Envoy 1.40 and the built filter. The per-attempt stage translates each
//! attempt for its own target (halo-providers), and the credential chain rendered by
//! halo-envoy-config signs Bedrock attempts (SigV4, checked by a fake that recomputes the
//! signature with aws-sigv4) and injects keys read from Envoy's environment.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use halo_e2e::bedrock::{ACCESS_KEY, FakeBedrock, SECRET_KEY, STREAM_EVENTS};
use halo_e2e::{Behaviour, Gateway, GatewayOptions, Issuer, Provider, bearer};
use halo_policy::Snapshot;
use reqwest::StatusCode;
use serde_json::{Value, json};

const REGION: &str = "us-east-1";
const BEDROCK_MODEL: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
const BEDROCK_INVOKE: &str = "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke";
const ANTHROPIC_MODEL: &str = "claude-sonnet-4-5-20250929";
const ANTHROPIC_KEY: &str = "sk-ant-gateway-own";
const AZURE_KEY: &str = "azure-gateway-key";

/// Envoy's environment: the AWS chain pointed at nothing but (optionally) the test's key
/// pair, and the key variables the policy's credentials name.
fn env(home: &str, aws: bool) -> Vec<(String, Option<String>)> {
    let key = aws.then_some((ACCESS_KEY, SECRET_KEY));
    let mut env: Vec<(String, Option<String>)> = halo_testkit::envoy::aws_chain_env(key)
        .into_iter()
        .map(|(name, value)| (name.to_string(), value.map(str::to_string)))
        .collect();
    env.push(("HOME".into(), Some(home.into())));
    env.push(("HALO_TEST_ANTHROPIC_KEY".into(), Some(ANTHROPIC_KEY.into())));
    env.push(("HALO_TEST_AZURE_KEY".into(), Some(AZURE_KEY.into())));
    env
}

struct Fixture {
    gw: Gateway,
    token: String,
    bedrock: FakeBedrock,
    bedrock_down: FakeBedrock,
    anthropic: Provider,
    anthropic_down: Provider,
    azure: Provider,
    _issuer: Issuer,
    _home: tempfile::TempDir,
}

async fn fixture(aws_credentials: bool) -> Fixture {
    // The fakes listen on loopback: let them receive the gateway's credentials.
    fixture_with(
        aws_credentials,
        json!({"signHosts": ["127.0.0.1"], "upstreamHosts": ["127.0.0.1"]}),
    )
    .await
}

async fn fixture_with(aws_credentials: bool, settings: Value) -> Fixture {
    let issuer = Issuer::start().await;
    let bedrock = FakeBedrock::start(REGION, StatusCode::OK).await;
    let bedrock_down = FakeBedrock::start(REGION, StatusCode::SERVICE_UNAVAILABLE).await;
    let anthropic = Provider::start("anthropic").await;
    let anthropic_down = Provider::behaving("anthropic-down", Behaviour::Status(503)).await;
    let azure = Provider::start("azure").await;
    let doc = json!({
        "schema": 1,
        "org": "providers-org",
        "identity": {"issuer": issuer.url, "audience": halo_e2e::AUDIENCE,
                     "claims": {"user": "email", "groups": "groups"}},
        "protocols": {"claude-code": "anthropic-messages", "codex": "openai-responses"},
        "upstreams": {
            "bedrock": {"url": bedrock.url, "kind": "bedrock", "region": REGION},
            "bedrock-down": {"url": bedrock_down.url, "kind": "bedrock", "region": REGION},
            "anthropic": {"url": anthropic.url, "kind": "anthropic",
                          "credential": {"env": "HALO_TEST_ANTHROPIC_KEY"}},
            "anthropic-down": {"url": anthropic_down.url, "kind": "anthropic"},
            "anthropic-plain": {"url": anthropic.url, "kind": "anthropic"},
            "azure": {"url": azure.url, "kind": "azure-openai",
                      "credential": {"env": "HALO_TEST_AZURE_KEY"}},
        },
        "models": {
            "claude": [{"upstream": "bedrock", "model": BEDROCK_MODEL}],
            "claude-fo": [
                {"upstream": "bedrock-down", "model": BEDROCK_MODEL},
                {"upstream": "anthropic", "model": ANTHROPIC_MODEL, "priority": 1},
            ],
            "codex": [{"upstream": "azure", "model": "gpt-5-deployment"}],
            // Anthropic (down) first, then Bedrock, which has no count_tokens, then
            // Anthropic again.
            "mixed": [
                {"upstream": "anthropic-down", "model": "first-choice"},
                {"upstream": "bedrock", "model": BEDROCK_MODEL, "priority": 1},
                {"upstream": "anthropic", "model": ANTHROPIC_MODEL, "priority": 2},
            ],
            // The first and the last target share a model and need nothing from the
            // stage; Bedrock, between them, rewrites the shared header map.
            "same-model-again": [
                {"upstream": "anthropic-down", "model": "shared-model"},
                {"upstream": "bedrock-down", "model": BEDROCK_MODEL, "priority": 1},
                {"upstream": "anthropic-plain", "model": "shared-model", "priority": 2},
            ],
        },
        "rings": [{"name": "general", "order": 0, "membership": {"default": true}}],
        "experiments": [],
        "toggles": [],
    });
    let snapshot = Snapshot::from_bytes(doc.to_string().as_bytes()).expect("policy decodes");
    let home = tempfile::tempdir().expect("home");
    let gw = Gateway::start(
        snapshot,
        GatewayOptions {
            settings,
            env: env(&home.path().display().to_string(), aws_credentials),
            ..GatewayOptions::default()
        },
    );
    let token = bearer(&issuer.token("dev@acme.test", &[]));
    Fixture {
        gw,
        token,
        bedrock,
        bedrock_down,
        anthropic,
        anthropic_down,
        azure,
        _issuer: issuer,
        _home: home,
    }
}

fn messages(alias: &str, stream: bool) -> Value {
    json!({"model": alias, "max_tokens": 64, "stream": stream,
           "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
           "messages": [{"role": "user", "content": "hi"}]})
}

impl Fixture {
    fn headers(&self) -> Vec<(&str, &str)> {
        vec![
            ("authorization", self.token.as_str()),
            ("anthropic-version", "2023-06-01"),
            ("x-api-key", "client-key-never-forwarded"),
            ("x-amz-security-token", "client-amz-never-forwarded"),
            ("content-type", "application/json"),
        ]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_serves_anthropic_clients_signed_translated_streamed_and_fails_over() {
    let f = fixture(true).await;

    // 1. A non-streaming Anthropic request: translated to invoke and SigV4-signed.
    let a =
        f.gw.post("/v1/messages", &f.headers(), &messages("claude", false))
            .await;
    assert_eq!(
        a.status,
        200,
        "{} {:?}",
        a.text(),
        f.bedrock
            .seen()
            .first()
            .map(|s| (&s.verdict, &s.seen.headers))
    );
    assert_eq!(a.json()["content"][0]["text"], "signed and served");
    let seen = f.bedrock.seen();
    assert_eq!(seen.len(), 1);
    let got = &seen[0];
    assert_eq!(got.verdict, Ok(()), "the fake recomputed another signature");
    assert_eq!(got.seen.path, BEDROCK_INVOKE);
    let body = got.seen.json();
    assert_eq!(body["anthropic_version"], "bedrock-2023-05-31");
    assert_eq!(body.get("model"), None);
    assert_eq!(body.get("stream"), None);
    assert_eq!(body["system"][0]["cache_control"]["type"], "ephemeral");
    assert_eq!(got.seen.header("x-api-key"), None);
    assert_eq!(got.seen.header("anthropic-version"), None);
    assert_eq!(got.seen.header("x-halo-target"), None);
    assert_eq!(got.seen.header("x-amz-security-token"), None);

    // 2. Streaming: invoke-with-response-stream, the event stream converted to SSE.
    let a =
        f.gw.post("/v1/messages", &f.headers(), &messages("claude", true))
            .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.header("content-type"), Some("text/event-stream"));
    let seen = f.bedrock.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].verdict, Ok(()));
    assert!(seen[1].seen.path.ends_with("/invoke-with-response-stream"));
    let text = a.text();
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = Value::Null;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).expect("SSE data is JSON");
                }
            }
            (name, data)
        })
        .collect();
    assert_eq!(events.len(), STREAM_EVENTS.len(), "{text}");
    for ((name, data), want) in events.iter().zip(STREAM_EVENTS) {
        let want: Value = serde_json::from_str(want).expect("event json");
        assert_eq!(data, &want);
        assert_eq!(name, want["type"].as_str().unwrap_or_default());
    }

    // 3. Failover bedrock (503) -> anthropic: each attempt its own request and credential.
    let a =
        f.gw.post("/v1/messages", &f.headers(), &messages("claude-fo", false))
            .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["provider"], "anthropic");
    let down = f.bedrock_down.seen();
    assert_eq!(down.len(), 1, "bedrock was tried first");
    assert_eq!(down[0].verdict, Ok(()));
    assert_eq!(down[0].seen.path, BEDROCK_INVOKE);
    let seen = f.anthropic.seen();
    assert_eq!(seen.len(), 1);
    let got = &seen[0];
    assert_eq!(got.path, "/v1/messages");
    assert_eq!(got.json()["model"], ANTHROPIC_MODEL);
    assert_eq!(got.json().get("anthropic_version"), None);
    assert_eq!(got.header("x-api-key"), Some(ANTHROPIC_KEY));
    assert_eq!(got.header("anthropic-version"), Some("2023-06-01"));
    for leaked in [
        "authorization",
        "x-amz-date",
        "x-amz-content-sha256",
        "x-amz-security-token",
        "x-halo-target",
    ] {
        assert_eq!(
            got.header(leaked),
            None,
            "{leaked} reached the anthropic target"
        );
    }

    // 4. Azure OpenAI: the responses path rewritten, the deployment as model, its key.
    let a =
        f.gw.post(
            "/v1/responses",
            &[
                ("authorization", f.token.as_str()),
                ("api-key", "client-key-never-forwarded"),
            ],
            &json!({"model": "codex", "input": "hi"}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let seen = f.azure.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/openai/v1/responses");
    assert_eq!(seen[0].json()["model"], "gpt-5-deployment");
    assert_eq!(seen[0].header("api-key"), Some(AZURE_KEY));
    assert_eq!(seen[0].header("authorization"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_aws_credentials_is_502_upstream_auth_error_and_nothing_is_sent() {
    let f = fixture(false).await;
    let a =
        f.gw.post("/v1/messages", &f.headers(), &messages("claude", false))
            .await;
    assert_eq!(a.status, 502, "{}", a.text());
    assert_eq!(a.json()["error"]["type"], "upstream_auth_error");
    assert_eq!(f.bedrock.count(), 0, "an unsigned request reached Bedrock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bedrock_upstream_on_a_non_aws_host_with_a_region_is_502_and_never_signed() {
    // No signHosts: 127.0.0.1 is not an AWS host, and the policy gives a region.
    let f = fixture_with(true, json!({})).await;
    let a =
        f.gw.post("/v1/messages", &f.headers(), &messages("claude", false))
            .await;
    assert_eq!(a.status, 502, "{}", a.text());
    assert_eq!(a.json()["error"]["type"], "bad_upstream");
    assert_eq!(
        f.bedrock.count(),
        0,
        "a signature left Envoy for a non-AWS host"
    );
    assert!(
        f.gw.envoy
            .logs()
            .contains("bedrock host 127.0.0.1 is neither an AWS host nor in signHosts"),
        "the error log names the host"
    );
    // With a target after it, the refusing host is left out of the failover order (#27
    // item 10): the call goes to the next target on the first attempt, not to a 502.
    let a =
        f.gw.post("/v1/messages", &f.headers(), &messages("claude-fo", false))
            .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["model"], ANTHROPIC_MODEL);
    assert_eq!(f.bedrock_down.count(), 0, "the refusing target was tried");
    assert_eq!(f.anthropic.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_skips_a_target_that_cannot_serve_the_call() {
    let f = fixture(true).await;
    // count_tokens: the first pick answers 503; Bedrock (next in the route) has no
    // count_tokens, so the call goes on to the other Anthropic target, not to a 502.
    let a =
        f.gw.post(
            "/v1/messages/count_tokens",
            &f.headers(),
            &json!({"model": "mixed", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["provider"], "anthropic");
    assert_eq!(f.anthropic_down.count(), 1, "the first pick was tried");
    assert_eq!(
        f.bedrock.count(),
        0,
        "Bedrock was never asked for count_tokens"
    );
    let seen = f.anthropic.seen();
    assert_eq!(
        seen.last().map(|s| s.path.as_str()),
        Some("/v1/messages/count_tokens")
    );
    assert_eq!(
        seen.last().map(|s| s.json()["model"].clone()),
        Some(json!(ANTHROPIC_MODEL))
    );
    // A messages call on the same alias still walks Bedrock after the first pick.
    let a =
        f.gw.post("/v1/messages", &f.headers(), &messages("mixed", false))
            .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(f.bedrock.count(), 1, "messages fail over to Bedrock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_after_a_translated_one_starts_from_the_clients_request() {
    let f = fixture(true).await;
    // Attempt 3 goes to a target with the first pick's model and kind, so the stage has
    // nothing of its own to write; but attempt 2 (Bedrock: translated, signed) changed the
    // header map every attempt shares, and attempt 3 must not inherit that.
    let a =
        f.gw.post(
            "/v1/messages",
            &f.headers(),
            &messages("same-model-again", false),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["provider"], "anthropic");
    assert_eq!(f.anthropic_down.count(), 1, "the first pick was tried");
    let down = f.bedrock_down.seen();
    assert_eq!(down.len(), 1, "Bedrock was tried second");
    assert_eq!(down[0].seen.path, BEDROCK_INVOKE);
    let seen = f.anthropic.seen();
    assert_eq!(seen.len(), 1);
    let got = &seen[0];
    assert_eq!(got.path, "/v1/messages");
    assert_eq!(got.json()["model"], "shared-model");
    assert_eq!(got.json().get("anthropic_version"), None);
    assert_eq!(got.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(got.header("content-type"), Some("application/json"));
    for leaked in [
        "authorization",
        "x-api-key",
        "x-amz-date",
        "x-amz-content-sha256",
        "x-amz-security-token",
    ] {
        assert_eq!(got.header(leaked), None, "{leaked} reached the last target");
    }
}
