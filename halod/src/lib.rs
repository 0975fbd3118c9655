//! halod: the device agent. It pulls the ring's signed release from the OCI registry and
//! writes the harness settings it carries, safely.
//!
//! - [`config`]: halod.yaml, strict, with the spec's defaults.
//! - [`agent`]: the apply loop: one cycle (steps 1-10), PollKill, and `run` interleaving
//!   both on one task; the status line.
//! - [`kill`]: PollKill, what a newly accepted kill list asks of this device.
//! - [`state`]: state.json, the single writer's record of what was applied.
//! - [`target`]: checkTarget, the rules a path must pass before halod writes it.
//! - [`install`]: write what changed (atomically), flag drift, remove stale files, refuse
//!   what fails checkTarget and still apply the rest.

pub mod agent;
pub mod config;
pub mod install;
pub mod kill;
pub mod state;
pub mod target;
