//! Failover in a real Envoy: each attempt carries its own target's model id.
//!
//! Every alias here routes tier 0 to a failing provider and tier 1 to a serving one, each
//! target with its own model id. Envoy retries (aggregate cluster + retry policy) and the
//! filter's per-attempt stage, an upstream HTTP filter on the aggregate, rewrites the
//! model for each attempt from the chosen endpoint's metadata. The filter's breakers
//! (halo-filter-core's `breaker`) keep a target that failed 5 times in a row from leading
//! a call, and let one probe through after the cool-down (2 s here, 30 s by default).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

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
    /// Answers 503 until told otherwise (the breaker's test).
    flaky: Provider,
    /// The one target of `single-503`: answers 503.
    lone: Provider,
    _issuer: Issuer,
}

/// The breakers' cool-down in these tests.
const COOL_DOWN_SECONDS: u32 = 2;

async fn fixture() -> Fixture {
    let issuer = Issuer::start().await;
    let unavailable = Provider::behaving("unavailable", Behaviour::Status(503)).await;
    let limited = Provider::behaving("limited", Behaviour::Status(429)).await;
    let cut = Provider::behaving("cut", Behaviour::HeadersThenReset).await;
    let backup = Provider::start("backup").await;
    let flaky = Provider::behaving("flaky", Behaviour::Status(503)).await;
    let lone = Provider::behaving("lone", Behaviour::Status(503)).await;
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
            "flaky": {"url": flaky.url, "kind": "anthropic"},
            "lone": {"url": lone.url, "kind": "anthropic"},
        },
        "models": {
            "on-503": tiers("unavailable", "model-503", "backup-after-503"),
            "on-429": tiers("limited", "model-429", "backup-after-429"),
            "on-refused": tiers("refused", "model-refused", "backup-after-refused"),
            "on-cut": tiers("cut", "model-cut", "backup-after-cut"),
            // Every target fails: a 503 then a 429, or a refused connection.
            "all-fail": [
                {"upstream": "unavailable", "model": "all-fail-503"},
                {"upstream": "limited", "model": "all-fail-429", "priority": 1},
            ],
            "unreachable": [{"upstream": "refused", "model": "unreachable-model"}],
            "single-503": [{"upstream": "lone", "model": "lone-model"}],
            "breaker-503": tiers("flaky", "flaky-model", "backup-after-flaky"),
            "breaker-429": tiers("limited", "limited-model", "backup-after-limited"),
        },
        "rings": [{"name": "general", "order": 0, "membership": {"default": true}}],
        "experiments": [],
        "toggles": [],
    });
    let snapshot = Snapshot::from_bytes(doc.to_string().as_bytes()).expect("policy decodes");
    let gw = Gateway::start(
        snapshot,
        GatewayOptions {
            breaker: halo_contract::attempts::Breaker {
                consecutive_failures: 5,
                open_seconds: COOL_DOWN_SECONDS,
            },
            ..GatewayOptions::default()
        },
    );
    let token = bearer(&issuer.token("dev@acme.test", &[]));
    Fixture {
        gw,
        token,
        unavailable,
        limited,
        cut,
        backup,
        flaky,
        lone,
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

    // The stage counted the attempts that needed another model id (the native build
    // hands its counts to Envoy once a second).
    halo_testkit::wait_until(
        "three attempt rewrites counted",
        std::time::Duration::from_secs(10),
        || (f.gw.counter("halo.attempt_rewrites") >= 3).then_some(()),
    );
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

/// One dashboard serves both builds: the same requests give the same Prometheus series,
/// names and labels, in the wasm and the native build (scripts/test.sh runs this binary
/// with each), compared with one list. The per-attempt stage's rewrites are the request
/// filter's `halo_attempt_rewrites`, not a cluster's, and the counters without labels
/// read 0 until counted (the panics counter: e2e/tests/panics.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_builds_export_the_same_series() {
    let f = fixture().await;
    let auth = [("authorization", f.token.as_str())];
    // A failover to tier 1's model (one rewrite), and an identity refusal.
    let a =
        f.gw.post("/v1/messages", &auth, &msg("on-503", false))
            .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let a = f.gw.post("/v1/messages", &[], &msg("on-503", false)).await;
    assert_eq!(a.status, 401, "{}", a.text());

    let expected: std::collections::BTreeMap<String, u64> = [
        ("halo_attempt_rewrites{}", 1),
        ("halo_auth_failures{}", 1),
        (
            r#"halo_decisions{halo_ring="general",halo_variant="none",halo_source="gateway"}"#,
            1,
        ),
        ("halo_panics{}", 0),
        (
            r#"halo_requests{halo_ring="general",halo_variant="none",halo_status="200"}"#,
            1,
        ),
        (
            r#"halo_requests{halo_ring="unknown",halo_variant="none",halo_status="401"}"#,
            1,
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    // The native build hands its counts to Envoy once a second: a bounded poll.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let series = loop {
        let series = f.gw.filter_series();
        if series == expected || std::time::Instant::now() > deadline {
            break series;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(
        series,
        expected,
        "the filter's series in /stats/prometheus ({})",
        if halo_testkit::filter_is_native() {
            "native"
        } else {
            "wasm"
        }
    );
}

/// Every target failing is answered `503 no_available_target` in the client wire's error
/// shape (spec: "If every target fails"), never the last provider's body nor Envoy's
/// plain-text 503 for a refused connection; a stream asked for gets the same answer, as
/// no byte of one was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_target_failing_is_answered_503_no_available_target() {
    let f = fixture().await;
    let auth = [("authorization", f.token.as_str())];
    for (alias, stream) in [
        ("all-fail", false),
        ("all-fail", true),
        ("unreachable", false),
    ] {
        let a = f.gw.post("/v1/messages", &auth, &msg(alias, stream)).await;
        assert_eq!(a.status, 503, "{alias}: {}", a.text());
        assert_eq!(
            a.header("content-type"),
            Some("application/json"),
            "{alias}"
        );
        assert_eq!(a.json()["type"], "error", "{alias}: {}", a.text());
        assert_eq!(
            a.json()["error"]["type"],
            "no_available_target",
            "{alias}: {}",
            a.text()
        );
        assert_eq!(a.header("x-provider"), None, "{alias}: a provider's answer");
    }
    // Both targets were tried for each request, each with its own model id.
    for (p, model) in [
        (&f.unavailable, "all-fail-503"),
        (&f.limited, "all-fail-429"),
    ] {
        let seen = models_seen(p);
        assert!(seen.len() >= 2, "{model}: {seen:?}");
        assert!(seen.iter().all(|m| m == model), "{seen:?}");
    }
    // Counted under the status the client got.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let key = r#"halo_requests{halo_ring="general",halo_variant="none",halo_status="503"}"#;
    while f.gw.filter_series().get(key) != Some(&3) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let series = f.gw.filter_series();
    assert_eq!(series.get(key), Some(&3), "{series:?}");
}

/// A model of one target is tried once (spec: "a single-target route is not retried"; a
/// retried model call is a duplicated bill): its failure is the client's 503
/// `no_available_target` after one attempt, streamed or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_target_model_is_tried_once() {
    let f = fixture().await;
    let auth = [("authorization", f.token.as_str())];
    for (n, stream) in [(1, false), (2, true)] {
        let a =
            f.gw.post("/v1/messages", &auth, &msg("single-503", stream))
                .await;
        assert_eq!(a.status, 503, "{}", a.text());
        assert_eq!(
            a.json()["error"]["type"],
            "no_available_target",
            "{}",
            a.text()
        );
        // Envoy answers once its attempts are over: what the provider saw is final.
        assert_eq!(models_seen(&f.lone), vec!["lone-model"; n], "attempts");
    }
}

/// The breaker as the spec says (halos-low-level-design.md, step 10): with more than one
/// target, 5 consecutive failures (5xx, 429, connect errors) open a target's breaker, and
/// a call then skips it from its first attempt; after the cool-down exactly one call
/// probes it; a failed probe opens it again, a successful one closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_failures_open_a_targets_breaker_and_one_probe_goes_after_the_cool_down() {
    let f = fixture().await;
    let auth = [("authorization", f.token.as_str())];
    let call = |alias: &'static str| {
        let gw = &f.gw;
        async move {
            let a = gw.post("/v1/messages", &auth, &msg(alias, false)).await;
            assert_eq!(a.status, 200, "{alias}: {}", a.text());
            a.json()["model"].as_str().unwrap_or("").to_string()
        }
    };
    // Five calls: flaky answers 503 (and limited 429) to each first attempt, backup
    // answers after it.
    for _ in 0..5 {
        assert_eq!(call("breaker-503").await, "backup-after-flaky");
        assert_eq!(call("breaker-429").await, "backup-after-limited");
    }
    assert_eq!(f.flaky.count(), 5);
    let limited = models_seen(&f.limited);
    assert_eq!(limited.iter().filter(|m| *m == "limited-model").count(), 5);
    // Open: the next calls skip the failing target from their first attempt (well within
    // the cool-down: each call takes milliseconds).
    for _ in 0..3 {
        assert_eq!(call("breaker-503").await, "backup-after-flaky");
        assert_eq!(call("breaker-429").await, "backup-after-limited");
    }
    assert_eq!(
        f.flaky.count(),
        5,
        "flaky skipped while its breaker is open"
    );
    assert_eq!(
        models_seen(&f.limited)
            .iter()
            .filter(|m| *m == "limited-model")
            .count(),
        5,
        "a 429 counts as a failure"
    );

    // After the cool-down one call probes flaky (a bounded poll: a call every 100 ms).
    let deadline = std::time::Instant::now()
        + std::time::Duration::from_secs(u64::from(COOL_DOWN_SECONDS) + 10);
    while f.flaky.count() == 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "no probe went to flaky within its cool-down and 10 s"
        );
        assert_eq!(call("breaker-503").await, "backup-after-flaky");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(f.flaky.count(), 6, "exactly one probe");
    // The probe failed: open again, so calls at once (several together) all skip it.
    let burst: Vec<String> =
        futures_util::future::join_all((0..4).map(|_| call("breaker-503"))).await;
    assert!(burst.iter().all(|m| m == "backup-after-flaky"), "{burst:?}");
    assert_eq!(f.flaky.count(), 6, "one probe per cool-down");

    // flaky recovers: the next probe succeeds and closes the breaker, so every call leads
    // with flaky again.
    f.flaky.set_behaviour(Behaviour::Serve);
    let deadline = std::time::Instant::now()
        + std::time::Duration::from_secs(u64::from(COOL_DOWN_SECONDS) + 10);
    loop {
        let model = call("breaker-503").await;
        if model == "flaky-model" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no successful probe within the cool-down and 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let burst: Vec<String> =
        futures_util::future::join_all((0..3).map(|_| call("breaker-503"))).await;
    assert!(burst.iter().all(|m| m == "flaky-model"), "{burst:?}");
}
