//! The kill list on the mesh path: `halo istio render` configures the filter to poll
//! halo-server through Istio's outbound cluster (`outbound|PORT||<halo-server FQDN>`),
//! `halo envoy-gateway render` through the `halo-killswitch` cluster its EnvoyPatchPolicy
//! adds. Each test takes the rendered wasm filter config, runs it in a real Envoy next to
//! the cluster the poll names, and shows that a kill served by the kill-list server reaches
//! routing through the poll (and that request bodies reach the filter: the rendered
//! allow_on_headers_stop_iteration is in force).
//!
//! For Istio, one substitution stands in for a part of a mesh that is not here:
//! istio-agent's rewrite of `vm_config.code.remote` (the oci:// image) to a local file:
//! the module is the workspace build (the image round trip is tests/wasm_image.rs).
//! The gateway token is as in a mesh: the rendered config names it by environment variable
//! (`killSwitch.tokenEnv: HALO_GATEWAY_TOKEN`, listed in the VM's host_env_keys), the
//! test exports it to Envoy's environment, and the filter reads it from the VM's.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use halo_e2e::*;
use halo_mesh::envoy_gateway::{self, GatewayOptions};
use halo_mesh::istio::{self, Delivery, IstioOptions};
use halo_mesh::{GATEWAY_TOKEN_ENV, Image, KillSwitchRef};
use serde_json::{Value, json};

const CANARY: &str = "sonnet-canary-model";
const CONTROL: &str = "claude-sonnet-4-5-20250929";
const HALO_SERVER: &str = "halo-server.halos.svc.cluster.local";

/// Every jwt_authn provider's `payload_in_metadata` set to Istio's key.
fn set_payload_key(v: &mut Value, key: &str) {
    match v {
        Value::Object(m) => {
            if let Some(p) = m.get_mut("payload_in_metadata") {
                *p = json!(key);
            }
            m.values_mut().for_each(|c| set_payload_key(c, key));
        }
        Value::Array(a) => a.iter_mut().for_each(|c| set_payload_key(c, key)),
        _ => {}
    }
}

/// The halo filter's entry of the bootstrap's HTTP filter chain.
fn wasm_filter_mut(doc: &mut Value) -> &mut Value {
    let filters = doc
        .pointer_mut(
            "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters",
        )
        .and_then(Value::as_array_mut)
        .expect("the bootstrap's HTTP filters");
    filters
        .iter_mut()
        .find(|f| f["name"] == halo_contract::names::FILTER_NAME)
        .expect("the halo filter")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_reaches_the_filter_rendered_for_istio_through_the_outbound_cluster_poll() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let kill = KillServer::start().await;
    let mut snap = test_snapshot(&issuer.url, &p);
    // The in-proxy mode refuses multi-target aliases and targets that need the gateway's
    // own key (openai, gemini); the kill list does not depend on them.
    for alias in ["weighted", "gpt", "gemini-pro"] {
        snap.models.remove(alias);
    }
    let kill_port: u16 = kill
        .url
        .split(':')
        .nth(2)
        .and_then(|s| s.split('/').next())
        .and_then(|s| s.parse().ok())
        .expect("kill server port");

    // 1. Render for Istio, exactly as `halo istio render --kill-switch-pubkey` does.
    let opts = IstioOptions {
        image: Image::parse(&format!(
            "oci://registry.example.com/halos/halo-filter@sha256:{}",
            "ab".repeat(32)
        ))
        .expect("image"),
        namespace: "istio-system".into(),
        selector: [("istio".to_string(), "ingressgateway".to_string())].into(),
        gateways: vec!["istio-system/halo-gateway".into()],
        hosts: vec!["*".into()],
        image_pull_policy: "IfNotPresent".into(),
        image_pull_secret: None,
        jwks_uri: None,
        settings: json!({}),
        delivery: Delivery::EnvoyFilter,
        kill_switch: Some(KillSwitchRef {
            service: HALO_SERVER.into(),
            port: kill_port,
            pubkey_pem: kill.pubkey_pem(),
            interval_seconds: Some(1),
        }),
        upstream_ca_credential: None,
    };
    let docs = istio::render(&snap, &opts).expect("render");
    let ef = docs
        .iter()
        .find(|d| d["kind"] == "EnvoyFilter")
        .expect("EnvoyFilter");
    let mut wasm = ef["spec"]["configPatches"][0]["patch"]["value"]["typed_config"].clone();
    let cluster_name = format!("outbound|{kill_port}||{HALO_SERVER}");
    let rendered: Value = serde_json::from_str(
        wasm["config"]["configuration"]["value"]
            .as_str()
            .expect("configuration string"),
    )
    .expect("configuration JSON");
    assert_eq!(rendered["settings"]["killSwitch"]["cluster"], cluster_name);
    assert_eq!(
        rendered["settings"]["killSwitch"]["tokenEnv"],
        GATEWAY_TOKEN_ENV
    );
    assert_eq!(wasm["config"]["allow_on_headers_stop_iteration"], true);

    // 2. The stand-in for istio-agent (see the module docs).
    wasm["config"]["vm_config"]["code"] = json!({"local": {
        "filename": halo_testkit::filter_wasm().display().to_string(),
    }});

    let cluster = halo_envoy_config::bootstrap::service_cluster(
        &halo_envoy_config::plan::ServicePlan::new(
            "kill-list server",
            &cluster_name,
            &kill.url,
            halo_envoy_config::tls::DEFAULT_UPSTREAM_CA_FILE,
        )
        .expect("url"),
    );
    kill_reaches_routing(
        &snap,
        &issuer,
        &kill,
        wasm,
        cluster,
        istio::ISTIO_JWT_PAYLOAD_KEY,
    )
    .await;
}

/// Start Envoy with the standalone listener and model clusters for `snap`, the wasm filter
/// config `wasm` and the kill-list cluster `cluster`; kill sonnet-canary and wait for a
/// canary user to fall back to control through the poll.
async fn kill_reaches_routing(
    snap: &halo_policy::Snapshot,
    issuer: &Issuer,
    kill: &KillServer,
    wasm: Value,
    cluster: Value,
    payload_key: &str,
) {
    let cluster_name = cluster["name"].as_str().expect("cluster name").to_string();
    let port = halo_testkit::free_port();
    let admin = halo_testkit::free_port();
    let boot = halo_envoy_config::bootstrap::Standalone {
        gateway: halo_envoy_config::plan::GatewaySettings {
            listen_address: "127.0.0.1".into(),
            listen_port: port,
            wasm_path: halo_testkit::filter_wasm().display().to_string(),
            ..halo_envoy_config::plan::GatewaySettings::default()
        },
        admin_address: "127.0.0.1".into(),
        admin_port: admin,
    };
    let mut doc = halo_envoy_config::bootstrap::standalone(snap, &boot).expect("bootstrap");
    set_payload_key(&mut doc, payload_key);
    wasm_filter_mut(&mut doc)["typed_config"] = wasm;
    doc["static_resources"]["clusters"]
        .as_array_mut()
        .expect("clusters")
        .push(cluster);
    let yaml = halo_envoy_config::yaml::to_yaml(&doc);
    let envoy = tokio::task::block_in_place(|| {
        // The gateway token in Envoy's environment, which it passes to the plugin VM
        // through the rendered `host_env_keys`: the filter reads `tokenEnv` itself.
        halo_testkit::envoy::Envoy::start_with_env(
            &yaml,
            admin,
            &[(GATEWAY_TOKEN_ENV, Some(KILL_TOKEN))],
        )
    });

    // A user in the canary arm of sonnet-canary.
    let user = (0..10_000)
        .map(|i| format!("cand{i}@acme.test"))
        .find(|u| {
            let e = snap.experiment("sonnet-canary").expect("experiment");
            halo_policy::decide::assigned_variant(e, u) == Some(1)
        })
        .expect("a canary user");
    let token = bearer(&issuer.token(&user, &[]));
    let client = client_builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let sonnet = || async {
        let resp = client
            .post(format!("http://127.0.0.1:{port}/v1/messages"))
            .header("authorization", token.as_str())
            .header("content-type", "application/json")
            .body(
                json!({"model": "sonnet", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
                    .to_string(),
            )
            .send()
            .await
            .unwrap_or_else(|e| panic!("request: {e}\n{}", envoy.logs()));
        assert_eq!(resp.status().as_u16(), 200, "{}", envoy.logs());
        let body: Value = resp.json().await.expect("JSON body");
        body["model"].as_str().unwrap_or("").to_string()
    };

    // 4. Nothing killed: the canary arm. Then a kill, picked up by the poll.
    assert_eq!(sonnet().await, CANARY);
    kill.serve_kills(&["sonnet-canary"], &[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if sonnet().await == CONTROL {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the kill never reached routing through {cluster_name}\n{}",
            envoy.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The poll went through the Istio-named cluster.
    let polled = envoy
        .stat(&format!("cluster.{cluster_name}.upstream_rq_completed"))
        .unwrap_or(0);
    assert!(polled > 0, "no request through {cluster_name}");
}

/// Envoy Gateway: the EnvoyExtensionPolicy's config and env, the EnvoyPatchPolicy's
/// stop-iteration field and its `halo-killswitch` cluster (the whole cluster resource, as
/// Envoy Gateway adds it), assembled the way Envoy Gateway's translator builds the wasm
/// filter (internal/xds/translator/wasm.go at d32f2829: name, VM id, v8, code, env,
/// configuration as a StringValue, root id, failOpen). Stand-ins: the module is a local
/// file (Envoy Gateway serves it from its wasm cache), the service is 127.0.0.1 (no
/// cluster DNS here), and tokenEnv is resolved into token (the filter change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_reaches_the_filter_rendered_for_envoy_gateway_through_the_patched_cluster() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let kill = KillServer::start().await;
    let mut snap = test_snapshot(&issuer.url, &p);
    for alias in ["weighted", "gpt", "gemini-pro"] {
        snap.models.remove(alias);
    }
    let kill_port: u16 = kill
        .url
        .split(':')
        .nth(2)
        .and_then(|s| s.split('/').next())
        .and_then(|s| s.parse().ok())
        .expect("kill server port");
    let opts = GatewayOptions {
        image: Image::parse(&format!(
            "oci://registry.example.com/halos/halo-filter@sha256:{}",
            "ab".repeat(32)
        ))
        .expect("image"),
        namespace: "halos".into(),
        gateway: "halo-gateway".into(),
        hosts: Vec::new(),
        image_pull_policy: "IfNotPresent".into(),
        image_pull_secret: None,
        jwks_uri: None,
        settings: json!({}),
        listener: "halos/halo-gateway/https".into(),
        kill_switch: Some(KillSwitchRef {
            service: "127.0.0.1".into(),
            port: kill_port,
            pubkey_pem: kill.pubkey_pem(),
            interval_seconds: Some(1),
        }),
    };
    let docs = envoy_gateway::render(&snap, &opts).expect("render");
    let by_kind = |k: &str| docs.iter().find(|d| d["kind"] == k).expect(k).clone();
    let policy = by_kind("EnvoyExtensionPolicy");
    let patch = by_kind("EnvoyPatchPolicy");
    let w = &policy["spec"]["wasm"][0];
    let config = w["config"].clone();
    assert_eq!(
        config["settings"]["killSwitch"]["tokenEnv"],
        GATEWAY_TOKEN_ENV
    );
    let mut plugin = json!({
        "name": w["name"],
        "root_id": w["rootID"],
        "fail_open": w["failOpen"],
        "vm_config": {
            "vm_id": "envoyextensionpolicy/halos/halo/wasm/0",
            "runtime": "envoy.wasm.runtime.v8",
            "code": {"local": {"filename": halo_testkit::filter_wasm().display().to_string()}},
            "environment_variables": {"host_env_keys": w["env"]["hostKeys"]},
        },
        "configuration": {
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": config.to_string(),
        },
    });
    // The EnvoyPatchPolicy's first patch, applied at its path under the filter.
    let op = &patch["spec"]["jsonPatches"][0]["operation"];
    let field = op["path"]
        .as_str()
        .and_then(|p| p.strip_prefix("/typed_config/config/"))
        .expect("a field of the filter's PluginConfig");
    plugin[field] = op["value"].clone();
    let wasm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": plugin,
    });
    let cluster = patch["spec"]["jsonPatches"][1]["operation"]["value"].clone();
    assert_eq!(cluster["name"], "halo-killswitch");
    kill_reaches_routing(&snap, &issuer, &kill, wasm, cluster, &issuer.url).await;
}
