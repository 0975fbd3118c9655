//! The kill switch's API (ADR-0009): kill and unkill an experiment or a toggle (admin,
//! with a reason), the kill state (admin), and the signed kill list gateways (gateway
//! token) and devices (device token) fetch. The kill log itself is halo-killswitch's;
//! this feature is on only with a kill key ([`DISABLED`] otherwise).

use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::future::BoxFuture;
use halo_killswitch::{Action, Change, KillRecord, KillSwitch, Target, audit_kill};
use halo_metrics::{Collect, CounterMap, Kind, Text};
use halo_store::LogStore;
use serde::Deserialize;
use serde_json::json;

use crate::auth::{Admin, bearer};
use crate::fleet::Devices;
use crate::http::admin::AdminState;
use crate::http::admin::authorization;
use crate::http::listener::Peer;
use crate::http::secret::{Secret, SecretGate};
use crate::http::{AdminAuth, ApiError, ApiJson, Disabled, no_store_json};
use crate::policy::Policy;
use crate::token::TokenDigest;

/// Longest accepted reason, in characters.
pub const MAX_REASON: usize = 1000;

/// The feature's routes.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/api/v1/experiments/{name}/kill"),
    ("POST", "/api/v1/experiments/{name}/unkill"),
    ("POST", "/api/v1/toggles/{name}/kill"),
    ("POST", "/api/v1/toggles/{name}/unkill"),
    ("GET", "/api/v1/killswitch"),
    ("GET", "/api/v1/gateway/killswitch"),
    ("GET", "/api/v1/fleet/killswitch"),
];

/// Every route's answer without a kill key: 501, no pretence (ADR-0009,
/// TestKillWithoutKeyNotImplemented).
pub const DISABLED: Disabled = Disabled {
    status: StatusCode::NOT_IMPLEMENTED,
    code: "kill_switch_disabled",
    message: "the kill switch is not enabled on this server: start halo-server with --killswitch-key-file, --gateway-token-file and --data-dir",
};

/// The kill switch as the API and the console serve it.
pub struct Kill {
    switch: Arc<KillSwitch>,
    /// The store the kill log is in: its audit log gets every change.
    store: Arc<dyn LogStore>,
    policy: Policy,
    gateway_token: Option<TokenDigest>,
    gate: Arc<SecretGate>,
    admin: Arc<AdminAuth>,
    devices: Arc<Devices>,
    changes: CounterMap<(&'static str, &'static str)>,
}

impl std::fmt::Debug for Kill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kill").finish_non_exhaustive()
    }
}

/// What the kill feature is made of (the server composes it).
pub struct KillParts {
    pub switch: Arc<KillSwitch>,
    pub store: Arc<dyn LogStore>,
    pub policy: Policy,
    pub gateway_token: Option<TokenDigest>,
    pub gate: Arc<SecretGate>,
    pub admin: Arc<AdminAuth>,
    pub devices: Arc<Devices>,
}

impl AdminState for Kill {
    fn admin_auth(&self) -> &AdminAuth {
        &self.admin
    }
}

impl Kill {
    pub fn new(parts: KillParts) -> Arc<Kill> {
        Arc::new(Kill {
            switch: parts.switch,
            store: parts.store,
            policy: parts.policy,
            gateway_token: parts.gateway_token,
            gate: parts.gate,
            admin: parts.admin,
            devices: parts.devices,
            changes: CounterMap::default(),
        })
    }

    /// The switch (its state, its subscribers).
    pub fn switch(&self) -> &Arc<KillSwitch> {
        &self.switch
    }

    /// The feature's routes.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route(
                "/api/v1/experiments/{name}/kill",
                post(change(Action::Kill, Target::Experiment)),
            )
            .route(
                "/api/v1/experiments/{name}/unkill",
                post(change(Action::Unkill, Target::Experiment)),
            )
            .route(
                "/api/v1/toggles/{name}/kill",
                post(change(Action::Kill, Target::Toggle)),
            )
            .route(
                "/api/v1/toggles/{name}/unkill",
                post(change(Action::Unkill, Target::Toggle)),
            )
            .route("/api/v1/killswitch", get(status))
            .route("/api/v1/gateway/killswitch", get(gateway_list))
            .route("/api/v1/fleet/killswitch", get(fleet_list))
            .with_state(Arc::clone(self))
    }

    async fn signed_list(&self) -> Result<Response, ApiError> {
        let signed = self.switch.sign_now().await.map_err(ApiError::internal)?;
        Ok(no_store_json(signed.envelope.to_vec()))
    }
}

/// The kill switch's families of `/metrics`, written with the switch off too (zeros, and
/// `halo_server_kill_switch_enabled 0`).
pub struct KillMetrics(pub Option<Arc<Kill>>);

impl Collect for KillMetrics {
    fn collect<'a>(&'a self, out: &'a mut Text) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let empty = CounterMap::default();
            let changes = self.0.as_ref().map_or(&empty, |k| &k.changes);
            out.counters(
                "halo_server_kill_changes_total",
                "Accepted kills and unkills.",
                &["action", "target"],
                changes,
            );
            let (experiments, toggles) = match &self.0 {
                Some(k) => {
                    let s = k.switch.state().await;
                    (s.experiments.len(), s.toggles.len())
                }
                None => (0, 0),
            };
            out.family(
                "halo_server_killed",
                Kind::Gauge,
                "Experiments and toggles killed now.",
            )
            .sample(
                "halo_server_killed",
                &[("target", "experiment")],
                experiments,
            )
            .sample("halo_server_killed", &[("target", "toggle")], toggles);
            out.single(
                "halo_server_kill_switch_enabled",
                Kind::Gauge,
                "Whether the kill switch is served.",
                u8::from(self.0.is_some()),
            );
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReasonBody {
    reason: String,
}

type Body = Result<ApiJson<ReasonBody>, ApiError>;

/// What one kill or unkill request answers.
type Answer = BoxFuture<'static, Result<Response, ApiError>>;

/// The handler of one of the four kill and unkill routes (the console's is shaped alike).
fn change(
    action: Action,
    target: Target,
) -> impl Fn(State<Arc<Kill>>, Admin, Path<String>, Body) -> Answer + Clone + Send + Sync + 'static
{
    move |kill, admin, name, body| Box::pin(change_one(kill, admin, name, body, action, target))
}

async fn change_one(
    State(kill): State<Arc<Kill>>,
    admin: Admin,
    Path(name): Path<String>,
    body: Body,
    action: Action,
    target: Target,
) -> Result<Response, ApiError> {
    let ApiJson(body) = body?;
    let done = kill
        .change(&admin, action, target, &name, &body.reason)
        .await?;
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
pub struct Changed {
    pub killed: bool,
    pub version: u64,
}

impl Kill {
    /// Kill or unkill `name` for `admin` with `reason` (ADR-0009: a reason is required, the
    /// name must be in the served policy, the audit is fail-closed for unkills). The API and
    /// the console both call this.
    pub async fn change(
        &self,
        admin: &Admin,
        action: Action,
        target: Target,
        name: &str,
        reason: &str,
    ) -> Result<Changed, ApiError> {
        let ks = &self.switch;
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
        let policy = self.policy.now();
        let in_policy = match target {
            Target::Experiment => policy.org.experiments.contains_key(name),
            Target::Toggle => policy.org.toggles.contains_key(name),
        };
        // An unkill may name something the policy has since dropped, if it is still killed.
        let known =
            in_policy || (action == Action::Unkill && ks.state().await.is_killed(target, name));
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
        let store = Arc::clone(&self.store);
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
        self.changes.inc((action_str, target.as_str()));
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
}

async fn status(State(kill): State<Arc<Kill>>, _admin: Admin) -> Json<serde_json::Value> {
    let s = kill.switch.state().await;
    Json(json!({
        "enabled": true,
        "version": s.version,
        "experiments": s.experiments.values().collect::<Vec<_>>(),
        "toggles": s.toggles.values().collect::<Vec<_>>(),
    }))
}

async fn gateway_list(
    State(kill): State<Arc<Kill>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let token = bearer(authorization(&headers)).map(str::to_string);
    let expected = kill.gateway_token.clone();
    kill.gate
        .check(peer.ip(), &Secret::bearer("gateway token"), || async {
            match (token, expected) {
                (Some(t), Some(d)) if d.matches(&t) => Some(()),
                _ => None,
            }
        })
        .await?;
    kill.signed_list().await
}

async fn fleet_list(
    State(kill): State<Arc<Kill>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    kill.devices
        .authenticate(&kill.gate, peer.ip(), &headers)
        .await?;
    kill.signed_list().await
}
