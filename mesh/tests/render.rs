//! Golden files and upstream CRD schema checks for every renderer. Regenerate the golden
//! files with `UPDATE_GOLDEN=1 cargo test -p halo-mesh`. The CRDs are read from
//! ../shared/crds beside the workspace (CI checks shared/ out there); a missing directory
//! fails the test.

use std::collections::BTreeMap;
use std::path::PathBuf;

use halo_mesh::envoy_gateway::{self, GatewayOptions};
use halo_mesh::istio::{self, IstioOptions};
use halo_mesh::{Image, MeshError, to_yaml};
use halo_policy::Snapshot;
use serde_json::{Value, json};

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

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
        image_pull_secret: Some("halo-registry".into()),
        jwks_uri: None,
        settings: json!({}),
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
    }
}

fn golden(name: &str, text: &str) {
    let path = manifest_dir().join("tests/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, text).expect("write golden");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run UPDATE_GOLDEN=1 cargo test -p halo-mesh)",
            path.display()
        )
    });
    assert!(
        committed == text,
        "{} is out of date: run UPDATE_GOLDEN=1 cargo test -p halo-mesh",
        path.display()
    );
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

#[test]
fn the_plugin_carries_a_configuration_the_filter_accepts_and_runs_after_istio_authn() {
    let snap = snapshot("mesh-corp");
    let docs = istio::render(&snap, &istio_options()).expect("render");
    let plugin = kind(&docs, "WasmPlugin")[0];
    assert_eq!(plugin["spec"]["phase"], "AUTHZ", "after Istio's jwt_authn");
    assert_eq!(plugin["spec"]["failStrategy"], "FAIL_CLOSE");
    assert_eq!(plugin["spec"]["sha256"], image().sha256);
    assert!(
        plugin["spec"]["url"]
            .as_str()
            .unwrap_or("")
            .starts_with("oci://")
    );
    let cfg = &plugin["spec"]["pluginConfig"];
    assert_eq!(cfg["settings"]["identity"]["jwtMetadataKey"], "payload");
    let back = Snapshot::from_bytes(cfg["snapshot"].to_string().as_bytes()).expect("snapshot");
    assert_eq!(back, snap, "the snapshot round-trips through pluginConfig");
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
    assert_eq!(
        kind(&docs, "ServiceEntry").len(),
        2,
        "the in-cluster service needs no ServiceEntry"
    );

    let docs = envoy_gateway::render(&snap, &gateway_options()).expect("render");
    let policy = kind(&docs, "EnvoyExtensionPolicy")[0];
    assert_eq!(
        policy["spec"]["wasm"][0]["config"]["settings"]["identity"]["jwtMetadataKey"],
        "https://idp.mesh-corp.example/oauth2/default"
    );
    assert_eq!(kind(&docs, "BackendTLSPolicy").len(), 2);
    assert_eq!(kind(&docs, "Backend").len(), 3);
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
        assert!(
            text.contains("\"gpt\"") && text.contains("failover"),
            "{text}"
        );
    }
}

#[test]
fn a_tag_only_image_is_refused() {
    let err = Image::parse("oci://registry.example.com/halos/halo-filter:latest").expect_err("tag");
    assert!(err.to_string().contains("not pinned"), "{err}");
}

// ---- schema checks ----

fn crds_dir() -> PathBuf {
    // The workspace root's sibling shared/ (CI's layout); HALO_CRDS_DIR overrides it for
    // a checkout elsewhere. Missing CRDs fail: the check never silently skips.
    let dir = match std::env::var_os("HALO_CRDS_DIR") {
        Some(d) => PathBuf::from(d),
        None => manifest_dir().join("../../shared/crds"),
    };
    assert!(
        dir.is_dir(),
        "the upstream CRDs are missing: expected {} (shared/crds beside the workspace, or set HALO_CRDS_DIR); the schema checks cannot run without them",
        dir.display()
    );
    dir
}

/// (apiVersion, kind) -> openAPIV3Schema, from every CRD file.
fn schemas() -> BTreeMap<(String, String), Value> {
    let dir = crds_dir();
    let files = [
        "istio/customresourcedefinitions.gen.yaml",
        "envoy-gateway/gateway.envoyproxy.io_envoyextensionpolicies.yaml",
        "envoy-gateway/gateway.envoyproxy.io_securitypolicies.yaml",
        "envoy-gateway/gateway.envoyproxy.io_backends.yaml",
        "envoy-gateway/gateway.envoyproxy.io_backendtrafficpolicies.yaml",
        "gateway-api/standard-gatewayapi-crds.yaml",
    ];
    let mut out = BTreeMap::new();
    for f in files {
        let path = dir.join(f);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for crd in docs {
            if crd["kind"] != "CustomResourceDefinition" {
                continue;
            }
            let group = crd["spec"]["group"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let kind = crd["spec"]["names"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            for v in crd["spec"]["versions"].as_array().into_iter().flatten() {
                let version = v["name"].as_str().unwrap_or_default();
                out.insert(
                    (format!("{group}/{version}"), kind.clone()),
                    openapi_to_json_schema(v["schema"]["openAPIV3Schema"].clone()),
                );
            }
        }
    }
    out
}

/// OpenAPI v3 -> JSON Schema: `nullable: true` widens the type; int-or-string fields
/// (`x-kubernetes-int-or-string`) accept either; an object with `properties` gets
/// `additionalProperties: false` unless it preserves unknown fields, because Kubernetes
/// prunes unknown fields (a misspelt field would be silently dropped, not refused); other
/// x-kubernetes-* are annotations.
fn openapi_to_json_schema(mut v: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(m) => {
                if m.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                    m.remove("type");
                    m.insert(
                        "anyOf".into(),
                        json!([{"type": "integer"}, {"type": "string"}]),
                    );
                }
                if m.get("nullable") == Some(&Value::Bool(true))
                    && let Some(Value::String(t)) = m.get("type").cloned()
                {
                    m.insert("type".into(), json!([t, "null"]));
                }
                let preserve =
                    m.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
                if m.contains_key("properties")
                    && !m.contains_key("additionalProperties")
                    && !preserve
                {
                    m.insert("additionalProperties".into(), Value::Bool(false));
                }
                m.retain(|k, _| !k.starts_with("x-kubernetes-"));
                for (_, child) in m.iter_mut() {
                    walk(child);
                }
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    // Istio's root schemas list only spec and status; every object has these three.
    if let Some(props) = v.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert("apiVersion".into(), json!({"type": "string"}));
        props.insert("kind".into(), json!({"type": "string"}));
        props.insert("metadata".into(), json!({"type": "object"}));
    }
    walk(&mut v);
    v
}

fn check_against_crds(docs: &[Value], schemas: &BTreeMap<(String, String), Value>) {
    assert!(!docs.is_empty());
    for doc in docs {
        let key = (
            doc["apiVersion"].as_str().unwrap_or_default().to_string(),
            doc["kind"].as_str().unwrap_or_default().to_string(),
        );
        let schema = schemas
            .get(&key)
            .unwrap_or_else(|| panic!("no CRD schema for {key:?}"));
        let validator = jsonschema::options()
            .should_validate_formats(false)
            .build(schema)
            .unwrap_or_else(|e| panic!("schema of {key:?}: {e}"));
        let errors: Vec<String> = validator
            .iter_errors(doc)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{key:?} {} is refused by its CRD schema:\n{}",
            doc["metadata"]["name"],
            errors.join("\n")
        );
    }
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
    docs[0]["spec"]["phase"] = json!("AFTER_AUTHN");
    let result = std::panic::catch_unwind(|| check_against_crds(&docs[..1], &schemas));
    assert!(
        result.is_err(),
        "a phase outside the CRD's enum must be refused"
    );
    docs[0] = good;
    docs[0]["spec"]["imagePullSecrets"] = json!("typo");
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
