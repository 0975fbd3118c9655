//! The kill list on the Istio mesh path: `halo istio render` configures the filter to poll
//! halo-server through Istio's outbound cluster (`outbound|PORT||<halo-server FQDN>`). This
//! test takes the Envoy Wasm filter config out of the rendered EnvoyFilter, runs it in a
//! real Envoy next to a cluster named exactly like Istio's, and shows that a kill served by
//! the kill-list server reaches routing through the poll.
//!
//! Two substitutions stand in for the parts of a mesh that are not here, both explicit:
//! - istio-agent's rewrite of `vm_config.code.remote` (the oci:// image) to a local file:
//!   the module is the workspace build (the image round trip is tests/wasm_image.rs);
//! - the gateway token: the rendered config names it by environment variable
//!   (`killSwitch.tokenEnv: HALO_GATEWAY_TOKEN`, listed in the VM's host_env_keys). Until
//!   the filter reads `tokenEnv` from the VM environment, the harness resolves it into
//!   `token` from that same environment variable, which is what the filter change does.

use std::time::{Duration, Instant};

use halo_e2e::*;
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

/// The wasm filter entry of the bootstrap's HTTP filter chain.
fn wasm_filter_mut(doc: &mut Value) -> &mut Value {
    let filters = doc
        .pointer_mut(
            "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters",
        )
        .and_then(Value::as_array_mut)
        .expect("the bootstrap's HTTP filters");
    filters
        .iter_mut()
        .find(|f| f["name"] == "envoy.filters.http.wasm")
        .expect("the wasm filter")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_reaches_the_filter_rendered_for_istio_through_the_outbound_cluster_poll() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let kill = KillServer::start().await;
    let mut snap = test_snapshot(&issuer.url, &p);
    // The mesh path refuses multi-target aliases; the kill list does not depend on them.
    snap.models.remove("weighted");
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

    // 2. The two stand-ins (see the module docs).
    wasm["config"]["vm_config"]["code"] = json!({"local": {
        "filename": halo_testkit::filter_wasm().display().to_string(),
    }});
    // SAFETY: set before Envoy starts, read by nothing else in this test binary.
    unsafe { std::env::set_var(GATEWAY_TOKEN_ENV, KILL_TOKEN) };
    let mut cfg = rendered.clone();
    let ks = cfg["settings"]["killSwitch"]
        .as_object_mut()
        .expect("killSwitch");
    ks.remove("tokenEnv");
    ks.insert(
        "token".into(),
        json!(std::env::var(GATEWAY_TOKEN_ENV).expect("token env")),
    );
    wasm["config"]["configuration"]["value"] = json!(cfg.to_string());

    // 3. A gateway Envoy: the standalone listener and model clusters for the same
    // snapshot, the rendered filter config, and halo-server's cluster named like Istio's.
    let port = halo_testkit::free_port();
    let admin = halo_testkit::free_port();
    let boot = halo_envoy_config::bootstrap::Standalone {
        listen_address: "127.0.0.1".into(),
        listen_port: port,
        admin_address: "127.0.0.1".into(),
        admin_port: admin,
        wasm_path: halo_testkit::filter_wasm().display().to_string(),
        jwks_uri: None,
        settings: json!({}),
        killswitch_url: None,
    };
    let mut doc = halo_envoy_config::bootstrap::standalone(&snap, &boot).expect("bootstrap");
    set_payload_key(&mut doc, istio::ISTIO_JWT_PAYLOAD_KEY);
    wasm_filter_mut(&mut doc)["typed_config"] = wasm;
    let ep = halo_envoy_config::bootstrap::endpoint("kill-list server", &kill.url).expect("url");
    doc["static_resources"]["clusters"]
        .as_array_mut()
        .expect("clusters")
        .push(halo_envoy_config::bootstrap::cluster(&cluster_name, &ep));
    let yaml = halo_envoy_config::yaml::to_yaml(&doc);
    let envoy = tokio::task::block_in_place(|| halo_testkit::envoy::Envoy::start(&yaml, admin));

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
