//! Envoy Gateway manifests: the filter as an EnvoyExtensionPolicy pulling the digest-pinned
//! wasm image, the developers' issuer as a SecurityPolicy (jwt), and per routed upstream a
//! Backend (the external host), a BackendTLSPolicy (TLS origination, verified against the
//! system CAs) and a BackendTrafficPolicy (passive health check as the breaker), plus the
//! HTTPRoute sending the filter's route header to the Backend.
//!
//! The filter needs `allow_on_headers_stop_iteration: true`, which EnvoyExtensionPolicy
//! does not expose (envoyproxy/gateway#8382): an EnvoyPatchPolicy adds it to the wasm
//! filter Envoy Gateway generates, found by its name
//! (`envoy.filters.http.wasm/envoyextensionpolicy/<ns>/halo/wasm/0`) under the Gateway's
//! listener, and (with the kill list) adds the `halo-killswitch` cluster the filter's poll
//! names. EnvoyPatchPolicy must be enabled in Envoy Gateway
//! (`extensionApis.enableEnvoyPatchPolicy: true`).
//!
//! Envoy Gateway enables policy filters per route, so the HTTPRoute ends with a catch-all
//! rule: every request matches some route before the filter runs, the filter then sets the
//! route header and Envoy re-selects the header rule. Envoy Gateway's jwt_authn writes the
//! payload under the issuer, which the filter is told through `identity.jwtMetadataKey`.

use halo_contract::names;
use halo_envoy_config::bootstrap::filter_configuration;
use halo_policy::Snapshot;
use serde_json::{Value, json};

use crate::{
    GATEWAY_TOKEN_ENV, Image, KillSwitchRef, MeshError, STOP_ITERATION_FIELD, jwks_uri, metadata,
    routed_upstreams, settings_with_key, with_kill_switch,
};

/// What the Envoy Gateway manifests are rendered from, besides the snapshot.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    pub image: Image,
    pub namespace: String,
    /// The Gateway API Gateway (same namespace) the policies and the route attach to.
    pub gateway: String,
    /// Hostnames developers call (HTTPRoute hostnames; empty: all).
    pub hosts: Vec<String>,
    /// `IfNotPresent` or `Always`.
    pub image_pull_policy: String,
    /// A Secret (kubernetes.io/dockerconfigjson) holding registry credentials.
    pub image_pull_secret: Option<String>,
    /// The issuer's JWKS URL; default `<issuer>/.well-known/jwks.json`.
    pub jwks_uri: Option<String>,
    /// The filter's `settings` object, passed through (jwtMetadataKey is set here).
    pub settings: Value,
    /// The Envoy listener (xDS name) carrying the Gateway's HTTP traffic, which the
    /// EnvoyPatchPolicy patches: `<namespace>/<gateway>/<listener section>` by default in
    /// Envoy Gateway, `tcp-<port>` with its v2 xDS name scheme.
    pub listener: String,
    /// The kill-list poll (none: the kill state changes only by re-rendering).
    pub kill_switch: Option<KillSwitchRef>,
}

/// The name Envoy Gateway gives the HTTP filter of the first wasm entry of the
/// EnvoyExtensionPolicy `policy` in `ns`.
pub fn wasm_filter_name(ns: &str, policy: &str) -> String {
    format!("envoy.filters.http.wasm/envoyextensionpolicy/{ns}/{policy}/wasm/0")
}

/// Every Envoy Gateway manifest for `snap`, or why the mesh path cannot serve it.
pub fn render(snap: &Snapshot, opts: &GatewayOptions) -> Result<Vec<Value>, MeshError> {
    crate::in_proxy_servable(snap)?;
    crate::check_pull_policy(&opts.image_pull_policy)?;
    let ns = opts.namespace.as_str();
    let issuer = snap.identity.as_ref().filter(|i| !i.issuer.is_empty());
    let settings = settings_with_key(&opts.settings, issuer.map(|i| i.issuer.as_str()))?;
    let ks = opts.kill_switch.as_ref();
    let settings = with_kill_switch(settings, ks, names::KILLSWITCH_CLUSTER)?;
    if opts.listener.is_empty() {
        return Err(MeshError::Option(
            "the Gateway's Envoy listener name is required (the EnvoyPatchPolicy that sets allow_on_headers_stop_iteration patches it)".into(),
        ));
    }
    let gateway_ref =
        json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": opts.gateway}]);
    let mut docs = Vec::new();

    let mut image = json!({"url": opts.image.reference(), "sha256": opts.image.sha256});
    if let Some(secret) = &opts.image_pull_secret {
        image["pullSecretRef"] = json!({"name": secret});
    }
    let mut wasm = json!({
        "name": names::FILTER_NAME,
        "rootID": names::FILTER_NAME,
        "failOpen": false,
        "code": {"type": "Image", "image": image, "pullPolicy": opts.image_pull_policy},
        "config": filter_configuration(snap, &settings),
    });
    if ks.is_some() {
        wasm["env"] = json!({"hostKeys": [GATEWAY_TOKEN_ENV]});
    }
    docs.push(json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyExtensionPolicy",
        "metadata": metadata("halo", ns),
        "spec": {"targetRefs": gateway_ref, "wasm": [wasm]},
    }));
    docs.push(patch_policy(opts, ks));

    if let Some(identity) = issuer {
        let mut provider = json!({
            "name": "halo",
            "issuer": identity.issuer,
            "remoteJWKS": {"uri": jwks_uri(&identity.issuer, opts.jwks_uri.as_deref())},
            "extractFrom": {
                "headers": [
                    {"name": "authorization", "valuePrefix": "Bearer "},
                    {"name": "x-goog-api-key"},
                ],
                "params": ["key"],
            },
        });
        if let Some(aud) = identity.effective_audience() {
            provider["audiences"] = json!([aud]);
        }
        docs.push(json!({
            "apiVersion": "gateway.envoyproxy.io/v1alpha1",
            "kind": "SecurityPolicy",
            "metadata": metadata("halo-jwt", ns),
            "spec": {
                "targetRefs": gateway_ref,
                // A missing token passes to the filter, which answers 401 in the caller's
                // wire format (or routes anonymously when the operator allows it).
                "jwt": {"optional": true, "providers": [provider]},
            },
        }));
    }

    let upstreams = routed_upstreams(snap)?;
    let mut rules = Vec::new();
    for u in &upstreams {
        let host = &u.endpoint.host;
        docs.push(json!({
            "apiVersion": "gateway.envoyproxy.io/v1alpha1",
            "kind": "Backend",
            "metadata": metadata(&u.cluster, ns),
            "spec": {"endpoints": [{"fqdn": {"hostname": host, "port": u.endpoint.port}}]},
        }));
        if u.endpoint.tls {
            docs.push(json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "BackendTLSPolicy",
                "metadata": metadata(&u.cluster, ns),
                "spec": {
                    "targetRefs": [{"group": "gateway.envoyproxy.io", "kind": "Backend", "name": u.cluster}],
                    "validation": {"hostname": host, "wellKnownCACertificates": "System"},
                },
            }));
        }
        rules.push(json!({
            "name": u.cluster,
            "matches": u.route_values.iter()
                .map(|v| json!({
                    "path": {"type": "PathPrefix", "value": "/"},
                    "headers": [{"type": "Exact", "name": names::ROUTE_HEADER, "value": v}],
                }))
                .collect::<Vec<_>>(),
            "filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": host}}],
            "backendRefs": [{"group": "gateway.envoyproxy.io", "kind": "Backend", "name": u.cluster, "port": u.endpoint.port}],
        }));
    }
    // The catch-all: matched before the filter runs (so the filter is enabled on it); it
    // has no backend, so a request the filter did not route never reaches an upstream.
    rules.push(json!({
        "name": "halo-unrouted",
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
    }));
    let mut route = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": metadata("halo", ns),
        "spec": {"parentRefs": [{"name": opts.gateway}], "rules": rules},
    });
    if !opts.hosts.is_empty() {
        route["spec"]["hostnames"] = json!(opts.hosts);
    }
    docs.push(route);
    // The breaker: 5 consecutive 5xx eject a backend endpoint for 30 s.
    docs.push(json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "BackendTrafficPolicy",
        "metadata": metadata("halo", ns),
        "spec": {
            "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "halo"}],
            "healthCheck": {"passive": {
                "consecutive5XxErrors": 5,
                "interval": "30s",
                "baseEjectionTime": "30s",
                "maxEjectionPercent": 100,
            }},
            // Model responses stream for minutes.
            "timeout": {"http": {"requestTimeout": "0s"}},
        },
    }));
    Ok(docs)
}

/// The EnvoyPatchPolicy: allow_on_headers_stop_iteration on the halo wasm filter, and the
/// kill-list cluster when the poll is configured.
fn patch_policy(opts: &GatewayOptions, ks: Option<&KillSwitchRef>) -> Value {
    let filter = wasm_filter_name(&opts.namespace, "halo");
    let mut patches = vec![json!({
        "type": "type.googleapis.com/envoy.config.listener.v3.Listener",
        "name": opts.listener,
        "operation": {
            "op": "add",
            // Every filter chain of the listener (HTTP and HTTPS) carries the filter.
            "jsonPath": format!("..http_filters[?(@.name=='{filter}')]"),
            "path": format!("/typed_config/config/{STOP_ITERATION_FIELD}"),
            "value": true,
        },
    })];
    if let Some(ks) = ks {
        patches.push(json!({
            "type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            "name": names::KILLSWITCH_CLUSTER,
            // An empty path adds the value as a whole new cluster.
            "operation": {"op": "add", "path": "", "value": {
                "name": names::KILLSWITCH_CLUSTER,
                "type": "STRICT_DNS",
                "connect_timeout": "5s",
                "load_assignment": {
                    "cluster_name": names::KILLSWITCH_CLUSTER,
                    "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                        "address": ks.service,
                        "port_value": ks.port,
                    }}}}]}],
                },
            }},
        }));
    }
    json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyPatchPolicy",
        "metadata": metadata("halo", &opts.namespace),
        "spec": {
            // The singular targetRef: the CRD of Envoy Gateway d32f2829 (shared/crds) knows
            // only it; later releases accept it as deprecated.
            "targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": opts.gateway},
            "type": "JSONPatch",
            "jsonPatches": patches,
        },
    })
}

/// The Envoy Gateway routing for the halo gateway as a mesh service ([`crate::service`]):
/// the namespace, halo-server and the gateway, the HTTPRoute sending every request on
/// `hosts` through Envoy Gateway's `gateway` (in the same namespace) to the halo
/// gateway's Service, and a BackendTrafficPolicy lifting Envoy Gateway's request timeout
/// (responses stream for minutes; the halo gateway times its attempts itself). Provider
/// TLS, failover and the breaker are the halo gateway's, as in the xDS mode.
pub fn render_service(
    snap: &Snapshot,
    opts: &crate::service::ServiceOptions,
    gateway: &str,
    hosts: &[String],
) -> Result<Vec<Value>, MeshError> {
    use crate::service::{GATEWAY_NAME, gateway_port};
    let ns = opts.namespace.as_str();
    let mut docs = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": ns, "labels": crate::labels()}}),
    ];
    docs.extend(crate::service::render(snap, opts)?);
    let mut route = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": metadata(GATEWAY_NAME, ns),
        "spec": {
            "parentRefs": [{"name": gateway}],
            "rules": [{
                "name": GATEWAY_NAME,
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [{"kind": "Service", "name": GATEWAY_NAME, "port": gateway_port()}],
            }],
        },
    });
    if !hosts.is_empty() {
        route["spec"]["hostnames"] = json!(hosts);
    }
    docs.push(route);
    docs.push(json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "BackendTrafficPolicy",
        "metadata": metadata(GATEWAY_NAME, ns),
        "spec": {
            "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": GATEWAY_NAME}],
            "timeout": {"http": {"requestTimeout": "0s"}},
        },
    }));
    Ok(docs)
}
