//! The Halos HTTP filter as an Envoy dynamic module: a native shared object
//! (`libhalo_filter_native.so`) loaded by `envoy.filters.http.dynamic_modules`.
//!
//! It is the same filter as the wasm build: the same configuration document and the same
//! flows, written once in halo-filter-core over its `Host` trait, which this crate
//! implements over Envoy's dynamic-module ABI. What differs is only the glue: no VM, so no
//! copy of the request into a VM and no VM call per step; bodies handed piece by piece
//! (edited with [`body_edit`]); and one process-wide kill list instead of one per worker
//! VM.
//!
//! - [`ffi`]: the ABI, the safe calls made of it and the exported hooks; the only
//!   `unsafe` code.
//! - [`host`]: the core's `Host` over those calls.
//! - [`body_edit`]: a head edit written into Envoy's body without copying the rest.
//! - [`plugin`]: a filter configuration, its counters and the kill-list poller.

pub mod body_edit;
#[allow(
    unsafe_code,
    reason = "Envoy's dynamic-module ABI: the C declarations, the calls made safe and the exported hooks; every unsafe block says why it is sound"
)]
pub mod ffi;
pub mod host;
pub mod plugin;
