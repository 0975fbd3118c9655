//! halo-mesh: the compiled policy as Kubernetes manifests for a service mesh, so nobody
//! hand-writes them. Pure: the caller reads the policy and passes flags; every renderer
//! returns `serde_json::Value` documents, printed with [`to_yaml`].
//!
//! Code map:
//! - [`istio`]: the in-proxy mode: EnvoyFilter (or WasmPlugin), RequestAuthentication, ServiceEntry +
//!   DestinationRule per upstream, the VirtualService sending the filter's route header to
//!   them.
//! - [`envoy_gateway`]: the in-proxy mode: EnvoyExtensionPolicy + EnvoyPatchPolicy, SecurityPolicy, Backend +
//!   BackendTLSPolicy + BackendTrafficPolicy per upstream, the HTTPRoute.
//! - [`service`]: the halo gateway as a mesh service (the default mode): halo-server
//!   driving an Envoy of halo's own over xDS, which the Istio and Envoy Gateway
//!   renderers' `render_service` route to.
//! - [`control_plane`]: halo-server's Deployment, Service, NetworkPolicy.
//!
//! Shared here: the digest-pinned image reference, the upstream endpoints, the refusal
//! of alias targets the in-proxy mode cannot serve (see [`in_proxy_servable`]) and the kill-list
//! poller's settings (see [`KillSwitchRef`]).
//!
//! Two facts shape every mesh rendering:
//! - The filter pauses on request headers and decides on the body, so its Envoy wasm
//!   config needs `allow_on_headers_stop_iteration: true` (Envoy >= 1.35); without it Envoy
//!   turns the pause into StopAll and the body never reaches the filter: every model call
//!   hangs. Neither Istio's WasmPlugin nor Envoy Gateway's EnvoyExtensionPolicy exposes
//!   the field, so each renderer adds it with the platform's patch resource
//!   ([`STOP_ITERATION_FIELD`]).
//! - No secret is ever rendered: the gateway token for the kill list reaches the filter
//!   through a proxy environment variable ([`GATEWAY_TOKEN_ENV`]) the operator fills from
//!   a Secret.

pub mod control_plane;
pub mod envoy_gateway;
pub mod istio;
pub mod service;

use halo_envoy_config::plan::{Endpoint, endpoint, used_upstreams};
use halo_policy::{Snapshot, cluster_names};
use serde_json::Value;

/// Why manifests cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    #[error(
        "image {0:?} is not pinned: give oci://REGISTRY/REPOSITORY@sha256:<64 hex digits> (a tag can move; the mesh must pull exactly the module that was tested)"
    )]
    Unpinned(String),
    #[error("image {0:?} is not an oci://REGISTRY/REPOSITORY@sha256:<digest> reference")]
    BadImage(String),
    #[error(
        "the in-proxy mode (the filter inside Istio's or Envoy Gateway's own Envoy) cannot serve {n} alias target(s) of this policy: each needs the filter's per-attempt stage, which runs only on halo's aggregate clusters, so the mesh's Envoy would send every attempt the request the filter shaped for the first pick (another provider's model id, untranslated, unsigned, without the gateway's key):\n{list}\nRender the default --mode service (the halo gateway as a mesh service: Envoy driven over xDS by halo-server), which serves every one of them; or give each alias one target of a pass-through kind (anthropic or orchestrator, no credential) for the in-proxy mode",
        n = .0.len(),
        list = .0.iter().map(|u| format!("  - {u}")).collect::<Vec<_>>().join("\n")
    )]
    InProxy(Vec<Unservable>),
    #[error(transparent)]
    Upstream(#[from] halo_envoy_config::plan::PlanError),
    #[error("{0}")]
    Option(String),
}

/// A wasm image pinned by digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// `REGISTRY/REPOSITORY` (no scheme, no digest).
    pub repository: String,
    /// The 64 lowercase hex digits of the manifest's sha256.
    pub sha256: String,
}

impl Image {
    /// Parse `oci://REG/REPO@sha256:HEX`; a tag-only reference is refused.
    pub fn parse(text: &str) -> Result<Image, MeshError> {
        let rest = text
            .strip_prefix("oci://")
            .ok_or_else(|| MeshError::BadImage(text.to_string()))?;
        let Some((repo, digest)) = rest.split_once('@') else {
            return Err(MeshError::Unpinned(text.to_string()));
        };
        let hex = digest
            .strip_prefix("sha256:")
            .ok_or_else(|| MeshError::BadImage(text.to_string()))?;
        let valid_hex = hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        // A tag before the digest (`repo:tag@sha256:...`) is dropped: the digest decides.
        let repo = match repo.rsplit_once(':') {
            Some((r, tag)) if !tag.contains('/') => r,
            _ => repo,
        };
        if !valid_hex || repo.is_empty() || !repo.contains('/') {
            return Err(MeshError::BadImage(text.to_string()));
        }
        Ok(Image {
            repository: repo.to_string(),
            sha256: hex.to_string(),
        })
    }

    /// `oci://REG/REPO@sha256:HEX`.
    pub fn oci_url(&self) -> String {
        format!("oci://{}", self.reference())
    }

    /// `REG/REPO@sha256:HEX`.
    pub fn reference(&self) -> String {
        format!("{}@sha256:{}", self.repository, self.sha256)
    }
}

/// One alias target the in-proxy mode cannot serve, and what it needs that only the
/// per-attempt stage gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unservable {
    /// Where the route is: `models`, `toggle T`, `experiment E variant V`.
    pub scope: String,
    pub alias: String,
    /// `upstream/model`.
    pub target: String,
    /// What the target needs per attempt, e.g. "SigV4 signing".
    pub needs: Vec<&'static str>,
}

impl std::fmt::Display for Unservable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: alias {:?} target {}: needs {}; served by --mode service",
            self.scope,
            self.alias,
            self.target,
            self.needs.join(", ")
        )
    }
}

/// What a target of `upstream` needs from the per-attempt stage besides the first pick's
/// model id: translation (the kinds `halo_filter_core::attempt::translates` names for
/// some wire), SigV4, and the gateway's own credential (every kind
/// [`UpstreamKind::is_credentialed`] names, and any upstream with a `credential`).
fn stage_needs(upstream: &halo_policy::types::Upstream) -> Vec<&'static str> {
    use halo_policy::types::UpstreamKind as K;
    let mut needs = Vec::new();
    match upstream.kind {
        K::Bedrock => needs.extend(["SigV4 signing", "translation for Anthropic clients"]),
        K::Vertex => needs.extend(["translation", "a minted Google token"]),
        K::AzureOpenai => needs.extend(["translation", "the gateway's api-key"]),
        kind if kind.is_credentialed() => needs.push("the gateway's own credential"),
        _ if upstream.credential.is_some() => needs.push("the gateway's own credential"),
        _ => {}
    }
    needs
}

/// Refuse, listing every one, the alias targets the in-proxy mode would serve wrongly:
/// a route of more than one target (failover or split: the filter shapes the request for
/// the first pick, and the next attempt would carry that pick's model id, host and
/// credentials to another target; only halo's aggregate clusters with the per-attempt
/// stage give each attempt its own), and a target that needs the stage itself
/// ([`stage_needs`]). Only single pass-through targets remain, which the filter's request
/// stage serves completely.
pub fn in_proxy_servable(snap: &Snapshot) -> Result<(), MeshError> {
    let mut refused = Vec::new();
    for (scope, routes) in cluster_names::scoped_routes(snap) {
        let scope = match scope {
            cluster_names::RouteScope::Gateway => "models".to_string(),
            cluster_names::RouteScope::Variant {
                experiment,
                variant,
            } => format!("experiment {experiment:?} variant {variant:?}"),
            cluster_names::RouteScope::Toggle { toggle } => format!("toggle {toggle:?}"),
        };
        for (alias, targets) in routes {
            for t in targets {
                let mut needs = Vec::new();
                if targets.len() > 1 {
                    needs.push("its own model id on failover or split");
                }
                if let Some(u) = snap.upstreams.get(&t.upstream) {
                    needs.extend(stage_needs(u));
                }
                if !needs.is_empty() {
                    refused.push(Unservable {
                        scope: scope.clone(),
                        alias: alias.clone(),
                        target: format!("{}/{}", t.upstream, t.model),
                        needs,
                    });
                }
            }
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(MeshError::InProxy(refused))
    }
}

/// The Envoy wasm PluginConfig field the filter needs (see the module docs).
pub const STOP_ITERATION_FIELD: &str = "allow_on_headers_stop_iteration";

/// The proxy environment variable holding the gateway token for the kill list. The
/// rendered wasm VM config lists it as a host env key; the operator sets it on the gateway
/// pods from a Secret (`valueFrom.secretKeyRef`), so no manifest holds the token.
pub const GATEWAY_TOKEN_ENV: &str = "HALO_GATEWAY_TOKEN";

/// halo-server's kill-list path.
pub const KILLSWITCH_PATH: &str = "/api/v1/gateway/killswitch";

/// Where the filter polls the signed kill list in a mesh: halo-server's in-cluster
/// Service. Only references: the public key is public (it verifies, it cannot sign) and
/// the token is named by its environment variable.
#[derive(Debug, Clone)]
pub struct KillSwitchRef {
    /// halo-server's Service FQDN, e.g. `halo-server.halos.svc.cluster.local`.
    pub service: String,
    /// Its API port (8080 in `halo control-plane render`).
    pub port: u16,
    /// The kill-list verification key (ed25519 public key, PEM).
    pub pubkey_pem: String,
    /// Poll interval; the filter's default (10 s) when `None`.
    pub interval_seconds: Option<u32>,
}

impl KillSwitchRef {
    /// The `settings.killSwitch` object for a poll through the Envoy cluster `cluster`.
    /// Plain http on the wire to the filter's eyes: in Istio the outbound cluster adds mesh
    /// mTLS; in Envoy Gateway the call stays inside the cluster network (the filter requires
    /// the explicit allowInsecureInCluster for that).
    pub(crate) fn settings(&self, cluster: &str) -> Result<Value, MeshError> {
        let svc = self.service.as_str();
        let valid = !svc.is_empty()
            && svc
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            && svc.contains('.');
        if !valid {
            return Err(MeshError::Option(format!(
                "kill-list service {svc:?}: give halo-server's Service FQDN, e.g. halo-server.halos.svc.cluster.local"
            )));
        }
        if !self.pubkey_pem.contains("PUBLIC KEY") {
            return Err(MeshError::Option(
                "the kill-list key must be the ed25519 PUBLIC key (PEM); the signing key never leaves halo-server".into(),
            ));
        }
        let mut ks = serde_json::json!({
            "cluster": cluster,
            "url": format!("http://{svc}:{}{KILLSWITCH_PATH}", self.port),
            "tokenEnv": GATEWAY_TOKEN_ENV,
            "pubkey": self.pubkey_pem,
            "allowInsecureInCluster": true,
        });
        if let Some(secs) = self.interval_seconds {
            ks["intervalSeconds"] = serde_json::json!(secs);
        }
        Ok(ks)
    }
}

/// Put the kill-list settings into the filter settings; a token given inline is refused
/// (it would land in a custom resource anyone allowed to read it could see).
pub(crate) fn with_kill_switch(
    mut settings: Value,
    ks: Option<&KillSwitchRef>,
    cluster: &str,
) -> Result<Value, MeshError> {
    if settings.pointer("/killSwitch/token").is_some() {
        return Err(MeshError::Option(
            "settings.killSwitch.token: a gateway token is never rendered into a manifest; the filter reads it from the proxy environment variable HALO_GATEWAY_TOKEN".into(),
        ));
    }
    if let (Some(ks), Some(map)) = (ks, settings.as_object_mut()) {
        map.insert("killSwitch".into(), ks.settings(cluster)?);
    }
    Ok(settings)
}

/// Prefix of the per-upstream mesh resources (ServiceEntry, DestinationRule, Backend, ...).
pub const UPSTREAM_RESOURCE_PREFIX: &str = "halo-upstream-";

/// One routed upstream: its policy name, the name of its mesh resources, the
/// `x-halo-route` values the filter writes for requests it sends there, its endpoint.
#[derive(Debug, Clone)]
pub struct RoutedUpstream {
    pub name: String,
    /// A Kubernetes resource name (`halo-upstream-<name>`).
    pub cluster: String,
    /// The filter's `x-halo-route` values for this upstream: the aggregate cluster names
    /// of [`halo_policy::cluster_names`] (one target per route in the mesh, so first pick 0),
    /// sorted.
    pub route_values: Vec<String>,
    pub endpoint: Endpoint,
}

/// Every upstream some route names, in name order.
pub fn routed_upstreams(snap: &Snapshot) -> Result<Vec<RoutedUpstream>, MeshError> {
    let used = used_upstreams(snap);
    let mut values: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for (scope, routes) in cluster_names::scoped_routes(snap) {
        for (alias, targets) in routes {
            // in_proxy_servable refused every multi-target route before rendering.
            if let [target] = targets.as_slice() {
                values
                    .entry(target.upstream.as_str())
                    .or_default()
                    .push(cluster_names::aggregate_cluster(scope, alias, 0));
            }
        }
    }
    let mut out = Vec::new();
    for (name, upstream) in &snap.upstreams {
        if used.contains(name.as_str()) {
            let mut route_values = values.remove(name.as_str()).unwrap_or_default();
            route_values.sort();
            out.push(RoutedUpstream {
                name: name.clone(),
                cluster: format!("{UPSTREAM_RESOURCE_PREFIX}{name}"),
                route_values,
                endpoint: endpoint(&format!("upstream {name}"), &upstream.url)?,
            });
        }
    }
    Ok(out)
}

/// A manifest's `metadata`: name, namespace and the renderer's labels.
pub(crate) fn metadata(name: &str, ns: &str) -> Value {
    serde_json::json!({"name": name, "namespace": ns, "labels": labels()})
}

/// Kubernetes image pull policies the renderers accept.
pub(crate) fn check_pull_policy(policy: &str) -> Result<(), MeshError> {
    if matches!(policy, "IfNotPresent" | "Always") {
        Ok(())
    } else {
        Err(MeshError::Option(format!(
            "image pull policy {policy:?}: use IfNotPresent or Always"
        )))
    }
}

/// The issuer's JWKS URL: the flag, else `<issuer>/.well-known/jwks.json`.
pub fn jwks_uri(issuer: &str, flag: Option<&str>) -> String {
    flag.map_or_else(
        || halo_envoy_config::plan::default_jwks_uri(issuer),
        str::to_string,
    )
}

/// The filter settings for the mesh: `settings` (an object) with the jwt_authn metadata
/// key the platform's JWT filter writes.
pub(crate) fn settings_with_key(settings: &Value, key: Option<&str>) -> Result<Value, MeshError> {
    let mut s = settings.clone();
    let Some(map) = s.as_object_mut() else {
        return Err(MeshError::Option("settings must be a JSON object".into()));
    };
    if let Some(key) = key {
        let identity = map
            .entry("identity")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(identity) = identity.as_object_mut() {
            identity.insert("jwtMetadataKey".into(), Value::String(key.to_string()));
        }
    }
    Ok(s)
}

/// Documents as one YAML stream with a header naming the source.
pub fn to_yaml(docs: &[Value], header: &str) -> String {
    let mut out = String::new();
    for line in header.lines() {
        out.push_str(&format!("# {line}\n"));
    }
    for d in docs {
        out.push_str("---\n");
        out.push_str(&halo_envoy_config::yaml::to_yaml(d));
    }
    out
}

/// The labels every rendered object carries.
pub(crate) fn labels() -> Value {
    serde_json::json!({"app.kubernetes.io/part-of": "halos", "app.kubernetes.io/managed-by": "halo"})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_must_be_pinned_by_digest() {
        let hex = "a".repeat(64);
        let img = Image::parse(&format!("oci://reg.example:5000/halos/filter@sha256:{hex}"))
            .expect("pinned");
        assert_eq!(img.repository, "reg.example:5000/halos/filter");
        assert_eq!(img.sha256, hex);
        let err = Image::parse("oci://reg.example/halos/filter:1.0").expect_err("tag only");
        assert!(matches!(err, MeshError::Unpinned(_)), "{err}");
        assert!(err.to_string().contains("not pinned"));
        assert!(
            Image::parse(&format!("reg/x@sha256:{hex}")).is_err(),
            "no scheme"
        );
        assert!(
            Image::parse("oci://reg/x@sha256:abc").is_err(),
            "short digest"
        );
        let img = Image::parse(&format!("oci://reg/x:1.0@sha256:{hex}")).expect("tag+digest");
        assert_eq!(img.repository, "reg/x");
    }
}
