//! xDS mode end to end: an Envoy booted from envoy/ads.yaml alone gets its listener (jwt_authn,
//! the halo filter by ECDS, router), routes and clusters from halo-xds, and serves
//! JWT-authenticated model calls of the test policy through the filter.

use std::time::Duration;

use halo_e2e::{Gateway, Issuer, Providers, bearer, test_snapshot};
use halo_testkit::free_port;
use halo_xds::{GatewaySettings, NodeKey, SnapshotCache, snapshot_of};
use serde_json::{Value, json};

fn msg(model: &str) -> Value {
    json!({"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
}

fn settings(port: u16) -> GatewaySettings {
    halo_e2e::xds::settings(port)
}

/// The variable holding prov-b's key in Envoy's environment (see the credential test).
const PROV_B_KEY_ENV: &str = "HALO_TEST_PROV_B_KEY";
const PROV_B_KEY: &str = "sk-prov-b-gateway-own";

/// An Envoy from ads.yaml as node `node`, served `snap` by a fresh cache (returned, for
/// policy changes), listening on a free port.
async fn gateway(snap: &halo_policy::Snapshot, node: &str) -> (SnapshotCache, Gateway) {
    let (ads, gw) = halo_e2e::xds::gateway(
        snap,
        &settings(free_port()),
        node,
        &[(PROV_B_KEY_ENV, Some(PROV_B_KEY))],
    )
    .await;
    (ads.cache.clone(), gw)
}

/// POST until the answer satisfies `done` (bounded).
async fn poll(gw: &Gateway, token: &str, model: &str, done: impl Fn(u16, &Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let a = gw
            .client
            .post(format!("{}/v1/messages", gw.base))
            .header("authorization", token)
            .json(&msg(model))
            .send()
            .await;
        if let Ok(a) = a {
            let status = a.status().as_u16();
            let body: Value = a.json().await.unwrap_or(Value::Null);
            if done(status, &body) {
                return body;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no matching answer in time; Envoy log:\n{}",
            gw.envoy.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_split_over_1000_users_is_within_3_points_and_sticky_through_xds() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let snap = test_snapshot(&issuer.url, &p);
    let (_cache, gw) = gateway(&snap, "gw-split").await;
    let first = bearer(&issuer.token("user0@acme.test", &[]));
    poll(&gw, &first, "weighted", |s, _| s == 200).await;

    // "weighted" is 50/50 prov-a (model-a) / prov-b (model-b), sticky per user + session.
    let mut on_a = 0usize;
    for n in 0..1000 {
        let token = bearer(&issuer.token(&format!("user{n}@acme.test"), &[]));
        let session = format!("s-{n}");
        let headers = [
            ("authorization", token.as_str()),
            ("x-claude-code-session-id", session.as_str()),
        ];
        let a = gw.post("/v1/messages", &headers, &msg("weighted")).await;
        assert_eq!(a.status, 200, "{}", a.text());
        let provider = a.json()["provider"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let model = a.json()["model"].as_str().unwrap_or_default().to_string();
        match provider.as_str() {
            "prov-a" => {
                assert_eq!(model, "model-a");
                on_a += 1;
            }
            "prov-b" => assert_eq!(model, "model-b"),
            other => panic!("unexpected provider {other:?}"),
        }
        // Sticky: the same user and session lands on the same target again.
        if n % 50 == 0 {
            let again = gw.post("/v1/messages", &headers, &msg("weighted")).await;
            assert_eq!(again.json()["provider"].as_str(), Some(provider.as_str()));
        }
    }
    let share = on_a as f64 / 10.0;
    assert!(
        (47.0..=53.0).contains(&share),
        "prov-a got {share}% of 1,000 users"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_from_ads_yaml_alone_serves_jwt_calls_through_the_filter() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let snap = test_snapshot(&issuer.url, &p);
    let (cache, gw) = gateway(&snap, "gw-e2e").await;
    let token = bearer(&issuer.token("dave@acme.test", &[]));

    // The filter rewrote the alias to the target's model and routed to its aggregate.
    let body = poll(&gw, &token, "haiku", |s, _| s == 200).await;
    assert_eq!(body["provider"], "prov-a", "{body}");
    assert_eq!(body["model"], "claude-haiku-4-5");
    let seen = p.a.seen().pop().expect("prov-a got the call");
    assert_eq!(seen.header("x-halo-ring"), Some("general"));
    assert_eq!(seen.header("authorization"), None, "credentials stripped");
    assert_eq!(seen.header("x-halo-route"), None);

    // jwt_authn is in the chain: no token, and a forged one, are refused by the filter.
    let a = gw.post("/v1/messages", &[], &msg("haiku")).await;
    assert_eq!(a.status, 401, "{}", a.text());
    let forged = bearer(&issuer.forge(&issuer.claims("dave@acme.test", &[])));
    let a = gw
        .post("/v1/messages", &[("authorization", &forged)], &msg("haiku"))
        .await;
    assert_eq!(a.status, 401, "{}", a.text());

    // A policy change (haiku moves to prov-b) reaches the filter by ECDS without a restart.
    let mut changed = snap.clone();
    if let Some(route) = changed.models.get_mut("haiku") {
        route[0].upstream = "prov-b".into();
        route[0].model = "haiku-on-b".into();
    }
    cache.set(
        NodeKey::Default,
        snapshot_of(&changed, &settings(gw.port)).expect("translate"),
    );
    // Clusters (CDS) and the filter's configuration (ECDS) are separate resources; the
    // per-attempt stage takes the model id from the endpoint (CDS), so the new upstream
    // never sees the old model id. Wait for both to land.
    let body = poll(&gw, &token, "haiku", |s, b| {
        s == 200 && b["provider"] == "prov-b" && b["model"] == "haiku-on-b"
    })
    .await;
    assert_eq!(body["model"], "haiku-on-b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_through_xds_carries_the_next_targets_model_id() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let mut snap = test_snapshot(&issuer.url, &p);
    // prov-a refuses connections: "weighted" (50/50 prov-a model-a, prov-b model-b)
    // callers whose first pick is prov-a fail over to prov-b.
    if let Some(up) = snap.upstreams.get_mut("prov-a") {
        up.url = format!("http://127.0.0.1:{}", free_port());
    }
    let (_cache, gw) = gateway(&snap, "gw-failover").await;
    let first = bearer(&issuer.token("user-0@acme.test", &[]));
    poll(&gw, &first, "weighted", |s, _| s == 200).await;
    for i in 0..12 {
        let token = bearer(&issuer.token(&format!("user-{i}@acme.test"), &[]));
        let a = gw
            .post(
                "/v1/messages",
                &[("authorization", &token)],
                &msg("weighted"),
            )
            .await;
        assert_eq!(a.status, 200, "{}", a.text());
        assert_eq!(a.json()["provider"], "prov-b");
        assert_eq!(
            a.json()["model"],
            "model-b",
            "the retry carries prov-b's model id"
        );
    }
    // Some callers picked prov-a first and were retried on prov-b (the native build hands
    // its counts to Envoy once a second).
    halo_testkit::wait_until(
        "an attempt rewrite counted",
        std::time::Duration::from_secs(10),
        || (gw.counter("halo.attempt_rewrites") >= 1).then_some(()),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_reaches_its_target_and_nowhere_else() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let mut snap = test_snapshot(&issuer.url, &p);
    // prov-b's key is a reference to Envoy's environment, read by its credential step at
    // use time; the value never passes through the control plane.
    if let Some(up) = snap.upstreams.get_mut("prov-b") {
        up.credential = Some(halo_policy::types::Credential {
            env: Some(PROV_B_KEY_ENV.into()),
            file: None,
        });
    }
    let (_cache, gw) = gateway(&snap, "gw-sds").await;
    // "weighted" is 50/50 prov-a / prov-b: ask until both have answered.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut user = 0;
    while p.b.count() == 0 || p.a.count() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "both targets did not answer in time; Envoy log:\n{}",
            gw.envoy.logs()
        );
        user += 1;
        let t = bearer(&issuer.token(&format!("sds-{user}@acme.test"), &[]));
        let _ = gw
            .post(
                "/v1/messages",
                &[("authorization", &t), ("x-api-key", "client-key")],
                &msg("weighted"),
            )
            .await;
    }
    for seen in p.b.seen() {
        assert_eq!(seen.header("x-api-key"), Some(PROV_B_KEY));
    }
    for seen in p.a.seen() {
        assert_eq!(seen.header("x-api-key"), None, "prov-a has no credential");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_credential_rotates_without_an_envoy_restart() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let dir = tempfile::tempdir().expect("key dir");
    let key_file = dir.path().join("prov-b.key");
    std::fs::write(&key_file, "key-one").expect("key");
    let mut snap = test_snapshot(&issuer.url, &p);
    if let Some(up) = snap.upstreams.get_mut("prov-b") {
        up.credential = Some(halo_policy::types::Credential {
            env: None,
            file: Some(key_file.display().to_string()),
        });
    }
    // "haiku" routes to prov-a; move it to prov-b so every call lands there.
    if let Some(route) = snap.models.get_mut("haiku") {
        route[0].upstream = "prov-b".into();
    }
    let (_cache, gw) = gateway(&snap, "gw-rotate").await;
    let token = bearer(&issuer.token("rot@acme.test", &[]));
    let key_seen = |want: &'static str| {
        let gw = &gw;
        let token = token.clone();
        let p = &p;
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                let _ = gw
                    .post("/v1/messages", &[("authorization", &token)], &msg("haiku"))
                    .await;
                if p.b
                    .seen()
                    .last()
                    .and_then(|s| s.header("x-api-key").map(str::to_string))
                    == Some(want.to_string())
                {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "prov-b never got {want}; Envoy log:\n{}",
                    gw.envoy.logs()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    key_seen("key-one").await;
    // Rotate the way secret managers do: a new file moved over the old one.
    let next = dir.path().join("prov-b.key.next");
    std::fs::write(&next, "key-two").expect("next key");
    std::fs::rename(&next, &key_file).expect("rotate");
    key_seen("key-two").await;
}
