//! Failover in a real Envoy: each attempt carries its own target's model id.
//!
//! Every alias here routes tier 0 to a failing provider and tier 1 to a serving one, each
//! target with its own model id. Envoy retries (aggregate cluster + retry policy) and the
//! filter's per-attempt stage, an upstream HTTP filter on the aggregate, rewrites the
//! model for each attempt from the chosen endpoint's metadata. One Envoy serves every case.

use halo_e2e::{Behaviour, Gateway, GatewayOptions, Issuer, Provider, bearer};
use halo_policy::Snapshot;
use serde_json::{Value, json};

fn msg(alias: &str, stream: bool) -> Value {
    json!({"model": alias, "max_tokens": 5, "stream": stream,
           "messages": [{"role": "user", "content": "hi"}]})
}

struct Fixture {
    gw: Gateway,
    token: String,
    unavailable: Provider,
    limited: Provider,
    cut: Provider,
    backup: Provider,
    _issuer: Issuer,
}

async fn fixture() -> Fixture {
    let issuer = Issuer::start().await;
    let unavailable = Provider::behaving("unavailable", Behaviour::Status(503)).await;
    let limited = Provider::behaving("limited", Behaviour::Status(429)).await;
    let cut = Provider::behaving("cut", Behaviour::HeadersThenReset).await;
    let backup = Provider::start("backup").await;
    // Nothing listens here: connections are refused.
    let refused = format!("http://127.0.0.1:{}", halo_testkit::free_port());
    let tiers = |first: &str, first_model: &str, second_model: &str| {
        json!([
            {"upstream": first, "model": first_model},
            {"upstream": "backup", "model": second_model, "priority": 1},
        ])
    };
    let doc = json!({
        "schema": 1,
        "org": "failover-org",
        "identity": {"issuer": issuer.url, "audience": halo_e2e::AUDIENCE,
                     "claims": {"user": "email", "groups": "groups"}},
        "protocols": {"claude-code": "anthropic-messages"},
        "upstreams": {
            "unavailable": {"url": unavailable.url, "kind": "anthropic"},
            "limited": {"url": limited.url, "kind": "anthropic"},
            "refused": {"url": refused, "kind": "anthropic"},
            "cut": {"url": cut.url, "kind": "anthropic"},
            "backup": {"url": backup.url, "kind": "anthropic"},
        },
        "models": {
            "on-503": tiers("unavailable", "model-503", "backup-after-503"),
            "on-429": tiers("limited", "model-429", "backup-after-429"),
            "on-refused": tiers("refused", "model-refused", "backup-after-refused"),
            "on-cut": tiers("cut", "model-cut", "backup-after-cut"),
        },
        "rings": [{"name": "general", "order": 0, "membership": {"default": true}}],
        "experiments": [],
        "toggles": [],
    });
    let snapshot = Snapshot::from_bytes(doc.to_string().as_bytes()).expect("policy decodes");
    let gw = Gateway::start(snapshot, GatewayOptions::default());
    let token = bearer(&issuer.token("dev@acme.test", &[]));
    Fixture {
        gw,
        token,
        unavailable,
        limited,
        cut,
        backup,
        _issuer: issuer,
    }
}

fn models_seen(p: &Provider) -> Vec<String> {
    p.seen()
        .iter()
        .map(|s| s.json()["model"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_failover_attempt_carries_its_own_targets_model_id() {
    let f = fixture().await;
    let auth = [("authorization", f.token.as_str())];

    // 503 from tier 0: tier 1 answers, with its own model id in the body it got.
    let a =
        f.gw.post("/v1/messages", &auth, &msg("on-503", false))
            .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.header("x-provider"), Some("backup"));
    assert_eq!(models_seen(&f.unavailable), ["model-503"]);
    assert_eq!(
        models_seen(&f.backup),
        ["backup-after-503"],
        "{}",
        f.gw.envoy.logs()
    );

    // 429 (rate limited) moves on the same way.
    let a =
        f.gw.post("/v1/messages", &auth, &msg("on-429", false))
            .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(models_seen(&f.limited), ["model-429"]);
    assert_eq!(
        models_seen(&f.backup).last().map(String::as_str),
        Some("backup-after-429")
    );

    // A tier-0 target that refuses connections: the request goes to tier 1.
    let a =
        f.gw.post("/v1/messages", &auth, &msg("on-refused", false))
            .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["model"], "backup-after-refused");

    // The stage counted the attempts that needed another model id.
    assert!(f.gw.counter("halo.attempt_rewrites") >= 3);
    // Nothing internal reached a provider.
    for s in f.backup.seen() {
        assert_eq!(s.header("x-halo-attempt"), None);
        assert_eq!(s.header("x-halo-route"), None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_fails_after_sending_headers_is_not_retried() {
    let f = fixture().await;
    let before = f.backup.count();
    let resp =
        f.gw.client
            .post(format!("{}/v1/messages", f.gw.base))
            .header("authorization", &f.token)
            .json(&msg("on-cut", true))
            .send()
            .await
            .expect("response headers arrive");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers()
            .get("x-provider")
            .and_then(|v| v.to_str().ok()),
        Some("cut")
    );
    // The client has the headers: now the provider fails mid-body.
    f.cut.release_stream();
    // The body ends early (or in an error): the stream was cut, not replayed elsewhere.
    let body = resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
    assert!(!String::from_utf8_lossy(&body).contains("message_stop"));
    assert_eq!(models_seen(&f.cut), ["model-cut"]);
    assert_eq!(
        f.backup.count(),
        before,
        "a response byte reached the client: no retry"
    );
}
