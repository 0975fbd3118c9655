//! The standalone bootstrap: one Envoy, static resources, no control plane.
//!
//! Listener -> HTTP connection manager -> jwt_authn (when the policy names an issuer) ->
//! the halo wasm filter (fails closed) -> router. The one route sends every request to the
//! cluster named by the filter's route header (see [`crate::names`]). Clusters: one per
//! policy upstream, the issuer's JWKS, the kill-list server.
//!
//! [`standalone`] is pure: the caller reads files and passes their contents.

use std::collections::{BTreeMap, BTreeSet};

use halo_policy::Snapshot;
use halo_policy::cluster_names;
use halo_policy::cluster_names::EndpointFacts;
use serde_json::{Value, json};

use crate::credentials::{
    self, AttemptTarget, Hosts, SecretDelivery, SettingsError, TargetCredential,
};
use crate::names;
use crate::tls::UpstreamTls;

/// Default request body bound of model calls (the filter's default too).
pub const DEFAULT_MAX_BODY_BYTES: u64 = 32 * 1024 * 1024;

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

/// What the standalone bootstrap is rendered from, besides the snapshot.
#[derive(Debug, Clone)]
pub struct Standalone {
    /// Listener address and port.
    pub listen_address: String,
    pub listen_port: u16,
    /// Admin address and port (stats, /ready). Keep it on loopback.
    pub admin_address: String,
    pub admin_port: u16,
    /// The filter module as Envoy will see it: halo_filter.wasm, or the native build
    /// libhalo_filter_native.so (rendered as a dynamic module; see [`halo_filter`]).
    pub wasm_path: String,
    /// The issuer's JWKS URL; default `<issuer>/.well-known/jwks.json`.
    pub jwks_uri: Option<String>,
    /// The filter's `settings` object (identity, forwardAuth, maxBodyBytes, killSwitch...),
    /// passed through; `killSwitch.cluster` is filled in when a kill-list URL is given.
    pub settings: Value,
    /// The kill-list URL (halo-server's GET /api/v1/gateway/killswitch).
    pub killswitch_url: Option<String>,
    /// Where the SDS file of each provider key lives, as Envoy sees it
    /// ([`standalone_secret_files`] gives their contents): a rotated key file is then used
    /// without a restart. `None`: static secrets, read once when Envoy starts.
    pub secrets_dir: Option<String>,
    /// The CA bundle every https cluster verifies its server against (PEM, as Envoy sees
    /// it): the system's ([`crate::tls::system_ca_bundle`]) or a private CA's.
    pub upstream_ca_file: String,
}

/// Why a bootstrap cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("{what}: {url:?} is not an http(s) URL with a host")]
    BadUrl { what: String, url: String },
    #[error("settings must be a JSON object")]
    Settings,
    #[error(transparent)]
    Credentials(#[from] SettingsError),
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
/// refused (Envoy would send it nowhere).
pub fn endpoint(what: &str, url: &str) -> Result<Endpoint, RenderError> {
    let bad = || RenderError::BadUrl {
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

/// The connect timeout of a service cluster (the JWKS, the kill list); a model cluster's is
/// its target's `timeoutSeconds` or [`Failover::default_connect_timeout_seconds`].
pub const SERVICE_CONNECT_TIMEOUT_SECONDS: u32 = 5;

/// A one-endpoint cluster for `ep`: DNS-resolved unless the host is an IP literal (the
/// address family is a resolver setting, so only a resolved cluster has one); for https,
/// TLS verified against `trusted_ca` with the host as SAN (and SNI), see [`crate::tls`].
/// Its connect timeout is a service's ([`SERVICE_CONNECT_TIMEOUT_SECONDS`]).
pub fn cluster(name: &str, ep: &Endpoint, trusted_ca: &str) -> Value {
    let is_ip = ep.host.parse::<std::net::IpAddr>().is_ok();
    let mut c = json!({
        "name": name,
        // One endpoint per cluster: LOGICAL_DNS keeps connections across DNS answers
        // (a provider's many addresses) instead of draining them on each change.
        "type": if is_ip { "STATIC" } else { "LOGICAL_DNS" },
        "connect_timeout": format!("{SERVICE_CONNECT_TIMEOUT_SECONDS}s"),
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {
                "address": {"socket_address": {"address": ep.host, "port_value": ep.port}},
                "hostname": ep.host,
            }}]}],
        },
    });
    if !is_ip {
        c["dns_lookup_family"] = json!("V4_PREFERRED");
    }
    if ep.tls {
        c["transport_socket"] = UpstreamTls::for_host(&ep.host, trusted_ca).transport_socket();
    }
    c
}

/// The names of every upstream the snapshot can route to: the gateway routes, toggle
/// routes and experiment variant routes name upstreams.
pub fn used_upstreams(snap: &Snapshot) -> BTreeSet<&str> {
    let mut used: BTreeSet<&str> = BTreeSet::new();
    let routes = snap
        .models
        .values()
        .chain(snap.toggles.iter().flat_map(|t| t.routes.values()))
        .chain(
            snap.experiments
                .iter()
                .flat_map(|e| e.variants.iter().flat_map(|v| v.routes.values())),
        );
    for targets in routes {
        for t in targets {
            used.insert(t.upstream.as_str());
        }
    }
    used
}

/// A target endpoint's `filter_metadata.halo`, sorted by key: what the per-attempt stage
/// and the credential chain read (`target`: the target's cluster name, the marker the
/// credential filters match; `model`, `kind`, `upstream`; and the upstream settings a
/// translation reads: `region`, `project`, `apiVersion`, when set; and `attempt`, all the
/// stage reads as one JSON value, [`EndpointFacts`]). The xDS translator writes the same
/// pairs.
pub fn target_metadata(
    cluster: &str,
    upstream_name: &str,
    upstream: Option<&halo_policy::types::Upstream>,
    model: &str,
    host: &str,
) -> Vec<(&'static str, String)> {
    let mut md = vec![
        // What auto_host_rewrite writes after the upstream filters: the stage sets it
        // first, so a SigV4 signature covers the host the provider receives.
        ("host", host.to_string()),
        (
            "kind",
            upstream
                .map(|u| u.kind.as_str())
                .unwrap_or_default()
                .to_string(),
        ),
        ("model", model.to_string()),
        ("target", cluster.to_string()),
        ("upstream", upstream_name.to_string()),
    ];
    if let Some(u) = upstream {
        for (key, value) in [
            ("apiVersion", &u.api_version),
            ("project", &u.project),
            ("region", &u.region),
        ] {
            if let Some(v) = value {
                md.push((key, v.clone()));
            }
        }
    }
    // The same facts in one value: what the per-attempt stage reads, in one call.
    let facts = EndpointFacts {
        model: model.to_string(),
        kind: upstream
            .map(|u| u.kind.as_str())
            .unwrap_or_default()
            .to_string(),
        host: host.to_string(),
        region: upstream.and_then(|u| u.region.clone()),
        project: upstream.and_then(|u| u.project.clone()),
        api_version: upstream.and_then(|u| u.api_version.clone()),
    };
    md.push((names::ENDPOINT_FACTS_KEY, facts.encode()));
    md.sort();
    md
}

/// What moves an attempt to the next target (spec: a connect error, a 5xx or a 429).
/// Envoy never retries once response headers went downstream, so a stream that failed
/// mid-body is not retried (invariant 4).
pub const RETRY_ON: &str = "5xx,connect-failure,retriable-status-codes";

/// The status codes besides 5xx that [`RETRY_ON`] retries.
pub const RETRIABLE_STATUS_CODES: [u32; 1] = [429];

/// Failover settings of the model clusters and route. The defaults are written here only;
/// the xDS translator's `GatewaySettings` takes them, so both modes walk targets the same
/// way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failover {
    /// Attempts per request, the first included.
    pub max_attempts: u32,
    /// Consecutive 5xx (connect failures count) that open a target's breaker.
    pub breaker_failures: u32,
    /// How long a breaker stays open before a probe.
    pub breaker_open_seconds: u32,
    /// Connect timeout of a target without timeoutSeconds.
    pub default_connect_timeout_seconds: u32,
}

impl Default for Failover {
    fn default() -> Self {
        Failover {
            max_attempts: 3,
            breaker_failures: 5,
            breaker_open_seconds: 30,
            default_connect_timeout_seconds: 10,
        }
    }
}

/// The model clusters, named by [`halo_policy::cluster_names`] exactly as the xDS
/// translator names them: one one-endpoint cluster per target (outlier detection is its
/// breaker), then one aggregate cluster per (route scope, alias, first pick) listing the
/// targets' clusters in failover order. Sorted by name within each group.
///
/// With `attempt_stage` (the wasm path), every aggregate runs the filter's per-attempt
/// stage as an upstream HTTP filter ([`attempt_protocol_options`]).
pub fn model_clusters(
    snap: &Snapshot,
    failover: &Failover,
    attempt_stage: Option<&str>,
    hosts: &Hosts,
    delivery: SecretDelivery<'_>,
    trusted_ca: &str,
) -> Result<ModelClusters, RenderError> {
    let mut out = ModelClusters::default();
    let headers = hosts.rendered_headers(|u| snap.upstreams.contains_key(u))?;
    let mut creds: BTreeMap<String, AttemptTarget> = BTreeMap::new();
    let mut targets: BTreeMap<String, Value> = BTreeMap::new();
    let mut timeouts: BTreeMap<String, u32> = BTreeMap::new();
    let mut aggregates: BTreeMap<String, Value> = BTreeMap::new();
    for (scope, routes) in cluster_names::scoped_routes(snap) {
        for (alias, route) in routes {
            for t in route {
                let name = cluster_names::target_cluster(t);
                if targets.contains_key(&name) {
                    continue;
                }
                let url = snap
                    .upstreams
                    .get(&t.upstream)
                    .map(|u| u.url.as_str())
                    .unwrap_or_default();
                let ep = endpoint(&format!("upstream {}", t.upstream), url)?;
                if let Some(secs) = t.timeout_seconds {
                    timeouts.insert(name.clone(), secs);
                }
                let mut c = cluster(&name, &ep, trusted_ca);
                c["connect_timeout"] = json!(format!(
                    "{}s",
                    t.timeout_seconds
                        .unwrap_or(failover.default_connect_timeout_seconds)
                ));
                c["outlier_detection"] = json!({
                    "consecutive_5xx": failover.breaker_failures,
                    "base_ejection_time": format!("{}s", failover.breaker_open_seconds),
                    // One host per cluster: the default cap (10%) must not keep it in.
                    "max_ejection_percent": 100,
                });
                let halo: serde_json::Map<String, Value> = target_metadata(
                    &name,
                    &t.upstream,
                    snap.upstreams.get(&t.upstream),
                    &t.model,
                    &ep.host,
                )
                .into_iter()
                .map(|(k, v)| (k.to_string(), Value::String(v)))
                .collect();
                c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["metadata"] =
                    json!({"filter_metadata": {names::METADATA_NAMESPACE: halo}});
                let (cred, warning) = match snap.upstreams.get(&t.upstream) {
                    Some(u) => credentials::target_credential(&t.upstream, u, hosts),
                    None => (TargetCredential::None, None),
                };
                out.warnings.extend(warning);
                if let TargetCredential::Key { secret, source, .. } = &cred
                    && !out.secrets.iter().any(|s| s["name"] == json!(secret))
                {
                    out.secrets.push(credentials::secret(secret, source));
                }
                creds.insert(
                    name.clone(),
                    AttemptTarget {
                        cluster: name.clone(),
                        credential: cred,
                        headers: headers.get(&t.upstream).cloned().unwrap_or_default(),
                    },
                );
                targets.insert(name, c);
            }
            for (name, _first_pick, clusters) in
                cluster_names::route_aggregates(snap, scope, alias, route)
            {
                if let Some(secs) = clusters.first().and_then(|c| timeouts.get(c)) {
                    out.header_timeouts.insert(name.clone(), *secs);
                }
                let mut aggregate = json!({
                    "name": name,
                    "connect_timeout": "5s",
                    "lb_policy": "CLUSTER_PROVIDED",
                    "cluster_type": {
                        "name": "envoy.clusters.aggregate",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig",
                            "clusters": clusters,
                        },
                    },
                });
                if let Some(wasm_path) = attempt_stage {
                    let targets: Vec<AttemptTarget> = clusters
                        .iter()
                        .map(|c| {
                            creds.get(c).cloned().unwrap_or_else(|| AttemptTarget {
                                cluster: c.clone(),
                                ..AttemptTarget::default()
                            })
                        })
                        .collect();
                    aggregate["typed_extension_protocol_options"] =
                        attempt_protocol_options(wasm_path, &targets, delivery);
                }
                aggregates.insert(name, aggregate);
            }
        }
    }
    out.clusters = targets
        .into_values()
        .chain(aggregates.into_values())
        .collect();
    Ok(out)
}

/// What [`model_clusters`] renders.
#[derive(Debug, Clone, Default)]
pub struct ModelClusters {
    pub clusters: Vec<Value>,
    /// The keys' secrets (references to an env variable or file, never a value), one per
    /// credentialed upstream in use.
    pub secrets: Vec<Value>,
    /// Credentials the policy configures that are not used, and why.
    pub warnings: Vec<String>,
    /// Per aggregate whose first pick has `timeoutSeconds`, that value: its route bounds
    /// each attempt's wait for response headers ([`model_routes`]).
    pub header_timeouts: BTreeMap<String, u32>,
}

/// The model routes, in order: one per aggregate in `header_timeouts` (matched on its name
/// in the route header) whose retry policy has that `per_try_timeout`, then the route for
/// every other aggregate (`cluster_header`). A target's `timeoutSeconds` bounds connect
/// (its cluster's `connect_timeout`) and the wait for response headers (this per-try
/// timeout): a primary that accepts and hangs is retried on the next target. Envoy ignores
/// a per-try timeout once the response has started downstream, so a started stream is never
/// cut by it (seen in Envoy 1.40, `tests/tests/timeouts.rs`). The per-try timeout is the
/// first pick's and applies to every attempt of the request: Envoy takes it per route,
/// not per upstream.
pub fn model_routes(failover: &Failover, header_timeouts: &BTreeMap<String, u32>) -> Vec<Value> {
    let route = |name: &str, matcher: Value, target: (&str, &str), per_try: Option<u32>| {
        let mut retry = retry_policy(failover);
        if let Some(secs) = per_try {
            retry["per_try_timeout"] = json!(format!("{secs}s"));
        }
        json!({
            "name": name,
            "match": matcher,
            "route": {
                target.0: target.1,
                // Streams have no total limit; idleness ends them.
                "timeout": "0s",
                "idle_timeout": format!("{STREAM_IDLE_TIMEOUT_SECONDS}s"),
                "auto_host_rewrite": true,
                "retry_policy": retry,
            },
            "request_headers_to_remove": [names::ROUTE_HEADER],
        })
    };
    let mut routes: Vec<Value> = header_timeouts
        .iter()
        .map(|(aggregate, secs)| {
            route(
                aggregate,
                json!({"prefix": "/", "headers": [{
                    "name": names::ROUTE_HEADER,
                    "string_match": {"exact": aggregate},
                }]}),
                ("cluster", aggregate),
                Some(*secs),
            )
        })
        .collect();
    routes.push(route(
        BY_ROUTE_HEADER,
        json!({"prefix": "/"}),
        ("cluster_header", names::ROUTE_HEADER),
        None,
    ));
    routes
}

/// The name of the model route that takes its cluster from the route header (the routes
/// before it are named after the aggregate they serve).
pub const BY_ROUTE_HEADER: &str = "by-route-header";

/// The retry policy of the model route: the xDS translator's (move on after a connect
/// error, a 5xx or a 429; each retry to the next sub-cluster of the aggregate). Envoy
/// never retries once response headers went downstream.
pub fn retry_policy(failover: &Failover) -> Value {
    json!({
        "retry_on": RETRY_ON,
        "retriable_status_codes": RETRIABLE_STATUS_CODES,
        "num_retries": failover.max_attempts.saturating_sub(1),
        "retry_priority": {
            "name": "envoy.retry_priorities.previous_priorities",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
                "update_frequency": 1,
            },
        },
    })
}

/// jwt_authn for the policy's identity: one provider for bearer tokens, one for the
/// gemini wire that also takes `x-goog-api-key` and `?key=`. A missing or failed token
/// passes (the filter answers 401 itself, or routes anonymously with allowAnonymous);
/// verified claims go to dynamic metadata under [`names::JWT_PAYLOAD_KEY`] and, for the
/// native build (`module_path` a `.so`), also to [`names::JWT_PAYLOAD_HEADER`].
pub fn jwt_authn(snap: &Snapshot, jwks_uri: &str, module_path: &str) -> Option<Value> {
    let identity = snap.identity.as_ref().filter(|i| !i.issuer.is_empty())?;
    let provider = |gemini: bool| {
        let mut p = json!({
            "issuer": identity.issuer,
            "remote_jwks": {
                "http_uri": {"uri": jwks_uri, "cluster": names::JWKS_CLUSTER, "timeout": "5s"},
                "cache_duration": "300s",
            },
            "payload_in_metadata": names::JWT_PAYLOAD_KEY,
            // The filter strips credentials itself (unless forwardAuth).
            "forward": true,
            // A coding tool sends the same token for an hour: verify its signature once.
            "jwt_cache_config": {"jwt_cache_size": 1000},
        });
        if is_native_module(module_path) {
            // The native build cannot read the nested payload out of the metadata: it
            // takes the verified payload from this header, set only for a verified token.
            p["forward_payload_header"] = json!(names::JWT_PAYLOAD_HEADER);
        }
        if let Some(aud) = identity.effective_audience() {
            p["audiences"] = json!([aud]);
        }
        if gemini {
            p["from_headers"] = json!([
                {"name": "authorization", "value_prefix": "Bearer "},
                {"name": "x-goog-api-key"},
            ]);
            p["from_params"] = json!(["key"]);
        }
        p
    };
    let requires = |provider: &str| {
        json!({"requires_any": {"requirements": [
            {"provider_name": provider},
            {"allow_missing_or_failed": {}},
        ]}})
    };
    Some(json!({
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
            "providers": {"halo": provider(false), "halo_gemini": provider(true)},
            "rules": [
                {"match": {"prefix": "/v1beta/models/"}, "requires": requires("halo_gemini")},
                {"match": {"prefix": "/"}, "requires": requires("halo")},
            ],
        },
    }))
}

/// The filter's configuration document `{snapshot, settings}` (the format the filter's
/// `config` module decodes), shared by the bootstrap and the mesh renderers.
pub fn filter_configuration(snap: &Snapshot, settings: &Value) -> Value {
    let snapshot: Value = serde_json::to_value(snap).unwrap_or(Value::Null);
    json!({"snapshot": snapshot, "settings": settings})
}

/// The halo filter, configured with `{snapshot, settings}`; fails closed. `module_path`
/// is the filter as Envoy will see it: `halo_filter.wasm` (proxy-wasm, in V8) or the
/// native build `libhalo_filter_native.so` (a dynamic module), told apart by the `.so`.
pub fn halo_filter(module_path: &str, snap: &Snapshot, settings: &Value) -> Value {
    halo_filter_with(module_path, &filter_configuration(snap, settings))
}

/// [`halo_filter`] with a configuration document already built (the xDS server adds the
/// pushed `killList` to it), for either build.
pub fn halo_filter_with(module_path: &str, configuration: &Value) -> Value {
    filter_instance("halo", module_path, &configuration.to_string())
}

/// The filter's per-attempt stage (`{"stage": "attempt"}`): the same module, run as an
/// upstream HTTP filter, once per attempt, after Envoy picked the endpoint.
pub fn attempt_filter(module_path: &str) -> Value {
    filter_instance("halo-attempt", module_path, ATTEMPT_STAGE_CONFIGURATION)
}

/// True when `module_path` is the native build (a shared object) rather than wasm.
pub fn is_native_module(module_path: &str) -> bool {
    module_path.ends_with(".so")
}

fn filter_instance(name: &str, module_path: &str, configuration: &str) -> Value {
    if is_native_module(module_path) {
        native_filter(name, module_path, configuration)
    } else {
        wasm_plugin(name, module_path, configuration)
    }
}

/// An Envoy dynamic-module HTTP filter running the native halo module as `name` with
/// `configuration` (the same document the wasm plugin gets). Envoy loads the file once
/// per process, whatever the number of filters using it.
fn native_filter(name: &str, module_path: &str, configuration: &str) -> Value {
    json!({
        "name": "envoy.filters.http.dynamic_modules",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
            "dynamic_module_config": {
                "name": "halo_filter_native",
                "module": {"local": {"filename": module_path}},
                // Counters are `halo.<name>` with their tags as labels, under a namespace
                // Prometheus names leave out ([`runtime`]): `halo_requests{halo_ring=...}`,
                // as the wasm build's.
                "metrics_namespace": names::NATIVE_METRICS_NAMESPACE,
            },
            "filter_name": name,
            "filter_config": {
                "@type": "type.googleapis.com/google.protobuf.StringValue",
                "value": configuration,
            },
        },
    })
}

/// An Envoy wasm HTTP filter running the halo module as plugin `name` (also its root id)
/// with `configuration`. Both plugins share the VM (`vm_id: halo`, same code).
fn wasm_plugin(name: &str, wasm_path: &str, configuration: &str) -> Value {
    json!({
        "name": "envoy.filters.http.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": name,
                "root_id": name,
                "fail_open": false,
                // Pause on request headers must mean StopIteration (the body still reaches
                // the filter, the headers wait for its decision), not proxy-wasm's default
                // StopAll, under which the body never reaches the filter. Envoy >= 1.35.
                "allow_on_headers_stop_iteration": true,
                "vm_config": {
                    "vm_id": "halo",
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": wasm_path}},
                },
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": configuration,
                },
            },
        },
    })
}

pub use crate::names::ATTEMPT_STAGE_CONFIGURATION;

/// An aggregate cluster's `typed_extension_protocol_options`: upstream HTTP filters, the
/// per-attempt stage then, when a target has a credential, the credential chain
/// ([`credentials::attempt_chain`]), then the upstream codec. Upstream filters must sit on
/// the aggregate: the ones on its sub-clusters do not run when a route goes through the
/// aggregate (seen in Envoy 1.40). The protocol (HTTP/1.1) is the sub-clusters' default.
pub fn attempt_protocol_options(
    wasm_path: &str,
    targets: &[AttemptTarget],
    delivery: SecretDelivery<'_>,
) -> Value {
    json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http_protocol_options": {}},
            "http_filters": credentials::attempt_chain(
                attempt_filter(wasm_path),
                targets,
                delivery,
            ),
        },
    })
}

/// How long a stream may carry no byte either way before Envoy resets it, in both modes.
/// Streams have no total time limit (route timeout 0): a model answer streams for as long
/// as it takes, and providers send keep-alive events (Anthropic's `ping`) far more often.
/// Without it a provider that accepts and then hangs would hold the client forever.
pub const STREAM_IDLE_TIMEOUT_SECONDS: u32 = 300;

/// The access log of the model listener, both modes: one JSON line per request on Envoy's
/// standard output. What was decided and how it went: the time, the ring, the experiment
/// and variant, the aggregate cluster (`<alias>-<first pick>`, prefixed by the experiment
/// or toggle scope; see [`halo_policy::cluster_names`]), the upstream address of the last
/// attempt, the status and Envoy's response flags, the attempts, the total duration and the
/// time to the response's first byte (ms). Never a body, a header value other than the
/// filter's own stamps, a query string, the path, or a user id (invariant 6): the filter's
/// `x-halo-user` stamp is not among the fields.
pub fn access_log() -> Value {
    json!({
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
    })
}

/// Stats tags for the filter's metrics (`halo.<metric>.<tag>.<value>...`, see the
/// filter's `metrics` module), so Prometheus shows them as labels.
pub fn stats_tags() -> Value {
    let tags: Vec<Value> = [
        "ring", "variant", "status", "source", "outcome", "upstream", "kind",
    ]
    .iter()
    .map(|tag| {
        json!({
            "tag_name": format!("halo_{tag}"),
            "regex": format!(r"^wasmcustom\.halo\..*?(\.{tag}\.([^.]+))"),
        })
    })
    .collect();
    Value::Array(tags)
}

/// The runtime of a gateway's Envoy, both modes (envoy/ads.yaml holds the same):
/// Envoy's defaults, plus the native build's metrics namespace registered as a custom
/// one, which Prometheus names leave out as they leave out the wasm build's `wasmcustom`
/// (without it they read `envoy_halocustom_halo_requests`). Envoy 1.40 keeps that behind
/// a runtime guard; tests/tests/decision.rs checks the names both builds export.
pub fn runtime() -> Value {
    json!({"layers": [
        {"name": "halo", "static_layer": {STRIP_CUSTOM_STAT_PREFIX: true}},
        {"name": "admin", "admin_layer": {}},
    ]})
}

/// The runtime guard that registers a dynamic module's metrics namespace as a custom
/// stat namespace ([`runtime`]).
pub const STRIP_CUSTOM_STAT_PREFIX: &str =
    "envoy.reloadable_features.dynamic_modules_strip_custom_stat_prefix";

/// The whole standalone bootstrap.
pub fn standalone(snap: &Snapshot, opts: &Standalone) -> Result<Value, RenderError> {
    let mut settings = opts.settings.clone();
    if !settings.is_object() {
        return Err(RenderError::Settings);
    }
    let failover = Failover::default();
    let hosts = Hosts::from_settings(&settings)?;
    if let Some(m) = settings.as_object_mut() {
        // Gateway settings for the renderer, not the filter's.
        for key in credentials::HOSTS_SETTINGS {
            m.remove(key);
        }
    }
    let delivery = match &opts.secrets_dir {
        Some(dir) => SecretDelivery::Files { dir },
        None => SecretDelivery::Static,
    };
    let model = model_clusters(
        snap,
        &failover,
        Some(&opts.wasm_path),
        &hosts,
        delivery,
        &opts.upstream_ca_file,
    )?;
    let mut clusters = model.clusters;
    if let Some(url) = &opts.killswitch_url {
        let ep = endpoint("killswitch URL", url)?;
        clusters.push(cluster(
            names::KILLSWITCH_CLUSTER,
            &ep,
            &opts.upstream_ca_file,
        ));
        let ks = settings
            .as_object_mut()
            .map(|m| m.entry("killSwitch").or_insert_with(|| json!({})));
        if let Some(Value::Object(ks)) = ks {
            ks.insert("cluster".into(), json!(names::KILLSWITCH_CLUSTER));
            ks.insert("url".into(), json!(url));
        }
    }

    let mut http_filters = Vec::new();
    if let Some(identity) = snap.identity.as_ref().filter(|i| !i.issuer.is_empty()) {
        let jwks = match &opts.jwks_uri {
            Some(u) => u.clone(),
            None => format!(
                "{}/.well-known/jwks.json",
                identity.issuer.trim_end_matches('/')
            ),
        };
        let ep = endpoint("JWKS URI", &jwks)?;
        clusters.push(cluster(names::JWKS_CLUSTER, &ep, &opts.upstream_ca_file));
        http_filters.extend(jwt_authn(snap, &jwks, &opts.wasm_path));
    }
    let mut filter = halo_filter(&opts.wasm_path, snap, &settings);
    // The name xDS gives it too (its ECDS resource's): one name in both modes.
    filter["name"] = json!(names::FILTER_NAME);
    http_filters.push(filter);
    http_filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
    }));

    let hcm = json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "halo",
            "codec_type": "AUTO",
            "stream_idle_timeout": format!("{STREAM_IDLE_TIMEOUT_SECONDS}s"),
            "access_log": [access_log()],
            "route_config": {
                "name": "halo",
                "virtual_hosts": [{
                    "name": "halo",
                    "domains": ["*"],
                    "routes": model_routes(&failover, &model.header_timeouts),
                }],
            },
            "http_filters": http_filters,
        },
    });
    let mut doc = json!({
        // SDS from a file (the Vertex token) needs a node id and cluster.
        "node": {"id": "halo", "cluster": "halo"},
        "admin": {"address": {"socket_address": {"address": opts.admin_address, "port_value": opts.admin_port}}},
        "stats_config": {"stats_tags": stats_tags()},
        "layered_runtime": runtime(),
        "static_resources": {
            "listeners": [{
                "name": "halo",
                "address": {"socket_address": {"address": opts.listen_address, "port_value": opts.listen_port}},
                "per_connection_buffer_limit_bytes": listener_buffer_limit(&settings),
                "filter_chains": [{"filters": [hcm]}],
            }],
            "clusters": clusters,
        },
    });
    if !model.secrets.is_empty() && opts.secrets_dir.is_none() {
        // References to where each key is read (env or file), never a value.
        doc["static_resources"]["secrets"] = Value::Array(model.secrets);
    }
    Ok(doc)
}

/// With [`Standalone::secrets_dir`]: the SDS files the bootstrap reads its provider keys'
/// references from, as (file name in that directory, JSON text). Write them (atomically)
/// before starting Envoy; they hold env or file references, never a key.
pub fn standalone_secret_files(
    snap: &Snapshot,
    opts: &Standalone,
) -> Result<Vec<(String, String)>, RenderError> {
    let Some(dir) = &opts.secrets_dir else {
        return Ok(Vec::new());
    };
    let hosts = Hosts::from_settings(&opts.settings)?;
    let model = model_clusters(
        snap,
        &Failover::default(),
        Some(&opts.wasm_path),
        &hosts,
        SecretDelivery::Files { dir },
        &opts.upstream_ca_file,
    )?;
    Ok(model
        .secrets
        .iter()
        .filter_map(credentials::secret_file)
        .collect())
}

/// Warnings about the policy's credentials the standalone bootstrap does not use.
pub fn credential_warnings(snap: &Snapshot, settings: &Value) -> Vec<String> {
    let Ok(hosts) = Hosts::from_settings(settings) else {
        return Vec::new();
    };
    model_clusters(
        snap,
        &Failover::default(),
        None,
        &hosts,
        SecretDelivery::Static,
        crate::tls::DEFAULT_UPSTREAM_CA_FILE,
    )
    .map(|m| m.warnings)
    .unwrap_or_default()
}

/// The standalone bootstrap as the YAML file `halo envoy bootstrap` writes: a header
/// saying where it came from (plus any `warnings`, each as a `# WARNING:` line), then the
/// document.
pub fn standalone_yaml(
    snap: &Snapshot,
    opts: &Standalone,
    source: &str,
    warnings: &[String],
) -> Result<String, RenderError> {
    let doc = standalone(snap, opts)?;
    let mut out = format!(
        "# Envoy standalone bootstrap for Halos, generated by `halo envoy bootstrap` from {source}\n\
         # (policy snapshot {}). Do not edit: change the policy or the flags and render again.\n",
        snap.version()
    );
    for w in warnings {
        out.push_str(&format!("# WARNING: {w}\n"));
    }
    out.push_str(&crate::yaml::to_yaml(&doc));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity_snapshot() -> Snapshot {
        serde_json::from_value(json!({
            "schema": 1, "org": "o",
            "identity": {"issuer": "https://idp.example", "audience": "api://halos"},
            "protocols": {"claude-code": "anthropic-messages", "codex": "openai-responses",
                          "gemini-cli": "gemini"},
            "upstreams": {}, "models": {}, "experiments": [], "toggles": [],
            "rings": [{"name": "general", "order": 0, "membership": {"default": true}}],
        }))
        .expect("snapshot")
    }

    #[test]
    fn a_shared_object_renders_the_native_build_as_a_dynamic_module() {
        let snap = identity_snapshot();
        let native = halo_filter("/opt/halo/libhalo_filter_native.so", &snap, &json!({}));
        assert_eq!(native["name"], "envoy.filters.http.dynamic_modules");
        let tc = &native["typed_config"];
        assert_eq!(
            tc["dynamic_module_config"]["module"]["local"]["filename"],
            "/opt/halo/libhalo_filter_native.so"
        );
        assert_eq!(tc["filter_name"], "halo");
        let doc: Value = serde_json::from_str(
            tc["filter_config"]["value"]
                .as_str()
                .expect("config string"),
        )
        .expect("the filter's configuration document");
        assert_eq!(doc, filter_configuration(&snap, &json!({})));
        let stage = attempt_filter("/opt/halo/libhalo_filter_native.so");
        assert_eq!(stage["typed_config"]["filter_name"], "halo-attempt");
        assert_eq!(
            stage["typed_config"]["filter_config"]["value"],
            ATTEMPT_STAGE_CONFIGURATION
        );

        let wasm = halo_filter("/opt/halo/halo_filter.wasm", &snap, &json!({}));
        assert_eq!(wasm["name"], "envoy.filters.http.wasm");
    }

    #[test]
    fn jwt_authn_forwards_the_verified_payload_only_for_the_native_build() {
        let snap = identity_snapshot();
        let header = |module: &str| {
            let j = jwt_authn(&snap, "https://idp.example/jwks", module).expect("jwt_authn");
            j["typed_config"]["providers"]["halo"]["forward_payload_header"].clone()
        };
        assert_eq!(
            header("/x/libhalo_filter_native.so"),
            names::JWT_PAYLOAD_HEADER
        );
        assert_eq!(header("/x/halo_filter.wasm"), Value::Null);
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
