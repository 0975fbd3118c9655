//! The fleet's API: enrollment tokens (admin), enrollment (a one-time token in the body),
//! a device's ring (device token), status reports (device or fleet token), and the
//! device list and revocation (admin). The devices themselves are [`devices`].

pub mod devices;

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use halo_killswitch::now_rfc3339;
use halo_policy::decide::{Subject, resolve_ring};
use halo_store::{Log, LogStore, StoreError};
use serde::Deserialize;
use serde_json::json;

pub use devices::{Device, Devices, FleetError};

use crate::auth::{Admin, bearer};
use crate::http::admin::AdminState;
use crate::http::admin::authorization;
use crate::http::listener::Peer;
use crate::http::secret::{Secret, SecretGate};
use crate::http::{AdminAuth, ApiError, ApiJson};
use crate::policy::Policy;
use crate::token::TokenDigest;

/// The feature's routes.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/api/v1/enrollment-tokens"),
    ("POST", "/api/v1/enroll"),
    ("GET", "/api/v1/fleet/ring"),
    ("POST", "/api/v1/fleet/report"),
    ("GET", "/api/v1/devices"),
    ("POST", "/api/v1/devices/{id}/revoke"),
];

/// The fleet as the API and the console serve it.
pub struct FleetApi {
    pub devices: Arc<Devices>,
    /// Where the audit log is (every mint, enrollment and revocation).
    pub store: Arc<dyn LogStore>,
    pub policy: Policy,
    /// `--token-file`: a report without a device (halod's fleet-wide token).
    pub fleet_token: Option<TokenDigest>,
    pub gate: Arc<SecretGate>,
    pub admin: Arc<AdminAuth>,
}

impl std::fmt::Debug for FleetApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetApi").finish_non_exhaustive()
    }
}

impl AdminState for FleetApi {
    fn admin_auth(&self) -> &AdminAuth {
        &self.admin
    }
}

impl FleetApi {
    /// The feature's routes.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/api/v1/enrollment-tokens", post(mint_enrollment))
            .route("/api/v1/enroll", post(enroll))
            .route("/api/v1/fleet/ring", get(fleet_ring))
            .route("/api/v1/fleet/report", post(fleet_report))
            .route("/api/v1/devices", get(list_devices))
            .route("/api/v1/devices/{id}/revoke", post(revoke_device))
            .with_state(Arc::clone(self))
    }

    /// Revoke a device for `admin`, audited (the API and the console both call this).
    pub async fn revoke(&self, admin: &Admin, id: &str) -> Result<Device, ApiError> {
        let device = self
            .devices
            .revoke(id, &admin.user)
            .await
            .map_err(fleet_error)?;
        // The revoke stands even if the audit fails (fail safe), but the caller hears of it.
        audit(
        self.store.as_ref(),
        json!({"at": now_rfc3339(), "actor": admin.user, "action": "revoke-device", "device": id}),
    )
    .map_err(|e| {
        ApiError::internal(format!(
            "the device is revoked but the audit log could not be written: {e}"
        ))
    })?;
        Ok(device)
    }
}

impl Devices {
    /// The device a request's `Authorization: Bearer <device token>` names, checked under
    /// the throttle.
    pub async fn authenticate(
        &self,
        gate: &SecretGate,
        ip: std::net::IpAddr,
        headers: &HeaderMap,
    ) -> Result<Device, ApiError> {
        let token = bearer(authorization(headers)).map(str::to_string);
        gate.check(ip, &Secret::bearer("device token"), || async {
            match token {
                Some(t) => self.device_for_token(&t).await,
                None => None,
            }
        })
        .await
    }
}

/// The enrollment token: sent in the body, and good once, so the refusal says so rather
/// than name a header.
fn enrollment_secret() -> Secret {
    Secret {
        kind: "enrollment token",
        refusal: format!(
            "{}: each one enrolls a single device; an admin mints a new one (POST /api/v1/enrollment-tokens), sent in the body as {{\"enrollmentToken\": \"<token>\"}}",
            FleetError::BadEnrollmentToken
        ),
    }
}

fn audit(store: &dyn LogStore, record: serde_json::Value) -> Result<(), StoreError> {
    store.append(Log::Audit, &record)
}

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
    State(api): State<Arc<FleetApi>>,
    admin: Admin,
    body: Result<ApiJson<MintBody>, ApiError>,
) -> Result<Response, ApiError> {
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
        api.store.as_ref(),
        json!({"at": now_rfc3339(), "actor": admin.user, "action": "mint-enrollment", "user": body.user, "groups": body.groups}),
    )
    .map_err(ApiError::internal)?;
    let minted = api
        .devices
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
    State(api): State<Arc<FleetApi>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    body: Result<ApiJson<EnrollBody>, ApiError>,
) -> Result<Response, ApiError> {
    let ApiJson(body) = body?;
    let devices = &api.devices;
    let result = api
        .gate
        .check(peer.ip(), &enrollment_secret(), || async {
            Some(
                devices
                    .enroll(&body.enrollment_token, body.host.clone())
                    .await,
            )
            .filter(|r| !matches!(r, Err(FleetError::BadEnrollmentToken)))
        })
        .await?;
    let enrolled = result.map_err(fleet_error)?;
    if let Err(e) = audit(
        api.store.as_ref(),
        json!({"at": now_rfc3339(), "actor": enrolled.device_id, "action": "enroll", "host": body.host}),
    ) {
        // Fail closed: an unaudited device does not keep its token.
        let _ = api.devices.revoke(&enrolled.device_id, "halo-server").await;
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
    State(api): State<Arc<FleetApi>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
    query: Result<Query<RingQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let device = api
        .devices
        .authenticate(&api.gate, peer.ip(), &headers)
        .await?;
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
    let policy = api.policy.now();
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
    State(api): State<Arc<FleetApi>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
    body: Result<ApiJson<serde_json::Map<String, serde_json::Value>>, ApiError>,
) -> Result<Response, ApiError> {
    let token = bearer(authorization(&headers)).map(str::to_string);
    let fleet_token = api.fleet_token.clone();
    let devices = &api.devices;
    // The fleet token reports for no device; a device token reports for its device.
    let reporter: Option<String> = api
        .gate
        .check(
            peer.ip(),
            &Secret::bearer("fleet or device token"),
            || async {
                let t = token?;
                if fleet_token.as_ref().is_some_and(|d| d.matches(&t)) {
                    return Some(None);
                }
                devices.device_for_token(&t).await.map(|d| Some(d.id))
            },
        )
        .await?;
    let ApiJson(status) = body?;
    api.devices
        .report(reporter.as_deref(), serde_json::Value::Object(status))
        .await
        .map_err(fleet_error)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"accepted": true}))).into_response())
}

async fn list_devices(State(api): State<Arc<FleetApi>>, _admin: Admin) -> Json<serde_json::Value> {
    Json(json!({"devices": api.devices.list().await}))
}

async fn revoke_device(
    State(api): State<Arc<FleetApi>>,
    admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<Device>, ApiError> {
    api.revoke(&admin, &id).await.map(Json)
}
