//! The example policy's xDS resources: deterministic (equal bytes, equal version) and
//! complete. The plan they are emitted from is golden-tested in halo-envoy-config
//! (`envoy-config/tests/golden.rs`).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use halo_xds::{GatewaySettings, plan, snapshot_of, type_url};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xds lives under the workspace root")
        .to_path_buf()
}

fn acme() -> halo_policy::Snapshot {
    let org =
        halo_policy::load::load_dir(&root().join("examples/acme-corp")).expect("example loads");
    halo_policy::compile(&org)
}

#[test]
fn acme_corp_translation_is_deterministic_and_complete() {
    let settings = GatewaySettings::default();
    let a = snapshot_of(&acme(), &settings).expect("translates");
    let b = snapshot_of(&acme(), &settings).expect("translates");
    assert_eq!(a.version, b.version);
    assert_eq!(a.resources, b.resources);
    let plan = plan(&acme(), &settings).expect("translates");
    let clusters = &a.resources[type_url::CLUSTER];
    // Targets, aggregates and the issuer's JWKS cluster (acme-corp names an issuer).
    assert!(plan.listener.jwks.is_some());
    assert_eq!(
        clusters.len(),
        plan.targets.len() + plan.aggregates.len() + 1
    );
    // The halo filter's configuration travels by ECDS.
    assert_eq!(a.resources[type_url::EXTENSION_CONFIG].len(), 1);
    // Every aggregate lists only sub-clusters that exist, and every alias has `<alias>-0`.
    let names: std::collections::BTreeSet<&str> =
        plan.targets.iter().map(|t| t.name.as_str()).collect();
    for agg in &plan.aggregates {
        assert!(!agg.clusters.is_empty());
        assert!(
            agg.clusters.iter().all(|c| names.contains(c.as_str())),
            "{}",
            agg.name
        );
    }
    for alias in acme().models.keys() {
        assert!(
            plan.aggregates
                .iter()
                .any(|a| a.name == format!("{alias}-0"))
        );
    }
    assert_eq!(a.resources[type_url::LISTENER].len(), 1);
    assert_eq!(a.resources[type_url::ROUTE].len(), 1);
    // A settings change is a new version even when the policy is the same.
    let other = GatewaySettings {
        max_attempts: 2,
        ..GatewaySettings::default()
    };
    assert_ne!(
        snapshot_of(&acme(), &other).expect("translates").version,
        a.version
    );
}

/// The evidence export (the gateway file's `evidence`) as xDS resources: the receiver's
/// cluster over HTTP/2, and on the listener the OpenTelemetry access logger with its
/// header filter (only calls the filter stamped) and the token as gRPC metadata.
#[test]
fn the_evidence_export_is_an_http2_cluster_and_a_filtered_access_logger() {
    use envoy_types::pb::envoy::config::accesslog::v3::access_log_filter::FilterSpecifier;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
    use envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
        UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
    };
    use prost::Message;

    let token = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
    let settings = GatewaySettings {
        evidence: Some(halo_envoy_config::evidence::Export {
            url: "http://10.0.0.7:4319".into(),
            token_file: None,
            token: token.into(),
        }),
        ..GatewaySettings::default()
    };
    let without = snapshot_of(&acme(), &GatewaySettings::default()).expect("translates");
    let with = snapshot_of(&acme(), &settings).expect("translates");
    let clusters = &with.resources[type_url::CLUSTER];
    assert_eq!(
        clusters.len(),
        without.resources[type_url::CLUSTER].len() + 1
    );
    let evidence = clusters
        .iter()
        .find(|r| r.name == halo_envoy_config::evidence::EVIDENCE_CLUSTER)
        .expect("the evidence cluster");
    let cluster = Cluster::decode(evidence.body.value.as_slice()).expect("a cluster");
    let options = HttpProtocolOptions::decode(
        cluster.typed_extension_protocol_options
            ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
            .value
            .as_slice(),
    )
    .expect("protocol options");
    let Some(UpstreamProtocolOptions::ExplicitHttpConfig(explicit)) =
        options.upstream_protocol_options
    else {
        panic!("explicit HTTP config: {options:?}");
    };
    assert!(matches!(
        explicit.protocol_config,
        Some(ProtocolConfig::Http2ProtocolOptions(_))
    ));

    let listener = &with.resources[type_url::LISTENER][0];
    let listener = Listener::decode(listener.body.value.as_slice()).expect("a listener");
    let Some(filter::ConfigType::TypedConfig(hcm)) =
        &listener.filter_chains[0].filters[0].config_type
    else {
        panic!("typed HCM");
    };
    let hcm = HttpConnectionManager::decode(hcm.value.as_slice()).expect("HCM");
    assert_eq!(hcm.access_log.len(), 2, "the request log and the evidence");
    let otel = &hcm.access_log[1];
    assert_eq!(otel.name, halo_envoy_config::evidence::ACCESS_LOGGER);
    let Some(FilterSpecifier::HeaderFilter(h)) = otel
        .filter
        .as_ref()
        .and_then(|f| f.filter_specifier.clone())
    else {
        panic!("a header filter: {:?}", otel.filter);
    };
    let header = h.header.expect("header");
    assert_eq!(header.name, "x-halo-ring");
    assert_eq!(
        header.header_match_specifier,
        Some(HeaderMatchSpecifier::PresentMatch(true))
    );
    assert!(
        hcm.access_log[0].filter.is_none(),
        "the request log is unfiltered"
    );
    let bytes = listener.encode_to_vec();
    assert!(
        bytes.windows(token.len()).any(|w| w == token.as_bytes()),
        "the token rides in the pushed listener, as gRPC metadata"
    );
}
