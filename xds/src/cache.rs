//! The snapshot cache: what each Envoy node should hold, and what it told us it holds.
//!
//! A [`Snapshot`] is a version plus resource sets by type URL. The host sets one per node
//! id, or a default served to every node without its own. Each resource type carries its
//! own version: a type whose resources did not change between two snapshots keeps the
//! version it had, so a policy change that only touches routes does not make every
//! Envoy re-ACK identical clusters.
//!
//! Setting a snapshot wakes every connected stream (one `watch` channel). The status view
//! ([`SnapshotCache::status`]) records per node and type what was last sent, what Envoy
//! last accepted and the last rejection with Envoy's own reason: halo-server exposes it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::{Semaphore, watch};

use crate::metrics::Metrics;

/// The type URLs the server knows, and the order a change is pushed in.
pub mod type_url {
    pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
    pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
    pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
    /// ECDS: a filter's configuration, discovered on its own.
    pub const EXTENSION_CONFIG: &str =
        "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";

    /// Push order on a change: clusters (and their endpoints) before anything that names
    /// them; filter configuration before the listener that uses it; routes last. Envoy's
    /// own ADS client expects this order (CDS, EDS, LDS, RDS).
    pub const PUSH_ORDER: [&str; 5] = [CLUSTER, ENDPOINT, EXTENSION_CONFIG, LISTENER, ROUTE];

    /// Types where an empty subscription means "everything" (SotW wildcard).
    pub fn is_wildcard(type_url: &str) -> bool {
        type_url == CLUSTER || type_url == LISTENER
    }

    /// Short name for logs and metrics labels.
    pub fn short(type_url: &str) -> &str {
        match type_url {
            CLUSTER => "cds",
            ENDPOINT => "eds",
            LISTENER => "lds",
            ROUTE => "rds",
            EXTENSION_CONFIG => "ecds",
            other => other.rsplit('.').next().unwrap_or(other),
        }
    }
}

/// One named xDS resource, already packed.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub name: String,
    pub body: Any,
}

impl Resource {
    /// Pack `message` under `name`.
    pub fn new<T: Message + Name>(name: impl Into<String>, message: &T) -> Resource {
        Resource {
            name: name.into(),
            body: Any {
                type_url: T::type_url(),
                value: message.encode_to_vec(),
            },
        }
    }

    /// The type URL of its body.
    pub fn type_url(&self) -> &str {
        &self.body.type_url
    }
}

/// What the host wants a node to hold: a version and resources grouped by type URL.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub version: String,
    pub resources: BTreeMap<String, Vec<Resource>>,
}

impl Snapshot {
    /// A snapshot from loose resources, grouped by their type URL (order kept per type).
    pub fn from_resources(
        version: impl Into<String>,
        resources: impl IntoIterator<Item = Resource>,
    ) -> Snapshot {
        let mut by_type: BTreeMap<String, Vec<Resource>> = BTreeMap::new();
        for r in resources {
            by_type.entry(r.type_url().to_string()).or_default().push(r);
        }
        Snapshot {
            version: version.into(),
            resources: by_type,
        }
    }
}

/// Which snapshot `set` replaces.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NodeKey {
    /// Served to every node that has no snapshot of its own.
    Default,
    Node(String),
}

impl From<&str> for NodeKey {
    fn from(id: &str) -> NodeKey {
        NodeKey::Node(id.to_string())
    }
}

impl From<String> for NodeKey {
    fn from(id: String) -> NodeKey {
        NodeKey::Node(id)
    }
}

/// The resources of one type in a cached snapshot, with that type's own version.
#[derive(Debug)]
pub(crate) struct TypeSet {
    pub version: String,
    digest: [u8; 32],
    pub resources: Vec<Resource>,
    /// The wildcard response body, encoded on first use and shared by every stream.
    wire: OnceLock<Arc<Vec<u8>>>,
}

impl TypeSet {
    fn new(version: String, digest: [u8; 32], resources: Vec<Resource>) -> TypeSet {
        TypeSet {
            version,
            digest,
            resources,
            wire: OnceLock::new(),
        }
    }

    /// The response body (all resources) for `type_url`, shared.
    pub fn wire_body(&self, type_url: &str) -> Arc<Vec<u8>> {
        self.wire
            .get_or_init(|| {
                Arc::new(crate::server::encode_body(
                    &self.version,
                    type_url,
                    self.resources.iter(),
                ))
            })
            .clone()
    }
}

/// A snapshot as served: per-type versions resolved.
#[derive(Debug)]
pub(crate) struct Cached {
    pub version: String,
    pub types: BTreeMap<String, Arc<TypeSet>>,
}

impl Cached {
    /// The set of `type_url`; a type the snapshot lacks is an empty set at the snapshot's
    /// version (so a wildcard subscriber learns that everything of it was removed).
    pub fn get(&self, type_url: &str) -> Arc<TypeSet> {
        self.types
            .get(type_url)
            .cloned()
            .unwrap_or_else(|| Arc::new(TypeSet::new(self.version.clone(), [0; 32], Vec::new())))
    }
}

fn digest(resources: &[Resource]) -> [u8; 32] {
    let mut h = Sha256::new();
    for r in resources {
        for part in [r.name.as_bytes(), r.body.type_url.as_bytes(), &r.body.value] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
    }
    h.finalize().into()
}

/// A rejection as Envoy reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Nack {
    /// The version Envoy refused.
    pub version: String,
    /// Envoy's reason (error_detail.message), truncated.
    pub reason: String,
    pub at_unix: u64,
}

/// Per node and type: what went out and what came back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_version: Option<String>,
    /// Responses of this type sent to this node (all its streams, ever).
    pub sent_count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acked_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_nack: Option<Nack>,
}

/// Per node: open streams and per-type status (keyed by short type name: cds, lds, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub node: String,
    pub connected_streams: u32,
    pub types: BTreeMap<String, TypeStatus>,
}

impl NodeStatus {
    /// The status of one type by its full type URL.
    pub fn of(&self, type_url: &str) -> Option<&TypeStatus> {
        self.types.get(type_url::short(type_url))
    }
}

/// The cache shared by the host (which sets snapshots) and the ADS server (which serves
/// them). Cheap to clone.
#[derive(Clone)]
pub struct SnapshotCache {
    inner: Arc<Inner>,
}

struct Inner {
    snapshots: RwLock<HashMap<NodeKey, Arc<Cached>>>,
    changed: watch::Sender<u64>,
    status: Mutex<BTreeMap<String, NodeStatus>>,
    metrics: Metrics,
    push_permits: Arc<Semaphore>,
}

/// Streams that may have a push in flight (sent, not yet ACKed) at once; see
/// [`SnapshotCache::with_push_limit`].
pub const DEFAULT_PUSH_LIMIT: usize = 100;

impl Default for SnapshotCache {
    fn default() -> Self {
        SnapshotCache::new()
    }
}

impl std::fmt::Debug for SnapshotCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotCache").finish_non_exhaustive()
    }
}

/// Envoy's rejection messages can be long (a whole proto in text form); keep the start.
const MAX_REASON: usize = 2048;

impl SnapshotCache {
    pub fn new() -> SnapshotCache {
        SnapshotCache::with_push_limit(DEFAULT_PUSH_LIMIT)
    }

    /// A cache whose server lets at most `limit` streams have a push in flight (sent and
    /// not yet answered) at once. A change to many Envoys then goes out in waves, bounding
    /// the server's memory to about `limit` encoded responses in transport buffers.
    pub fn with_push_limit(limit: usize) -> SnapshotCache {
        let (changed, _) = watch::channel(0);
        SnapshotCache {
            inner: Arc::new(Inner {
                snapshots: RwLock::new(HashMap::new()),
                changed,
                status: Mutex::new(BTreeMap::new()),
                metrics: Metrics::default(),
                push_permits: Arc::new(Semaphore::new(limit.max(1))),
            }),
        }
    }

    /// Replace the snapshot of `key` and push it to every connected stream it concerns.
    /// A type whose resources are byte-identical to the previous snapshot of the same key
    /// keeps its previous version, so nothing is re-sent for it.
    pub fn set(&self, key: impl Into<NodeKey>, snapshot: Snapshot) {
        let key = key.into();
        let mut map = self
            .inner
            .snapshots
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let previous = map.get(&key).cloned();
        let types = snapshot
            .resources
            .into_iter()
            .map(|(type_url, resources)| {
                let d = digest(&resources);
                let set = match previous.as_ref().and_then(|p| p.types.get(&type_url)) {
                    Some(old) if old.digest == d => old.clone(),
                    _ => Arc::new(TypeSet::new(snapshot.version.clone(), d, resources)),
                };
                (type_url, set)
            })
            .collect();
        map.insert(
            key,
            Arc::new(Cached {
                version: snapshot.version,
                types,
            }),
        );
        drop(map);
        self.inner.metrics.snapshots_set.inc();
        self.inner.changed.send_modify(|g| *g += 1);
    }

    /// Forget a node's own snapshot (it falls back to the default).
    pub fn clear(&self, key: impl Into<NodeKey>) {
        let key = key.into();
        self.inner
            .snapshots
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        self.inner.changed.send_modify(|g| *g += 1);
    }

    /// The version of the snapshot `node` is served (its own, else the default).
    pub fn version_for(&self, node: &str) -> Option<String> {
        self.snapshot_for(node).map(|c| c.version.clone())
    }

    pub(crate) fn snapshot_for(&self, node: &str) -> Option<Arc<Cached>> {
        let map = self
            .inner
            .snapshots
            .read()
            .unwrap_or_else(|e| e.into_inner());
        map.get(&NodeKey::Node(node.to_string()))
            .or_else(|| map.get(&NodeKey::Default))
            .cloned()
    }

    pub(crate) fn push_permits(&self) -> Arc<Semaphore> {
        self.inner.push_permits.clone()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// Counters of the server using this cache.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Every node seen since start, sorted by id.
    pub fn status(&self) -> Vec<NodeStatus> {
        self.lock_status().values().cloned().collect()
    }

    /// One node's status.
    pub fn node_status(&self, node: &str) -> Option<NodeStatus> {
        self.lock_status().get(node).cloned()
    }

    fn lock_status(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, NodeStatus>> {
        self.inner.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_type(&self, node: &str, type_url: &str, f: impl FnOnce(&mut TypeStatus)) {
        let mut status = self.lock_status();
        let n = status
            .entry(node.to_string())
            .or_insert_with(|| NodeStatus {
                node: node.to_string(),
                ..NodeStatus::default()
            });
        f(n.types
            .entry(type_url::short(type_url).to_string())
            .or_default());
    }

    pub(crate) fn stream_opened(&self, node: &str) {
        self.inner.metrics.streams_active.inc();
        self.inner.metrics.streams_total.inc();
        let mut status = self.lock_status();
        let n = status
            .entry(node.to_string())
            .or_insert_with(|| NodeStatus {
                node: node.to_string(),
                ..NodeStatus::default()
            });
        n.connected_streams += 1;
    }

    pub(crate) fn stream_closed(&self, node: &str) {
        self.inner.metrics.streams_active.dec();
        if let Some(n) = self.lock_status().get_mut(node) {
            n.connected_streams = n.connected_streams.saturating_sub(1);
        }
    }

    pub(crate) fn record_sent(&self, node: &str, type_url: &str, version: &str) {
        self.inner.metrics.pushes.inc();
        self.with_type(node, type_url, |t| {
            t.sent_version = Some(version.to_string());
            t.sent_count += 1;
        });
    }

    pub(crate) fn record_ack(&self, node: &str, type_url: &str, version: &str) {
        self.inner.metrics.acks.inc();
        self.with_type(node, type_url, |t| {
            t.acked_version = Some(version.to_string())
        });
    }

    pub(crate) fn record_nack(&self, node: &str, type_url: &str, version: &str, reason: &str) {
        self.inner.metrics.nacks.inc();
        let mut reason = reason.to_string();
        if reason.len() > MAX_REASON {
            let mut cut = MAX_REASON;
            while !reason.is_char_boundary(cut) {
                cut -= 1;
            }
            reason.truncate(cut);
            reason.push('…');
        }
        let at_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.with_type(node, type_url, |t| {
            t.last_nack = Some(Nack {
                version: version.to_string(),
                reason,
                at_unix,
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;

    fn cluster(name: &str) -> Resource {
        Resource::new(
            name,
            &Cluster {
                name: name.to_string(),
                ..Cluster::default()
            },
        )
    }

    #[test]
    fn unchanged_types_keep_their_version_and_changed_ones_take_the_new_one() {
        let cache = SnapshotCache::new();
        let l = Resource {
            name: "l".into(),
            body: Any {
                type_url: type_url::LISTENER.into(),
                value: vec![1],
            },
        };
        cache.set(
            NodeKey::Default,
            Snapshot::from_resources("v1", [cluster("a"), l.clone()]),
        );
        cache.set(
            NodeKey::Default,
            Snapshot::from_resources("v2", [cluster("a"), cluster("b"), l.clone()]),
        );
        let c = cache.snapshot_for("any").expect("default snapshot");
        assert_eq!(c.version, "v2");
        assert_eq!(c.get(type_url::CLUSTER).version, "v2");
        assert_eq!(c.get(type_url::LISTENER).version, "v1");
        // A type the snapshot lacks is empty at the snapshot's version.
        assert!(c.get(type_url::ROUTE).resources.is_empty());
        assert_eq!(c.get(type_url::ROUTE).version, "v2");
    }

    #[test]
    fn a_node_snapshot_wins_over_the_default_and_clear_falls_back() {
        let cache = SnapshotCache::new();
        cache.set(NodeKey::Default, Snapshot::from_resources("d", []));
        cache.set("n1", Snapshot::from_resources("own", []));
        assert_eq!(cache.version_for("n1").as_deref(), Some("own"));
        assert_eq!(cache.version_for("n2").as_deref(), Some("d"));
        cache.clear("n1");
        assert_eq!(cache.version_for("n1").as_deref(), Some("d"));
    }

    #[test]
    fn nack_reasons_are_kept_short() {
        let cache = SnapshotCache::new();
        cache.record_nack("n", type_url::CLUSTER, "v", &"é".repeat(5000));
        let s = cache.node_status("n").expect("node seen");
        let nack = s.of(type_url::CLUSTER).and_then(|t| t.last_nack.clone());
        let nack = nack.expect("nack recorded");
        assert!(nack.reason.len() <= MAX_REASON + '…'.len_utf8());
        assert_eq!(cache.metrics().nacks.get(), 1);
    }
}
