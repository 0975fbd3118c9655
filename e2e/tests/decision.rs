//! Decisions in Envoy match halo-policy: sticky picks, canaries, toggles; SSE streams
//! incrementally. (The filter's counters in Prometheus: e2e/tests/failover.rs.)

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use halo_e2e::*;
use halo_policy::assign;
use halo_policy::decide::{self, Caller, Subject};
use halo_policy::route;
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
async fn sticky_assignment_in_envoy_matches_halo_policy_for_200_users() {
    let (issuer, _p, gw) = setup().await;
    let targets = gw.snapshot.models["weighted"].clone();
    let mut per_upstream = [0usize; 2];
    for i in 0..200 {
        let user = format!("user{i}@acme.test");
        let session = format!("s-{}", i % 7);
        let token = bearer(&issuer.token(&user, &[]));
        let headers = [
            ("authorization", token.as_str()),
            ("x-claude-code-session-id", session.as_str()),
        ];

        // Weighted tier: the sticky pick by user + session.
        let a = gw.post("/v1/messages", &headers, &msg("weighted")).await;
        assert_eq!(a.status, 200, "{}", a.text());
        let order = route::route_order(
            &targets,
            Some(&assign::sticky_key(&user, &session)),
            "weighted",
        );
        let want = order[0].target;
        assert_eq!(
            a.header("x-provider"),
            Some(want.upstream.as_str()),
            "{user} {session}"
        );
        assert_eq!(a.json()["model"], want.model.as_str(), "{user} {session}");
        per_upstream[usize::from(want.upstream == "prov-b")] += 1;

        // Canary: the variant and the route match decide().
        let a = gw.post("/v1/messages", &headers, &msg("sonnet")).await;
        let d = decide::decide(
            &gw.snapshot,
            &Caller::Verified(Subject::new(user.clone(), &[])),
            "sonnet",
        );
        let attributed = d
            .experiment
            .as_ref()
            .expect("every general user is in sonnet-canary");
        assert_eq!(attributed.experiment, "sonnet-canary");
        assert_eq!(
            a.header("x-provider"),
            Some(d.targets[0].upstream.as_str()),
            "{user}"
        );
        assert_eq!(a.json()["model"], d.targets[0].model.as_str(), "{user}");
    }
    // Both targets of a 50/50 tier are used.
    assert!(
        per_upstream[0] > 50 && per_upstream[1] > 50,
        "{per_upstream:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traffic_toggle_applies_to_its_cohort_only() {
    let (issuer, p, gw) = setup().await;
    let ds = bearer(&issuer.token("dana@acme.test", &["ds"]));
    let other = bearer(&issuer.token("oscar@acme.test", &["eng"]));
    let a = gw
        .post("/v1/messages", &[("authorization", &ds)], &msg("haiku"))
        .await;
    assert_eq!(a.header("x-provider"), Some("prov-b"), "{}", a.text());
    assert_eq!(a.json()["model"], "haiku-b-model");
    let a = gw
        .post("/v1/messages", &[("authorization", &other)], &msg("haiku"))
        .await;
    assert_eq!(a.header("x-provider"), Some("prov-a"));
    assert_eq!(a.json()["model"], "claude-haiku-4-5");
    // The rewritten body (longer than the client's) goes out framed by its new length.
    let sent = p.a.seen().last().cloned().expect("prov-a got the request");
    assert_eq!(
        sent.header("content-length"),
        Some(sent.body.len().to_string().as_str())
    );
    assert_eq!(sent.header("transfer-encoding"), None);
    // The toggle routes haiku only: the ds user's sonnet is untouched by it.
    assert_eq!(
        p.b.seen()
            .iter()
            .filter(|s| s.json()["model"] == "haiku-b-model")
            .count(),
        1
    );
}

/// A user whose variant in `experiment` is `variant`.
fn user_with(snap: &halo_policy::Snapshot, wants: &[(&str, &str)]) -> String {
    (0..10_000)
        .map(|i| format!("cand{i}@acme.test"))
        .find(|u| {
            wants.iter().all(|(exp, var)| {
                let e = snap.experiment(exp).expect("experiment");
                decide::assigned_variant(e, u).map(|i| e.variants[i].name.as_str()) == Some(*var)
            })
        })
        .expect("some user has this assignment")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_canaries_on_different_aliases_each_claim_only_their_own_alias() {
    let (issuer, p, gw) = setup().await;
    let user = user_with(
        &gw.snapshot,
        &[("sonnet-canary", "canary"), ("opus-canary", "control")],
    );
    let token = bearer(&issuer.token(&user, &[]));
    let auth = [("authorization", token.as_str())];

    let a = gw.post("/v1/messages", &auth, &msg("sonnet")).await;
    assert_eq!(a.json()["model"], "sonnet-canary-model");
    let s = p.b.seen().pop().expect("canary target");
    assert_eq!(s.header("x-halo-experiment"), Some("sonnet-canary"));
    assert_eq!(s.header("x-halo-variant"), Some("canary"));

    let a = gw.post("/v1/messages", &auth, &msg("opus")).await;
    assert_eq!(
        a.json()["model"],
        "claude-opus-4-1",
        "control arm of opus-canary"
    );
    let s = p.a.seen().pop().expect("control target");
    assert_eq!(s.header("x-halo-experiment"), Some("opus-canary"));
    assert_eq!(s.header("x-halo-variant"), Some("control"));

    // haiku is in neither canary: no experiment stamped.
    gw.post("/v1/messages", &auth, &msg("haiku")).await;
    let s = p.a.seen().pop().expect("haiku");
    assert_eq!(s.header("x-halo-experiment"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_streams_incrementally() {
    let (issuer, p, gw) = setup().await;
    let token = bearer(&issuer.token("dave@acme.test", &[]));
    let mut body = msg("haiku");
    body["stream"] = json!(true);
    let mut resp = gw
        .client
        .post(format!("{}/v1/messages", gw.base))
        .header("authorization", &token)
        .body(body.to_string())
        .send()
        .await
        .expect("stream request");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    // The provider holds the last event until released: the first must arrive alone.
    let mut first = String::new();
    while !first.contains("\n\n") {
        let chunk = resp
            .chunk()
            .await
            .expect("read")
            .expect("first event before the end");
        first.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(first.contains("message_start"), "{first}");
    assert!(
        first.contains("claude-haiku-4-5"),
        "rewritten model upstream: {first}"
    );
    assert!(
        !first.contains("message_stop"),
        "the last event was not sent yet"
    );
    p.a.release_stream();
    let mut rest = String::new();
    while let Some(chunk) = resp.chunk().await.expect("read rest") {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(rest.contains("message_stop"), "{rest}");
}
