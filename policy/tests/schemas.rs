//! The JSON Schemas under `schemas/`: they are current with the types, every example
//! policy document satisfies its kind's schema, and a typo or a wrong enum value is
//! refused with an error that names the field.
//!
//! Run with `HALO_UPDATE_SCHEMAS=1` to rewrite the committed schema files.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use halo_policy::Kind;
use halo_policy::schema::{SCHEMA_KINDS, schema_file_contents, schema_file_name, schema_for};
use serde_json::{Value, json};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("policy/ has a parent")
        .to_path_buf()
}

fn schemas_dir() -> PathBuf {
    repo_root().join("schemas")
}

fn validator(kind: Kind) -> jsonschema::Validator {
    jsonschema::validator_for(&schema_for(kind))
        .unwrap_or_else(|e| panic!("schema of {kind} does not compile: {e}"))
}

/// Every error as `<instance path>: <message>`, the way a user would read it.
fn errors(kind: Kind, doc: &Value) -> Vec<String> {
    validator(kind)
        .iter_errors(doc)
        .map(|e| format!("{}: {}", e.instance_path(), e))
        .collect()
}

#[test]
fn committed_schemas_are_current() {
    let update = std::env::var("HALO_UPDATE_SCHEMAS").is_ok_and(|v| v == "1");
    let dir = schemas_dir();
    let mut stale = Vec::new();
    for kind in SCHEMA_KINDS {
        let path = dir.join(schema_file_name(kind));
        let want = schema_file_contents(kind).expect("schema serializes");
        if update {
            std::fs::create_dir_all(&dir).expect("create schemas/");
            std::fs::write(&path, &want).expect("write schema");
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(have) if have == want => {}
            Ok(_) => stale.push(format!("{} differs", path.display())),
            Err(e) => stale.push(format!("{} unreadable: {e}", path.display())),
        }
    }
    assert!(
        stale.is_empty(),
        "schemas/ is out of date with policy/src/types.rs:\n  {}\n\
         regenerate with: HALO_UPDATE_SCHEMAS=1 cargo test -p halo-policy --test schemas",
        stale.join("\n  ")
    );

    // No stray schema files that nothing generates any more.
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("read schemas/")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    let mut want: Vec<String> = SCHEMA_KINDS
        .iter()
        .map(|k| schema_file_name(*k).to_string())
        .collect();
    want.sort();
    assert_eq!(names, want, "schemas/ holds exactly one file per kind");
}

#[test]
fn schema_file_names_are_distinct_and_identify_their_kind() {
    let mut seen = std::collections::BTreeSet::new();
    for kind in SCHEMA_KINDS {
        let name = schema_file_name(kind);
        assert!(seen.insert(name), "{name} used twice");
        let schema = schema_for(kind);
        assert_eq!(
            schema["$id"],
            json!(format!("{}{name}", halo_policy::schema::SCHEMA_ID_BASE))
        );
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        assert_eq!(schema["additionalProperties"], json!(false), "{kind}");
        let required = schema["required"].as_array().expect("required list");
        assert_eq!(required[0], "apiVersion", "{kind}");
        assert_eq!(
            required.contains(&json!("kind")),
            kind != Kind::Root,
            "{kind}: only document kinds carry `kind`"
        );
    }
}

// ---------------------------------------------------------------------------
// The envelope: apiVersion and kind
// ---------------------------------------------------------------------------

#[test]
fn a_document_needs_the_right_api_version_and_kind() {
    let ring = json!({
        "apiVersion": "halos.dev/v1", "kind": "Ring",
        "name": "general", "order": 9, "profile": "base",
        "membership": {"default": true}
    });
    assert_eq!(errors(Kind::Ring, &ring), Vec::<String>::new());

    let mut wrong_version = ring.clone();
    wrong_version["apiVersion"] = json!("halos.dev/v2");
    let errs = errors(Kind::Ring, &wrong_version);
    assert!(
        errs.iter().any(|e| e.starts_with("/apiVersion")),
        "{errs:?}"
    );

    let mut wrong_kind = ring.clone();
    wrong_kind["kind"] = json!("Profile");
    let errs = errors(Kind::Ring, &wrong_kind);
    assert!(errs.iter().any(|e| e.starts_with("/kind")), "{errs:?}");

    let mut missing = ring.clone();
    missing.as_object_mut().unwrap().remove("apiVersion");
    let errs = errors(Kind::Ring, &missing);
    assert!(errs.iter().any(|e| e.contains("apiVersion")), "{errs:?}");

    // halos.yaml has no kind, so a kind key there is a mistake.
    let root = json!({"apiVersion": "halos.dev/v1", "org": "acme-corp"});
    assert_eq!(errors(Kind::Root, &root), Vec::<String>::new());
    let mut root_with_kind = root.clone();
    root_with_kind["kind"] = json!("Root");
    let errs = errors(Kind::Root, &root_with_kind);
    assert!(errs.iter().any(|e| e.contains("'kind'")), "{errs:?}");
}

// ---------------------------------------------------------------------------
// Typos and wrong enum values
// ---------------------------------------------------------------------------

#[test]
fn an_unknown_field_fails_with_an_error_naming_it() {
    // At the top level of a document.
    let toggle = json!({
        "apiVersion": "halos.dev/v1", "kind": "Toggle",
        "name": "deep-reasoning", "owner": "ai-platform@acme.com",
        "expires": "2027-03-31", "axis": "client",
        "expiry": "2027-04-30"
    });
    let errs = errors(Kind::Toggle, &toggle);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].contains("'expiry'"), "{errs:?}");

    // Deep inside: a misspelt key of one upstream of the Gateway.
    let gateway = json!({
        "apiVersion": "halos.dev/v1", "kind": "Gateway",
        "baseURL": "https://halo-gateway.acme.com",
        "upstreams": {
            "openai": {
                "url": "https://api.openai.com", "kind": "openai",
                "credentials": {"env": "OPENAI_API_KEY"}
            }
        }
    });
    let errs = errors(Kind::Gateway, &gateway);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].starts_with("/upstreams/openai"), "{errs:?}");
    assert!(errs[0].contains("'credentials'"), "{errs:?}");

    // The spec's spelling is baseURL, not the camelCase a serde default would give.
    let mut base_url = gateway.clone();
    base_url["upstreams"]["openai"]
        .as_object_mut()
        .unwrap()
        .remove("credentials");
    let obj = base_url.as_object_mut().unwrap();
    let url = obj.remove("baseURL").unwrap();
    obj.insert("baseUrl".into(), url);
    let errs = errors(Kind::Gateway, &base_url);
    assert!(errs.iter().any(|e| e.contains("'baseUrl'")), "{errs:?}");
}

#[test]
fn a_wrong_enum_value_fails_with_an_error_naming_the_field() {
    let experiment = json!({
        "apiVersion": "halos.dev/v1", "kind": "Experiment",
        "name": "sonnet-bedrock-canary", "type": "canary", "axis": "traffic",
        "status": "running", "salt": "s1", "rings": ["canary"],
        "variants": [{"name": "control", "weight": 90}, {"name": "canary", "weight": 10}]
    });
    assert_eq!(errors(Kind::Experiment, &experiment), Vec::<String>::new());

    for (field, bad) in [
        ("type", "blue-green"),
        ("axis", "server"),
        ("status", "live"),
    ] {
        let mut doc = experiment.clone();
        doc[field] = json!(bad);
        let errs = errors(Kind::Experiment, &doc);
        assert!(
            errs.iter().any(|e| e.starts_with(&format!("/{field}:"))),
            "{field}: {errs:?}"
        );
    }

    // An enum inside a map key: a harness that does not exist.
    let profile = json!({
        "apiVersion": "halos.dev/v1", "kind": "Profile", "name": "base",
        "harnesses": {"cursor": {"version": "1.0.0"}}
    });
    let errs = errors(Kind::Profile, &profile);
    assert!(errs.iter().any(|e| e.contains("'cursor'")), "{errs:?}");

    // A rule effect must be on or off; YAML 1.1's `true` is not accepted.
    let toggle = json!({
        "apiVersion": "halos.dev/v1", "kind": "Toggle",
        "name": "haiku-bedrock", "owner": "ai-platform@acme.com",
        "expires": "2027-03-31", "axis": "traffic",
        "rules": [{"rings": ["canary"], "effect": true}]
    });
    let errs = errors(Kind::Toggle, &toggle);
    assert!(
        errs.iter().any(|e| e.starts_with("/rules/0/effect:")),
        "{errs:?}"
    );
}

#[test]
fn a_missing_required_field_fails() {
    let rollout = json!({
        "apiVersion": "halos.dev/v1", "kind": "Rollout",
        "name": "sonnet-bedrock", "axis": "traffic",
        "experiment": "sonnet-bedrock-canary", "change": {},
        "steps": [{"ring": "canary", "percent": 5}]
    });
    let errs = errors(Kind::Rollout, &rollout);
    assert!(
        errs.iter()
            .any(|e| e.starts_with("/steps/0:") && e.contains("\"bake\"")),
        "{errs:?}"
    );
}

// ---------------------------------------------------------------------------
// The example policy repos
// ---------------------------------------------------------------------------

#[cfg(feature = "load")]
mod examples {
    use super::*;
    use halo_policy::{Experiment, Gateway, Profile, Ring, Rollout, Root, Toggle};

    /// A YAML file under examples/ and its documents.
    struct ExampleFile {
        path: PathBuf,
        text: String,
        docs: Vec<Value>,
    }

    fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read examples dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                yaml_files(&path, out);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }

    fn example_files() -> Vec<ExampleFile> {
        let mut paths = Vec::new();
        yaml_files(&repo_root().join("examples"), &mut paths);
        paths.sort();
        assert!(!paths.is_empty(), "no example policy files found");
        // YAML 1.2 booleans only, as editors and the schema read them: `effect: on`
        // is the string "on", not true.
        let mut options = serde_saphyr::Options::default();
        options.strict_booleans = true;
        paths
            .into_iter()
            .map(|path| {
                let text = std::fs::read_to_string(&path).expect("read example");
                let docs: Vec<Value> =
                    serde_saphyr::from_str_multiple_with_options(&text, options.clone())
                        .unwrap_or_else(|e| panic!("{}: bad YAML: {e}", path.display()));
                ExampleFile { path, text, docs }
            })
            .collect()
    }

    /// `halos.yaml` at the top of an example repo is the root; any other document
    /// names its kind.
    fn kind_of(file: &ExampleFile, doc: &Value) -> Kind {
        let is_root = file.path.file_name().is_some_and(|n| n == "halos.yaml")
            && file.path.parent().and_then(Path::parent) == Some(&repo_root().join("examples"));
        if is_root {
            return Kind::Root;
        }
        let kind = doc["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: document without kind", file.path.display()));
        Kind::from_kind_str(kind)
            .unwrap_or_else(|| panic!("{}: unknown kind {kind}", file.path.display()))
    }

    #[test]
    fn every_example_document_satisfies_its_schema() {
        let mut kinds_seen = std::collections::BTreeSet::new();
        let mut failures = Vec::new();
        for file in example_files() {
            for (i, doc) in file.docs.iter().enumerate() {
                let kind = kind_of(&file, doc);
                kinds_seen.insert(kind);
                for err in errors(kind, doc) {
                    failures.push(format!(
                        "{} (document {}) [{kind}] {err}",
                        file.path.display(),
                        i + 1
                    ));
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        // The acme-corp example is meant to show every kind.
        assert_eq!(
            kinds_seen.len(),
            SCHEMA_KINDS.len(),
            "kinds seen: {kinds_seen:?}"
        );
    }

    #[test]
    fn every_example_document_decodes_into_its_type() {
        // The schema and the serde types must agree on what is valid: a document the
        // schema accepts but the strict loader would refuse is a broken example.
        fn decode<T: serde::de::DeserializeOwned>(doc: &Value) -> Result<(), String> {
            let mut body = doc.clone();
            if let Some(obj) = body.as_object_mut() {
                obj.remove("apiVersion");
                obj.remove("kind");
            }
            serde_path_to_error::deserialize::<_, T>(body)
                .map(|_| ())
                .map_err(|e| format!("{}: {}", e.path(), e.inner()))
        }
        let mut failures = Vec::new();
        for file in example_files() {
            for (i, doc) in file.docs.iter().enumerate() {
                let kind = kind_of(&file, doc);
                let result = match kind {
                    Kind::Root => decode::<Root>(doc),
                    Kind::Gateway => decode::<Gateway>(doc),
                    Kind::Profile => decode::<Profile>(doc),
                    Kind::Ring => decode::<Ring>(doc),
                    Kind::Experiment => decode::<Experiment>(doc),
                    Kind::Toggle => decode::<Toggle>(doc),
                    Kind::Rollout => decode::<Rollout>(doc),
                };
                if let Err(e) = result {
                    failures.push(format!("{} (document {}): {e}", file.path.display(), i + 1));
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn every_example_file_points_editors_at_the_right_schema() {
        const MODELINE: &str = "# yaml-language-server: $schema=";
        for file in example_files() {
            let first = file.text.lines().next().unwrap_or_default();
            let target = first.strip_prefix(MODELINE).unwrap_or_else(|| {
                panic!(
                    "{}: first line must be `{MODELINE}...`",
                    file.path.display()
                )
            });
            let resolved = file.path.parent().expect("file has a dir").join(target);
            let resolved = resolved
                .canonicalize()
                .unwrap_or_else(|e| panic!("{}: {target}: {e}", file.path.display()));
            for doc in &file.docs {
                let kind = kind_of(&file, doc);
                let want = schemas_dir()
                    .join(schema_file_name(kind))
                    .canonicalize()
                    .expect("schema file exists");
                assert_eq!(
                    resolved,
                    want,
                    "{}: a {kind} document under a modeline for another schema",
                    file.path.display()
                );
            }
        }
    }

    #[test]
    fn the_gateway_example_carries_the_specs_failover_excerpt_verbatim() {
        // docs/ and the traffic-plane spec quote this excerpt of acme-corp's gateway.yaml.
        let excerpt = "\
models:
  opus:
    targets:
      - upstream: bedrock-use1        # priority 0: primary
        model: arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/p7q2opus41bb
        timeoutSeconds: 30            # connect + response headers; streams are not time-limited
      - upstream: anthropic-direct    # priority 1: failover
        model: claude-opus-4-1-20250805
        priority: 1
  default:
    targets:                          # 90/10 split, sticky per user + session
      - {upstream: anthropic-direct, model: claude-sonnet-4-5-20250929, weight: 90}
      - {upstream: anthropic-direct, model: claude-opus-4-1-20250805, weight: 10}
";
        let text = std::fs::read_to_string(repo_root().join("examples/acme-corp/gateway.yaml"))
            .expect("read gateway.yaml");
        assert!(
            text.contains(excerpt),
            "gateway.yaml lost the spec's excerpt"
        );
    }
}
