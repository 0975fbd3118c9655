//! Google's side of a Vertex call, on loopback and speaking the real wire (feature
//! `google`; tokio and axum, unlike the rest of this crate):
//! - [`FakeGoogle`]: an OAuth token endpoint that verifies the RS256 assertion against the
//!   service account's public key (aud, iss, scope, iat/exp) and a metadata server that
//!   wants `Metadata-Flavor: Google`; both hand out numbered tokens.
//! - [`FakeVertex`]: accepts only the token the fake Google issued last; records path,
//!   `authorization` and body.
//! - [`write_key_file`], [`token_in`]: a service-account key file for the fake, and the
//!   token in an SDS file halo-credentials wrote.
//!
//! Shared by halo-credentials' tests and halo-e2e's gateway tests. The keys in
//! `data/google/` are test-only.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Value, json};

pub const SA_KEY_PEM: &str = include_str!("../data/google/test-sa-key.pem");
pub const SA_PUB_PEM: &str = include_str!("../data/google/test-sa-pub.pem");
pub const FOREIGN_KEY_PEM: &str = include_str!("../data/google/foreign-key.pem");
pub const CLIENT_EMAIL: &str = "halo-gateway@acme-vertex.iam.gserviceaccount.com";
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// Every token the fake hands out starts with this (so a log can be searched for it).
pub const TOKEN_PREFIX: &str = "ya29.fake-";

#[derive(Default)]
struct Inner {
    /// Successful answers so far (token n is `ya29.fake-<n>`, from 1).
    issued: AtomicUsize,
    /// Refused assertions (a bad signature, audience, issuer, scope or lifetime).
    refused: AtomicUsize,
    /// Answers made as failures while `failing`.
    failed: AtomicUsize,
    /// Token requests to answer before failing (0: never fail).
    fail_after: AtomicUsize,
    failing: AtomicBool,
    /// Token requests beyond `hold_after` wait until released.
    hold_after: AtomicUsize,
    gate: tokio::sync::Notify,
    released: AtomicBool,
    expires_in: AtomicUsize,
    /// When each token was issued (unix seconds, fractional).
    issued_at: Mutex<Vec<f64>>,
    metadata_flavors: Mutex<Vec<Option<String>>>,
    token_uri: Mutex<String>,
}

/// Google's token endpoint and metadata server.
#[derive(Clone)]
pub struct FakeGoogle {
    pub port: u16,
    inner: Arc<Inner>,
}

impl FakeGoogle {
    pub async fn start(expires_in: u64) -> FakeGoogle {
        let inner = Arc::new(Inner::default());
        inner
            .expires_in
            .store(expires_in as usize, Ordering::SeqCst);
        let app = Router::new()
            .route("/token", post(token))
            .route(
                "/computeMetadata/v1/instance/service-accounts/default/token",
                get(metadata),
            )
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake google");
        let port = listener.local_addr().expect("addr").port();
        *inner.token_uri.lock().unwrap() = format!("http://127.0.0.1:{port}/token");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeGoogle { port, inner }
    }

    pub fn token_uri(&self) -> String {
        self.inner.token_uri.lock().unwrap().clone()
    }

    pub fn metadata_base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn issued(&self) -> usize {
        self.inner.issued.load(Ordering::SeqCst)
    }

    pub fn refused(&self) -> usize {
        self.inner.refused.load(Ordering::SeqCst)
    }

    pub fn failed(&self) -> usize {
        self.inner.failed.load(Ordering::SeqCst)
    }

    /// Answer `n` more successful requests, then 503 until [`FakeGoogle::recover`].
    pub fn fail_after(&self, n: usize) {
        self.inner.fail_after.store(n, Ordering::SeqCst);
    }

    pub fn recover(&self) {
        self.inner.failing.store(false, Ordering::SeqCst);
        self.inner.fail_after.store(0, Ordering::SeqCst);
    }

    /// Hold every token request after the first `n` until [`FakeGoogle::release`].
    pub fn hold_after(&self, n: usize) {
        self.inner.hold_after.store(n, Ordering::SeqCst);
    }

    pub fn release(&self) {
        self.inner.released.store(true, Ordering::SeqCst);
        self.inner.gate.notify_waiters();
    }

    /// When token `n` (from 1) was issued, as unix seconds.
    pub fn issued_at(&self, n: usize) -> Option<f64> {
        self.inner.issued_at.lock().unwrap().get(n - 1).copied()
    }

    /// The Metadata-Flavor header of each metadata request.
    pub fn metadata_flavors(&self) -> Vec<Option<String>> {
        self.inner.metadata_flavors.lock().unwrap().clone()
    }
}

pub fn token_name(n: usize) -> String {
    format!("{TOKEN_PREFIX}{n}")
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn issue(inner: &Inner) -> Response {
    let n = inner.issued.fetch_add(1, Ordering::SeqCst) + 1;
    inner.issued_at.lock().unwrap().push(now_secs());
    let expires_in = inner.expires_in.load(Ordering::SeqCst);
    Json(json!({"access_token": token_name(n), "expires_in": expires_in, "token_type": "Bearer"}))
        .into_response()
}

#[derive(Deserialize)]
struct TokenForm {
    grant_type: String,
    assertion: String,
}

#[derive(Deserialize)]
struct AssertionClaims {
    scope: String,
    iat: u64,
    exp: u64,
}

fn refuse(inner: &Inner, why: &str) -> Response {
    inner.refused.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": "invalid_grant", "error_description": why})),
    )
        .into_response()
}

/// The token endpoint: verify the assertion as Google does, then hand out a token.
async fn token(State(inner): State<Arc<Inner>>, Form(form): Form<TokenForm>) -> Response {
    if form.grant_type != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
        return refuse(&inner, "unsupported grant_type");
    }
    let public = pem::parse(SA_PUB_PEM).expect("test public key");
    let key = DecodingKey::from_rsa_der(public.contents());
    let mut validation = Validation::new(Algorithm::RS256);
    let token_uri = inner.token_uri.lock().unwrap().clone();
    validation.set_audience(&[token_uri]);
    validation.set_issuer(&[CLIENT_EMAIL]);
    validation.set_required_spec_claims(&["exp", "iat", "aud", "iss"]);
    let claims = match jsonwebtoken::decode::<AssertionClaims>(&form.assertion, &key, &validation) {
        Ok(data) => data.claims,
        Err(_) => return refuse(&inner, "Invalid JWT Signature."),
    };
    if claims.scope != SCOPE {
        return refuse(&inner, "wrong scope");
    }
    let now = now_secs() as u64;
    if claims.exp <= claims.iat || claims.exp - claims.iat > 3600 || claims.iat > now + 60 {
        return refuse(&inner, "bad assertion lifetime");
    }
    let seen = inner.issued.load(Ordering::SeqCst) + inner.failed.load(Ordering::SeqCst);
    let hold_after = inner.hold_after.load(Ordering::SeqCst);
    if hold_after > 0 && seen >= hold_after {
        let notified = inner.gate.notified();
        if !inner.released.load(Ordering::SeqCst) {
            notified.await;
        }
    }
    let fail_after = inner.fail_after.load(Ordering::SeqCst);
    if fail_after > 0 && inner.issued.load(Ordering::SeqCst) >= fail_after {
        inner.failing.store(true, Ordering::SeqCst);
    }
    if inner.failing.load(Ordering::SeqCst) {
        inner.failed.fetch_add(1, Ordering::SeqCst);
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "temporarily_unavailable"})),
        )
            .into_response();
    }
    issue(&inner)
}

async fn metadata(State(inner): State<Arc<Inner>>, headers: HeaderMap) -> Response {
    let flavor = headers
        .get("metadata-flavor")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    inner.metadata_flavors.lock().unwrap().push(flavor.clone());
    if flavor.as_deref() != Some("Google") {
        return (
            StatusCode::FORBIDDEN,
            "Missing Metadata-Flavor:Google header.",
        )
            .into_response();
    }
    let mut response = issue(&inner);
    response
        .headers_mut()
        .insert("metadata-flavor", "Google".parse().unwrap());
    response
}

/// A service-account key file for the fake, signed by `key_pem`.
pub fn write_key_file(dir: &Path, token_uri: &str, key_pem: &str) -> PathBuf {
    let key = json!({
        "type": "service_account",
        "project_id": "acme-vertex",
        "private_key_id": "0123456789abcdef",
        "private_key": key_pem,
        "client_email": CLIENT_EMAIL,
        "client_id": "101",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
        "client_x509_cert_url": "https://www.googleapis.com/robot/v1/metadata/x509/halo-gateway",
        "universe_domain": "googleapis.com"
    });
    let path = dir.join("sa.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&key).unwrap()).unwrap();
    path
}

/// The token in an SDS file written by halo-credentials (`Bearer ` stripped), if any.
pub fn token_in(sds: &Path) -> Option<String> {
    let bytes = std::fs::read(sds).ok()?;
    let doc: Value = serde_json::from_slice(&bytes).ok()?;
    let value = doc["resources"][0]["generic_secret"]["secret"]["inline_string"].as_str()?;
    value.strip_prefix("Bearer ").map(str::to_string)
}

/// The (input, output) tokens every answer of [`FakeVertex`] reports.
pub const VERTEX_USAGE: (u64, u64) = (12, 3);

/// One request a fake Vertex received.
#[derive(Debug, Clone)]
pub struct VertexCall {
    pub path: String,
    pub authorization: Option<String>,
    pub body: Vec<u8>,
}

struct VertexState {
    google: FakeGoogle,
    calls: Mutex<Vec<VertexCall>>,
}

/// A Vertex endpoint that accepts only `Authorization: Bearer <the latest token the fake
/// Google issued>` (401 otherwise) and records what it saw.
#[derive(Clone)]
pub struct FakeVertex {
    pub port: u16,
    state: Arc<VertexState>,
}

impl FakeVertex {
    pub async fn start(google: &FakeGoogle) -> FakeVertex {
        let state = Arc::new(VertexState {
            google: google.clone(),
            calls: Mutex::new(Vec::new()),
        });
        let app = Router::new().fallback(vertex).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake vertex");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeVertex { port, state }
    }

    pub fn calls(&self) -> Vec<VertexCall> {
        self.state.calls.lock().unwrap().clone()
    }
}

async fn vertex(
    State(state): State<Arc<VertexState>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    state.calls.lock().unwrap().push(VertexCall {
        path: uri.path().to_string(),
        authorization: authorization.clone(),
        body: body.to_vec(),
    });
    let current = format!("Bearer {}", token_name(state.google.issued()));
    if authorization.as_deref() != Some(current.as_str()) {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": {"code": 401, "status": "UNAUTHENTICATED"}})),
        )
            .into_response();
    }
    Json(
        json!({"id": "msg_1", "type": "message", "role": "assistant",
        "content": [{"type": "text", "text": "hi"}],
        "usage": {"input_tokens": VERTEX_USAGE.0, "output_tokens": VERTEX_USAGE.1}}),
    )
    .into_response()
}
