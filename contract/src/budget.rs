//! The budget check's descriptors: the rate-limit domain and the descriptor entries
//! Envoy's ratelimit filter sends halo-server's budget service (halo-envoy-config's
//! `budget` writes them from the filter's facts, halo-server's `budget` reads them).

/// The rate-limit domain halo-server answers.
pub const DOMAIN: &str = "halo-budget";

/// Descriptor entry keys.
pub const PHASE: &str = "phase";
pub const BUDGETS: &str = "budgets";
pub const WIRE: &str = "wire";
/// The alias the call is routed as (after a `routeTo` budget moved it): a spent `routeTo`
/// budget lets through the calls on its cheaper aliases.
pub const ALIAS: &str = "alias";
/// The `phase` values.
pub const PHASE_CHECK: &str = "check";
pub const PHASE_SPEND_TOKENS: &str = "spend-tokens";
pub const PHASE_SPEND_MICRO_USD: &str = "spend-micro-usd";
