//! `halo-server --controller`: halo-controller's loop in this process, on this server's
//! ports (spec: low-level design "Controller loop"):
//! - the policy: [`ServedPolicy`], the policy the server serves *now* (its PolicySource's
//!   latest accepted state), so an edit to the policy dir reaches the next tick;
//! - the evidence: the store the receivers write ([`halo_controller::evidence_store`]);
//! - the kill switch: [`ServerKill`], this server's switch, only with a kill key. A
//!   controller kill goes through the same append-then-apply and the same fail-closed
//!   audit as an admin's (ADR-0009), with actor `halo-controller`;
//! - pull requests: git and gh on a local clone of the policy repo; notifications: the
//!   signed webhook.

use std::sync::Arc;

use anyhow::Context as _;
use futures_util::future::BoxFuture;
use halo_controller::assemble::{ServerKill, assemble};
use halo_controller::controller::{Controller, PolicyError, PolicyPort};
use halo_controller::kill::KillPort;
use halo_xds::source::Served;

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
    settings: &crate::config::Settings,
    policy: tokio::sync::watch::Receiver<Arc<Served>>,
    evidence: Option<Arc<dyn halo_evidence::Store>>,
    kill: Option<ServerKill>,
) -> anyhow::Result<Option<Arc<Controller>>> {
    let c = &settings.controller;
    if !c.enabled {
        return Ok(None);
    }
    let data_dir = settings
        .data_dir
        .as_deref()
        .context("--controller requires --data-dir")?;
    let evidence = evidence.context(
        "--controller reads the evidence store: configure a receiver (--otlp-gateway-listen)",
    )?;
    let controller = assemble(
        c,
        data_dir,
        &settings.policy_dir,
        Arc::new(ServedPolicy(policy)),
        evidence,
        kill.map(|k| Arc::new(k) as Arc<dyn KillPort>),
    )?;
    Ok(Some(Arc::new(controller)))
}

/// The controller's counters in Prometheus text.
pub fn render_prometheus(c: &Controller) -> String {
    use halo_controller::controller::DECISIONS;
    use std::fmt::Write as _;
    use std::sync::atomic::Ordering;
    let n = &c.counters;
    let mut out = format!(
        "# HELP halo_controller_ticks_total Controller ticks run.\n# TYPE halo_controller_ticks_total counter\nhalo_controller_ticks_total {}\n\
         # HELP halo_controller_tick_failures_total Controller ticks that failed (retried sooner).\n# TYPE halo_controller_tick_failures_total counter\nhalo_controller_tick_failures_total {}\n\
         # HELP halo_controller_verdicts_total Verdicts by decision.\n# TYPE halo_controller_verdicts_total counter\n",
        n.ticks.load(Ordering::Relaxed),
        n.tick_failures.load(Ordering::Relaxed)
    );
    for d in DECISIONS {
        let _ = writeln!(
            out,
            "halo_controller_verdicts_total{{decision=\"{}\"}} {}",
            d.as_str(),
            n.verdicts(d)
        );
    }
    out.push_str("# HELP halo_controller_actions_total Actions decided (each once per experiment run).\n# TYPE halo_controller_actions_total counter\n");
    for d in DECISIONS.into_iter().skip(1) {
        let _ = writeln!(
            out,
            "halo_controller_actions_total{{decision=\"{}\"}} {}",
            d.as_str(),
            n.actions(d)
        );
    }
    out
}
