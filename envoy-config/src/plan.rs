//! The gateway plan: compiled snapshot + [`GatewaySettings`] -> [`Plan`], every decision
//! about a gateway's Envoy resources, made once, in plain serializable types.
//!
//! Two emitters print a plan and decide nothing: the standalone bootstrap as Envoy JSON
//! ([`crate::bootstrap::standalone`]) and halo-xds's `envoy` module as protobuf resources.
//! The plan's JSON is what the golden file holds (`envoy-config/tests/golden/`), so a
//! review reads a diff of decisions rather than of Envoy configuration.
//!
//! What the plan decides (docs/design/gateway.md):
//! - the listener: address, buffer limit ([`listener_buffer_limit`]), stream idle timeout,
//!   access logs ([`access_logs`]), jwt_authn and the JWKS cluster, the halo filter and its
//!   settings (the kill-list poll's cluster and the breakers' settings filled in), the
//!   kill-list cluster, the evidence receiver's cluster (HTTP/2) its OpenTelemetry
//!   access logger sends to;
//! - the route: the cluster header, retries ([`RETRY_ON`]), per-try timeouts per aggregate;
//! - one aggregate per (route scope, alias, first pick) listing sub-clusters in failover
//!   order ([`halo_policy::cluster_names::route_aggregates`]);
//! - one one-endpoint cluster per target: DNS or static, upstream TLS
//!   ([`UpstreamTls::for_host`]), connect timeout (no outlier detection: the breakers are
//!   the filter's), the endpoint metadata the per-attempt stage reads
//!   ([`target_metadata`]), its credential;
//! - the operator's warnings.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use halo_policy::cluster_names::{self, EndpointFacts};
use halo_policy::{Snapshot, Target};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::credentials::{self, AttemptTarget, Hosts, SettingsError, TargetCredential};
use crate::tls::UpstreamTls;
use halo_contract::attempts::{Breaker, RETRIABLE_STATUS_CODES};
use halo_contract::names;

/// Default request body bound of model calls (the filter's default too).
pub use halo_contract::limits::DEFAULT_MAX_BODY_BYTES;

/// The connect timeout of a service cluster (the JWKS, the kill list) and of an aggregate
/// (which connects nothing itself); a target's is its `timeoutSeconds` or
/// [`GatewaySettings::default_connect_timeout_seconds`].
pub const SERVICE_CONNECT_TIMEOUT_SECONDS: u32 = 5;

/// What moves an attempt to the next target (spec: a connect error, a 5xx or a 429).
/// Envoy never retries once response headers went downstream, so a stream that failed
/// mid-body is not retried (invariant 4).
pub const RETRY_ON: &str = "5xx,connect-failure,retriable-status-codes";

/// Gateway settings the policy does not carry: where Envoy listens, how it fails over,
/// what it trusts, the gateway's own credentials. The xDS gateway file
/// (`--xds-gateway-file`, camelCase, strict) decodes into it; the standalone bootstrap's
/// flags fill it ([`crate::bootstrap::Standalone::gateway`]). Every default is written
/// here.
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
    /// time limit (route timeout 0): a model answer streams for as long as it takes, and
    /// providers send keep-alive events (Anthropic's `ping`) far more often. Without it a
    /// provider that accepts and then hangs would hold the client forever.
    pub stream_idle_timeout_seconds: u32,
    /// CA bundle that verifies https upstreams.
    pub upstream_ca_file: String,
    /// The filter as Envoy sees it: halo_filter.wasm, or the native build
    /// libhalo_filter_native.so (a `.so` renders an Envoy dynamic module).
    pub wasm_path: String,
    /// The filter's `settings` object (identity, forwardAuth, maxBodyBytes, killSwitch...).
    pub filter_settings: Value,
    /// The issuer's JWKS URL. Unset, the renderers put in the `jwks_uri` of the issuer's
    /// OIDC discovery document (`halo envoy bootstrap` when it renders, halo-server for
    /// each served issuer); the plan itself does no I/O and falls back to
    /// `<issuer>/.well-known/jwks.json`.
    pub jwks_uri: Option<String>,
    /// Put the halo filter in the chain (default). Off only to test the routing layer on
    /// its own, with the route header sent by the test client: never in a gateway.
    pub halo_filter: bool,
    /// halo-server's kill-list URL (GET /api/v1/gateway/killswitch): the filter's poll.
    /// Gets the [`names::KILLSWITCH_CLUSTER`] cluster; `filterSettings.killSwitch.{cluster,url}`
    /// are filled in.
    pub killswitch_url: Option<String>,
    /// Exact hosts besides AWS's that may receive the gateway's SigV4 signature.
    pub sign_hosts: Vec<String>,
    /// Exact hosts besides the providers' own https domains that may receive a key.
    pub upstream_hosts: Vec<String>,
    /// The SDS file halo-credentials writes beside Envoy (`Bearer <token>`): every vertex
    /// upstream's attempts get it as `Authorization`. Envoy reads it.
    pub vertex_token_sds: Option<String>,
    /// The secret's name in that file; default `halo-vertex-token`.
    pub vertex_token_secret: Option<String>,
    /// Per policy upstream name, headers set on its attempts; `${VAR}` is read from
    /// Envoy's environment.
    pub upstream_headers: BTreeMap<String, BTreeMap<String, String>>,
    /// Where Envoy sends one evidence record per decided model call (halo-server's
    /// gateway receiver, `{url, tokenFile}`): the OpenTelemetry access logger
    /// ([`access_logs`]) and its HTTP/2 service cluster. `None`: no export.
    pub evidence: Option<crate::evidence::Export>,
    /// Edge mode (the spec's deploy mode (a)): an http(s) URL without a path, the existing
    /// gateway (Kong, LiteLLM, an internal LLM gateway) every model call is forwarded to
    /// after the decision, instead of the target's upstream: the client's path, the model
    /// rewritten to the decided target's model id, no translation and no credential of
    /// this gateway's own (the next hop holds the provider keys; `filterSettings.forwardAuth`
    /// keeps the client's Authorization for it to verify). Failover, timeouts and the
    /// breaker stay per target. Unset (default): each target's own upstream.
    pub next_hop: Option<String>,
    /// Where requests go that the policy has no route for (for example `GET /v1/models`,
    /// which the filter otherwise answers itself, or another provider path): an http(s)
    /// URL, its path unused (the client's is forwarded). The caller is identified first,
    /// as for a model call (unauthenticated: 401); the client's credentials are removed
    /// unless `forwardAuth`. Unset (default): such paths are 404.
    pub default_upstream: Option<String>,
    /// The mirror service's URL (halo-server's `POST /mirror` on `--shadow-listen`), where
    /// the filter sends shadow jobs: gets the [`names::SHADOW_CLUSTER`] cluster;
    /// `filterSettings.shadow.{cluster,url}` are filled in (the token and `maxBytes` are
    /// the filter settings' own, as the kill switch's token). Unset: nothing is mirrored.
    pub shadow_url: Option<String>,
    /// Jobs in flight to the mirror service at most (the cluster's circuit breakers:
    /// connections, pending and active requests). One over is not sent, counted by the
    /// filter (`not_sent`) and by Envoy (`upstream_rq_pending_overflow`).
    pub shadow_max_in_flight: u32,
    /// halo-server's budget service (its rate-limit service, `--budget-listen`) and its
    /// token (`{url, tokenFile}`): with a policy that has budgets, Envoy's ratelimit filter
    /// after the halo filter asks it ([`crate::budget`]). Unset with budgets in the policy:
    /// they are not enforced, and the plan warns.
    pub budgets: Option<crate::evidence::Export>,
}

/// Default [`GatewaySettings::shadow_max_in_flight`].
pub const DEFAULT_SHADOW_MAX_IN_FLIGHT: u32 = 64;

impl GatewaySettings {
    /// The credential settings as the credential chain takes them.
    pub fn hosts(&self) -> Hosts {
        Hosts {
            sign_hosts: self.sign_hosts.clone(),
            upstream_hosts: self.upstream_hosts.clone(),
            vertex_token_sds: self.vertex_token_sds.clone(),
            vertex_token_secret: self.vertex_token_secret.clone(),
            upstream_headers: self.upstream_headers.clone(),
        }
    }

    /// These settings with `settings` as the filter's settings, the gateway's credential
    /// keys ([`credentials::HOSTS_SETTINGS`]: `halo envoy bootstrap --gateway-settings`
    /// writes them beside the filter's) taken out of it into these settings' fields.
    pub fn with_filter_settings(mut self, mut settings: Value) -> Result<Self, PlanError> {
        let hosts = Hosts::from_settings(&settings)?;
        let Some(m) = settings.as_object_mut() else {
            return Err(PlanError::Settings);
        };
        for key in credentials::HOSTS_SETTINGS {
            m.remove(key);
        }
        self.filter_settings = settings;
        self.sign_hosts = hosts.sign_hosts;
        self.upstream_hosts = hosts.upstream_hosts;
        self.vertex_token_sds = hosts.vertex_token_sds;
        self.vertex_token_secret = hosts.vertex_token_secret;
        self.upstream_headers = hosts.upstream_headers;
        Ok(self)
    }
}

impl Default for GatewaySettings {
    fn default() -> Self {
        GatewaySettings {
            listener_name: "halo".into(),
            listen_address: "0.0.0.0".into(),
            listen_port: 8080,
            route_config_name: "halo".into(),
            route_header: names::ROUTE_HEADER.into(),
            max_attempts: 3,
            breaker: Breaker::default(),
            default_connect_timeout_seconds: 10,
            stream_idle_timeout_seconds: 300,
            upstream_ca_file: crate::tls::DEFAULT_UPSTREAM_CA_FILE.into(),
            wasm_path: "/usr/local/lib/halo/halo_filter.wasm".into(),
            filter_settings: json!({}),
            jwks_uri: None,
            halo_filter: true,
            killswitch_url: None,
            sign_hosts: Vec::new(),
            upstream_hosts: Vec::new(),
            vertex_token_sds: None,
            vertex_token_secret: None,
            upstream_headers: BTreeMap::new(),
            evidence: None,
            next_hop: None,
            default_upstream: None,
            shadow_url: None,
            shadow_max_in_flight: DEFAULT_SHADOW_MAX_IN_FLIGHT,
            budgets: None,
        }
    }
}

/// Every decision of a gateway's configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub listener: ListenerPlan,
    pub route: RoutePlan,
    /// Sorted by name.
    pub aggregates: Vec<AggregatePlan>,
    /// Sorted by name.
    pub targets: Vec<TargetPlan>,
    /// The module path of the filter's per-attempt stage, an upstream HTTP filter on every
    /// aggregate (each attempt gets its target's model id); with the halo filter only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt_stage: Option<String>,
    /// Credentials configured but not used, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Plan {
    /// What each attempt of aggregate `a` gets after the per-attempt stage, in its
    /// failover order: the target's credential and `upstreamHeaders`.
    pub fn attempt_targets(&self, a: &AggregatePlan) -> Vec<AttemptTarget> {
        a.clusters
            .iter()
            .map(|c| {
                let t = self.targets.iter().find(|t| &t.name == c);
                AttemptTarget {
                    cluster: c.clone(),
                    credential: t.map(|t| t.credential.clone()).unwrap_or_default(),
                    headers: t.map(|t| t.headers.clone()).unwrap_or_default(),
                }
            })
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerPlan {
    pub name: String,
    /// jwt_authn's configuration ([`crate::bootstrap::jwt_authn`], Envoy JSON), when the
    /// policy names an issuer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwt_authn: Option<Value>,
    /// The JWKS cluster jwt_authn fetches keys through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwks: Option<ServicePlan>,
    /// The kill-list server's cluster (the filter's poll).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub killswitch: Option<ServicePlan>,
    /// The evidence receiver's cluster (HTTP/2), which the OpenTelemetry access logger
    /// among [`Self::access_logs`] sends to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<ServicePlan>,
    /// The default upstream's cluster ([`GatewaySettings::default_upstream`]): the filter
    /// names it in the route header for a request no policy route takes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_upstream: Option<ServicePlan>,
    /// The mirror service's cluster ([`GatewaySettings::shadow_url`]), the filter's
    /// shadow callouts' destination, bounded by its circuit breakers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ServicePlan>,
    /// The halo filter; `None`: no halo filter (routing-layer tests only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<FilterPlan>,
    /// The budget check after the halo filter, when the policy has budgets and the
    /// settings name the budget service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budgets: Option<BudgetPlan>,
    pub address: String,
    pub port: u16,
    pub route_config_name: String,
    pub stream_idle_timeout_seconds: u32,
    /// Room for a whole model call ([`listener_buffer_limit`]).
    pub per_connection_buffer_limit_bytes: u32,
    /// The HTTP connection manager's access loggers, Envoy JSON ([`access_logs`]). In
    /// the plan's JSON with gRPC metadata values redacted: the evidence logger's carries
    /// the OTLP gateway token.
    #[serde(serialize_with = "redacted_logs")]
    pub access_logs: Vec<Value>,
}

fn redacted_logs<S: serde::Serializer>(logs: &[Value], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(logs.iter().map(crate::evidence::redacted))
}

impl ListenerPlan {
    /// Every service cluster the listener's filters and loggers use, in one order for both
    /// emitters: the JWKS, the kill list, the evidence receiver, the default upstream, the
    /// mirror service, the budget service.
    pub fn services(&self) -> Vec<&ServicePlan> {
        [
            self.jwks.as_ref(),
            self.killswitch.as_ref(),
            self.evidence.as_ref(),
            self.default_upstream.as_ref(),
            self.shadow.as_ref(),
            self.budgets.as_ref().map(|b| &b.service),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The budget check: Envoy's ratelimit filter and the budget service's cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetPlan {
    pub service: ServicePlan,
    /// The ratelimit filter, Envoy JSON ([`crate::budget::ratelimit_filter`]); in the
    /// plan's JSON with its gRPC metadata (the token) redacted.
    #[serde(serialize_with = "redacted_budget_filter")]
    pub filter: Value,
}

fn redacted_budget_filter<S: serde::Serializer>(filter: &Value, s: S) -> Result<S::Ok, S::Error> {
    crate::budget::redacted(filter).serialize(s)
}

/// The halo filter in the listener's chain.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FilterPlan {
    /// Its name in the chain, in both modes ([`names::FILTER_NAME`]; in xDS mode also the
    /// name of its ECDS resource).
    pub name: String,
    /// The module as Envoy sees it (wasm, or the native `.so`).
    pub module: String,
    /// The filter's `settings` (the kill-list poll's cluster and URL filled in). Not in
    /// the golden file: it carries the gateway token.
    #[serde(skip)]
    pub settings: Value,
}

/// A one-endpoint service cluster: the issuer's JWKS, the kill-list server.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePlan {
    pub cluster: String,
    pub uri: String,
    pub host: String,
    pub port: u16,
    /// A host name is resolved by Envoy (logical DNS); an IP literal is a static endpoint.
    pub resolve: bool,
    pub connect_timeout_seconds: u32,
    /// https: TLS, verified against upstreamCaFile (SNI + DNS SAN for a host name, an IP
    /// SAN for an IP literal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
    /// Spoken over HTTP/2 (a gRPC service: the evidence receiver); HTTP/1.1 otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub http2: bool,
    /// Requests in flight at most (circuit breakers: as many connections, pending and
    /// active requests; no retries); `None`: Envoy's defaults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
}

impl ServicePlan {
    /// The service cluster `cluster` for `uri` (`what` names the setting in errors),
    /// verified against `trusted_ca` when https.
    pub fn new(
        what: &str,
        cluster: &str,
        uri: &str,
        trusted_ca: &str,
    ) -> Result<ServicePlan, PlanError> {
        let ep = endpoint(what, uri)?;
        Ok(ServicePlan {
            cluster: cluster.into(),
            tls: ep.tls.then(|| UpstreamTls::for_host(&ep.host, trusted_ca)),
            uri: uri.into(),
            resolve: ep.host.parse::<IpAddr>().is_err(),
            connect_timeout_seconds: SERVICE_CONNECT_TIMEOUT_SECONDS,
            host: ep.host,
            port: ep.port,
            http2: false,
            max_in_flight: None,
        })
    }

    /// This service as a gRPC one: HTTP/2, and ALPN h2 when TLS.
    pub fn grpc(mut self) -> ServicePlan {
        self.http2 = true;
        if let Some(tls) = &mut self.tls {
            tls.alpn = crate::tls::ALPN_H2.to_string();
        }
        self
    }
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
    /// The aggregates whose route differs from the catch-all's, each a route of its own
    /// matched on the aggregate's name in the route header, before the catch-all route
    /// ([`BY_ROUTE_HEADER`]): see [`AggregateRoute`].
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub aggregate_routes: BTreeMap<String, AggregateRoute>,
}

/// How one aggregate's route differs from the catch-all's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AggregateRoute {
    /// The first pick's `timeoutSeconds`: the bound on each attempt's wait for response
    /// headers. A target's `timeoutSeconds` bounds connect (its cluster's) and the wait
    /// for headers (this per-try timeout): a primary that accepts and hangs is retried on
    /// the next target. Envoy ignores a per-try timeout once the response started
    /// downstream, so a started stream is never cut (seen in Envoy 1.40,
    /// `e2e/tests/timeouts.rs`). Envoy takes it per route, so every attempt of the request
    /// gets the first pick's bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_try_timeout_seconds: Option<u32>,
    /// 0 for an aggregate of one target: there is nothing to fail over to, and a retried
    /// model call is a duplicated bill (spec: "a single-target route is not retried").
    pub num_retries: u32,
}

impl RoutePlan {
    /// The model route under `settings`, with no route of any aggregate's own.
    pub fn new(settings: &GatewaySettings) -> RoutePlan {
        RoutePlan {
            name: settings.route_config_name.clone(),
            cluster_header: settings.route_header.clone(),
            auto_host_rewrite: true,
            request_headers_to_remove: vec![settings.route_header.clone()],
            retry_on: RETRY_ON.into(),
            retriable_status_codes: RETRIABLE_STATUS_CODES.to_vec(),
            num_retries: settings.max_attempts.saturating_sub(1),
            idle_timeout_seconds: settings.stream_idle_timeout_seconds,
            aggregate_routes: BTreeMap::new(),
        }
    }
}

/// The name of the model route that takes its cluster from the route header (the routes
/// before it are named after the aggregate they serve).
pub const BY_ROUTE_HEADER: &str = "by-route-header";

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
    /// An IP literal is a static endpoint; a host name is resolved by Envoy (logical DNS:
    /// one endpoint per cluster, connections kept across DNS answers).
    pub resolve: bool,
    /// How an https upstream's certificate is verified (CA, SAN, SNI).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
    pub connect_timeout_seconds: u32,
    /// The endpoint's `filter_metadata.halo` ([`target_metadata`]), sorted by key.
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

/// Why a gateway cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("route {alias:?} names upstream {upstream:?}, which is not in the snapshot")]
    UnknownUpstream { alias: String, upstream: String },
    #[error("{what}: {url:?} is not an absolute http(s) URL with a host")]
    BadUrl { what: String, url: String },
    #[error("settings: maxAttempts must be at least 1")]
    NoAttempts,
    #[error("settings must be a JSON object")]
    Settings,
    #[error("settings: {0}")]
    Credentials(#[from] SettingsError),
    #[error("settings: evidence has no token (its tokenFile was not read)")]
    EvidenceToken,
    #[error("settings: budgets has no token (its tokenFile was not read)")]
    BudgetToken,
}

/// A parsed http(s) URL: what a cluster needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub path: String,
}

/// Parse `url` (http or https, any case; host, optional port and path) with the
/// workspace's one URL parser, [`halo_policy::validate::parse_http_url`]; user info is
/// refused (Envoy would send it nowhere). `what` names the URL in the error.
pub fn endpoint(what: &str, url: &str) -> Result<Endpoint, PlanError> {
    let bad = || PlanError::BadUrl {
        what: what.to_string(),
        url: url.to_string(),
    };
    let u = halo_policy::validate::parse_http_url(url).map_err(|_| bad())?;
    if u.userinfo {
        return Err(bad());
    }
    Ok(Endpoint {
        tls: u.https,
        host: u.host.to_string(),
        port: u.port_or_default(),
        path: if u.path.is_empty() {
            "/".to_string()
        } else {
            u.path.to_string()
        },
    })
}

/// The listener's `per_connection_buffer_limit_bytes` for the filter `settings`: room for
/// a whole model call plus 1 MiB, so the filter, which holds the body to decide, answers
/// its JSON 413 `request_too_large` above `maxBodyBytes` before Envoy's own (plain-text)
/// limit is reached. Envoy's default (1 MiB) refused long conversations. The router's
/// retry buffer takes the same limit, so a large body can still fail over.
pub fn listener_buffer_limit(settings: &Value) -> u32 {
    let max_body = settings
        .get("maxBodyBytes")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_MAX_BODY_BYTES);
    u32::try_from(max_body.saturating_add(1024 * 1024)).unwrap_or(u32::MAX)
}

/// The model listener's access loggers, both modes: the one place that decides them.
///
/// The request log: one JSON line per request on Envoy's standard output. What was decided
/// and how it went: the time, the ring, the experiment and variant, the aggregate cluster
/// (`<alias>-<first pick>`, prefixed by the experiment or toggle scope; see
/// [`halo_policy::cluster_names`]), the upstream address of the last attempt, the status
/// and Envoy's response flags, the attempts, the total duration and the time to the
/// response's first byte (ms). Never a body, a header value other than the filter's own
/// stamps, a query string, the path, or a user id (invariant 6): the filter's `x-halo-user`
/// stamp is not among the fields.
///
/// With [`GatewaySettings::evidence`], the evidence record: Envoy's OpenTelemetry access
/// logger ([`crate::evidence::access_log`]) to the evidence cluster.
pub fn access_logs(settings: &GatewaySettings) -> Vec<Value> {
    let mut logs = vec![json!({
        "name": "envoy.access_loggers.stdout",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
            "log_format": {"json_format": {
                "time": "%START_TIME%",
                "log": "halo.request",
                "ring": "%REQ(x-halo-ring)%",
                "experiment": "%REQ(x-halo-experiment)%",
                "variant": "%REQ(x-halo-variant)%",
                "route": "%UPSTREAM_CLUSTER%",
                "upstream": "%UPSTREAM_HOST%",
                "method": "%REQ(:METHOD)%",
                "status": "%RESPONSE_CODE%",
                "flags": "%RESPONSE_FLAGS%",
                "attempts": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
                "durationMs": "%DURATION%",
                "firstByteMs": "%RESPONSE_DURATION%",
            }},
        },
    })];
    logs.extend(settings.evidence.iter().map(crate::evidence::access_log));
    logs
}

/// A target endpoint's `filter_metadata.halo`, sorted by key: what the per-attempt stage
/// and the credential chain read (`target`: the target's cluster name, the marker the
/// credential filters match; `model`, `kind`, `upstream`, `host`; and the upstream
/// settings a translation reads: `region`, `project`, `apiVersion`, when set; and
/// [`names::ENDPOINT_FACTS_KEY`], all the stage reads as one JSON value, [`EndpointFacts`]).
pub fn target_metadata(
    cluster: &str,
    upstream_name: &str,
    upstream: &halo_policy::types::Upstream,
    model: &str,
    host: &str,
) -> Vec<(String, String)> {
    let kind = upstream.kind.as_str().to_string();
    let mut md = vec![
        // What auto_host_rewrite writes after the upstream filters: the stage sets it
        // first, so a SigV4 signature covers the host the provider receives.
        ("host".to_string(), host.to_string()),
        ("kind".to_string(), kind),
        ("model".to_string(), model.to_string()),
        (names::TARGET_METADATA_KEY.to_string(), cluster.to_string()),
        ("upstream".to_string(), upstream_name.to_string()),
    ];
    for (key, value) in [
        ("apiVersion", &upstream.api_version),
        ("project", &upstream.project),
        ("region", &upstream.region),
    ] {
        if let Some(v) = value {
            md.push((key.to_string(), v.clone()));
        }
    }
    // The same facts in one value: what the per-attempt stage reads, in one call.
    let facts = EndpointFacts::of(upstream, model, host);
    md.push((names::ENDPOINT_FACTS_KEY.to_string(), facts.encode()));
    md.sort();
    md
}

/// The names of every upstream the snapshot can route to: the gateway routes, toggle
/// routes and experiment variant routes name upstreams.
pub fn used_upstreams(snap: &Snapshot) -> BTreeSet<&str> {
    cluster_names::scoped_routes(snap)
        .into_iter()
        .flat_map(|(_, routes)| routes.values())
        .flatten()
        .map(|t| t.upstream.as_str())
        .collect()
}

/// The JWKS URL of `issuer` when neither the settings nor its OIDC discovery document
/// name one: `<issuer>/.well-known/jwks.json`.
pub fn default_jwks_uri(issuer: &str) -> String {
    format!("{}/.well-known/jwks.json", issuer.trim_end_matches('/'))
}

/// Decide every resource for `snap` under `settings`.
pub fn plan(snap: &Snapshot, settings: &GatewaySettings) -> Result<Plan, PlanError> {
    if settings.max_attempts == 0 {
        return Err(PlanError::NoAttempts);
    }
    if !settings.filter_settings.is_object() {
        return Err(PlanError::Settings);
    }
    let hosts = settings.hosts();
    let headers = hosts.rendered_headers(|u| snap.upstreams.contains_key(u))?;
    let mut targets: BTreeMap<String, TargetPlan> = BTreeMap::new();
    let mut timeouts: BTreeMap<String, u32> = BTreeMap::new();
    let mut route = RoutePlan::new(settings);
    let mut aggregates: BTreeMap<String, AggregatePlan> = BTreeMap::new();

    for (scope, routes) in cluster_names::scoped_routes(snap) {
        for (alias, targets_of_route) in routes {
            for target in targets_of_route {
                let name = cluster_names::target_cluster(target);
                if let Some(secs) = target.timeout_seconds {
                    timeouts.insert(name.clone(), secs);
                }
                if let std::collections::btree_map::Entry::Vacant(slot) = targets.entry(name) {
                    let name = slot.key().clone();
                    let mut t = plan_target(snap, settings, &hosts, alias, target, name)?;
                    t.headers = headers.get(&target.upstream).cloned().unwrap_or_default();
                    slot.insert(t);
                }
            }
            for (name, first_pick, mut clusters) in
                cluster_names::route_aggregates(snap, scope, alias, targets_of_route)
            {
                skip_refusing(&mut clusters, &targets);
                let per_try = clusters.first().and_then(|c| timeouts.get(c)).copied();
                let single = clusters.len() == 1;
                if per_try.is_some() || single {
                    route.aggregate_routes.insert(
                        name.clone(),
                        AggregateRoute {
                            per_try_timeout_seconds: per_try,
                            num_retries: if single { 0 } else { route.num_retries },
                        },
                    );
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

    let mut warnings = Vec::new();
    match &settings.next_hop {
        Some(hop) => warnings.extend(
            used_upstreams(snap)
                .into_iter()
                .filter(|u| snap.upstreams.get(*u).is_some_and(|u| u.credential.is_some()))
                .map(|u| {
                    format!(
                        "upstream {u}: its credential is not used in edge mode; the next hop {hop} authenticates to the provider"
                    )
                }),
        ),
        None => {
            for name in used_upstreams(snap) {
                let Some(u) = snap.upstreams.get(name) else {
                    continue;
                };
                warnings.extend(credentials::target_credential(name, u, &hosts).1);
            }
        }
    }

    let jwks = match snap.identity.as_ref().filter(|i| !i.issuer.is_empty()) {
        None => None,
        Some(id) => {
            let uri = settings
                .jwks_uri
                .clone()
                .unwrap_or_else(|| default_jwks_uri(&id.issuer));
            Some(ServicePlan::new(
                "jwksUri",
                names::JWKS_CLUSTER,
                &uri,
                &settings.upstream_ca_file,
            )?)
        }
    };
    let killswitch = settings
        .killswitch_url
        .as_deref()
        .map(|u| {
            ServicePlan::new(
                "killswitchUrl",
                names::KILLSWITCH_CLUSTER,
                u,
                &settings.upstream_ca_file,
            )
        })
        .transpose()?;
    let evidence = match &settings.evidence {
        Some(e) if e.token.is_empty() => return Err(PlanError::EvidenceToken),
        Some(e) => Some(crate::evidence::service(e, &settings.upstream_ca_file)?),
        None => None,
    };
    let default_upstream = settings
        .default_upstream
        .as_deref()
        .map(|u| {
            ServicePlan::new(
                "defaultUpstream",
                names::DEFAULT_UPSTREAM_CLUSTER,
                u,
                &settings.upstream_ca_file,
            )
        })
        .transpose()?;
    let shadow = settings
        .shadow_url
        .as_deref()
        .map(|u| {
            ServicePlan::new(
                "shadowUrl",
                names::SHADOW_CLUSTER,
                u,
                &settings.upstream_ca_file,
            )
        })
        .transpose()?
        .map(|s| ServicePlan {
            max_in_flight: Some(settings.shadow_max_in_flight.max(1)),
            ..s
        });
    // Budgets need the halo filter (its facts are the descriptors) and the service.
    let budgets = match (
        &settings.budgets,
        snap.budgets.is_empty() || !settings.halo_filter,
    ) {
        (_, true) => None,
        (None, false) => {
            warnings.push(
                "the policy has budgets but the settings name no budget service (budgets.url): they are not enforced"
                    .to_string(),
            );
            None
        }
        (Some(b), false) if b.token.is_empty() => return Err(PlanError::BudgetToken),
        (Some(b), false) => Some(BudgetPlan {
            service: crate::budget::service(b, &settings.upstream_ca_file)?,
            filter: crate::budget::ratelimit_filter(crate::budget::Check::of(snap), b),
        }),
    };
    let jwt_authn = jwks
        .as_ref()
        .and_then(|j| crate::bootstrap::jwt_authn(snap, &j.uri, &settings.wasm_path));
    let filter = settings.halo_filter.then(|| {
        let mut filter_settings = settings.filter_settings.clone();
        if let (Some(ks), Some(m)) = (&killswitch, filter_settings.as_object_mut()) {
            let entry = m.entry("killSwitch").or_insert_with(|| json!({}));
            entry["cluster"] = json!(ks.cluster);
            entry["url"] = json!(ks.uri);
        }
        if let (Some(sh), Some(m)) = (&shadow, filter_settings.as_object_mut()) {
            let entry = m.entry("shadow").or_insert_with(|| json!({}));
            entry["cluster"] = json!(sh.cluster);
            entry["url"] = json!(sh.uri);
        }
        if let (Some(d), Some(m)) = (&default_upstream, filter_settings.as_object_mut()) {
            m.insert("defaultUpstreamCluster".into(), json!(d.cluster));
        }
        // The breakers are the filter's: the gateway setting is theirs. Written only when
        // it is not the default (which the filter applies without it), so a filter build
        // from before the setting still takes the default configuration.
        if let Some(m) = filter_settings.as_object_mut()
            && settings.breaker != Breaker::default()
        {
            m.insert("breaker".into(), json!(settings.breaker));
        }
        FilterPlan {
            name: names::FILTER_NAME.into(),
            module: settings.wasm_path.clone(),
            settings: filter_settings,
        }
    });

    Ok(Plan {
        listener: ListenerPlan {
            jwt_authn,
            jwks,
            killswitch,
            evidence,
            default_upstream,
            shadow,
            filter,
            budgets,
            name: settings.listener_name.clone(),
            address: settings.listen_address.clone(),
            port: settings.listen_port,
            route_config_name: settings.route_config_name.clone(),
            stream_idle_timeout_seconds: settings.stream_idle_timeout_seconds,
            per_connection_buffer_limit_bytes: listener_buffer_limit(&settings.filter_settings),
            access_logs: access_logs(settings),
        },
        route,
        aggregates: aggregates.into_values().collect(),
        targets: targets.into_values().collect(),
        attempt_stage: settings.halo_filter.then(|| settings.wasm_path.clone()),
        warnings,
    })
}

/// Leave out of a failover order every target known now to refuse each call (a bedrock
/// host that may not receive the gateway's signature), so the attempt goes to the next
/// target instead of being answered 502 there: Envoy does not retry an upstream filter's
/// own answer. An order of refusing targets only is kept: the call gets the refusal.
/// (Targets whose upstream kind cannot take a class of calls are left out per class by
/// [`cluster_names::route_aggregates`]; a translation that fails for one request is
/// answered 502 `bad_upstream` by the per-attempt stage, docs/design/credentials.md.)
fn skip_refusing(clusters: &mut Vec<String>, targets: &BTreeMap<String, TargetPlan>) {
    let refuses = |c: &String| {
        targets
            .get(c)
            .is_some_and(|t| matches!(t.credential, TargetCredential::RefuseSigning { .. }))
    };
    if !clusters.iter().all(refuses) {
        clusters.retain(|c| !refuses(c));
    }
}

fn plan_target(
    snap: &Snapshot,
    settings: &GatewaySettings,
    hosts: &Hosts,
    alias: &str,
    target: &Target,
    name: String,
) -> Result<TargetPlan, PlanError> {
    let upstream =
        snap.upstreams
            .get(&target.upstream)
            .ok_or_else(|| PlanError::UnknownUpstream {
                alias: alias.to_string(),
                upstream: target.upstream.clone(),
            })?;
    let edge;
    let (upstream, ep) = match &settings.next_hop {
        // Edge mode: the next hop in the target's place, a pass-through kind (only the
        // model is rewritten) that gets no credential of this gateway's.
        Some(hop) => {
            edge = halo_policy::types::Upstream {
                url: hop.clone(),
                kind: halo_policy::types::UpstreamKind::Orchestrator,
                credential: None,
                ..upstream.clone()
            };
            (&edge, next_hop(hop)?)
        }
        None => (
            upstream,
            endpoint(&format!("upstream {}", target.upstream), &upstream.url)?,
        ),
    };
    let metadata = target_metadata(&name, &target.upstream, upstream, &target.model, &ep.host);
    let (credential, _) = credentials::target_credential(&target.upstream, upstream, hosts);
    Ok(TargetPlan {
        credential_summary: summary(&credential),
        credential,
        headers: Vec::new(),
        metadata,
        name,
        upstream: target.upstream.clone(),
        kind: upstream.kind.as_str().to_string(),
        model: target.model.clone(),
        tls: ep
            .tls
            .then(|| UpstreamTls::for_host(&ep.host, &settings.upstream_ca_file)),
        resolve: ep.host.parse::<IpAddr>().is_err(),
        host: ep.host,
        port: ep.port,
        connect_timeout_seconds: target
            .timeout_seconds
            .unwrap_or(settings.default_connect_timeout_seconds),
    })
}

/// The next hop's endpoint: an http(s) URL with a host and no path (the client's path is
/// forwarded as it is).
fn next_hop(url: &str) -> Result<Endpoint, PlanError> {
    let ep = endpoint("nextHop", url)?;
    if ep.path != "/" {
        return Err(PlanError::BadUrl {
            what: "nextHop (no path: the client's is forwarded)".into(),
            url: url.into(),
        });
    }
    Ok(ep)
}

fn summary(c: &TargetCredential) -> String {
    match c {
        TargetCredential::None => String::new(),
        TargetCredential::SigV4 { region } => format!("sigv4 {region}"),
        TargetCredential::RefuseSigning { host } => {
            format!("refused: {host} may not be signed for")
        }
        TargetCredential::Key { header, source, .. } => match source {
            credentials::SecretSource::Env(var) => {
                format!("{header} from environment variable {var}, read at use time")
            }
            credentials::SecretSource::File(path) => {
                format!("{header} from file {path}, read at use time")
            }
        },
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

    fn snapshot(models: BTreeMap<String, Vec<Target>>) -> Snapshot {
        Snapshot {
            schema: 1,
            org: "o".into(),
            identity: None,
            protocols: BTreeMap::new(),
            upstreams: BTreeMap::new(),
            models,
            rings: vec![],
            experiments: vec![],
            toggles: vec![],
            prices: Default::default(),
            budgets: Default::default(),
            budget_service: None,
        }
    }

    #[test]
    fn the_breaker_setting_goes_to_the_filter_and_no_target_has_outlier_detection() {
        let mut snap = snapshot(BTreeMap::from([(
            "m".to_string(),
            vec![t("a", "x", 0), t("a", "y", 1)],
        )]));
        snap.upstreams.insert(
            "a".into(),
            Upstream {
                url: "http://127.0.0.1:9".into(),
                kind: UpstreamKind::Anthropic,
                region: None,
                project: None,
                api_version: None,
                credential: None,
            },
        );
        let filter_settings = |s: &GatewaySettings| {
            let p = plan(&snap, s).expect("plans");
            p.listener.filter.expect("the halo filter").settings
        };
        // The default is the filter's own: not written (a filter build from before the
        // setting takes the configuration).
        assert_eq!(
            filter_settings(&GatewaySettings::default()).get("breaker"),
            None
        );
        let custom = GatewaySettings {
            breaker: Breaker {
                consecutive_failures: 3,
                open_seconds: 7,
            },
            ..GatewaySettings::default()
        };
        assert_eq!(
            filter_settings(&custom)["breaker"],
            json!({"consecutiveFailures": 3, "openSeconds": 7})
        );
        let cluster =
            crate::bootstrap::target_cluster(&plan(&snap, &custom).expect("plans").targets[0]);
        assert!(cluster.get("outlier_detection").is_none(), "{cluster}");
    }

    #[test]
    fn unknown_upstreams_and_bad_urls_are_errors() {
        let mut snap = snapshot(BTreeMap::from([("m".to_string(), vec![t("nope", "x", 0)])]));
        let s = GatewaySettings::default();
        assert!(matches!(
            plan(&snap, &s),
            Err(PlanError::UnknownUpstream { .. })
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
        assert!(matches!(plan(&snap, &s), Err(PlanError::BadUrl { .. })));
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
        assert_eq!(plan(&snap, &zero), Err(PlanError::NoAttempts));
        let not_an_object = GatewaySettings {
            filter_settings: json!([]),
            ..GatewaySettings::default()
        };
        assert_eq!(plan(&snap, &not_an_object), Err(PlanError::Settings));
    }

    #[test]
    fn edge_mode_sends_every_target_to_the_next_hop_as_it_is_with_its_model() {
        let mut snap = snapshot(BTreeMap::from([(
            "m".to_string(),
            vec![t("br", "us.anthropic.claude", 0), t("oa", "gpt-5", 1)],
        )]));
        for (name, url, kind) in [
            (
                "br",
                "https://bedrock-runtime.us-east-1.amazonaws.com",
                UpstreamKind::Bedrock,
            ),
            ("oa", "https://api.openai.com", UpstreamKind::Openai),
        ] {
            snap.upstreams.insert(
                name.into(),
                Upstream {
                    url: url.into(),
                    kind,
                    region: None,
                    project: None,
                    api_version: None,
                    credential: Some(halo_policy::types::Credential {
                        env: Some("K".into()),
                        file: None,
                    }),
                },
            );
        }
        let s = GatewaySettings {
            next_hop: Some("http://kong.internal:8000".into()),
            ..GatewaySettings::default()
        };
        let p = plan(&snap, &s).expect("plans");
        assert_eq!(p.targets.len(), 2);
        for tp in &p.targets {
            assert_eq!((tp.host.as_str(), tp.port), ("kong.internal", 8000));
            assert!(tp.tls.is_none() && tp.resolve);
            assert_eq!(tp.kind, "orchestrator", "passed through, not translated");
            assert!(tp.credential.is_none(), "the next hop holds the keys");
        }
        let models: Vec<&str> = p.targets.iter().map(|t| t.model.as_str()).collect();
        assert_eq!(models, ["us.anthropic.claude", "gpt-5"]);
        assert_eq!(p.warnings.len(), 2, "{:?}", p.warnings);
        let with_path = GatewaySettings {
            next_hop: Some("http://kong.internal:8000/llm".into()),
            ..GatewaySettings::default()
        };
        assert!(matches!(
            plan(&snap, &with_path),
            Err(PlanError::BadUrl { .. })
        ));
        // Strictly decoded, camelCase, as the xDS gateway file writes it.
        let decoded: GatewaySettings =
            serde_json::from_value(json!({"nextHop": "https://litellm:4000"})).expect("decodes");
        assert_eq!(decoded.next_hop.as_deref(), Some("https://litellm:4000"));
        assert!(serde_json::from_value::<GatewaySettings>(json!({"next_hop": "x"})).is_err());
    }

    #[test]
    fn vertex_token_and_upstream_headers_are_planned_per_target() {
        let mut snap = snapshot(BTreeMap::from([(
            "m".to_string(),
            vec![t("v", "claude", 0)],
        )]));
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
        s.upstream_headers
            .insert("nope".into(), BTreeMap::from([("x".into(), "y".into())]));
        assert!(matches!(plan(&snap, &s), Err(PlanError::Credentials(_))));
    }

    #[test]
    fn a_target_that_must_refuse_is_left_out_of_failover_orders() {
        let up = |url: &str, kind, region: Option<&str>| Upstream {
            url: url.into(),
            kind,
            region: region.map(str::to_string),
            project: None,
            api_version: None,
            credential: None,
        };
        let mut snap = snapshot(BTreeMap::from([
            (
                "m".to_string(),
                vec![t("unsigned", "claude", 0), t("direct", "claude", 1)],
            ),
            ("only".to_string(), vec![t("unsigned", "claude", 0)]),
        ]));
        snap.upstreams.insert(
            "unsigned".into(),
            up(
                "https://bedrock.corp.example",
                UpstreamKind::Bedrock,
                Some("us-east-1"),
            ),
        );
        snap.upstreams.insert(
            "direct".into(),
            up("https://api.anthropic.com", UpstreamKind::Anthropic, None),
        );
        let p = plan(&snap, &GatewaySettings::default()).expect("plans");
        let order = |name: &str| -> Vec<String> {
            let a = p.aggregates.iter().find(|a| a.name == name).expect(name);
            a.clusters
                .iter()
                .map(|c| c.split('~').nth(1).unwrap_or_default().to_string())
                .collect()
        };
        // First pick the refusing target: the first attempt goes to the next one.
        assert_eq!(order("m-0"), ["direct"]);
        assert_eq!(order("m-1"), ["direct"]);
        // Nothing else to try: the refusal answers.
        assert_eq!(order("only-0"), ["unsigned"]);
        // Signing allowed for the host: back in the order.
        let signs = GatewaySettings {
            sign_hosts: vec!["bedrock.corp.example".into()],
            ..GatewaySettings::default()
        };
        let p = plan(&snap, &signs).expect("plans");
        let a = p.aggregates.iter().find(|a| a.name == "m-0").expect("m-0");
        assert_eq!(a.clusters.len(), 2);
    }

    #[test]
    fn endpoints() {
        let e = endpoint("x", "https://api.anthropic.com").unwrap();
        assert_eq!(
            (e.tls, e.host.as_str(), e.port, e.path.as_str()),
            (true, "api.anthropic.com", 443, "/")
        );
        let e = endpoint("x", "http://127.0.0.1:8080/api/v1/gateway/killswitch").unwrap();
        assert_eq!(
            (e.tls, e.port, e.path.as_str()),
            (false, 8080, "/api/v1/gateway/killswitch")
        );
        assert!(endpoint("x", "ftp://h").is_err());
        assert!(endpoint("x", "http://:80").is_err());
        assert!(endpoint("x", "https://user@h").is_err());
        // The scheme is case-insensitive, as policy validation takes it.
        let e = endpoint("x", "HTTPS://API.example:8443?q=1").unwrap();
        assert_eq!(
            (e.tls, e.host.as_str(), e.port, e.path.as_str()),
            (true, "API.example", 8443, "?q=1")
        );
        let e = endpoint("x", "http://[::1]:9/v1").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 9));
    }
}
