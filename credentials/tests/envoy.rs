//! halo-credentials feeding a real Envoy 1.40: an upstream `credential_injector` reads the
//! SDS file the binary writes and sets `Authorization: Bearer <token>` on requests to a
//! fake Vertex, which accepts only the token the fake Google issued last. When the
//! refresher rotates the token, Envoy sends the new one without a restart.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::time::Duration;

use halo_testkit::envoy::Envoy;
use halo_testkit::{free_port, wait_until};
use serde_json::json;
use support::{FakeGoogle, FakeVertex, Process, SA_KEY_PEM, TOKEN_PREFIX, assert_no_secret};
use support::{token_in, token_name, write_key_file};

const SECRET: &str = "vertex-token";
const RAW_PREDICT: &str = "/v1/projects/acme-vertex/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict";

/// A listener routing everything to the `vertex` cluster, whose upstream filter chain
/// injects the token from the SDS file (the shape the gateway's aggregate clusters use).
fn bootstrap(port: u16, admin: u16, vertex_port: u16, sds: &Path) -> String {
    json!({
        "node": {"id": "halo-credentials-test", "cluster": "halo-credentials-test"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{"name": "main",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "main",
                    "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{
                        "match": {"prefix": "/"}, "route": {"cluster": "vertex"}}]}]},
                    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
                }}]}]}],
            "clusters": [{
                "name": "vertex",
                "connect_timeout": "1s",
                "type": "STATIC",
                "load_assignment": {"cluster_name": "vertex", "endpoints": [{"lb_endpoints": [{"endpoint": {
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": vertex_port}}}}]}]},
                "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http_protocol_options": {}},
                    "http_filters": [
                        {"name": "envoy.filters.http.credential_injector", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector",
                            "overwrite": true,
                            "credential": {"name": "envoy.http.injected_credentials.generic", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic",
                                "credential": {"name": SECRET, "sds_config": {
                                    "path_config_source": {"path": sds.display().to_string()}}},
                                "header": "Authorization"}}}},
                        {"name": "envoy.filters.http.upstream_codec", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec"}}
                    ]}}
            }]
        }
    })
    .to_string()
}

async fn raw_predict(port: u16) -> u16 {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    client
        .post(format!("http://127.0.0.1:{port}{RAW_PREDICT}"))
        // A client credential that the injector must overwrite.
        .header("authorization", "Bearer client-token")
        .header("content-type", "application/json")
        .body(r#"{"anthropic_version":"vertex-2023-10-16","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .expect("request through Envoy")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_injects_the_current_token_and_follows_a_rotation_without_restart() {
    // Six-second tokens refreshed at half-life; the refresh is held until the test has
    // seen Envoy use the first token.
    let google = FakeGoogle::start(6).await;
    google.hold_after(1);
    let vertex = FakeVertex::start(&google).await;
    let dir = tempfile::tempdir().unwrap();
    let key = write_key_file(dir.path(), &google.token_uri(), SA_KEY_PEM);
    // A directory of its own: Envoy watches the directory the SDS file is in.
    std::fs::create_dir(dir.path().join("sds")).unwrap();
    let sds = dir.path().join("sds/vertex.yaml");
    let process = Process::start(
        &[
            "vertex",
            "--sds-file",
            sds.to_str().unwrap(),
            "--secret-name",
            SECRET,
            "--key-file",
            key.to_str().unwrap(),
            "--refresh-before",
            "0",
        ],
        &[],
    );
    let path = sds.clone();
    tokio::task::spawn_blocking(move || {
        wait_until("the first token", Duration::from_secs(30), || {
            (token_in(&path)? == token_name(1)).then_some(())
        })
    })
    .await
    .unwrap();

    let (port, admin) = (free_port(), free_port());
    let config = bootstrap(port, admin, vertex.port, &sds);
    let mut envoy = tokio::task::spawn_blocking(move || Envoy::start(&config, admin))
        .await
        .unwrap();

    assert_eq!(raw_predict(port).await, 200, "Envoy log:\n{}", envoy.logs());
    let calls = vertex.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].path, RAW_PREDICT);
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some("Bearer ya29.fake-1")
    );

    // Let the refresher mint the second token; Envoy picks up the replaced file.
    google.release();
    let handle = tokio::runtime::Handle::current();
    let v = vertex.clone();
    tokio::task::spawn_blocking(move || {
        wait_until(
            "Envoy sending the rotated token",
            Duration::from_secs(30),
            || {
                handle.block_on(raw_predict(port));
                let last = v.calls().pop()?;
                (last.authorization.as_deref() == Some("Bearer ya29.fake-2")).then_some(())
            },
        )
    })
    .await
    .unwrap();
    assert!(envoy.is_running(), "the same Envoy, not restarted");
    assert!(google.issued() >= 2, "the fake issued the token Envoy sent");
    // Every request after the rotation was accepted or carried a token the fake issued.
    for call in vertex.calls() {
        let auth = call.authorization.unwrap_or_default();
        assert!(
            auth.starts_with(&format!("Bearer {TOKEN_PREFIX}")),
            "only minted tokens reach Vertex, never the client's: {auth}"
        );
    }
    assert_no_secret(&process.logs());
    assert!(!envoy.logs().contains(TOKEN_PREFIX), "Envoy logged a token");
}
