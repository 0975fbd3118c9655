//! Kills in xDS mode when the push cannot reach Envoy: the filter's poll fallback has its
//! `halo-killswitch` cluster (sent over CDS with the rest), and after halo-server comes
//! back Envoy reconnects fast enough (envoy/ads.yaml's retry back-off) that a kill issued
//! while it was down reaches Envoy within two seconds of its return.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use halo_e2e::*;
use halo_testkit::free_port;
use halo_xds::{GatewaySettings, NodeKey, Pushed, snapshot_with_pushed};
use serde_json::{Value, json};

fn msg(model: &str) -> Value {
    json!({"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
}

/// A user the sonnet-canary experiment puts in its canary arm (routed to prov-b's
/// sonnet-canary-model; killed, to control: prov-a's sonnet).
fn canary_user(snap: &halo_policy::Snapshot) -> String {
    (0..10_000)
        .map(|i| format!("cand{i}@acme.test"))
        .find(|u| {
            let e = snap.experiment("sonnet-canary").expect("experiment");
            halo_policy::decide::assigned_variant(e, u) == Some(1)
        })
        .expect("a canary user")
}

/// The model `user`'s sonnet call reached, or `None` when the gateway did not answer 200.
async fn sonnet_model(gw: &Gateway, issuer: &Issuer, user: &str) -> Option<String> {
    let token = bearer(&issuer.token(user, &[]));
    let a = gw
        .post("/v1/messages", &[("authorization", &token)], &msg("sonnet"))
        .await;
    (a.status == 200).then(|| a.json()["model"].as_str().unwrap_or("").to_string())
}

/// Ask until the canary user's sonnet call reaches `model`, for at most `bound`.
async fn wait_model(gw: &Gateway, issuer: &Issuer, user: &str, model: &str, bound: Duration) {
    let deadline = Instant::now() + bound;
    loop {
        if sonnet_model(gw, issuer, user).await.as_deref() == Some(model) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "sonnet never reached {model} within {bound:?}; Envoy log:\n{}",
            gw.envoy.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn kill_settings(kill: &KillServer, port: u16) -> GatewaySettings {
    GatewaySettings {
        filter_settings: json!({"killSwitch": {
            "token": KILL_TOKEN, "pubkey": kill.pubkey_pem(), "intervalSeconds": 1,
        }}),
        killswitch_url: Some(kill.url.clone()),
        ..halo_e2e::xds::settings(port)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poll_fallback_works_in_xds_mode() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let kill = KillServer::start().await;
    let snap = test_snapshot(&issuer.url, &p);
    let user = canary_user(&snap);
    let settings = kill_settings(&kill, free_port());
    // Nothing pushed: only the poll can bring the kill.
    let (_ads, gw) = halo_e2e::xds::gateway(&snap, &settings, "gw-kill-poll", &[]).await;
    wait_model(
        &gw,
        &issuer,
        &user,
        "sonnet-canary-model",
        Duration::from_secs(30),
    )
    .await;
    assert!(
        gw.envoy
            .stat("cluster_manager.active_clusters")
            .unwrap_or(0)
            > 0
            && gw.envoy.admin("/clusters").contains("halo-killswitch::"),
        "the kill-list cluster was sent"
    );
    kill.serve_kills(&["sonnet-canary"], &[]);
    wait_model(
        &gw,
        &issuer,
        &user,
        "claude-sonnet-4-5-20250929",
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_issued_while_halo_server_is_down_reaches_envoy_soon_after_it_returns() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let kill = KillServer::start().await;
    // The poll finds nothing: what changes routing here is the push.
    kill.go_down();
    let snap = test_snapshot(&issuer.url, &p);
    let user = canary_user(&snap);
    let settings = kill_settings(&kill, free_port());
    let (mut ads, gw) = halo_e2e::xds::gateway(&snap, &settings, "gw-kill-restart", &[]).await;
    wait_model(
        &gw,
        &issuer,
        &user,
        "sonnet-canary-model",
        Duration::from_secs(30),
    )
    .await;

    // halo-server goes down for long enough that Envoy's default back-off (0.5 s doubling
    // to 30 s, jittered) would already wait several seconds between attempts.
    ads.stop().await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    // The kill is issued meanwhile: halo-server holds it for when Envoy is back.
    let envelope = kill.envelope(&["sonnet-canary"], &[], 0);
    let text = String::from_utf8(envelope).expect("envelope is JSON text");
    ads.cache.set(
        NodeKey::Default,
        snapshot_with_pushed(
            &snap,
            &settings,
            &Pushed {
                kill_list: Some(text),
                ..Pushed::default()
            },
        )
        .expect("translate"),
    );
    ads.restart().await;
    let back = Instant::now();
    // The goal is two seconds (#27): measured here and printed (BENCHMARKS.md, "Kill after
    // a halo-server restart"), never asserted; the bound only ends a test that would
    // otherwise wait forever (Envoy's default back-off would reach 30 s).
    wait_model(
        &gw,
        &issuer,
        &user,
        "claude-sonnet-4-5-20250929",
        Duration::from_secs(20),
    )
    .await;
    eprintln!(
        "kill-after-restart: the kill reached Envoy {} ms after halo-server returned",
        back.elapsed().as_millis()
    );
}
