//! The Halos HTTP filter as an Envoy dynamic module: a native shared object
//! (`libhalo_filter_native.so`) loaded by `envoy.filters.http.dynamic_modules`.
//!
//! It is the same filter as the wasm build (halo-filter): the same configuration
//! document, the same pure modules deciding everything (`pipeline`, `attempt`, `hygiene`,
//! `killstate`), the same two places in Envoy (the request filter in the connection
//! manager, the per-attempt stage on the aggregate cluster). What differs is only the
//! glue: no VM, so no copy of the request into a VM and no VM call per step, and one
//! process-wide kill list instead of one per worker VM.
//!
//! - [`abi`]: the hand-written subset of Envoy's dynamic-module C ABI.
//! - [`host`]: safe calls into Envoy, for a stream and for a configuration. With the
//!   exported `hooks`, the only `unsafe` code.
//! - `hooks`: the exported event hooks, dispatching to the filters.
//! - [`body_edit`]: a head edit written into Envoy's body without copying the rest.
//! - [`request`]: the request filter. [`stage`]: the per-attempt stage.
//! - [`plugin`]: a filter configuration, its counters and the kill-list poller.
//! - [`jwt`]: the verified claims as jwt_authn forwards them.

pub mod abi;
pub mod body_edit;
pub mod host;
pub mod jwt;
pub mod plugin;
pub mod request;
pub mod stage;

mod hooks;
