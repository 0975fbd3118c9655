//! The Halos proxy-wasm HTTP filter: thin glue between Envoy and halo-policy.
//!
//! Everything that decides lives in plain modules, unit-tested natively:
//! - [`config`]: the plugin configuration (snapshot + settings), decoded strictly.
//! - [`attempt`]: the per-attempt stage (each failover attempt gets its target's model).
//! - [`pipeline`]: identity, body bound, admit, decision, route pick, model rewrite.
//! - [`hygiene`]: which client headers never reach an upstream; the x-halo-* stamps.
//! - [`killstate`]: the kill list in force (poll results, lists shared by other workers).
//! - [`metrics`]: metric names with tags.
//! - [`cidr`]: trusted proxy prefixes.
//! - [`claims`]: verified claims as Envoy serializes them.
//!
//! This file only moves data: Envoy headers, properties and bodies into those functions,
//! their answers back into Envoy. Nothing here logs a header, a body or a user.

pub mod attempt;
pub mod cidr;
pub mod claims;
pub mod config;
pub mod hygiene;
pub mod killstate;
pub mod metrics;
pub mod pipeline;

#[cfg(target_arch = "wasm32")]
mod glue;

#[cfg(test)]
mod tests;
