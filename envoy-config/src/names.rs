//! Cluster names and the route header: the contract between the filter and Envoy's routes.
//!
//! The filter decides the target and writes the name of the Envoy cluster to send it to
//! in [`ROUTE_HEADER`]; the one model route uses `cluster_header: x-halo-route`, and Envoy
//! re-selects the route after the filter's header change. A client's copy of the header is
//! always removed, and the filter fails closed, so no request reaches the router with a
//! cluster the client chose.
//!
//! Scheme (stable; the xDS translator extends it, never reuses a name for something else):
//! - `halo-upstream-<upstream>`: one cluster per policy upstream (its URL's host and port,
//!   TLS when https). A target is (upstream, model); the model is rewritten into the body
//!   or path by the filter, so every target of one upstream shares its cluster. This is
//!   what single-target and weighted-tier routing send to.
//! - `halo-route-<key>` (reserved for failover): an aggregate cluster listing
//!   `halo-upstream-*` (or per-target) sub-clusters in failover order, one per (route,
//!   first pick). The filter will then write that name instead; nothing else changes.
//! - `halo-killswitch`, `halo-jwks`: the kill-list server and the issuer's JWKS.
//!
//! Policy upstream names are lowercase letters, digits and dashes (the policy validates
//! them), so they are valid in cluster names and stats names as they are.

/// The request header the filter sets to the chosen cluster's name.
pub const ROUTE_HEADER: &str = "x-halo-route";

/// Prefix of per-upstream clusters.
pub const UPSTREAM_CLUSTER_PREFIX: &str = "halo-upstream-";

/// Prefix reserved for failover aggregate clusters (issue 4).
pub const ROUTE_CLUSTER_PREFIX: &str = "halo-route-";

/// The kill-list server's cluster in the standalone bootstrap.
pub const KILLSWITCH_CLUSTER: &str = "halo-killswitch";

/// The identity provider's JWKS cluster.
pub const JWKS_CLUSTER: &str = "halo-jwks";

/// jwt_authn's `payload_in_metadata` key: the filter reads verified claims under it.
pub const JWT_PAYLOAD_KEY: &str = "halo_jwt";

/// The cluster serving policy upstream `upstream`.
pub fn upstream_cluster(upstream: &str) -> String {
    format!("{UPSTREAM_CLUSTER_PREFIX}{upstream}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_cluster_names() {
        assert_eq!(
            upstream_cluster("anthropic-direct"),
            "halo-upstream-anthropic-direct"
        );
        assert!(upstream_cluster("x").starts_with(UPSTREAM_CLUSTER_PREFIX));
        assert!(!UPSTREAM_CLUSTER_PREFIX.starts_with(ROUTE_CLUSTER_PREFIX));
    }
}
