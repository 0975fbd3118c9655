//! halo-contract: what the halo filter, Envoy's configuration, halo-server and the
//! evidence receiver must agree on, written once. Each side imports it; none redefines a
//! name, a field or a value of it.
//!
//! Pure (no I/O, no Envoy types) and small: it builds for wasm32 inside the filter.
//!
//! - [`names`]: the route header and the fixed cluster, metadata and configuration names.
//! - [`facts`]: the facts the filter writes per call and the evidence record's attributes.
//! - [`attempts`]: the statuses Envoy retries and the per-target breakers' settings.
//! - [`budget`]: the budget check's rate-limit domain and descriptor entries.
//! - [`limits`]: bounds both sides apply (the request body's).
//! - [`shadow`]: the shadow job the filter sends halo-server's mirror service.

pub mod attempts;
pub mod budget;
pub mod facts;
pub mod limits;
pub mod names;
pub mod shadow;
