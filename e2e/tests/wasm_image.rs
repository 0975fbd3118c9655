//! The filter image round trip: the module built in this workspace is pushed to a real
//! registry (docker-registry on loopback) in both layouts Istio and Envoy Gateway pull,
//! pulled back by digest, and the pulled module serves a governed request in a real Envoy.

use halo_e2e::*;
use halo_release::oci::{Registry, RegistryOptions};
use halo_release::wasm;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pulled_image_serves_a_governed_request_in_envoy() {
    let built = std::fs::read(halo_testkit::filter_wasm()).expect("the built filter module");
    let reg = halo_testkit::registry::Registry::start();
    let repo = Registry::connect(
        &format!("{}/halos/halo-filter", reg.host()),
        RegistryOptions::default(),
    )
    .expect("connect");
    let pushed = wasm::publish(&repo, &built, "e2e").await.expect("publish");
    assert_eq!(pushed.len(), 2, "wasm and compat variants");

    let issuer = Issuer::start().await;
    let providers = Providers::start().await;
    let dir = std::env::temp_dir().join(format!("halo-e2e-wasm-image-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for image in &pushed {
        let module = wasm::pull(&repo, &image.digest).await.expect("pull");
        assert_eq!(module, built, "{} holds the built module", image.tag);
        let path = dir.join(format!("{}.wasm", image.tag));
        std::fs::write(&path, &module).expect("write module");

        let gw = Gateway::start(
            test_snapshot(&issuer.url, &providers),
            GatewayOptions {
                wasm_path: Some(path),
                ..GatewayOptions::default()
            },
        );
        let token = bearer(&issuer.token("alice@acme.test", &[]));
        let body = json!({"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        let a = gw
            .post("/v1/messages", &[("authorization", token.as_str())], &body)
            .await;
        assert_eq!(a.status, 200, "{}: {}", image.tag, a.text());
        assert_eq!(a.header("x-provider"), Some("prov-a"), "{}", image.tag);
        // The decision reached the provider: alice is in the canary ring.
        let seen = providers.a.seen();
        let last = seen.last().expect("prov-a saw the call");
        assert_eq!(last.header("x-halo-ring"), Some("canary"), "{}", image.tag);
        // No token: the filter (not Envoy) answers 401.
        let a = gw.post("/v1/messages", &[], &body).await;
        assert_eq!(a.status, 401, "{}: {}", image.tag, a.text());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The mesh platforms' jwt_authn stores the verified payload under their own key (Istio:
/// `payload`); the renderers pass it as `identity.jwtMetadataKey`. Without it the filter
/// finds no claims and answers 401; with it the caller is identified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filter_reads_claims_under_the_mesh_jwt_metadata_key() {
    let issuer = Issuer::start().await;
    let providers = Providers::start().await;
    let body =
        json!({"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let token = bearer(&issuer.token("alice@acme.test", &[]));
    for (settings, want) in [
        (json!({}), 401),
        (json!({"identity": {"jwtMetadataKey": "payload"}}), 200),
    ] {
        let gw = Gateway::start(
            test_snapshot(&issuer.url, &providers),
            GatewayOptions {
                settings: settings.clone(),
                jwt_payload_key: Some("payload".into()),
                ..GatewayOptions::default()
            },
        );
        let a = gw
            .post("/v1/messages", &[("authorization", token.as_str())], &body)
            .await;
        assert_eq!(a.status, want, "{settings}: {}", a.text());
    }
}
