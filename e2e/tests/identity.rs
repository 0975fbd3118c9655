//! Identity, admit and header hygiene through a real Envoy (jwt_authn + the halo filter).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use halo_e2e::*;
use serde_json::{Value, json};

async fn setup() -> (Issuer, Providers, Gateway) {
    let issuer = Issuer::start().await;
    let providers = Providers::start().await;
    let snap = test_snapshot(&issuer.url, &providers);
    let gw = Gateway::start(snap, GatewayOptions::default());
    (issuer, providers, gw)
}

fn msg(model: &str) -> Value {
    json!({"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_jwt_is_routed_alias_rewritten_ring_and_release_stamped() {
    let (issuer, p, gw) = setup().await;
    let token = bearer(&issuer.token("dave@acme.test", &["eng"]));
    let body = json!({"model": "haiku", "max_tokens": 5, "metadata": {"n": 1.50},
        "messages": [{"role": "user", "content": "h\u{e9}llo \"q\""}]});
    let a = gw
        .post("/v1/messages", &[("authorization", &token)], &body)
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.header("x-provider"), Some("prov-a"));
    let seen = p.a.seen();
    assert_eq!(seen.len(), 1);
    let s = &seen[0];
    assert_eq!(s.json()["model"], "claude-haiku-4-5");
    // Only the model's bytes changed: the rest is byte-identical to what the client sent.
    let sent = body
        .to_string()
        .replace("\"haiku\"", "\"claude-haiku-4-5\"");
    assert_eq!(String::from_utf8_lossy(&s.body), sent);
    assert_eq!(s.header("x-halo-ring"), Some("general"));
    assert_eq!(s.header("x-halo-release"), Some("sha256:0123abcd"));

    // The canary ring by user claim; no release pinned there.
    let token = bearer(&issuer.token("alice@acme.test", &[]));
    let a = gw
        .post("/v1/messages", &[("authorization", &token)], &msg("haiku"))
        .await;
    assert_eq!(a.status, 200);
    let s = p.a.seen().pop().expect("second request");
    assert_eq!(s.header("x-halo-ring"), Some("canary"));
    assert_eq!(s.header("x-halo-release"), None);
    // And by group claim.
    let token = bearer(&issuer.token("erin@acme.test", &["canary-group"]));
    gw.post("/v1/messages", &[("authorization", &token)], &msg("haiku"))
        .await;
    assert_eq!(
        p.a.seen().pop().expect("third").header("x-halo-ring"),
        Some("canary")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_forged_expired_wrong_audience_garbage_and_unverified_tokens_are_401() {
    let (issuer, p, gw) = setup().await;
    let now = now_unix();
    let mut expired = issuer.claims("dave@acme.test", &[]);
    expired["iat"] = json!(now - 7200);
    expired["exp"] = json!(now - 3600);
    let mut wrong_aud = issuer.claims("dave@acme.test", &[]);
    wrong_aud["aud"] = json!("api://someone-else");
    let mut unverified = issuer.claims("dave@acme.test", &[]);
    unverified["email_verified"] = json!(false);
    let mut no_verified_claim = issuer.claims("dave@acme.test", &[]);
    no_verified_claim
        .as_object_mut()
        .expect("object")
        .remove("email_verified");
    let cases: Vec<(&str, Option<String>)> = vec![
        ("missing", None),
        (
            "forged",
            Some(issuer.forge(&issuer.claims("dave@acme.test", &[]))),
        ),
        ("expired", Some(issuer.mint(&expired))),
        ("wrong audience", Some(issuer.mint(&wrong_aud))),
        ("garbage", Some("not-a-jwt".to_string())),
        (
            "garbage segments",
            Some("eyJhbGciOiJFUzI1NiJ9.e30.AAAA".to_string()),
        ),
        ("email_verified false", Some(issuer.mint(&unverified))),
        (
            "email_verified absent",
            Some(issuer.mint(&no_verified_claim)),
        ),
    ];
    for (what, token) in cases {
        let auth = token.map(|t| bearer(&t));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("authorization", a.as_str())).collect();
        let a = gw.post("/v1/messages", &headers, &msg("haiku")).await;
        assert_eq!(a.status, 401, "{what}: {}", a.text());
        assert_eq!(
            a.header("www-authenticate"),
            Some("Bearer realm=\"halos\""),
            "{what}"
        );
        assert_eq!(a.json()["error"]["type"], "authentication_error", "{what}");
    }
    assert_eq!(p.total(), 0, "no refused request reached an upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_credentials_never_reach_the_upstream() {
    let (issuer, p, gw) = setup().await;
    let token = bearer(&issuer.token("dave@acme.test", &[]));
    let a = gw
        .post(
            "/v1/messages",
            &[
                ("authorization", &token),
                ("x-api-key", "sk-ant-client-secret"),
                ("api-key", "azure-client-secret"),
                ("x-goog-api-key", "goog-client-secret"),
                ("proxy-authorization", "Basic cHJveHk6c2VjcmV0"),
                ("anthropic-version", "2023-06-01"),
            ],
            &msg("haiku"),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let s = p.a.seen().pop().expect("routed");
    for h in [
        "authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "proxy-authorization",
    ] {
        assert_eq!(s.header(h), None, "{h} reached the upstream");
    }
    assert_eq!(
        s.header("anthropic-version"),
        Some("2023-06-01"),
        "other headers pass"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_halo_headers_are_stripped_and_not_used_for_the_decision() {
    let (issuer, p, gw) = setup().await;
    let token = bearer(&issuer.token("dave@acme.test", &[]));
    let a = gw
        .post(
            "/v1/messages",
            &[
                ("authorization", &token),
                ("x-halo-ring", "canary"),
                ("x-halo-route", "halo-upstream-prov-b"),
                ("x-halo-experiment", "sonnet-canary"),
                ("x-halo-variant", "canary"),
                ("x-halo-killswitch", "misconfigured"),
                ("x-halo-user", "alice@acme.test"),
            ],
            &msg("haiku"),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(
        a.header("x-provider"),
        Some("prov-a"),
        "the client's route header was ignored"
    );
    assert_eq!(p.b.count(), 0);
    let s = p.a.seen().pop().expect("routed");
    assert_eq!(
        s.header("x-halo-ring"),
        Some("general"),
        "ring from the token, not the header"
    );
    assert_eq!(s.header("x-halo-experiment"), None);
    assert_eq!(s.header("x-halo-variant"), None);
    assert_eq!(s.header("x-halo-killswitch"), None);
    assert_eq!(s.header("x-halo-user"), None);
    // The route header chose the cluster (the alias's aggregate) and is removed before the
    // upstream, as in xDS mode.
    assert_eq!(s.header("x-halo-route"), None);
    let halo: Vec<_> = s
        .headers
        .iter()
        .filter(|(n, _)| n.starts_with("x-halo-"))
        .collect();
    assert_eq!(halo.len(), 2, "only the gateway's own stamps: {halo:?}");
}

/// The header through which jwt_authn hands the native build a verified payload: a
/// client's copy must never name the caller, with or without a token of its own. (jwt_authn
/// removes a client's copy before it verifies; the native filter also believes the header
/// only when jwt_authn's metadata says it verified a token.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_jwt_payload_header_never_names_the_caller() {
    use base64::Engine as _;
    let (issuer, p, gw) = setup().await;
    // alice is in the canary ring; dave is not.
    let forged = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(
        json!({"email": "alice@acme.test", "email_verified": true, "groups": ["canary-group"]})
            .to_string(),
    );
    let header = halo_contract::names::JWT_PAYLOAD_HEADER;

    // No token: the forged payload is not a verified one.
    let a = gw
        .post("/v1/messages", &[(header, &forged)], &msg("haiku"))
        .await;
    assert_eq!(a.status, 401, "{}", a.text());
    assert_eq!(p.a.count() + p.b.count(), 0);

    // dave's token beside alice's forged payload: dave or nobody, never alice.
    let token = bearer(&issuer.token("dave@acme.test", &[]));
    let a = gw
        .post(
            "/v1/messages",
            &[("authorization", &token), (header, &forged)],
            &msg("haiku"),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let s = p.a.seen().pop().expect("routed");
    assert_eq!(s.header("x-halo-ring"), Some("general"), "routed as dave");
    assert_eq!(
        s.header(header),
        None,
        "the payload header never leaves Envoy"
    );

    // dave alone: routed as dave, and the header jwt_authn forwarded is stripped.
    let a = gw
        .post("/v1/messages", &[("authorization", &token)], &msg("haiku"))
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let s = p.a.seen().pop().expect("routed");
    assert_eq!(s.header("x-halo-ring"), Some("general"));
    assert_eq!(s.header(header), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_model_batches_and_non_model_paths_are_refused_before_any_upstream() {
    let (issuer, p, gw) = setup().await;
    let token = bearer(&issuer.token("dave@acme.test", &[]));
    let auth = [("authorization", token.as_str())];
    let a = gw
        .post("/v1/messages", &auth, &msg("claude-3-opus-20240229"))
        .await;
    assert_eq!(a.status, 400, "{}", a.text());
    assert_eq!(a.json()["error"]["type"], "invalid_request_error");
    let a = gw
        .post("/v1/messages", &auth, &json!({"messages": []}))
        .await;
    assert_eq!(a.status, 400, "no model: {}", a.text());
    let a = gw
        .post("/v1/messages/batches", &auth, &json!({"requests": []}))
        .await;
    assert_eq!(a.status, 400, "batches: {}", a.text());
    let a = gw.post("/v1/complete", &auth, &msg("haiku")).await;
    assert_eq!(a.status, 404, "{}", a.text());
    assert_eq!(a.json()["error"]["type"], "not_found_error");
    let a = gw.send(reqwest::Method::GET, "/admin", &auth, vec![]).await;
    assert_eq!(a.status, 404);
    let a = gw
        .send(reqwest::Method::GET, "/v1/messages", &auth, vec![])
        .await;
    assert_eq!(a.status, 404, "GET on a POST path");
    assert_eq!(p.total(), 0, "nothing reached an upstream");

    // GET /v1/models passes through (to the first target of the first alias here).
    let a = gw
        .send(reqwest::Method::GET, "/v1/models", &auth, vec![])
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["data"][0]["type"], "model");
    assert_eq!(p.total(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_body_is_413_and_never_reaches_an_upstream() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let snap = test_snapshot(&issuer.url, &p);
    let gw = Gateway::start(
        snap,
        GatewayOptions {
            settings: json!({"maxBodyBytes": 4096}),
            ..GatewayOptions::default()
        },
    );
    let token = bearer(&issuer.token("dave@acme.test", &[]));
    let big =
        json!({"model": "haiku", "messages": [{"role": "user", "content": "x".repeat(8192)}]});
    let a = gw
        .post("/v1/messages", &[("authorization", &token)], &big)
        .await;
    assert_eq!(a.status, 413, "{}", a.text());
    assert_eq!(a.json()["error"]["type"], "request_too_large");
    // Just under the bound passes.
    let ok = json!({"model": "haiku", "messages": [{"role": "user", "content": "x".repeat(3000)}]});
    let a = gw
        .post("/v1/messages", &[("authorization", &token)], &ok)
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(p.total(), 1);

    // Chunked (no content-length): the filter counts the body as it arrives.
    let port = gw.port;
    let status = tokio::task::spawn_blocking(move || chunked_post(port, &token, 8))
        .await
        .expect("join");
    assert_eq!(status, 413);
    assert_eq!(
        p.total(),
        1,
        "the chunked oversize request never reached an upstream"
    );
}

/// POST /v1/messages with `chunks` chunks of 1 KiB (a body growing past 4 KiB), chunked.
fn chunked_post(port: u16, auth: &str, chunks: usize) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: gw\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let _ = s.write_all(head.as_bytes());
    let first = r#"{"model":"haiku","messages":[{"role":"user","content":""#;
    let _ = s.write_all(format!("{:x}\r\n{first}\r\n", first.len()).as_bytes());
    for _ in 0..chunks {
        let chunk = "x".repeat(1024);
        if s.write_all(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes())
            .is_err()
        {
            break;
        }
    }
    let _ = s.write_all(b"4\r\n\"}]}\r\n0\r\n\r\n");
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n])
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_header_identity_duplicate_header_and_stripping() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let snap = test_snapshot(&issuer.url, &p);
    let gw = Gateway::start(
        snap,
        GatewayOptions {
            settings: json!({"identity": {
                "mode": "trusted_header",
                "identityHeader": "X-Forwarded-User",
                "groupsHeader": "x-forwarded-groups",
                "trustedProxyCIDRs": ["127.0.0.0/8"],
            }}),
            ..GatewayOptions::default()
        },
    );
    let a = gw
        .post(
            "/v1/messages",
            &[
                ("x-forwarded-user", "zed@acme.test"),
                ("x-forwarded-groups", "eng, canary-group"),
            ],
            &msg("haiku"),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let s = p.a.seen().pop().expect("routed");
    assert_eq!(
        s.header("x-halo-ring"),
        Some("canary"),
        "groups from the trusted header"
    );
    assert_eq!(
        s.header("x-forwarded-user"),
        None,
        "identity header stripped"
    );
    assert_eq!(
        s.header("x-forwarded-groups"),
        None,
        "groups header stripped"
    );

    let a = gw
        .post(
            "/v1/messages",
            &[
                ("x-forwarded-user", "zed@acme.test"),
                ("x-forwarded-user", "alice@acme.test"),
            ],
            &msg("haiku"),
        )
        .await;
    assert_eq!(a.status, 400, "{}", a.text());
    let a = gw.post("/v1/messages", &[], &msg("haiku")).await;
    assert_eq!(a.status, 401, "no identity from the proxy");
    assert_eq!(p.total(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_mode_duplicate_credential_is_400_and_allow_anonymous_routes_ring_unknown() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let snap = test_snapshot(&issuer.url, &p);
    let gw = Gateway::start(
        snap,
        GatewayOptions {
            settings: json!({"identity": {"allowAnonymous": true}}),
            ..GatewayOptions::default()
        },
    );
    let token = bearer(&issuer.token("dave@acme.test", &[]));
    let a = gw
        .post(
            "/v1/messages",
            &[("authorization", &token), ("authorization", &token)],
            &msg("haiku"),
        )
        .await;
    assert_eq!(a.status, 400, "{}", a.text());
    // A garbage token is downgraded to anonymous: default routing, ring unknown, no
    // experiment even on an alias with a canary.
    let a = gw
        .post(
            "/v1/messages",
            &[("authorization", "Bearer garbage")],
            &msg("sonnet"),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let s = p.a.seen().pop().expect("routed");
    assert_eq!(s.header("x-halo-ring"), Some("unknown"));
    assert_eq!(s.header("x-halo-experiment"), None);
    assert_eq!(s.json()["model"], "claude-sonnet-4-5-20250929");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_issuer_no_cidrs_no_mode_is_503() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let mut snap = test_snapshot(&issuer.url, &p);
    snap.identity = None;
    let gw = Gateway::start(snap, GatewayOptions::default());
    let a = gw.post("/v1/messages", &[], &msg("haiku")).await;
    assert_eq!(a.status, 503, "{}", a.text());
    assert_eq!(a.json()["error"]["type"], "policy_unavailable");
    assert_eq!(p.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_wire_with_x_goog_api_key_works_and_the_key_is_not_forwarded() {
    let (issuer, p, gw) = setup().await;
    let token = issuer.token("dave@acme.test", &[]);
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let a = gw
        .post(
            "/v1beta/models/gemini-pro:generateContent",
            &[("x-goog-api-key", &token)],
            &body,
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let s = p.gemini.seen().pop().expect("routed to gemini");
    assert_eq!(s.path, "/v1beta/models/gemini-2.5-pro:generateContent");
    assert_eq!(s.header("x-goog-api-key"), None);
    assert_eq!(s.header("x-halo-ring"), Some("general"));

    // The token as ?key= works on the gemini wire too, and is removed from the query.
    let path = format!("/v1beta/models/gemini-pro:streamGenerateContent?alt=sse&key={token}");
    let a = gw.post(&path, &[], &body).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let s = p.gemini.seen().pop().expect("routed to gemini");
    assert_eq!(
        s.path,
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    );

    // x-goog-api-key is a token on the gemini wire only.
    let a = gw
        .post("/v1/messages", &[("x-goog-api-key", &token)], &msg("haiku"))
        .await;
    assert_eq!(a.status, 401);
    assert_eq!(p.a.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_responses_wire_is_routed_with_the_model_rewritten() {
    let (issuer, p, gw) = setup().await;
    let token = bearer(&issuer.token("dave@acme.test", &[]));
    let a = gw
        .post(
            "/v1/responses",
            &[("authorization", &token)],
            &json!({"model": "gpt", "input": "hi"}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let s = p.openai.seen().pop().expect("routed to openai");
    assert_eq!(s.json()["model"], "gpt-5-codex");
    assert_eq!(s.json()["input"], "hi");
}

/// How [`post_in_pieces`] frames the body.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Framing {
    /// One HTTP chunk per piece, no length announced.
    Chunked,
    /// The pieces' total announced as `content-length`, then the pieces as raw bytes.
    Length,
}

/// Write a POST /v1/messages whose body is `pieces`, with a short pause between them so
/// Envoy reads them as separate pieces (what a slow upload looks like; the assertions
/// hold however Envoy happens to group them). With `finish` false a chunked body is left
/// open after the last piece. Returns the raw response head and body read within 10 s,
/// or what arrived by then.
fn post_in_pieces(
    port: u16,
    auth: &str,
    pieces: &[&[u8]],
    framing: Framing,
    finish: bool,
) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    let length = match framing {
        Framing::Chunked => "Transfer-Encoding: chunked".to_string(),
        Framing::Length => format!(
            "Content-Length: {}",
            pieces.iter().map(|p| p.len()).sum::<usize>()
        ),
    };
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: gw\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\n{length}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).expect("head");
    for piece in pieces {
        let mut chunk = Vec::new();
        if framing == Framing::Chunked {
            chunk.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        }
        chunk.extend_from_slice(piece);
        if framing == Framing::Chunked {
            chunk.extend_from_slice(b"\r\n");
        }
        if s.write_all(&chunk).is_err() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if finish && framing == Framing::Chunked {
        let _ = s.write_all(b"0\r\n\r\n");
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                // One response: stop once its body (JSON) is complete.
                let text = String::from_utf8_lossy(&out);
                if let Some((_, body)) = text.split_once("\r\n\r\n")
                    && serde_json::from_str::<Value>(body.trim()).is_ok()
                {
                    break;
                }
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_arriving_in_pieces_is_scanned_on_the_way_and_forwarded_intact() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let gw = Gateway::start(test_snapshot(&issuer.url, &p), GatewayOptions::default());
    let token = bearer(&issuer.token("dave@acme.test", &[]));

    // Escapes, unicode, numbers and nesting, cut at awkward places: inside the "model"
    // key, inside escapes and a \u escape, inside a number and a literal.
    let turn =
        r#"{"role":"user","content":"quote \" back\\slash caf\u00e9 tab\t","n":-12.5e3,"ok":true}"#;
    let body = format!(
        r#"{{"model":"haiku","max_tokens":16,"messages":[{}]}}"#,
        vec![turn; 2000].join(",")
    );
    let bytes = body.as_bytes();
    let cuts = [
        4,
        11,
        40,
        45,
        57,
        79,
        86,
        95,
        1000,
        70_000,
        70_003,
        bytes.len() - 2,
    ];
    let mut pieces = Vec::new();
    let mut at = 0;
    for cut in cuts {
        pieces.push(bytes[at..cut].to_vec());
        at = cut;
    }
    pieces.push(bytes[at..].to_vec());
    let gw = (gw.port, token);
    forwarded_with_only_the_model_changed(gw.clone(), &body, pieces, Framing::Length, &p).await;

    // In pieces of 64 KB, the native build's rewrite at the end (above, with a long
    // announced rest, it edits the model as soon as it has arrived), with the model where
    // Envoy holds it then: chunked, a last empty piece ends the body, so the model is in
    // what Envoy buffered, first or last; with a length and the model last, it is in the
    // last piece, after the buffered rest.
    let in_64k = |body: &str| -> Vec<Vec<u8>> {
        body.as_bytes()
            .chunks(64 * 1024)
            .map(<[u8]>::to_vec)
            .collect()
    };
    forwarded_with_only_the_model_changed(gw.clone(), &body, in_64k(&body), Framing::Chunked, &p)
        .await;
    let body = format!(
        r#"{{"max_tokens":16,"messages":[{}],"model":"haiku"}}"#,
        vec![turn; 2000].join(",")
    );
    for framing in [Framing::Chunked, Framing::Length] {
        forwarded_with_only_the_model_changed(gw.clone(), &body, in_64k(&body), framing, &p).await;
    }
}

/// Send `body`, cut into `pieces`, to the gateway (port, authorization) as dave: answered
/// 200, and prov-a (which serves his haiku) got the client's bytes with only the model
/// changed.
async fn forwarded_with_only_the_model_changed(
    (port, auth): (u16, String),
    body: &str,
    pieces: Vec<Vec<u8>>,
    framing: Framing,
    p: &Providers,
) {
    let before = p.a.count();
    let answer = tokio::task::spawn_blocking(move || {
        let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        post_in_pieces(port, &auth, &pieces, framing, true)
    })
    .await
    .expect("join");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let seen = p.a.seen();
    assert_eq!(seen.len(), before + 1, "prov-a serves haiku");
    let expected = body.replacen(r#""model":"haiku""#, r#""model":"claude-haiku-4-5""#, 1);
    assert!(
        seen[before].body == expected.as_bytes(),
        "the upstream got the client's bytes with only the model changed ({framing:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_invalid_early_is_refused_before_it_is_complete() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let gw = Gateway::start(test_snapshot(&issuer.url, &p), GatewayOptions::default());
    let token = bearer(&issuer.token("dave@acme.test", &[]));
    // `,]` can never become valid JSON, whatever follows; the client never ends the body.
    let port = gw.port;
    let answer = tokio::task::spawn_blocking(move || {
        post_in_pieces(
            port,
            &token,
            &[br#"{"model":"haiku","messages":[1,"#, b"]"],
            Framing::Chunked,
            false,
        )
    })
    .await
    .expect("join");
    assert!(answer.starts_with("HTTP/1.1 400"), "answer: {answer:?}");
    assert!(answer.contains("not valid JSON"), "{answer}");
    assert_eq!(p.total(), 0, "nothing reached an upstream");
}
