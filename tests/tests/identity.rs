//! Identity, admit, decision and hygiene through a real Envoy.

use halo_e2e::*;
use serde_json::json;

async fn setup() -> (Issuer, Providers, Gateway) {
    let issuer = Issuer::start().await;
    let providers = Providers::start().await;
    let snap = test_snapshot(&issuer.url, &providers);
    let gw = Gateway::start(snap, GatewayOptions::default());
    (issuer, providers, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_jwt_is_routed_alias_rewritten_ring_and_release_stamped() {
    let (issuer, p, gw) = setup().await;
    let token = bearer(&issuer.token("dave@acme.test", &["eng"]));
    let body =
        json!({"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let a = gw
        .post("/v1/messages", &[("authorization", &token)], &body)
        .await;
    assert_eq!(a.status, 200, "{}\n{}", a.text(), gw.envoy.logs());
    assert_eq!(a.header("x-provider"), Some("prov-a"));
    let seen = p.a.seen();
    assert_eq!(seen.len(), 1);
    let s = &seen[0];
    assert_eq!(s.json()["model"], "claude-haiku-4-5");
    // Every other byte of the body is as the client sent it.
    assert_eq!(s.json()["messages"], body["messages"]);
    assert_eq!(s.header("x-halo-ring"), Some("general"));
    assert_eq!(s.header("x-halo-release"), Some("sha256:0123abcd"));
}
