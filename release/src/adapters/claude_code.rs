//! Claude Code: `managed-settings.json` (model, permissions, hooks, env, apiKeyHelper,
//! harness overrides merged last) and `managed-mcp.json` (MCP servers), in the
//! system-wide directory Claude Code reads managed policy from.
//!
//! Gateway wiring (spec: traffic plane, Direct Bedrock): with `protocols.claude-code:
//! bedrock-invoke` the env selects Bedrock mode against the gateway
//! (CLAUDE_CODE_USE_BEDROCK, ANTHROPIC_BEDROCK_BASE_URL, CLAUDE_CODE_SKIP_BEDROCK_AUTH,
//! ANTHROPIC_MODEL = the alias); otherwise ANTHROPIC_BASE_URL points at the gateway.
//! `gateway.auth.helperCommand` becomes `apiKeyHelper` either way.
//!
//! Claude Code resolves its model families (`opus`, `sonnet`, `haiku`, `fable`) to its own
//! provider ids before sending, ids the gateway's allowlist refuses; so each family that
//! is a Gateway alias is rendered as that alias (ANTHROPIC_DEFAULT_<FAMILY>_MODEL, and the
//! background model's ANTHROPIC_SMALL_FAST_MODEL), in both modes. The families are
//! halo-policy's [`halo_policy::harness_models`], which `halo validate` checks too.

use serde_json::{Map, Value, json};

use halo_policy::harness_models::{self, FamilyModel};
use halo_policy::profile::merge_json_objects;
use halo_policy::{Harness, WireProtocol};

use super::{Context, Os, Rendered, base_url, json_bytes};

const H: Harness = Harness::ClaudeCode;

/// The managed settings directory per OS.
pub fn managed_dir(os: Os) -> &'static str {
    match os {
        Os::Darwin => "/Library/Application Support/ClaudeCode",
        Os::Linux => "/etc/claude-code",
        // Claude Code 2.x reads C:\Program Files\ClaudeCode (seen in 2.1.332's code path
        // lookup); the ProgramData location of 1.x is no longer read.
        Os::Windows => "C:\\Program Files\\ClaudeCode",
    }
}

fn join(os: Os, file: &str) -> String {
    let sep = if os == Os::Windows { "\\" } else { "/" };
    format!("{}{sep}{file}", managed_dir(os))
}

pub fn render(ctx: &Context<'_>, os: Os) -> Rendered {
    let mut out = Rendered::default();
    let profile = ctx.profile;
    let Some(harness) = profile.harnesses.get(&H) else {
        return out;
    };
    let mut settings = Map::new();
    let mut env = Map::new();
    let protocol = ctx.gateway.protocol(H);
    let base = base_url(ctx.gateway);
    match protocol {
        WireProtocol::BedrockInvoke => {
            env.insert("CLAUDE_CODE_USE_BEDROCK".into(), json!("1"));
            env.insert("ANTHROPIC_BEDROCK_BASE_URL".into(), json!(base));
            env.insert("CLAUDE_CODE_SKIP_BEDROCK_AUTH".into(), json!("1"));
            if let Some(model) = &harness.model {
                env.insert("ANTHROPIC_MODEL".into(), json!(model));
            }
        }
        other => {
            if other != WireProtocol::AnthropicMessages {
                out.warn(
                    H,
                    os,
                    format!(
                        "gateway protocol {} is not one Claude Code speaks; rendered for anthropic-messages",
                        other.as_str()
                    ),
                );
            }
            env.insert("ANTHROPIC_BASE_URL".into(), json!(base));
            if let Some(model) = &harness.model {
                settings.insert("model".into(), json!(model));
            }
        }
    }
    for (family, model) in harness_models::claude_code_families(ctx.gateway, harness) {
        let name = match model {
            FamilyModel::Alias(v) | FamilyModel::Overridden(v) => v,
            FamilyModel::Unmapped => continue,
        };
        if family.name == harness_models::CLAUDE_CODE_SMALL_FAST_FAMILY {
            env.insert(
                harness_models::CLAUDE_CODE_SMALL_FAST_ENV.into(),
                json!(name.clone()),
            );
        }
        env.insert(family.env.into(), json!(name));
    }
    match ctx.helper_command() {
        Some(cmd) => {
            settings.insert("apiKeyHelper".into(), json!(cmd));
        }
        None => out.warn(
            H,
            os,
            "the Gateway has no auth.helperCommand: no apiKeyHelper, so Claude Code sends no Halos token",
        ),
    }
    if let Some(t) = &profile.telemetry
        && t.enabled
    {
        env.insert("CLAUDE_CODE_ENABLE_TELEMETRY".into(), json!("1"));
        env.insert("OTEL_METRICS_EXPORTER".into(), json!("otlp"));
        env.insert("OTEL_LOGS_EXPORTER".into(), json!("otlp"));
        env.insert("OTEL_EXPORTER_OTLP_PROTOCOL".into(), json!("http/protobuf"));
        if let Some(endpoint) = &t.endpoint {
            env.insert("OTEL_EXPORTER_OTLP_ENDPOINT".into(), json!(endpoint));
        }
        if t.log_prompts {
            env.insert("OTEL_LOG_USER_PROMPTS".into(), json!("1"));
        }
    }
    if !profile.models.is_empty() {
        settings.insert("availableModels".into(), json!(profile.models));
    }
    if let Some(p) = &profile.permissions {
        let mut perms = Map::new();
        if let Some(mode) = &p.default_mode {
            perms.insert("defaultMode".into(), json!(mode));
        }
        for (key, list) in [("allow", &p.allow), ("ask", &p.ask), ("deny", &p.deny)] {
            if !list.is_empty() {
                perms.insert(key.into(), json!(list));
            }
        }
        settings.insert("permissions".into(), Value::Object(perms));
    }
    if !profile.hooks.is_empty() {
        let mut hooks = Map::new();
        for (event, list) in &profile.hooks {
            let groups: Vec<Value> = list
                .iter()
                .map(|h| {
                    let mut command = Map::new();
                    command.insert("type".into(), json!("command"));
                    command.insert("command".into(), json!(h.command));
                    if let Some(t) = h.timeout_seconds {
                        command.insert("timeout".into(), json!(t));
                    }
                    let mut group = Map::new();
                    if let Some(m) = &h.matcher {
                        group.insert("matcher".into(), json!(m));
                    }
                    group.insert("hooks".into(), json!([Value::Object(command)]));
                    Value::Object(group)
                })
                .collect();
            hooks.insert(event.clone(), Value::Array(groups));
        }
        settings.insert("hooks".into(), Value::Object(hooks));
    }
    if profile.egress.as_ref().is_some_and(|e| !e.allow.is_empty()) {
        out.warn(
            H,
            os,
            "egress.allow is not expressible in managed settings; enforce it at the network",
        );
    }
    settings.insert("env".into(), Value::Object(env));
    let overrides: Map<String, Value> = harness
        .overrides
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    merge_json_objects(&mut settings, &overrides);
    out.file(
        H,
        os,
        &join(os, "managed-settings.json"),
        json_bytes(&Value::Object(settings)),
    );

    if !profile.mcp.is_empty() {
        let mut servers = Map::new();
        for (name, s) in &profile.mcp {
            let mut server = Map::new();
            if let Some(url) = &s.url {
                let kind = if url.trim_end_matches('/').ends_with("/sse") {
                    "sse"
                } else {
                    "http"
                };
                server.insert("type".into(), json!(kind));
                server.insert("url".into(), json!(url));
            } else {
                server.insert("type".into(), json!("stdio"));
                if let Some(c) = &s.command {
                    server.insert("command".into(), json!(c));
                }
                server.insert("args".into(), json!(s.args));
            }
            if !s.env.is_empty() {
                server.insert("env".into(), json!(s.env));
            }
            servers.insert(name.clone(), Value::Object(server));
        }
        out.file(
            H,
            os,
            &join(os, "managed-mcp.json"),
            json_bytes(&json!({ "mcpServers": servers })),
        );
    }
    out
}
