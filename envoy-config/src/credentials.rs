//! Per-attempt credentials: Envoy's own filters after the halo filter's per-attempt stage
//! on an aggregate cluster, each wrapped in a match_delegate so it runs only on attempts
//! whose target it belongs to (docs/ARCHITECTURE.md, "Per-attempt credentials", pinned in
//! Envoy 1.40 by tests/tests/credentials.rs and tests/tests/providers.rs).
//!
//! Shared by the standalone bootstrap (secrets as static resources) and the xDS translator
//! (secrets over ADS): the same JSON either way. No secret is ever in the configuration:
//! a key is an Envoy `DataSource` naming the environment variable or file the policy's
//! `credential` names; SigV4 uses Envoy's AWS default chain.

use halo_policy::types::{Upstream, UpstreamKind};
use serde_json::{Value, json};

use crate::bootstrap::endpoint;

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
/// providers' own that may receive the gateway's credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hosts {
    /// `signHosts`: exact hosts (besides AWS's) that may receive a SigV4 signature.
    pub sign_hosts: Vec<String>,
    /// `upstreamHosts`: exact hosts (besides the providers' own domains) that may receive
    /// a key.
    pub upstream_hosts: Vec<String>,
}

/// The settings keys [`Hosts::from_settings`] reads; the renderers remove them from the
/// settings the filter gets.
pub const HOSTS_SETTINGS: [&str; 2] = ["signHosts", "upstreamHosts"];

impl Hosts {
    pub fn from_settings(settings: &Value) -> Hosts {
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
        Hosts {
            sign_hosts: list("signHosts"),
            upstream_hosts: list("upstreamHosts"),
        }
    }
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
    /// A bedrock target whose host may not receive the signature: 502 bad_upstream.
    RefuseSigning { host: String },
    /// A key from `source`, sent as `header` (with `Bearer ` for OpenAI).
    Key {
        header: &'static str,
        bearer: bool,
        secret: String,
        source: SecretSource,
    },
}

impl TargetCredential {
    pub fn is_none(&self) -> bool {
        *self == TargetCredential::None
    }
}

/// The secret name of upstream `name`'s key.
pub fn secret_name(upstream: &str) -> String {
    format!("halo-credential-{upstream}")
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
                        "upstream {name}: {host} is neither an AWS host nor in signHosts; its requests are answered 502"
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
            let (header, bearer) = match kind {
                UpstreamKind::Openai => ("Authorization", true),
                UpstreamKind::AzureOpenai => ("api-key", false),
                UpstreamKind::Gemini => ("x-goog-api-key", false),
                _ => ("x-api-key", false),
            };
            (
                TargetCredential::Key {
                    header,
                    bearer,
                    secret: secret_name(name),
                    source,
                },
                None,
            )
        }
        // Vertex (Google ADC token) is not rendered yet; orchestrator has none.
        _ => (TargetCredential::None, None),
    }
}

/// The `Secret` resource (envoy.extensions.transport_sockets.tls.v3.Secret) of a key: a
/// reference to where it is read, never the value. A file is re-read when replaced.
pub fn secret(name: &str, source: &SecretSource) -> Value {
    let data = match source {
        SecretSource::Env(var) => json!({"environment_variable": var}),
        SecretSource::File(path) => json!({"filename": path}),
    };
    json!({"name": name, "generic_secret": {"secret": data}})
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

/// How a key's secret is found: a static secret of the bootstrap, or over ADS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretDelivery {
    Static,
    Ads,
}

/// The filters one target's attempts get after the stage.
pub fn target_filters(
    cluster: &str,
    cred: &TargetCredential,
    delivery: SecretDelivery,
) -> Vec<Value> {
    match cred {
        TargetCredential::None => Vec::new(),
        TargetCredential::SigV4 { region } => vec![
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
        ],
        TargetCredential::RefuseSigning { host } => vec![only_for(
            &format!("halo.refuse.{cluster}"),
            cluster,
            lua(&refuse_signing_lua(host)),
        )],
        TargetCredential::Key {
            header,
            bearer,
            secret,
            ..
        } => {
            let mut credential = json!({"name": secret});
            if delivery == SecretDelivery::Ads {
                credential["sds_config"] = json!({"ads": {}, "resource_api_version": "V3"});
            }
            let mut generic = json!({
                "@type": "type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic",
                "credential": credential,
                "header": header,
            });
            if *bearer {
                generic["header_value_prefix"] = json!("Bearer ");
            }
            vec![only_for(
                &format!("halo.credential.{cluster}"),
                cluster,
                json!({"name": "envoy.filters.http.credential_injector", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector",
                    "overwrite": true,
                    "credential": {"name": "envoy.http.injected_credentials.generic", "typed_config": generic}}}),
            )]
        }
    }
}

/// The header_mutation every attempt starts with: reset [`RESET_HEADERS`], set the marker
/// from the chosen endpoint's metadata.
pub fn reset_filter() -> Value {
    let mut mutations: Vec<Value> = RESET_HEADERS.iter().map(|h| json!({"remove": h})).collect();
    mutations.push(json!({"append": {
        "header": {"key": TARGET_HEADER, "value": "%UPSTREAM_METADATA(halo:target)%"},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}));
    json!({"name": "halo.attempt-reset", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
        "mutations": {"request_mutations": mutations}}})
}

/// The header_mutation removing the marker before the request leaves.
pub fn unmark_filter() -> Value {
    json!({"name": "halo.attempt-unmark", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
        "mutations": {"request_mutations": [{"remove": TARGET_HEADER}]}}})
}

/// The upstream codec, last in every upstream filter chain.
pub fn codec_filter() -> Value {
    json!({
        "name": "envoy.filters.http.upstream_codec",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec"},
    })
}

/// An aggregate's upstream filters: `[stage, codec]` when none of its targets (cluster,
/// credential) has a credential, else `[reset, stage, each target's filters, unmark,
/// codec]`.
pub fn attempt_chain(
    stage: Value,
    targets: &[(String, TargetCredential)],
    delivery: SecretDelivery,
) -> Vec<Value> {
    if targets.iter().all(|(_, c)| c.is_none()) {
        return vec![stage, codec_filter()];
    }
    let mut chain = vec![reset_filter(), stage];
    for (cluster, cred) in targets {
        chain.extend(target_filters(cluster, cred, delivery));
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
            upstream_hosts: vec![],
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
            sign_hosts: vec![],
            upstream_hosts: vec!["127.0.0.1".into()],
        };
        assert!(!target_credential("az", &u, &hosts).0.is_none());
    }

    #[test]
    fn no_secret_value_is_ever_rendered() {
        let s = secret("n", &SecretSource::File("/run/keys/k".into()));
        assert_eq!(
            s["generic_secret"]["secret"],
            json!({"filename": "/run/keys/k"})
        );
        let s = secret("n", &SecretSource::Env("K".into()));
        assert_eq!(
            s["generic_secret"]["secret"],
            json!({"environment_variable": "K"})
        );
    }
}
