//! `halo-server --controller`: halo-controller's loop in this process, on this server's
//! ports (spec: low-level design "Controller loop"), and its API: the controller's status
//! and one rollout's view (admin), its counters in `/metrics`.
//!
//! - the policy: [`ServedPolicy`], the policy the server serves *now* (the policy source's
//!   latest accepted state), so an edit to the policy dir reaches the next tick;
//! - the evidence: the store the receivers write ([`halo_controller::evidence_store`]);
//! - the kill switch: halo-controller's `ServerKill`, this server's switch, only with a kill key. A
//!   controller kill goes through the same append-then-apply and the same fail-closed
//!   audit as an admin's (ADR-0009), with actor `halo-controller`;
//! - pull requests: git and gh on a local clone of the policy repo; notifications: the
//!   signed webhook.

use std::sync::Arc;

use anyhow::Context as _;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use futures_util::future::BoxFuture;
use halo_controller::assemble::{ControllerSettings, ServerKill, assemble};
use halo_controller::controller::{Controller, DECISIONS, PolicyError, PolicyPort};
use halo_controller::kill::KillPort;
use halo_metrics::{Collect, Kind, Text};
use halo_xds::source::Served;
use serde_json::json;

use crate::auth::Admin;
use crate::http::admin::AdminState;
use crate::http::{AdminAuth, ApiError, Disabled, or_disabled};
use crate::policy::Policy;

/// The feature's routes: the status needs a controller, a rollout's view does not (it
/// shows the document as served, with the controller's report when there is one).
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/api/v1/controller/status"),
    ("GET", "/api/v1/rollouts/{name}"),
];

/// The status route's answer without `--controller`.
pub const DISABLED: Disabled = Disabled {
    status: StatusCode::NOT_FOUND,
    code: "controller_disabled",
    message: "this halo-server runs no controller (see --controller)",
};

/// The policy this server serves now, as the controller reads it each tick.
pub struct ServedPolicy(pub tokio::sync::watch::Receiver<Arc<Served>>);

impl PolicyPort for ServedPolicy {
    fn current(&self) -> BoxFuture<'_, Result<Arc<halo_policy::Org>, PolicyError>> {
        let org = Arc::new(self.0.borrow().org.clone());
        Box::pin(async move { Ok(org) })
    }
}

/// The controller on this server's ports; `None` unless `--controller`.
pub fn build(
    c: &ControllerSettings,
    data_dir: Option<&std::path::Path>,
    policy_dir: &std::path::Path,
    policy: tokio::sync::watch::Receiver<Arc<Served>>,
    evidence: Option<Arc<dyn halo_evidence::Store>>,
    kill: Option<ServerKill>,
) -> anyhow::Result<Option<Arc<Controller>>> {
    if !c.enabled {
        return Ok(None);
    }
    let data_dir = data_dir.context("--controller requires --data-dir")?;
    let evidence = evidence.context(
        "--controller reads the evidence store: configure a receiver (--otlp-gateway-listen)",
    )?;
    let controller = assemble(
        c,
        data_dir,
        policy_dir,
        Arc::new(ServedPolicy(policy)),
        evidence,
        kill.map(|k| Arc::new(k) as Arc<dyn KillPort>),
    )?;
    Ok(Some(Arc::new(controller)))
}

/// The controller as the API and the console serve it (`controller` is `None` without
/// `--controller`).
pub struct ControllerApi {
    pub controller: Option<Arc<Controller>>,
    pub policy: Policy,
    pub admin: Arc<AdminAuth>,
}

impl AdminState for ControllerApi {
    fn admin_auth(&self) -> &AdminAuth {
        &self.admin
    }
}

impl ControllerApi {
    /// The feature's routes.
    pub fn router(self: &Arc<Self>) -> Router {
        let rollouts = Router::new()
            .route("/api/v1/rollouts/{name}", get(rollout_status))
            .with_state(Arc::clone(self));
        let status = self.controller.as_ref().map(|_| {
            Router::new()
                .route("/api/v1/controller/status", get(controller_status))
                .with_state(Arc::clone(self))
        });
        let status = or_disabled(status, &ROUTES[..1], DISABLED);
        rollouts.merge(status)
    }
}

/// The controller's state as of its last tick (per experiment: run, verdict with its
/// evidence table, last action), for `halo controller status` and the admin console.
async fn controller_status(
    State(api): State<Arc<ControllerApi>>,
    _admin: Admin,
) -> Result<Json<halo_controller::controller::Status>, ApiError> {
    match &api.controller {
        Some(c) => Ok(Json(c.status())),
        None => Err(ApiError::new(
            DISABLED.status,
            DISABLED.code,
            DISABLED.message,
        )),
    }
}

/// What halo-server knows of one rollout beside its document: the controller's last
/// report and its state file's chain verified now (both none without a controller). The
/// API and the console show the same.
pub struct RolloutView {
    pub report: Option<halo_controller::drive::RolloutReport>,
    pub chain: Option<Result<halo_controller::rollout_state::Chain, String>>,
}

impl ControllerApi {
    pub fn rollout_view(&self, name: &str) -> RolloutView {
        match &self.controller {
            None => RolloutView {
                report: None,
                chain: None,
            },
            Some(c) => RolloutView {
                report: c.status().rollouts.get(name).cloned(),
                chain: Some(
                    halo_controller::rollout_state::load(c.data_dir(), name)
                        .map_err(|e| e.to_string()),
                ),
            },
        }
    }
}

/// One rollout: its document as served now (steps, gates and bounds, current step), the
/// controller's last evaluation of it (gate values, bake left, the move decided at this
/// step and its actions) and its state file's hash chain, verified now. For `halo rollout
/// status NAME` and the admin console.
async fn rollout_status(
    State(api): State<Arc<ControllerApi>>,
    _admin: Admin,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let policy = api.policy.now();
    let Some(rollout) = policy.org.rollouts.get(&name) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_name",
            format!("the served policy has no rollout named {name:?}"),
        )
        .with(json!({"target": "rollout", "name": name})));
    };
    let view = api.rollout_view(&name);
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

/// The controller's counters in `/metrics` (registered only with `--controller`).
pub struct ControllerMetrics(pub Arc<Controller>);

impl Collect for ControllerMetrics {
    fn collect<'a>(&'a self, out: &'a mut Text) -> BoxFuture<'a, ()> {
        use std::sync::atomic::Ordering;
        let n = &self.0.counters;
        out.single(
            "halo_controller_ticks_total",
            Kind::Counter,
            "Controller ticks run.",
            n.ticks.load(Ordering::Relaxed),
        );
        out.single(
            "halo_controller_tick_failures_total",
            Kind::Counter,
            "Controller ticks that failed (retried sooner).",
            n.tick_failures.load(Ordering::Relaxed),
        );
        out.family(
            "halo_controller_verdicts_total",
            Kind::Counter,
            "Verdicts by decision.",
        );
        for d in DECISIONS {
            out.sample(
                "halo_controller_verdicts_total",
                &[("decision", d.as_str())],
                n.verdicts(d),
            );
        }
        out.family(
            "halo_controller_actions_total",
            Kind::Counter,
            "Actions decided (each once per experiment run).",
        );
        for d in DECISIONS.into_iter().skip(1) {
            out.sample(
                "halo_controller_actions_total",
                &[("decision", d.as_str())],
                n.actions(d),
            );
        }
        Box::pin(async {})
    }
}
