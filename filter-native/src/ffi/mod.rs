//! Everything that touches Envoy's dynamic-module ABI, and the crate's only `unsafe`
//! code: the raw ABI ([`abi`], private to this module), the safe calls made of it
//! ([`envoy`]), and the exported hooks (`hooks`).

mod abi;
pub mod envoy;
mod hooks;
