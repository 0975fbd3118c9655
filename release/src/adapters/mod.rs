//! Adapters: one per harness. Each renders an effective (already `extends`-resolved)
//! profile plus the Gateway into the files that harness reads from its managed,
//! system-wide locations, for darwin, linux and windows. Anything the profile says that
//! the harness's managed files cannot express is returned as a warning (it lands in the
//! release manifest): nothing is dropped silently.
//!
//! Output is deterministic: JSON objects are `BTreeMap`-ordered and pretty-printed,
//! TOML tables sorted, every file ends with a newline, mode 0644.

use serde::{Deserialize, Serialize};

use halo_policy::{Gateway, Harness, Profile};

pub mod claude_code;
pub mod codex;
pub mod gemini_cli;
pub mod telemetry;

/// An operating system a release renders for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Os {
    Darwin,
    Linux,
    Windows,
}

impl Os {
    pub const ALL: [Os; 3] = [Os::Darwin, Os::Linux, Os::Windows];

    pub fn as_str(self) -> &'static str {
        match self {
            Os::Darwin => "darwin",
            Os::Linux => "linux",
            Os::Windows => "windows",
        }
    }
}

/// The mode every rendered file gets: readable by all, writable by root only.
pub const FILE_MODE: u32 = 0o644;

/// One rendered file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedFile {
    pub harness: Harness,
    pub os: Os,
    /// Absolute path on the target OS.
    pub path: String,
    pub mode: u32,
    pub content: Vec<u8>,
}

/// What one adapter rendered for one OS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    pub files: Vec<RenderedFile>,
    /// Each prefixed with the harness and OS.
    pub warnings: Vec<String>,
}

impl Rendered {
    fn file(&mut self, harness: Harness, os: Os, path: &str, content: Vec<u8>) {
        self.files.push(RenderedFile {
            harness,
            os,
            path: path.to_string(),
            mode: FILE_MODE,
            content,
        });
    }

    fn warn(&mut self, harness: Harness, os: Os, message: impl std::fmt::Display) {
        self.warnings
            .push(format!("{} ({}): {message}", harness.as_str(), os.as_str()));
    }
}

/// What every adapter reads.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub gateway: &'a Gateway,
    /// The effective profile (`extends` resolved).
    pub profile: &'a Profile,
}

impl Context<'_> {
    /// The helper command that prints a fresh Halos token, if the policy has one.
    pub fn helper_command(&self) -> Option<&str> {
        self.gateway
            .auth
            .as_ref()
            .and_then(|a| a.helper_command.as_deref())
            .filter(|c| !c.trim().is_empty())
    }
}

/// Render `harness` for `os`.
pub fn render(harness: Harness, ctx: &Context<'_>, os: Os) -> Rendered {
    match harness {
        Harness::ClaudeCode => claude_code::render(ctx, os),
        Harness::Codex => codex::render(ctx, os),
        Harness::GeminiCli => gemini_cli::render(ctx, os),
    }
}

/// Pretty JSON with a trailing newline. serde_json keeps map order, and every map
/// here is a BTreeMap or a serde_json::Map (sorted without `preserve_order`).
pub(crate) fn json_bytes(value: &serde_json::Value) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(value).unwrap_or_default();
    out.push(b'\n');
    out
}

/// The gateway's base URL without a trailing slash.
pub(crate) fn base_url(gateway: &Gateway) -> &str {
    gateway.base_url.trim_end_matches('/')
}

/// Every location halod may write on `os`: managed files, and managed directories
/// (ending with `/`). checkTarget refuses anything else, and stale files are removed only
/// inside these.
pub fn managed_locations(os: Os) -> Vec<String> {
    let mut out = vec![format!("{}/", claude_code::managed_dir(os))];
    out.extend(codex::managed_path(os).map(str::to_string));
    out.push(gemini_cli::settings_path(os).to_string());
    out.extend(gemini_cli::profile_path(os).map(str::to_string));
    out.extend(telemetry::profile_path(os).map(str::to_string));
    out
}

/// The file a harness's settings (profile overrides, client toggle fragments) land in
/// on `os`, if the harness has one there.
pub fn settings_file(harness: Harness, os: Os) -> Option<String> {
    match harness {
        Harness::ClaudeCode => {
            let sep = if os == Os::Windows { "\\" } else { "/" };
            Some(format!(
                "{}{sep}managed-settings.json",
                claude_code::managed_dir(os)
            ))
        }
        Harness::Codex => codex::managed_path(os).map(str::to_string),
        Harness::GeminiCli => Some(gemini_cli::settings_path(os).to_string()),
    }
}

/// Merge a settings fragment (a client toggle's, for one harness) into that harness's
/// rendered settings file, the way profile overrides are merged: objects (tables)
/// deep-merged, anything else replaced. The output is formatted as the adapter formats
/// it, so an unchanged merge gives unchanged bytes.
pub fn merge_settings(
    harness: Harness,
    content: &[u8],
    fragment: &halo_policy::Settings,
) -> Result<Vec<u8>, String> {
    match harness {
        Harness::ClaudeCode | Harness::GeminiCli => {
            let mut value: serde_json::Value =
                serde_json::from_slice(content).map_err(|e| format!("not JSON: {e}"))?;
            let serde_json::Value::Object(base) = &mut value else {
                return Err("not a JSON object".into());
            };
            let over: serde_json::Map<String, serde_json::Value> = fragment
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            halo_policy::profile::merge_json_objects(base, &over);
            Ok(json_bytes(&value))
        }
        Harness::Codex => {
            let text = std::str::from_utf8(content).map_err(|e| format!("not UTF-8: {e}"))?;
            let mut table: toml::Table =
                toml::from_str(text).map_err(|e| format!("not TOML: {e}"))?;
            for (key, value) in fragment {
                let v = toml::Value::try_from(value)
                    .map_err(|e| format!("{key:?} is not expressible in TOML: {e}"))?;
                codex::merge_toml(&mut table, key, v);
            }
            Ok(toml::to_string(&table)
                .map_err(|e| e.to_string())?
                .into_bytes())
        }
    }
}

#[cfg(test)]
mod merge_tests {
    use super::*;

    #[test]
    fn managed_locations_cover_every_settings_file() {
        for os in [Os::Darwin, Os::Linux] {
            let managed = managed_locations(os);
            for h in [Harness::ClaudeCode, Harness::Codex, Harness::GeminiCli] {
                let file = settings_file(h, os).unwrap();
                assert!(
                    managed
                        .iter()
                        .any(|m| *m == file || m.ends_with('/') && file.starts_with(m.as_str())),
                    "{file} not managed on {os:?}"
                );
            }
        }
    }

    #[test]
    fn fragments_merge_like_overrides() {
        let fragment: halo_policy::Settings =
            [("alwaysThinkingEnabled".to_string(), serde_json::json!(true))].into();
        let out = merge_settings(Harness::ClaudeCode, b"{\"model\": \"x\"}", &fragment).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\n  \"alwaysThinkingEnabled\": true,\n  \"model\": \"x\"\n}\n"
        );
        let fragment: halo_policy::Settings = [(
            "model_reasoning_effort".to_string(),
            serde_json::json!("high"),
        )]
        .into();
        let out = merge_settings(Harness::Codex, b"model = \"gpt\"\n", &fragment).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("model_reasoning_effort = \"high\""), "{text}");
        assert!(merge_settings(Harness::Codex, b"not = = toml", &fragment).is_err());
    }
}
