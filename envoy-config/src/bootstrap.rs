//! The standalone bootstrap: one Envoy, static resources, no control plane. An emitter of
//! the gateway [`Plan`] (crate::plan), as halo-xds's `envoy` module is for xDS: it prints
//! the plan's decisions as Envoy JSON and decides nothing itself.
//!
//! Listener -> HTTP connection manager -> jwt_authn (when the policy names an issuer) ->
//! the halo filter (fails closed) -> the budget check (with budgets, [`crate::budget`]) ->
//! router. The one route sends every request to the cluster named by the filter's route
//! header (see [`halo_contract::names`]). Clusters: one per target, one aggregate per route and
//! first pick, and the plan's service clusters ([`crate::plan::ListenerPlan::services`]).
//!
//! Also here: the Envoy JSON of the filters both emitters use (jwt_authn, the halo filter
//! in either build, the per-attempt stage); halo-xds sends them as `TypedStruct`.
//!
//! [`standalone`] is pure: the caller reads files and passes their contents.

use serde_json::{Value, json};

use halo_policy::Snapshot;

use crate::credentials::{self, AttemptTarget};
use crate::plan::{
    self, AggregatePlan, AggregateRoute, BY_ROUTE_HEADER, FilterPlan, GatewaySettings, Plan,
    PlanError, RoutePlan, SERVICE_CONNECT_TIMEOUT_SECONDS, ServicePlan, TargetPlan,
};
use crate::tls::UpstreamTls;
use halo_contract::names;

/// What the standalone bootstrap is rendered from, besides the snapshot: the gateway
/// settings (both modes' one settings type; `halo envoy bootstrap`'s flags fill it) and
/// what only a bootstrap has.
#[derive(Debug, Clone)]
pub struct Standalone {
    pub gateway: GatewaySettings,
    /// Admin address and port (stats, /ready). Keep it on loopback.
    pub admin_address: String,
    pub admin_port: u16,
}

impl Standalone {
    /// The plan for `snap`.
    pub fn plan(&self, snap: &Snapshot) -> Result<Plan, PlanError> {
        plan::plan(snap, &self.gateway)
    }
}

/// A one-endpoint cluster: DNS-resolved unless `resolve` is false (an IP literal; the
/// address family is a resolver setting, so only a resolved cluster has one); with `tls`,
/// the server verified as [`UpstreamTls`] says.
fn one_endpoint_cluster(
    name: &str,
    host: &str,
    port: u16,
    resolve: bool,
    tls: Option<&UpstreamTls>,
    connect_timeout_seconds: u32,
) -> Value {
    let mut c = json!({
        "name": name,
        // One endpoint per cluster: LOGICAL_DNS keeps connections across DNS answers
        // (a provider's many addresses) instead of draining them on each change.
        "type": if resolve { "LOGICAL_DNS" } else { "STATIC" },
        "connect_timeout": format!("{connect_timeout_seconds}s"),
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {
                "address": {"socket_address": {"address": host, "port_value": port}},
                "hostname": host,
            }}]}],
        },
    });
    if resolve {
        c["dns_lookup_family"] = json!("V4_PREFERRED");
    }
    if let Some(tls) = tls {
        c["transport_socket"] = tls.transport_socket();
    }
    c
}

/// A service cluster (the JWKS, the kill list, the evidence receiver), Envoy JSON.
pub fn service_cluster(s: &ServicePlan) -> Value {
    let mut c = one_endpoint_cluster(
        &s.cluster,
        &s.host,
        s.port,
        s.resolve,
        s.tls.as_ref(),
        s.connect_timeout_seconds,
    );
    if let Some(n) = s.max_in_flight {
        c["circuit_breakers"] = json!({"thresholds": [{
            "max_connections": n, "max_pending_requests": n, "max_requests": n, "max_retries": 0,
        }]});
    }
    if s.http2 {
        c["typed_extension_protocol_options"] = json!({
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            },
        });
    }
    c
}

/// A target's cluster, Envoy JSON: its endpoint carries the target's metadata. No outlier
/// detection: the breakers are the filter's (halo-filter-core's `breaker`).
pub fn target_cluster(t: &TargetPlan) -> Value {
    let mut c = one_endpoint_cluster(
        &t.name,
        &t.host,
        t.port,
        t.resolve,
        t.tls.as_ref(),
        t.connect_timeout_seconds,
    );
    let halo: serde_json::Map<String, Value> = t
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["metadata"] =
        json!({"filter_metadata": {names::METADATA_NAMESPACE: halo}});
    c
}

/// An aggregate cluster, Envoy JSON: its sub-clusters are priorities, tried in order; with
/// the plan's attempt stage, the per-attempt chain runs as its upstream HTTP filters.
pub fn aggregate_cluster(plan: &Plan, a: &AggregatePlan) -> Value {
    let mut aggregate = json!({
        "name": a.name,
        "connect_timeout": format!("{SERVICE_CONNECT_TIMEOUT_SECONDS}s"),
        "lb_policy": "CLUSTER_PROVIDED",
        "cluster_type": {
            "name": "envoy.clusters.aggregate",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig",
                "clusters": a.clusters,
            },
        },
    });
    if let Some(module) = &plan.attempt_stage {
        aggregate["typed_extension_protocol_options"] =
            attempt_protocol_options(module, &plan.attempt_targets(a));
    }
    aggregate
}

/// The model routes of `r`, in order: one per aggregate of its `aggregate_routes`
/// (matched on its name in the route header) whose retry policy has that aggregate's
/// `per_try_timeout` and retries, then the route for every other aggregate
/// (`cluster_header`).
pub fn model_routes(r: &RoutePlan) -> Vec<Value> {
    let route = |name: &str, matcher: Value, target: (&str, &str), own: Option<&AggregateRoute>| {
        let mut retry = retry_policy(r);
        if let Some(own) = own {
            retry["num_retries"] = json!(own.num_retries);
            if let Some(secs) = own.per_try_timeout_seconds {
                retry["per_try_timeout"] = json!(format!("{secs}s"));
            }
        }
        let mut action = json!({
            target.0: target.1,
            // Streams have no total limit; idleness ends them.
            "timeout": "0s",
            "idle_timeout": format!("{}s", r.idle_timeout_seconds),
            "retry_policy": retry,
        });
        if r.auto_host_rewrite {
            action["auto_host_rewrite"] = json!(true);
        }
        json!({
            "name": name,
            "match": matcher,
            "route": action,
            "request_headers_to_remove": r.request_headers_to_remove,
        })
    };
    let mut routes: Vec<Value> = r
        .aggregate_routes
        .iter()
        .map(|(aggregate, own)| {
            route(
                aggregate,
                json!({"prefix": "/", "headers": [{
                    "name": r.cluster_header,
                    "string_match": {"exact": aggregate},
                }]}),
                ("cluster", aggregate),
                Some(own),
            )
        })
        .collect();
    routes.push(route(
        BY_ROUTE_HEADER,
        json!({"prefix": "/"}),
        ("cluster_header", &r.cluster_header),
        None,
    ));
    routes
}

/// The retry policy of the model route `r`: move on after what `r.retry_on` says, each
/// retry to the next sub-cluster (priority) of the aggregate not yet tried.
pub fn retry_policy(r: &RoutePlan) -> Value {
    json!({
        "retry_on": r.retry_on,
        "retriable_status_codes": r.retriable_status_codes,
        "num_retries": r.num_retries,
        "retry_priority": {
            "name": "envoy.retry_priorities.previous_priorities",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
                "update_frequency": 1,
            },
        },
    })
}

/// What halo-server pushes in the filter's configuration besides the policy (xDS mode):
/// the lists that change without a policy merge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pushed {
    /// The signed kill-list envelope as JSON text (`killList`): the filter verifies it
    /// with the kill public key exactly as a polled one.
    pub kill_list: Option<String>,
    /// The `routeTo` budgets spent now (`budgetsExhausted`): the filter sends their
    /// callers' aliases to the cheaper ones before routing.
    pub budgets_exhausted: Vec<halo_policy::budgets::Exhausted>,
}

impl Pushed {
    /// The configuration keys this adds, as one text: what a snapshot version hashes.
    pub fn digest_text(&self) -> String {
        format!(
            "{}\n{}",
            self.kill_list.as_deref().unwrap_or_default(),
            serde_json::to_string(&self.budgets_exhausted).unwrap_or_default()
        )
    }
}

/// The halo filter of `f` (either build) with its configuration `{snapshot, settings}`,
/// plus what halo-server pushes ([`Pushed`]: `killList`, `budgetsExhausted`) when there
/// is any; named `f.name`.
pub fn planned_filter(f: &FilterPlan, snap: &Snapshot, pushed: &Pushed) -> Value {
    let mut configuration = filter_configuration(snap, &f.settings);
    if let Some(envelope) = &pushed.kill_list {
        configuration["killList"] = Value::String(envelope.to_string());
    }
    if !pushed.budgets_exhausted.is_empty() {
        configuration["budgetsExhausted"] = json!(pushed.budgets_exhausted);
    }
    let mut filter = halo_filter_with(&f.module, &configuration);
    filter["name"] = json!(f.name);
    filter
}

/// The spellings of the `Bearer` authorization scheme jwt_authn takes a token after.
pub const BEARER_SCHEMES: [&str; 3] = ["Bearer", "bearer", "BEARER"];

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
        // `Authorization: <scheme> <token>`, the scheme in any of its usual spellings:
        // it is case-insensitive (RFC 7235), and Envoy matches a prefix exactly (its
        // default, `Bearer ` only, refused `bearer <token>` with a 401).
        let mut from_headers: Vec<Value> = BEARER_SCHEMES
            .iter()
            .map(|s| json!({"name": "authorization", "value_prefix": format!("{s} ")}))
            .collect();
        if gemini {
            from_headers.push(json!({"name": "x-goog-api-key"}));
            p["from_params"] = json!(["key"]);
        }
        p["from_headers"] = Value::Array(from_headers);
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
    filter_instance(names::FILTER_NAME, module_path, &configuration.to_string())
}

/// The filter's per-attempt stage (`{"stage": "attempt"}`): the same module, run as an
/// upstream HTTP filter, once per attempt, after Envoy picked the endpoint.
pub fn attempt_filter(module_path: &str) -> Value {
    filter_instance(
        names::ATTEMPT_STAGE_NAME,
        module_path,
        ATTEMPT_STAGE_CONFIGURATION,
    )
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

pub use halo_contract::names::ATTEMPT_STAGE_CONFIGURATION;

/// An aggregate cluster's `typed_extension_protocol_options`: upstream HTTP filters, the
/// per-attempt stage then, when a target has a credential, the credential chain
/// ([`credentials::attempt_chain`]), then the upstream codec. Upstream filters must sit on
/// the aggregate: the ones on its sub-clusters do not run when a route goes through the
/// aggregate (seen in Envoy 1.40). The protocol (HTTP/1.1) is the sub-clusters' default.
pub fn attempt_protocol_options(wasm_path: &str, targets: &[AttemptTarget]) -> Value {
    json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http_protocol_options": {}},
            "http_filters": credentials::attempt_chain(attempt_filter(wasm_path), targets),
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
/// a runtime guard; e2e/tests/decision.rs checks the names both builds export.
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
pub fn standalone(snap: &Snapshot, opts: &Standalone) -> Result<Value, PlanError> {
    emit(snap, &opts.plan(snap)?, opts)
}

/// [`Plan`] as the standalone bootstrap.
fn emit(snap: &Snapshot, plan: &Plan, opts: &Standalone) -> Result<Value, PlanError> {
    let l = &plan.listener;
    let mut clusters: Vec<Value> = plan.targets.iter().map(target_cluster).collect();
    clusters.extend(plan.aggregates.iter().map(|a| aggregate_cluster(plan, a)));
    clusters.extend(l.services().into_iter().map(service_cluster));
    let mut http_filters: Vec<Value> = l.jwt_authn.iter().cloned().collect();
    http_filters.extend(
        l.filter
            .as_ref()
            .map(|f| planned_filter(f, snap, &Pushed::default())),
    );
    // After the halo filter: the budget check reads the facts it wrote.
    http_filters.extend(l.budgets.as_ref().map(|b| b.filter.clone()));
    http_filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
    }));

    let hcm = json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": l.name,
            "codec_type": "AUTO",
            "stream_idle_timeout": format!("{}s", l.stream_idle_timeout_seconds),
            "access_log": l.access_logs,
            "route_config": {
                "name": plan.route.name,
                "virtual_hosts": [{
                    "name": plan.route.name,
                    "domains": ["*"],
                    "routes": model_routes(&plan.route),
                }],
            },
            "http_filters": http_filters,
        },
    });
    let doc = json!({
        // SDS from a file (the Vertex token) needs a node id and cluster.
        "node": {"id": "halo", "cluster": "halo"},
        "admin": {"address": {"socket_address": {"address": opts.admin_address, "port_value": opts.admin_port}}},
        "stats_config": {"stats_tags": stats_tags()},
        "layered_runtime": runtime(),
        "static_resources": {
            "listeners": [{
                "name": l.name,
                "address": {"socket_address": {"address": l.address, "port_value": l.port}},
                "per_connection_buffer_limit_bytes": l.per_connection_buffer_limit_bytes,
                "filter_chains": [{"filters": [hcm]}],
            }],
            "clusters": clusters,
        },
    });
    Ok(doc)
}

/// The standalone bootstrap as the YAML file `halo envoy bootstrap` writes: a header
/// saying where it came from (plus any `warnings`, each as a `# WARNING:` line), then the
/// document.
pub fn standalone_yaml(
    snap: &Snapshot,
    opts: &Standalone,
    source: &str,
    warnings: &[String],
) -> Result<String, PlanError> {
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
}
