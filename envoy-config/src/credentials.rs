//! Per-attempt credentials: Envoy's own filters after the halo filter's per-attempt stage
//! on an aggregate cluster, each wrapped in a match_delegate so it runs only on attempts
//! whose target it belongs to (docs/design/credentials.md, "Per-attempt credentials", pinned in
//! Envoy 1.40 by e2e/tests/credentials.rs and e2e/tests/providers.rs).
//!
//! Planned once (the gateway plan), printed by the standalone bootstrap and by halo-xds:
//! the same JSON either way. No secret is ever in the configuration: a key is read at use
//! time, per attempt, from the environment variable or file the policy's `credential`
//! names ([`key_lua`]: one target's missing key fails that target alone, 502
//! `upstream_auth_error`, and is used as soon as it is there); SigV4 uses Envoy's AWS
//! default chain; the Vertex token is the SDS file halo-credentials keeps fresh
//! (`vertexTokenSds`); `upstreamHeaders` values name environment variables through
//! Envoy's `%ENVIRONMENT(VAR)%` formatter.

use std::collections::BTreeMap;

use halo_policy::types::{Upstream, UpstreamKind};
use serde_json::{Value, json};

use crate::plan::endpoint;

/// The per-attempt marker header: the chosen endpoint's `halo.target` (its cluster name),
/// set by Envoy's formatter on every attempt and removed before the request leaves.
pub const TARGET_HEADER: &str = "x-halo-target";

/// Headers reset on every attempt: a previous attempt's credential or signature (the
/// header map is shared by all attempts) and the client's credentials.
pub const RESET_HEADERS: [&str; 8] = [
    "authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "proxy-authorization",
    "x-amz-date",
    "x-amz-content-sha256",
    "x-amz-security-token",
];

/// Gateway settings read by the renderers (never by the filter): hosts besides the
/// providers' own that may receive the gateway's credentials, where the Vertex token is,
/// and the operator's per-upstream headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hosts {
    /// `signHosts`: exact hosts (besides AWS's) that may receive a SigV4 signature.
    pub sign_hosts: Vec<String>,
    /// `upstreamHosts`: exact hosts (besides the providers' own domains) that may receive
    /// a key.
    pub upstream_hosts: Vec<String>,
    /// `vertexTokenSds`: the SDS file halo-credentials writes (`Bearer <token>`); every
    /// vertex upstream's attempts get it as `Authorization`.
    pub vertex_token_sds: Option<String>,
    /// `vertexTokenSecret`: the secret's name in that file (halo-credentials'
    /// `--secret-name`); default [`DEFAULT_VERTEX_SECRET`].
    pub vertex_token_secret: Option<String>,
    /// `upstreamHeaders`: per policy upstream name, headers set on its attempts; values as
    /// the operator wrote them (`${VAR}` expanded by Envoy, see [`header_value`]).
    pub upstream_headers: BTreeMap<String, BTreeMap<String, String>>,
}

/// The settings keys [`Hosts::from_settings`] reads; the renderers remove them from the
/// settings the filter gets.
pub const HOSTS_SETTINGS: [&str; 5] = [
    "signHosts",
    "upstreamHosts",
    "vertexTokenSds",
    "vertexTokenSecret",
    "upstreamHeaders",
];

/// halo-credentials' default `--secret-name`.
pub const DEFAULT_VERTEX_SECRET: &str = "halo-vertex-token";

/// Why the credential settings cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("settings.{key}: {why}")]
    Shape { key: &'static str, why: String },
    #[error("upstreamHeaders: {upstream:?} is not an upstream of the policy")]
    UnknownUpstream { upstream: String },
    #[error("upstreamHeaders.{upstream}.{header}: {why}")]
    Header {
        upstream: String,
        header: String,
        why: String,
    },
}

impl Hosts {
    /// Read the renderer's keys ([`HOSTS_SETTINGS`]) from the filter's `settings` object;
    /// a key of the wrong shape is an error naming it.
    pub fn from_settings(settings: &Value) -> Result<Hosts, SettingsError> {
        let shape = |key: &'static str, why: &str| SettingsError::Shape {
            key,
            why: why.to_string(),
        };
        for key in ["signHosts", "upstreamHosts"] {
            if let Some(v) = settings.get(key)
                && !v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
            {
                return Err(shape(key, "must be a list of host names"));
            }
        }
        let text = |key: &'static str| -> Result<Option<String>, SettingsError> {
            match settings.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
                Some(_) => Err(shape(key, "must be a non-empty string")),
            }
        };
        let vertex_token_sds = text("vertexTokenSds")?;
        if vertex_token_sds
            .as_deref()
            .is_some_and(|p| !p.starts_with('/'))
        {
            return Err(shape("vertexTokenSds", "must be an absolute path"));
        }
        let vertex_token_secret = text("vertexTokenSecret")?;
        let mut upstream_headers = BTreeMap::new();
        match settings.get("upstreamHeaders") {
            None | Some(Value::Null) => {}
            Some(Value::Object(ups)) => {
                for (up, headers) in ups {
                    let Some(headers) = headers.as_object() else {
                        return Err(shape(
                            "upstreamHeaders",
                            &format!("{up}: must map header names to values"),
                        ));
                    };
                    let mut out = BTreeMap::new();
                    for (h, v) in headers {
                        let Some(v) = v.as_str() else {
                            return Err(SettingsError::Header {
                                upstream: up.clone(),
                                header: h.clone(),
                                why: "the value must be a string".into(),
                            });
                        };
                        out.insert(h.clone(), v.to_string());
                    }
                    upstream_headers.insert(up.clone(), out);
                }
            }
            Some(_) => {
                return Err(shape(
                    "upstreamHeaders",
                    "must map upstream names to {header: value}",
                ));
            }
        }
        let list = |key: &str| -> Vec<String> {
            settings
                .get(key)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_ascii_lowercase)
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(Hosts {
            sign_hosts: list("signHosts"),
            upstream_hosts: list("upstreamHosts"),
            vertex_token_sds,
            vertex_token_secret,
            upstream_headers,
        })
    }

    /// Every upstream's headers as rendered by [`header_value`], checked against the
    /// policy's upstream names: an unknown upstream, a header name Envoy may not set here,
    /// or a malformed `${...}` is an error naming the upstream and the header.
    pub fn rendered_headers(
        &self,
        mut known: impl FnMut(&str) -> bool,
    ) -> Result<BTreeMap<String, Vec<(String, String)>>, SettingsError> {
        let mut out = BTreeMap::new();
        for (up, headers) in &self.upstream_headers {
            if !known(up) {
                return Err(SettingsError::UnknownUpstream {
                    upstream: up.clone(),
                });
            }
            let mut rendered = Vec::new();
            for (h, v) in headers {
                let err = |why: String| SettingsError::Header {
                    upstream: up.clone(),
                    header: h.clone(),
                    why,
                };
                check_header_name(h).map_err(err)?;
                rendered.push((h.to_ascii_lowercase(), header_value(v).map_err(err)?));
            }
            out.insert(up.clone(), rendered);
        }
        Ok(out)
    }
}

/// A header name `upstreamHeaders` may set: an HTTP token, not a pseudo-header, not one
/// Envoy or the gateway owns.
fn check_header_name(name: &str) -> Result<(), String> {
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$&'*+-.^_`|~".contains(&b));
    if !token {
        return Err("not a valid header name".into());
    }
    let lower = name.to_ascii_lowercase();
    if matches!(
        lower.as_str(),
        "host" | "content-length" | "transfer-encoding" | "connection" | "te" | "upgrade"
    ) || lower.starts_with("x-halo-")
        || lower.starts_with("x-envoy-")
    {
        return Err("this header is set by Envoy or the gateway".into());
    }
    Ok(())
}

/// An `upstreamHeaders` value in Envoy's formatter syntax: each `${VAR}` becomes
/// `%ENVIRONMENT(VAR)%` (read by Envoy from its own environment when it loads the
/// configuration, so no secret value is in it), a literal `%` becomes `%%`. A `$` not
/// followed by `{` is literal. `${` without `}`, or a name that is not
/// `[A-Za-z_][A-Za-z0-9_]*`, is an error.
pub fn header_value(value: &str) -> Result<String, String> {
    walk_header_value(value, "%%", |var, out| {
        out.push_str(&format!("%ENVIRONMENT({var})%"));
        Ok(())
    })
}

/// An `upstreamHeaders` value as Envoy sends it, for a sender of the gateway's requests
/// outside Envoy (halo-server's mirror service): each `${VAR}` replaced by `env(VAR)`; a
/// variable `env` does not have is an error naming it (never the value).
pub fn expand_header_value(
    value: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    walk_header_value(value, "%", |var, out| {
        out.push_str(&env(var).ok_or_else(|| format!("environment variable {var} is not set"))?);
        Ok(())
    })
}

/// The one reading of an `upstreamHeaders` value: literal text (a `%` written as
/// `percent`), and each `${VAR}` handed to `var`.
fn walk_header_value(
    value: &str,
    percent: &str,
    mut var_to: impl FnMut(&str, &mut String) -> Result<(), String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(i) = rest.find(['$', '%']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix('%') {
            out.push_str(percent);
            rest = after;
        } else if let Some(after) = tail.strip_prefix("${") {
            let Some(end) = after.find('}') else {
                // Not the value: it may hold a literal secret.
                return Err("\"${\" without a closing \"}\"".into());
            };
            let var = &after[..end];
            let valid = var
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(
                    "a ${...} does not hold an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
                        .into(),
                );
            }
            var_to(var, &mut out)?;
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = tail.strip_prefix('$').unwrap_or(tail);
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Where a key is read at use time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    Env(String),
    File(String),
}

/// What one target's attempts get after the per-attempt stage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TargetCredential {
    /// Nothing of the gateway's own (pass-through kinds, or no credential configured).
    #[default]
    None,
    /// SigV4 by Envoy's signer with the AWS default chain; unsigned attempts refused.
    SigV4 { region: String },
    /// A bedrock target whose host may not receive the signature: left out of failover
    /// orders by the plan; alone in one, 502 bad_upstream.
    RefuseSigning { host: String },
    /// Upstream `upstream`'s key, read from `source` at use time ([`key_lua`]), sent as
    /// `header` (with `Bearer ` for OpenAI).
    Key {
        header: &'static str,
        bearer: bool,
        upstream: String,
        source: SecretSource,
    },
    /// Google's access token (vertex) as `Authorization`, from the SDS file
    /// halo-credentials keeps fresh (`Bearer <token>` in secret `secret`).
    Token { secret: String, sds_path: String },
}

impl TargetCredential {
    pub fn is_none(&self) -> bool {
        *self == TargetCredential::None
    }
}

fn is_aws_host(host: &str) -> bool {
    [".amazonaws.com", ".amazonaws.com.cn", ".api.aws"]
        .iter()
        .any(|s| host.ends_with(s))
}

/// The region of a `bedrock-runtime[-fips].<region>.` host.
pub fn region_from_host(host: &str) -> Option<String> {
    let mut labels = host.split('.');
    let first = labels.next()?;
    if first != "bedrock-runtime" && first != "bedrock-runtime-fips" {
        return None;
    }
    labels
        .next()
        .filter(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        .map(str::to_string)
}

/// Whether a key for `kind` may go to `host` (`https` says the URL's scheme).
/// The header a key of `kind` travels in, and whether its value is `Bearer <key>`;
/// `None` for kinds whose credential is not a key.
fn key_header_of(kind: UpstreamKind) -> Option<(&'static str, bool)> {
    match kind {
        UpstreamKind::Openai => Some(("Authorization", true)),
        UpstreamKind::AzureOpenai => Some(("api-key", false)),
        UpstreamKind::Gemini => Some(("x-goog-api-key", false)),
        UpstreamKind::Anthropic => Some(("x-api-key", false)),
        UpstreamKind::Orchestrator | UpstreamKind::Bedrock | UpstreamKind::Vertex => None,
    }
}

fn key_host_allowed(kind: UpstreamKind, host: &str, https: bool, hosts: &Hosts) -> bool {
    if hosts.upstream_hosts.iter().any(|h| h == host) {
        return true;
    }
    https
        && match kind {
            UpstreamKind::Openai => host == "api.openai.com",
            UpstreamKind::AzureOpenai => host.ends_with(".openai.azure.com"),
            UpstreamKind::Gemini => host == "generativelanguage.googleapis.com",
            UpstreamKind::Anthropic => host == "api.anthropic.com",
            UpstreamKind::Vertex => host.ends_with(".googleapis.com"),
            _ => false,
        }
}

/// What `upstream` (named `name`) gets on each attempt, and a warning for the operator
/// when a configured credential is not used.
pub fn target_credential(
    name: &str,
    upstream: &Upstream,
    hosts: &Hosts,
) -> (TargetCredential, Option<String>) {
    let Ok(ep) = endpoint(&format!("upstream {name}"), &upstream.url) else {
        return (TargetCredential::None, None);
    };
    let host = ep.host.to_ascii_lowercase();
    match upstream.kind {
        UpstreamKind::Bedrock => {
            let region = upstream.region.clone().or_else(|| region_from_host(&host));
            match region {
                // The spec's backward-compatibility rule: no region, no signature.
                None => (TargetCredential::None, None),
                Some(region) if is_aws_host(&host) || hosts.sign_hosts.contains(&host) => {
                    (TargetCredential::SigV4 { region }, None)
                }
                Some(_) => (
                    TargetCredential::RefuseSigning { host: host.clone() },
                    Some(format!(
                        "upstream {name}: {host} is neither an AWS host nor in signHosts: it is left out of failover orders (a call goes to the next target, and is answered 502 only when no other is left)"
                    )),
                ),
            }
        }
        kind @ (UpstreamKind::Openai
        | UpstreamKind::AzureOpenai
        | UpstreamKind::Gemini
        | UpstreamKind::Anthropic) => {
            let Some(c) = &upstream.credential else {
                return (TargetCredential::None, None);
            };
            let source = match (&c.env, &c.file) {
                (Some(env), _) => SecretSource::Env(env.clone()),
                (None, Some(file)) => SecretSource::File(file.clone()),
                (None, None) => return (TargetCredential::None, None),
            };
            if !key_host_allowed(kind, &host, ep.tls, hosts) {
                return (
                    TargetCredential::None,
                    Some(format!(
                        "upstream {name}: {host} is not the provider's own https host nor in upstreamHosts; no credential is sent to it"
                    )),
                );
            }
            let (header, bearer) = key_header_of(kind).unwrap_or(("x-api-key", false));
            (
                TargetCredential::Key {
                    header,
                    bearer,
                    upstream: name.to_string(),
                    source,
                },
                None,
            )
        }
        UpstreamKind::Vertex => {
            let Some(sds_path) = &hosts.vertex_token_sds else {
                return (
                    TargetCredential::None,
                    Some(format!(
                        "upstream {name}: no vertexTokenSds (the SDS file halo-credentials writes); its requests carry no Google token"
                    )),
                );
            };
            if !key_host_allowed(UpstreamKind::Vertex, &host, ep.tls, hosts) {
                return (
                    TargetCredential::None,
                    Some(format!(
                        "upstream {name}: {host} is not an https *.googleapis.com host nor in upstreamHosts; no Google token is sent to it"
                    )),
                );
            }
            (
                TargetCredential::Token {
                    secret: hosts
                        .vertex_token_secret
                        .clone()
                        .unwrap_or_else(|| DEFAULT_VERTEX_SECRET.to_string()),
                    sds_path: sds_path.clone(),
                },
                None,
            )
        }
        // The orchestrator handles provider auth itself (or gets upstreamHeaders).
        UpstreamKind::Orchestrator => (TargetCredential::None, None),
    }
}

/// Run `filter` only on attempts whose marker is `cluster`.
fn only_for(name: &str, cluster: &str, filter: Value) -> Value {
    json!({
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.common.matching.v3.ExtensionWithMatcher",
            "extension_config": filter,
            "xds_matcher": {"matcher_list": {"matchers": [{
                "predicate": {"not_matcher": {"single_predicate": {
                    "input": {"name": "target", "typed_config": {
                        "@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                        "header_name": TARGET_HEADER}},
                    "value_match": {"exact": cluster},
                }}},
                "on_match": {"action": {"name": "skip", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.common.matcher.action.v3.SkipFilter"}}},
            }]}},
        },
    })
}

fn lua(code: &str) -> Value {
    json!({"name": "envoy.filters.http.lua", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        "default_source_code": {"inline_string": code}}})
}

/// Envoy's signer forwards unsigned when the AWS chain finds no credentials: refuse that.
const REQUIRE_SIGNATURE_LUA: &str = r#"function envoy_on_request(h)
  local auth = h:headers():get("authorization")
  if auth == nil or string.sub(auth, 1, 17) ~= "AWS4-HMAC-SHA256 " then
    h:logErr("halo: no AWS credentials for a bedrock upstream; answered 502 upstream_auth_error")
    h:respond({[":status"] = "502", ["content-type"] = "application/json"},
      '{"type":"error","error":{"type":"upstream_auth_error","message":"no AWS credentials for this upstream"}}')
  end
end
"#;

fn refuse_signing_lua(host: &str) -> String {
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'))
        .collect();
    format!(
        r#"function envoy_on_request(h)
  h:logErr("halo: bedrock host {host} is neither an AWS host nor in signHosts: not signed, answered 502")
  h:respond({{[":status"] = "502", ["content-type"] = "application/json"}},
    '{{"type":"error","error":{{"type":"bad_upstream","message":"this upstream host may not receive a SigV4 signature"}}}}')
end
"#
    )
}

/// How long (seconds, per Envoy worker) a key file's content is used before it is read
/// again: a key written or rotated later is used within about this long.
pub const KEY_FILE_REREAD_SECONDS: u32 = 1;

/// `s` as a Lua string literal: printable ASCII kept, quotes and backslashes escaped,
/// every other byte a decimal escape (a path or name cannot end the literal or the script).
fn lua_string(s: &str) -> String {
    let mut out = String::from("\"");
    for b in s.bytes() {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(char::from(b));
            }
            b' '..=b'~' => out.push(char::from(b)),
            _ => out.push_str(&format!("\\{b:03}")),
        }
    }
    out.push('"');
    out
}

/// The per-attempt step that gives upstream `upstream`'s attempts its key as `header`
/// (`Bearer <key>` when `bearer`), read where the policy's credential says at use time:
/// the environment variable from Envoy's environment on each attempt, the file at most
/// every [`KEY_FILE_REREAD_SECONDS`] per worker (trailing whitespace dropped). Nothing is
/// read when Envoy loads its configuration, so a key that is missing cannot make Envoy
/// refuse a configuration that carries the other targets' keys, and a key file that
/// appears later is used without a restart (Envoy's environment is fixed when it starts:
/// a variable set later needs a restart). A missing or empty key fails this target
/// alone, closed: 502 `upstream_auth_error`, nothing sent upstream, an error line in
/// Envoy's log naming the upstream and where its key was looked for, and
/// [`halo_contract::names::KEY_MISSING_HEADER`] for the halo filter's counter. The key is never logged.
pub fn key_lua(upstream: &str, header: &str, bearer: bool, source: &SecretSource) -> String {
    let name: String = upstream
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .collect();
    let (prelude, read, place) = match source {
        SecretSource::Env(var) => (
            "",
            format!("local key = os.getenv({})", lua_string(var)),
            format!("environment variable {var} is not set in Envoy's environment"),
        ),
        SecretSource::File(path) => (
            // Per worker (each has its own Lua state): the key and when it was read.
            "local cache = {}\n",
            format!(
                r#"local now = os.time()
  if cache.at == nil or now - cache.at >= {KEY_FILE_REREAD_SECONDS} then
    local f = io.open({path}, "rb")
    cache.key = nil
    if f then
      cache.key = string.gsub(f:read("*a") or "", "%s+$", "")
      f:close()
    end
    cache.at = now
  end
  local key = cache.key"#,
                path = lua_string(path)
            ),
            format!("file {path} cannot be read"),
        ),
    };
    let prefix = if bearer { "\"Bearer \" .. " } else { "" };
    let log = lua_string(&format!(
        "halo: upstream {name} has no key ({place}); answered 502 upstream_auth_error"
    ));
    let body = lua_string(&format!(
        r#"{{"type":"error","error":{{"type":"upstream_auth_error","message":"the gateway has no key for upstream {name}"}}}}"#
    ));
    format!(
        r#"{prelude}function envoy_on_request(h)
  {read}
  if key == nil or key == "" then
    h:logErr({log})
    h:respond({{[":status"] = "502", ["content-type"] = "application/json", [{marker}] = {upstream}}}, {body})
    return
  end
  h:headers():replace({header}, {prefix}key)
end
"#,
        marker = lua_string(halo_contract::names::KEY_MISSING_HEADER),
        upstream = lua_string(&name),
        header = lua_string(header),
    )
}

/// What one target's attempts get after the per-attempt stage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttemptTarget {
    /// The target's cluster name (the marker's value on its attempts).
    pub cluster: String,
    pub credential: TargetCredential,
    /// `upstreamHeaders` of its upstream: (lowercase name, value in Envoy's formatter
    /// syntax, [`header_value`]).
    pub headers: Vec<(String, String)>,
}

impl AttemptTarget {
    fn is_plain(&self) -> bool {
        self.credential.is_none() && self.headers.is_empty()
    }
}

fn header_mutation(name: &str, mutations: Vec<Value>) -> Value {
    json!({"name": name, "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
        "mutations": {"request_mutations": mutations}}})
}

fn set_header(name: &str, value: &str) -> Value {
    json!({"append": {
        "header": {"key": name, "value": value},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}})
}

/// The filters one target's attempts get after the stage: its `upstreamHeaders` (first,
/// so a signature covers them and the gateway's credential overwrites a header of the
/// same name), then its credential.
pub fn target_filters(target: &AttemptTarget) -> Vec<Value> {
    let cluster = target.cluster.as_str();
    let mut out = Vec::new();
    if !target.headers.is_empty() {
        let mutations = target
            .headers
            .iter()
            .map(|(h, v)| set_header(h, v))
            .collect();
        out.push(only_for(
            &format!("halo.headers.{cluster}"),
            cluster,
            header_mutation("envoy.filters.http.header_mutation", mutations),
        ));
    }
    let injector = |generic: Value| {
        only_for(
            &format!("halo.credential.{cluster}"),
            cluster,
            json!({"name": "envoy.filters.http.credential_injector", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector",
                // No credential (the secret not loaded): 401 from Envoy, nothing sent.
                "overwrite": true,
                "credential": {"name": "envoy.http.injected_credentials.generic", "typed_config": generic}}}),
        )
    };
    match &target.credential {
        TargetCredential::None => {}
        TargetCredential::SigV4 { region } => out.extend([
            only_for(
                &format!("halo.sign.{cluster}"),
                cluster,
                json!({"name": "envoy.filters.http.aws_request_signing", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.aws_request_signing.v3.AwsRequestSigning",
                    "service_name": "bedrock",
                    "region": region,
                    // Sign the SHA-256 of the final (translated) body.
                    "use_unsigned_payload": false,
                    "match_excluded_headers": [
                        {"prefix": "x-envoy"}, {"prefix": "x-halo"},
                        {"exact": "x-forwarded-proto"}, {"exact": "x-request-id"}]}}),
            ),
            only_for(
                &format!("halo.require-signature.{cluster}"),
                cluster,
                lua(REQUIRE_SIGNATURE_LUA),
            ),
        ]),
        TargetCredential::RefuseSigning { host } => out.push(only_for(
            &format!("halo.refuse.{cluster}"),
            cluster,
            lua(&refuse_signing_lua(host)),
        )),
        TargetCredential::Key {
            header,
            bearer,
            upstream,
            source,
        } => out.push(only_for(
            &format!("halo.key.{cluster}"),
            cluster,
            lua(&key_lua(upstream, header, *bearer, source)),
        )),
        // The file is Envoy's own (beside it, written by halo-credentials) in both modes:
        // Envoy reloads it when it is renamed over, so a rotated token needs no push.
        TargetCredential::Token { secret, sds_path } => out.push(injector(json!({
            "@type": "type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic",
            "credential": {"name": secret, "sds_config": {
                "path_config_source": {"path": sds_path},
                "resource_api_version": "V3"}},
            "header": "Authorization",
        }))),
    }
    out
}

/// The header_mutation every attempt starts with: reset [`RESET_HEADERS`] and `extra`
/// (the `upstreamHeaders` names of the aggregate's targets: one target's header must not
/// reach the next attempt's target), set the marker from the chosen endpoint's metadata.
pub fn reset_filter(extra: &[&str]) -> Value {
    let mut names: Vec<&str> = RESET_HEADERS.to_vec();
    for h in extra {
        if !names.contains(h) {
            names.push(h);
        }
    }
    let mut mutations: Vec<Value> = names.iter().map(|h| json!({"remove": h})).collect();
    mutations.push(set_header(
        TARGET_HEADER,
        &format!(
            "%UPSTREAM_METADATA({}:{})%",
            halo_contract::names::METADATA_NAMESPACE,
            halo_contract::names::TARGET_METADATA_KEY
        ),
    ));
    header_mutation("halo.attempt-reset", mutations)
}

/// The header_mutation removing the marker before the request leaves.
pub fn unmark_filter() -> Value {
    header_mutation(
        "halo.attempt-unmark",
        vec![json!({"remove": TARGET_HEADER})],
    )
}

/// The upstream codec, last in every upstream filter chain.
pub fn codec_filter() -> Value {
    json!({
        "name": "envoy.filters.http.upstream_codec",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec"},
    })
}

/// An aggregate's upstream filters: `[stage, codec]` when none of its targets has a
/// credential or `upstreamHeaders`, else `[reset, stage, each target's filters, unmark,
/// codec]`.
pub fn attempt_chain(stage: Value, targets: &[AttemptTarget]) -> Vec<Value> {
    if targets.iter().all(AttemptTarget::is_plain) {
        return vec![stage, codec_filter()];
    }
    let mut extra: Vec<&str> = targets
        .iter()
        .flat_map(|t| t.headers.iter().map(|(h, _)| h.as_str()))
        .collect();
    extra.sort_unstable();
    extra.dedup();
    let mut chain = vec![reset_filter(&extra), stage];
    for t in targets {
        chain.extend(target_filters(t));
    }
    chain.push(unmark_filter());
    chain.push(codec_filter());
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(url: &str, kind: UpstreamKind, region: Option<&str>) -> Upstream {
        Upstream {
            url: url.into(),
            kind,
            region: region.map(str::to_string),
            project: None,
            api_version: None,
            credential: None,
        }
    }

    #[test]
    fn bedrock_signs_only_for_aws_or_listed_hosts_with_a_region() {
        let hosts = Hosts {
            sign_hosts: vec!["bedrock.corp.example".into()],
            ..Hosts::default()
        };
        let c = |u: &Upstream| target_credential("b", u, &hosts).0;
        assert_eq!(
            c(&up(
                "https://bedrock-runtime.eu-west-1.amazonaws.com",
                UpstreamKind::Bedrock,
                None
            )),
            TargetCredential::SigV4 {
                region: "eu-west-1".into()
            }
        );
        assert_eq!(
            c(&up(
                "https://bedrock.corp.example",
                UpstreamKind::Bedrock,
                Some("eu-west-1")
            )),
            TargetCredential::SigV4 {
                region: "eu-west-1".into()
            }
        );
        assert_eq!(
            c(&up("http://proxy.local", UpstreamKind::Bedrock, None)),
            TargetCredential::None
        );
        assert_eq!(
            c(&up(
                "http://proxy.local",
                UpstreamKind::Bedrock,
                Some("us-east-1")
            )),
            TargetCredential::RefuseSigning {
                host: "proxy.local".into()
            }
        );
    }

    #[test]
    fn keys_go_only_to_the_providers_own_https_host_or_listed_hosts() {
        let mut u = up(
            "https://x.openai.azure.com",
            UpstreamKind::AzureOpenai,
            None,
        );
        u.credential = Some(halo_policy::types::Credential {
            env: Some("AZURE_KEY".into()),
            file: None,
        });
        let (c, w) = target_credential("az", &u, &Hosts::default());
        assert!(
            matches!(
                c,
                TargetCredential::Key {
                    header: "api-key",
                    ..
                }
            ),
            "{c:?}"
        );
        assert_eq!(w, None);
        u.url = "http://x.openai.azure.com".into();
        let (c, w) = target_credential("az", &u, &Hosts::default());
        assert_eq!(c, TargetCredential::None);
        assert!(w.is_some());
        u.url = "http://127.0.0.1:9".into();
        let hosts = Hosts {
            upstream_hosts: vec!["127.0.0.1".into()],
            ..Hosts::default()
        };
        assert!(!target_credential("az", &u, &hosts).0.is_none());
    }

    #[test]
    fn vertex_gets_the_token_file_only_on_googleapis_or_listed_hosts() {
        let mut u = up(
            "https://us-east5-aiplatform.googleapis.com",
            UpstreamKind::Vertex,
            Some("us-east5"),
        );
        let (c, w) = target_credential("v", &u, &Hosts::default());
        assert_eq!(c, TargetCredential::None);
        assert!(w.is_some_and(|w| w.contains("vertexTokenSds")));
        let hosts = Hosts {
            vertex_token_sds: Some("/run/halo/sds/vertex.json".into()),
            ..Hosts::default()
        };
        assert_eq!(
            target_credential("v", &u, &hosts),
            (
                TargetCredential::Token {
                    secret: DEFAULT_VERTEX_SECRET.into(),
                    sds_path: "/run/halo/sds/vertex.json".into()
                },
                None
            )
        );
        for url in [
            "http://us-east5-aiplatform.googleapis.com",
            "https://googleapis.com.evil.example",
            "http://127.0.0.1:9",
        ] {
            u.url = url.into();
            let (c, w) = target_credential("v", &u, &hosts);
            assert_eq!(c, TargetCredential::None, "{url}");
            assert!(w.is_some(), "{url}");
        }
        let listed = Hosts {
            upstream_hosts: vec!["127.0.0.1".into()],
            ..hosts
        };
        assert!(matches!(
            target_credential("v", &u, &listed).0,
            TargetCredential::Token { .. }
        ));
        let t = AttemptTarget {
            cluster: "c".into(),
            credential: target_credential("v", &u, &listed).0,
            headers: vec![],
        };
        let f = &target_filters(&t)[0];
        let generic =
            &f["typed_config"]["extension_config"]["typed_config"]["credential"]["typed_config"];
        assert_eq!(generic["header"], "Authorization");
        assert_eq!(
            generic["credential"]["sds_config"]["path_config_source"]["path"],
            "/run/halo/sds/vertex.json"
        );
    }

    #[test]
    fn a_key_is_read_at_use_time_and_its_absence_fails_its_target_closed() {
        let env = key_lua(
            "openai",
            "Authorization",
            true,
            &SecretSource::Env("OPENAI_KEY".into()),
        );
        assert!(env.contains(r#"os.getenv("OPENAI_KEY")"#), "{env}");
        assert!(
            env.contains(r#"h:headers():replace("Authorization", "Bearer " .. key)"#),
            "{env}"
        );
        assert!(env.contains(r#"[":status"] = "502""#), "{env}");
        assert!(
            env.contains(r#"["x-halo-key-missing"] = "openai""#),
            "{env}"
        );
        assert!(env.contains("upstream_auth_error"), "{env}");
        // A path cannot end the Lua string it is written in.
        let file = key_lua(
            "az",
            "api-key",
            false,
            &SecretSource::File("/keys/a\"b\\c\n".into()),
        );
        assert!(
            file.contains(r#"io.open("/keys/a\"b\\c\010", "rb")"#),
            "{file}"
        );
        assert!(
            file.contains(r#"h:headers():replace("api-key", key)"#),
            "{file}"
        );
        let t = AttemptTarget {
            cluster: "c".into(),
            credential: TargetCredential::Key {
                header: "x-api-key",
                bearer: false,
                upstream: "anthropic".into(),
                source: SecretSource::Env("K".into()),
            },
            headers: vec![],
        };
        let f = &target_filters(&t)[0];
        assert_eq!(f["name"], "halo.key.c");
        assert_eq!(
            f["typed_config"]["extension_config"]["name"],
            "envoy.filters.http.lua"
        );
    }

    #[test]
    fn header_values_name_environment_variables_never_values() {
        assert_eq!(
            header_value("${ANTHROPIC_API_KEY}").unwrap(),
            "%ENVIRONMENT(ANTHROPIC_API_KEY)%"
        );
        assert_eq!(
            header_value("Bearer ${T_1} 100% $x").unwrap(),
            "Bearer %ENVIRONMENT(T_1)% 100%% $x"
        );
        assert_eq!(header_value("2023-06-01").unwrap(), "2023-06-01");
        assert!(header_value("${OPEN").is_err());
        assert!(header_value("${}").is_err());
        assert!(header_value("${1X}").is_err());
        assert!(header_value("${A-B}").is_err());
        // The same reading, expanded outside Envoy (the mirror service).
        let env = |v: &str| (v == "T_1").then(|| "tok".to_string());
        assert_eq!(
            expand_header_value("Bearer ${T_1} 100% $x", env).unwrap(),
            "Bearer tok 100% $x"
        );
        let e = expand_header_value("${MISSING}", env).unwrap_err();
        assert!(e.contains("MISSING"), "{e}");
        assert!(expand_header_value("${OPEN", env).is_err());
    }

    #[test]
    fn upstream_headers_errors_name_the_upstream_and_header() {
        let hosts = |v: Value| Hosts::from_settings(&json!({ "upstreamHeaders": v }));
        let known = |u: &str| u == "anthropic";
        let h = hosts(json!({"anthropic": {"X-Api-Key": "${K}"}})).unwrap();
        assert_eq!(
            h.rendered_headers(known).unwrap()["anthropic"],
            vec![("x-api-key".to_string(), "%ENVIRONMENT(K)%".to_string())]
        );
        let e = hosts(json!({"nope": {"x-api-key": "${K}"}}))
            .unwrap()
            .rendered_headers(known)
            .unwrap_err();
        assert!(e.to_string().contains("\"nope\""), "{e}");
        let e = hosts(json!({"anthropic": {"x-api-key": "${K"}}))
            .unwrap()
            .rendered_headers(known)
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("upstreamHeaders.anthropic.x-api-key:"),
            "{e}"
        );
        for bad in [":authority", "host", "x-halo-target", "bad header"] {
            let e = hosts(json!({"anthropic": {bad: "v"}}))
                .unwrap()
                .rendered_headers(known)
                .unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert!(hosts(json!({"anthropic": {"x": 1}})).is_err());
        assert!(hosts(json!(["x"])).is_err());
        assert!(Hosts::from_settings(&json!({"vertexTokenSds": "relative.json"})).is_err());
    }

    #[test]
    fn one_targets_headers_are_reset_before_every_attempt() {
        let targets = [
            AttemptTarget {
                cluster: "a".into(),
                credential: TargetCredential::None,
                headers: vec![("x-org-key".into(), "%ENVIRONMENT(K)%".into())],
            },
            AttemptTarget {
                cluster: "b".into(),
                ..AttemptTarget::default()
            },
        ];
        let chain = attempt_chain(json!({"name": "stage"}), &targets);
        let names: Vec<&str> = chain.iter().map(|f| f["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "halo.attempt-reset",
                "stage",
                "halo.headers.a",
                "halo.attempt-unmark",
                "envoy.filters.http.upstream_codec"
            ]
        );
        let reset = chain[0]["typed_config"]["mutations"]["request_mutations"].to_string();
        assert!(reset.contains(r#"{"remove":"x-org-key"}"#), "{reset}");
    }
}
