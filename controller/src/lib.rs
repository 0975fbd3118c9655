//! halo-controller: reads experiment evidence, decides with always-valid statistics, and
//! acts: rollback (kill switch on gateway evidence only, pause PR, notification), promote
//! or expired (concluding PR, notification). Each action at most once per experiment run.
//!
//! A pure core with its I/O at the edges:
//! - [`stats`]: the mSPRT confidence sequence (pure, O(1) per update);
//! - [`decide`]: one experiment's verdict from its evidence (pure, time passed in);
//! - [`rollout`]: a rollout step's move from its bake, gates and guardrails (pure);
//! - [`rollout_state`]: `rollouts/<name>.json`, each rollout's hash-chained history;
//! - [`drive`]: step 11, each running rollout's tick: evaluate, then its move's actions;
//! - [`controller`]: the loop and the executor, behind ports for the policy served now,
//!   the evidence ([`evidence::EvidencePort`]), the kill switch ([`kill::KillPort`]),
//!   pull requests ([`pr::PullRequests`]) and notifications ([`notify::Notifier`]);
//! - [`evidence_store`]: the evidence port over halo-evidence's store;
//! - [`state`]: `controller-state.jsonl`, the fsynced record of every step;
//! - [`history`]: each experiment's evidence table at every tick, for charts;
//! - [`pr`]: git and gh; [`notify`]: the signed webhook;
//! - [`assemble`]: the controller from its settings and ports, as halo-server's
//!   `--controller` and `halo controller run` both build it, and the two kill ports.

pub mod assemble;
pub mod controller;
pub mod decide;
pub mod drive;
pub mod evidence;
pub mod evidence_store;
pub mod history;
pub mod kill;
pub mod notify;
pub mod pr;
pub mod rollout;
pub mod rollout_state;
pub mod state;
pub mod stats;
