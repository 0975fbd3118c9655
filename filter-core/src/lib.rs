//! The Halos HTTP filter, written once: everything it decides and every step of its
//! flows, with no proxy-wasm and no FFI, so it builds for wasm32 and natively and its
//! flows are tested natively against a fake Envoy.
//!
//! - [`host`]: what the filter needs of Envoy, as a trait each build implements
//!   (halo-filter-wasm over proxy-wasm, halo-filter-native over Envoy's dynamic-module ABI).
//! - [`request`]: the request filter's flow. [`stage`]: the per-attempt stage's flow.
//! - [`config`]: the plugin configuration (snapshot + settings), decoded strictly.
//! - [`attempt`]: the per-attempt stage's decisions (each failover attempt gets its
//!   target's model).
//! - [`pipeline`]: identity, body bound, admit, decision, route pick, model rewrite.
//! - [`hygiene`]: which client headers never reach an upstream; the x-halo-* stamps.
//! - [`killstate`]: the kill list in force (poll results, lists shared by other workers).
//! - [`breaker`]: the per-target breakers: which target may lead a call, from the
//!   outcomes of earlier calls' attempts.
//! - [`account`]: the response side of a decided call: usage, cost and time to first
//!   byte, written where Envoy's OpenTelemetry access logger reads them.
//! - [`shadow`]: shadow jobs: a sampled call as the shadow variant's target must receive
//!   it, for the mirror service, sent without the live call waiting.
//! - [`metrics`]: the counters, named once for both builds.
//! - [`cidr`]: trusted proxy prefixes. [`claims`], [`jwt`]: verified claims as Envoy
//!   hands them to each build.
//!
//! Nothing here logs a header value, a body or a user.

pub mod account;
pub mod attempt;
pub mod breaker;
pub mod cidr;
pub mod claims;
pub mod config;
pub mod host;
pub mod hygiene;
pub mod jwt;
pub mod killstate;
pub mod metrics;
pub mod pipeline;
pub mod request;
pub mod shadow;
pub mod stage;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod flow_tests;
#[cfg(test)]
mod tests;
