//! The Halos HTTP filter as a proxy-wasm module (`halo_filter.wasm`): halo-filter-core's
//! [`Host`] over proxy-wasm's host calls, and the root context (configuration, the
//! kill-list poll over shared data and ticks). The flows and every decision are in
//! halo-filter-core; this crate only moves data between Envoy and them.
//!
//! The host calls act on the context Envoy is running, so [`WasmHost`] is a plain value
//! made for each hook. Only wasm32 builds the glue; natively this crate is empty.

#[cfg(target_arch = "wasm32")]
mod glue;
#[cfg(target_arch = "wasm32")]
#[allow(
    unsafe_code,
    reason = "WASI's environment imports, which proxy-wasm does not wrap; the block says why it is sound"
)]
mod wasi;
