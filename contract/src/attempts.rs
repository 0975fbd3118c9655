//! What the filter's per-attempt stage and Envoy's retry policy agree on: the statuses
//! besides 5xx that move an attempt to the next target, and the per-target breakers'
//! settings the gateway plan writes into the filter's configuration.

use serde::{Deserialize, Serialize};

/// The status codes besides 5xx that halo-envoy-config's `RETRY_ON` retries.
pub const RETRIABLE_STATUS_CODES: [u32; 1] = [429];

/// The per-target breakers' settings: the gateway setting `breaker`, written into the halo
/// filter's settings (`settings.breaker`), whose breakers (halo-filter-core's `breaker`)
/// keep a target whose breaker is open from leading a call. Not Envoy's outlier detection:
/// that never counts a 429, has no single half-open probe, and would divert the probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Breaker {
    /// Consecutive failed attempts (a connect error, a reset, a 5xx or a 429) that open it.
    pub consecutive_failures: u32,
    /// How long it stays open before one call may probe the target again.
    pub open_seconds: u32,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            consecutive_failures: 5,
            open_seconds: 30,
        }
    }
}
