//! The plugin configuration: the compiled snapshot plus the filter's settings, decoded
//! strictly. A configuration this module refuses makes the plugin refuse to start, with
//! one log line naming the field and the problem.
//!
//! ```json
//! {"snapshot": {...compiled snapshot...},
//!  "settings": {"identity": {"mode": "jwt", "userClaim": "email", ...},
//!               "forwardAuth": false, "maxBodyBytes": 33554432,
//!               "killSwitch": {"cluster": "halo-killswitch", "url": "https://...", ...},
//!               "routeHeader": "x-halo-route",
//!               "breaker": {"consecutiveFailures": 5, "openSeconds": 30},
//!               "shadow": {"cluster": "halo-shadow", "url": "http://...:9445/mirror",
//!                          "tokenEnv": "HALO_SHADOW_TOKEN", "maxBytes": 1048576}},
//!  "killList": "<signed envelope>",
//!  "budgetsExhausted": [{"budget": "eng-daily", "subject": "<32 hex>", "untilMs": 1764889200000}]}
//! ```
//!
//! The per-attempt stage (an upstream filter on the aggregate clusters, see
//! [`crate::attempt`]) is the same module configured with `{"stage": "attempt"}`.

use std::net::IpAddr;

use halo_contract::attempts::Breaker;
use halo_policy::Snapshot;
use serde::Deserialize;

use crate::cidr::Cidr;

/// Default body bound for model calls (32 MiB), the plan's too.
pub use halo_contract::limits::DEFAULT_MAX_BODY_BYTES;
/// Default kill-list poll interval.
pub const DEFAULT_KILL_INTERVAL_SECS: u32 = 10;
const DEFAULT_USER_CLAIM: &str = "email";
const DEFAULT_GROUPS_CLAIM: &str = "groups";

/// A refused configuration, as the one log line says it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("halo filter configuration refused: {0}")]
pub struct ConfigError(pub String);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    snapshot: Box<serde_json::value::RawValue>,
    #[serde(default)]
    settings: RawSettings,
    /// A signed kill-list envelope pushed with the configuration (xDS): verified with
    /// `settings.killSwitch.pubkey` exactly like a polled one; the poll stays as fallback.
    #[serde(default, rename = "killList")]
    kill_list: Option<String>,
    /// The exhausted `routeTo` budgets pushed with the configuration (xDS): their callers'
    /// aliases go to the cheaper ones (halo-policy's `budgets::rerouted`).
    #[serde(default, rename = "budgetsExhausted")]
    budgets_exhausted: Vec<halo_policy::budgets::Exhausted>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSettings {
    #[serde(default)]
    identity: RawIdentity,
    #[serde(default)]
    forward_auth: bool,
    #[serde(default)]
    max_body_bytes: Option<u64>,
    #[serde(default)]
    kill_switch: Option<RawKillSwitch>,
    #[serde(default)]
    route_header: Option<String>,
    /// The cluster the gateway plan gives `defaultUpstream`: a request no policy route
    /// takes is routed there instead of answered 404.
    #[serde(default)]
    default_upstream_cluster: Option<String>,
    #[serde(default)]
    test_panic: Option<TestPanic>,
    /// The target breakers (halo-envoy-config's gateway setting `breaker`, which the plan
    /// writes here).
    #[serde(default)]
    breaker: Breaker,
    /// Where shadow jobs go ([`crate::shadow`]); absent: nothing is mirrored.
    #[serde(default)]
    shadow: Option<RawShadow>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawShadow {
    cluster: String,
    url: String,
    #[serde(default)]
    authority: Option<String>,
    #[serde(default)]
    token: Option<String>,
    /// As `killSwitch.tokenEnv`: a VM environment variable holding the shadow token.
    #[serde(default)]
    token_env: Option<String>,
    #[serde(default)]
    max_bytes: Option<u64>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    allow_insecure_in_cluster: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawIdentity {
    #[serde(default)]
    mode: Option<IdentityMode>,
    #[serde(default)]
    user_claim: Option<String>,
    #[serde(default)]
    groups_claim: Option<String>,
    #[serde(default)]
    identity_header: Option<String>,
    #[serde(default)]
    groups_header: Option<String>,
    #[serde(default, rename = "trustedProxyCIDRs")]
    trusted_proxy_cidrs: Vec<String>,
    #[serde(default)]
    allow_anonymous: bool,
    #[serde(default)]
    trust_unverified_email: Option<bool>,
    #[serde(default)]
    jwt_metadata_key: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawKillSwitch {
    cluster: String,
    url: String,
    #[serde(default)]
    authority: Option<String>,
    #[serde(default)]
    token: Option<String>,
    /// The name of a VM environment variable holding the token (Envoy passes it with
    /// `vm_config.environment_variables.host_env_keys`), so a manifest never holds it.
    #[serde(default)]
    token_env: Option<String>,
    pubkey: String,
    #[serde(default)]
    interval_seconds: Option<u32>,
    #[serde(default)]
    allow_insecure_in_cluster: bool,
}

/// How callers are identified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentityMode {
    /// Claims verified by Envoy's jwt_authn (payload in dynamic metadata).
    Jwt,
    /// Identity and groups headers set by a trusted auth proxy (peer in trustedProxyCIDRs).
    TrustedHeader,
    /// No identity: every caller is anonymous (ring unknown, gateway routing).
    None,
}

/// The identity settings in force.
#[derive(Debug, Clone, PartialEq)]
pub struct IdentitySettings {
    /// `None`: no mode given, no issuer, no CIDRs: every model call is 503 (fail closed).
    pub mode: Option<IdentityMode>,
    pub user_claim: String,
    pub groups_claim: String,
    /// Lowercased header names (trusted_header mode).
    pub identity_header: Option<String>,
    pub groups_header: Option<String>,
    pub trusted_proxies: Vec<Cidr>,
    pub allow_anonymous: bool,
    pub trust_unverified_email: bool,
    /// The key under jwt_authn's dynamic metadata holding the verified payload: `halo_jwt`
    /// in the standalone bootstrap; Istio's RequestAuthentication writes `payload`, Envoy
    /// Gateway's SecurityPolicy the issuer (the mesh renderers set it).
    pub jwt_metadata_key: String,
}

/// The kill-list poller's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KillSwitchSettings {
    pub cluster: String,
    pub authority: String,
    pub path: String,
    pub token: String,
    /// `Err` with the reason when the PEM is unusable: traffic keeps flowing, stamped
    /// `x-halo-killswitch: misconfigured`.
    pub key: Result<ed25519_compact::PublicKey, String>,
    pub interval_secs: u32,
}

/// Where shadow jobs are sent ([`crate::shadow`]): the mirror service's cluster, path
/// and token, and the largest job body.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowSettings {
    pub cluster: String,
    pub authority: String,
    pub path: String,
    pub token: String,
    /// A job whose body is larger is not sent (counted `too_large`).
    pub max_bytes: u64,
    /// How long Envoy waits for the service to take a job.
    pub timeout_ms: u64,
}

/// Default `shadow.maxBytes`: 1 MiB (the spec's default).
pub const DEFAULT_SHADOW_MAX_BYTES: u64 = 1024 * 1024;
/// Default `shadow.timeoutMs`: the service takes a job (202) before it works on it.
pub const DEFAULT_SHADOW_TIMEOUT_MS: u64 = 2000;

/// A decoded, checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub snapshot: Snapshot,
    pub identity: IdentitySettings,
    pub forward_auth: bool,
    pub max_body_bytes: u64,
    pub kill_switch: Option<KillSwitchSettings>,
    pub route_header: String,
    /// Where a request no policy route takes goes ([`RawSettings`]'s
    /// `defaultUpstreamCluster`); `None`: 404.
    pub default_upstream: Option<String>,
    /// The pushed kill-list envelope (bytes as signed), if any.
    pub kill_list: Option<Vec<u8>>,
    /// The pushed exhausted `routeTo` budgets (empty: none, or a standalone gateway).
    pub budgets_exhausted: Vec<halo_policy::budgets::Exhausted>,
    /// Test only (`settings.testPanic`): the native build panics in this hook, so the live
    /// suite can prove a panic answers 500 and never takes Envoy down. The wasm build
    /// ignores it (a panic there traps the VM, which is Envoy's to handle).
    pub test_panic: Option<TestPanic>,
    /// The target breakers' threshold and cool-down ([`crate::breaker`]).
    pub breaker: Breaker,
    /// Where shadow jobs go; `None`: nothing is mirrored.
    pub shadow: Option<ShadowSettings>,
}

/// Where `settings.testPanic` makes the native build panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TestPanic {
    RequestHeaders,
    RequestBody,
    ResponseHeaders,
}

/// What a plugin instance is.
#[derive(Debug, Clone)]
pub enum Plugin {
    /// The request filter (HTTP connection manager chain).
    Request(Box<Config>),
    /// The per-attempt stage (upstream filter on an aggregate cluster).
    Attempt,
}

#[derive(Debug, Deserialize)]
struct StageProbe {
    #[serde(default)]
    stage: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAttempt {
    stage: RawStage,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawStage {
    Attempt,
}

impl Plugin {
    /// Decode either configuration strictly: one with a `stage` key is the per-attempt
    /// stage's (and nothing else may be in it), any other the request filter's.
    pub fn from_bytes(bytes: &[u8]) -> Result<Plugin, ConfigError> {
        Plugin::from_bytes_with_env(bytes, &|_| None)
    }

    /// [`Plugin::from_bytes`] with the VM environment (see [`Config::from_bytes_with_env`]).
    pub fn from_bytes_with_env(bytes: &[u8], env: EnvLookup<'_>) -> Result<Plugin, ConfigError> {
        let staged = serde_json::from_slice::<StageProbe>(bytes)
            .map(|p| p.stage.is_some())
            .unwrap_or(false);
        if !staged {
            return Config::from_bytes_with_env(bytes, env).map(|c| Plugin::Request(Box::new(c)));
        }
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let raw: RawAttempt = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            ConfigError(format!("{path}: {}", e.into_inner()))
        })?;
        match raw.stage {
            RawStage::Attempt => Ok(Plugin::Attempt),
        }
    }
}

/// The value of `name` in a WASI environment block (NUL-terminated `NAME=value` entries).
pub fn env_entry(block: &[u8], name: &str) -> Option<String> {
    block
        .split(|b| *b == 0)
        .filter_map(|entry| std::str::from_utf8(entry).ok())
        .find_map(|entry| {
            entry
                .split_once('=')
                .filter(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
}

/// Reads the plugin VM's environment (`settings.killSwitch.tokenEnv`).
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

impl Config {
    /// True when the kill switch is configured with an unusable key (traffic flows
    /// unkilled and is stamped so).
    pub fn kill_switch_misconfigured(&self) -> bool {
        self.kill_switch.as_ref().is_some_and(|k| k.key.is_err())
    }

    /// What a filter logs at error level when it starts with this configuration: settings
    /// it accepts but that change how traffic is treated.
    pub fn start_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(Err(e)) = self.kill_switch.as_ref().map(|k| &k.key) {
            out.push(format!(
                "halo: the kill-switch public key is unusable ({e}); traffic flows unkilled and is stamped x-halo-killswitch: misconfigured"
            ));
        }
        if self.identity.mode.is_none() {
            out.push(
                "halo: no identity configuration (no issuer, no trusted proxies, no mode): every request is answered 503"
                    .to_string(),
            );
        }
        out
    }

    /// Decode the plugin configuration bytes strictly and check every setting, with no
    /// VM environment.
    pub fn from_bytes(bytes: &[u8]) -> Result<Config, ConfigError> {
        Config::from_bytes_with_env(bytes, &|_| None)
    }

    /// [`Config::from_bytes`], reading variables named by the configuration from `env`.
    pub fn from_bytes_with_env(bytes: &[u8], env: EnvLookup<'_>) -> Result<Config, ConfigError> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            ConfigError(format!("{path}: {}", e.into_inner()))
        })?;
        let snapshot = Snapshot::from_bytes(raw.snapshot.get().as_bytes())
            .map_err(|e| ConfigError(format!("snapshot: {e}")))?;
        let s = raw.settings;
        let identity = identity_settings(&snapshot, s.identity)?;
        let max_body_bytes = s.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if max_body_bytes == 0 {
            return Err(ConfigError(
                "settings.maxBodyBytes: must be at least 1".into(),
            ));
        }
        let kill_switch = s
            .kill_switch
            .map(|k| kill_switch_settings(k, env))
            .transpose()?;
        if raw.kill_list.is_some() && kill_switch.is_none() {
            return Err(ConfigError(
                "killList: a pushed kill list needs settings.killSwitch (its pubkey verifies it)"
                    .into(),
            ));
        }
        let route_header = s
            .route_header
            .unwrap_or_else(|| halo_contract::names::ROUTE_HEADER.to_string())
            .to_ascii_lowercase();
        if !route_header.starts_with("x-halo-") || !is_token(&route_header) {
            return Err(ConfigError(format!(
                "settings.routeHeader: {route_header:?} must be a header name starting with x-halo- (so every client copy is stripped)"
            )));
        }
        if let Some(c) = &s.default_upstream_cluster
            && !is_token(c)
        {
            return Err(ConfigError(format!(
                "settings.defaultUpstreamCluster: {c:?} is not a cluster name"
            )));
        }
        if s.breaker.consecutive_failures == 0 || s.breaker.open_seconds == 0 {
            return Err(ConfigError(
                "settings.breaker: consecutiveFailures and openSeconds must be at least 1".into(),
            ));
        }
        let shadow = s.shadow.map(|r| shadow_settings(r, env)).transpose()?;
        Ok(Config {
            shadow,
            snapshot,
            identity,
            forward_auth: s.forward_auth,
            max_body_bytes,
            kill_switch,
            route_header,
            default_upstream: s.default_upstream_cluster,
            kill_list: raw.kill_list.map(String::into_bytes),
            budgets_exhausted: raw.budgets_exhausted,
            test_panic: s.test_panic,
            breaker: s.breaker,
        })
    }
}

fn identity_settings(snap: &Snapshot, raw: RawIdentity) -> Result<IdentitySettings, ConfigError> {
    let claims = snap.identity.as_ref().and_then(|i| i.claims.as_ref());
    let has_issuer = snap.identity.as_ref().is_some_and(|i| !i.issuer.is_empty());
    let mut trusted_proxies = Vec::new();
    for (i, text) in raw.trusted_proxy_cidrs.iter().enumerate() {
        let cidr = Cidr::parse(text).ok_or_else(|| {
            ConfigError(format!(
                "settings.identity.trustedProxyCIDRs[{i}]: {text:?} is not an IP prefix such as 10.0.0.0/8"
            ))
        })?;
        trusted_proxies.push(cidr);
    }
    // The spec's defaulting: an issuer means jwt, CIDRs alone mean trusted_header, and
    // neither (without an explicit mode) fails closed at request time.
    let mode = raw.mode.or(if has_issuer {
        Some(IdentityMode::Jwt)
    } else if !trusted_proxies.is_empty() {
        Some(IdentityMode::TrustedHeader)
    } else {
        None
    });
    let header = |name: Option<String>, field: &str| -> Result<Option<String>, ConfigError> {
        match name {
            None => Ok(None),
            Some(n) if n.is_empty() => Ok(None),
            Some(n) if is_token(&n) => Ok(Some(n.to_ascii_lowercase())),
            Some(n) => Err(ConfigError(format!(
                "settings.identity.{field}: {n:?} is not a header name"
            ))),
        }
    };
    let identity_header = header(raw.identity_header, "identityHeader")?;
    let groups_header = header(raw.groups_header, "groupsHeader")?;
    if mode == Some(IdentityMode::TrustedHeader) {
        if identity_header.is_none() {
            return Err(ConfigError(
                "settings.identity.identityHeader: required in trusted_header mode".into(),
            ));
        }
        if trusted_proxies.is_empty() {
            return Err(ConfigError(
                "settings.identity.trustedProxyCIDRs: required in trusted_header mode (the header is honoured only from these peers)".into(),
            ));
        }
    }
    if mode == Some(IdentityMode::Jwt) && !has_issuer {
        return Err(ConfigError(
            "settings.identity.mode: jwt needs identity.issuer in the policy".into(),
        ));
    }
    let claim = |raw: Option<String>, policy: Option<&String>, default: &str, field: &str| {
        let c = raw
            .or_else(|| policy.cloned())
            .unwrap_or_else(|| default.to_string());
        if c.is_empty() || c.contains('.') {
            Err(ConfigError(format!(
                "settings.identity.{field}: {c:?} must be a top-level claim name"
            )))
        } else {
            Ok(c)
        }
    };
    Ok(IdentitySettings {
        mode,
        user_claim: claim(
            raw.user_claim,
            claims.and_then(|c| c.user.as_ref()),
            DEFAULT_USER_CLAIM,
            "userClaim",
        )?,
        groups_claim: claim(
            raw.groups_claim,
            claims.and_then(|c| c.groups.as_ref()),
            DEFAULT_GROUPS_CLAIM,
            "groupsClaim",
        )?,
        identity_header,
        groups_header,
        trusted_proxies,
        allow_anonymous: raw.allow_anonymous,
        jwt_metadata_key: match raw.jwt_metadata_key {
            None => halo_contract::names::JWT_PAYLOAD_KEY.to_string(),
            Some(k) if !k.is_empty() => k,
            Some(_) => {
                return Err(ConfigError(
                    "settings.identity.jwtMetadataKey: must not be empty".into(),
                ));
            }
        },
        trust_unverified_email: raw.trust_unverified_email.unwrap_or_else(|| {
            snap.identity
                .as_ref()
                .is_some_and(|i| i.trust_unverified_email)
        }),
    })
}

fn kill_switch_settings(
    raw: RawKillSwitch,
    env: EnvLookup<'_>,
) -> Result<KillSwitchSettings, ConfigError> {
    let field = |f: &str, m: String| ConfigError(format!("settings.killSwitch.{f}: {m}"));
    if raw.cluster.is_empty() {
        return Err(field(
            "cluster",
            "must name the Envoy cluster of the kill-list server".into(),
        ));
    }
    let token =
        token_of(raw.token, raw.token_env, env, "gateway token").map_err(|(f, m)| field(f, m))?;
    let url = service_url(&raw.url, raw.allow_insecure_in_cluster, "the list")
        .map_err(|m| field("url", m))?;
    let interval_secs = raw.interval_seconds.unwrap_or(DEFAULT_KILL_INTERVAL_SECS);
    if interval_secs == 0 || interval_secs > 3600 {
        return Err(field("intervalSeconds", "must be 1..=3600".into()));
    }
    let key = halo_policy::keys::public_key_from_pem(&raw.pubkey).map_err(|e| e.to_string());
    Ok(KillSwitchSettings {
        cluster: raw.cluster,
        authority: raw.authority.unwrap_or(url.authority),
        path: url.path,
        token,
        key,
        interval_secs,
    })
}

/// The token given inline or through a VM environment variable (never both), required:
/// `Err((field, message))`.
fn token_of(
    token: Option<String>,
    token_env: Option<String>,
    env: EnvLookup<'_>,
    what: &str,
) -> Result<String, (&'static str, String)> {
    let token = match (token, token_env) {
        (Some(_), Some(_)) => {
            return Err(("tokenEnv", "give token or tokenEnv, not both".into()));
        }
        (Some(token), None) => token,
        (None, Some(name)) => env(&name).filter(|t| !t.is_empty()).ok_or_else(|| {
            (
                "tokenEnv",
                format!(
                    "{name} is not set in the plugin VM's environment (pass it with vm_config.environment_variables.host_env_keys)"
                ),
            )
        })?,
        (None, None) => String::new(),
    };
    if token.is_empty() {
        return Err(("token", format!("the {what} is required")));
    }
    Ok(token)
}

/// A service URL the filter sends a token to: https, loopback, or plain http only when
/// the operator says the service is in-cluster (`carried` names what else would cross
/// the network in clear).
fn service_url(text: &str, allow_insecure_in_cluster: bool, carried: &str) -> Result<Url, String> {
    let url = parse_url(text)?;
    if !url.https && !is_loopback_host(&url.host) && !allow_insecure_in_cluster {
        return Err(format!(
            "plain http to {:?} is refused (the token and {carried} would cross the network in clear); use https, or set allowInsecureInCluster for an in-cluster service",
            url.host
        ));
    }
    Ok(url)
}

fn shadow_settings(raw: RawShadow, env: EnvLookup<'_>) -> Result<ShadowSettings, ConfigError> {
    let field = |(f, m): (&str, String)| ConfigError(format!("settings.shadow.{f}: {m}"));
    if !is_token(&raw.cluster) {
        return Err(field((
            "cluster",
            "must name the Envoy cluster of the mirror service".into(),
        )));
    }
    let token = token_of(raw.token, raw.token_env, env, "shadow token").map_err(field)?;
    let url = service_url(
        &raw.url,
        raw.allow_insecure_in_cluster,
        "the mirrored requests",
    )
    .map_err(|m| field(("url", m)))?;
    let max_bytes = raw.max_bytes.unwrap_or(DEFAULT_SHADOW_MAX_BYTES);
    if max_bytes == 0 {
        return Err(field(("maxBytes", "must be at least 1".into())));
    }
    let timeout_ms = raw.timeout_ms.unwrap_or(DEFAULT_SHADOW_TIMEOUT_MS);
    if !(1..=60_000).contains(&timeout_ms) {
        return Err(field(("timeoutMs", "must be 1..=60000".into())));
    }
    Ok(ShadowSettings {
        cluster: raw.cluster,
        authority: raw.authority.unwrap_or(url.authority),
        path: url.path,
        token,
        max_bytes,
        timeout_ms,
    })
}

struct Url {
    https: bool,
    authority: String,
    host: String,
    path: String,
}

/// The kill-list URL, read by the workspace's one URL parser
/// ([`halo_policy::validate::parse_http_url`]), so the filter takes what policy
/// validation and the Envoy configuration emitters take.
fn parse_url(text: &str) -> Result<Url, String> {
    let u = halo_policy::validate::parse_http_url(text)
        .map_err(|why| format!("{text:?} is not an http(s) URL: it {why}"))?;
    if u.userinfo {
        return Err("the URL needs a host (and no user info)".into());
    }
    Ok(Url {
        https: u.https,
        authority: u.authority.to_string(),
        host: u.host.to_string(),
        path: if u.path.is_empty() {
            "/".to_string()
        } else {
            u.path.to_string()
        },
    })
}

fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// An HTTP header name (RFC 9110 token).
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}
