//! Target timeouts as the spec says (halos-traffic-plane.md, "Model routes and failover"):
//! `timeoutSeconds` bounds connect plus response headers, so a primary that accepts the
//! connection and then hangs fails over to the next target; a stream that has started is
//! never cut by it. Both modes, one policy.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use halo_e2e::{Gateway, GatewayOptions, Hang, Issuer, Provider, bearer};
use halo_policy::Snapshot;
use halo_testkit::free_port;
use serde_json::{Value, json};

fn msg(alias: &str, stream: bool) -> Value {
    json!({"model": alias, "max_tokens": 5, "stream": stream,
           "messages": [{"role": "user", "content": "hi"}]})
}

struct Fixture {
    hang: Hang,
    slow: Provider,
    backup: Provider,
    issuer: Issuer,
    snapshot: Snapshot,
}

async fn fixture() -> Fixture {
    let issuer = Issuer::start().await;
    let hang = Hang::start().await;
    // Answers headers and the first event at once, the rest when the test releases it.
    let slow = Provider::start("slow").await;
    let backup = Provider::start("backup").await;
    let tiers = |first: &str, model: &str| {
        json!([
            {"upstream": first, "model": model, "timeoutSeconds": 1},
            {"upstream": "backup", "model": format!("backup-after-{first}"), "priority": 1},
        ])
    };
    let doc = json!({
        "schema": 1,
        "org": "timeout-org",
        "identity": {"issuer": issuer.url, "audience": halo_e2e::AUDIENCE,
                     "claims": {"user": "email", "groups": "groups"}},
        "protocols": {"claude-code": "anthropic-messages"},
        "upstreams": {
            "hang": {"url": hang.url, "kind": "anthropic"},
            "slow": {"url": slow.url, "kind": "anthropic"},
            "backup": {"url": backup.url, "kind": "anthropic"},
        },
        "models": {
            "on-hang": tiers("hang", "model-hang"),
            "slow-stream": tiers("slow", "model-slow"),
        },
        "rings": [{"name": "general", "order": 0, "membership": {"default": true}}],
        "experiments": [],
        "toggles": [],
    });
    let snapshot = Snapshot::from_bytes(doc.to_string().as_bytes()).expect("policy decodes");
    Fixture {
        hang,
        slow,
        backup,
        issuer,
        snapshot,
    }
}

async fn hanging_primary_fails_over_and_a_started_stream_is_not_cut(f: &Fixture, gw: &Gateway) {
    let token = bearer(&f.issuer.token("dev@acme.test", &[]));
    let auth = [("authorization", token.as_str())];
    let a = gw.post("/v1/messages", &auth, &msg("on-hang", false)).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["provider"], "backup", "{}", a.text());
    assert_eq!(a.json()["model"], "backup-after-hang");
    assert!(f.hang.accepted() >= 1, "the primary was tried first");

    // The slow primary's stream starts at once and ends after its timeout: it is served
    // whole, not cut and not retried.
    let resp = gw
        .client
        .post(format!("{}/v1/messages", gw.base))
        .header("authorization", &token)
        .json(&msg("slow-stream", true))
        .send()
        .await
        .expect("stream request");
    assert_eq!(resp.status().as_u16(), 200);
    let before = f.backup.count();
    // Past timeoutSeconds (1 s) with the stream open, then let it finish.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    f.slow.release_stream();
    let text = tokio::time::timeout(Duration::from_secs(20), resp.text())
        .await
        .expect("the stream ends")
        .expect("the stream is read whole");
    assert!(text.contains("message_start"), "{text}");
    assert!(text.contains("message_stop"), "the stream was cut: {text}");
    assert_eq!(
        f.backup.count(),
        before,
        "a started stream is never retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_timeout_seconds_bounds_headers_not_streams() {
    let f = fixture().await;
    let gw = Gateway::start(f.snapshot.clone(), GatewayOptions::default());
    hanging_primary_fails_over_and_a_started_stream_is_not_cut(&f, &gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_timeout_seconds_bounds_headers_not_streams() {
    let f = fixture().await;
    let (_ads, gw) = halo_e2e::xds::gateway(
        &f.snapshot,
        &halo_e2e::xds::settings(free_port()),
        "gw-timeouts",
        &[],
    )
    .await;
    halo_e2e::xds::wait_serving(&gw).await;
    hanging_primary_fails_over_and_a_started_stream_is_not_cut(&f, &gw).await;
}
