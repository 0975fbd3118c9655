//! The model names a harness resolves by itself before a request leaves it.
//!
//! Claude Code turns the family names `opus`, `sonnet`, `haiku` and `fable` (and `best`,
//! `opusplan`, or no model at all) into its own current provider model ids, such as
//! `claude-sonnet-5-5`, which a gateway allowlist of aliases refuses. Each family has an
//! environment variable that replaces the family's id with any name: the release renders
//! it as the Gateway alias of the same name, so every model Claude Code may ask for is a
//! policy alias, and `halo validate` warns when a family is left without one. The
//! background ("small/fast") model is the haiku family's, also read under its older name.
//!
//! Gemini CLI resolves `auto`, `pro` and `flash` itself (0.61.0 sends
//! `gemini-3.1-pro-preview` for `pro`; `auto` first asks a flash-lite model to route) and
//! has no variable to remap them: a Gemini CLI profile must not name an alias so called.
//! Codex sends the configured name as it is.
//!
//! Observed with Claude Code 2.1.332 and Gemini CLI 0.61.0 against a recording server
//! (docs/harnesses.md); the Claude Code families are proved through the gateway by the live
//! test (e2e/tests/harnesses.rs).

use crate::types::{Gateway, HarnessSettings};

/// One family of models a harness resolves itself, and the variable that overrides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelFamily {
    /// The name a developer (or the harness) uses: `sonnet`.
    pub name: &'static str,
    /// The environment variable naming the model sent for it.
    pub env: &'static str,
}

/// Claude Code's families (2.1.332).
pub const CLAUDE_CODE_FAMILIES: [ModelFamily; 4] = [
    ModelFamily {
        name: "opus",
        env: "ANTHROPIC_DEFAULT_OPUS_MODEL",
    },
    ModelFamily {
        name: "sonnet",
        env: "ANTHROPIC_DEFAULT_SONNET_MODEL",
    },
    ModelFamily {
        name: "haiku",
        env: "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    },
    ModelFamily {
        name: "fable",
        env: "ANTHROPIC_DEFAULT_FABLE_MODEL",
    },
];

/// The older variable for Claude Code's background model, still read; it is the haiku
/// family's model.
pub const CLAUDE_CODE_SMALL_FAST_ENV: &str = "ANTHROPIC_SMALL_FAST_MODEL";
/// The family whose model the background calls use.
pub const CLAUDE_CODE_SMALL_FAST_FAMILY: &str = "haiku";

/// The model names Gemini CLI (0.61.0) replaces with its own model ids before sending.
pub const GEMINI_CLI_SELF_RESOLVED: [&str; 3] = ["auto", "pro", "flash"];

/// What a Claude Code family is sent as under one profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FamilyModel {
    /// The Gateway has an alias of the family's name: the release renders the variable.
    Alias(String),
    /// The profile's overrides set the variable (`env.<VAR>`) to this value.
    Overridden(String),
    /// Neither: Claude Code sends its own model id, which the gateway refuses.
    Unmapped,
}

/// The value the profile's overrides give `env.<var>`, if a string.
fn overridden<'a>(harness: &'a HarnessSettings, var: &str) -> Option<&'a str> {
    harness
        .overrides
        .get("env")
        .and_then(|env| env.get(var))
        .and_then(|v| v.as_str())
}

/// How each of Claude Code's families is sent under `harness` (a profile's
/// `harnesses.claude-code`), in [`CLAUDE_CODE_FAMILIES`] order.
pub fn claude_code_families(
    gateway: &Gateway,
    harness: &HarnessSettings,
) -> Vec<(ModelFamily, FamilyModel)> {
    CLAUDE_CODE_FAMILIES
        .iter()
        .map(|family| {
            let model = match overridden(harness, family.env) {
                Some(v) => FamilyModel::Overridden(v.to_string()),
                None if gateway.models.contains_key(family.name) => {
                    FamilyModel::Alias(family.name.to_string())
                }
                None => FamilyModel::Unmapped,
            };
            (*family, model)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gateway(aliases: &[&str]) -> Gateway {
        let models: serde_json::Map<String, serde_json::Value> = aliases
            .iter()
            .map(|a| {
                (
                    a.to_string(),
                    serde_json::json!({"upstream": "u", "model": "m"}),
                )
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "baseURL": "https://gw.example.com",
            "upstreams": {"u": {"url": "https://u.example.com", "kind": "anthropic"}},
            "models": models,
        }))
        .expect("a gateway")
    }

    #[test]
    fn families_map_to_aliases_overrides_or_nothing() {
        let gw = gateway(&["sonnet", "haiku", "default"]);
        let harness: HarnessSettings = serde_json::from_value(serde_json::json!({
            "version": "2.1.332",
            "overrides": {"env": {"ANTHROPIC_DEFAULT_OPUS_MODEL": "default"}},
        }))
        .unwrap();
        let got: Vec<(&str, FamilyModel)> = claude_code_families(&gw, &harness)
            .into_iter()
            .map(|(f, m)| (f.name, m))
            .collect();
        assert_eq!(
            got,
            vec![
                ("opus", FamilyModel::Overridden("default".into())),
                ("sonnet", FamilyModel::Alias("sonnet".into())),
                ("haiku", FamilyModel::Alias("haiku".into())),
                ("fable", FamilyModel::Unmapped),
            ]
        );
    }
}
