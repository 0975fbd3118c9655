//! The HTTP layer every halo-server feature shares, and the only one: a leaf that imports
//! no feature.
//!
//! - [`ApiError`]: every refusal, as `{"error": "<code>", "message": "<what is wrong>"}`
//!   with its status (401 adds `WWW-Authenticate`, 429 `Retry-After`); [`ApiJson`] turns
//!   a body's rejection into one; [`finish`] makes every other error answer JSON too.
//! - [`admin`]: the [`Admin`](crate::auth::Admin) extractor, so a handler that takes an
//!   `Admin` argument is an admin call and no handler can forget the check.
//! - [`secret`]: shared secrets (gateway, device, fleet and enrollment tokens) checked
//!   under the per-address [`throttle`].
//! - [`disabled`]: the router of a feature that is off: every route of it answers the
//!   feature's one refusal.
//! - [`listener`]: the TCP listener that turns hyper's own bare refusals into JSON.

pub mod admin;
pub mod listener;
pub mod secret;
pub mod throttle;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, MatchedPath, Request};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, on};
use axum::{Json, Router};
use halo_metrics::{CounterMap, Text};
use serde_json::json;

use crate::auth::AuthError;

pub use admin::AdminAuth;

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

    /// Add fields beside `error` and `message` (what the refusal is about).
    pub fn with(mut self, extra: serde_json::Value) -> ApiError {
        self.extra = Some(extra);
        self
    }

    /// A 500 for a failure the caller cannot fix, logged (its text is the message).
    pub fn internal(e: impl std::fmt::Display) -> ApiError {
        tracing::error!(error = %e, "request failed");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
    }
}

impl ApiError {
    /// The answer's body: `{"error", "message"}` and the refusal's own fields.
    pub fn body(&self) -> serde_json::Value {
        let mut body = json!({"error": self.code, "message": self.message});
        if let (Some(serde_json::Value::Object(extra)), Some(obj)) =
            (&self.extra, body.as_object_mut())
        {
            obj.extend(extra.clone());
        }
        body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, Json(self.body())).into_response();
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
pub async fn json_errors(req: Request, next: Next) -> Response {
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

/// The served routes finished as every listener of halo-server finishes them: unknown
/// paths and methods answered in JSON, request bodies bounded, every error answer JSON,
/// and (with `requests`) each answer counted by route template.
pub fn finish(
    router: Router,
    max_body_bytes: usize,
    requests: Option<std::sync::Arc<Requests>>,
) -> Router {
    let router = router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::middleware::from_fn(json_errors));
    match requests {
        Some(requests) => router.layer(axum::middleware::from_fn(
            move |req: Request, next: Next| {
                let requests = std::sync::Arc::clone(&requests);
                async move { requests.count(req, next).await }
            },
        )),
        None => router,
    }
}

/// HTTP requests by method, route template (never the raw path: names and ids stay out)
/// and status, for `/metrics`.
#[derive(Debug, Default)]
pub struct Requests {
    counts: CounterMap<(String, String, u16)>,
}

impl Requests {
    async fn count(&self, req: Request, next: Next) -> Response {
        let method = req.method().to_string();
        let route = req
            .extensions()
            .get::<MatchedPath>()
            .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
        let resp = next.run(req).await;
        self.counts.inc((method, route, resp.status().as_u16()));
        resp
    }

    pub fn write_prometheus(&self, out: &mut Text) {
        out.counters(
            "halo_server_http_requests_total",
            "HTTP requests by route template and status.",
            &["method", "route", "status"],
            &self.counts,
        );
    }
}

/// What every route of a feature that is off answers: one status, code and message (the
/// message says which flag turns the feature on).
#[derive(Debug, Clone, Copy)]
pub struct Disabled {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: &'static str,
}

/// The router of a feature that is off: each of its `routes` (method, path template), so
/// a client hears that the feature is off rather than that the path does not exist.
pub fn disabled(routes: &[(&str, &str)], answer: Disabled) -> Router {
    let mut router = Router::new();
    for (method, path) in routes {
        // The route lists are the features' own constants, so a method that does not
        // parse is this crate's mistake: the OpenAPI test lists every route served.
        let Some(filter) = Method::from_bytes(method.as_bytes())
            .ok()
            .and_then(|m| MethodFilter::try_from(m).ok())
        else {
            tracing::error!(%method, %path, "a disabled route with no such method");
            continue;
        };
        router = router.route(
            path,
            on(filter, move || async move {
                ApiError::new(answer.status, answer.code, answer.message)
            }),
        );
    }
    router
}

/// A feature's routes when it runs (`Some`), else its [`disabled`] router.
pub fn or_disabled(router: Option<Router>, routes: &[(&str, &str)], answer: Disabled) -> Router {
    router.unwrap_or_else(|| disabled(routes, answer))
}

/// A JSON document that must not be cached (the signed kill list: its freshness is the
/// point of it).
pub fn no_store_json(body: Vec<u8>) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}
