//! Upstream TLS is verified: every https cluster of the standalone bootstrap (a provider,
//! the JWKS, the kill list) refuses a server whose certificate comes from a CA Envoy does
//! not trust, or names another host; once that CA is configured (`upstream_ca_file`,
//! `halo envoy bootstrap --upstream-ca-file`), the same servers are used. Each server here
//! is a fake behind an https front ([`halo_e2e::tls`]) with a certificate from a CA of
//! this test; by default Envoy trusts only the system bundle.

use std::time::Duration;

use halo_e2e::tls::TestCa;
use halo_e2e::*;
use halo_testkit::wait_until;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_upstream_certificates_are_refused_and_served_once_the_ca_is_configured() {
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
    let options = |settings: Value, ca_file: Option<std::path::PathBuf>| GatewayOptions {
        settings,
        killswitch_url: Some(kill_front.url("localhost")),
        jwks_uri: Some(jwks.url("127.0.0.1")),
        upstream_ca_file: ca_file,
        ..GatewayOptions::default()
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
    let gw = Gateway::start(snap.clone(), options(kill_settings(true), None));
    let a = gw
        .post("/v1/messages", &[("authorization", &token)], &msg("haiku"))
        .await;
    assert_eq!(a.status, 503, "{}", a.text());
    assert_eq!(p.a.count(), 0, "nothing reached the provider");
    assert_eq!(prov_a.handshakes(), 0);
    assert!(prov_a.refused() > 0, "Envoy broke off the handshake");
    assert!(ssl_failures(&gw, "t~prov-a~.*", "fail_verify_error") > 0);
    wait_until("the JWKS fetch refused", Duration::from_secs(20), || {
        (ssl_failures(&gw, "halo-jwks", "fail_verify_error") > 0).then_some(())
    });
    wait_until(
        "the kill-list poll refused",
        Duration::from_secs(20),
        || (ssl_failures(&gw, "halo-killswitch", "fail_verify_error") > 0).then_some(()),
    );
    assert_eq!(jwks.handshakes(), 0);
    assert_eq!(kill_front.handshakes(), 0);
    drop(gw);

    // 2. The test CA configured: the JWKS verifies the token (no anonymous fallback: a
    //    200 needs it), the provider serves, the kill list is fetched.
    let gw = Gateway::start(snap, options(kill_settings(false), Some(ca.ca_file())));
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
            let ok = gw.prometheus_sum(&format!(
                "{}{{halo_outcome=\"ok\"}}",
                prometheus_metric("halo_killswitch_fetch")
            ));
            (ok > 0).then_some(())
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
