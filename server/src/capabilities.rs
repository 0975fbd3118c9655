//! What this halo-server serves, unauthenticated: `GET /api/v1/capabilities` (which
//! features are on, where data lives, the policy served) and the OpenAPI document.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::policy::Policy;

/// The OpenAPI document, checked in beside the crate and kept in sync by a test.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// The feature's routes.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/api/v1/capabilities"),
    ("GET", "/api/v1/openapi.json"),
];

/// The facts `/api/v1/capabilities` reports, fixed at start-up but for the policy.
#[derive(Debug)]
pub struct Capabilities {
    pub kill_switch: bool,
    pub fleet_token: bool,
    /// Where the data lives (the log store's own description).
    pub storage: String,
    pub policy: Policy,
}

impl Capabilities {
    /// The feature's routes.
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/api/v1/capabilities", get(capabilities))
            .route("/api/v1/openapi.json", get(openapi))
            .with_state(self)
    }
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn capabilities(State(caps): State<Arc<Capabilities>>) -> Json<serde_json::Value> {
    let policy = caps.policy.now();
    Json(json!({
        "killSwitch": caps.kill_switch,
        "enrollment": true,
        "fleetToken": caps.fleet_token,
        "adminAuth": policy.org.root.identity.is_some(),
        "storage": caps.storage,
        "policy": {"org": policy.org.root.org, "version": policy.version},
    }))
}
