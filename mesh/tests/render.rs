//! Golden files and upstream CRD schema checks for every renderer. Regenerate the golden
//! files with `UPDATE_GOLDEN=1 cargo test -p halo-mesh`. The CRDs are read from
//! ../shared/crds beside the workspace (CI checks shared/ out there); a missing directory
//! fails the test.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

mod common;

use common::{check_against_crds, golden, manifest_dir, schemas};
use halo_mesh::envoy_gateway::{self, GatewayOptions};
use halo_mesh::istio::{self, Delivery, IstioOptions};
use halo_mesh::{Image, KillSwitchRef, MeshError, to_yaml};
use halo_policy::Snapshot;
use serde_json::{Value, json};

fn snapshot(fixture: &str) -> Snapshot {
    let dir = manifest_dir().join("tests/fixtures").join(fixture);
    let org = halo_policy::load::load_dir(&dir)
        .unwrap_or_else(|e| panic!("fixture {fixture} loads: {e:?}"));
    halo_policy::compile(&org)
}

fn image() -> Image {
    Image::parse(&format!(
        "oci://registry.example.com/halos/halo-filter@sha256:{}",
        "0123456789abcdef".repeat(4)
    ))
    .expect("pinned image")
}

fn istio_options() -> IstioOptions {
    IstioOptions {
        image: image(),
        namespace: "istio-system".into(),
        selector: BTreeMap::from([("istio".to_string(), "ingressgateway".to_string())]),
        gateways: vec!["istio-system/halo-gateway".into()],
        hosts: vec!["halo-gateway.mesh-corp.example".into()],
        image_pull_policy: "IfNotPresent".into(),
        image_pull_secret: None,
        jwks_uri: None,
        settings: json!({}),
        delivery: Delivery::EnvoyFilter,
        kill_switch: Some(kill_switch()),
        upstream_ca_credential: None,
    }
}

fn kill_switch() -> KillSwitchRef {
    KillSwitchRef {
        service: "halo-server.halos.svc.cluster.local".into(),
        port: 8080,
        pubkey_pem: std::fs::read_to_string(manifest_dir().join("tests/fixtures/killswitch.pub"))
            .expect("public key fixture"),
        interval_seconds: None,
    }
}

fn gateway_options() -> GatewayOptions {
    GatewayOptions {
        image: image(),
        namespace: "halos".into(),
        gateway: "halo-gateway".into(),
        hosts: vec!["halo-gateway.mesh-corp.example".into()],
        image_pull_policy: "IfNotPresent".into(),
        image_pull_secret: Some("halo-registry".into()),
        jwks_uri: None,
        settings: json!({}),
        listener: "halos/halo-gateway/https".into(),
        kill_switch: Some(kill_switch()),
    }
}

#[test]
fn istio_manifests_match_the_golden_file() {
    let docs = istio::render(&snapshot("mesh-corp"), &istio_options()).expect("render");
    golden(
        "istio.yaml",
        &to_yaml(&docs, "rendered from tests/fixtures/mesh-corp"),
    );
}

#[test]
fn envoy_gateway_manifests_match_the_golden_file() {
    let docs = envoy_gateway::render(&snapshot("mesh-corp"), &gateway_options()).expect("render");
    golden(
        "envoy-gateway.yaml",
        &to_yaml(&docs, "rendered from tests/fixtures/mesh-corp"),
    );
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// The Envoy Wasm filter config inside the rendered EnvoyFilter (its EXTENSION_CONFIG).
fn envoy_filter_wasm(docs: &[Value]) -> Value {
    let ef = kind(docs, "EnvoyFilter")[0];
    let ext = ef["spec"]["configPatches"]
        .as_array()
        .expect("patches")
        .iter()
        .find(|p| p["applyTo"] == "EXTENSION_CONFIG")
        .expect("EXTENSION_CONFIG patch");
    ext["patch"]["value"]["typed_config"]["config"].clone()
}

#[test]
fn the_envoy_filter_carries_the_stop_iteration_knob_and_a_configuration_the_filter_accepts() {
    let snap = snapshot("mesh-corp");
    let docs = istio::render(&snap, &istio_options()).expect("render");
    assert!(kind(&docs, "WasmPlugin").is_empty(), "EnvoyFilter delivery");
    let ef = kind(&docs, "EnvoyFilter")[0];
    assert_eq!(
        ef["spec"]["workloadSelector"]["labels"]["istio"],
        "ingressgateway"
    );
    let insert = &ef["spec"]["configPatches"][1];
    assert_eq!(insert["applyTo"], "HTTP_FILTER");
    assert_eq!(insert["match"]["context"], "GATEWAY");
    assert_eq!(
        insert["patch"]["filterClass"], "AUTHZ",
        "after Istio's jwt_authn"
    );
    let wasm = envoy_filter_wasm(&docs);
    assert_eq!(
        insert["patch"]["value"]["name"], ef["spec"]["configPatches"][0]["patch"]["value"]["name"],
        "the filter chain entry names the extension config"
    );
    // The knob the filter needs, set exactly as the standalone bootstrap sets it.
    let standalone = halo_envoy_config::bootstrap::halo_filter("x.wasm", &snap, &json!({}));
    assert_eq!(
        wasm["allow_on_headers_stop_iteration"],
        standalone["typed_config"]["config"]["allow_on_headers_stop_iteration"]
    );
    assert_eq!(wasm["allow_on_headers_stop_iteration"], true);
    assert_eq!(wasm["fail_open"], false);
    let remote = &wasm["vm_config"]["code"]["remote"];
    assert_eq!(remote["sha256"], image().sha256);
    assert_eq!(remote["http_uri"]["uri"], image().oci_url());
    let cfg: Value = serde_json::from_str(
        wasm["configuration"]["value"]
            .as_str()
            .expect("string config"),
    )
    .expect("JSON config");
    assert_eq!(cfg["settings"]["identity"]["jwtMetadataKey"], "payload");
    let back = Snapshot::from_bytes(cfg["snapshot"].to_string().as_bytes()).expect("snapshot");
    assert_eq!(
        back, snap,
        "the snapshot round-trips through the configuration"
    );
    // The kill list: polled through Istio's outbound cluster for halo-server, the token by
    // environment variable only.
    let ks = &cfg["settings"]["killSwitch"];
    assert_eq!(
        ks["cluster"],
        "outbound|8080||halo-server.halos.svc.cluster.local"
    );
    assert_eq!(
        ks["url"],
        "http://halo-server.halos.svc.cluster.local:8080/api/v1/gateway/killswitch"
    );
    assert_eq!(ks["tokenEnv"], "HALO_GATEWAY_TOKEN");
    assert!(ks.get("token").is_none(), "no token in a manifest");
    assert_eq!(
        wasm["vm_config"]["environment_variables"]["host_env_keys"],
        json!(["HALO_GATEWAY_TOKEN"])
    );

    // One DestinationRule per routed upstream, breaker 5 x 5xx / 30 s; TLS only for https.
    let rules = kind(&docs, "DestinationRule");
    assert_eq!(rules.len(), 3);
    for r in &rules {
        let od = &r["spec"]["trafficPolicy"]["outlierDetection"];
        assert_eq!(
            (
                od["consecutive5xxErrors"].as_u64(),
                od["baseEjectionTime"].as_str()
            ),
            (Some(5), Some("30s"))
        );
    }
    let orch = rules
        .iter()
        .find(|r| r["metadata"]["name"] == "halo-upstream-orchestrator")
        .expect("orchestrator");
    assert!(
        orch["spec"]["trafficPolicy"].get("tls").is_none(),
        "http upstream: no TLS"
    );
    // An https upstream's certificate is verified: the host as SNI and subject alt name,
    // the system CA bundle by default, a private CA's Secret when one is given.
    let anthropic = rules
        .iter()
        .find(|r| r["spec"]["host"] == "api.anthropic.com")
        .expect("anthropic");
    assert_eq!(
        anthropic["spec"]["trafficPolicy"]["tls"],
        json!({"mode": "SIMPLE", "sni": "api.anthropic.com",
               "subjectAltNames": ["api.anthropic.com"], "insecureSkipVerify": false})
    );
    let private = istio::render(
        &snap,
        &IstioOptions {
            upstream_ca_credential: Some("provider-ca".into()),
            ..istio_options()
        },
    )
    .expect("render");
    for r in kind(&private, "DestinationRule") {
        if let Some(tls) = r["spec"]["trafficPolicy"].get("tls") {
            assert_eq!(tls["credentialName"], "provider-ca", "{r}");
        }
    }
    assert_eq!(
        kind(&docs, "ServiceEntry").len(),
        2,
        "the in-cluster service needs no ServiceEntry"
    );

    let docs = envoy_gateway::render(&snap, &gateway_options()).expect("render");
    let policy = kind(&docs, "EnvoyExtensionPolicy")[0];
    let wasm = &policy["spec"]["wasm"][0];
    assert_eq!(
        wasm["config"]["settings"]["identity"]["jwtMetadataKey"],
        "https://idp.mesh-corp.example/oauth2/default"
    );
    assert_eq!(
        wasm["config"]["settings"]["killSwitch"]["cluster"],
        "halo-killswitch"
    );
    assert_eq!(wasm["env"]["hostKeys"], json!(["HALO_GATEWAY_TOKEN"]));
    assert_eq!(kind(&docs, "BackendTLSPolicy").len(), 2);
    assert_eq!(kind(&docs, "Backend").len(), 3);
    // The EnvoyPatchPolicy sets the knob on the filter Envoy Gateway names after the
    // policy, and adds the cluster the kill-list poll names.
    let patch = kind(&docs, "EnvoyPatchPolicy")[0];
    let ops = patch["spec"]["jsonPatches"].as_array().expect("patches");
    assert_eq!(ops[0]["name"], "halos/halo-gateway/https");
    assert_eq!(
        ops[0]["operation"]["jsonPath"],
        "..http_filters[?(@.name=='envoy.filters.http.wasm/envoyextensionpolicy/halos/halo/wasm/0')]"
    );
    assert_eq!(
        ops[0]["operation"]["path"],
        "/typed_config/config/allow_on_headers_stop_iteration"
    );
    assert_eq!(ops[1]["operation"]["value"]["name"], "halo-killswitch");
    assert_eq!(
        ops[1]["operation"]["value"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            ["address"]["socket_address"]["address"],
        "halo-server.halos.svc.cluster.local"
    );
}

#[test]
fn the_wasm_plugin_delivery_is_still_rendered_but_warned_about_and_secrets_stay_out() {
    let snap = snapshot("mesh-corp");
    let mut opts = istio_options();
    opts.delivery = Delivery::WasmPlugin;
    opts.image_pull_secret = Some("halo-registry".into());
    let docs = istio::render(&snap, &opts).expect("render");
    let plugin = kind(&docs, "WasmPlugin")[0];
    assert_eq!(plugin["spec"]["phase"], "AUTHZ", "after Istio's jwt_authn");
    assert_eq!(plugin["spec"]["failStrategy"], "FAIL_CLOSE");
    assert_eq!(plugin["spec"]["imagePullSecret"], "halo-registry");
    assert_eq!(
        plugin["spec"]["vmConfig"]["env"],
        json!([{"name": "HALO_GATEWAY_TOKEN", "valueFrom": "HOST"}])
    );
    assert!(istio::WASM_PLUGIN_WARNING.contains("allow_on_headers_stop_iteration"));
    check_against_crds(&docs, &schemas());

    // The EnvoyFilter delivery cannot reference a pull Secret: refused, not inlined.
    let mut opts = istio_options();
    opts.image_pull_secret = Some("halo-registry".into());
    let err = istio::render(&snap, &opts).expect_err("pull secret with EnvoyFilter");
    assert!(err.to_string().contains("--delivery wasm-plugin"), "{err}");

    // A token given inline in the settings is refused by both renderers.
    let mut opts = istio_options();
    opts.settings = json!({"killSwitch": {"token": "s3cret"}});
    let err = istio::render(&snap, &opts).expect_err("inline token");
    assert!(err.to_string().contains("never rendered"), "{err}");
    let mut opts = gateway_options();
    opts.settings = json!({"killSwitch": {"token": "s3cret"}});
    assert!(envoy_gateway::render(&snap, &opts).is_err());
}

#[test]
fn failover_routes_are_refused_naming_the_alias() {
    let snap = snapshot("failover");
    for err in [
        istio::render(&snap, &istio_options()).expect_err("istio"),
        envoy_gateway::render(&snap, &gateway_options()).expect_err("envoy gateway"),
    ] {
        assert!(
            matches!(&err, MeshError::Failover { alias, count: 2, .. } if alias == "gpt"),
            "{err}"
        );
        let text = err.to_string();
        // Names the alias, why (the per-target model id), and what to do instead.
        for needle in ["\"gpt\"", "model id", "halo xDS server", "--xds-listen"] {
            assert!(text.contains(needle), "{needle} missing: {text}");
        }
    }
}

#[test]
fn a_tag_only_image_is_refused() {
    let err = Image::parse("oci://registry.example.com/halos/halo-filter:latest").expect_err("tag");
    assert!(err.to_string().contains("not pinned"), "{err}");
}

#[test]
fn every_manifest_is_valid_against_the_upstream_crds() {
    let schemas = schemas();
    let snap = snapshot("mesh-corp");
    check_against_crds(
        &istio::render(&snap, &istio_options()).expect("istio"),
        &schemas,
    );
    check_against_crds(
        &envoy_gateway::render(&snap, &gateway_options()).expect("envoy gateway"),
        &schemas,
    );
}

#[test]
fn the_schema_check_catches_a_wrong_field() {
    let schemas = schemas();
    let mut docs = istio::render(&snapshot("mesh-corp"), &istio_options()).expect("istio");
    let good = docs[0].clone();
    docs[0]["spec"]["configPatches"][1]["patch"]["filterClass"] = json!("AFTER_AUTHN");
    let result = std::panic::catch_unwind(|| check_against_crds(&docs[..1], &schemas));
    assert!(
        result.is_err(),
        "a filter class outside the CRD's enum must be refused"
    );
    docs[0] = good;
    docs[0]["spec"]["workloadSelectors"] = json!("typo");
    let result = std::panic::catch_unwind(|| check_against_crds(&docs[..1], &schemas));
    assert!(
        result.is_err(),
        "a field Kubernetes would prune must be refused"
    );
}

fn control_plane_options() -> halo_mesh::control_plane::ControlPlaneOptions {
    let root = manifest_dir().join("tests/fixtures/mesh-corp");
    let mut policy_files = Vec::new();
    for name in ["gateway.yaml", "halos.yaml", "profile.yaml", "rings.yaml"] {
        let text = std::fs::read_to_string(root.join(name)).expect("fixture file");
        policy_files.push((name.to_string(), text));
    }
    policy_files.push(("rings/extra.yaml".to_string(), "# nested\n".to_string()));
    halo_mesh::control_plane::ControlPlaneOptions {
        namespace: "halos".into(),
        image: format!(
            "registry.example.com/halos/halo-server@sha256:{}",
            "1".repeat(64)
        ),
        policy_files,
        killswitch_key_secret: "halo-killswitch-key".into(),
        gateway_token_secret: "halo-gateway-token".into(),
        fleet_token_secret: "halo-fleet-token".into(),
        data_claim: "halo-server-data".into(),
        monitoring_namespace: "monitoring".into(),
    }
}

#[test]
fn control_plane_manifests_match_the_golden_file_and_keep_secrets_and_admin_private() {
    let docs = halo_mesh::control_plane::render(&control_plane_options()).expect("render");
    golden(
        "control-plane.yaml",
        &to_yaml(&docs, "rendered from tests/fixtures/mesh-corp"),
    );
    assert!(
        kind(&docs, "Secret").is_empty(),
        "secrets are referenced, never rendered"
    );
    let service = kind(&docs, "Service")[0];
    let ports: Vec<u64> = service["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .filter_map(|p| p["port"].as_u64())
        .collect();
    assert_eq!(ports, [8080], "the admin port is not a Service port");
    let np = kind(&docs, "NetworkPolicy")[0];
    let admin_rule = np["spec"]["ingress"]
        .as_array()
        .expect("rules")
        .iter()
        .find(|r| r["ports"][0]["port"] == 9090)
        .expect("admin rule");
    assert!(
        admin_rule["from"].is_array(),
        "the admin port is open to the monitoring namespace only"
    );
    let cm = kind(&docs, "ConfigMap")[0];
    assert!(
        cm["data"]["rings__extra.yaml"].is_string(),
        "nested policy paths survive"
    );
}
