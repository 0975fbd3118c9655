//! The access log, both modes: one JSON line per request on Envoy's standard output with
//! what was decided and how it went (ring, variant, route, upstream, status, attempts,
//! durations), and never the body, a credential, the query string or the user id.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use halo_e2e::*;
use halo_testkit::{free_port, wait_until};
use serde_json::{Value, json};

/// The access-log lines Envoy has written so far.
fn access_lines(gw: &Gateway) -> Vec<Value> {
    gw.envoy
        .logs()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["log"] == "halo.request")
        .collect()
}

async fn one_line_per_request_and_nothing_private(gw: &Gateway, issuer: &Issuer) {
    let user = "paula.private@acme.test";
    let token = bearer(&issuer.token(user, &[]));
    let marker = "body-marker-3f9c";
    let body = json!({"model": "haiku", "max_tokens": 5,
                      "messages": [{"role": "user", "content": marker}]});
    // Ready first (xDS: the configuration lands asynchronously).
    wait_until("the gateway to serve", Duration::from_secs(30), || {
        let a = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(gw.post(
                "/v1/messages",
                &[("authorization", &token)],
                &body,
            ))
        });
        (a.status == 200).then_some(())
    });
    let before = access_lines(gw).len();
    let a = gw
        .post(
            "/v1/messages?secret-query=q-7d1e",
            &[("authorization", &token), ("x-api-key", "client-key-5be2")],
            &body,
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let a = gw.post("/v1/messages", &[], &body).await;
    assert_eq!(a.status, 401, "{}", a.text());

    // Envoy flushes the log about once a second: wait for the refused call's line (the only
    // 401), then take the served call's line, the last 200.
    let lines = wait_until(
        "the refused call's log line",
        Duration::from_secs(15),
        || {
            let lines = access_lines(gw);
            (lines.len() >= before + 2 && lines.iter().any(|l| l["status"] == 401)).then_some(lines)
        },
    );
    let served = lines
        .iter()
        .rev()
        .find(|l| l["status"] == 200)
        .expect("the served call's line");
    assert_eq!(served["ring"], "general", "{served}");
    assert_eq!(served["status"], 200, "{served}");
    assert_eq!(served["attempts"], 1, "{served}");
    assert_eq!(served["method"], "POST", "{served}");
    assert!(
        served["route"].as_str().unwrap_or("").starts_with("haiku-"),
        "{served}"
    );
    assert!(
        served["upstream"]
            .as_str()
            .unwrap_or("")
            .starts_with("127.0.0.1:"),
        "{served}"
    );
    assert!(served["durationMs"].is_number(), "{served}");
    assert!(served["time"].is_string(), "{served}");
    let refused = lines
        .iter()
        .find(|l| l["status"] == 401)
        .expect("the refused call's line");
    assert_eq!(refused["attempts"], 0, "{refused}");

    let text = lines
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    for private in [
        user,
        token.trim_start_matches("Bearer "),
        "q-7d1e",
        "secret-query",
        "client-key-5be2",
        marker,
    ] {
        assert!(
            !text.contains(private),
            "{private:?} in the access log:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_access_log_is_one_json_line_per_request_without_private_data() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let gw = Gateway::start(test_snapshot(&issuer.url, &p), GatewayOptions::default());
    one_line_per_request_and_nothing_private(&gw, &issuer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_access_log_is_one_json_line_per_request_without_private_data() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let snap = test_snapshot(&issuer.url, &p);
    let (_ads, gw) =
        halo_e2e::xds::gateway(&snap, &halo_e2e::xds::settings(free_port()), "gw-log", &[]).await;
    one_line_per_request_and_nothing_private(&gw, &issuer).await;
}
