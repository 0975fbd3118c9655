//! Envoy Gateway manifests: the filter as an EnvoyExtensionPolicy pulling the digest-pinned
//! wasm image, the developers' issuer as a SecurityPolicy (jwt), and per routed upstream a
//! Backend (the external host), a BackendTLSPolicy (TLS origination, verified against the
//! system CAs) and a BackendTrafficPolicy (passive health check as the breaker), plus the
//! HTTPRoute sending the filter's route header to the Backend.
//!
//! Envoy Gateway enables policy filters per route, so the HTTPRoute ends with a catch-all
//! rule: every request matches some route before the filter runs, the filter then sets the
//! route header and Envoy re-selects the header rule. Envoy Gateway's jwt_authn writes the
//! payload under the issuer, which the filter is told through `identity.jwtMetadataKey`.

use halo_envoy_config::bootstrap::filter_configuration;
use halo_envoy_config::names;
use halo_policy::Snapshot;
use serde_json::{Value, json};

use crate::{Image, MeshError, jwks_uri, metadata, routed_upstreams, settings_with_key};

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
}

/// Every Envoy Gateway manifest for `snap`, or why the mesh path cannot serve it.
pub fn render(snap: &Snapshot, opts: &GatewayOptions) -> Result<Vec<Value>, MeshError> {
    crate::single_target_routes(snap)?;
    crate::check_pull_policy(&opts.image_pull_policy)?;
    let ns = opts.namespace.as_str();
    let issuer = snap.identity.as_ref().filter(|i| !i.issuer.is_empty());
    let settings = settings_with_key(&opts.settings, issuer.map(|i| i.issuer.as_str()))?;
    let gateway_ref =
        json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": opts.gateway}]);
    let mut docs = Vec::new();

    let mut image = json!({"url": opts.image.reference(), "sha256": opts.image.sha256});
    if let Some(secret) = &opts.image_pull_secret {
        image["pullSecretRef"] = json!({"name": secret});
    }
    docs.push(json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyExtensionPolicy",
        "metadata": metadata("halo", ns),
        "spec": {
            "targetRefs": gateway_ref,
            "wasm": [{
                "name": "halo",
                "rootID": "halo",
                "failOpen": false,
                "code": {"type": "Image", "image": image, "pullPolicy": opts.image_pull_policy},
                "config": filter_configuration(snap, &settings),
            }],
        },
    }));

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
