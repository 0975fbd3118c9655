//! halo-e2e: the end-to-end harness. Everything real except the model providers and the
//! identity provider, which are small axum servers on loopback speaking the real wire and
//! signing with real keys:
//! - [`Issuer`]: an OIDC issuer's JWKS and ES256 tokens minted with a real P-256 key.
//! - [`Provider`]: a fake model provider (Anthropic `/v1/messages` incl. a gated SSE
//!   stream, OpenAI `/v1/responses`, Gemini `generateContent`, `GET /v1/models`) that
//!   records every request it receives.
//! - [`KillServer`]: halo-server's `GET /api/v1/gateway/killswitch`, serving envelopes
//!   signed with halo-policy's `killswitch::sign`.
//! - [`Gateway`]: a real Envoy from the standalone bootstrap (halo-envoy-config) with the
//!   built filter module, or in xDS mode ([`xds::gateway`]) from envoy/ads.yaml and
//!   halo-xds.
//! - [`shadow::Mirror`]: a recording mirror service (`POST /mirror`) that can be made
//!   slow, failing or gone.
//! - [`tls::TestCa`]: https fronts for the fakes, with certificates from a CA of the test.
//! - [`bedrock::FakeBedrock`]: a Bedrock runtime that recomputes every SigV4 signature with
//!   `aws-sigv4` and refuses mismatches.

// Test support, used only by tests: a step that cannot be done fails the test that
// asked for it, with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod bedrock;
pub mod shadow;
pub use halo_testkit::tls;
pub mod xds;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use halo_policy::Snapshot;
use halo_policy::killswitch::{self, KillPayload};
use halo_testkit::envoy::Envoy;
use halo_testkit::es256;
use serde_json::{Value, json};
use tokio::sync::Notify;

/// The audience tokens must carry.
pub const AUDIENCE: &str = "api://halos";
/// The gateway token the kill-list server expects.
pub const KILL_TOKEN: &str = "gw-token-7f3a";

async fn serve(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    // Each write goes out at once, as a provider's streaming server sends it: with
    // Nagle's algorithm a stream's second write waits for the first one's delayed ACK
    // (40 ms on Linux loopback).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    addr
}

/// A reqwest client builder. The workspace's reqwest brings rustls without a crypto
/// provider (halo-server installs ring at start); install the same before any client.
pub fn client_builder() -> reqwest::ClientBuilder {
    // Err means a provider is already installed: fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

/// Unix seconds now.
pub fn now_unix() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

// ---------------------------------------------------------------------------------------
// Issuer

/// Where the test issuer's discovery document says its keys are (as Okta's
/// `/oauth2/v1/keys`: not the `/.well-known/jwks.json` default).
pub const ISSUER_KEYS_PATH: &str = "/oauth2/v1/keys";

/// A local OIDC issuer: serves its discovery document and JWKS, and mints ES256 tokens.
pub struct Issuer {
    pub url: String,
    key: p256::ecdsa::SigningKey,
}

fn p256_key(seed: u8) -> p256::ecdsa::SigningKey {
    p256::ecdsa::SigningKey::from_slice(&[seed; 32]).expect("a valid P-256 scalar")
}

impl Issuer {
    /// The issuer's keys are served at `/.well-known/jwks.json` and at [`ISSUER_KEYS_PATH`],
    /// the `jwks_uri` of its OIDC discovery document (`/.well-known/openid-configuration`).
    pub async fn start() -> Issuer {
        let key = p256_key(0x11);
        let jwks = json!({"keys": [es256::jwk(&key, "k1")]});
        let url = Arc::new(std::sync::OnceLock::<String>::new());
        let keys = {
            let jwks = jwks.clone();
            axum::routing::get(move || {
                let jwks = jwks.clone();
                async move { axum::Json(jwks) }
            })
        };
        let discovery = {
            let url = Arc::clone(&url);
            axum::routing::get(move || {
                let u = url.get().cloned().unwrap_or_default();
                async move {
                    axum::Json(json!({
                        "issuer": u,
                        "jwks_uri": format!("{u}{ISSUER_KEYS_PATH}"),
                        "token_endpoint": format!("{u}/oauth2/v1/token"),
                    }))
                }
            })
        };
        let router = axum::Router::new()
            .route("/.well-known/jwks.json", keys.clone())
            .route(ISSUER_KEYS_PATH, keys)
            .route("/.well-known/openid-configuration", discovery);
        let addr = serve(router).await;
        let base = format!("http://{addr}");
        let _ = url.set(base.clone());
        Issuer { url: base, key }
    }

    /// Standard claims for `email`, valid for an hour, plus `extra`.
    pub fn claims(&self, email: &str, groups: &[&str]) -> Value {
        let now = now_unix();
        json!({
            "iss": self.url, "aud": AUDIENCE, "sub": format!("sub-{email}"),
            "email": email, "email_verified": true, "groups": groups,
            "iat": now, "exp": now + 3600,
        })
    }

    /// A valid token for `email` in `groups`.
    pub fn token(&self, email: &str, groups: &[&str]) -> String {
        self.mint(&self.claims(email, groups))
    }

    /// Sign arbitrary claims with the issuer's key.
    pub fn mint(&self, claims: &Value) -> String {
        es256::sign(&self.key, "k1", claims)
    }

    /// The same claims signed by a key the JWKS does not have (same kid).
    pub fn forge(&self, claims: &Value) -> String {
        es256::sign(&p256_key(0x22), "k1", claims)
    }
}

// ---------------------------------------------------------------------------------------
// Providers

/// One request a provider received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Lowercase names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

struct ProviderState {
    name: String,
    /// Keep what was received (off for benchmark sinks).
    record: bool,
    seen: Mutex<Vec<Seen>>,
    /// Releases the rest of a gated SSE stream.
    release: Notify,
    /// How it answers (recorded requests are kept whatever the answer).
    behaviour: Mutex<Behaviour>,
}

/// How a fake provider answers model calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// As the real wire (JSON, or SSE for `stream: true`).
    Serve,
    /// This status with an Anthropic-style error body (503 overloaded, 429 rate limit).
    Status(u16),
    /// 200 and the first SSE event, then, once released ([`Provider::release_stream`]),
    /// the connection is cut mid-body.
    HeadersThenReset,
    /// A model's answer as Anthropic sends it, with usage, whatever was asked: what the
    /// filter's response accounting reads on every call (the gateway bench's
    /// `HALO_BENCH_ANSWER`).
    Answer(AnswerShape),
}

/// The shape of a [`Behaviour::Answer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerShape {
    /// One JSON message of about 4 KB of text.
    Json4k,
    /// An SSE stream of this many events: `message_start` (input and cache usage),
    /// content deltas, `message_delta` (output usage) and `message_stop`; the first
    /// event alone, the others together a millisecond later.
    Sse(u16),
}

/// Anthropic's answer of `shape` for `model`, as [`Behaviour::Answer`] sends it.
fn anthropic_answer(shape: AnswerShape, model: &str, provider: String) -> Response {
    let usage = json!({"input_tokens": 1200, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 3000, "output_tokens": 850});
    match shape {
        AnswerShape::Json4k => {
            let text = "The parser now reports the line and column of every error. ".repeat(68);
            let body = json!({"id": "msg_bench", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "usage": usage});
            (
                [
                    ("x-provider", provider),
                    ("content-type", "application/json".to_string()),
                ],
                body.to_string(),
            )
                .into_response()
        }
        AnswerShape::Sse(events) => {
            let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
            let first = event(
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_bench", "type": "message", "role": "assistant", "model": model,
                    "content": [], "usage": {"input_tokens": 1200, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 3000, "output_tokens": 1}}}),
            );
            let mut rest = String::new();
            for _ in 0..events.saturating_sub(3) {
                rest.push_str(&event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "the line and column "}}),
                ));
            }
            rest.push_str(&event(
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 850}}),
            ));
            rest.push_str(&event("message_stop", json!({"type": "message_stop"})));
            // The first event on its own, the rest a millisecond later: the client's first
            // byte and its last are two moments, as with a model that streams.
            let parts = [(Duration::ZERO, first), (Duration::from_millis(1), rest)];
            let stream = futures_util::stream::iter(parts).then(|(pause, part)| async move {
                tokio::time::sleep(pause).await;
                Ok::<_, std::io::Error>(Bytes::from(part))
            });
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "text/event-stream")
                .header("x-provider", provider)
                .body(Body::from_stream(stream))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
        }
    }
}

/// A fake model provider on loopback.
#[derive(Clone)]
pub struct Provider {
    pub name: String,
    pub url: String,
    state: Arc<ProviderState>,
}

impl Provider {
    pub async fn start(name: &str) -> Provider {
        Provider::start_with(name, true).await
    }

    /// A provider that answers without keeping requests (for load).
    pub async fn sink(name: &str) -> Provider {
        Provider::start_with(name, false).await
    }

    async fn start_with(name: &str, record: bool) -> Provider {
        let state = Arc::new(ProviderState {
            record,
            name: name.to_string(),
            seen: Mutex::new(Vec::new()),
            release: Notify::new(),
            behaviour: Mutex::new(Behaviour::Serve),
        });
        let router = axum::Router::new()
            .fallback(provider_handler)
            // Real providers take whole long conversations: no 2 MB cap of axum's.
            .layer(axum::extract::DefaultBodyLimit::disable())
            .with_state(state.clone());
        let addr = serve(router).await;
        Provider {
            name: name.to_string(),
            url: format!("http://{addr}"),
            state,
        }
    }

    /// Everything received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().expect("seen lock").clone()
    }

    pub fn count(&self) -> usize {
        self.state.seen.lock().expect("seen lock").len()
    }

    /// A provider answering with `behaviour` from the start.
    pub async fn behaving(name: &str, behaviour: Behaviour) -> Provider {
        let p = Provider::start(name).await;
        *p.state.behaviour.lock().expect("behaviour lock") = behaviour;
        p
    }

    /// The same provider reached at `url` (an https front for it, say).
    pub fn at(&self, url: &str) -> Provider {
        Provider {
            url: url.to_string(),
            ..self.clone()
        }
    }

    /// Answer every request from now on with `behaviour`.
    pub fn set_behaviour(&self, behaviour: Behaviour) {
        *self.state.behaviour.lock().expect("behaviour lock") = behaviour;
    }

    /// Let a gated SSE stream send its last event.
    pub fn release_stream(&self) {
        self.state.release.notify_one();
    }
}

async fn provider_handler(
    State(state): State<Arc<ProviderState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !state.record {
        let behaviour = *state.behaviour.lock().expect("behaviour lock");
        if let Behaviour::Answer(shape) = behaviour {
            // Not parsed for its model: a sink serves load, where each request's parse
            // would be the load generator's own cost.
            return anthropic_answer(shape, "claude-haiku-4-5", state.name.clone());
        }
        return (
            [("x-provider", state.name.clone())],
            "{\"type\":\"message\"}",
        )
            .into_response();
    }
    let path = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_string(), |p| p.as_str().to_string());
    let seen = Seen {
        method: method.to_string(),
        path: path.clone(),
        headers: headers
            .iter()
            .map(|(n, v)| (n.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
        body: body.to_vec(),
    };
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state.seen.lock().expect("seen lock").push(seen);
    let provider = state.name.clone();
    let behaviour = *state.behaviour.lock().expect("behaviour lock");
    match behaviour {
        Behaviour::Serve => {}
        Behaviour::Answer(shape) => {
            let model = request["model"].as_str().unwrap_or("").to_string();
            return anthropic_answer(shape, &model, provider);
        }
        Behaviour::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let kind = if code == 429 {
                "rate_limit_error"
            } else {
                "overloaded_error"
            };
            let body = json!({"type": "error", "error": {"type": kind, "message": provider}});
            return (status, [("x-provider", provider.clone())], body.to_string()).into_response();
        }
        Behaviour::HeadersThenReset => {
            let first =
                Bytes::from_static(b"event: message_start\ndata: {\"type\":\"message_start\"}\n\n");
            // After the first event, wait for the test (which has the response headers by
            // then), and fail: hyper cuts the connection mid-body.
            let st = state.clone();
            let stream = futures_util::stream::unfold(0u8, move |step| {
                let st = st.clone();
                let first = first.clone();
                async move {
                    match step {
                        0 => Some((Ok::<_, std::io::Error>(first), 1)),
                        1 => {
                            st.release.notified().await;
                            Some((Err(std::io::Error::other("provider failed mid-stream")), 2))
                        }
                        _ => None,
                    }
                }
            });
            return Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "text/event-stream")
                .header("x-provider", provider)
                .body(Body::from_stream(stream))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
        }
    }
    let json_reply = |v: Value| {
        (
            [
                ("x-provider", provider.clone()),
                ("content-type", "application/json".to_string()),
            ],
            v.to_string(),
        )
            .into_response()
    };
    if method == Method::GET && uri.path() == "/v1/models" {
        return json_reply(json!({"data": [{"id": "claude-sonnet-4-5", "type": "model"}]}));
    }
    if uri.path() == "/v1/messages" && request["stream"] == json!(true) {
        let model = request["model"].as_str().unwrap_or("").to_string();
        let st = state.clone();
        let first = format!(
            "event: message_start\ndata: {}\n\n",
            json!({"type": "message_start", "message": {"model": model}})
        );
        let stream = futures_util::stream::unfold(0u8, move |step| {
            let st = st.clone();
            let first = first.clone();
            async move {
                match step {
                    0 => Some((Ok::<_, std::io::Error>(Bytes::from(first)), 1)),
                    1 => {
                        // The last event waits until the test has seen the first one.
                        st.release.notified().await;
                        Some((
                            Ok(Bytes::from_static(
                                b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
                            )),
                            2,
                        ))
                    }
                    _ => None,
                }
            }
        });
        return Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "text/event-stream")
            .header("x-provider", provider)
            .body(Body::from_stream(stream))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    let model = request["model"].clone();
    json_reply(json!({"provider": state.name, "path": path, "model": model, "type": "message"}))
}

/// A provider that accepts connections, reads what it is sent and never answers: what a
/// hung upstream looks like to Envoy (connected, no response headers).
pub struct Hang {
    pub url: String,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
}

impl Hang {
    pub async fn start() -> Hang {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut sink = tokio::io::sink();
                    let _ = tokio::io::copy(&mut conn, &mut sink).await;
                });
            }
        });
        Hang {
            url: format!("http://{addr}"),
            accepted,
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------------------------------
// Kill-list server

enum Serving {
    Envelope(Vec<u8>),
    Down,
}

/// halo-server's kill-list endpoint, signing with a real ed25519 key.
pub struct KillServer {
    pub url: String,
    pub key: ed25519_dalek::SigningKey,
    serving: Arc<Mutex<Serving>>,
    version: Mutex<u64>,
}

impl KillServer {
    pub async fn start() -> KillServer {
        let key = ed25519_dalek::SigningKey::from_bytes(&[0x33; 32]);
        let serving = Arc::new(Mutex::new(Serving::Down));
        let s = serving.clone();
        let router = axum::Router::new().route(
            "/api/v1/gateway/killswitch",
            axum::routing::get(move |headers: HeaderMap| {
                let s = s.clone();
                async move {
                    let auth = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    if auth != format!("Bearer {KILL_TOKEN}") {
                        return StatusCode::UNAUTHORIZED.into_response();
                    }
                    match &*s.lock().expect("serving lock") {
                        Serving::Envelope(e) => {
                            ([("content-type", "application/json")], e.clone()).into_response()
                        }
                        Serving::Down => StatusCode::SERVICE_UNAVAILABLE.into_response(),
                    }
                }
            }),
        );
        let addr = serve(router).await;
        let k = KillServer {
            url: format!("http://{addr}/api/v1/gateway/killswitch"),
            key,
            serving,
            version: Mutex::new(0),
        };
        k.serve_kills(&[], &[]);
        k
    }

    /// The public key as PEM (what the gateway is configured with).
    pub fn pubkey_pem(&self) -> String {
        halo_policy::keys::KeyPair::from_signing_key(&self.key)
            .expect("key pair")
            .public_pem
            .clone()
    }

    /// A signed envelope issued `offset_secs` from now.
    pub fn envelope(&self, experiments: &[&str], toggles: &[&str], offset_secs: i64) -> Vec<u8> {
        let mut v = self.version.lock().expect("version lock");
        *v += 1;
        let payload = KillPayload {
            version: *v,
            experiments: experiments.iter().map(|s| s.to_string()).collect(),
            toggles: toggles.iter().map(|s| s.to_string()).collect(),
            issued_at: time::OffsetDateTime::now_utc() + time::Duration::seconds(offset_secs),
        };
        killswitch::sign(&payload, &self.key).expect("sign kill list")
    }

    /// Serve a fresh list killing these experiments and toggles.
    pub fn serve_kills(&self, experiments: &[&str], toggles: &[&str]) {
        let e = self.envelope(experiments, toggles, 0);
        self.serve(e);
    }

    pub fn serve(&self, envelope: Vec<u8>) {
        *self.serving.lock().expect("serving lock") = Serving::Envelope(envelope);
    }

    /// Answer 503 from now on.
    pub fn go_down(&self) {
        *self.serving.lock().expect("serving lock") = Serving::Down;
    }
}

// ---------------------------------------------------------------------------------------
// The policy and the gateway

/// The providers behind the test policy, by upstream name.
pub struct Providers {
    pub a: Provider,
    pub b: Provider,
    pub openai: Provider,
    pub gemini: Provider,
}

impl Providers {
    pub async fn start() -> Providers {
        Providers {
            a: Provider::start("prov-a").await,
            b: Provider::start("prov-b").await,
            openai: Provider::start("openai").await,
            gemini: Provider::start("gemini").await,
        }
    }

    pub fn all(&self) -> [&Provider; 4] {
        [&self.a, &self.b, &self.openai, &self.gemini]
    }

    pub fn total(&self) -> usize {
        self.all().iter().map(|p| p.count()).sum()
    }
}

/// The test policy as a compiled snapshot: rings canary (alice, group canary-group) and
/// general (default, pinned release); aliases sonnet, opus, haiku, weighted (50/50
/// prov-a/prov-b), gpt (openai), gemini-pro (gemini); toggle haiku-b (group ds routes haiku
/// to prov-b); canaries sonnet-canary and opus-canary (50/50, each on its own alias).
pub fn test_snapshot(issuer: &str, p: &Providers) -> Snapshot {
    let t = |up: &str, model: &str| json!({"upstream": up, "model": model});
    let doc = json!({
        "schema": 1,
        "org": "test-org",
        "identity": {"issuer": issuer, "audience": AUDIENCE, "claims": {"user": "email", "groups": "groups"}},
        "protocols": {"claude-code": "anthropic-messages", "codex": "openai-responses", "gemini-cli": "gemini"},
        "upstreams": {
            "prov-a": {"url": p.a.url, "kind": "anthropic"},
            "prov-b": {"url": p.b.url, "kind": "anthropic"},
            "openai": {"url": p.openai.url, "kind": "openai"},
            "gemini": {"url": p.gemini.url, "kind": "gemini"},
        },
        "models": {
            "sonnet": [t("prov-a", "claude-sonnet-4-5-20250929")],
            "opus": [t("prov-a", "claude-opus-4-1")],
            "haiku": [t("prov-a", "claude-haiku-4-5")],
            "weighted": [
                {"upstream": "prov-a", "model": "model-a", "weight": 50},
                {"upstream": "prov-b", "model": "model-b", "weight": 50},
            ],
            "gpt": [t("openai", "gpt-5-codex")],
            "gemini-pro": [t("gemini", "gemini-2.5-pro")],
        },
        "rings": [
            {"name": "canary", "order": 0, "membership": {"users": ["alice@acme.test"], "groups": ["canary-group"]}},
            {"name": "general", "order": 9, "release": "sha256:0123abcd", "membership": {"default": true}},
        ],
        "experiments": [
            {"name": "opus-canary", "type": "canary", "axis": "traffic", "status": "running",
             "rings": ["canary", "general"], "salt": "opus-canary-v1",
             "variants": [{"name": "control", "weight": 50},
                          {"name": "canary", "weight": 50, "routes": {"opus": [t("prov-b", "opus-canary-model")]}}]},
            {"name": "sonnet-canary", "type": "canary", "axis": "traffic", "status": "running",
             "rings": ["canary", "general"], "salt": "sonnet-canary-v1",
             "variants": [{"name": "control", "weight": 50},
                          {"name": "canary", "weight": 50, "routes": {"sonnet": [t("prov-b", "sonnet-canary-model")]}}]},
        ],
        "toggles": [
            {"name": "haiku-b", "default": false, "rules": [{"groups": ["ds"], "effect": "on"}],
             "routes": {"haiku": [t("prov-b", "haiku-b-model")]}},
        ],
    });
    Snapshot::from_bytes(doc.to_string().as_bytes()).expect("test snapshot decodes")
}

/// A running gateway: Envoy with the halo filter in front of the fakes.
pub struct Gateway {
    pub envoy: Envoy,
    pub port: u16,
    pub base: String,
    pub snapshot: Snapshot,
    pub client: reqwest::Client,
}

/// How to start a gateway.
pub struct GatewayOptions {
    pub settings: Value,
    pub killswitch_url: Option<String>,
    pub concurrency: u32,
    /// The filter module Envoy loads; default the workspace build
    /// ([`halo_testkit::filter_module`]).
    pub wasm_path: Option<std::path::PathBuf>,
    /// Make jwt_authn write the verified payload under this key instead of the
    /// bootstrap's (as Istio's `payload` or Envoy Gateway's issuer key do).
    pub jwt_payload_key: Option<String>,
    /// Envoy's environment changes: `(name, Some(value))` sets, `(name, None)` removes
    /// (the AWS credential chain, key variables). Non-empty: one worker.
    pub env: Vec<(String, Option<String>)>,
    /// The CA bundle upstream certificates are verified against; default the system's.
    pub upstream_ca_file: Option<std::path::PathBuf>,
    /// The JWKS URL (default: the issuer's `/.well-known/jwks.json`).
    pub jwks_uri: Option<String>,
    /// Run Envoy (one worker) under callgrind, to count instructions per request.
    pub callgrind: bool,
    /// Export evidence to this receiver (halo-server's gateway receiver and its token).
    pub evidence: Option<halo_envoy_config::evidence::Export>,
    /// Edge mode: the gateway settings' `nextHop`.
    pub next_hop: Option<String>,
    /// The gateway settings' `defaultUpstream`.
    pub default_upstream: Option<String>,
    /// The target breakers' settings (the gateway setting `breaker`; default 5 / 30 s).
    pub breaker: halo_contract::attempts::Breaker,
    /// The mirror service shadow jobs go to (the gateway settings' `shadowUrl`; the token
    /// and maxBytes are `settings.shadow`'s).
    pub shadow_url: Option<String>,
    /// The budget service Envoy's ratelimit filter asks (the gateway settings' `budgets`:
    /// halo-server's `--budget-listen` and its token).
    pub budgets: Option<halo_envoy_config::evidence::Export>,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        GatewayOptions {
            settings: json!({}),
            killswitch_url: None,
            concurrency: 1,
            wasm_path: None,
            jwt_payload_key: None,
            env: Vec::new(),
            upstream_ca_file: None,
            jwks_uri: None,
            callgrind: false,
            evidence: None,
            next_hop: None,
            default_upstream: None,
            breaker: halo_contract::attempts::Breaker::default(),
            shadow_url: None,
            budgets: None,
        }
    }
}

/// Every jwt_authn provider's `payload_in_metadata` set to `key`.
fn set_payload_key(v: &mut Value, key: &str) {
    match v {
        Value::Object(m) => {
            if let Some(p) = m.get_mut("payload_in_metadata") {
                *p = json!(key);
            }
            m.values_mut().for_each(|c| set_payload_key(c, key));
        }
        Value::Array(a) => a.iter_mut().for_each(|c| set_payload_key(c, key)),
        _ => {}
    }
}

impl Gateway {
    /// Render the standalone bootstrap for `snapshot` and start Envoy on it.
    pub fn start(snapshot: Snapshot, opts: GatewayOptions) -> Gateway {
        let port = halo_testkit::free_port();
        let admin = halo_testkit::free_port();
        let boot = halo_envoy_config::bootstrap::Standalone {
            gateway: halo_envoy_config::plan::GatewaySettings {
                listen_address: "127.0.0.1".into(),
                listen_port: port,
                wasm_path: opts
                    .wasm_path
                    .unwrap_or_else(halo_testkit::filter_module)
                    .display()
                    .to_string(),
                jwks_uri: opts.jwks_uri,
                killswitch_url: opts.killswitch_url,
                evidence: opts.evidence,
                next_hop: opts.next_hop,
                default_upstream: opts.default_upstream,
                upstream_ca_file: opts.upstream_ca_file.map_or_else(
                    || halo_envoy_config::tls::DEFAULT_UPSTREAM_CA_FILE.to_string(),
                    |f| f.display().to_string(),
                ),
                breaker: opts.breaker,
                shadow_url: opts.shadow_url,
                budgets: opts.budgets,
                ..halo_envoy_config::plan::GatewaySettings::default()
            }
            .with_filter_settings(opts.settings)
            .expect("gateway settings"),
            admin_address: "127.0.0.1".into(),
            admin_port: admin,
        };
        let mut doc =
            halo_envoy_config::bootstrap::standalone(&snapshot, &boot).expect("render bootstrap");
        if let Some(key) = &opts.jwt_payload_key {
            set_payload_key(&mut doc, key);
        }
        let yaml = halo_envoy_config::yaml::to_yaml(&doc);
        if let Some(path) = std::env::var_os("HALO_E2E_DUMP") {
            let _ = std::fs::write(path, &yaml);
        }
        let env: Vec<(&str, Option<&str>)> = opts
            .env
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_deref()))
            .collect();
        let envoy = tokio::task::block_in_place(|| {
            if opts.callgrind {
                Envoy::start_under_callgrind(&yaml, admin)
            } else if env.is_empty() {
                Envoy::start_with(&yaml, admin, opts.concurrency)
            } else {
                Envoy::start_with_env(&yaml, admin, &env)
            }
        });
        if std::env::var_os("HALO_E2E_DEBUG").is_some() {
            let _ = halo_testkit::http::request(admin, "POST", "/logging?level=debug", &[], b"");
        }
        Gateway {
            envoy,
            port,
            base: format!("http://127.0.0.1:{port}"),
            snapshot,
            client: client_builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("http client"),
        }
    }

    /// POST a JSON body to `path` with `headers`.
    pub async fn post(&self, path: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
        self.send(
            reqwest::Method::POST,
            path,
            headers,
            body.to_string().into_bytes(),
        )
        .await
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Answer {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        let resp = match req.body(body).send().await {
            Ok(r) => r,
            Err(e) => panic!(
                "request through Envoy failed: {e}\nEnvoy log:\n{}",
                self.envoy.logs()
            ),
        };
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let body = resp.bytes().await.expect("response body").to_vec();
        Answer {
            status,
            headers,
            body,
        }
    }

    /// The value of a counter whose Prometheus text line starts with `prefix` (name and
    /// labels), summed over matching lines.
    pub fn prometheus_sum(&self, prefix: &str) -> u64 {
        self.envoy
            .prometheus()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// The filter's series in `/stats/prometheus` (`halo_requests{halo_ring="general",...}`,
    /// the same in both builds) with their values.
    pub fn filter_series(&self) -> std::collections::BTreeMap<String, u64> {
        self.envoy
            .prometheus()
            .lines()
            .filter(|l| l.starts_with("halo_"))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_string(), value.parse().ok()?))
            })
            .collect()
    }

    /// The filter's counter `name` (dotted, as defined by the filter) under either
    /// build's namespace (`wasmcustom.<name>`, `halocustom.<name>`), summed.
    pub fn counter(&self, name: &str) -> u64 {
        let name = name.replace('.', "\\.");
        self.envoy.stat_sum(&format!("(^|\\.){name}$"))
    }
}

/// POST `body` to `/v1/messages` of the gateway on `port` over a raw connection, announced
/// (Content-Length) or chunked, writing from a thread while the answer is read, so an
/// answer sent before the body is complete is seen (an oversize body's 413). Returns
/// (status, content-type, body).
pub fn raw_post(port: u16, auth: &str, body: Vec<u8>, chunked: bool) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let framing = if chunked {
        "Transfer-Encoding: chunked".to_string()
    } else {
        format!("Content-Length: {}", body.len())
    };
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: gw\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nConnection: close\r\n{framing}\r\n\r\n"
    );
    let mut w = s.try_clone().expect("clone stream");
    let writer = std::thread::spawn(move || {
        w.write_all(head.as_bytes())?;
        if chunked {
            for piece in body.chunks(64 * 1024) {
                w.write_all(format!("{:x}\r\n", piece.len()).as_bytes())?;
                w.write_all(piece)?;
                w.write_all(b"\r\n")?;
            }
            w.write_all(b"0\r\n\r\n")
        } else {
            w.write_all(&body)
        }
    });
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    // The gateway may close before the rest of the body is written: that is the point.
    let _ = writer.join();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    (status, content_type, body.to_string())
}

/// A response as the client saw it.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `("authorization", "Bearer <token>")` as an owned pair.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}
