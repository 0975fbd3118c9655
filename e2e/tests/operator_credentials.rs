//! The gateway's own credentials that are not policy `credential`s, through the real
//! gateway (standalone bootstrap, Envoy 1.40, the built filter):
//! - Vertex: halo-credentials (its library, in this process) mints a token from a fake
//!   Google token endpoint and publishes it in the SDS file `vertexTokenSds` names; the
//!   rendered `credential_injector` sends it to a fake Vertex, which accepts only the
//!   token the fake issued last;
//! - `upstreamHeaders`: an upstream's headers, `${VAR}` read from Envoy's environment,
//!   reach that upstream's attempts and no other target's.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use halo_credentials::google::TokenSource;
use halo_credentials::refresh::Policy;
use halo_credentials::run::{Refresher, SystemClock};
use halo_credentials::sds::{self, SdsFile};
use halo_e2e::{Behaviour, Gateway, GatewayOptions, Issuer, Provider, bearer};
use halo_policy::Snapshot;
use halo_testkit::google::{FakeGoogle, FakeVertex, SA_KEY_PEM, token_name, write_key_file};
use serde_json::{Value, json};

const VERTEX_MODEL: &str = "claude-sonnet-4-5@20250929";
/// halo-providers percent-encodes the model segment (`@` as `%40`, which Google decodes).
const RAW_PREDICT: &str = "/v1/projects/acme-vertex/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5%4020250929:rawPredict";

fn vertex_policy(issuer: &Issuer, vertex: &FakeVertex) -> Snapshot {
    let doc = json!({
        "schema": 1,
        "org": "vertex-org",
        "identity": {"issuer": issuer.url, "audience": halo_e2e::AUDIENCE,
                     "claims": {"user": "email", "groups": "groups"}},
        "protocols": {"claude-code": "anthropic-messages"},
        "upstreams": {
            "vertex": {"url": format!("http://127.0.0.1:{}", vertex.port), "kind": "vertex",
                       "project": "acme-vertex", "region": "us-east5"},
        },
        "models": {"claude": [{"upstream": "vertex", "model": VERTEX_MODEL}]},
        "rings": [{"name": "general", "order": 0, "membership": {"default": true}}],
        "experiments": [],
        "toggles": [],
    });
    Snapshot::from_bytes(doc.to_string().as_bytes()).expect("policy decodes")
}

fn claude_code(token: &str) -> Vec<(&str, &str)> {
    vec![
        ("authorization", token),
        ("anthropic-version", "2023-06-01"),
        ("x-api-key", "client-key-never-forwarded"),
        ("content-type", "application/json"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vertex_attempt_carries_the_token_halo_credentials_minted_and_only_to_an_allowed_host() {
    let issuer = Issuer::start().await;
    let google = FakeGoogle::start(3600).await;
    let vertex = FakeVertex::start(&google).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let key = write_key_file(dir.path(), &google.token_uri(), SA_KEY_PEM);
    // A directory of its own: Envoy watches the directory the SDS file is in.
    std::fs::create_dir(dir.path().join("sds")).expect("sds dir");
    let sds_path = dir.path().join("sds/vertex.json");
    let sds_file = SdsFile::new(&sds_path, "halo-vertex-token", sds::Value::Bearer).expect("sds");
    let mut refresher = Refresher::new(
        TokenSource::KeyFile(key),
        sds_file,
        Policy::default(),
        SystemClock,
    )
    .expect("refresher");
    refresher
        .attempt()
        .await
        .expect("the first token is published");
    assert_eq!(google.issued(), 1);

    let sds = sds_path.display().to_string();
    let gw = Gateway::start(
        vertex_policy(&issuer, &vertex),
        GatewayOptions {
            // The fake listens on plain http on loopback: list it, as an operator would.
            settings: json!({"vertexTokenSds": sds, "upstreamHosts": ["127.0.0.1"]}),
            ..GatewayOptions::default()
        },
    );
    let token = bearer(&issuer.token("dev@acme.test", &[]));
    let body = json!({"model": "claude", "max_tokens": 64,
                      "messages": [{"role": "user", "content": "hi"}]});
    let a = gw.post("/v1/messages", &claude_code(&token), &body).await;
    assert_eq!(a.status, 200, "{}\n{}", a.text(), gw.envoy.logs());
    let calls = vertex.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].path, RAW_PREDICT);
    let expected = format!("Bearer {}", token_name(1));
    assert_eq!(calls[0].authorization.as_deref(), Some(expected.as_str()));
    let sent: Value = serde_json::from_slice(&calls[0].body).expect("json body");
    assert_eq!(sent["anthropic_version"], "vertex-2023-10-16");
    assert_eq!(sent.get("model"), None, "the model is in the path");
    assert_eq!(sent["messages"][0]["content"], "hi");

    // count_tokens has no Vertex equivalent: refused, nothing reaches Vertex.
    let a = gw
        .post("/v1/messages/count_tokens", &claude_code(&token), &body)
        .await;
    assert_ne!(a.status, 200, "{}", a.text());
    assert_eq!(vertex.calls().len(), 1, "count_tokens was sent to Vertex");
    assert!(!gw.envoy.logs().contains("ya29."), "Envoy logged a token");
    drop(gw);

    // Without upstreamHosts, 127.0.0.1 over http is not a Google host: no token for it.
    let gw = Gateway::start(
        vertex_policy(&issuer, &vertex),
        GatewayOptions {
            settings: json!({"vertexTokenSds": sds}),
            ..GatewayOptions::default()
        },
    );
    let a = gw.post("/v1/messages", &claude_code(&token), &body).await;
    assert_eq!(a.status, 401, "the fake refuses a call without the token");
    let calls = vertex.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].path, RAW_PREDICT);
    assert_eq!(
        calls[1].authorization, None,
        "neither the gateway's token nor the client's credential"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_headers_reach_their_upstream_and_not_the_next_target() {
    const KEY: &str = "sk-operator-key-from-env";
    let issuer = Issuer::start().await;
    let first = Provider::behaving("first", Behaviour::Status(503)).await;
    let second = Provider::start("second").await;
    let doc = json!({
        "schema": 1,
        "org": "headers-org",
        "identity": {"issuer": issuer.url, "audience": halo_e2e::AUDIENCE,
                     "claims": {"user": "email", "groups": "groups"}},
        "protocols": {"claude-code": "anthropic-messages"},
        "upstreams": {
            "first": {"url": first.url, "kind": "anthropic"},
            "second": {"url": second.url, "kind": "anthropic"},
        },
        "models": {"claude": [
            {"upstream": "first", "model": "model-first"},
            {"upstream": "second", "model": "model-second", "priority": 1},
        ]},
        "rings": [{"name": "general", "order": 0, "membership": {"default": true}}],
        "experiments": [],
        "toggles": [],
    });
    let snapshot = Snapshot::from_bytes(doc.to_string().as_bytes()).expect("policy decodes");
    let settings = json!({"upstreamHeaders": {"first": {
        "x-api-key": "${HALO_TEST_KEY}",
        "anthropic-version": "2023-06-01",
        "x-operator-note": "100% ${HALO_TEST_KEY}",
    }}});

    // The rendered configuration names the variable, never its value.
    let rendered = halo_envoy_config::bootstrap::standalone(
        &snapshot,
        &halo_envoy_config::bootstrap::Standalone {
            gateway: halo_envoy_config::plan::GatewaySettings {
                listen_address: "127.0.0.1".into(),
                listen_port: 1,
                wasm_path: "/x.wasm".into(),
                ..halo_envoy_config::plan::GatewaySettings::default()
            }
            .with_filter_settings(settings.clone())
            .expect("settings"),
            admin_address: "127.0.0.1".into(),
            admin_port: 2,
        },
    )
    .expect("renders")
    .to_string();
    assert!(rendered.contains("%ENVIRONMENT(HALO_TEST_KEY)%"));
    assert!(!rendered.contains("upstreamHeaders"), "not for the filter");

    let gw = Gateway::start(
        snapshot,
        GatewayOptions {
            settings,
            env: vec![("HALO_TEST_KEY".into(), Some(KEY.into()))],
            ..GatewayOptions::default()
        },
    );
    let token = bearer(&issuer.token("dev@acme.test", &[]));
    let headers = vec![
        ("authorization", token.as_str()),
        ("anthropic-version", "2023-01-01"),
        ("x-api-key", "client-key-never-forwarded"),
        ("content-type", "application/json"),
    ];
    let body = json!({"model": "claude", "max_tokens": 64,
                      "messages": [{"role": "user", "content": "hi"}]});
    let a = gw.post("/v1/messages", &headers, &body).await;
    assert_eq!(a.status, 200, "{}\n{}", a.text(), gw.envoy.logs());

    let seen = first.seen();
    assert_eq!(seen.len(), 1, "the first target was tried once");
    assert_eq!(seen[0].header("x-api-key"), Some(KEY));
    assert_eq!(seen[0].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(
        seen[0].header("x-operator-note"),
        Some(format!("100% {KEY}").as_str())
    );
    assert_eq!(seen[0].json()["model"], "model-first");
    let seen = second.seen();
    assert_eq!(seen.len(), 1, "failover reached the second target");
    assert_eq!(seen[0].json()["model"], "model-second");
    assert_eq!(seen[0].header("x-api-key"), None, "{:?}", seen[0].headers);
    assert_eq!(seen[0].header("x-operator-note"), None);
    assert_eq!(seen[0].header("anthropic-version"), Some("2023-01-01"));
    assert!(!gw.envoy.logs().contains(KEY), "Envoy logged the key");
}

/// A key file is read at use time (#27 item 3): missing when Envoy starts, its target is
/// refused 502 `upstream_auth_error` with nothing sent (and counted by upstream); once it
/// is written the key is used, and a rotated one too, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_key_written_later_and_rotated_is_used_without_an_envoy_restart() {
    let issuer = Issuer::start().await;
    let provider = Provider::start("keyed").await;
    let keys = tempfile::tempdir().expect("key dir");
    let key_file = keys.path().join("keyed.key");
    let doc = json!({
        "schema": 1, "org": "rotate-org",
        "identity": {"issuer": issuer.url, "audience": halo_e2e::AUDIENCE,
                     "claims": {"user": "email", "groups": "groups"}},
        "protocols": {"claude-code": "anthropic-messages"},
        "upstreams": {"keyed": {"url": provider.url, "kind": "anthropic",
                                "credential": {"file": key_file.display().to_string()}}},
        "models": {"claude": [{"upstream": "keyed", "model": "m"}]},
        "rings": [{"name": "general", "order": 0, "membership": {"default": true}}],
        "experiments": [], "toggles": [],
    });
    let snap = Snapshot::from_bytes(doc.to_string().as_bytes()).expect("policy");
    let gw = Gateway::start(
        snap,
        GatewayOptions {
            settings: json!({"upstreamHosts": ["127.0.0.1"]}),
            ..GatewayOptions::default()
        },
    );
    let token = bearer(&issuer.token("dev@acme.test", &[]));
    let body = json!({"model": "claude", "max_tokens": 8,
                      "messages": [{"role": "user", "content": "hi"}]});
    let last_key = || {
        provider
            .seen()
            .last()
            .and_then(|s| s.header("x-api-key").map(str::to_string))
    };
    // No key file yet: refused, nothing sent, the marker kept from the client.
    let a = gw.post("/v1/messages", &claude_code(&token), &body).await;
    assert_eq!(a.status, 502, "{}", a.text());
    assert_eq!(
        a.json()["error"]["type"],
        "upstream_auth_error",
        "{}",
        a.text()
    );
    assert_eq!(a.header("x-halo-key-missing"), None);
    assert_eq!(provider.count(), 0, "nothing reached the provider");
    assert!(
        gw.envoy.logs().contains(&format!(
            "halo: upstream keyed has no key (file {} cannot be read)",
            key_file.display()
        )),
        "{}",
        gw.envoy.logs()
    );
    let key_seen = |want: &'static str| {
        let (gw, token, body) = (&gw, token.clone(), body.clone());
        let last_key = &last_key;
        async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            loop {
                let _ = gw.post("/v1/messages", &claude_code(&token), &body).await;
                if last_key().as_deref() == Some(want) {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{want} never reached the provider; Envoy log:\n{}",
                    gw.envoy.logs()
                );
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    };
    // The key written (atomically, as secret managers do, with a trailing newline).
    let next = keys.path().join("keyed.key.next");
    std::fs::write(&next, "key-one\n").expect("key");
    std::fs::rename(&next, &key_file).expect("write");
    key_seen("key-one").await;
    // Rotated: a new file moved over the old one.
    std::fs::write(&next, "key-two").expect("next key");
    std::fs::rename(&next, &key_file).expect("rotate");
    key_seen("key-two").await;
    // Counted by upstream (the native build hands its counts over once a second).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let counted = gw.filter_series();
        if counted.iter().any(|(s, v)| {
            s.starts_with("halo_upstream_auth_errors{")
                && s.contains("halo_upstream=\"keyed\"")
                && *v >= 1
        }) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the refusal is not counted by upstream: {counted:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(!gw.envoy.logs().contains("key-one"), "Envoy logged the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_forward_auth_a_pass_through_target_after_a_keyed_one_gets_the_clients_key() {
    let issuer = Issuer::start().await;
    let keyed = Provider::behaving("keyed", Behaviour::Status(503)).await;
    let pass = Provider::start("pass").await;
    let doc = json!({
        "schema": 1, "org": "forward-org",
        "identity": {"issuer": issuer.url, "audience": halo_e2e::AUDIENCE,
                     "claims": {"user": "email", "groups": "groups"}},
        "protocols": {"codex": "openai-responses"},
        "upstreams": {
            "keyed": {"url": keyed.url, "kind": "openai", "credential": {"env": "HALO_TEST_OPENAI_KEY"}},
            "pass": {"url": pass.url, "kind": "orchestrator"},
        },
        "models": {"gpt": [
            {"upstream": "keyed", "model": "gpt-keyed"},
            {"upstream": "pass", "model": "gpt-pass", "priority": 1},
        ]},
        "rings": [{"name": "general", "order": 0, "membership": {"default": true}}],
        "experiments": [], "toggles": [],
    });
    let snap = Snapshot::from_bytes(doc.to_string().as_bytes()).expect("policy");
    let gw = Gateway::start(
        snap,
        GatewayOptions {
            settings: json!({"forwardAuth": true, "upstreamHosts": ["127.0.0.1"]}),
            env: vec![(
                "HALO_TEST_OPENAI_KEY".into(),
                Some("gateway-openai-key".into()),
            )],
            ..GatewayOptions::default()
        },
    );
    let token = bearer(&issuer.token("dev@acme.test", &[]));
    let a = gw
        .post(
            "/v1/responses",
            &[("authorization", &token), ("x-api-key", "client-own-key")],
            &json!({"model": "gpt", "input": "hi"}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["provider"], "pass");
    // The keyed (credentialed) target got the gateway's key, not the client's.
    let k = keyed.seen();
    assert_eq!(k.len(), 1);
    assert_eq!(
        k[0].header("authorization"),
        Some("Bearer gateway-openai-key")
    );
    assert_eq!(k[0].header("x-api-key"), None);
    // The pass-through target after it got the client's credentials back.
    let p = pass.seen();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].header("x-api-key"), Some("client-own-key"));
    assert_eq!(p[0].header("authorization"), Some(token.as_str()));
    assert_eq!(p[0].json()["model"], "gpt-pass");
}
