//! halo-server's API reads the policy it serves now (issue 27, item 1): an experiment
//! merged into the policy dir can be killed, a ring edit moves a device's ring, an
//! identity edit applies to the next admin call, and capabilities name the new version,
//! all without a restart; a refused edit changes none of it. Both with and without
//! `--xds-listen` (the same policy source feeds the API and the xDS server).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Env, Server, serve};

/// Ask `path` with `token` until `done` holds (bounded: the policy dir is checked every
/// 250 ms).
async fn until(server: &Server, path: &str, token: Option<&str>, done: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = server.get(path, token).await;
        if done(&r.body) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "GET {path} never changed: {:?}",
            r.body
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn version(server: &Server) -> String {
    let r = server.get("/api/v1/capabilities", None).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body["policy"]["version"]
        .as_str()
        .expect("version")
        .to_string()
}

async fn edits_apply_without_a_restart(xds: bool) {
    let env = Env::new().await;
    let policy = env.path("policy");
    let mut settings = env.settings();
    if xds {
        settings.xds_listen = Some("127.0.0.1:0".parse().expect("addr"));
    }
    let server = serve(&settings).await;
    let admin = env.admin_token();
    let reason = json!({"reason": "error rate 12%"});
    let kill = "/api/v1/experiments/opus-canary-2/kill";

    // Not in the policy yet: 404 unknown_name.
    let r = server.post(kill, Some(&admin), reason.clone()).await;
    assert_eq!(r.status, 404, "{:?}", r.body);
    assert_eq!(r.body["error"], "unknown_name");

    // A device enrolled for erin, who is in no ring list: she lands in `general`.
    let r = server
        .post(
            "/api/v1/enrollment-tokens",
            Some(&admin),
            json!({"user": "erin@acme.com"}),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let enrollment = r.body["token"].as_str().expect("token").to_string();
    let r = server
        .post(
            "/api/v1/enroll",
            None,
            json!({"enrollmentToken": enrollment}),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let device = r.body["deviceToken"]
        .as_str()
        .expect("device token")
        .to_string();
    let r = server.get("/api/v1/fleet/ring", Some(&device)).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_ne!(r.body["ring"], "canary");

    // A refused edit (an unknown field) changes nothing the API answers.
    let old = version(&server).await;
    std::fs::write(
        policy.join("experiments/opus-canary-2.yaml"),
        std::fs::read_to_string(policy.join("experiments/gpt-shadow.yaml"))
            .expect("gpt-shadow.yaml")
            .replace("name: gpt-shadow", "name: opus-canary-2\nsurprise: 1"),
    )
    .expect("write the refused experiment");
    // The refusal is on /metrics (with or without xDS): wait for it, bounded.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = server
            .http
            .get(format!("{}/metrics", server.admin_base))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text");
        if text.contains("halo_policy_reloads_total{outcome=\"refused\"} 1\n") {
            break;
        }
        assert!(Instant::now() < deadline, "never refused:\n{text}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let r = server.post(kill, Some(&admin), reason.clone()).await;
    assert_eq!(r.status, 404, "{:?}", r.body);
    assert_eq!(version(&server).await, old);

    // The experiment is merged (valid now) and erin joins the canary ring.
    std::fs::write(
        policy.join("experiments/opus-canary-2.yaml"),
        std::fs::read_to_string(policy.join("experiments/gpt-shadow.yaml"))
            .expect("gpt-shadow.yaml")
            .replace("name: gpt-shadow", "name: opus-canary-2")
            .replace("salt: gpt-shadow-5-1-codex", "salt: opus-canary-2"),
    )
    .expect("write the experiment");
    let rings = policy.join("rings/rings.yaml");
    let text = std::fs::read_to_string(&rings).expect("rings.yaml");
    std::fs::write(
        &rings,
        text.replacen(
            "    - bob@acme.com\n",
            "    - bob@acme.com\n    - erin@acme.com\n",
            1,
        ),
    )
    .expect("edit rings.yaml");
    until(&server, "/api/v1/capabilities", None, |b| {
        b["policy"]["version"] != old.as_str()
    })
    .await;
    let r = server.post(kill, Some(&admin), reason.clone()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["killed"], true);
    let r = server.get("/api/v1/fleet/ring", Some(&device)).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["ring"], "canary");

    // The identity is the served one too: halos-admins loses admin rights.
    let root = policy.join("halos.yaml");
    let text = std::fs::read_to_string(&root).expect("halos.yaml");
    std::fs::write(&root, text.replace("    - halos-admins\n", "")).expect("edit halos.yaml");
    let before = version(&server).await;
    until(&server, "/api/v1/capabilities", None, |b| {
        b["policy"]["version"] != before.as_str()
    })
    .await;
    let r = server.get("/api/v1/killswitch", Some(&admin)).await;
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert_eq!(r.body["error"], "forbidden");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_follows_policy_edits() {
    edits_apply_without_a_restart(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_follows_policy_edits_with_xds() {
    edits_apply_without_a_restart(true).await;
}
