//! halo-server over HTTP on loopback: every server row of ADR-0009's implementation
//! status table, plus enrollment, fleet, bad input and durability. The admin's identity
//! provider is a fake OIDC issuer on loopback (HTTPS, JWKS, real Ed25519 JWTs).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{SystemTime, UNIX_EPOCH};

use halo_policy::killswitch::{KillList, verify};
use serde_json::json;
use support::{Env, FLEET_TOKEN, GATEWAY_TOKEN, Reply, Server, serve};

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

async fn kill_list(env: &Env, server: &Server) -> KillList {
    let r = server
        .get("/api/v1/gateway/killswitch", Some(GATEWAY_TOKEN))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    verify(&r.raw, &env.killswitch_pub, now(), None).expect("the served list verifies")
}

fn assert_error(r: &Reply, status: u16, code: &str) {
    assert_eq!(r.status, status, "{:?}", r.body);
    assert_eq!(r.body["error"], code, "{:?}", r.body);
    assert!(
        r.body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{:?}",
        r.body
    );
}

// ADR-0009: TestKillEndpointsAuthz (admin auth; a reason is required, 422 without one;
// the kill lands in killswitch.jsonl and audit.jsonl).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_endpoints_authz() {
    let env = Env::new().await;
    let server = serve(&env.settings()).await;
    let path = "/api/v1/experiments/claude-opus-default/kill";
    let body = json!({"reason": "error rate 12%"});

    let r = server.post(path, None, body.clone()).await;
    assert_error(&r, 401, "authentication_error");
    let r = server.post(path, Some("not-a-jwt"), body.clone()).await;
    assert_error(&r, 401, "authentication_error");
    let forged = env.issuer.mint_with_foreign_key(json!({
        "aud": "api://halos", "email": "mallory@acme.com", "groups": ["halos-admins"]
    }));
    let r = server.post(path, Some(&forged), body.clone()).await;
    assert_error(&r, 401, "authentication_error");
    let wrong_aud = env.issuer.mint(json!({
        "aud": "another-app", "email": "alice@acme.com", "groups": ["halos-admins"]
    }));
    let r = server.post(path, Some(&wrong_aud), body.clone()).await;
    assert_error(&r, 401, "authentication_error");
    let r = server
        .post(path, Some(&env.user_token()), body.clone())
        .await;
    assert_error(&r, 403, "forbidden");
    assert!(env.log_lines("killswitch.jsonl").is_empty());

    let admin = env.admin_token();
    let r = server.post(path, Some(&admin), json!({})).await;
    assert_error(&r, 422, "invalid_body");
    assert!(r.body["message"].as_str().unwrap().contains("reason"));
    let r = server
        .post(path, Some(&admin), json!({"reason": "  "}))
        .await;
    assert_error(&r, 422, "reason_required");
    assert!(env.log_lines("killswitch.jsonl").is_empty());
    assert!(env.log_lines("audit.jsonl").is_empty());

    let r = server.post(path, Some(&admin), body.clone()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["killed"], true);
    let log = env.log_lines("killswitch.jsonl");
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["actor"], "alice@acme.com");
    assert_eq!(log[0]["action"], "kill");
    assert_eq!(log[0]["name"], "claude-opus-default");
    assert_eq!(log[0]["reason"], "error rate 12%");
    let audit = env.log_lines("audit.jsonl");
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0]["action"], "kill");

    let status = server.get("/api/v1/killswitch", Some(&admin)).await;
    assert_eq!(status.status, 200);
    assert_eq!(status.body["experiments"][0]["name"], "claude-opus-default");
    assert_eq!(status.body["experiments"][0]["by"], "alice@acme.com");
    let status = server
        .get("/api/v1/killswitch", Some(&env.user_token()))
        .await;
    assert_error(&status, 403, "forbidden");
    // The JWKS was fetched once and cached across every call above.
    let fetches = env
        .issuer
        .jwks_fetches
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(fetches, 1);
    server.stop().await;
}

// ADR-0009: TestToggleKillEndpoints, and "kills never expire; only unkill lifts"
// across a restart (which reloads the log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toggle_kill_endpoints_and_restart_reloads() {
    let env = Env::new().await;
    let admin = env.admin_token();
    let server = serve(&env.settings()).await;
    let r = server
        .post(
            "/api/v1/toggles/deep-reasoning/kill",
            Some(&admin),
            json!({"reason": "latency"}),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = server
        .post(
            "/api/v1/experiments/gpt-shadow/kill",
            Some(&admin),
            json!({"reason": "cost"}),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let list = kill_list(&env, &server).await;
    assert!(list.is_toggle_killed("deep-reasoning"));
    assert!(list.is_experiment_killed("gpt-shadow"));
    assert_eq!(list.version(), 2);
    server.stop().await;

    // Restart on the same data dir: the kills are still in force.
    let server = serve(&env.settings()).await;
    let list = kill_list(&env, &server).await;
    assert!(list.is_toggle_killed("deep-reasoning"));
    assert!(list.is_experiment_killed("gpt-shadow"));
    let r = server
        .post(
            "/api/v1/toggles/deep-reasoning/unkill",
            Some(&admin),
            json!({"reason": "fixed"}),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["killed"], false);
    let list = kill_list(&env, &server).await;
    assert!(!list.is_toggle_killed("deep-reasoning"));
    assert!(list.is_experiment_killed("gpt-shadow"));
    assert_eq!(list.version(), 3);
    server.stop().await;
}

// ADR-0009: TestKillRejectsInvalidNames: unknown names are 404 with a JSON body naming
// them, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_rejects_invalid_names() {
    let env = Env::new().await;
    let admin = env.admin_token();
    let server = serve(&env.settings()).await;
    for path in [
        "/api/v1/experiments/no-such-experiment/kill",
        "/api/v1/experiments/deep-reasoning/kill",
        "/api/v1/toggles/claude-opus-default/kill",
        "/api/v1/toggles/no-such-toggle/unkill",
        "/api/v1/experiments/%2E%2E%2Fetc/kill",
    ] {
        let r = server
            .post(path, Some(&admin), json!({"reason": "x"}))
            .await;
        assert_error(&r, 404, "unknown_name");
        assert!(r.body["name"].is_string(), "{:?}", r.body);
    }
    let r = server
        .post(
            "/api/v1/experiments/no-such-experiment/kill",
            Some(&admin),
            json!({"reason": "x"}),
        )
        .await;
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("no-such-experiment")
    );
    assert!(env.log_lines("killswitch.jsonl").is_empty());
    assert!(env.log_lines("audit.jsonl").is_empty());
    server.stop().await;
}

// ADR-0009: TestGatewayKillswitchEndpoint: {payload, signature} over
// "halo-killswitch-v1\n" + payload with the kill key; 401 without the gateway token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_killswitch_endpoint() {
    let env = Env::new().await;
    let server = serve(&env.settings()).await;
    let r = server.get("/api/v1/gateway/killswitch", None).await;
    assert_error(&r, 401, "authentication_error");
    let r = server
        .get(
            "/api/v1/gateway/killswitch",
            Some("0000000000000000000000000000000000000000000000000000000000000000"),
        )
        .await;
    assert_error(&r, 401, "authentication_error");
    // An admin JWT is not a gateway token.
    let r = server
        .get("/api/v1/gateway/killswitch", Some(&env.admin_token()))
        .await;
    assert_error(&r, 401, "authentication_error");

    let first = kill_list(&env, &server).await;
    assert!(first.experiments().is_empty());
    assert_eq!(first.version(), 0);
    let r = server
        .post(
            "/api/v1/experiments/claude-opus-default/kill",
            Some(&env.admin_token()),
            json!({"reason": "guardrail"}),
        )
        .await;
    assert_eq!(r.status, 200);
    let r = server
        .get("/api/v1/gateway/killswitch", Some(GATEWAY_TOKEN))
        .await;
    let body: serde_json::Value = serde_json::from_slice(&r.raw).unwrap();
    assert!(body["payload"]["issuedAt"].is_string());
    assert!(body["signature"].is_string());
    // Newer than the list held before: a gateway accepts it as an update.
    let second = verify(&r.raw, &env.killswitch_pub, now(), Some(&first)).unwrap();
    assert!(second.is_experiment_killed("claude-opus-default"));
    // Another key (say the release key) does not verify it.
    let other = halo_policy::keys::generate().unwrap();
    let other = halo_policy::keys::public_key_from_pem(&other.public_pem).unwrap();
    assert!(verify(&r.raw, &other, now(), None).is_err());
    server.stop().await;
}

// ADR-0009: TestKillWithoutKeyNotImplemented: no key, no pretence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_without_key_not_implemented() {
    let env = Env::new().await;
    let server = serve(&env.settings_without_kill_switch()).await;
    let caps = server.get("/api/v1/capabilities", None).await;
    assert_eq!(caps.status, 200);
    assert_eq!(caps.body["killSwitch"], false);
    let r = server
        .post(
            "/api/v1/experiments/claude-opus-default/kill",
            Some(&env.admin_token()),
            json!({"reason": "x"}),
        )
        .await;
    assert_error(&r, 501, "kill_switch_disabled");
    let r = server
        .get("/api/v1/gateway/killswitch", Some(GATEWAY_TOKEN))
        .await;
    assert_error(&r, 501, "kill_switch_disabled");
    assert!(env.log_lines("killswitch.jsonl").is_empty());
    server.stop().await;

    let server = serve(&env.settings()).await;
    let caps = server.get("/api/v1/capabilities", None).await;
    assert_eq!(caps.body["killSwitch"], true);
    server.stop().await;
}

// ADR-0009: TestKillAuditFailure: a kill stays applied if the audit append fails, a
// failed unkill is reverted, and both answer 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_audit_failure() {
    let env = Env::new().await;
    let admin = env.admin_token();
    let server = serve(&env.settings()).await;
    let audit = env.path("data").join("audit.jsonl");
    // Make audit appends fail: the path becomes a directory.
    std::fs::remove_file(&audit).unwrap();
    std::fs::create_dir(&audit).unwrap();

    let r = server
        .post(
            "/api/v1/experiments/claude-opus-default/kill",
            Some(&admin),
            json!({"reason": "breach"}),
        )
        .await;
    assert_error(&r, 500, "audit_failed");
    assert_eq!(r.body["killed"], true);
    assert!(
        kill_list(&env, &server)
            .await
            .is_experiment_killed("claude-opus-default")
    );

    let r = server
        .post(
            "/api/v1/experiments/claude-opus-default/unkill",
            Some(&admin),
            json!({"reason": "looks fine"}),
        )
        .await;
    assert_error(&r, 500, "audit_failed");
    assert_eq!(r.body["killed"], true);
    assert!(
        kill_list(&env, &server)
            .await
            .is_experiment_killed("claude-opus-default")
    );
    let log = env.log_lines("killswitch.jsonl");
    let actions: Vec<_> = log.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["kill", "unkill", "kill"]);
    assert_eq!(log[2]["actor"], "halo-server");
    server.stop().await;

    // The log is the truth after a restart too.
    std::fs::remove_dir(&audit).unwrap();
    let server = serve(&env.settings()).await;
    assert!(
        kill_list(&env, &server)
            .await
            .is_experiment_killed("claude-opus-default")
    );
    server.stop().await;
}

// Two concurrent kills of the same name both land in the log, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_kills_both_land_in_order() {
    let env = Env::new().await;
    let admin = env.admin_token();
    let server = serve(&env.settings()).await;
    let path = "/api/v1/experiments/gpt-shadow/kill";
    let (a, b) = tokio::join!(
        server.post(path, Some(&admin), json!({"reason": "first"})),
        server.post(path, Some(&admin), json!({"reason": "second"})),
    );
    assert_eq!((a.status, b.status), (200, 200));
    let mut versions = [
        a.body["version"].as_u64().unwrap(),
        b.body["version"].as_u64().unwrap(),
    ];
    versions.sort();
    assert_eq!(versions, [1, 2]);
    let log = env.log_lines("killswitch.jsonl");
    assert_eq!(log.len(), 2);
    assert_eq!(log[0]["seq"], 1);
    assert_eq!(log[1]["seq"], 2);
    let mut reasons: Vec<_> = log.iter().map(|r| r["reason"].as_str().unwrap()).collect();
    reasons.sort();
    assert_eq!(reasons, ["first", "second"]);
    server.stop().await;
}

// Malformed JSON, an oversized body, unknown fields, a wrong content type: 4xx with a
// JSON body naming the problem, and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_nothing_is_written() {
    let env = Env::new().await;
    let admin = env.admin_token();
    let server = serve(&env.settings()).await;
    let path = "/api/v1/experiments/gpt-shadow/kill";
    let r = server
        .post_raw(path, &admin, b"{\"reason\": ".to_vec())
        .await;
    assert_error(&r, 400, "malformed_json");
    let big = format!("{{\"reason\": \"{}\"}}", "x".repeat(8192));
    let r = server.post_raw(path, &admin, big.into_bytes()).await;
    assert_error(&r, 413, "body_too_large");
    let r = server
        .post(path, Some(&admin), json!({"reason": "x", "extra": 1}))
        .await;
    assert_error(&r, 422, "invalid_body");
    assert!(r.body["message"].as_str().unwrap().contains("extra"));
    let r = server
        .send(
            server
                .http
                .post(format!("{}{path}", server.base))
                .bearer_auth(&admin)
                .body("reason=x"),
        )
        .await;
    assert_error(&r, 415, "unsupported_media_type");
    let r = server.get("/api/v1/nope", None).await;
    assert_error(&r, 404, "not_found");
    let r = server.get(path, Some(&admin)).await;
    assert_error(&r, 405, "method_not_allowed");
    assert!(env.log_lines("killswitch.jsonl").is_empty());
    assert!(env.log_lines("audit.jsonl").is_empty());
    server.stop().await;
}

// Failed gateway-token attempts from one address are slowed, then blocked; a blocked
// address gets the same answer for the right token as for a wrong one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_address_cannot_tell_a_right_guess() {
    let env = Env::new().await;
    let server = serve(&env.settings()).await;
    let wrong = "9c41e07b3fa2d5688e1b0c7d4f5a2e939c41e07b3fa2d5688e1b0c7d4f5a2e93";
    let mut statuses = Vec::new();
    for _ in 0..halo_server::http::throttle::BLOCK_AFTER {
        statuses.push(
            server
                .get("/api/v1/gateway/killswitch", Some(wrong))
                .await
                .status,
        );
    }
    assert!(statuses.iter().all(|s| *s == 401), "{statuses:?}");
    let right = server
        .get("/api/v1/gateway/killswitch", Some(GATEWAY_TOKEN))
        .await;
    let wrong = server.get("/api/v1/gateway/killswitch", Some(wrong)).await;
    assert_error(&right, 429, "too_many_attempts");
    assert_eq!(right.raw, wrong.raw);
    assert_eq!(right.status, wrong.status);
    let metrics = server
        .send(server.http.get(format!("{}/metrics", server.admin_base)))
        .await;
    let text = String::from_utf8(metrics.raw).unwrap();
    assert!(text.contains("halo_server_blocked_addresses 1"), "{text}");
    server.stop().await;
}

// Enrollment: a one-time token for a device token; ring, kill list and report with the
// device token; admins list and revoke devices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrollment_ring_report_and_revoke() {
    let env = Env::new().await;
    let admin = env.admin_token();
    let server = serve(&env.settings()).await;
    let r = server
        .post(
            "/api/v1/enrollment-tokens",
            Some(&env.user_token()),
            json!({}),
        )
        .await;
    assert_error(&r, 403, "forbidden");
    let r = server
        .post(
            "/api/v1/enrollment-tokens",
            Some(&admin),
            json!({"user": "carol@acme.com", "groups": ["halos-canary"]}),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let enrollment = r.body["token"].as_str().unwrap().to_string();

    let r = server
        .post(
            "/api/v1/enroll",
            None,
            json!({"enrollmentToken": enrollment, "host": "carol-mbp"}),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let device_token = r.body["deviceToken"].as_str().unwrap().to_string();
    let device_id = r.body["deviceId"].as_str().unwrap().to_string();
    // One-time: the same enrollment token does not enroll twice.
    let again = server
        .post(
            "/api/v1/enroll",
            None,
            json!({"enrollmentToken": enrollment}),
        )
        .await;
    assert_error(&again, 401, "authentication_error");
    // The message says what happened and where the token goes (the body), not a header
    // (issue 27, item 6).
    let message = again.body["message"].as_str().unwrap();
    assert!(message.contains("already used"), "{message}");
    assert!(message.contains("enrollmentToken"), "{message}");
    assert!(!message.contains("Authorization"), "{message}");
    // Only digests are stored.
    let stored = std::fs::read_to_string(env.path("data").join("devices.jsonl")).unwrap()
        + &std::fs::read_to_string(env.path("data").join("enrollments.jsonl")).unwrap();
    assert!(!stored.contains(&device_token) && !stored.contains(&enrollment));

    let r = server
        .get(
            "/api/v1/fleet/ring?user=carol@acme.com&host=carol-mbp",
            Some(&device_token),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["ring"], "canary");
    assert_eq!(r.body["subject"], "carol@acme.com");
    assert_eq!(r.body["groups"], json!(["halos-canary"]));
    let r = server
        .get("/api/v1/fleet/ring?user=bob@acme.com", Some(&device_token))
        .await;
    assert_error(&r, 403, "forbidden");
    let r = server
        .get("/api/v1/fleet/ring?user=carol@acme.com", None)
        .await;
    assert_error(&r, 401, "authentication_error");

    // ADR-0009: TestFleetKillswitchEndpoint (halod polls the same signed list).
    let r = server
        .get("/api/v1/fleet/killswitch", Some(&device_token))
        .await;
    assert_eq!(r.status, 200);
    verify(&r.raw, &env.killswitch_pub, now(), None).unwrap();
    let r = server
        .get("/api/v1/fleet/killswitch", Some(GATEWAY_TOKEN))
        .await;
    assert_error(&r, 401, "authentication_error");

    let status = json!({"ring": "canary", "digest": "sha256:ab", "ok": true});
    let r = server
        .post("/api/v1/fleet/report", Some(&device_token), status.clone())
        .await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    let r = server
        .post("/api/v1/fleet/report", Some(FLEET_TOKEN), status.clone())
        .await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    let r = server
        .post("/api/v1/fleet/report", Some(GATEWAY_TOKEN), status.clone())
        .await;
    assert_error(&r, 401, "authentication_error");
    assert_eq!(env.log_lines("reports.jsonl").len(), 2);

    let r = server.get("/api/v1/devices", Some(&admin)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["devices"][0]["id"], device_id.as_str());
    assert_eq!(r.body["devices"][0]["host"], "carol-mbp");
    assert!(r.body["devices"][0]["lastReportAt"].is_string());
    let r = server
        .post(
            &format!("/api/v1/devices/{device_id}/revoke"),
            Some(&admin),
            json!({}),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["revoked"], true);
    let r = server
        .get(
            "/api/v1/fleet/ring?user=carol@acme.com",
            Some(&device_token),
        )
        .await;
    assert_error(&r, 401, "authentication_error");
    let r = server
        .post("/api/v1/devices/dev-nope/revoke", Some(&admin), json!({}))
        .await;
    assert_error(&r, 404, "unknown_device");
    server.stop().await;

    // Revocation survives a restart.
    let server = serve(&env.settings()).await;
    let r = server
        .get(
            "/api/v1/fleet/ring?user=carol@acme.com",
            Some(&device_token),
        )
        .await;
    assert_error(&r, 401, "authentication_error");
    server.stop().await;
}

// /healthz and /metrics are on the admin listener, not the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metrics_on_the_admin_listener() {
    let env = Env::new().await;
    let server = serve(&env.settings()).await;
    let r = server
        .send(server.http.get(format!("{}/healthz", server.admin_base)))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["status"], "ok");
    server.get("/api/v1/capabilities", None).await;
    let r = server
        .send(server.http.get(format!("{}/metrics", server.admin_base)))
        .await;
    let text = String::from_utf8(r.raw).unwrap();
    assert!(
        text.contains(
            "halo_server_http_requests_total{method=\"GET\",route=\"/api/v1/capabilities\",status=\"200\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains("halo_server_kill_switch_enabled 1"));
    assert_eq!(server.get("/healthz", None).await.status, 404);
    assert_eq!(server.get("/metrics", None).await.status, 404);
    server.stop().await;
}

// The watch channel the xDS server will subscribe to sees a kill at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_see_a_kill_at_once() {
    let env = Env::new().await;
    let server = serve(&env.settings()).await;
    let ks = server.killswitch();
    let mut rx = ks.subscribe();
    rx.borrow_and_update();
    let r = server
        .post(
            "/api/v1/experiments/gpt-shadow/kill",
            Some(&env.admin_token()),
            json!({"reason": "x"}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(rx.has_changed().unwrap());
    let signed = rx.borrow_and_update().clone();
    let list = verify(&signed.envelope, &env.killswitch_pub, now(), None).unwrap();
    assert!(list.is_experiment_killed("gpt-shadow"));
    server.stop().await;
}
