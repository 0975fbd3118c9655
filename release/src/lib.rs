//! halo-release: the signed, deterministic releases of harness settings that halod
//! applies on developer machines, and the ring pointers that say which release a ring
//! runs.
//!
//! The pure part (no network, no clock of its own) follows the spec's release pipeline:
//! - [`build`]: BuildRing. One release per variant of every running client-axis
//!   experiment that enrolls the ring (a *channel*), then the ring release, whose
//!   manifest lists those experiments with salt, weights and channels.
//! - [`adapters`]: one per harness (Claude Code, Codex, Gemini CLI), each rendering the
//!   effective profile for darwin, linux and windows into that harness's managed
//!   locations. What an adapter cannot express becomes a warning in the manifest.
//! - [`check`]: CheckRendered, the permission-bypass backstop over every rendered file.
//! - [`pack`]: the deterministic USTAR tar; the release digest is sha256(tar).
//! - [`sign`]: ed25519 statements for releases and pointers, key ids.
//! - [`pointer`]: the ring pointer payload, its seq rule, and its checks.
//! - [`names`]: registry tags of releases, channels and pointers.
//!
//! With feature `oci`, [`oci`] publishes to and pulls from a real OCI registry with
//! oci-client: push (publish, promote) for `halo release`, pull + verify for both
//! `halo release verify` and halod.

pub mod adapters;
pub mod build;
pub mod check;
pub mod names;
#[cfg(feature = "oci")]
pub mod oci;
pub mod pack;
pub mod pointer;
pub mod sign;
#[cfg(feature = "oci")]
pub mod wasm;

pub use build::{BuildError, Release, ReleaseManifest, RingBuild, build_ring};
