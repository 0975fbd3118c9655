//! Golden files and upstream CRD schema checks for every renderer. Regenerate the golden
//! files with `UPDATE_GOLDEN=1 cargo test -p halo-mesh`. The CRDs are read from
//! ../shared/crds beside the workspace (CI checks shared/ out there); a missing directory
//! fails the test.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

mod common;

use common::{check_against_schemas, golden, manifest_dir, schemas};
use halo_mesh::envoy_gateway::{self, GatewayOptions};
use halo_mesh::istio::{self, Delivery, IstioOptions};
use halo_mesh::service::ServiceOptions;
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
    assert_eq!(rules.len(), 2);
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
        1,
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
    assert_eq!(kind(&docs, "BackendTLSPolicy").len(), 1);
    assert_eq!(kind(&docs, "Backend").len(), 2);
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
    check_against_schemas(&docs, &schemas());

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
fn the_in_proxy_mode_refuses_every_target_that_needs_the_attempt_stage_naming_alias_target_and_mode()
 {
    let snap = snapshot("failover");
    for err in [
        istio::render(&snap, &istio_options()).expect_err("istio"),
        envoy_gateway::render(&snap, &gateway_options()).expect_err("envoy gateway"),
    ] {
        let MeshError::InProxy(refused) = &err else {
            panic!("{err}")
        };
        assert!(
            refused
                .iter()
                .any(|u| u.alias == "gpt"
                    && u.needs.contains(&"its own model id on failover or split")),
            "{err}"
        );
        let text = err.to_string();
        for needle in ["\"gpt\"", "model id", "--mode service", "per-attempt stage"] {
            assert!(text.contains(needle), "{needle} missing: {text}");
        }
    }

    // The project's own example: every alias target that needs the stage is listed, each
    // with what it needs, so one refusal says everything the in-proxy mode cannot serve.
    let acme = acme_corp();
    let MeshError::InProxy(refused) = istio::render(&acme, &istio_options()).expect_err("acme")
    else {
        panic!("an in-proxy refusal")
    };
    let find = |alias: &str, target: &str| {
        refused
            .iter()
            .find(|u| u.scope == "models" && u.alias == alias && u.target == target)
            .unwrap_or_else(|| panic!("{alias} -> {target} not refused: {refused:?}"))
    };
    let opus = find(
        "opus",
        "bedrock-use1/arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/p7q2opus41bb",
    );
    assert!(opus.needs.contains(&"SigV4 signing"), "{opus:?}");
    assert!(
        find("sonnet", "vertex-use5/claude-sonnet-4-5@20250929")
            .needs
            .contains(&"a minted Google token")
    );
    assert!(
        find("gpt", "azure-openai-eus2/gpt-5-codex")
            .needs
            .contains(&"translation")
    );
    assert!(
        find("gpt", "openai/gpt-5-codex")
            .needs
            .contains(&"the gateway's own credential")
    );
    // haiku is one anthropic target without a credential: the in-proxy mode serves it.
    assert!(
        refused
            .iter()
            .all(|u| !(u.scope == "models" && u.alias == "haiku")),
        "{refused:?}"
    );
    // Toggles' and experiments' routes are checked as the gateway's are.
    assert!(refused.iter().any(|u| u.scope != "models"), "{refused:?}");
    let line = refused[0].to_string();
    assert!(line.ends_with("served by --mode service"), "{line}");

    // A single target of a credentialed kind is refused too: the mesh's Envoy has no
    // credential chain, so the provider would get no key.
    let mut single = snapshot("mesh-corp");
    if let Some(u) = single.upstreams.get_mut("anthropic-direct") {
        u.credential = Some(halo_policy::types::Credential {
            env: Some("ANTHROPIC_API_KEY".into()),
            file: None,
        });
    }
    let err = envoy_gateway::render(&single, &gateway_options()).expect_err("credential");
    assert!(err.to_string().contains("\"default\" target anthropic-direct/claude-sonnet-4-5-20250929: needs the gateway's own credential"), "{err}");
}

fn acme_corp() -> Snapshot {
    let org = halo_policy::load::load_dir(&manifest_dir().join("../examples/acme-corp"))
        .expect("examples/acme-corp loads");
    halo_policy::compile(&org)
}

fn acme_policy_files() -> Vec<(String, String)> {
    fn walk(root: &std::path::Path, dir: &std::path::Path, out: &mut Vec<(String, String)>) {
        for e in std::fs::read_dir(dir).expect("dir") {
            let path = e.expect("entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|x| x == "yaml") {
                let rel = path.strip_prefix(root).expect("under root");
                out.push((
                    rel.to_string_lossy().into_owned(),
                    std::fs::read_to_string(&path).expect("policy file"),
                ));
            }
        }
    }
    let root = manifest_dir().join("../examples/acme-corp");
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out.sort();
    out
}

fn service_options() -> ServiceOptions {
    ServiceOptions {
        namespace: "halos".into(),
        envoy_image: format!("docker.io/envoyproxy/envoy@sha256:{}", "4".repeat(64)),
        server_image: format!(
            "registry.example.com/halos/halo-server@sha256:{}",
            "1".repeat(64)
        ),
        filter_image: image(),
        credentials_image: Some(format!(
            "registry.example.com/halos/halo-credentials@sha256:{}",
            "2".repeat(64)
        )),
        policy_files: acme_policy_files(),
        replicas: 2,
        data_size: "5Gi".into(),
        provider_keys_secret: "halo-provider-keys".into(),
        settings: json!({}),
        jwks_uri: None,
        monitoring_namespace: "monitoring".into(),
        image_pull_policy: "IfNotPresent".into(),
    }
}

fn istio_service() -> Vec<Value> {
    istio::render_service(
        &acme_corp(),
        &service_options(),
        &["istio-system/halo-gateway".to_string()],
        &["halo-gateway.acme.com".to_string()],
    )
    .expect("the service mode renders examples/acme-corp")
}

fn envoy_gateway_service() -> Vec<Value> {
    envoy_gateway::render_service(
        &acme_corp(),
        &service_options(),
        "halo-gateway",
        &["halo-gateway.acme.com".to_string()],
    )
    .expect("the service mode renders examples/acme-corp")
}

#[test]
fn the_service_mode_renders_examples_acme_corp_for_both_meshes_matching_the_golden_files() {
    // The policy files' contents are halo-server's ConfigMap verbatim: the golden files
    // name them instead, so an edit to the example does not touch them.
    let mut opts = service_options();
    for (path, text) in &mut opts.policy_files {
        *text = format!("<examples/acme-corp/{path}>");
    }
    let hosts = ["halo-gateway.acme.com".to_string()];
    let istio = istio::render_service(
        &acme_corp(),
        &opts,
        &["istio-system/halo-gateway".to_string()],
        &hosts,
    )
    .expect("istio");
    golden(
        "istio-service.yaml",
        &to_yaml(&istio, "rendered from examples/acme-corp"),
    );
    let eg = envoy_gateway::render_service(&acme_corp(), &opts, "halo-gateway", &hosts)
        .expect("envoy gateway");
    golden(
        "envoy-gateway-service.yaml",
        &to_yaml(&eg, "rendered from examples/acme-corp"),
    );
}

#[test]
fn every_service_mode_manifest_passes_its_schema_kubernetes_or_crd() {
    let schemas = schemas();
    check_against_schemas(&istio_service(), &schemas);
    check_against_schemas(&envoy_gateway_service(), &schemas);
}

fn named<'a>(docs: &'a [Value], kind_name: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind_name && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind_name} {name} missing"))
}

#[test]
fn the_gateway_boots_from_the_bootstrap_the_xds_live_suites_run() {
    let docs = istio_service();
    let shipped = named(&docs, "ConfigMap", "halo-gateway")["data"]["envoy.yaml"]
        .as_str()
        .expect("envoy.yaml");
    // By construction: the one function the live suites (e2e/src/xds.rs,
    // server/tests/support/gateway.rs) boot Envoy with, over the same compiled-in
    // envoy/ads.yaml; only the three values the file marks differ (and STATIC becomes
    // STRICT_DNS for a Service name).
    let suites =
        halo_envoy_config::ads::AdsBootstrap::loopback("halo-gateway", 18000, 9901).render();
    assert_eq!(suites, halo_envoy_config::ads::ADS_YAML);
    let differ: Vec<(&str, &str)> = suites
        .lines()
        .zip(shipped.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(
        differ,
        [
            (
                "    socket_address: { address: 127.0.0.1, port_value: 9901 }",
                "    socket_address: { address: 0.0.0.0, port_value: 9901 }"
            ),
            ("      type: STATIC", "      type: STRICT_DNS"),
            (
                "                    socket_address: { address: 127.0.0.1, port_value: 18000 }",
                "                    socket_address: { address: halo-server.halos.svc.cluster.local, port_value: 18000 }"
            ),
        ]
    );
    // The ADS address is halo-server's Service and its xDS port, which halo-server listens
    // on and the NetworkPolicy opens to the gateway pods alone.
    let server = named(&docs, "Deployment", "halo-server");
    let args = server["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args");
    let after = |flag: &str| {
        let i = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("{flag}"));
        args[i + 1].as_str().expect("value").to_string()
    };
    assert_eq!(after("--xds-listen"), "0.0.0.0:18000");
    let np = named(&docs, "NetworkPolicy", "halo-server");
    let xds_rule = np["spec"]["ingress"]
        .as_array()
        .expect("rules")
        .iter()
        .find(|r| r["ports"][0]["port"] == 18000)
        .expect("xds rule");
    assert_eq!(
        xds_rule["from"],
        json!([{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "halo-gateway"}}}])
    );
    // The gateway file halo-server reads decodes strictly into the settings the plan takes,
    // and points the filter at the module the image volume mounts.
    let file = named(&docs, "ConfigMap", "halo-xds-gateway")["data"]["xds-gateway.yaml"]
        .as_str()
        .expect("gateway file");
    let settings: halo_envoy_config::plan::GatewaySettings =
        serde_saphyr::from_str(file).expect("a valid gateway file");
    assert_eq!(settings.wasm_path, "/etc/halos/filter/plugin.wasm");
    assert_eq!(
        settings.vertex_token_sds.as_deref(),
        Some("/run/halo/sds/vertex.yaml")
    );
    assert_eq!(
        settings.killswitch_url.as_deref(),
        Some("http://halo-server.halos.svc.cluster.local:8080/api/v1/gateway/killswitch")
    );
    assert_eq!(
        settings.evidence.as_ref().map(|e| e.url.as_str()),
        Some("http://halo-server.halos.svc.cluster.local:4319"),
        "evidence to halo-server's gateway receiver (its own token file)"
    );
    let gw = named(&docs, "Deployment", "halo-gateway");
    let pod = &gw["spec"]["template"]["spec"];
    let filter = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "filter")
        .expect("filter volume");
    assert_eq!(filter["image"]["reference"], image().reference());
    let envoy = &pod["containers"][0];
    assert_eq!(envoy["readinessProbe"]["httpGet"]["path"], "/ready");
    // Provider keys by reference: each credential env the policy routes to, and AWS's.
    let env: Vec<&str> = envoy["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter(|e| e["valueFrom"]["secretKeyRef"]["name"] == "halo-provider-keys")
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(
        env,
        [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AZURE_OPENAI_API_KEY",
            "GEMINI_API_KEY",
            "OPENAI_API_KEY"
        ]
    );
    assert_eq!(
        pod["containers"][1]["name"], "halo-credentials",
        "vertex: the token minter"
    );
}

#[test]
fn the_service_mode_keeps_admin_ports_private_and_secrets_out() {
    for docs in [istio_service(), envoy_gateway_service()] {
        assert!(
            kind(&docs, "Secret").is_empty(),
            "secrets are referenced, never rendered"
        );
        let text = to_yaml(&docs, "");
        assert!(!text.contains("BEGIN PRIVATE KEY"));
        for svc in kind(&docs, "Service") {
            for p in svc["spec"]["ports"].as_array().expect("ports") {
                assert!(
                    p["port"] != 9901 && p["port"] != 9090,
                    "an admin port is never a Service port: {svc}"
                );
            }
        }
        let np = named(&docs, "NetworkPolicy", "halo-gateway");
        let admin = np["spec"]["ingress"]
            .as_array()
            .expect("rules")
            .iter()
            .find(|r| r["ports"][0]["port"] == 9901)
            .expect("admin rule");
        assert_eq!(
            admin["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "monitoring"
        );
        let pdb = named(&docs, "PodDisruptionBudget", "halo-gateway");
        assert_eq!(pdb["spec"]["maxUnavailable"], 1);
        let pvc = named(&docs, "PersistentVolumeClaim", "halo-server-data");
        assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "5Gi");
    }
    // Istio: mesh mTLS to the gateway; TLS passthrough to the providers (the halo gateway
    // originates and verifies TLS itself).
    let docs = istio_service();
    assert_eq!(
        named(&docs, "DestinationRule", "halo-gateway")["spec"]["trafficPolicy"]["tls"]["mode"],
        "ISTIO_MUTUAL"
    );
    assert_eq!(
        named(&docs, "PeerAuthentication", "halo-gateway")["spec"]["mtls"]["mode"],
        "STRICT"
    );
    let bedrock = named(&docs, "ServiceEntry", "halo-upstream-bedrock-use1");
    assert_eq!(bedrock["spec"]["ports"][0]["protocol"], "TLS");
    assert!(
        kind(&docs, "DestinationRule").len() == 1,
        "no TLS origination by the sidecar"
    );
    let vs = named(&docs, "VirtualService", "halo-gateway");
    assert_eq!(
        vs["spec"]["http"][0]["route"][0]["destination"]["host"],
        "halo-gateway.halos.svc.cluster.local"
    );
    // Envoy Gateway: the HTTPRoute to the gateway's Service, no request timeout.
    let docs = envoy_gateway_service();
    let route = named(&docs, "HTTPRoute", "halo-gateway");
    assert_eq!(
        route["spec"]["rules"][0]["backendRefs"][0]["name"],
        "halo-gateway"
    );
    assert_eq!(route["spec"]["rules"][0]["backendRefs"][0]["port"], 8080);
    // Vertex without the minter's image is refused, not rendered without a token.
    let mut opts = service_options();
    opts.credentials_image = None;
    let err = istio::render_service(&acme_corp(), &opts, &[], &[]).expect_err("no minter");
    assert!(err.to_string().contains("--credentials-image"), "{err}");
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
    check_against_schemas(
        &istio::render(&snap, &istio_options()).expect("istio"),
        &schemas,
    );
    check_against_schemas(
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
    let result = std::panic::catch_unwind(|| check_against_schemas(&docs[..1], &schemas));
    assert!(
        result.is_err(),
        "a filter class outside the CRD's enum must be refused"
    );
    docs[0] = good;
    docs[0]["spec"]["workloadSelectors"] = json!("typo");
    let result = std::panic::catch_unwind(|| check_against_schemas(&docs[..1], &schemas));
    assert!(
        result.is_err(),
        "a field Kubernetes would prune must be refused"
    );
    // Built-in kinds too: Kubernetes' own schema refuses a misspelt Deployment field and
    // a wrongly typed port.
    let service = istio_service();
    let deployment = named(&service, "Deployment", "halo-gateway").clone();
    let mut typo = deployment.clone();
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = json!({});
    let result = std::panic::catch_unwind(|| check_against_schemas(&[typo], &schemas));
    assert!(
        result.is_err(),
        "a misspelt container field must be refused"
    );
    let mut wrong = deployment;
    wrong["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] =
        json!("eighty");
    let result = std::panic::catch_unwind(|| check_against_schemas(&[wrong], &schemas));
    assert!(result.is_err(), "a string containerPort must be refused");
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
        xds: None,
        data_claim_size: None,
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
