//! Every answer of halo-server is JSON with an error code (issue 27, item 5), including
//! the refusals made below the router: hyper's own 400, 414 and 431, axum's rejections,
//! 404, 405 and 413. Raw HTTP/1.1 over loopback, so nothing between the test and the
//! server reshapes an answer.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{Env, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Send `request` (a whole HTTP/1.1 request, `connection: close` added by the caller)
/// and read the answer to the end: status, lowercased head, body.
async fn exchange(base: &str, request: Vec<u8>) -> (u16, String, Vec<u8>) {
    let addr = base.trim_start_matches("http://");
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    // The server may answer and close before it has read everything (431, 414): a
    // failed write is then expected, the answer is what counts.
    let _ = conn.write_all(&request).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        let mut chunk = [0u8; 8192];
        loop {
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "no end of answer: {}",
        String::from_utf8_lossy(&answer)
    );
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(&answer)));
    let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, head, answer[end + 4..].to_vec())
}

fn assert_json_error(what: &str, answer: &(u16, String, Vec<u8>), status: u16, code: &str) {
    let (got, head, body) = answer;
    assert_eq!(*got, status, "{what}: {head}");
    assert!(
        head.contains("\r\ncontent-type: application/json"),
        "{what}: no JSON content type in\n{head}"
    );
    let v: Value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{what}: body is not JSON ({e}): {body:?}"));
    assert_eq!(v["error"], code, "{what}: {v}");
    assert!(
        v["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: {v}"
    );
}

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: halo\r\n{extra}connection: close\r\n\r\n").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_json_with_an_error_code() {
    let env = Env::new().await;
    let settings = env.settings();
    let max_body = settings.max_body_bytes;
    let server = serve(&settings).await;
    let api = server.base.clone();

    for base in [&api, &server.admin_base] {
        let r = exchange(base, get("/no/such/route", "")).await;
        assert_json_error("unknown route", &r, 404, "not_found");
        let r = exchange(
            base,
            b"DELETE /api/v1/capabilities HTTP/1.1\r\nhost: halo\r\nconnection: close\r\n\r\n"
                .to_vec(),
        )
        .await;
        assert_json_error(
            "DELETE",
            &r,
            if base == &api { 405 } else { 404 },
            if base == &api {
                "method_not_allowed"
            } else {
                "not_found"
            },
        );
        // hyper's own refusals: a path over 64 KiB, more than 100 headers, a head over
        // ~400 KiB (when it arrives in pieces), and a request line that is not HTTP.
        let long = format!("/api/v1/capabilities?x={}", "a".repeat(70 * 1024));
        let r = exchange(base, get(&long, "")).await;
        assert_json_error("70 KiB path", &r, 414, "uri_too_long");
        let many: String = (0..120).map(|i| format!("x-h{i}: v\r\n")).collect();
        let r = exchange(base, get("/api/v1/capabilities", &many)).await;
        assert_json_error("120 headers", &r, 431, "headers_too_large");
        // hyper refuses a head over its read buffer's limit only if the head arrives in
        // more than one read: when the whole request is already in the socket (a loaded
        // machine), it parses it and the route answers. Either way the answer is JSON.
        let big = format!("x-big: {}\r\n", "b".repeat(500 * 1024));
        let r = exchange(base, get("/api/v1/capabilities", &big)).await;
        if r.0 == 431 {
            assert_json_error("500 KiB header", &r, 431, "headers_too_large");
        } else {
            assert!(
                r.1.contains("\r\ncontent-type: application/json"),
                "500 KiB header, answered {}: {}",
                r.0,
                r.1
            );
        }
        let r = exchange(base, b"NOT HTTP AT ALL\r\n\r\n".to_vec()).await;
        assert_json_error("garbage request line", &r, 400, "bad_request");
    }
    let r = exchange(&server.admin_base, get("/metrics", "")).await;
    assert_eq!(r.0, 200, "{}", r.1);

    // The admin listener: 405 too.
    let r = exchange(
        &server.admin_base,
        b"POST /healthz HTTP/1.1\r\nhost: halo\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            .to_vec(),
    )
    .await;
    assert_json_error("POST /healthz", &r, 405, "method_not_allowed");

    // 413: a body over --max-body-bytes.
    let body = format!("{{\"enrollmentToken\": \"{}\"}}", "t".repeat(max_body + 1));
    let mut req = format!(
        "POST /api/v1/enroll HTTP/1.1\r\nhost: halo\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body.as_bytes());
    let r = exchange(&api, req).await;
    assert_json_error("oversized body", &r, 413, "body_too_large");

    // axum's own rejection of a path parameter that is not UTF-8.
    let admin = env.admin_token();
    let reason = br#"{"reason":"x"}"#;
    let mut req = format!(
        "POST /api/v1/experiments/%FF%FE/kill HTTP/1.1\r\nhost: halo\r\nauthorization: Bearer {admin}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        reason.len()
    )
    .into_bytes();
    req.extend_from_slice(reason);
    let r = exchange(&api, req).await;
    assert_json_error("non-UTF-8 path parameter", &r, 400, "bad_request");

    // A good answer still passes untouched, on the same kind of connection.
    let r = exchange(&api, get("/api/v1/capabilities", "")).await;
    assert_eq!(r.0, 200, "{}", r.1);
    let v: Value = serde_json::from_slice(&r.2).expect("capabilities JSON");
    assert_eq!(v["killSwitch"], true);
    server.stop().await;
}
