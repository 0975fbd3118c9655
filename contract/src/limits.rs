//! Bounds the filter and Envoy's configuration must agree on.

/// The request body bound of model calls when the settings name none: the filter refuses
/// a larger body and the plan gives Envoy's buffer the same bound (the two once differed,
/// and Envoy's 1 MiB cut calls the filter would have taken).
pub const DEFAULT_MAX_BODY_BYTES: u64 = 32 * 1024 * 1024;
