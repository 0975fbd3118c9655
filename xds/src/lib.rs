//! halo-xds: compiled policy -> Envoy resources, a snapshot cache, and the ADS server.
//!
//! - [`envoy`]: pure. The gateway [`Plan`] (halo-envoy-config's `plan`: a compiled
//!   [`halo_policy::Snapshot`] plus [`GatewaySettings`] -> every decision, serializable,
//!   golden-tested; the standalone bootstrap emits the same plan as JSON) -> Envoy
//!   resources, one to one.
//! - [`cache`]: [`SnapshotCache`], versioned resource sets per type URL and node, and the
//!   status view (per node: last sent, last ACKed, last NACK with Envoy's reason).
//! - [`server`]: state-of-the-world ADS over tonic ([`serve`], or [`server::service`] to
//!   mount it in a host's own tonic server). Pushes on every [`SnapshotCache::set`].
//! - [`metrics`]: push/ACK/NACK counters, Prometheus text.
//!
//! A host (halo-server) does: `let cache = SnapshotCache::new();`
//! `cache.set(NodeKey::Default, snapshot_of(&compiled, &settings)?);`
//! `tokio::spawn(serve(listener, cache.clone()));` and shows `cache.status()` (serde
//! Serialize: per node, per type cds/lds/rds/ecds: sentVersion, sentCount, ackedVersion,
//! lastNack {version, reason, atUnix}) and `cache.metrics().render_prometheus()`. An
//! invalid policy never reaches `set`: the host keeps the last snapshot it set.
//! `SnapshotCache::with_push_limit` bounds how many streams have a push in flight.
//!
//! # Cluster names
//!
//! The filter sets `x-halo-route` to an aggregate cluster name; both sides get names from
//! [`halo_policy::cluster_names`]:
//! - Gateway `models` route of alias A, first pick = target index i (as written in
//!   policy): `A-i`. Experiment variant route: `x~<experiment>~<variant>~A-i`. Traffic
//!   toggle route: `g~<toggle>~A-i`.
//! - The aggregate lists one-target sub-clusters in failover order (i, the rest of i's
//!   priority tier in policy order, then later tiers in policy order), each named
//!   `t~<upstream>~<model slug>~<hash8>` and shared by every aggregate listing it.
//! - Every sub-cluster's endpoint carries metadata `halo: {upstream, kind, model}`.

pub mod cache;
pub mod envoy;
pub mod metrics;
pub mod server;
pub mod source;

pub use cache::{NodeKey, NodeStatus, Resource, Snapshot, SnapshotCache, TypeStatus, type_url};
pub use halo_envoy_config::bootstrap::Pushed;
pub use halo_envoy_config::plan::{GatewaySettings, Plan, PlanError, plan};
pub use metrics::Metrics;
pub use server::{ServeError, serve, serve_with_shutdown};
pub use source::{JwksUris, PolicySource, Served, SourceStatus, Transform};

/// Translate `compiled` under `settings` into a cache snapshot whose version is the
/// compiled snapshot's version (sha256 of its bytes) and the settings'.
pub fn snapshot_of(
    compiled: &halo_policy::Snapshot,
    settings: &GatewaySettings,
) -> Result<Snapshot, PlanError> {
    snapshot_with_pushed(compiled, settings, &Pushed::default())
}

/// [`snapshot_of`], with what halo-server pushes in the filter's configuration
/// ([`Pushed`]): the current signed kill-list envelope (`killList`; the filter verifies it
/// with the kill public key exactly as a polled one, the poll stays as the fallback) and
/// the exhausted `routeTo` budgets (`budgetsExhausted`).
pub fn snapshot_with_pushed(
    compiled: &halo_policy::Snapshot,
    settings: &GatewaySettings,
    pushed: &Pushed,
) -> Result<Snapshot, PlanError> {
    let plan = plan(compiled, settings)?;
    let mut resources = envoy::resources(&plan);
    if let Some(f) = &plan.listener.filter {
        let filter = halo_envoy_config::bootstrap::planned_filter(f, compiled, pushed);
        resources.push(envoy::filter_config(&f.name, &filter));
    }
    let settings_json = serde_json::to_vec(settings).unwrap_or_default();
    let version = format!(
        "{}.{}.{}",
        &compiled.version()[..16],
        &halo_policy::Snapshot::version_of(&settings_json)[..8],
        &halo_policy::Snapshot::version_of(pushed.digest_text().as_bytes())[..8]
    );
    Ok(Snapshot::from_resources(version, resources))
}
