//! halo-credentials: keeps provider tokens that must be minted fresh in Envoy SDS secret
//! files. Today that is Google's access token for Vertex AI.
//!
//! The gateway never puts a secret in the wasm filter's or xDS configuration: per-attempt
//! credentials are set by Envoy's `credential_injector` from a secret Envoy reads itself.
//! Static keys are files or environment variables Envoy reads directly; a Google token
//! lives an hour and has to be minted, so this process mints it (from a service-account
//! key or the metadata server, [`google`]), publishes it in an SDS file ([`sds`]) and
//! refreshes it before it expires ([`refresh`], [`run`]). Envoy reloads the file when it
//! is replaced, without a restart.

pub mod google;
pub mod refresh;
pub mod run;
pub mod sds;
