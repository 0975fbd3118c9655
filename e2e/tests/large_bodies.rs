//! Long conversations in both modes: a 5 MB and a 30 MB model call are served whole, and a
//! body over maxBodyBytes (default 32 MiB), announced or chunked, gets the filter's JSON
//! 413 `request_too_large`, never Envoy's plain-text one. Envoy's default connection
//! buffer (1 MiB) refused the first through xDS; both modes now size the listener's from
//! maxBodyBytes (halo-envoy-config's `listener_buffer_limit`). scripts/test.sh runs this
//! with both filter builds.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use halo_e2e::*;
use halo_testkit::free_port;
use serde_json::{Value, json};

const MIB: usize = 1024 * 1024;
/// The filter's default maxBodyBytes.
const MAX_BODY: usize = 32 * MIB;

/// An Anthropic call for `alias` whose one message is `size` bytes of text.
fn conversation(alias: &str, size: usize) -> Vec<u8> {
    json!({"model": alias, "max_tokens": 5,
           "messages": [{"role": "user", "content": "x".repeat(size)}]})
    .to_string()
    .into_bytes()
}

async fn serves_long_conversations_and_refuses_oversize_in_json(
    gw: &Gateway,
    p: &Providers,
    token: &str,
) {
    // Ready (xDS: the listener, clusters and the filter's configuration have landed).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let a = gw
            .send(
                reqwest::Method::POST,
                "/v1/messages",
                &[("authorization", token)],
                conversation("haiku", 10),
            )
            .await;
        if a.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never ready: {} {}",
            a.status,
            a.text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for size in [5 * MIB, 30 * MIB] {
        let a = gw
            .send(
                reqwest::Method::POST,
                "/v1/messages",
                &[
                    ("authorization", token),
                    ("content-type", "application/json"),
                ],
                conversation("haiku", size),
            )
            .await;
        assert_eq!(a.status, 200, "{size} bytes: {}", a.text());
        assert_eq!(a.json()["model"], "claude-haiku-4-5");
        let seen = p.a.seen().pop().expect("prov-a got it");
        assert_eq!(
            seen.json()["messages"][0]["content"].as_str().map(str::len),
            Some(size),
            "the whole conversation reached the provider"
        );
    }
    let served = p.total();
    for chunked in [false, true] {
        let port = gw.port;
        let auth = token.to_string();
        let (status, content_type, body) = tokio::task::spawn_blocking(move || {
            raw_post(
                port,
                &auth,
                conversation("haiku", MAX_BODY + MIB / 2),
                chunked,
            )
        })
        .await
        .expect("join");
        assert_eq!(status, 413, "chunked {chunked}: {body}");
        assert_eq!(
            content_type, "application/json",
            "chunked {chunked}: {body}"
        );
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert_eq!(
            v["error"]["type"], "request_too_large",
            "chunked {chunked}: {body}"
        );
    }
    assert_eq!(
        p.total(),
        served,
        "an oversize body never reaches a provider"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_serves_5_and_30_mb_conversations_and_refuses_oversize_in_json() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let gw = Gateway::start(test_snapshot(&issuer.url, &p), GatewayOptions::default());
    let token = bearer(&issuer.token("long@acme.test", &[]));
    serves_long_conversations_and_refuses_oversize_in_json(&gw, &p, &token).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_serves_5_and_30_mb_conversations_and_refuses_oversize_in_json() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let snap = test_snapshot(&issuer.url, &p);
    let (_ads, gw) = halo_e2e::xds::gateway(
        &snap,
        &halo_e2e::xds::settings(free_port()),
        "gw-large",
        &[],
    )
    .await;
    let token = bearer(&issuer.token("long@acme.test", &[]));
    serves_long_conversations_and_refuses_oversize_in_json(&gw, &p, &token).await;
}
