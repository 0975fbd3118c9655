//! Gemini CLI: the system settings file (highest precedence of its settings files) and,
//! on darwin and linux, a login-shell profile script that points Gemini CLI at the
//! gateway and mints `GEMINI_API_KEY` from `gateway.auth.helperCommand` at shell start.
//! Only the command is written to disk, never a token (spec: traffic plane, Gemini CLI).
//! Windows has no login-shell profile to render, so the manifest warns there.

use serde_json::{Map, Value, json};

use halo_policy::profile::merge_json_objects;
use halo_policy::{Harness, WireProtocol};

use super::{Context, Os, Rendered, base_url, json_bytes};

const H: Harness = Harness::GeminiCli;

/// The system settings path per OS.
pub fn settings_path(os: Os) -> &'static str {
    match os {
        Os::Darwin => "/Library/Application Support/GeminiCli/settings.json",
        Os::Linux => "/etc/gemini-cli/settings.json",
        Os::Windows => "C:\\ProgramData\\gemini-cli\\settings.json",
    }
}

/// The login-shell profile script (`None` on Windows).
pub fn profile_path(os: Os) -> Option<&'static str> {
    match os {
        Os::Darwin | Os::Linux => Some("/etc/profile.d/halos-gemini-cli.sh"),
        Os::Windows => None,
    }
}

/// `s` inside single quotes for a POSIX shell.
pub fn shell_single_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The profile script: base URL plus the line that mints the key at shell start.
pub fn profile_script(base_url: &str, helper_command: &str) -> String {
    format!(
        "# Managed by Halos (halod). Gemini CLI reaches the Halos gateway with a short-lived\n\
         # token minted here at shell start; the token itself is never written to disk.\n\
         GOOGLE_GEMINI_BASE_URL={}\n\
         export GOOGLE_GEMINI_BASE_URL\n\
         GEMINI_API_KEY=\"$(sh -c {})\"\n\
         export GEMINI_API_KEY\n",
        shell_single_quote(base_url),
        shell_single_quote(helper_command),
    )
}

pub fn render(ctx: &Context<'_>, os: Os) -> Rendered {
    let mut out = Rendered::default();
    let profile = ctx.profile;
    let Some(harness) = profile.harnesses.get(&H) else {
        return out;
    };
    let protocol = ctx.gateway.protocol(H);
    if protocol != WireProtocol::Gemini {
        out.warn(
            H,
            os,
            format!(
                "gateway protocol {} is not one Gemini CLI speaks; rendered for gemini",
                protocol.as_str()
            ),
        );
    }
    let mut settings = Map::new();
    if let Some(model) = &harness.model {
        settings.insert("model".into(), json!({ "name": model }));
    }
    settings.insert(
        "security".into(),
        json!({ "auth": { "selectedType": "gemini-api-key" } }),
    );
    if !profile.mcp.is_empty() {
        let mut servers = Map::new();
        for (name, m) in &profile.mcp {
            let mut server = Map::new();
            if let Some(url) = &m.url {
                let key = if url.trim_end_matches('/').ends_with("/sse") {
                    "url"
                } else {
                    "httpUrl"
                };
                server.insert(key.into(), json!(url));
            } else {
                if let Some(c) = &m.command {
                    server.insert("command".into(), json!(c));
                }
                server.insert("args".into(), json!(m.args));
            }
            if !m.env.is_empty() {
                server.insert("env".into(), json!(m.env));
            }
            servers.insert(name.clone(), Value::Object(server));
        }
        settings.insert("mcpServers".into(), Value::Object(servers));
    }
    if let Some(t) = &profile.telemetry
        && t.enabled
    {
        let mut tel = Map::new();
        tel.insert("enabled".into(), json!(true));
        if let Some(endpoint) = &t.endpoint {
            tel.insert("target".into(), json!("local"));
            tel.insert("otlpEndpoint".into(), json!(endpoint));
            tel.insert("otlpProtocol".into(), json!("http"));
        }
        tel.insert("logPrompts".into(), json!(t.log_prompts));
        settings.insert("telemetry".into(), Value::Object(tel));
    }
    if profile.permissions.is_some() {
        out.warn(
            H,
            os,
            "permissions (Claude Code rule syntax) are not translated for Gemini CLI: use tools.* overrides",
        );
    }
    if !profile.hooks.is_empty() {
        out.warn(H, os, "hooks are not rendered for Gemini CLI");
    }
    if !profile.models.is_empty() {
        out.warn(
            H,
            os,
            "the models menu is not enforceable in Gemini CLI settings",
        );
    }
    if profile.egress.as_ref().is_some_and(|e| !e.allow.is_empty()) {
        out.warn(
            H,
            os,
            "egress.allow is not expressible in Gemini CLI settings; enforce it at the network",
        );
    }
    let overrides: Map<String, Value> = harness
        .overrides
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    merge_json_objects(&mut settings, &overrides);
    out.file(
        H,
        os,
        settings_path(os),
        json_bytes(&Value::Object(settings)),
    );

    match (profile_path(os), ctx.helper_command()) {
        (Some(path), Some(cmd)) => {
            let script = profile_script(base_url(ctx.gateway), cmd);
            out.file(H, os, path, script.into_bytes());
        }
        (Some(_), None) => out.warn(
            H,
            os,
            "the Gateway has no auth.helperCommand: no GEMINI_API_KEY profile line rendered",
        ),
        (None, _) => out.warn(
            H,
            os,
            "no login-shell profile on Windows: set GOOGLE_GEMINI_BASE_URL and mint GEMINI_API_KEY from the helper command in the user's shell",
        ),
    }
    if os == Os::Darwin {
        out.warn(
            H,
            os,
            "macOS login shells do not read /etc/profile.d by default: source the profile script from /etc/zprofile",
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_command_is_quoted_and_no_token_is_written() {
        let script = profile_script(
            "https://gw.example.com",
            "halo auth token --audience 'api://x'",
        );
        assert!(script.contains(
            "GEMINI_API_KEY=\"$(sh -c 'halo auth token --audience '\\''api://x'\\''')\"\n"
        ));
        assert!(script.contains("GOOGLE_GEMINI_BASE_URL='https://gw.example.com'\n"));
    }
}
