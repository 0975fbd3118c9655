//! Shared by the mesh tests: golden files and the schema checks (the upstream CRDs and
//! Kubernetes' own schemas for its built-in kinds).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Value, json};

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compare `text` with the committed file `path` (relative to the crate); rewrite it with
/// UPDATE_GOLDEN=1.
pub fn golden_at(path: &std::path::Path, text: &str) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, text).expect("write golden");
    }
    let committed = std::fs::read_to_string(path).unwrap_or_else(|e| {
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

pub fn golden(name: &str, text: &str) {
    golden_at(&manifest_dir().join("tests/golden").join(name), text);
}

// ---- schema checks ----

pub fn crds_dir() -> PathBuf {
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
pub fn schemas() -> BTreeMap<(String, String), Value> {
    let dir = crds_dir();
    let files = [
        "istio/customresourcedefinitions.gen.yaml",
        "envoy-gateway/gateway.envoyproxy.io_envoyextensionpolicies.yaml",
        "envoy-gateway/gateway.envoyproxy.io_securitypolicies.yaml",
        "envoy-gateway/gateway.envoyproxy.io_backends.yaml",
        "envoy-gateway/gateway.envoyproxy.io_backendtrafficpolicies.yaml",
        "gateway-api/standard-gatewayapi-crds.yaml",
    ];
    let vendored = manifest_dir().join("tests/crds/gateway.envoyproxy.io_envoypatchpolicies.yaml");
    let mut out = kubernetes_schemas();
    for path in files.iter().map(|f| dir.join(f)).chain([vendored]) {
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

/// Kubernetes' own schemas (v1.35, strict: an unknown field is refused) for the built-in
/// kinds the renderers emit, from tests/k8s (see its README), keyed like the CRDs'.
fn kubernetes_schemas() -> BTreeMap<(String, String), Value> {
    let path = manifest_dir().join("tests/k8s/schemas-v1.35.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let all: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = BTreeMap::new();
    for (key, def) in all["kinds"].as_object().expect("kinds") {
        let (api, kind) = key.split_once(' ').expect("`apiVersion kind`");
        let def = def.as_str().expect("definition name");
        out.insert(
            (api.to_string(), kind.to_string()),
            json!({"$defs": all["$defs"], "$ref": format!("#/$defs/{def}")}),
        );
    }
    out
}

/// OpenAPI v3 -> JSON Schema: `nullable: true` widens the type; int-or-string fields
/// (`x-kubernetes-int-or-string`) accept either; an object with `properties` gets
/// `additionalProperties: false` unless it preserves unknown fields, because Kubernetes
/// prunes unknown fields (a misspelt field would be silently dropped, not refused); other
/// x-kubernetes-* are annotations.
pub fn openapi_to_json_schema(mut v: Value) -> Value {
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

pub fn check_against_schemas(docs: &[Value], schemas: &BTreeMap<(String, String), Value>) {
    assert!(!docs.is_empty());
    for doc in docs {
        let key = (
            doc["apiVersion"].as_str().unwrap_or_default().to_string(),
            doc["kind"].as_str().unwrap_or_default().to_string(),
        );
        let schema = schemas
            .get(&key)
            .unwrap_or_else(|| panic!("no schema for {key:?}"));
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
            "{key:?} {} is refused by its schema:\n{}",
            doc["metadata"]["name"],
            errors.join("\n")
        );
    }
}
