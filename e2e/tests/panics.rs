//! A panic in the native filter (injected with the test-only `settings.testPanic`)
//! answers that request 500 with a JSON body, is counted (`halo.panics`), and never takes
//! Envoy down: the next requests are answered too. The wasm build ignores the setting.

use halo_e2e::*;
use serde_json::json;

async fn gateway(at: &str) -> (Issuer, Providers, Gateway) {
    let issuer = Issuer::start().await;
    let providers = Providers::start().await;
    let snap = test_snapshot(&issuer.url, &providers);
    let gw = Gateway::start(
        snap,
        GatewayOptions {
            settings: json!({"testPanic": at}),
            ..GatewayOptions::default()
        },
    );
    (issuer, providers, gw)
}

fn msg() -> serde_json::Value {
    json!({"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_request_hook_answers_500_and_envoy_keeps_serving() {
    let native = halo_testkit::filter_is_native();
    for at in ["requestHeaders", "requestBody"] {
        let (issuer, p, gw) = gateway(at).await;
        let token = bearer(&issuer.token("dave@acme.test", &["eng"]));
        for n in 1..=3u64 {
            let a = gw
                .post("/v1/messages", &[("authorization", &token)], &msg())
                .await;
            if !native {
                assert_eq!(
                    a.status,
                    200,
                    "the wasm build ignores testPanic: {}",
                    a.text()
                );
                continue;
            }
            assert_eq!(a.status, 500, "{at}: {}", a.text());
            assert_eq!(a.json()["type"], "error", "{at}");
            assert_eq!(a.json()["error"]["type"], "api_error", "{at}");
            assert_eq!(a.header("content-type"), Some("application/json"), "{at}");
            assert_eq!(gw.counter("halo.panics"), n, "{at}: each panic counted");
        }
        if native {
            assert!(p.a.seen().is_empty(), "{at}: nothing reached an upstream");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_response_hook_lets_the_answer_pass() {
    let (issuer, p, gw) = gateway("responseHeaders").await;
    let token = bearer(&issuer.token("dave@acme.test", &["eng"]));
    for n in 1..=2u64 {
        let a = gw
            .post("/v1/messages", &[("authorization", &token)], &msg())
            .await;
        assert_eq!(a.status, 200, "{}", a.text());
        assert_eq!(a.header("x-provider"), Some("prov-a"));
        let panics = if halo_testkit::filter_is_native() {
            n
        } else {
            0
        };
        assert_eq!(gw.counter("halo.panics"), panics);
        // Under the name the wasm build's dashboard reads (0 there).
        assert_eq!(gw.filter_series().get("halo_panics{}"), Some(&panics));
    }
    assert_eq!(p.a.seen().len(), 2);
}
