//! The ADS protocol as a client sees it, against the server in-process on loopback (as
//! istio/ztunnel tests its xDS client): ordering, named subscriptions (ECDS), stale
//! nonces, NACK hold, node id required.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{Node, TypedExtensionConfig};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use halo_xds::{NodeKey, Resource, Snapshot, SnapshotCache, type_url};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const WAIT: Duration = Duration::from_secs(10);

fn raw(type_url: &str, name: &str, payload: &[u8]) -> Resource {
    Resource {
        name: name.into(),
        body: Any {
            type_url: type_url.into(),
            value: payload.to_vec(),
        },
    }
}

fn ecds(name: &str, payload: &[u8]) -> Resource {
    Resource::new(
        name,
        &TypedExtensionConfig {
            name: name.into(),
            typed_config: Some(Any {
                type_url: "type.googleapis.com/google.protobuf.StringValue".into(),
                value: payload.to_vec(),
            }),
        },
    )
}

/// Bounded poll for server-side effects of requests already sent.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn start(cache: &SnapshotCache) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(halo_xds::serve(listener, cache.clone()));
    port
}

struct Client {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: tonic::Streaming<DiscoveryResponse>,
}

impl Client {
    async fn connect(
        port: u16,
        node: Option<&str>,
        first_type: &str,
    ) -> Result<Client, tonic::Status> {
        let mut ads = AggregatedDiscoveryServiceClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .expect("connect");
        let (tx, rx) = mpsc::channel(8);
        tx.send(DiscoveryRequest {
            node: node.map(|id| Node {
                id: id.into(),
                ..Node::default()
            }),
            type_url: first_type.into(),
            ..DiscoveryRequest::default()
        })
        .await
        .expect("queue first request");
        let rx = ads
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Client { tx, rx })
    }

    async fn send(&self, req: DiscoveryRequest) {
        self.tx.send(req).await.expect("stream open");
    }

    async fn next(&mut self) -> DiscoveryResponse {
        tokio::time::timeout(WAIT, self.rx.message())
            .await
            .expect("a response in time")
            .expect("stream ok")
            .expect("stream open")
    }

    async fn ack(&self, r: &DiscoveryResponse, names: &[&str]) {
        self.send(DiscoveryRequest {
            version_info: r.version_info.clone(),
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            ..DiscoveryRequest::default()
        })
        .await;
    }
}

#[tokio::test]
async fn a_change_goes_out_clusters_first_and_only_for_types_that_changed() {
    let cache = SnapshotCache::new();
    let snap = |v: &str, c: &[u8], l: &[u8], r: &[u8]| {
        Snapshot::from_resources(
            v,
            [
                raw(type_url::CLUSTER, "c", c),
                raw(type_url::LISTENER, "l", l),
                raw(type_url::ROUTE, "r", r),
            ],
        )
    };
    cache.set(NodeKey::Default, snap("v1", b"c1", b"l1", b"r1"));
    let port = start(&cache).await;
    // Subscribe in the "wrong" order: listener first.
    let mut c = Client::connect(port, Some("n1"), type_url::LISTENER)
        .await
        .expect("stream");
    let lds = c.next().await;
    assert_eq!(
        (lds.type_url.as_str(), lds.version_info.as_str()),
        (type_url::LISTENER, "v1")
    );
    c.ack(&lds, &[]).await;
    c.send(DiscoveryRequest {
        type_url: type_url::CLUSTER.into(),
        ..DiscoveryRequest::default()
    })
    .await;
    let cds = c.next().await;
    c.ack(&cds, &[]).await;
    c.send(DiscoveryRequest {
        type_url: type_url::ROUTE.into(),
        resource_names: vec!["r".into()],
        ..DiscoveryRequest::default()
    })
    .await;
    let rds = c.next().await;
    c.ack(&rds, &["r"]).await;

    until("three ACKs", || cache.metrics().acks.get() == 3).await;
    // Routes and clusters change, the listener does not.
    cache.set(NodeKey::Default, snap("v2", b"c2", b"l1", b"r2"));
    let first = c.next().await;
    let second = c.next().await;
    assert_eq!(first.type_url, type_url::CLUSTER);
    assert_eq!(second.type_url, type_url::ROUTE);
    assert_eq!(first.version_info, "v2");
    assert_eq!(first.resources[0].value, b"c2");
    c.ack(&first, &[]).await;
    c.ack(&second, &["r"]).await;
    until("both ACKs", || cache.metrics().acks.get() == 5).await;
    // Nothing else arrives: the next response is the one for the next change.
    cache.set(NodeKey::Default, snap("v3", b"c2", b"l3", b"r2"));
    let next = c.next().await;
    assert_eq!(
        (next.type_url.as_str(), next.version_info.as_str()),
        (type_url::LISTENER, "v3")
    );
    let status = cache.node_status("n1").expect("node seen");
    assert_eq!(
        status
            .of(type_url::CLUSTER)
            .and_then(|t| t.acked_version.clone())
            .as_deref(),
        Some("v2")
    );
    assert_eq!(status.of(type_url::LISTENER).map(|t| t.sent_count), Some(2));
}

#[tokio::test]
async fn named_subscriptions_get_what_they_name_and_ecds_is_served() {
    let cache = SnapshotCache::new();
    cache.set(
        NodeKey::Default,
        Snapshot::from_resources("v1", [ecds("halo", b"one"), ecds("other", b"x")]),
    );
    let port = start(&cache).await;
    let mut c = Client::connect(port, Some("n1"), type_url::EXTENSION_CONFIG)
        .await
        .expect("stream");
    // Named type with no names: nothing is subscribed, nothing is sent; then name one.
    c.send(DiscoveryRequest {
        type_url: type_url::EXTENSION_CONFIG.into(),
        resource_names: vec!["halo".into()],
        ..DiscoveryRequest::default()
    })
    .await;
    let r = c.next().await;
    assert_eq!(r.resources.len(), 1);
    let got = <TypedExtensionConfig as prost::Message>::decode(r.resources[0].value.as_slice())
        .expect("decodes");
    assert_eq!(got.name, "halo");
    c.ack(&r, &["halo"]).await;
    // A node-specific snapshot reaches only that node.
    cache.set(
        "n1",
        Snapshot::from_resources("mine", [ecds("halo", b"two")]),
    );
    let r = c.next().await;
    assert_eq!(r.version_info, "mine");
}

#[tokio::test]
async fn stale_acks_are_ignored_and_a_nack_is_held_until_the_snapshot_changes() {
    let cache = SnapshotCache::new();
    let snap = |v: &str| Snapshot::from_resources(v, [raw(type_url::CLUSTER, "c", v.as_bytes())]);
    cache.set(NodeKey::Default, snap("v1"));
    let port = start(&cache).await;
    let mut c = Client::connect(port, Some("n1"), type_url::CLUSTER)
        .await
        .expect("stream");
    let v1 = c.next().await;
    cache.set(NodeKey::Default, snap("v2"));
    let v2 = c.next().await;
    // The ACK of v1 arrives after v2 went out: stale, ignored.
    c.ack(&v1, &[]).await;
    // NACK v2 the way Envoy does: its last good version, the nonce, and error_detail.
    c.send(DiscoveryRequest {
        version_info: String::new(),
        type_url: type_url::CLUSTER.into(),
        response_nonce: v2.nonce.clone(),
        error_detail: Some(RpcStatus {
            code: 3,
            message: "cluster c: bad value".into(),
            details: vec![],
        }),
        ..DiscoveryRequest::default()
    })
    .await;
    // Requests on one stream are handled in order: once the NACK is recorded, the stale
    // ACK before it was handled too.
    until("the NACK to be recorded", || {
        cache.metrics().nacks.get() == 1
    })
    .await;
    // Wake the stream with an unrelated change: v2 must not be re-sent.
    cache.set("someone-else", snap("x"));
    cache.set(NodeKey::Default, snap("v3"));
    let next = c.next().await;
    assert_eq!(next.version_info, "v3", "the NACKed version was re-sent");
    let status = cache.node_status("n1").expect("node seen");
    let cds = status.of(type_url::CLUSTER).expect("cds status");
    let nack = cds.last_nack.clone().expect("nack recorded");
    assert_eq!(
        (nack.version.as_str(), nack.reason.as_str()),
        ("v2", "cluster c: bad value")
    );
    assert_eq!(cds.acked_version, None, "a stale ACK must not count");
    assert_eq!(cds.sent_count, 3);
    assert_eq!(cache.metrics().stale.get(), 1);
    assert_eq!(cache.metrics().nacks.get(), 1);
}

#[tokio::test]
async fn a_stream_without_a_node_id_is_refused() {
    let cache = SnapshotCache::new();
    cache.set(NodeKey::Default, Snapshot::from_resources("v1", []));
    let port = start(&cache).await;
    let err = match Client::connect(port, None, type_url::CLUSTER).await {
        Ok(mut c) => c.rx.message().await.expect_err("refused"),
        Err(e) => e,
    };
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn with_a_push_limit_of_one_a_stream_waits_for_the_other_ones_ack() {
    let cache = SnapshotCache::with_push_limit(1);
    cache.set(
        NodeKey::Default,
        Snapshot::from_resources("v1", [raw(type_url::CLUSTER, "c", b"1")]),
    );
    let port = start(&cache).await;
    let mut a = Client::connect(port, Some("n-a"), type_url::CLUSTER)
        .await
        .expect("stream");
    let first = a.next().await;
    // a holds the only permit until it answers; b's first response must wait for that.
    let mut b = Client::connect(port, Some("n-b"), type_url::CLUSTER)
        .await
        .expect("stream");
    let early = tokio::time::timeout(Duration::from_millis(300), b.rx.message()).await;
    assert!(early.is_err(), "b was answered while a held the permit");
    a.ack(&first, &[]).await;
    assert_eq!(b.next().await.version_info, "v1");
}
