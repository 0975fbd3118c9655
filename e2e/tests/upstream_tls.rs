//! Upstream TLS is verified in both modes: every https cluster (a provider, the JWKS, the
//! kill list) of the standalone bootstrap and of the xDS resources refuses a server whose
//! certificate comes from a CA Envoy does not trust, or names another host; once that CA
//! is configured (`halo envoy bootstrap --upstream-ca-file`, xDS `upstreamCaFile`), the
//! same servers are used. Each server here is a fake behind an https front
//! ([`halo_e2e::tls`]) with a certificate from a CA of this test; by default Envoy trusts
//! only the system bundle. scripts/test.sh runs this with both filter builds.

use std::time::Duration;

use halo_contract::names;
use halo_e2e::tls::TestCa;
use halo_e2e::*;
use halo_testkit::{free_port, wait_until};
use serde_json::{Value, json};

fn msg(model: &str) -> Value {
    json!({"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
}

/// Envoy's counter `cluster.<cluster>.ssl.<what>` summed over the clusters whose name
/// matches `cluster` (a regex).
fn ssl_failures(gw: &Gateway, cluster: &str, what: &str) -> u64 {
    gw.envoy
        .stat_sum(&format!("^cluster\\.{cluster}\\.ssl\\.{what}$"))
}

/// How the gateway gets its configuration.
#[derive(Clone, Copy)]
enum Mode {
    Standalone,
    Xds,
}

/// The https service URLs both modes are given: the kill list's and the JWKS's.
struct Upstreams {
    killswitch_url: String,
    jwks_uri: String,
}

/// A gateway in `mode` for `snap`, ready to serve (xDS: every resource landed). The ADS
/// server, in xDS mode, lives as long as the returned handle.
async fn gateway(
    mode: Mode,
    snap: &halo_policy::Snapshot,
    up: &Upstreams,
    settings: Value,
    ca_file: Option<std::path::PathBuf>,
) -> (Option<halo_e2e::xds::Ads>, Gateway) {
    match mode {
        Mode::Standalone => {
            let gw = Gateway::start(
                snap.clone(),
                GatewayOptions {
                    settings,
                    killswitch_url: Some(up.killswitch_url.clone()),
                    jwks_uri: Some(up.jwks_uri.clone()),
                    upstream_ca_file: ca_file,
                    ..GatewayOptions::default()
                },
            );
            (None, gw)
        }
        Mode::Xds => {
            let base = halo_e2e::xds::settings(free_port());
            let gs = halo_xds::GatewaySettings {
                filter_settings: settings,
                killswitch_url: Some(up.killswitch_url.clone()),
                jwks_uri: Some(up.jwks_uri.clone()),
                upstream_ca_file: ca_file
                    .map_or(base.upstream_ca_file.clone(), |f| f.display().to_string()),
                ..base
            };
            let (ads, gw) = halo_e2e::xds::gateway(snap, &gs, "gw-upstream-tls", &[]).await;
            filter_answers(&gw).await;
            (Some(ads), gw)
        }
    }
}

/// Wait (bounded) until the filter answers a call without a model with its own JSON
/// error: the listener, routes, clusters and the filter's configuration have landed.
async fn filter_answers(gw: &Gateway) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let a = gw.post("/v1/messages", &[], &json!({})).await;
        if (400..500).contains(&a.status) && a.json()["error"].is_object() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the xDS gateway never served (last: {} {}); Envoy log:\n{}",
            a.status,
            a.text(),
            gw.envoy.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_untrusted_upstream_certificates_are_refused_and_served_once_the_ca_is_configured()
 {
    untrusted_upstream_certificates_are_refused_and_served_once_the_ca_is_configured(
        Mode::Standalone,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_untrusted_upstream_certificates_are_refused_and_served_once_the_ca_is_configured() {
    untrusted_upstream_certificates_are_refused_and_served_once_the_ca_is_configured(Mode::Xds)
        .await;
}

async fn untrusted_upstream_certificates_are_refused_and_served_once_the_ca_is_configured(
    mode: Mode,
) {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let kill = KillServer::start().await;
    let ca = TestCa::new("halo e2e private CA");
    // prov-a by host name (SNI and a DNS SAN), the JWKS by IP literal (an IP SAN), the
    // kill list by host name; prov-b's certificate names another host.
    let prov_a = ca.front(&p.a.url, &["localhost"]).await;
    let prov_b = ca.front(&p.b.url, &["elsewhere.example"]).await;
    let jwks = ca
        .front(
            &format!("{}/.well-known/jwks.json", issuer.url),
            &["127.0.0.1"],
        )
        .await;
    let kill_front = ca.front(&kill.url, &["localhost"]).await;
    let https = Providers {
        a: p.a.at(&prov_a.url("localhost")),
        b: p.b.at(&prov_b.url("localhost")),
        openai: p.openai.clone(),
        gemini: p.gemini.clone(),
    };
    let snap = test_snapshot(&issuer.url, &https);
    let up = Upstreams {
        killswitch_url: kill_front.url("localhost"),
        jwks_uri: jwks.url("127.0.0.1"),
    };
    let kill_settings = |anonymous: bool| {
        json!({
            "identity": {"allowAnonymous": anonymous},
            "killSwitch": {"token": KILL_TOKEN, "pubkey": kill.pubkey_pem(), "intervalSeconds": 1},
        })
    };
    let token = bearer(&issuer.token("dave@acme.test", &[]));

    // 1. The system bundle only: nothing of the test CA's is trusted. Anonymous callers
    //    are allowed, so the failed JWKS fetch does not stop the call before the provider.
    let (ads, gw) = gateway(mode, &snap, &up, kill_settings(true), None).await;
    let a = gw
        .post("/v1/messages", &[("authorization", &token)], &msg("haiku"))
        .await;
    assert_eq!(a.status, 503, "{}", a.text());
    assert_eq!(p.a.count(), 0, "nothing reached the provider");
    assert_eq!(prov_a.handshakes(), 0);
    // The front counts the broken-off handshake on its own task, which may finish after
    // Envoy has already answered the client: wait for it (bounded), as for the stats.
    wait_until(
        "Envoy broke off the handshake",
        Duration::from_secs(10),
        || (prov_a.refused() > 0).then_some(()),
    );
    wait_until(
        "prov-a's verify failure counted",
        Duration::from_secs(10),
        || (ssl_failures(&gw, "t~prov-a~.*", "fail_verify_error") > 0).then_some(()),
    );
    wait_until("the JWKS fetch refused", Duration::from_secs(20), || {
        (ssl_failures(&gw, names::JWKS_CLUSTER, "fail_verify_error") > 0).then_some(())
    });
    wait_until(
        "the kill-list poll refused",
        Duration::from_secs(20),
        || (ssl_failures(&gw, names::KILLSWITCH_CLUSTER, "fail_verify_error") > 0).then_some(()),
    );
    assert_eq!(jwks.handshakes(), 0);
    assert_eq!(kill_front.handshakes(), 0);
    drop((ads, gw));

    // 2. The test CA configured: the JWKS verifies the token (no anonymous fallback: a
    //    200 needs it), the provider serves, the kill list is fetched.
    let (_ads, gw) = gateway(mode, &snap, &up, kill_settings(false), Some(ca.ca_file())).await;
    let a = gw
        .post("/v1/messages", &[("authorization", &token)], &msg("haiku"))
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["provider"], "prov-a");
    assert_eq!(p.a.count(), 1);
    assert!(jwks.handshakes() > 0 && prov_a.handshakes() > 0);
    wait_until(
        "a kill list fetched over TLS",
        Duration::from_secs(20),
        || {
            // Envoy's own count of the poll's answers (the filter's counters are named
            // differently per mode and build): a 200 came back through the verified
            // cluster.
            let fetched = gw.envoy.stat_sum(&format!(
                "^cluster\\.{}\\.(internal\\.)?upstream_rq_200$",
                names::KILLSWITCH_CLUSTER
            ));
            (fetched > 0).then_some(())
        },
    );
    assert!(kill_front.handshakes() > 0);

    // 3. A trusted CA but a certificate for another host: refused on the SAN.
    let ds = bearer(&issuer.token("erin@acme.test", &["ds"]));
    let a = gw
        .post("/v1/messages", &[("authorization", &ds)], &msg("haiku"))
        .await;
    assert_eq!(a.status, 503, "{}", a.text());
    assert_eq!(p.b.count(), 0, "nothing reached the wrongly named server");
    assert!(ssl_failures(&gw, "t~prov-b~.*", "fail_verify_san") > 0);
}
