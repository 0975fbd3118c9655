//! A [`Plan`] (halo-envoy-config's gateway plan) as Envoy resources, one to one: the xDS
//! emitter, as halo-envoy-config's `bootstrap` is the standalone one. Nothing is decided
//! here.

use envoy_types::pb::envoy::config::accesslog::v3::{
    AccessLog, AccessLogFilter, HeaderFilter, access_log, access_log_filter,
};
use envoy_types::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, circuit_breakers,
    cluster::{ClusterDiscoveryType, CustomClusterType, DiscoveryType, DnsLookupFamily, LbPolicy},
};
use envoy_types::pb::envoy::config::core::v3::Address;
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, DataSource, ExtensionConfigSource,
    SocketAddress, TransportSocket, TypedExtensionConfig, address,
    config_source::ConfigSourceSpecifier, data_source, socket_address::PortSpecifier,
    transport_socket,
};
use envoy_types::pb::envoy::config::core::v3::{Http1ProtocolOptions, Http2ProtocolOptions};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::RetryPolicy;
use envoy_types::pb::envoy::config::route::v3::{
    HeaderMatcher, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
    header_matcher::HeaderMatchSpecifier, retry_policy, route::Action,
    route_action::ClusterSpecifier, route_action::HostRewriteSpecifier, route_match::PathSpecifier,
};
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager::RouteSpecifier, http_filter,
};
use envoy_types::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SubjectAltNameMatcher, UpstreamTlsContext,
    common_tls_context::ValidationContextType, subject_alt_name_matcher::SanType,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions,
    http_protocol_options::{
        ExplicitHttpConfig, UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
    },
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_types::pb::google::protobuf::{
    Any, BoolValue, Duration, UInt32Value, Value, value::Kind,
};
use prost::{Message, Name};

use halo_envoy_config::credentials::{self, AttemptTarget};
use halo_envoy_config::tls::{San, UpstreamTls};

use crate::cache::Resource;
use halo_envoy_config::plan::{
    AggregatePlan, AggregateRoute, BY_ROUTE_HEADER, ListenerPlan, Plan, RoutePlan,
    SERVICE_CONNECT_TIMEOUT_SECONDS, ServicePlan, TargetPlan,
};

use halo_contract::names::METADATA_NAMESPACE;

fn any<T: Message + Name>(m: &T) -> Any {
    Any {
        type_url: T::type_url(),
        value: m.encode_to_vec(),
    }
}

fn seconds(s: u32) -> Duration {
    Duration {
        seconds: i64::from(s),
        nanos: 0,
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

fn ads() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..ConfigSource::default()
    }
}

fn socket(host: &str, port: u16) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: host.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(u32::from(port))),
            ..SocketAddress::default()
        })),
    }
}

/// Every resource of `plan`: clusters (targets, then aggregates), the listener, the route
/// configuration.
pub fn resources(plan: &Plan) -> Vec<Resource> {
    let mut out = Vec::new();
    for t in &plan.targets {
        out.push(Resource {
            name: t.name.clone(),
            body: Any {
                type_url: Cluster::type_url(),
                value: target_cluster_bytes(t),
            },
        });
    }
    for a in &plan.aggregates {
        out.push(Resource::new(
            &a.name,
            &aggregate_cluster(a, plan.attempt_stage.as_deref(), &plan.attempt_targets(a)),
        ));
    }
    // The JWKS cluster jwt_authn fetches keys through, the kill-list cluster the filter's
    // poll (the fallback to the pushed kill list) goes through, and the evidence
    // receiver's, which the OpenTelemetry access logger sends to, the default
    // upstream's, the mirror service's (the filter's shadow jobs) and the budget service's.
    for s in plan.listener.services() {
        out.push(Resource::new(&s.cluster, &service_cluster(s)));
    }
    out.push(Resource::new(
        &plan.listener.name,
        &listener(&plan.listener),
    ));
    out.push(Resource::new(
        &plan.route.name,
        &route_configuration(&plan.route),
    ));
    out
}

/// A target's one-endpoint cluster, encoded (no outlier detection: the breakers are the
/// filter's).
///
/// Encoded by hand around the endpoint metadata: prost holds protobuf maps (Metadata,
/// Struct) in a HashMap, whose order changes from one build of the value to the next,
/// and the cache versions a type by the digest of its bytes. So the metadata is written
/// with sorted keys and spliced in; protobuf allows fields in any order.
pub fn target_cluster_bytes(t: &TargetPlan) -> Vec<u8> {
    let mut st = Vec::new();
    // Sorted by key already (halo-envoy-config's target_metadata).
    for (k, v) in &t.metadata {
        let mut entry = Vec::new();
        len_delimited(1, k.as_bytes(), &mut entry);
        len_delimited(2, &string(v).encode_to_vec(), &mut entry);
        len_delimited(1, &entry, &mut st);
    }
    let mut md_entry = Vec::new();
    len_delimited(1, METADATA_NAMESPACE.as_bytes(), &mut md_entry);
    len_delimited(2, &st, &mut md_entry);
    let mut metadata = Vec::new();
    len_delimited(1, &md_entry, &mut metadata);

    let mut lb_endpoint = LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
            address: Some(socket(&t.host, t.port)),
            hostname: t.host.clone(),
            ..Endpoint::default()
        })),
        ..LbEndpoint::default()
    }
    .encode_to_vec();
    len_delimited(3, &metadata, &mut lb_endpoint); // LbEndpoint.metadata
    let mut locality = LocalityLbEndpoints::default().encode_to_vec();
    len_delimited(2, &lb_endpoint, &mut locality); // LocalityLbEndpoints.lb_endpoints
    let mut assignment = ClusterLoadAssignment {
        cluster_name: t.name.clone(),
        ..ClusterLoadAssignment::default()
    }
    .encode_to_vec();
    len_delimited(2, &locality, &mut assignment); // ClusterLoadAssignment.endpoints
    let mut cluster = target_cluster_without_endpoint(t).encode_to_vec();
    len_delimited(33, &assignment, &mut cluster); // Cluster.load_assignment
    cluster
}

fn len_delimited(tag: u32, bytes: &[u8], out: &mut Vec<u8>) {
    prost::encoding::encode_key(tag, prost::encoding::WireType::LengthDelimited, out);
    prost::encoding::encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// The target's cluster as a value (decoded from [`target_cluster_bytes`]).
pub fn target_cluster(t: &TargetPlan) -> Cluster {
    Cluster::decode(target_cluster_bytes(t).as_slice())
        .unwrap_or_else(|_| target_cluster_without_endpoint(t))
}

fn target_cluster_without_endpoint(t: &TargetPlan) -> Cluster {
    one_endpoint_cluster(
        &t.name,
        t.resolve,
        t.tls.as_ref(),
        t.connect_timeout_seconds,
    )
}

/// A one-endpoint cluster without its endpoint: logical DNS when `resolve` (with the
/// address family, a resolver setting), else static; TLS as `tls` says.
fn one_endpoint_cluster(
    name: &str,
    resolve: bool,
    tls: Option<&UpstreamTls>,
    connect_timeout_seconds: u32,
) -> Cluster {
    let discovery = if resolve {
        DiscoveryType::LogicalDns
    } else {
        DiscoveryType::Static
    };
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(discovery as i32)),
        dns_lookup_family: if resolve {
            DnsLookupFamily::V4Preferred as i32
        } else {
            DnsLookupFamily::default() as i32
        },
        connect_timeout: Some(seconds(connect_timeout_seconds)),
        transport_socket: tls.map(transport_socket),
        ..Cluster::default()
    }
}

/// An https cluster's transport socket: halo-envoy-config's [`UpstreamTls`] decision
/// (its `transport_socket` JSON, for the standalone bootstrap) as protobuf.
pub fn transport_socket(t: &UpstreamTls) -> TransportSocket {
    let (san_type, san) = match &t.san {
        San::Dns(h) => (SanType::Dns, h),
        San::IpAddress(ip) => (SanType::IpAddress, ip),
    };
    let tls = UpstreamTlsContext {
        sni: t.sni.clone().unwrap_or_default(),
        common_tls_context: Some(CommonTlsContext {
            alpn_protocols: vec![t.alpn.clone()],
            validation_context_type: Some(ValidationContextType::ValidationContext(
                CertificateValidationContext {
                    trusted_ca: Some(DataSource {
                        specifier: Some(data_source::Specifier::Filename(t.trusted_ca.clone())),
                        ..DataSource::default()
                    }),
                    match_typed_subject_alt_names: vec![SubjectAltNameMatcher {
                        san_type: san_type as i32,
                        matcher: Some(StringMatcher {
                            match_pattern: Some(MatchPattern::Exact(san.clone())),
                            ..StringMatcher::default()
                        }),
                        ..SubjectAltNameMatcher::default()
                    }],
                    ..CertificateValidationContext::default()
                },
            )),
            ..CommonTlsContext::default()
        }),
        ..UpstreamTlsContext::default()
    };
    TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(any(&tls))),
    }
}

/// An aggregate cluster: its sub-clusters are priorities, tried in order. With
/// `attempt_stage` (the wasm path), the filter's per-attempt stage runs as its upstream
/// HTTP filter, once per attempt (halo-envoy-config's `attempt_protocol_options`, the
/// standalone bootstrap's, as protobuf).
pub fn aggregate_cluster(
    a: &AggregatePlan,
    attempt_stage: Option<&str>,
    targets: &[AttemptTarget],
) -> Cluster {
    let config = ClusterConfig {
        clusters: a.clusters.clone(),
    };
    let mut typed_extension_protocol_options = std::collections::HashMap::new();
    if let Some(wasm_path) = attempt_stage {
        let stage = halo_envoy_config::bootstrap::attempt_filter(wasm_path);
        let chain = credentials::attempt_chain(stage, targets);
        let options = HttpProtocolOptions {
            upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                        Http1ProtocolOptions::default(),
                    )),
                },
            )),
            http_filters: chain
                .iter()
                .map(|f| HttpFilter {
                    name: f["name"].as_str().unwrap_or_default().to_string(),
                    config_type: Some(http_filter::ConfigType::TypedConfig(typed_struct(
                        &f["typed_config"],
                    ))),
                    ..HttpFilter::default()
                })
                .collect(),
            ..HttpProtocolOptions::default()
        };
        // One key: the map's order cannot change the bytes.
        typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_string(),
            any(&options),
        );
    }
    Cluster {
        typed_extension_protocol_options,
        name: a.name.clone(),
        cluster_discovery_type: Some(ClusterDiscoveryType::ClusterType(CustomClusterType {
            name: "envoy.clusters.aggregate".into(),
            typed_config: Some(any(&config)),
        })),
        lb_policy: LbPolicy::ClusterProvided as i32,
        connect_timeout: Some(seconds(SERVICE_CONNECT_TIMEOUT_SECONDS)),
        ..Cluster::default()
    }
}

/// The model routes (halo-envoy-config's `model_routes`, the standalone bootstrap's): one
/// per aggregate of the plan's `aggregate_routes` (matched on its name in the route
/// header, with its own per-try timeout and retries), then the route for every other
/// aggregate (cluster from the filter's header). Retries walk the failover order.
pub fn route_configuration(r: &RoutePlan) -> RouteConfiguration {
    let retry_policy = |own: Option<&AggregateRoute>| RetryPolicy {
        retry_on: r.retry_on.clone(),
        num_retries: Some(UInt32Value {
            value: own.map_or(r.num_retries, |o| o.num_retries),
        }),
        retriable_status_codes: r.retriable_status_codes.clone(),
        per_try_timeout: own.and_then(|o| o.per_try_timeout_seconds).map(seconds),
        // Each retry goes to the next priority (sub-cluster) not yet tried.
        retry_priority: Some(retry_policy::RetryPriority {
            name: "envoy.retry_priorities.previous_priorities".into(),
            config_type: Some(retry_policy::retry_priority::ConfigType::TypedConfig(any(
                &PreviousPrioritiesConfig {
                    update_frequency: 1,
                },
            ))),
        }),
        ..RetryPolicy::default()
    };
    let route = |name: &str, headers: Vec<HeaderMatcher>, cluster, per_try| Route {
        name: name.to_string(),
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::Prefix("/".into())),
            headers,
            ..RouteMatch::default()
        }),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(cluster),
            // Streams are never time-limited as a whole; idleness ends them.
            timeout: Some(seconds(0)),
            idle_timeout: Some(seconds(r.idle_timeout_seconds)),
            retry_policy: Some(retry_policy(per_try)),
            host_rewrite_specifier: r.auto_host_rewrite.then_some(
                HostRewriteSpecifier::AutoHostRewrite(BoolValue { value: true }),
            ),
            ..RouteAction::default()
        })),
        request_headers_to_remove: r.request_headers_to_remove.clone(),
        ..Route::default()
    };
    let mut routes: Vec<Route> = r
        .aggregate_routes
        .iter()
        .map(|(aggregate, own)| {
            route(
                aggregate,
                vec![HeaderMatcher {
                    name: r.cluster_header.clone(),
                    header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(
                        StringMatcher {
                            match_pattern: Some(MatchPattern::Exact(aggregate.clone())),
                            ..StringMatcher::default()
                        },
                    )),
                    ..HeaderMatcher::default()
                }],
                ClusterSpecifier::Cluster(aggregate.clone()),
                Some(own),
            )
        })
        .collect();
    routes.push(route(
        BY_ROUTE_HEADER,
        Vec::new(),
        ClusterSpecifier::ClusterHeader(r.cluster_header.clone()),
        None,
    ));
    RouteConfiguration {
        name: r.name.clone(),
        virtual_hosts: vec![VirtualHost {
            name: r.name.clone(),
            domains: vec!["*".into()],
            routes,
            ..VirtualHost::default()
        }],
        ..RouteConfiguration::default()
    }
}

/// The listener: HTTP connection manager with routes from RDS over ADS; filters jwt_authn
/// (when the policy names an issuer), the halo filter (configuration by ECDS), router.
pub fn listener(l: &ListenerPlan) -> Listener {
    let mut http_filters = Vec::new();
    if let Some(jwt) = &l.jwt_authn {
        http_filters.push(HttpFilter {
            name: "envoy.filters.http.jwt_authn".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(typed_struct(
                &jwt["typed_config"],
            ))),
            ..HttpFilter::default()
        });
    }
    if let Some(f) = &l.filter {
        http_filters.push(HttpFilter {
            name: f.name.clone(),
            config_type: Some(http_filter::ConfigType::ConfigDiscovery(
                ExtensionConfigSource {
                    config_source: Some(ads()),
                    // Either build of the filter: wasm, or the native dynamic module.
                    type_urls: vec![
                        "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm".into(),
                        "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter".into(),
                    ],
                    ..ExtensionConfigSource::default()
                },
            )),
            ..HttpFilter::default()
        });
    }
    // After the halo filter: the budget check reads the facts it wrote.
    if let Some(b) = &l.budgets {
        http_filters.push(HttpFilter {
            name: halo_envoy_config::budget::FILTER_NAME.into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(typed_struct(
                &b.filter["typed_config"],
            ))),
            ..HttpFilter::default()
        });
    }
    http_filters.push(HttpFilter {
        name: "envoy.filters.http.router".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(
            any(&Router::default()),
        )),
        ..HttpFilter::default()
    });
    let hcm = HttpConnectionManager {
        stat_prefix: l.name.clone(),
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: Some(ads()),
            route_config_name: l.route_config_name.clone(),
        })),
        stream_idle_timeout: Some(seconds(l.stream_idle_timeout_seconds)),
        access_log: l.access_logs.iter().map(access_logger).collect(),
        http_filters,
        ..HttpConnectionManager::default()
    };
    Listener {
        name: l.name.clone(),
        address: Some(socket(&l.address, l.port)),
        per_connection_buffer_limit_bytes: Some(UInt32Value {
            value: l.per_connection_buffer_limit_bytes,
        }),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))),
            }],
            ..FilterChain::default()
        }],
        ..Listener::default()
    }
}

/// An access logger of the plan (Envoy JSON: name, typed_config, and an optional
/// `filter`) as protobuf.
pub fn access_logger(log: &serde_json::Value) -> AccessLog {
    AccessLog {
        name: log["name"].as_str().unwrap_or_default().to_string(),
        filter: log.get("filter").map(access_log_filter),
        config_type: Some(access_log::ConfigType::TypedConfig(typed_struct(
            &log["typed_config"],
        ))),
    }
}

/// An access log's `filter`: the one kind the plan uses, a header filter on a header's
/// presence (the evidence logger keeps to calls the filter stamped). Any other shape
/// becomes a header matcher without a name, which Envoy refuses (the listener update is
/// NACKed and shows in /xds/status): a filter this emitter does not know is never dropped
/// silently, which would export every request.
fn access_log_filter(f: &serde_json::Value) -> AccessLogFilter {
    let header = &f["header_filter"]["header"];
    let name = match (header["name"].as_str(), header["present_match"].as_bool()) {
        (Some(name), Some(true)) if f.as_object().is_some_and(|m| m.len() == 1) => name,
        _ => "",
    };
    AccessLogFilter {
        filter_specifier: Some(access_log_filter::FilterSpecifier::HeaderFilter(
            HeaderFilter {
                header: Some(HeaderMatcher {
                    name: name.to_string(),
                    header_match_specifier: Some(HeaderMatchSpecifier::PresentMatch(true)),
                    ..HeaderMatcher::default()
                }),
            },
        )),
    }
}

/// An Envoy JSON `typed_config` (with its `@type`) as an `Any` holding an
/// `xds.type.v3.TypedStruct`: Envoy converts it to the named message when it loads the
/// filter. This lets the listener reuse halo-envoy-config's JSON builders (the standalone
/// bootstrap's) instead of a second, protobuf copy of them.
///
/// The Struct is encoded by hand with sorted keys (prost holds Struct fields in a
/// HashMap), so equal JSON always gives equal bytes and the cache does not see a change.
pub fn typed_struct(typed_config: &serde_json::Value) -> Any {
    let type_url = typed_config
        .get("@type")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    let mut body = typed_config.clone();
    if let Some(m) = body.as_object_mut() {
        m.remove("@type");
    }
    let mut out = Vec::new();
    if !type_url.is_empty() {
        len_delimited(1, type_url.as_bytes(), &mut out);
    }
    len_delimited(2, &struct_bytes(&body), &mut out);
    Any {
        type_url: "type.googleapis.com/xds.type.v3.TypedStruct".into(),
        value: out,
    }
}

/// google.protobuf.Struct bytes of a JSON object (anything else: an empty Struct).
fn struct_bytes(v: &serde_json::Value) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(m) = v.as_object() {
        let mut keys: Vec<&String> = m.keys().collect();
        keys.sort();
        for k in keys {
            let mut entry = Vec::new();
            len_delimited(1, k.as_bytes(), &mut entry);
            len_delimited(2, &value_bytes(&m[k]), &mut entry);
            len_delimited(1, &entry, &mut out);
        }
    }
    out
}

/// google.protobuf.Value bytes of a JSON value.
fn value_bytes(v: &serde_json::Value) -> Vec<u8> {
    use prost::encoding::{WireType, encode_key, encode_varint};
    let mut out = Vec::new();
    match v {
        serde_json::Value::Null => {
            encode_key(1, WireType::Varint, &mut out);
            encode_varint(0, &mut out);
        }
        serde_json::Value::Number(n) => {
            encode_key(2, WireType::SixtyFourBit, &mut out);
            out.extend_from_slice(&n.as_f64().unwrap_or(0.0).to_le_bytes());
        }
        serde_json::Value::String(s) => len_delimited(3, s.as_bytes(), &mut out),
        serde_json::Value::Bool(b) => {
            encode_key(4, WireType::Varint, &mut out);
            encode_varint(u64::from(*b), &mut out);
        }
        serde_json::Value::Object(_) => len_delimited(5, &struct_bytes(v), &mut out),
        serde_json::Value::Array(items) => {
            let mut list = Vec::new();
            for i in items {
                len_delimited(1, &value_bytes(i), &mut list);
            }
            len_delimited(6, &list, &mut out);
        }
    }
    out
}

/// A one-endpoint service cluster: the issuer's JWKS, the kill-list server, the evidence
/// receiver (HTTP/2).
pub fn service_cluster(j: &ServicePlan) -> Cluster {
    let mut typed_extension_protocol_options = std::collections::HashMap::new();
    if j.http2 {
        let options = HttpProtocolOptions {
            upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                        Http2ProtocolOptions::default(),
                    )),
                },
            )),
            ..HttpProtocolOptions::default()
        };
        // One key: the map's order cannot change the bytes.
        typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_string(),
            any(&options),
        );
    }
    let limit = |n: u32| Some(UInt32Value { value: n });
    let circuit_breakers = j.max_in_flight.map(|n| CircuitBreakers {
        thresholds: vec![circuit_breakers::Thresholds {
            max_connections: limit(n),
            max_pending_requests: limit(n),
            max_requests: limit(n),
            max_retries: limit(0),
            ..circuit_breakers::Thresholds::default()
        }],
        ..CircuitBreakers::default()
    });
    Cluster {
        typed_extension_protocol_options,
        circuit_breakers,
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: j.cluster.clone(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                        address: Some(socket(&j.host, j.port)),
                        hostname: j.host.clone(),
                        ..Endpoint::default()
                    })),
                    ..LbEndpoint::default()
                }],
                ..LocalityLbEndpoints::default()
            }],
            ..ClusterLoadAssignment::default()
        }),
        ..one_endpoint_cluster(
            &j.cluster,
            j.resolve,
            j.tls.as_ref(),
            j.connect_timeout_seconds,
        )
    }
}

/// The halo filter's ECDS resource: `filter` is halo-envoy-config's HTTP filter JSON
/// (`{name, typed_config}`, either build); its typed_config goes out as a TypedStruct.
pub fn filter_config(name: &str, filter: &serde_json::Value) -> Resource {
    let config = TypedExtensionConfig {
        name: name.to_string(),
        typed_config: Some(typed_struct(&filter["typed_config"])),
    };
    Resource::new(name, &config)
}
