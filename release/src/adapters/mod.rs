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
