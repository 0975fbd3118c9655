//! Golden tests: the gateway plan of the acme-corp example under the default gateway
//! settings plus an evidence export (`tests/golden/acme-corp.plan.json`, every decision
//! as reviewed JSON, the OTLP token redacted), and
//! envoy/standalone.yaml, exactly what the standalone emitter makes of that example with
//! the documented flags. Regenerate with `UPDATE_GOLDEN=1 cargo test -p
//! halo-envoy-config` (the same as `halo envoy bootstrap --policy-dir examples/acme-corp
//! --killswitch-url https://halo-server.acme.internal/api/v1/gateway/killswitch
//! --killswitch-token-file ... --killswitch-pubkey ...`, with placeholders).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use halo_envoy_config::bootstrap::{Standalone, standalone_yaml};
use halo_envoy_config::plan::GatewaySettings;
use serde_json::json;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The options the committed file is rendered with (also `halo envoy bootstrap`'s defaults).
pub fn golden_options() -> Standalone {
    Standalone {
        gateway: GatewaySettings {
            listen_address: "0.0.0.0".into(),
            listen_port: 8080,
            wasm_path: "/etc/halos/halo_filter.wasm".into(),
            jwks_uri: Some("https://acme.okta.com/oauth2/aus9halos2acme7corp/v1/keys".into()),
            filter_settings: json!({"killSwitch": {
                "token": "REPLACE-WITH-THE-GATEWAY-TOKEN",
                "pubkey": "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAREPLACEWITHTHEKILLSWITCHPUBLICKEYPEM000000=\n-----END PUBLIC KEY-----\n",
            }}),
            killswitch_url: Some(
                "https://halo-server.acme.internal/api/v1/gateway/killswitch".into(),
            ),
            upstream_ca_file: halo_envoy_config::tls::DEFAULT_UPSTREAM_CA_FILE.into(),
            ..GatewaySettings::default()
        },
        admin_address: "127.0.0.1".into(),
        admin_port: 9901,
    }
}

fn acme() -> halo_policy::Snapshot {
    let org =
        halo_policy::load::load_dir(&root().join("examples/acme-corp")).expect("acme-corp loads");
    halo_policy::compile(&org)
}

/// The gateway settings the golden plan is made with: the defaults, plus the evidence
/// export to a gateway receiver (the xDS gateway file's `evidence` key).
pub fn golden_plan_settings() -> GatewaySettings {
    GatewaySettings {
        evidence: Some(halo_envoy_config::evidence::Export {
            url: "https://halo-server.acme.internal:4319".into(),
            token_file: Some("/etc/halo/otlp-gateway.token".into()),
            token: "REPLACE-WITH-THE-OTLP-GATEWAY-TOKEN".into(),
        }),
        ..GatewaySettings::default()
    }
}

#[test]
fn acme_corp_plan_matches_the_golden_file() {
    let plan =
        halo_envoy_config::plan::plan(&acme(), &golden_plan_settings()).expect("example plans");
    let mut actual = serde_json::to_string_pretty(&plan).expect("plan serializes");
    actual.push('\n');
    assert!(
        !actual.contains("REPLACE-WITH-THE-OTLP-GATEWAY-TOKEN"),
        "the token is never in the plan's JSON"
    );
    let path = root().join("envoy-config/tests/golden/acme-corp.plan.json");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &actual).expect("write golden file");
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 creates it)", path.display()));
    assert!(
        expected == actual,
        "{} differs from the plan: run UPDATE_GOLDEN=1 cargo test -p halo-envoy-config and review the diff",
        path.display()
    );
}

#[test]
fn standalone_yaml_matches_the_renderer() {
    let org =
        halo_policy::load::load_dir(&root().join("examples/acme-corp")).expect("acme-corp loads");
    let snap = halo_policy::compile(&org);
    let yaml =
        standalone_yaml(&snap, &golden_options(), "examples/acme-corp", &[]).expect("render");
    let path = root().join("envoy/standalone.yaml");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &yaml).expect("write golden");
    }
    let committed = std::fs::read_to_string(&path).expect("envoy/standalone.yaml exists");
    assert!(
        committed == yaml,
        "envoy/standalone.yaml is out of date: run UPDATE_GOLDEN=1 cargo test -p halo-envoy-config"
    );
}

#[test]
fn every_routed_upstream_has_a_cluster_and_jwt_authn_names_the_policy_identity() {
    let org =
        halo_policy::load::load_dir(&root().join("examples/acme-corp")).expect("acme-corp loads");
    let snap = halo_policy::compile(&org);
    let doc = halo_envoy_config::bootstrap::standalone(&snap, &golden_options()).expect("render");
    let clusters: Vec<&str> = doc["static_resources"]["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    // The model clusters carry the xDS translator's names: one aggregate per alias and
    // first pick, one sub-cluster per target.
    for (alias, route) in &snap.models {
        for (i, t) in route.iter().enumerate() {
            let agg = halo_policy::cluster_names::aggregate_cluster(
                halo_policy::cluster_names::RouteScope::Gateway,
                alias,
                i,
            );
            assert!(clusters.contains(&agg.as_str()), "{agg}: {clusters:?}");
            let sub = halo_policy::cluster_names::target_cluster(t);
            assert!(clusters.contains(&sub.as_str()), "{sub}: {clusters:?}");
        }
    }
    assert!(clusters.contains(&"halo-killswitch") && clusters.contains(&"halo-jwks"));
    let hcm =
        &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    let filters = hcm["http_filters"].as_array().expect("filters");
    let names: Vec<&str> = filters.iter().filter_map(|f| f["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.filters.http.jwt_authn",
            halo_contract::names::FILTER_NAME,
            "envoy.filters.http.router"
        ]
    );
    let provider = &filters[0]["typed_config"]["providers"]["halo"];
    assert_eq!(
        provider["issuer"],
        "https://acme.okta.com/oauth2/aus9halos2acme7corp"
    );
    assert_eq!(provider["audiences"], json!(["api://halos"]));
    assert_eq!(provider["payload_in_metadata"], "halo_jwt");
    let gemini = &filters[0]["typed_config"]["providers"]["halo_gemini"];
    assert_eq!(gemini["from_params"], json!(["key"]));
    let routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
        .as_array()
        .expect("routes");
    // Last, every aggregate by the filter's header; before it, one route per aggregate
    // whose first pick has timeoutSeconds (opus: bedrock-use1, 30 s) or that has one
    // target only (never retried: a retried model call is a duplicated bill).
    assert_eq!(
        routes.last().expect("a route")["route"]["cluster_header"],
        "x-halo-route"
    );
    let opus = routes
        .iter()
        .find(|r| r["route"]["cluster"] == "opus-0")
        .expect("opus-0 has a route of its own");
    assert_eq!(opus["route"]["retry_policy"]["per_try_timeout"], "30s");
    assert_eq!(opus["route"]["retry_policy"]["num_retries"], 2);
    let single = routes
        .iter()
        .find(|r| r["route"]["cluster"] == "gpt-1")
        .expect("gpt-1 (one target after the first pick) has a route of its own");
    assert_eq!(single["route"]["retry_policy"]["num_retries"], 0);
    assert_eq!(
        routes.last().expect("a route")["route"]["retry_policy"]["num_retries"],
        2
    );
    assert_eq!(
        opus["match"]["headers"][0],
        json!({"name": "x-halo-route", "string_match": {"exact": "opus-0"}})
    );
    // Every https cluster verifies its server: CA bundle and the host as SAN.
    let all = doc["static_resources"]["clusters"]
        .as_array()
        .expect("clusters");
    let https: Vec<&serde_json::Value> = all
        .iter()
        .filter(|c| c.get("transport_socket").is_some())
        .collect();
    assert!(https.len() >= 3, "providers, JWKS and kill list are https");
    for c in https {
        let vc = &c["transport_socket"]["typed_config"]["common_tls_context"]["validation_context"];
        assert_eq!(
            vc["trusted_ca"]["filename"],
            halo_envoy_config::tls::DEFAULT_UPSTREAM_CA_FILE,
            "{c}"
        );
        let host = &c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["hostname"];
        assert_eq!(
            vc["match_typed_subject_alt_names"][0]["matcher"]["exact"], *host,
            "{c}"
        );
        assert_eq!(c["transport_socket"]["typed_config"]["sni"], *host, "{c}");
    }
    let wasm = &filters[1]["typed_config"]["config"];
    assert_eq!(wasm["fail_open"], false);
    assert_eq!(wasm["allow_on_headers_stop_iteration"], true);
    let config: serde_json::Value =
        serde_json::from_str(wasm["configuration"]["value"].as_str().expect("string"))
            .expect("json");
    assert_eq!(
        config["settings"]["killSwitch"]["cluster"],
        "halo-killswitch"
    );
    assert_eq!(config["snapshot"]["org"], "acme-corp");
}
