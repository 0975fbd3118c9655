//! The test kit's own check: each real component starts, answers, and stops on drop.

use halo_testkit::envoy::Envoy;
use halo_testkit::registry::Registry;
use halo_testkit::{free_port, http};

#[test]
fn envoy_starts_serves_a_direct_response_and_stops_on_drop() {
    let admin = free_port();
    let listen = free_port();
    let bootstrap = format!(
        r#"
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: probe
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: probe
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                direct_response: {{status: 200, body: {{inline_string: "hello from envoy"}}}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    );
    let envoy = Envoy::start(&bootstrap, admin);
    let response = http::get(listen, "/").expect("listener answers");
    assert_eq!(response.status, 200);
    assert_eq!(response.body, "hello from envoy");
    assert!(
        envoy
            .prometheus()
            .contains("envoy_http_downstream_rq_total")
    );
    drop(envoy);
    assert!(
        http::get(admin, "/ready").is_none(),
        "Envoy is gone after drop"
    );
}

#[test]
fn registry_starts_answers_v2_and_stops_on_drop() {
    let registry = Registry::start();
    let port = registry.port();
    let response = http::get(port, "/v2/").expect("registry answers");
    assert_eq!(response.status, 200);
    let catalog = http::get(port, "/v2/_catalog").expect("catalog");
    assert!(catalog.body.contains("repositories"), "{}", catalog.body);
    drop(registry);
    assert!(
        http::get(port, "/v2/").is_none(),
        "registry is gone after drop"
    );
}
