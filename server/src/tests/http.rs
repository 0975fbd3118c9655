//! The HTTP leaf every feature shares: the router of a feature that is off, the JSON
//! fallbacks `finish` adds, and shared secrets under the per-address throttle.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::connect_info::MockConnectInfo;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::routing::{get, post};
use serde_json::json;

use super::{WRONG_TOKEN, assert_error, from, get as get_req, post as post_req, request, send};
use crate::auth::bearer;
use crate::http::admin::authorization;
use crate::http::listener::Peer;
use crate::http::secret::{Secret, SecretGate};
use crate::http::throttle::{BLOCK_AFTER, SLOW_AFTER};
use crate::http::{ApiError, ApiJson, disabled, finish};

/// `path` with every `{param}` filled in.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|seg| if seg.starts_with('{') { "x" } else { seg })
        .collect::<Vec<_>>()
        .join("/")
}

fn method(name: &str) -> Method {
    Method::from_bytes(name.as_bytes()).expect("a method")
}

#[tokio::test]
async fn a_disabled_feature_answers_every_route_with_its_refusal_and_other_methods_405() {
    let router = finish(
        disabled(crate::kill::ROUTES, crate::kill::DISABLED),
        1 << 20,
        None,
    );
    assert_eq!(crate::kill::ROUTES.len(), 7);
    for (m, path) in crate::kill::ROUTES {
        let path = concrete(path);
        let body = (*m == "POST").then(|| json!({"reason": "x"}));
        let r = send(&router, request(method(m), &path, None, body.as_ref())).await;
        assert_error(&r, StatusCode::NOT_IMPLEMENTED, "kill_switch_disabled");
        assert!(
            r.message().contains("--killswitch-key-file"),
            "{m} {path}: {}",
            r.message()
        );

        let other = if *m == "GET" {
            Method::DELETE
        } else {
            Method::GET
        };
        let r = send(&router, request(other.clone(), &path, None, None)).await;
        assert_error(&r, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
        assert!(r.message().contains(other.as_str()), "{}", r.message());
        // The 405 keeps axum's `Allow`: the route's method (GET brings HEAD).
        let allow: Vec<&str> = r.header(header::ALLOW).split(',').collect();
        assert!(allow.contains(m), "{other} {path}: {allow:?}");
        assert!(
            !allow.contains(&other.as_str()),
            "{other} {path}: {allow:?}"
        );
    }
}

#[tokio::test]
async fn an_unknown_path_is_404_in_json() {
    let router = finish(
        disabled(crate::kill::ROUTES, crate::kill::DISABLED),
        1 << 20,
        None,
    );
    for path in ["/api/v1/nope", "/", "/api/v1/experiments/x/kill/more"] {
        let r = send(&router, get_req(path, None)).await;
        assert_error(&r, StatusCode::NOT_FOUND, "not_found");
        assert!(r.message().contains("openapi.json"), "{}", r.message());
    }
}

#[derive(Debug, serde::Deserialize)]
struct Needs {
    count: u32,
}

#[tokio::test]
async fn plain_text_refusals_become_json_and_other_answers_stay() {
    let routes = Router::new()
        // axum's own extractor rejection: plain text.
        .route(
            "/query",
            get(|q: axum::extract::Query<Needs>| async move { q.0.count.to_string() }),
        )
        .route(
            "/busy",
            get(|| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [("x-halo-why", "draining")],
                    "draining, retry",
                )
            }),
        )
        .route("/bare", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
        .route("/fine", get(|| async { "plain and fine" }))
        .route(
            "/shaped",
            get(|| async { ApiError::new(StatusCode::CONFLICT, "own_code", "its own words") }),
        );
    let router = finish(routes, 1 << 20, None);

    let r = send(&router, get_req("/query?count=many", None)).await;
    assert_error(&r, StatusCode::BAD_REQUEST, "bad_request");
    assert!(r.message().contains("count"), "{}", r.message());

    let r = send(&router, get_req("/busy", None)).await;
    assert_error(&r, StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    assert_eq!(r.message(), "draining, retry");
    // The refusal's own headers stay.
    assert_eq!(
        r.header(header::HeaderName::from_static("x-halo-why")),
        "draining"
    );

    let r = send(&router, get_req("/bare", None)).await;
    assert_error(&r, StatusCode::INTERNAL_SERVER_ERROR, "internal");
    assert_eq!(r.message(), "Internal Server Error");

    let r = send(&router, get_req("/fine", None)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(&r.raw[..], b"plain and fine");

    let r = send(&router, get_req("/shaped", None)).await;
    assert_error(&r, StatusCode::CONFLICT, "own_code");
    assert_eq!(r.message(), "its own words");
}

#[tokio::test]
async fn bodies_over_the_bound_are_413_in_json() {
    let routes = Router::new().route(
        "/echo",
        post(|ApiJson(v): ApiJson<serde_json::Value>| async move { axum::Json(v) }),
    );
    let router = finish(routes, 64, None);
    let r = send(&router, post_req("/echo", None, &json!({"a": 1}))).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body, json!({"a": 1}));
    let r = send(
        &router,
        post_req("/echo", None, &json!({"a": "x".repeat(100)})),
    )
    .await;
    assert_error(&r, StatusCode::PAYLOAD_TOO_LARGE, "body_too_large");
}

const SECRET: &str = "5e1f0a9c3b7d2e4f6a8c0b1d3e5f7a9c2b4d6e8f0a1c3e5b7d9f1a3c5e7b9d0f";

async fn guarded(
    State(gate): State<Arc<SecretGate>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
) -> Result<&'static str, ApiError> {
    let ok = bearer(authorization(&headers)) == Some(SECRET);
    gate.check(peer.ip(), &Secret::bearer("test token"), || async move {
        ok.then_some(())
    })
    .await?;
    Ok("in")
}

#[tokio::test]
async fn a_shared_secret_blocks_an_address_after_block_after_failures() {
    let gate = Arc::new(SecretGate::default());
    let blocked: SocketAddr = "192.0.2.7:5000".parse().expect("addr");
    // Requests without their own ConnectInfo come from `blocked`.
    let router = Router::new()
        .route("/guarded", get(guarded))
        .with_state(Arc::clone(&gate))
        .layer(MockConnectInfo(Peer(blocked)));
    let call = |token: &str| {
        let mut req = get_req("/guarded", Some(token));
        req.extensions_mut().remove::<ConnectInfo<Peer>>();
        req
    };

    let r = send(&router, call(SECRET)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    // Failures up to SLOW_AFTER are answered at once, each a 401 naming the secret.
    for _ in 0..SLOW_AFTER {
        let r = send(&router, call(WRONG_TOKEN)).await;
        assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
        assert!(r.message().contains("test token"), "{}", r.message());
    }
    // The rest up to the block as a listener that answers its own way records them
    // (past SLOW_AFTER each check would first wait its growing delay).
    for _ in SLOW_AFTER..BLOCK_AFTER {
        gate.outcome(blocked.ip(), false);
    }

    let right = send(&router, call(SECRET)).await;
    let wrong = send(&router, call(WRONG_TOKEN)).await;
    assert_error(&right, StatusCode::TOO_MANY_REQUESTS, "too_many_attempts");
    assert_eq!(right.header(header::RETRY_AFTER), "900");
    // Blocked, the right secret earns the same answer as a wrong one.
    assert_eq!(right.raw, wrong.raw);
    assert_eq!(wrong.status, StatusCode::TOO_MANY_REQUESTS);

    // Another address is not blocked.
    let elsewhere: SocketAddr = "192.0.2.8:5000".parse().expect("addr");
    let r = send(&router, from(get_req("/guarded", Some(SECRET)), elsewhere)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);

    let mut text = halo_metrics::Text::new();
    gate.write_prometheus(&mut text);
    let text = text.finish();
    let failures = format!("halo_server_secret_failures_total{{kind=\"test token\"}} {SLOW_AFTER}");
    assert!(text.lines().any(|l| l == failures), "{failures} in\n{text}");
    assert!(
        text.lines().any(|l| l == "halo_server_blocked_addresses 1"),
        "{text}"
    );
}

#[tokio::test]
async fn a_success_before_the_block_clears_the_count() {
    let gate = Arc::new(SecretGate::default());
    let router = Router::new()
        .route("/guarded", get(guarded))
        .with_state(Arc::clone(&gate));
    let addr: SocketAddr = "192.0.2.9:5000".parse().expect("addr");
    for _ in 0..BLOCK_AFTER - 1 {
        gate.outcome(addr.ip(), false);
    }
    gate.outcome(addr.ip(), true);
    // Were the count kept, this failure would block the address (and its check wait).
    let r = send(&router, from(get_req("/guarded", Some(WRONG_TOKEN)), addr)).await;
    assert_error(&r, StatusCode::UNAUTHORIZED, "authentication_error");
    let r = send(&router, from(get_req("/guarded", Some(SECRET)), addr)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
}
