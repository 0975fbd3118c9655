//! The data-plane contract: the route header and the fixed cluster, metadata and
//! configuration names the filter, both emitters (standalone bootstrap, xDS) and the tests
//! share. Nothing here is written as a literal anywhere else.
//!
//! The filter decides the target and writes the name of the Envoy cluster to send it to
//! in [`ROUTE_HEADER`]; the one model route uses `cluster_header: x-halo-route`, and Envoy
//! re-selects the route after the filter's header change. A client's copy of the header is
//! always removed, and the filter fails closed, so no request reaches the router with a
//! cluster the client chose.
//!
//! The model clusters (one aggregate per route scope, alias and first pick; one
//! sub-cluster per target) are named by [`halo_policy::cluster_names`], the one scheme the
//! filter and the gateway plan (both modes) call.

/// The request header the filter sets to the chosen cluster's name.
pub const ROUTE_HEADER: &str = "x-halo-route";

/// The kill-list server's cluster in the standalone bootstrap.
pub const KILLSWITCH_CLUSTER: &str = "halo-killswitch";
/// The mirror service's cluster: the filter's shadow jobs go there.
pub const SHADOW_CLUSTER: &str = "halo-shadow";

/// The halo filter's name in the listener's filter chain, in both modes (in xDS mode also
/// the name of its ECDS resource).
pub const FILTER_NAME: &str = "halo";

/// The identity provider's JWKS cluster.
pub const JWKS_CLUSTER: &str = "halo-jwks";

/// The stats namespace of the native build's counters (Envoy prefixes each counter a
/// dynamic module defines with it; the wasm build's is Envoy's `wasmcustom`).
pub const NATIVE_METRICS_NAMESPACE: &str = "halocustom";

/// The endpoint metadata namespace (`filter_metadata.halo`) of every target's facts; the
/// per-attempt stage reads [`ENDPOINT_FACTS_KEY`] there.
pub const METADATA_NAMESPACE: &str = "halo";

/// The key of a target's cluster name in [`METADATA_NAMESPACE`]: the per-attempt
/// credential chain's marker (`credentials::TARGET_HEADER`) is set from it.
pub const TARGET_METADATA_KEY: &str = "target";

/// The key of a target's [`halo_policy::cluster_names::EndpointFacts`] in
/// [`METADATA_NAMESPACE`].
pub use halo_policy::cluster_names::ENDPOINT_FACTS_KEY;

/// The filter configuration that makes the module the per-attempt stage (an upstream
/// HTTP filter on every aggregate cluster) instead of the request filter.
pub const ATTEMPT_STAGE_CONFIGURATION: &str = r#"{"stage":"attempt"}"#;

/// The per-attempt stage's filter (and wasm root id) name on every aggregate cluster.
pub const ATTEMPT_STAGE_NAME: &str = "halo-attempt";

/// jwt_authn's `payload_in_metadata` key: the filter reads verified claims under it.
pub const JWT_PAYLOAD_KEY: &str = "halo_jwt";

/// jwt_authn's `forward_payload_header` for the native filter build, which reads the
/// verified payload there (its ABI reads no nested metadata). An `x-halo-*` name, so the
/// filter's hygiene strips it before any upstream.
pub const JWT_PAYLOAD_HEADER: &str = "x-halo-jwt-payload";

/// The cluster of the gateway settings' `defaultUpstream`, where requests no policy route
/// takes go (the filter names it in the route header).
pub const DEFAULT_UPSTREAM_CLUSTER: &str = "halo-default-upstream";

/// The response header naming the upstream whose key was missing on a 502
/// `upstream_auth_error` of the credential chain ([`crate::credentials::key_lua`]): the
/// halo filter counts it per upstream (`halo_upstream_auth_errors`) and removes it before
/// the client.
pub const KEY_MISSING_HEADER: &str = "x-halo-key-missing";
