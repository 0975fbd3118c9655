//! The gateway in xDS mode: an Envoy booted from the committed envoy/ads.yaml alone, fed
//! by halo-xds's ADS server on loopback. The same [`Gateway`] handle as the standalone
//! bootstrap's, so a test can run one scenario through both modes.

use std::time::Duration;

use halo_testkit::envoy::Envoy;
use halo_testkit::free_port;
use halo_xds::{GatewaySettings, NodeKey, SnapshotCache, snapshot_of};

use crate::{Gateway, client_builder};

/// envoy/ads.yaml with this test's node id and ports (the three values it marks).
pub fn ads_bootstrap(node: &str, ads_port: u16, admin_port: u16) -> String {
    halo_envoy_config::ads::AdsBootstrap::loopback(node, ads_port, admin_port).render()
}

/// Gateway settings for a test listener on `port` with the filter under test; the fake
/// providers listen on loopback, so they may receive the gateway's keys.
pub fn settings(port: u16) -> GatewaySettings {
    GatewaySettings {
        listen_address: "127.0.0.1".into(),
        listen_port: port,
        wasm_path: halo_testkit::filter_module().display().to_string(),
        upstream_hosts: vec!["127.0.0.1".into()],
        ..GatewaySettings::default()
    }
}

/// A running ADS server for one test.
pub struct Ads {
    pub cache: SnapshotCache,
    pub port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Ads {
    /// Serve `cache` on a free loopback port.
    pub async fn start(cache: SnapshotCache) -> Ads {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind ADS");
        let port = listener.local_addr().expect("addr").port();
        let mut ads = Ads {
            cache,
            port,
            stop: None,
            task: None,
        };
        ads.serve(listener);
        ads
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let cache = self.cache.clone();
        self.task = Some(tokio::spawn(async move {
            let _ = halo_xds::serve_with_shutdown(listener, cache, async {
                // Only an explicit stop ends it: a dropped handle keeps serving, like
                // `halo_xds::serve`, for the test's lifetime.
                if rx.await.is_err() {
                    std::future::pending::<()>().await;
                }
            })
            .await;
        }));
        self.stop = Some(tx);
    }

    /// Stop serving (halo-server going down): the server is dropped, so open streams are
    /// cut and the port refuses (a graceful shutdown would wait for Envoy's stream, which
    /// never ends by itself).
    pub async fn stop(&mut self) {
        self.stop.take();
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Serve again on the same port (halo-server back).
    pub async fn restart(&mut self) {
        let listener = halo_testkit::wait_until(
            "the ADS port to bind again",
            Duration::from_secs(10),
            || std::net::TcpListener::bind(("127.0.0.1", self.port)).ok(),
        );
        listener.set_nonblocking(true).expect("nonblocking");
        let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
        self.serve(listener);
    }
}

/// An Envoy from envoy/ads.yaml as node `node` with `env` added to its environment,
/// connected to `ads`, its listener on `settings.listen_port` (already in the cache).
pub fn envoy(ads: &Ads, node: &str, env: &[(&str, Option<&str>)]) -> Envoy {
    let admin = free_port();
    tokio::task::block_in_place(|| {
        Envoy::start_with_env(&ads_bootstrap(node, ads.port, admin), admin, env)
    })
}

/// A gateway in xDS mode serving `snap` under `settings` (its listen port is the
/// gateway's), and the ADS server feeding it (for policy changes, restarts).
pub async fn gateway(
    snap: &halo_policy::Snapshot,
    settings: &GatewaySettings,
    node: &str,
    env: &[(&str, Option<&str>)],
) -> (Ads, Gateway) {
    let cache = SnapshotCache::new();
    cache.set(
        NodeKey::Default,
        snapshot_of(snap, settings).expect("translate"),
    );
    let ads = Ads::start(cache).await;
    let envoy = envoy(&ads, node, env);
    let port = settings.listen_port;
    let gw = Gateway {
        envoy,
        port,
        base: format!("http://127.0.0.1:{port}"),
        snapshot: snap.clone(),
        client: client_builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client"),
    };
    (ads, gw)
}

/// The gateway an xDS server on `ads_port` (halo-server's `--xds-listen`) feeds: an Envoy
/// from envoy/ads.yaml whose listener is on `listen_port` (the server's gateway file's),
/// serving `snap`; returned once it serves ([`wait_serving`]).
pub async fn gateway_of(ads_port: u16, listen_port: u16, snap: &halo_policy::Snapshot) -> Gateway {
    let admin = free_port();
    let envoy = tokio::task::block_in_place(|| {
        Envoy::start(&ads_bootstrap("halo-gateway", ads_port, admin), admin)
    });
    let gw = Gateway {
        envoy,
        port: listen_port,
        base: format!("http://127.0.0.1:{listen_port}"),
        snapshot: snap.clone(),
        client: client_builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client"),
    };
    wait_serving(&gw).await;
    gw
}

/// Wait (bounded) until the xDS gateway's listener and filter are in place: a call
/// without credentials gets the filter's own 401 (Envoy answers 500 while the filter's
/// configuration has not arrived by ECDS, and refuses connections before the listener).
pub async fn wait_serving(gw: &Gateway) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = gw
            .client
            .post(format!("{}/v1/messages", gw.base))
            .body("{}")
            .send()
            .await
            .map(|r| r.status().as_u16())
            .ok();
        if status == Some(401) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the xDS gateway never served (last: {status:?}); Envoy log:\n{}",
            gw.envoy.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
