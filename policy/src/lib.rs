//! halo-policy: the Halos data model and every pure decision.
//!
//! No I/O, no async, no Envoy types: the same functions answer in the wasm filter, in
//! `halo gateway routes`, in halod's variant choice and in the controller. Builds for
//! `wasm32-unknown-unknown` with default features. Two native-only features add edges:
//! `load` (read a policy directory from disk) and `sign` (sign kill lists, make keys).
//!
//! Code map:
//! - [`types`]: one type per policy kind, decoded strictly.
//! - [`load`] (feature `load`): a policy directory -> [`types::Org`], every problem named.
//! - [`validate`] and [`guardrails`]: references, ranges and the 16 built-in guardrails.
//! - [`compile`] and [`snapshot`]: Org -> the deterministic compiled snapshot.
//! - [`assign`]: the single source of hashing (rings, variants, weighted picks).
//! - [`decide`]: ring, toggles, experiments and shadow for one request.
//! - [`budgets`]: which spend and token budgets apply to a caller, their periods and the
//!   refusal once one is spent.
//! - [`admit`]: the client wire, operation and alias of a request; the body model rewrite.
//! - [`body_scan`]: the strict one-pass JSON scan that finds a body's top-level model.
//! - [`harness_models`]: the model names a harness resolves itself (Claude Code's families).
//! - [`profile`]: `extends` resolved into one effective Profile (child overrides parent).
//! - [`route`]: the failover order of an alias's targets (priority tiers, sticky pick).
//! - [`cluster_names`]: the Envoy cluster names the translator creates and the filter picks.
//! - [`killswitch`]: the signed kill list: verify, apply, and (feature `sign`) sign.
//! - [`keys`]: ed25519 keys as PEM: parse public keys; (feature `sign`) generate, load private.
//! - [`schema`]: the JSON Schema of each kind, as committed under `schemas/`.

pub mod admit;
pub mod assign;
pub mod body_scan;
pub mod budgets;
pub mod cluster_names;
pub mod compile;
pub mod decide;
pub mod guardrails;
pub mod harness_models;
pub mod issue;
pub mod keys;
pub mod killswitch;
#[cfg(feature = "load")]
pub mod load;
pub mod profile;
pub mod route;
pub mod schema;
pub mod snapshot;
pub mod types;
pub mod validate;

pub use compile::compile;
pub use issue::{Issue, Severity};
pub use snapshot::Snapshot;
pub use types::*;
