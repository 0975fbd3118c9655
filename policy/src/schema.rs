//! JSON Schemas of every policy kind, generated from the types in [`crate::types`].
//!
//! The committed files under `schemas/` are the output of [`schema_file_contents`]; a
//! test regenerates them and fails when they drift from the types. Editors pick them up
//! through a `# yaml-language-server: $schema=...` line at the top of a policy file, so a
//! typo is flagged while typing instead of at `halo validate`.
//!
//! A document on disk is flat: `apiVersion`, `kind`, then the type's own fields. The
//! types never see `apiVersion` and `kind` (the loader removes them before decoding), so
//! they are added here as required constants. The schemas describe shape only (field
//! names, types, enum values); cross-document rules such as references, unique ring
//! orders or guardrails stay in `validate` and `guardrails`.

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value};

use crate::types::{API_VERSION, Experiment, Gateway, Kind, Profile, Ring, Rollout, Root, Toggle};

/// Base of the schemas' `$id`s; the file name is appended.
pub const SCHEMA_ID_BASE: &str = "https://halos.dev/schemas/v1/";

/// The file name of `kind`'s schema under `schemas/`.
pub fn schema_file_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Root => "halos.schema.json",
        Kind::Gateway => "gateway.schema.json",
        Kind::Profile => "profile.schema.json",
        Kind::Ring => "ring.schema.json",
        Kind::Experiment => "experiment.schema.json",
        Kind::Toggle => "toggle.schema.json",
        Kind::Rollout => "rollout.schema.json",
    }
}

/// Every kind that has a schema: `halos.yaml` first, then the document kinds.
pub const SCHEMA_KINDS: [Kind; 7] = [
    Kind::Root,
    Kind::Gateway,
    Kind::Profile,
    Kind::Ring,
    Kind::Experiment,
    Kind::Toggle,
    Kind::Rollout,
];

/// The JSON Schema (draft 2020-12) of a document of `kind` as written in a policy repo.
///
/// Object keys come out sorted at every level, whether or not serde_json's
/// `preserve_order` feature is on somewhere in the build, so the committed files are
/// byte-for-byte reproducible.
pub fn schema_for(kind: Kind) -> Value {
    let mut schema = match kind {
        Kind::Root => type_schema::<Root>(),
        Kind::Gateway => type_schema::<Gateway>(),
        Kind::Profile => type_schema::<Profile>(),
        Kind::Ring => type_schema::<Ring>(),
        Kind::Experiment => type_schema::<Experiment>(),
        Kind::Toggle => type_schema::<Toggle>(),
        Kind::Rollout => type_schema::<Rollout>(),
    };
    if let Value::Object(root) = &mut schema {
        add_envelope(root, kind);
    }
    sorted(schema)
}

/// The exact text of `kind`'s committed schema file: pretty JSON and a trailing newline.
pub fn schema_file_contents(kind: Kind) -> Result<String, serde_json::Error> {
    let mut text = serde_json::to_string_pretty(&schema_for(kind))?;
    text.push('\n');
    Ok(text)
}

fn type_schema<T: JsonSchema>() -> Value {
    SchemaSettings::draft2020_12()
        .for_deserialize()
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value()
}

/// Adds `$id`, `title`, and the `apiVersion` (and, for document kinds, `kind`) keys as
/// required constants in front of the type's own required fields.
fn add_envelope(root: &mut Map<String, Value>, kind: Kind) {
    let file = schema_file_name(kind);
    root.insert(
        "$id".into(),
        Value::String(format!("{SCHEMA_ID_BASE}{file}")),
    );
    let title = match kind {
        Kind::Root => format!("Halos halos.yaml ({API_VERSION})"),
        _ => format!("Halos {kind} ({API_VERSION})"),
    };
    root.insert("title".into(), Value::String(title));

    let mut envelope = vec![(
        "apiVersion",
        serde_json::json!({
            "description": "The policy API version; every document carries it.",
            "type": "string",
            "const": API_VERSION,
        }),
    )];
    if kind != Kind::Root {
        envelope.push((
            "kind",
            serde_json::json!({
                "description": "The document kind; it picks the schema and the type.",
                "type": "string",
                "const": kind.as_str(),
            }),
        ));
    }

    let properties = root
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(properties) = properties {
        for (name, schema) in &envelope {
            properties.insert((*name).into(), schema.clone());
        }
    }

    let mut required: Vec<Value> = envelope
        .iter()
        .map(|(name, _)| Value::String((*name).into()))
        .collect();
    if let Some(Value::Array(existing)) = root.get("required") {
        required.extend(existing.iter().cloned());
    }
    root.insert("required".into(), Value::Array(required));
    // The types deny unknown fields; say so even if a future type forgets.
    root.insert("additionalProperties".into(), Value::Bool(false));
}

/// Rebuilds every object with its keys in sorted order.
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}
