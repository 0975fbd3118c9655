//! Istio manifests: the filter as a WasmPlugin pulled from a digest-pinned OCI image, the
//! developers' issuer as a RequestAuthentication, and per routed upstream a ServiceEntry
//! (the external host), a DestinationRule (TLS origination for https, outlier detection
//! as the breaker) and a VirtualService rule sending the filter's route header there.
//!
//! Ordering: Istio inserts AUTHN-phase plugins *before* its own authentication filters and
//! AUTHZ-phase plugins after them (before its authorization filters). The filter reads the
//! claims Istio's jwt_authn verified, so it runs in AUTHZ, with a high priority so it
//! precedes other AUTHZ plugins. Istio's jwt_authn puts the payload under `payload`, which
//! the filter is told through `identity.jwtMetadataKey`.

use std::collections::BTreeMap;

use halo_envoy_config::bootstrap::filter_configuration;
use halo_envoy_config::names;
use halo_policy::Snapshot;
use serde_json::{Value, json};

use crate::{Image, MeshError, jwks_uri, metadata, routed_upstreams, settings_with_key};

/// Where Istio's jwt_authn writes the verified payload (Istio's `EnvoyJwtFilterPayload`).
pub const ISTIO_JWT_PAYLOAD_KEY: &str = "payload";

/// WasmPlugin priority within the AUTHZ phase: higher runs first.
pub const PLUGIN_PRIORITY: i64 = 1000;

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
}

/// Every Istio manifest for `snap`, or why the mesh cannot serve it.
pub fn render(snap: &Snapshot, opts: &IstioOptions) -> Result<Vec<Value>, MeshError> {
    crate::single_target_routes(snap)?;
    crate::check_pull_policy(&opts.image_pull_policy)?;
    if opts.selector.is_empty() {
        return Err(MeshError::Option(
            "a selector is required: the WasmPlugin must attach to the gateway workload, not every proxy in the namespace".into(),
        ));
    }
    let ns = opts.namespace.as_str();
    let issuer = snap.identity.as_ref().filter(|i| !i.issuer.is_empty());
    let settings = settings_with_key(&opts.settings, issuer.map(|_| ISTIO_JWT_PAYLOAD_KEY))?;
    let selector = json!({"matchLabels": opts.selector});
    let mut docs = Vec::new();

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
            "pluginName": "halo",
            "type": "HTTP",
            "failStrategy": "FAIL_CLOSE",
            "match": [{"mode": "SERVER"}],
            "pluginConfig": filter_configuration(snap, &settings),
        },
    });
    if let Some(secret) = &opts.image_pull_secret {
        plugin["spec"]["imagePullSecret"] = json!(secret);
    }
    docs.push(plugin);

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
            policy["tls"] = json!({"mode": "SIMPLE", "sni": host});
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
