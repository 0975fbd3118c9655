//! Codex: `managed_config.toml`, the managed-defaults layer Codex reads from
//! `/etc/codex/` on Unix (darwin and linux). Codex documents no system-wide file on
//! Windows, so nothing is rendered there and the manifest says so.
//!
//! The gateway is a custom model provider `halos` speaking the Responses API at
//! `<baseURL>/v1`. From [`AUTH_COMMAND_SINCE`] Codex runs a provider's token command
//! itself (`[model_providers.halos.auth]`, seen working in 0.169.0 and 0.171.0, which
//! still read the legacy managed_config.toml): `gateway.auth.helperCommand` is rendered there,
//! through `sh -c` as Claude Code and the Gemini CLI profile run it. Older pins read the key
//! from an environment variable (`env_key`), so the variable is named and the manifest
//! warns that it must be exported.

use toml::{Table, Value};

use halo_policy::{Harness, WireProtocol};

use super::{Context, Os, Rendered, base_url};

const H: Harness = Harness::Codex;

/// The environment variable Codex reads the Halos token from.
pub const TOKEN_ENV: &str = "HALOS_TOKEN";

/// The first Codex version known to run `model_providers.<id>.auth.command`: the oldest
/// this adapter was run against (0.169.0, acme-corp's base pin, against a recording
/// server; 0.171.0, the live tests' pin, through the gateway).
pub const AUTH_COMMAND_SINCE: (u64, u64, u64) = (0, 169, 0);

/// `major.minor.patch` of an exact pin (a pre-release or build suffix ignored).
fn version_triple(pin: &str) -> Option<(u64, u64, u64)> {
    let core = pin.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// Whether Codex at `pin` runs a provider's token command itself.
pub fn runs_auth_command(pin: &str) -> bool {
    version_triple(pin).is_some_and(|v| v >= AUTH_COMMAND_SINCE)
}

/// The managed config path per OS (`None`: Codex has no documented one there).
pub fn managed_path(os: Os) -> Option<&'static str> {
    match os {
        Os::Darwin | Os::Linux => Some("/etc/codex/managed_config.toml"),
        Os::Windows => None,
    }
}

fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

pub fn render(ctx: &Context<'_>, os: Os) -> Rendered {
    let mut out = Rendered::default();
    let profile = ctx.profile;
    let Some(harness) = profile.harnesses.get(&H) else {
        return out;
    };
    let Some(path) = managed_path(os) else {
        out.warn(
            H,
            os,
            "Codex has no documented system-wide config on Windows: nothing rendered",
        );
        return out;
    };
    let mut config = Table::new();
    let protocol = ctx.gateway.protocol(H);
    if protocol != WireProtocol::OpenaiResponses {
        out.warn(
            H,
            os,
            format!(
                "gateway protocol {} is not one Codex speaks; rendered for openai-responses",
                protocol.as_str()
            ),
        );
    }
    if let Some(model) = &harness.model {
        config.insert("model".into(), s(model));
    }
    config.insert("model_provider".into(), s("halos"));
    let mut provider = Table::new();
    provider.insert("name".into(), s("Halos gateway"));
    provider.insert(
        "base_url".into(),
        s(&format!("{}/v1", base_url(ctx.gateway))),
    );
    provider.insert("wire_api".into(), s("responses"));
    let command_auth = runs_auth_command(&harness.version);
    match (ctx.helper_command(), command_auth) {
        (Some(cmd), true) => {
            let mut auth = Table::new();
            auth.insert("command".into(), s("sh"));
            auth.insert("args".into(), Value::Array(vec![s("-c"), s(cmd)]));
            provider.insert("auth".into(), Value::Table(auth));
        }
        _ => {
            provider.insert("env_key".into(), s(TOKEN_ENV));
        }
    }
    let mut providers = Table::new();
    providers.insert("halos".into(), Value::Table(provider));
    config.insert("model_providers".into(), Value::Table(providers));
    match ctx.helper_command() {
        Some(_) if command_auth => {}
        Some(cmd) => out.warn(
            H,
            os,
            format!(
                "Codex {} reads its token from ${TOKEN_ENV}; export it at shell start from `{cmd}`",
                harness.version
            ),
        ),
        None => out.warn(
            H,
            os,
            format!(
                "the Gateway has no auth.helperCommand: ${TOKEN_ENV} must be set by other means"
            ),
        ),
    }

    if !profile.mcp.is_empty() {
        let mut servers = Table::new();
        for (name, m) in &profile.mcp {
            let mut server = Table::new();
            if let Some(url) = &m.url {
                server.insert("url".into(), s(url));
            } else if let Some(c) = &m.command {
                server.insert("command".into(), s(c));
                server.insert(
                    "args".into(),
                    Value::Array(m.args.iter().map(|a| s(a)).collect()),
                );
            }
            if !m.env.is_empty() {
                let env: Table = m.env.iter().map(|(k, v)| (k.clone(), s(v))).collect();
                server.insert("env".into(), Value::Table(env));
            }
            servers.insert(name.clone(), Value::Table(server));
        }
        config.insert("mcp_servers".into(), Value::Table(servers));
    }
    if let Some(t) = &profile.telemetry
        && t.enabled
    {
        let mut otel = Table::new();
        otel.insert("log_user_prompt".into(), Value::Boolean(t.log_prompts));
        if let Some(endpoint) = &t.endpoint {
            let mut http = Table::new();
            http.insert("endpoint".into(), s(&logs_url(endpoint)));
            http.insert("protocol".into(), s("binary"));
            let mut exporter = Table::new();
            exporter.insert("otlp-http".into(), Value::Table(http));
            otel.insert("exporter".into(), Value::Table(exporter));
        }
        config.insert("otel".into(), Value::Table(otel));
    }
    if profile.permissions.is_some() {
        out.warn(
            H,
            os,
            "permissions (Claude Code rule syntax) have no Codex equivalent: use approval_policy and sandbox_mode overrides",
        );
    }
    if !profile.hooks.is_empty() {
        out.warn(H, os, "hooks are not rendered for Codex");
    }
    if !profile.models.is_empty() {
        out.warn(H, os, "the models menu is not enforceable in Codex config");
    }
    if profile.egress.as_ref().is_some_and(|e| !e.allow.is_empty()) {
        out.warn(
            H,
            os,
            "egress.allow is not expressible in Codex config; enforce it at the network",
        );
    }
    for (key, value) in &harness.overrides {
        match Value::try_from(value) {
            Ok(v) => merge_toml(&mut config, key, v),
            Err(e) => out.warn(
                H,
                os,
                format!("override {key:?} is not expressible in TOML ({e}); not rendered"),
            ),
        }
    }
    let text = toml::to_string(&config).unwrap_or_default();
    out.file(H, os, path, text.into_bytes());
    out
}

/// Set `key` in `table`: tables deep-merged, anything else replaced.
pub(crate) fn merge_toml(table: &mut Table, key: &str, value: Value) {
    match (table.get_mut(key), value) {
        (Some(Value::Table(base)), Value::Table(over)) => {
            for (k, v) in over {
                merge_toml(base, &k, v);
            }
        }
        (_, value) => {
            table.insert(key.to_string(), value);
        }
    }
}

/// Codex's `otlp-http` exporter posts to its `endpoint` as written (its docs:
/// `https://otel.example.com/v1/logs`), unlike the OTLP environment variables, which
/// take a base URL and add the signal's path. The profile's `telemetry.endpoint` is the
/// base (what Claude Code's `OTEL_EXPORTER_OTLP_ENDPOINT` gets), so the logs path is
/// added here; an endpoint already naming it is kept.
fn logs_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with("/v1/logs") {
        base.to_string()
    } else {
        format!("{base}/v1/logs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_command_follows_the_pinned_version() {
        assert!(runs_auth_command("0.171.0"));
        assert!(runs_auth_command("0.172.0-alpha.1"));
        assert!(runs_auth_command("1.0.0"));
        assert!(!runs_auth_command("0.46.0"));
        assert!(runs_auth_command("0.169.0"));
        assert!(!runs_auth_command("0.168.9"));
        assert!(!runs_auth_command("not-a-version"));
    }

    #[test]
    fn the_otlp_http_endpoint_is_the_logs_url() {
        assert_eq!(
            logs_url("https://otel.acme.com:4318"),
            "https://otel.acme.com:4318/v1/logs"
        );
        assert_eq!(
            logs_url("https://otel.acme.com:4318/"),
            "https://otel.acme.com:4318/v1/logs"
        );
        assert_eq!(logs_url("http://h:4318/v1/logs"), "http://h:4318/v1/logs");
    }
}
