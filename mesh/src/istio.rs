//! Istio manifests: the filter as an EnvoyFilter (or WasmPlugin, see Delivery) pulled from
//! a digest-pinned OCI image, the
//! developers' issuer as a RequestAuthentication, and per routed upstream a ServiceEntry
//! (the external host), a DestinationRule (TLS origination for https, outlier detection
//! as the breaker) and a VirtualService rule sending the filter's route header there.
//!
//! Delivery: the filter needs `allow_on_headers_stop_iteration: true` in its Envoy wasm
//! config, which WasmPlugin does not expose (and an EnvoyFilter cannot MERGE into the
//! config a WasmPlugin delivers over ECDS). So by default ([`Delivery::EnvoyFilter`]) the
//! filter is an EnvoyFilter with two patches, Istio's documented pattern for wasm
//! extensions: EXTENSION_CONFIG ADD (the full Envoy Wasm filter config, code fetched by
//! istio-agent from the same `oci://` URL and sha256 a WasmPlugin would use) and
//! HTTP_FILTER ADD in the AUTHZ filter class (the filter chain entry pointing at it over
//! ECDS). [`Delivery::WasmPlugin`] is kept for when Istio exposes the field; today it
//! renders a plugin under which every model call hangs, so it carries a warning.
//!
//! Ordering: Istio inserts AUTHN-phase plugins *before* its own authentication filters and
//! AUTHZ-phase plugins after them (before its authorization filters). The filter reads the
//! claims Istio's jwt_authn verified, so it runs in AUTHZ, with a high priority so it
//! precedes other AUTHZ plugins. Istio's jwt_authn puts the payload under `payload`, which
//! the filter is told through `identity.jwtMetadataKey`.

use std::collections::BTreeMap;

use halo_contract::names;
use halo_envoy_config::bootstrap::filter_configuration;
use halo_envoy_config::tls::UpstreamTls;
use halo_policy::Snapshot;
use serde_json::{Value, json};

use crate::{
    GATEWAY_TOKEN_ENV, Image, KillSwitchRef, MeshError, STOP_ITERATION_FIELD, jwks_uri, metadata,
    routed_upstreams, settings_with_key, with_kill_switch,
};

/// Where Istio's jwt_authn writes the verified payload (Istio's `EnvoyJwtFilterPayload`).
pub const ISTIO_JWT_PAYLOAD_KEY: &str = "payload";

/// WasmPlugin priority within the AUTHZ phase: higher runs first.
pub const PLUGIN_PRIORITY: i64 = 1000;

/// How the filter reaches the gateway's Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// EnvoyFilter (EXTENSION_CONFIG + HTTP_FILTER) carrying allow_on_headers_stop_iteration.
    EnvoyFilter,
    /// WasmPlugin: cannot set allow_on_headers_stop_iteration; model calls hang.
    WasmPlugin,
}

/// The warning the WasmPlugin delivery carries (output header and CLI stderr).
pub const WASM_PLUGIN_WARNING: &str = "WARNING: Istio's WasmPlugin cannot set allow_on_headers_stop_iteration: Envoy turns the filter's pause into StopAll, the request body never reaches it and every model call hangs. Use the default --delivery envoy-filter until Istio exposes the field.";

/// The Envoy cluster Istio builds for a Service port: what the filter's kill-list poll
/// (dispatch_http_call) names.
pub fn outbound_cluster(fqdn: &str, port: u16) -> String {
    format!("outbound|{port}||{fqdn}")
}

/// What the Istio manifests are rendered from, besides the snapshot.
#[derive(Debug, Clone)]
pub struct IstioOptions {
    pub image: Image,
    pub namespace: String,
    /// Workload labels of the gateway running the filter (WasmPlugin and
    /// RequestAuthentication selector).
    pub selector: BTreeMap<String, String>,
    /// The Istio Gateway(s) the VirtualService binds to, `namespace/name`.
    pub gateways: Vec<String>,
    /// Hostnames developers call (VirtualService hosts).
    pub hosts: Vec<String>,
    /// `IfNotPresent` or `Always`.
    pub image_pull_policy: String,
    /// A Secret in the plugin's namespace holding registry credentials.
    pub image_pull_secret: Option<String>,
    /// The issuer's JWKS URL; default `<issuer>/.well-known/jwks.json`.
    pub jwks_uri: Option<String>,
    /// The filter's `settings` object, passed through (jwtMetadataKey is set here).
    pub settings: Value,
    pub delivery: Delivery,
    /// The kill-list poll (none: the kill state changes only by re-rendering).
    pub kill_switch: Option<KillSwitchRef>,
    /// A Secret (in [`Self::namespace`]) holding the private CA (`ca.crt`) that https
    /// upstreams' certificates lead to; `None`: the proxy's system CA bundle.
    pub upstream_ca_credential: Option<String>,
}

/// Every Istio manifest for `snap`, or why the mesh cannot serve it.
pub fn render(snap: &Snapshot, opts: &IstioOptions) -> Result<Vec<Value>, MeshError> {
    crate::in_proxy_servable(snap)?;
    crate::check_pull_policy(&opts.image_pull_policy)?;
    if opts.selector.is_empty() {
        return Err(MeshError::Option(
            "a selector is required: the filter must attach to the gateway workload, not every proxy in the namespace".into(),
        ));
    }
    let ns = opts.namespace.as_str();
    let issuer = snap.identity.as_ref().filter(|i| !i.issuer.is_empty());
    let settings = settings_with_key(&opts.settings, issuer.map(|_| ISTIO_JWT_PAYLOAD_KEY))?;
    let selector = json!({"matchLabels": opts.selector});
    let mut docs = Vec::new();

    let ks = opts.kill_switch.as_ref();
    let settings = with_kill_switch(
        settings,
        ks,
        &ks.map(|k| outbound_cluster(&k.service, k.port))
            .unwrap_or_default(),
    )?;
    match opts.delivery {
        Delivery::EnvoyFilter => {
            if opts.image_pull_secret.is_some() {
                return Err(MeshError::Option(
                    "--image-pull-secret works only with --delivery wasm-plugin: istiod resolves a WasmPlugin's pull Secret, while an EnvoyFilter would have to carry the credentials inline. Pull the filter from a registry the gateway reaches without credentials (an in-cluster mirror)".into(),
                ));
            }
            docs.push(envoy_filter(snap, &settings, opts));
        }
        Delivery::WasmPlugin => docs.push(wasm_plugin(snap, &settings, opts, &selector)),
    }

    if let Some(identity) = issuer {
        let mut rule = json!({
            "issuer": identity.issuer,
            "jwksUri": jwks_uri(&identity.issuer, opts.jwks_uri.as_deref()),
            // The filter strips credentials itself (unless forwardAuth).
            "forwardOriginalToken": true,
            // Claude Code and Codex send a bearer token; Gemini CLI its API-key header or
            // `?key=`.
            "fromHeaders": [
                {"name": "authorization", "prefix": "Bearer "},
                {"name": "x-goog-api-key"},
            ],
            "fromParams": ["key"],
        });
        if let Some(aud) = identity.effective_audience() {
            rule["audiences"] = json!([aud]);
        }
        docs.push(json!({
            "apiVersion": "security.istio.io/v1",
            "kind": "RequestAuthentication",
            "metadata": metadata("halo-jwt", ns),
            "spec": {"selector": selector, "jwtRules": [rule]},
        }));
    }

    let upstreams = routed_upstreams(snap)?;
    let mut http_routes = Vec::new();
    for u in &upstreams {
        let host = &u.endpoint.host;
        // An in-cluster Service is already in Istio's registry; only external hosts get
        // a ServiceEntry.
        let in_cluster = host.ends_with(".svc.cluster.local") || host.ends_with(".svc");
        if !in_cluster {
            docs.push(json!({
                "apiVersion": "networking.istio.io/v1",
                "kind": "ServiceEntry",
                "metadata": metadata(&u.cluster, ns),
                "spec": {
                    "hosts": [host],
                    "location": "MESH_EXTERNAL",
                    "resolution": "DNS",
                    // Plain HTTP from the gateway's point of view: the DestinationRule
                    // originates TLS, so the filter's rewritten request is what is sent.
                    "ports": [{"number": u.endpoint.port, "name": "http-halo", "protocol": "HTTP"}],
                },
            }));
        }
        let mut policy = json!({
            // The breaker: 5 consecutive 5xx eject the host for 30 s.
            "outlierDetection": {
                "consecutive5xxErrors": 5,
                "interval": "30s",
                "baseEjectionTime": "30s",
                "maxEjectionPercent": 100,
            },
        });
        if u.endpoint.tls {
            policy["tls"] = upstream_tls(host, opts.upstream_ca_credential.as_deref());
        }
        docs.push(json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": metadata(&u.cluster, ns),
            "spec": {"host": host, "trafficPolicy": policy},
        }));
        http_routes.push(json!({
            "name": u.cluster,
            "match": u.route_values.iter()
                .map(|v| json!({"headers": {names::ROUTE_HEADER: {"exact": v}}}))
                .collect::<Vec<_>>(),
            "rewrite": {"authority": host},
            "route": [{"destination": {"host": host, "port": {"number": u.endpoint.port}}}],
            // Model responses stream for minutes.
            "timeout": "0s",
        }));
    }
    // Requests the filter did not route (it answered them itself, or it is not running)
    // must not reach any upstream.
    http_routes.push(json!({
        "name": "halo-unrouted",
        "directResponse": {"status": 503, "body": {"string": "{\"error\":{\"type\":\"halo_unrouted\",\"message\":\"the halo filter did not route this request\"}}"}},
    }));
    docs.push(json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": metadata("halo", ns),
        "spec": {"hosts": opts.hosts, "gateways": opts.gateways, "http": http_routes},
    }));
    Ok(docs)
}

/// TLS origination to an https upstream, verified as in the other modes
/// (halo-envoy-config's [`UpstreamTls::for_host`]): the certificate must lead to the
/// private CA in `ca_credential` (a Secret with `ca.crt`) or, without one, to the proxy's
/// system CA bundle (Istio verifies against it when no CA is set,
/// `VERIFY_CERTIFICATE_AT_CLIENT`, on by default since 1.20), and carry the URL's host as a
/// subject alt name; SNI is the host name (none for an IP literal). Nothing is skipped:
/// `insecureSkipVerify` is stated false.
fn upstream_tls(host: &str, ca_credential: Option<&str>) -> Value {
    let verify = UpstreamTls::for_host(host, "");
    let (_, san) = verify.san_type_and_value();
    let mut tls = json!({
        "mode": "SIMPLE",
        "subjectAltNames": [san],
        "insecureSkipVerify": false,
    });
    if let Some(sni) = &verify.sni {
        tls["sni"] = json!(sni);
    }
    if let Some(secret) = ca_credential {
        tls["credentialName"] = json!(secret);
    }
    tls
}

/// The filter as an EnvoyFilter: the Envoy Wasm filter config served over ECDS (what a
/// WasmPlugin would produce, plus allow_on_headers_stop_iteration), inserted in the AUTHZ
/// class of the gateway's HTTP filters, after Istio's jwt_authn.
fn envoy_filter(snap: &Snapshot, settings: &Value, opts: &IstioOptions) -> Value {
    let ns = opts.namespace.as_str();
    // ECDS names are global per proxy: qualify with the namespace (Istio's advice).
    let ecds_name = format!("{ns}.{}", names::FILTER_NAME);
    let mut env = json!({
        // istio-agent reads the pull policy from here, as it does for a WasmPlugin.
        "key_values": {"ISTIO_META_WASM_IMAGE_PULL_POLICY": opts.image_pull_policy},
    });
    if opts.kill_switch.is_some() {
        env["host_env_keys"] = json!([GATEWAY_TOKEN_ENV]);
    }
    let mut config = json!({
        "name": names::FILTER_NAME,
        "root_id": names::FILTER_NAME,
        "fail_open": false,
        "vm_config": {
            "vm_id": "halo",
            "runtime": "envoy.wasm.runtime.v8",
            // istio-agent fetches the image (oci://, digest-checked) and rewrites this to
            // a local file before the config reaches Envoy.
            "code": {"remote": {
                "http_uri": {"uri": opts.image.oci_url(), "timeout": "30s"},
                "sha256": opts.image.sha256,
            }},
            "environment_variables": env,
        },
        "configuration": {
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": filter_configuration(snap, settings).to_string(),
        },
    });
    config[STOP_ITERATION_FIELD] = json!(true);
    json!({
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": metadata("halo", ns),
        "spec": {
            "workloadSelector": {"labels": opts.selector},
            "configPatches": [
                {
                    "applyTo": "EXTENSION_CONFIG",
                    "patch": {"operation": "ADD", "value": {
                        "name": ecds_name,
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                            "config": config,
                        },
                    }},
                },
                {
                    "applyTo": "HTTP_FILTER",
                    "match": {
                        "context": "GATEWAY",
                        "listener": {"filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager"}}},
                    },
                    "patch": {
                        "operation": "ADD",
                        // After Istio's authentication (jwt_authn) filters, like phase AUTHZ.
                        "filterClass": "AUTHZ",
                        "value": {
                            "name": ecds_name,
                            "config_discovery": {
                                // Wait for the module instead of serving without the filter.
                                "config_source": {"ads": {}, "initial_fetch_timeout": "0s"},
                                "type_urls": ["type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"],
                            },
                        },
                    },
                },
            ],
        },
    })
}

/// The filter as a WasmPlugin (see [`WASM_PLUGIN_WARNING`]).
fn wasm_plugin(snap: &Snapshot, settings: &Value, opts: &IstioOptions, selector: &Value) -> Value {
    let ns = opts.namespace.as_str();
    let mut plugin = json!({
        "apiVersion": "extensions.istio.io/v1alpha1",
        "kind": "WasmPlugin",
        "metadata": metadata("halo", ns),
        "spec": {
            "selector": selector,
            "url": opts.image.oci_url(),
            "sha256": opts.image.sha256,
            "imagePullPolicy": opts.image_pull_policy,
            "phase": "AUTHZ",
            "priority": PLUGIN_PRIORITY,
            "pluginName": names::FILTER_NAME,
            "type": "HTTP",
            "failStrategy": "FAIL_CLOSE",
            "match": [{"mode": "SERVER"}],
            "pluginConfig": filter_configuration(snap, settings),
        },
    });
    if let Some(secret) = &opts.image_pull_secret {
        plugin["spec"]["imagePullSecret"] = json!(secret);
    }
    if opts.kill_switch.is_some() {
        plugin["spec"]["vmConfig"] =
            json!({"env": [{"name": GATEWAY_TOKEN_ENV, "valueFrom": "HOST"}]});
    }
    plugin
}

/// The Istio routing for the halo gateway as a mesh service ([`crate::service`]): the
/// `halos` namespace with sidecar injection (the ingress gateway reaches the halo gateway,
/// and the halo gateway halo-server, over mesh mTLS), halo-server and the gateway, a
/// PeerAuthentication requiring mTLS on the gateway's model-call port (the admin port stays
/// plain for the monitoring namespace's scraper), a DestinationRule originating mesh mTLS
/// to it, the VirtualService binding `gateways`/`hosts` to it, and a ServiceEntry per
/// external host the gateway's Envoy calls (providers and the identity issuer), so a mesh
/// with `outboundTrafficPolicy: REGISTRY_ONLY` lets it out. Those are TLS passthrough: the
/// halo gateway originates and verifies TLS to providers itself, as the gateway plan says
/// (CA bundle, SAN, SNI), so the sidecar never sees a provider request or key.
pub fn render_service(
    snap: &Snapshot,
    opts: &crate::service::ServiceOptions,
    gateways: &[String],
    hosts: &[String],
) -> Result<Vec<Value>, MeshError> {
    use crate::service::{ENVOY_ADMIN_PORT, GATEWAY_NAME, gateway_host, gateway_port};
    let ns = opts.namespace.as_str();
    let mut namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": ns, "labels": crate::labels()}});
    namespace["metadata"]["labels"]["istio-injection"] = json!("enabled");
    let mut docs = vec![namespace];
    docs.extend(crate::service::render(snap, opts)?);
    // The gateway's Envoy dials halo-server through its sidecar as it starts: hold it
    // until the sidecar is up (it would retry, but every first attempt would fail).
    for d in &mut docs {
        if d["kind"] == "Deployment" && d["metadata"]["name"] == GATEWAY_NAME {
            d["spec"]["template"]["metadata"]["annotations"] = json!({
                "proxy.istio.io/config": "{\"holdApplicationUntilProxyStarts\": true}",
            });
        }
    }
    let host = gateway_host(ns);
    let selector = json!({"matchLabels": {"app.kubernetes.io/name": GATEWAY_NAME}});
    docs.push(json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": metadata(GATEWAY_NAME, ns),
        "spec": {
            "selector": selector,
            "mtls": {"mode": "STRICT"},
            "portLevelMtls": {ENVOY_ADMIN_PORT.to_string(): {"mode": "PERMISSIVE"}},
        },
    }));
    docs.push(json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": metadata(GATEWAY_NAME, ns),
        "spec": {"host": host, "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}}},
    }));
    docs.push(json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": metadata(GATEWAY_NAME, ns),
        "spec": {
            "hosts": hosts,
            "gateways": gateways,
            "http": [{
                "name": GATEWAY_NAME,
                "route": [{"destination": {"host": host, "port": {"number": gateway_port()}}}],
                // Model responses stream for minutes; the halo gateway times attempts.
                "timeout": "0s",
            }],
        },
    }));
    // The external hosts the gateway's Envoy dials: each routed upstream, and the issuer
    // (jwt_authn fetches its JWKS).
    let mut external: Vec<(String, String, u16, bool)> = routed_upstreams(snap)?
        .into_iter()
        .map(|u| (u.cluster, u.endpoint.host, u.endpoint.port, u.endpoint.tls))
        .collect();
    if let Some(identity) = snap.identity.as_ref().filter(|i| !i.issuer.is_empty()) {
        let jwks = jwks_uri(&identity.issuer, opts.jwks_uri.as_deref());
        let ep = halo_envoy_config::plan::endpoint("the issuer's JWKS", &jwks)?;
        external.push(("halo-issuer".into(), ep.host, ep.port, ep.tls));
    }
    for (name, host, port, tls) in external {
        if host.ends_with(".svc.cluster.local") || host.ends_with(".svc") {
            continue;
        }
        let port = if tls {
            json!({"number": port, "name": format!("tls-{port}"), "protocol": "TLS"})
        } else {
            json!({"number": port, "name": format!("http-{port}"), "protocol": "HTTP"})
        };
        docs.push(json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "ServiceEntry",
            "metadata": metadata(&name, ns),
            "spec": {
                "hosts": [host],
                "location": "MESH_EXTERNAL",
                "resolution": "DNS",
                "ports": [port],
                // Only the halo gateway's namespace uses it.
                "exportTo": ["."],
            },
        }));
    }
    Ok(docs)
}
