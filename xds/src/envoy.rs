//! A [`Plan`] as Envoy resources, one to one. Nothing is decided here.

use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster, OutlierDetection,
    cluster::{ClusterDiscoveryType, CustomClusterType, DiscoveryType, DnsLookupFamily, LbPolicy},
};
use envoy_types::pb::envoy::config::core::v3::Address;
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, DataSource, SocketAddress, TransportSocket,
    address, config_source::ConfigSourceSpecifier, data_source, socket_address::PortSpecifier,
    transport_socket,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::RetryPolicy;
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, retry_policy, route::Action,
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
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_types::pb::google::protobuf::{
    Any, BoolValue, Duration, UInt32Value, Value, value::Kind,
};
use prost::{Message, Name};

use crate::cache::Resource;
use crate::translate::{AggregatePlan, ListenerPlan, Plan, RoutePlan, TargetPlan};

/// Endpoint metadata namespace carrying a target's upstream, kind and model id.
pub const METADATA_NAMESPACE: &str = "halo";

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
pub fn resources(plan: &Plan, upstream_ca_file: &str) -> Vec<Resource> {
    let mut out = Vec::new();
    for t in &plan.targets {
        out.push(Resource {
            name: t.name.clone(),
            body: Any {
                type_url: Cluster::type_url(),
                value: target_cluster_bytes(t, upstream_ca_file),
            },
        });
    }
    for a in &plan.aggregates {
        out.push(Resource::new(&a.name, &aggregate_cluster(a)));
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

/// A one-endpoint cluster whose outlier detection is the target's breaker, encoded.
///
/// Encoded by hand around the endpoint metadata: prost holds protobuf maps (Metadata,
/// Struct) in a HashMap, whose order changes from one build of the value to the next,
/// and the cache versions a type by the digest of its bytes. So the metadata is written
/// with sorted keys and spliced in; protobuf allows fields in any order.
pub fn target_cluster_bytes(t: &TargetPlan, upstream_ca_file: &str) -> Vec<u8> {
    let mut fields = vec![
        ("kind", t.kind.as_str()),
        ("model", t.model.as_str()),
        ("upstream", t.upstream.as_str()),
    ];
    fields.sort();
    let mut st = Vec::new();
    for (k, v) in fields {
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
    let mut cluster = target_cluster_without_endpoint(t, upstream_ca_file).encode_to_vec();
    len_delimited(33, &assignment, &mut cluster); // Cluster.load_assignment
    cluster
}

fn len_delimited(tag: u32, bytes: &[u8], out: &mut Vec<u8>) {
    prost::encoding::encode_key(tag, prost::encoding::WireType::LengthDelimited, out);
    prost::encoding::encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// The target's cluster as a value (decoded from [`target_cluster_bytes`]).
pub fn target_cluster(t: &TargetPlan, upstream_ca_file: &str) -> Cluster {
    Cluster::decode(target_cluster_bytes(t, upstream_ca_file).as_slice())
        .unwrap_or_else(|_| target_cluster_without_endpoint(t, upstream_ca_file))
}

fn target_cluster_without_endpoint(t: &TargetPlan, upstream_ca_file: &str) -> Cluster {
    let discovery = if t.resolve {
        DiscoveryType::LogicalDns
    } else {
        DiscoveryType::Static
    };
    let transport_socket = t.tls_sni.as_ref().map(|sni| {
        let tls = UpstreamTlsContext {
            sni: sni.clone(),
            common_tls_context: Some(CommonTlsContext {
                alpn_protocols: vec!["http/1.1".into()],
                validation_context_type: Some(ValidationContextType::ValidationContext(
                    CertificateValidationContext {
                        trusted_ca: Some(DataSource {
                            specifier: Some(data_source::Specifier::Filename(
                                upstream_ca_file.to_string(),
                            )),
                            ..DataSource::default()
                        }),
                        match_typed_subject_alt_names: vec![SubjectAltNameMatcher {
                            san_type: SanType::Dns as i32,
                            matcher: Some(StringMatcher {
                                match_pattern: Some(MatchPattern::Exact(sni.clone())),
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
    });
    Cluster {
        name: t.name.clone(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(discovery as i32)),
        dns_lookup_family: DnsLookupFamily::V4Preferred as i32,
        connect_timeout: Some(seconds(t.connect_timeout_seconds)),
        outlier_detection: Some(OutlierDetection {
            consecutive_5xx: Some(UInt32Value {
                value: t.breaker.consecutive_failures,
            }),
            base_ejection_time: Some(seconds(t.breaker.open_seconds)),
            // One host per cluster: the default cap (10%) must not keep it in.
            max_ejection_percent: Some(UInt32Value { value: 100 }),
            ..OutlierDetection::default()
        }),
        transport_socket,
        ..Cluster::default()
    }
}

/// An aggregate cluster: its sub-clusters are priorities, tried in order.
pub fn aggregate_cluster(a: &AggregatePlan) -> Cluster {
    let config = ClusterConfig {
        clusters: a.clusters.clone(),
    };
    Cluster {
        name: a.name.clone(),
        cluster_discovery_type: Some(ClusterDiscoveryType::ClusterType(CustomClusterType {
            name: "envoy.clusters.aggregate".into(),
            typed_config: Some(any(&config)),
        })),
        lb_policy: LbPolicy::ClusterProvided as i32,
        connect_timeout: Some(seconds(5)),
        ..Cluster::default()
    }
}

/// The one route: cluster from the filter's header, retries walk the failover order.
pub fn route_configuration(r: &RoutePlan) -> RouteConfiguration {
    let retry_policy = RetryPolicy {
        retry_on: r.retry_on.clone(),
        num_retries: Some(UInt32Value {
            value: r.num_retries,
        }),
        retriable_status_codes: r.retriable_status_codes.clone(),
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
    let action = RouteAction {
        cluster_specifier: Some(ClusterSpecifier::ClusterHeader(r.cluster_header.clone())),
        // Streams are never time-limited as a whole; idleness ends them.
        timeout: Some(seconds(0)),
        idle_timeout: Some(seconds(r.idle_timeout_seconds)),
        retry_policy: Some(retry_policy),
        host_rewrite_specifier: r.auto_host_rewrite.then_some(
            HostRewriteSpecifier::AutoHostRewrite(BoolValue { value: true }),
        ),
        ..RouteAction::default()
    };
    RouteConfiguration {
        name: r.name.clone(),
        virtual_hosts: vec![VirtualHost {
            name: r.name.clone(),
            domains: vec!["*".into()],
            routes: vec![Route {
                name: "by-route-header".into(),
                r#match: Some(RouteMatch {
                    path_specifier: Some(PathSpecifier::Prefix("/".into())),
                    ..RouteMatch::default()
                }),
                action: Some(Action::Route(action)),
                request_headers_to_remove: r.request_headers_to_remove.clone(),
                ..Route::default()
            }],
            ..VirtualHost::default()
        }],
        ..RouteConfiguration::default()
    }
}

/// The listener: HTTP connection manager with routes from RDS over ADS, then the router.
pub fn listener(l: &ListenerPlan) -> Listener {
    let hcm = HttpConnectionManager {
        stat_prefix: l.name.clone(),
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: Some(ads()),
            route_config_name: l.route_config_name.clone(),
        })),
        stream_idle_timeout: Some(seconds(l.stream_idle_timeout_seconds)),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(
                any(&Router::default()),
            )),
            ..HttpFilter::default()
        }],
        ..HttpConnectionManager::default()
    };
    Listener {
        name: l.name.clone(),
        address: Some(socket(&l.address, l.port)),
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
