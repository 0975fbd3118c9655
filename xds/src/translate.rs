//! The translator: compiled snapshot + gateway settings -> a [`Plan`] -> Envoy resources.
//!
//! Two pure steps. [`plan`] decides everything (names, failover orders, timeouts, TLS,
//! breaker, retries) in plain serializable types; its JSON is what the golden files hold,
//! so a reviewer reads a diff of decisions rather than of protobuf bytes. [`crate::envoy::resources`]
//! maps a plan one-to-one onto Envoy's types.
//!
//! The resource graph (see docs/ARCHITECTURE.md, section xDS):
//! - one Listener -> HttpConnectionManager -> RDS `settings.route_config_name`;
//! - one RouteConfiguration: every path goes to the cluster named by the `x-halo-route`
//!   header (set by the filter), with the retry policy that walks the failover order;
//! - one aggregate Cluster per (route, alias, first pick) listing sub-clusters in failover
//!   order, named by [`halo_policy::cluster_names::route_aggregates`] (plus per call class
//!   aggregates that skip targets the class cannot use);
//! - one one-endpoint Cluster per target (outlier detection = the breaker), named by
//!   [`halo_policy::cluster_names::target_cluster`], its endpoint metadata carrying the
//!   target's upstream, kind and model id under `halo` for per-attempt work.
//!
//! Still to come with the filter (issue 3): the jwt_authn and halo filters in the HCM and
//! the filter's configuration (ECDS).

use std::collections::BTreeMap;
use std::net::IpAddr;

use halo_envoy_config::credentials::{self, Hosts, TargetCredential};
use halo_envoy_config::tls::UpstreamTls;
use halo_policy::cluster_names::{route_aggregates, scoped_routes, target_cluster};
use halo_policy::{Snapshot, Target};
use serde::{Deserialize, Serialize};

/// Gateway settings the policy does not carry: where Envoy listens and how it retries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct GatewaySettings {
    pub listener_name: String,
    pub listen_address: String,
    pub listen_port: u16,
    pub route_config_name: String,
    /// The request header the filter sets to an aggregate cluster name.
    pub route_header: String,
    /// Attempts per request, the first included (so retries = max_attempts - 1).
    pub max_attempts: u32,
    pub breaker: Breaker,
    /// Connect timeout of a target without timeoutSeconds.
    pub default_connect_timeout_seconds: u32,
    /// A stream with no bytes either way for this long is reset; streams have no total
    /// time limit (route timeout 0).
    pub stream_idle_timeout_seconds: u32,
    /// CA bundle that verifies https upstreams.
    pub upstream_ca_file: String,
    /// The filter as Envoy sees it: halo_filter.wasm, or the native build
    /// libhalo_filter_native.so (a `.so` renders an Envoy dynamic module).
    pub wasm_path: String,
    /// The filter's `settings` object (identity, forwardAuth, maxBodyBytes, killSwitch...),
    /// delivered with the snapshot by ECDS.
    pub filter_settings: serde_json::Value,
    /// The issuer's JWKS URL; default `<issuer>/.well-known/jwks.json`.
    pub jwks_uri: Option<String>,
    /// Put the halo filter in the chain (default). Off only to test the routing layer on
    /// its own, with the route header sent by the test client: never in a gateway.
    pub halo_filter: bool,
    /// halo-server's kill-list URL (GET /api/v1/gateway/killswitch): the filter's poll,
    /// the fallback to the kill list pushed in its configuration. Gets the
    /// `halo-killswitch` cluster; `filterSettings.killSwitch.{cluster,url}` are filled in.
    pub killswitch_url: Option<String>,
    /// Exact hosts besides AWS's that may receive the gateway's SigV4 signature
    /// (halo-proxy's `signHosts`).
    pub sign_hosts: Vec<String>,
    /// Exact hosts besides the providers' own https domains that may receive a key
    /// (halo-proxy's `upstreamHosts`).
    pub upstream_hosts: Vec<String>,
    /// The SDS file halo-credentials writes beside Envoy (`Bearer <token>`): every vertex
    /// upstream's attempts get it as `Authorization`. Envoy reads it, not this server.
    pub vertex_token_sds: Option<String>,
    /// The secret's name in that file; default `halo-vertex-token`.
    pub vertex_token_secret: Option<String>,
    /// Per policy upstream name, headers set on its attempts (halo-proxy's
    /// `upstreamHeaders`); `${VAR}` is read from Envoy's environment.
    pub upstream_headers: BTreeMap<String, BTreeMap<String, String>>,
}

impl GatewaySettings {
    /// The credential settings as halo-envoy-config's renderers take them.
    pub fn hosts(&self) -> Hosts {
        Hosts {
            sign_hosts: self.sign_hosts.clone(),
            upstream_hosts: self.upstream_hosts.clone(),
            vertex_token_sds: self.vertex_token_sds.clone(),
            vertex_token_secret: self.vertex_token_secret.clone(),
            upstream_headers: self.upstream_headers.clone(),
        }
    }
}

impl Default for GatewaySettings {
    fn default() -> Self {
        let failover = halo_envoy_config::bootstrap::Failover::default();
        GatewaySettings {
            listener_name: "halo".into(),
            listen_address: "0.0.0.0".into(),
            listen_port: 8080,
            route_config_name: "halo".into(),
            route_header: halo_envoy_config::names::ROUTE_HEADER.into(),
            max_attempts: failover.max_attempts,
            breaker: Breaker::default(),
            default_connect_timeout_seconds: failover.default_connect_timeout_seconds,
            stream_idle_timeout_seconds: halo_envoy_config::bootstrap::STREAM_IDLE_TIMEOUT_SECONDS,
            upstream_ca_file: halo_envoy_config::tls::DEFAULT_UPSTREAM_CA_FILE.into(),
            wasm_path: "/usr/local/lib/halo/halo_filter.wasm".into(),
            filter_settings: serde_json::json!({}),
            jwks_uri: None,
            halo_filter: true,
            killswitch_url: None,
            sign_hosts: Vec::new(),
            upstream_hosts: Vec::new(),
            vertex_token_sds: None,
            vertex_token_secret: None,
            upstream_headers: BTreeMap::new(),
        }
    }
}

/// The per-target breaker, as Envoy outlier detection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Breaker {
    /// Consecutive 5xx (connect failures count) that open it.
    pub consecutive_failures: u32,
    /// How long it stays open before a request may probe the target again.
    pub open_seconds: u32,
}

impl Default for Breaker {
    fn default() -> Self {
        let failover = halo_envoy_config::bootstrap::Failover::default();
        Breaker {
            consecutive_failures: failover.breaker_failures,
            open_seconds: failover.breaker_open_seconds,
        }
    }
}

/// Every decision of a translation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub listener: ListenerPlan,
    pub route: RoutePlan,
    /// Sorted by name.
    pub aggregates: Vec<AggregatePlan>,
    /// Sorted by name.
    pub targets: Vec<TargetPlan>,
    /// The wasm path of the filter's per-attempt stage, an upstream HTTP filter on every
    /// aggregate (each attempt gets its target's model id); with the halo filter only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt_stage: Option<String>,
    /// The keys' secrets (where each is read: env or file, never a value), served over
    /// ADS to the credential filters; sorted by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<serde_json::Value>,
    /// Credentials configured but not used, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerPlan {
    pub name: String,
    /// jwt_authn's configuration (halo-envoy-config's builder, Envoy JSON), when the
    /// policy names an issuer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwt_authn: Option<serde_json::Value>,
    /// The JWKS cluster jwt_authn fetches keys through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwks: Option<ServicePlan>,
    /// The kill-list server's cluster (the filter's poll).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub killswitch: Option<ServicePlan>,
    /// Name of the ECDS resource carrying the halo filter's configuration; `None`: no
    /// halo filter (routing-layer tests only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter_config_name: Option<String>,
    pub address: String,
    pub port: u16,
    pub route_config_name: String,
    pub stream_idle_timeout_seconds: u32,
    /// Room for a whole model call (halo-envoy-config's `listener_buffer_limit`).
    pub per_connection_buffer_limit_bytes: u32,
    /// The access log (halo-envoy-config's `access_log`, Envoy JSON).
    pub access_log: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePlan {
    pub cluster: String,
    pub uri: String,
    pub host: String,
    pub port: u16,
    /// https: TLS, verified against upstreamCaFile (SNI + DNS SAN for a host name, an IP
    /// SAN for an IP literal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutePlan {
    pub name: String,
    pub cluster_header: String,
    /// Set Host to the chosen target's host name (providers route on it).
    pub auto_host_rewrite: bool,
    /// Headers that are the gateway's business only, removed before the upstream.
    pub request_headers_to_remove: Vec<String>,
    pub retry_on: String,
    pub retriable_status_codes: Vec<u32>,
    pub num_retries: u32,
    pub idle_timeout_seconds: u32,
    /// Per aggregate whose first pick has `timeoutSeconds`: that bound on each attempt's
    /// wait for response headers (a route of its own; halo-envoy-config's `model_routes`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub header_timeouts: BTreeMap<String, u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AggregatePlan {
    pub name: String,
    pub alias: String,
    /// Index in the route as written of the target tried first.
    pub first_pick: usize,
    /// Sub-cluster names in failover order.
    pub clusters: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetPlan {
    pub name: String,
    pub upstream: String,
    /// The upstream's kind as written in policy.
    pub kind: String,
    pub model: String,
    pub host: String,
    pub port: u16,
    /// An IP literal is a static endpoint; a host name is resolved by Envoy (logical DNS).
    pub resolve: bool,
    /// How an https upstream's certificate is verified (CA, SAN, SNI).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
    pub connect_timeout_seconds: u32,
    pub breaker: Breaker,
    /// The endpoint's `filter_metadata.halo` (halo-envoy-config's `target_metadata`),
    /// sorted by key.
    pub metadata: Vec<(String, String)>,
    /// What this target's attempts get after the per-attempt stage.
    #[serde(skip)]
    pub credential: TargetCredential,
    /// Its upstream's `upstreamHeaders` (name, value in Envoy's formatter syntax: an
    /// environment variable's name, never its value).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
    /// [`Self::credential`] in words, for the golden files.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub credential_summary: String,
}

/// Why a snapshot cannot be translated.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TranslateError {
    #[error("route {alias:?} names upstream {upstream:?}, which is not in the snapshot")]
    UnknownUpstream { alias: String, upstream: String },
    #[error("upstream {upstream:?}: url {url:?} is not an absolute http(s) URL with a host")]
    BadUrl { upstream: String, url: String },
    #[error("settings: maxAttempts must be at least 1")]
    NoAttempts,
    #[error("settings: {0} {1:?} is not an absolute http(s) URL with a host")]
    BadServiceUrl(&'static str, String),
    #[error("settings: {0}")]
    Credentials(#[from] credentials::SettingsError),
}

fn service(
    what: &'static str,
    cluster: &str,
    uri: String,
    trusted_ca: &str,
) -> Result<ServicePlan, TranslateError> {
    let ep = halo_envoy_config::bootstrap::endpoint(what, &uri)
        .map_err(|_| TranslateError::BadServiceUrl(what, uri.clone()))?;
    Ok(ServicePlan {
        cluster: cluster.into(),
        tls: ep.tls.then(|| UpstreamTls::for_host(&ep.host, trusted_ca)),
        uri,
        host: ep.host,
        port: ep.port,
    })
}

/// The ECDS resource name of the halo filter's configuration.
pub const FILTER_CONFIG_NAME: &str = halo_envoy_config::names::FILTER_NAME;

/// Decide every resource for `snap` under `settings`.
pub fn plan(snap: &Snapshot, settings: &GatewaySettings) -> Result<Plan, TranslateError> {
    if settings.max_attempts == 0 {
        return Err(TranslateError::NoAttempts);
    }
    let hosts = settings.hosts();
    let headers = hosts.rendered_headers(|u| snap.upstreams.contains_key(u))?;
    let mut targets: BTreeMap<String, TargetPlan> = BTreeMap::new();
    let mut timeouts: BTreeMap<String, u32> = BTreeMap::new();
    let mut header_timeouts: BTreeMap<String, u32> = BTreeMap::new();
    let mut aggregates: BTreeMap<String, AggregatePlan> = BTreeMap::new();

    for (scope, routes) in scoped_routes(snap) {
        for (alias, route) in routes {
            for target in route {
                let name = target_cluster(target);
                if let Some(secs) = target.timeout_seconds {
                    timeouts.insert(name.clone(), secs);
                }
                if let std::collections::btree_map::Entry::Vacant(slot) = targets.entry(name) {
                    let name = slot.key().clone();
                    let mut t = plan_target(snap, settings, alias, target, name)?;
                    t.headers = headers.get(&target.upstream).cloned().unwrap_or_default();
                    slot.insert(t);
                }
            }
            for (name, first_pick, clusters) in route_aggregates(snap, scope, alias, route) {
                if let Some(secs) = clusters.first().and_then(|c| timeouts.get(c)) {
                    header_timeouts.insert(name.clone(), *secs);
                }
                aggregates.insert(
                    name.clone(),
                    AggregatePlan {
                        name,
                        alias: alias.clone(),
                        first_pick,
                        clusters,
                    },
                );
            }
        }
    }

    let mut secrets: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let mut warnings = Vec::new();
    let used: std::collections::BTreeSet<&str> =
        targets.values().map(|t| t.upstream.as_str()).collect();
    for name in used {
        let Some(u) = snap.upstreams.get(name) else {
            continue;
        };
        let (cred, warning) = credentials::target_credential(name, u, &hosts);
        warnings.extend(warning);
        if let TargetCredential::Key { secret, source, .. } = &cred {
            secrets.insert(secret.clone(), credentials::secret(secret, source));
        }
    }
    let secrets: Vec<serde_json::Value> = secrets.into_values().collect();

    let identity = snap.identity.as_ref().filter(|i| !i.issuer.is_empty());
    let jwks = match identity {
        None => None,
        Some(id) => {
            let uri = settings.jwks_uri.clone().unwrap_or_else(|| {
                format!("{}/.well-known/jwks.json", id.issuer.trim_end_matches('/'))
            });
            Some(service(
                "jwksUri",
                halo_envoy_config::names::JWKS_CLUSTER,
                uri,
                &settings.upstream_ca_file,
            )?)
        }
    };
    let killswitch = settings
        .killswitch_url
        .clone()
        .map(|u| {
            service(
                "killswitchUrl",
                halo_envoy_config::names::KILLSWITCH_CLUSTER,
                u,
                &settings.upstream_ca_file,
            )
        })
        .transpose()?;
    let jwt_authn = jwks
        .as_ref()
        .and_then(|j| halo_envoy_config::bootstrap::jwt_authn(snap, &j.uri, &settings.wasm_path));

    Ok(Plan {
        listener: ListenerPlan {
            jwt_authn,
            jwks,
            killswitch,
            filter_config_name: settings.halo_filter.then(|| FILTER_CONFIG_NAME.into()),
            name: settings.listener_name.clone(),
            address: settings.listen_address.clone(),
            port: settings.listen_port,
            route_config_name: settings.route_config_name.clone(),
            stream_idle_timeout_seconds: settings.stream_idle_timeout_seconds,
            per_connection_buffer_limit_bytes: halo_envoy_config::bootstrap::listener_buffer_limit(
                &settings.filter_settings,
            ),
            access_log: halo_envoy_config::bootstrap::access_log(),
        },
        route: RoutePlan {
            name: settings.route_config_name.clone(),
            cluster_header: settings.route_header.clone(),
            auto_host_rewrite: true,
            request_headers_to_remove: vec![settings.route_header.clone()],
            retry_on: halo_envoy_config::bootstrap::RETRY_ON.into(),
            retriable_status_codes: halo_envoy_config::bootstrap::RETRIABLE_STATUS_CODES.to_vec(),
            num_retries: settings.max_attempts - 1,
            idle_timeout_seconds: settings.stream_idle_timeout_seconds,
            header_timeouts,
        },
        aggregates: aggregates.into_values().collect(),
        targets: targets.into_values().collect(),
        attempt_stage: settings.halo_filter.then(|| settings.wasm_path.clone()),
        secrets,
        warnings,
    })
}

fn plan_target(
    snap: &Snapshot,
    settings: &GatewaySettings,
    alias: &str,
    target: &Target,
    name: String,
) -> Result<TargetPlan, TranslateError> {
    let upstream =
        snap.upstreams
            .get(&target.upstream)
            .ok_or_else(|| TranslateError::UnknownUpstream {
                alias: alias.to_string(),
                upstream: target.upstream.clone(),
            })?;
    let ep =
        halo_envoy_config::bootstrap::endpoint(&target.upstream, &upstream.url).map_err(|_| {
            TranslateError::BadUrl {
                upstream: target.upstream.clone(),
                url: upstream.url.clone(),
            }
        })?;
    let (https, host, port) = (ep.tls, ep.host, ep.port);
    let is_ip = host.parse::<IpAddr>().is_ok();
    let metadata = halo_envoy_config::bootstrap::target_metadata(
        &name,
        &target.upstream,
        Some(upstream),
        &target.model,
        &host,
    )
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let (credential, _) =
        credentials::target_credential(&target.upstream, upstream, &settings.hosts());
    Ok(TargetPlan {
        credential_summary: summary(&credential),
        credential,
        headers: Vec::new(),
        metadata,
        name,
        upstream: target.upstream.clone(),
        kind: upstream.kind.as_str().to_string(),
        model: target.model.clone(),
        tls: https.then(|| UpstreamTls::for_host(&host, &settings.upstream_ca_file)),
        resolve: !is_ip,
        host,
        port,
        connect_timeout_seconds: target
            .timeout_seconds
            .unwrap_or(settings.default_connect_timeout_seconds),
        breaker: settings.breaker.clone(),
    })
}

fn summary(c: &TargetCredential) -> String {
    match c {
        TargetCredential::None => String::new(),
        TargetCredential::SigV4 { region } => format!("sigv4 {region}"),
        TargetCredential::RefuseSigning { host } => {
            format!("refused: {host} may not be signed for")
        }
        TargetCredential::Key { header, secret, .. } => format!("{header} from secret {secret}"),
        TargetCredential::Token { secret, sds_path } => {
            format!("Authorization from secret {secret} in SDS file {sds_path}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use halo_policy::types::{Upstream, UpstreamKind};

    fn t(upstream: &str, model: &str, priority: u32) -> Target {
        Target {
            upstream: upstream.into(),
            model: model.into(),
            weight: None,
            priority,
            timeout_seconds: None,
        }
    }

    #[test]
    fn failover_order_is_pick_then_its_tier_then_later_tiers() {
        let route = vec![
            t("a", "p1", 1),
            t("a", "p0x", 0),
            t("a", "p0y", 0),
            t("a", "p2", 2),
        ];
        let orders = halo_policy::cluster_names::failover_orders(&route, "x");
        let models = |i: usize| -> Vec<String> {
            orders[i]
                .1
                .iter()
                .map(|n| n.split('~').nth(2).unwrap_or_default().to_string())
                .collect()
        };
        assert_eq!(models(2), ["p0y", "p0x", "p1", "p2"]);
        assert_eq!(models(1), ["p0x", "p0y", "p1", "p2"]);
        // A later-tier first pick leaves the earlier tier out.
        assert_eq!(models(0), ["p1", "p2"]);
        assert_eq!(models(3), ["p2"]);
    }

    #[test]
    fn unknown_upstreams_and_bad_urls_are_errors() {
        let mut snap = Snapshot {
            schema: 1,
            org: "o".into(),
            identity: None,
            protocols: BTreeMap::new(),
            upstreams: BTreeMap::new(),
            models: BTreeMap::from([("m".to_string(), vec![t("nope", "x", 0)])]),
            rings: vec![],
            experiments: vec![],
            toggles: vec![],
            prices: Default::default(),
        };
        let s = GatewaySettings::default();
        assert!(matches!(
            plan(&snap, &s),
            Err(TranslateError::UnknownUpstream { .. })
        ));
        snap.upstreams.insert(
            "nope".into(),
            Upstream {
                url: "ftp://x".into(),
                kind: UpstreamKind::Anthropic,
                region: None,
                project: None,
                api_version: None,
                credential: None,
            },
        );
        assert!(matches!(
            plan(&snap, &s),
            Err(TranslateError::BadUrl { .. })
        ));
        if let Some(u) = snap.upstreams.get_mut("nope") {
            u.url = "http://[::1]:9/v1".into();
        }
        let p = plan(&snap, &s).expect("plans");
        assert_eq!((p.targets[0].host.as_str(), p.targets[0].port), ("::1", 9));
        assert!(!p.targets[0].resolve && p.targets[0].tls.is_none());
        let zero = GatewaySettings {
            max_attempts: 0,
            ..GatewaySettings::default()
        };
        assert_eq!(plan(&snap, &zero), Err(TranslateError::NoAttempts));
    }

    #[test]
    fn vertex_token_and_upstream_headers_are_planned_per_target() {
        let mut snap = Snapshot {
            schema: 1,
            org: "o".into(),
            identity: None,
            protocols: BTreeMap::new(),
            upstreams: BTreeMap::new(),
            models: BTreeMap::from([("m".to_string(), vec![t("v", "claude", 0)])]),
            rings: vec![],
            experiments: vec![],
            toggles: vec![],
            prices: Default::default(),
        };
        snap.upstreams.insert(
            "v".into(),
            Upstream {
                url: "https://us-east5-aiplatform.googleapis.com".into(),
                kind: UpstreamKind::Vertex,
                region: Some("us-east5".into()),
                project: Some("p".into()),
                api_version: None,
                credential: None,
            },
        );
        let mut s = GatewaySettings {
            vertex_token_sds: Some("/run/halo/sds/vertex.json".into()),
            upstream_headers: BTreeMap::from([(
                "v".to_string(),
                BTreeMap::from([("x-goog-user-project".to_string(), "${PROJ}".to_string())]),
            )]),
            ..GatewaySettings::default()
        };
        let p = plan(&snap, &s).expect("plans");
        assert_eq!(
            p.targets[0].credential_summary,
            "Authorization from secret halo-vertex-token in SDS file /run/halo/sds/vertex.json"
        );
        assert_eq!(
            p.targets[0].headers,
            [(
                "x-goog-user-project".to_string(),
                "%ENVIRONMENT(PROJ)%".to_string()
            )]
        );
        assert!(p.secrets.is_empty(), "Envoy reads the token file itself");
        s.upstream_headers
            .insert("nope".into(), BTreeMap::from([("x".into(), "y".into())]));
        assert!(matches!(
            plan(&snap, &s),
            Err(TranslateError::Credentials(_))
        ));
    }
}
