//! The HTTP API (axum): routes, authentication per route, and JSON errors.
//!
//! Every error is `{"error": "<code>", "message": "<what is wrong>"}` with a 4xx or 5xx
//! status; nothing is written before a request is fully validated, and every write is
//! durable before a 2xx. Authentication by route:
//! - admin (OIDC JWT + adminGroups): kill/unkill, kill status, enrollment tokens, devices;
//! - gateway token: GET /api/v1/gateway/killswitch;
//! - device token: fleet ring, fleet kill list, fleet report (or the fleet token);
//! - enrollment token (one-time, in the body): POST /api/v1/enroll;
//! - none: capabilities and the OpenAPI document.
//!
//! Shared secrets go through the per-address [`Throttle`].

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{
    ConnectInfo, DefaultBodyLimit, FromRequest, MatchedPath, Path, Query, Request, State,
};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use halo_policy::decide::{Subject, resolve_ring};
use halo_xds::{PolicySource, Served};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use crate::auth::{Admin, AuthError, OidcVerifier, bearer};
use crate::fleet::{Device, Fleet, FleetError};
use crate::listener::Peer;
use crate::metrics::{Gauges, Metrics};
use crate::throttle::{Gate, Throttle};
use crate::token::TokenDigest;
use halo_killswitch::{Action, Change, KillRecord, KillSwitch, Target, audit_kill, now_rfc3339};
use halo_store::{Log, LogStore, StoreError};

/// The OpenAPI document, checked in beside the crate and kept in sync by a test.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// Longest accepted reason, in characters.
pub const MAX_REASON: usize = 1000;

/// Every (method, path template) the API serves; the OpenAPI test checks the document
/// lists exactly these.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/api/v1/capabilities"),
    ("GET", "/api/v1/openapi.json"),
    ("POST", "/api/v1/experiments/{name}/kill"),
    ("POST", "/api/v1/experiments/{name}/unkill"),
    ("POST", "/api/v1/toggles/{name}/kill"),
    ("POST", "/api/v1/toggles/{name}/unkill"),
    ("GET", "/api/v1/killswitch"),
    ("GET", "/api/v1/gateway/killswitch"),
    ("GET", "/api/v1/fleet/killswitch"),
    ("POST", "/api/v1/enrollment-tokens"),
    ("POST", "/api/v1/enroll"),
    ("GET", "/api/v1/fleet/ring"),
    ("POST", "/api/v1/fleet/report"),
    ("GET", "/api/v1/devices"),
    ("POST", "/api/v1/devices/{id}/revoke"),
    ("GET", "/api/v1/evidence/samples"),
    ("GET", "/api/v1/controller/status"),
    ("GET", "/api/v1/budgets/status"),
    ("GET", "/api/v1/rollouts/{name}"),
];

/// Everything the handlers share.
pub struct AppState {
    /// The policy served now: the policy source publishes every accepted edit here.
    pub policy: watch::Receiver<Arc<Served>>,
    pub store: Arc<dyn LogStore>,
    pub killswitch: Option<Arc<KillSwitch>>,
    pub gateway_token: Option<TokenDigest>,
    pub fleet_token: Option<TokenDigest>,
    pub fleet: Fleet,
    pub oidc: OidcVerifier,
    pub throttle: Throttle,
    pub metrics: Metrics,
    pub max_body_bytes: usize,
    /// The evidence store, when the receivers run.
    pub evidence: Option<Arc<crate::evidence::Evidence>>,
    /// The store the samples API reads: the receivers', else the mirror service's (a
    /// halo-server that only mirrors still answers `halo evidence query` for its
    /// shadow variants).
    pub samples: Option<Arc<dyn halo_evidence::Store>>,
    /// The budget service, with `--budget-listen`: its counters.
    pub budget: Option<Arc<crate::budget::Budgets>>,
    /// The in-process controller, with `--controller`.
    pub controller: Option<Arc<halo_controller::controller::Controller>>,
    /// The mirror service's counts, with `--shadow-listen`.
    pub shadow: Option<Arc<crate::shadow::ShadowMetrics>>,
}

pub(crate) type Shared = Arc<AppState>;

impl AppState {
    /// The policy served at this moment (a handler reads it once and keeps it).
    pub fn policy(&self) -> Arc<Served> {
        Arc::clone(&self.policy.borrow())
    }
}

/// A JSON error response.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    extra: Option<serde_json::Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            extra: None,
        }
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn code(&self) -> &'static str {
        self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    fn with(mut self, extra: serde_json::Value) -> ApiError {
        self.extra = Some(extra);
        self
    }

    fn internal(e: impl std::fmt::Display) -> ApiError {
        tracing::error!(error = %e, "request failed");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": self.code, "message": self.message});
        if let (Some(serde_json::Value::Object(extra)), Some(obj)) =
            (self.extra, body.as_object_mut())
        {
            obj.extend(extra);
        }
        let mut resp = (self.status, Json(body)).into_response();
        match self.status {
            StatusCode::UNAUTHORIZED => {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"halos\""),
                );
            }
            StatusCode::TOO_MANY_REQUESTS => {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("900"));
            }
            _ => {}
        }
        resp
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> ApiError {
        match e {
            AuthError::Unauthenticated(m) => {
                ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", m)
            }
            AuthError::Forbidden(m) => ApiError::new(StatusCode::FORBIDDEN, "forbidden", m),
            AuthError::Unavailable(m) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "identity_unavailable", m)
            }
        }
    }
}

/// `axum::Json` with rejections turned into JSON errors that name the problem.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    Json<T>: FromRequest<S, Rejection = JsonRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    let status = rejection.status();
    let code = match &rejection {
        JsonRejection::JsonDataError(_) => "invalid_body",
        JsonRejection::JsonSyntaxError(_) => "malformed_json",
        JsonRejection::MissingJsonContentType(_) => "unsupported_media_type",
        _ if status == StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        _ => "bad_body",
    };
    ApiError::new(status, code, rejection.body_text())
}

/// Build the API router.
pub fn router(state: Shared) -> Router {
    let limit = state.max_body_bytes;
    Router::new()
        .route("/api/v1/capabilities", get(capabilities))
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/experiments/{name}/kill", post(kill_experiment))
        .route("/api/v1/experiments/{name}/unkill", post(unkill_experiment))
        .route("/api/v1/toggles/{name}/kill", post(kill_toggle))
        .route("/api/v1/toggles/{name}/unkill", post(unkill_toggle))
        .route("/api/v1/killswitch", get(killswitch_status))
        .route("/api/v1/gateway/killswitch", get(gateway_killswitch))
        .route("/api/v1/fleet/killswitch", get(fleet_killswitch))
        .route("/api/v1/enrollment-tokens", post(mint_enrollment))
        .route("/api/v1/enroll", post(enroll))
        .route("/api/v1/fleet/ring", get(fleet_ring))
        .route("/api/v1/fleet/report", post(fleet_report))
        .route("/api/v1/devices", get(list_devices))
        .route("/api/v1/devices/{id}/revoke", post(revoke_device))
        .route("/api/v1/evidence/samples", get(crate::evidence::samples))
        .route("/api/v1/controller/status", get(controller_status))
        .route("/api/v1/budgets/status", get(crate::budget::status))
        .route("/api/v1/rollouts/{name}", get(rollout_status))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn(json_errors))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

/// The admin listener's router: /healthz, /metrics and /xds/status.
pub fn admin_router(
    state: Shared,
    source: Arc<PolicySource>,
    xds: Option<Arc<crate::xds::XdsHost>>,
) -> Router {
    // /metrics: the server's own, the policy source's, then (with --xds-listen) the ADS
    // server's.
    let xds_metrics = xds.clone();
    let metrics = get(move |s: State<Shared>| {
        let xds = xds_metrics.clone();
        let source = Arc::clone(&source);
        async move { metrics(s, &source, xds.as_deref()).await }
    });
    // The xDS status: the policy served, the last refused edit, each Envoy's versions.
    let xds_status = get(move || {
        let xds = xds.clone();
        async move {
            match xds {
                Some(x) => Json(x.status()).into_response(),
                None => ApiError::new(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "xDS is off (--xds-listen)",
                )
                .into_response(),
            }
        }
    });
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/metrics", metrics)
        .route("/xds/status", xds_status)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(json_errors))
        .with_state(state)
}

async fn count_requests(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let resp = next.run(req).await;
    state
        .metrics
        .request(method.as_str(), &route, resp.status().as_u16());
    resp
}

/// The error code of an HTTP status, for refusals made outside the handlers (axum's
/// extractor rejections, hyper's own answers in `listener`).
pub fn status_code_name(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "bad_request",
        401 => "authentication_error",
        403 => "forbidden",
        404 => "not_found",
        405 => "method_not_allowed",
        408 => "request_timeout",
        413 => "body_too_large",
        414 => "uri_too_long",
        415 => "unsupported_media_type",
        422 => "invalid_body",
        429 => "too_many_attempts",
        431 => "headers_too_large",
        503 => "unavailable",
        s if s >= 500 => "internal",
        _ => "bad_request",
    }
}

/// Every error answer is JSON: one that a handler did not shape (an extractor's plain
/// text rejection, say) is rewritten into `{"error", "message"}`, its text the message.
async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    // Rejection texts are short; anything longer is cut, not buffered.
    let text = axum::body::to_bytes(body, 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("refused").to_string()
    } else {
        text
    };
    let mut out = ApiError::new(status, status_code_name(status), message).into_response();
    // The rejection's other headers (405's `allow`) stay; the JSON answer's own win.
    let own: Vec<_> = out.headers().keys().cloned().collect();
    for (name, value) in &parts.headers {
        if !own.contains(name) && name != header::CONTENT_LENGTH {
            out.headers_mut().append(name.clone(), value.clone());
        }
    }
    out
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; see /api/v1/openapi.json",
    )
}

async fn method_not_allowed(method: Method) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed on this endpoint; see /api/v1/openapi.json"),
    )
}

async fn metrics(
    State(state): State<Shared>,
    source: &PolicySource,
    xds: Option<&crate::xds::XdsHost>,
) -> Response {
    let mut g = Gauges {
        blocked_addresses: state.throttle.blocked_count(),
        kill_switch_enabled: state.killswitch.is_some(),
        ..Gauges::default()
    };
    if let Some(ks) = &state.killswitch {
        let s = ks.state().await;
        g.killed_experiments = s.experiments.len();
        g.killed_toggles = s.toggles.len();
    }
    let mut text = state.metrics.render(&g);
    text.push_str(&source.status().render_prometheus());
    if let Some(x) = xds {
        text.push_str(&x.render_prometheus());
    }
    if let Some(e) = &state.evidence {
        text.push_str(&e.metrics.render());
    }
    if let Some(b) = &state.budget {
        text.push_str(&b.metrics.render());
    }
    if let Some(c) = &state.controller {
        text.push_str(&crate::controller::render_prometheus(c));
    }
    if let Some(m) = &state.shadow {
        text.push_str(&m.render());
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn capabilities(State(state): State<Shared>) -> Json<serde_json::Value> {
    let policy = state.policy();
    Json(json!({
        "killSwitch": state.killswitch.is_some(),
        "enrollment": true,
        "fleetToken": state.fleet_token.is_some(),
        "adminAuth": policy.org.root.identity.is_some(),
        "storage": state.store.describe(),
        "policy": {"org": policy.org.root.org, "version": policy.version},
    }))
}

// ---------------------------------------------------------------------------
// Authentication helpers
// ---------------------------------------------------------------------------

fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

pub(crate) async fn admin(state: &AppState, headers: &HeaderMap) -> Result<Admin, ApiError> {
    let policy = state.policy();
    state
        .oidc
        .verify_admin(policy.org.root.identity.as_ref(), authorization(headers))
        .await
        .map_err(ApiError::from)
}

fn blocked() -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_attempts",
        "too many failed token attempts from this address; try again later",
    )
}

/// A shared secret the API checks: what it is called and how it is presented, for the
/// metrics label and the refusal's message.
#[derive(Debug, Clone, Copy)]
enum Secret {
    Gateway,
    Device,
    FleetOrDevice,
    Enrollment,
}

impl Secret {
    fn kind(self) -> &'static str {
        match self {
            Secret::Gateway => "gateway token",
            Secret::Device => "device token",
            Secret::FleetOrDevice => "fleet or device token",
            Secret::Enrollment => "enrollment token",
        }
    }

    fn refusal(self) -> String {
        match self {
            // Sent in the body, and good once: say so rather than name a header.
            Secret::Enrollment => format!(
                "{}: each one enrolls a single device; an admin mints a new one (POST /api/v1/enrollment-tokens), sent in the body as {{\"enrollmentToken\": \"<token>\"}}",
                FleetError::BadEnrollmentToken
            ),
            other => format!(
                "a valid {} is required as `Authorization: Bearer <token>`",
                other.kind()
            ),
        }
    }
}

/// Check a shared secret under the throttle: a blocked address gets 429 without the
/// secret being looked at; otherwise wait the address's delay, then `check`.
async fn with_throttle<T, F, Fut>(
    state: &AppState,
    ip: IpAddr,
    secret: Secret,
    check: F,
) -> Result<T, ApiError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let delay = match state.throttle.gate(ip) {
        Gate::Blocked => return Err(blocked()),
        Gate::Check(d) => d,
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    match check().await {
        Some(v) => {
            state.throttle.success(ip);
            Ok(v)
        }
        None => {
            state.throttle.failure(ip);
            state.metrics.secret_failure(secret.kind());
            Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                secret.refusal(),
            ))
        }
    }
}

async fn device_auth(
    state: &AppState,
    ip: IpAddr,
    headers: &HeaderMap,
) -> Result<Device, ApiError> {
    let token = bearer(authorization(headers)).map(str::to_string);
    with_throttle(state, ip, Secret::Device, || async {
        match token {
            Some(t) => state.fleet.device_for_token(&t).await,
            None => None,
        }
    })
    .await
}

fn kill_switch(state: &AppState) -> Result<&Arc<KillSwitch>, ApiError> {
    state.killswitch.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "kill_switch_disabled",
            "the kill switch is not enabled on this server: start halo-server with --killswitch-key-file, --gateway-token-file and --data-dir",
        )
    })
}

fn audit(store: &dyn LogStore, record: serde_json::Value) -> Result<(), StoreError> {
    store.append(Log::Audit, &record)
}

// ---------------------------------------------------------------------------
// Kill switch
// ---------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReasonBody {
    reason: String,
}

async fn kill_experiment(
    s: State<Shared>,
    h: HeaderMap,
    n: Path<String>,
    b: Result<ApiJson<ReasonBody>, ApiError>,
) -> Result<Response, ApiError> {
    change(s, h, n, b, Action::Kill, Target::Experiment).await
}
async fn unkill_experiment(
    s: State<Shared>,
    h: HeaderMap,
    n: Path<String>,
    b: Result<ApiJson<ReasonBody>, ApiError>,
) -> Result<Response, ApiError> {
    change(s, h, n, b, Action::Unkill, Target::Experiment).await
}
async fn kill_toggle(
    s: State<Shared>,
    h: HeaderMap,
    n: Path<String>,
    b: Result<ApiJson<ReasonBody>, ApiError>,
) -> Result<Response, ApiError> {
    change(s, h, n, b, Action::Kill, Target::Toggle).await
}
async fn unkill_toggle(
    s: State<Shared>,
    h: HeaderMap,
    n: Path<String>,
    b: Result<ApiJson<ReasonBody>, ApiError>,
) -> Result<Response, ApiError> {
    change(s, h, n, b, Action::Unkill, Target::Toggle).await
}

async fn change(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Result<ApiJson<ReasonBody>, ApiError>,
    action: Action,
    target: Target,
) -> Result<Response, ApiError> {
    let admin = admin(&state, &headers).await?;
    let ApiJson(body) = body?;
    let done = kill_or_unkill(&state, &admin, action, target, &name, &body.reason).await?;
    Ok(Json(json!({
        "target": target.as_str(),
        "name": name,
        "killed": done.killed,
        "version": done.version,
    }))
    .into_response())
}

/// A kill or unkill that was applied and audited.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Changed {
    pub killed: bool,
    pub version: u64,
}

/// Kill or unkill `name` for `admin` with `reason` (ADR-0009: a reason is required, the
/// name must be in the served policy, the audit is fail-closed for unkills). The API and
/// the console both call this.
pub(crate) async fn kill_or_unkill(
    state: &AppState,
    admin: &Admin,
    action: Action,
    target: Target,
    name: &str,
    reason: &str,
) -> Result<Changed, ApiError> {
    let ks = kill_switch(state)?;
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "reason_required",
            "a non-blank reason is required: say why, it goes into the kill log and the audit log",
        ));
    }
    if reason.chars().count() > MAX_REASON {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "reason_too_long",
            format!("the reason is longer than {MAX_REASON} characters"),
        ));
    }
    let policy = state.policy();
    let in_policy = match target {
        Target::Experiment => policy.org.experiments.contains_key(name),
        Target::Toggle => policy.org.toggles.contains_key(name),
    };
    // An unkill may name something the policy has since dropped, if it is still killed.
    let known = in_policy || (action == Action::Unkill && ks.state().await.is_killed(target, name));
    if !known {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_name",
            format!(
                "the served policy has no {} named {name:?}",
                target.as_str()
            ),
        )
        .with(json!({"target": target.as_str(), "name": name})));
    }
    let store = Arc::clone(&state.store);
    let actor = admin.user.clone();
    let audit_record = |rec: &KillRecord| audit_kill(store.as_ref(), rec);
    let outcome = ks
        .change(&actor, action, target, name, reason, audit_record)
        .await
        .map_err(ApiError::internal)?;
    let action_str = match action {
        Action::Kill => "kill",
        Action::Unkill => "unkill",
    };
    state.metrics.kill_change(action_str, target.as_str());
    let killed_now = ks.state().await.is_killed(target, name);
    match outcome {
        Change::Done { version } => Ok(Changed {
            killed: killed_now,
            version,
        }),
        Change::AuditFailed {
            version,
            reverted,
            audit_error,
        } => {
            tracing::error!(error = %audit_error, action = action_str, "audit append failed");
            let message = match (action, reverted) {
                (Action::Kill, _) => "the kill is applied (fail safe) but the audit log could not be written".to_string(),
                (Action::Unkill, true) => "the unkill was reverted because the audit log could not be written".to_string(),
                (Action::Unkill, false) => "the audit log could not be written and reverting the unkill failed too; check the data dir".to_string(),
            };
            Err(
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "audit_failed", message).with(
                    json!({
                        "target": target.as_str(),
                        "name": name,
                        "killed": killed_now,
                        "version": version,
                    }),
                ),
            )
        }
    }
}

async fn killswitch_status(
    State(state): State<Shared>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    admin(&state, &headers).await?;
    let ks = kill_switch(&state)?;
    let s = ks.state().await;
    Ok(Json(json!({
        "enabled": true,
        "version": s.version,
        "experiments": s.experiments.values().collect::<Vec<_>>(),
        "toggles": s.toggles.values().collect::<Vec<_>>(),
    })))
}

async fn signed_list(ks: &KillSwitch) -> Result<Response, ApiError> {
    let signed = ks.sign_now().await.map_err(ApiError::internal)?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        signed.envelope.to_vec(),
    )
        .into_response())
}

async fn gateway_killswitch(
    State(state): State<Shared>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let ks = kill_switch(&state)?;
    let token = bearer(authorization(&headers)).map(str::to_string);
    let expected = state.gateway_token.clone();
    with_throttle(&state, peer.ip(), Secret::Gateway, || async {
        match (token, expected) {
            (Some(t), Some(d)) if d.matches(&t) => Some(()),
            _ => None,
        }
    })
    .await?;
    signed_list(ks).await
}

async fn fleet_killswitch(
    State(state): State<Shared>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let ks = kill_switch(&state)?;
    device_auth(&state, peer.ip(), &headers).await?;
    signed_list(ks).await
}

// ---------------------------------------------------------------------------
// Enrollment and devices
// ---------------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MintBody {
    /// Bind the device to this user: its ring requests may only ask for them.
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    groups: Vec<String>,
}

fn fleet_error(e: FleetError) -> ApiError {
    match e {
        FleetError::BadEnrollmentToken => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            e.to_string(),
        ),
        FleetError::UnknownDevice(_) => {
            ApiError::new(StatusCode::NOT_FOUND, "unknown_device", e.to_string())
        }
        other => ApiError::internal(other),
    }
}

async fn mint_enrollment(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Result<ApiJson<MintBody>, ApiError>,
) -> Result<Response, ApiError> {
    let admin = admin(&state, &headers).await?;
    let ApiJson(body) = body?;
    if body.user.as_deref().is_some_and(|u| u.trim().is_empty())
        || body.groups.iter().any(|g| g.trim().is_empty())
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            "user and groups must not be blank",
        ));
    }
    // Audit first: no audit record, no token.
    audit(
        state.store.as_ref(),
        json!({"at": now_rfc3339(), "actor": admin.user, "action": "mint-enrollment", "user": body.user, "groups": body.groups}),
    )
    .map_err(ApiError::internal)?;
    let minted = state
        .fleet
        .mint_enrollment(&admin.user, body.user, body.groups)
        .await
        .map_err(fleet_error)?;
    Ok((StatusCode::CREATED, Json(minted)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EnrollBody {
    enrollment_token: String,
    #[serde(default)]
    host: Option<String>,
}

async fn enroll(
    State(state): State<Shared>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    body: Result<ApiJson<EnrollBody>, ApiError>,
) -> Result<Response, ApiError> {
    let ApiJson(body) = body?;
    let fleet = &state.fleet;
    let result = with_throttle(&state, peer.ip(), Secret::Enrollment, || async {
        Some(
            fleet
                .enroll(&body.enrollment_token, body.host.clone())
                .await,
        )
        .filter(|r| !matches!(r, Err(FleetError::BadEnrollmentToken)))
    })
    .await?;
    let enrolled = result.map_err(fleet_error)?;
    if let Err(e) = audit(
        state.store.as_ref(),
        json!({"at": now_rfc3339(), "actor": enrolled.device_id, "action": "enroll", "host": body.host}),
    ) {
        // Fail closed: an unaudited device does not keep its token.
        let _ = state.fleet.revoke(&enrolled.device_id, "halo-server").await;
        return Err(ApiError::internal(format!("audit log: {e}")));
    }
    Ok((StatusCode::CREATED, Json(enrolled)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RingQuery {
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    host: Option<String>,
}

async fn fleet_ring(
    State(state): State<Shared>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
    query: Result<Query<RingQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let device = device_auth(&state, peer.ip(), &headers).await?;
    let Query(q) = query
        .map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", r.body_text()))?;
    let _ = q.host;
    let user = match (&device.user, q.user.filter(|u| !u.is_empty())) {
        (Some(bound), Some(asked)) if *bound != asked => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "this device is enrolled for another user",
            ));
        }
        (Some(bound), _) => bound.clone(),
        (None, Some(asked)) => asked,
        (None, None) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                "user is required: ?user=<user>&host=<host>",
            ));
        }
    };
    let subject = Subject {
        user,
        groups: device.groups.clone(),
    };
    let policy = state.policy();
    let ring = resolve_ring(&policy.compiled, &subject).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_ring",
            "no ring matches this user and the policy has no default ring",
        )
    })?;
    Ok(Json(json!({
        "ring": ring.name,
        "subject": subject.user,
        "groups": subject.groups,
    })))
}

async fn fleet_report(
    State(state): State<Shared>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
    body: Result<ApiJson<serde_json::Map<String, serde_json::Value>>, ApiError>,
) -> Result<Response, ApiError> {
    let token = bearer(authorization(&headers)).map(str::to_string);
    let fleet_token = state.fleet_token.clone();
    let fleet = &state.fleet;
    // The fleet token reports for no device; a device token reports for its device.
    let reporter: Option<String> =
        with_throttle(&state, peer.ip(), Secret::FleetOrDevice, || async {
            let t = token?;
            if fleet_token.as_ref().is_some_and(|d| d.matches(&t)) {
                return Some(None);
            }
            fleet.device_for_token(&t).await.map(|d| Some(d.id))
        })
        .await?;
    let ApiJson(status) = body?;
    state
        .fleet
        .report(reporter.as_deref(), serde_json::Value::Object(status))
        .await
        .map_err(fleet_error)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"accepted": true}))).into_response())
}

/// The controller's state as of its last tick (per experiment: run, verdict with its
/// evidence table, last action), for `halo controller status` and the admin console.
async fn controller_status(
    State(state): State<Shared>,
    headers: HeaderMap,
) -> Result<Json<halo_controller::controller::Status>, ApiError> {
    admin(&state, &headers).await?;
    let controller = state.controller.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "controller_disabled",
            "this halo-server runs no controller (see --controller)",
        )
    })?;
    Ok(Json(controller.status()))
}

/// What halo-server knows of one rollout beside its document: the controller's last
/// report and its state file's chain verified now (both none without a controller). The
/// API and the console show the same.
pub(crate) struct RolloutView {
    pub report: Option<halo_controller::drive::RolloutReport>,
    pub chain: Option<Result<halo_controller::rollout_state::Chain, String>>,
}

pub(crate) fn rollout_view(state: &AppState, name: &str) -> RolloutView {
    match &state.controller {
        None => RolloutView {
            report: None,
            chain: None,
        },
        Some(c) => RolloutView {
            report: c.status().rollouts.get(name).cloned(),
            chain: Some(
                halo_controller::rollout_state::load(c.data_dir(), name).map_err(|e| e.to_string()),
            ),
        },
    }
}

/// One rollout: its document as served now (steps, gates and bounds, current step), the
/// controller's last evaluation of it (gate values, bake left, the move decided at this
/// step and its actions) and its state file's hash chain, verified now. For `halo rollout
/// status NAME` and the admin console.
async fn rollout_status(
    State(state): State<Shared>,
    headers: HeaderMap,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    admin(&state, &headers).await?;
    let policy = state.policy();
    let Some(rollout) = policy.org.rollouts.get(&name) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_name",
            format!("the served policy has no rollout named {name:?}"),
        )
        .with(json!({"target": "rollout", "name": name})));
    };
    let view = rollout_view(&state, &name);
    let chain = view.chain.map(|c| match c {
        Ok(chain) => json!({
            "verified": true,
            "records": chain.records().len(),
            "head": chain.head(),
            "state": chain.state(),
        }),
        Err(e) => json!({"verified": false, "error": e}),
    });
    let report = view.report;
    Ok(Json(json!({
        "rollout": rollout,
        "controller": report,
        "chain": chain,
    })))
}

async fn list_devices(
    State(state): State<Shared>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    admin(&state, &headers).await?;
    Ok(Json(json!({"devices": state.fleet.list().await})))
}

async fn revoke_device(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Device>, ApiError> {
    let admin = admin(&state, &headers).await?;
    revoke_device_for(&state, &admin, &id).await.map(Json)
}

/// Revoke a device for `admin`, audited (the API and the console both call this).
pub(crate) async fn revoke_device_for(
    state: &AppState,
    admin: &Admin,
    id: &str,
) -> Result<Device, ApiError> {
    let device = state
        .fleet
        .revoke(id, &admin.user)
        .await
        .map_err(fleet_error)?;
    // The revoke stands even if the audit fails (fail safe), but the caller hears of it.
    audit(
        state.store.as_ref(),
        json!({"at": now_rfc3339(), "actor": admin.user, "action": "revoke-device", "device": id}),
    )
    .map_err(|e| {
        ApiError::internal(format!(
            "the device is revoked but the audit log could not be written: {e}"
        ))
    })?;
    Ok(device)
}
