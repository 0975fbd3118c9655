//! `rollouts/<name>.json` in the data dir: one rollout's history, one record per
//! transition, each naming the SHA-256 of the record before it, the whole file rewritten
//! atomically (temp file, fsync, rename) at each append.
//!
//! A file whose chain does not verify (a record edited, removed from the middle, reordered,
//! the last record edited (the file also holds the last record's hash), the file cut or not
//! JSON) is never acted on: [`load`] refuses it with the record and
//! the reason, and the controller reports it and holds the rollout until an operator
//! repairs or removes the file (docs/design/controller.md, "Rollouts"). Records removed from
//! the end leave a shorter valid chain, as with any hash chain without an outside anchor;
//! what that can do is repeat an action (a PR, a notification), never skip a bake.
//!
//! The records:
//! - `step_started`: the controller first saw the policy at this step; its bake runs from
//!   here, so a restart mid-bake resumes the bake where it was;
//! - `decided`: the step's move (advance, complete, rollback, pause) with its evaluation;
//!   its actions follow, each recorded when done, so each happens at most once:
//! - `kill` (rollback of a traffic rollout: its outcome, whatever it was; not retried),
//!   `pull_request` (the URL), `notified`.
//!
//! The state is a fold over the records ([`RolloutState`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::kill::KillOutcome;
use crate::rollout::{Evaluation, Move};

/// The state files' folder in the data dir.
pub const DIR: &str = "rollouts";

/// One transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Record {
    /// 0, 1, 2, ... in file order.
    pub seq: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// `sha256:<hex>` of the record before (its JSON as written); none for the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev: Option<String>,
    pub event: Event,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    StepStarted {
        step: u32,
    },
    Decided {
        step: u32,
        evaluation: Box<Evaluation>,
    },
    Kill {
        step: u32,
        #[serde(rename = "killOutcome")]
        outcome: KillOutcome,
    },
    PullRequest {
        step: u32,
        url: String,
    },
    Notified {
        step: u32,
    },
}

/// The file: the rollout's name, its records, and the last record's hash (so an edit of
/// the last record is found too). Each record is kept as the exact JSON text it was
/// written as: the chain hashes those bytes, so it does not depend on a value surviving
/// a parse and a print unchanged (serde_json's default float parsing may move a float by
/// one unit in the last place, which once broke every chain holding a gate's mean).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    rollout: String,
    records: Vec<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    head: Option<String>,
}

/// Why a state file is not acted on.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a rollout state file: {message}", path.display())]
    Malformed { path: PathBuf, message: String },
    #[error("{}: the hash chain does not verify at record {seq}: {why}; the rollout is held until the file is repaired or removed", path.display())]
    Broken {
        path: PathBuf,
        seq: usize,
        why: String,
    },
    #[error("rollout name {0:?} cannot name a state file")]
    BadName(String),
    #[error(transparent)]
    Write(#[from] halo_fsutil::WriteError),
}

/// The move decided for one step, and its actions so far.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepAction {
    pub step: u32,
    #[serde(with = "time::serde::rfc3339")]
    pub decided_at: OffsetDateTime,
    pub evaluation: Evaluation,
    pub kill_outcome: Option<KillOutcome>,
    pub pull_request: Option<String>,
    pub notified: bool,
}

/// The fold over the records.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutState {
    /// The step the controller last saw the policy at, and since when.
    pub step: Option<u32>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub step_started: Option<OffsetDateTime>,
    /// The move decided at `step`, if any (one per step).
    pub action: Option<StepAction>,
}

impl RolloutState {
    fn apply(&mut self, rec: &Record) {
        match &rec.event {
            Event::StepStarted { step } => {
                self.step = Some(*step);
                self.step_started = Some(rec.at);
                self.action = None;
            }
            Event::Decided { step, evaluation } => {
                self.action = Some(StepAction {
                    step: *step,
                    decided_at: rec.at,
                    evaluation: (**evaluation).clone(),
                    kill_outcome: None,
                    pull_request: None,
                    notified: false,
                });
            }
            Event::Kill { step, outcome } => {
                if let Some(a) = self.action_at(*step) {
                    a.kill_outcome = Some(*outcome);
                }
            }
            Event::PullRequest { step, url } => {
                if let Some(a) = self.action_at(*step) {
                    a.pull_request = Some(url.clone());
                }
            }
            Event::Notified { step } => {
                if let Some(a) = self.action_at(*step) {
                    a.notified = true;
                }
            }
        }
    }

    /// The move decided at the current step halted the rollout (rollback, pause): nothing
    /// more is done until the policy moves it to another step (a human's merge).
    pub fn halted(&self) -> bool {
        self.action
            .as_ref()
            .is_some_and(|a| a.evaluation.action.halts())
    }

    fn action_at(&mut self, step: u32) -> Option<&mut StepAction> {
        self.action.as_mut().filter(|a| a.step == step)
    }

    /// The move decided at `step` that is still waiting for its actions, if any.
    pub fn decided(&self, step: u32) -> Option<Move> {
        self.action
            .as_ref()
            .filter(|a| a.step == step)
            .map(|a| a.evaluation.action)
    }
}

/// One rollout's chain, loaded and verified.
#[derive(Debug)]
pub struct Chain {
    path: PathBuf,
    rollout: String,
    records: Vec<Record>,
    /// Each record's JSON as written (what the hashes cover).
    written: Vec<Box<RawValue>>,
    /// The hash of the last record.
    head: Option<String>,
    state: RolloutState,
}

/// The state file of rollout `name` under `data_dir`.
pub fn path(data_dir: &Path, name: &str) -> Result<PathBuf, ChainError> {
    if !halo_policy::validate::is_name(name) {
        return Err(ChainError::BadName(name.to_string()));
    }
    Ok(data_dir.join(DIR).join(format!("{name}.json")))
}

/// `sha256:<hex>` of a record's JSON as written.
fn hash(written: &RawValue) -> String {
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(written.get().as_bytes()))
    )
}

/// Load and verify rollout `name`'s chain; a missing file is an empty chain.
pub fn load(data_dir: &Path, name: &str) -> Result<Chain, ChainError> {
    let path = path(data_dir, name)?;
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Chain {
                path,
                rollout: name.to_string(),
                records: Vec::new(),
                written: Vec::new(),
                head: None,
                state: RolloutState::default(),
            });
        }
        Err(source) => return Err(ChainError::Read { path, source }),
    };
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    let file: File = serde_path_to_error::deserialize(de).map_err(|e| ChainError::Malformed {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let broken = |seq: usize, why: String| ChainError::Broken {
        path: path.clone(),
        seq,
        why,
    };
    if file.rollout != name {
        return Err(broken(
            0,
            format!("the file is rollout {:?}'s", file.rollout),
        ));
    }
    let mut head: Option<String> = None;
    let mut state = RolloutState::default();
    let mut records = Vec::with_capacity(file.records.len());
    for (i, written) in file.records.iter().enumerate() {
        let rec: Record =
            serde_json::from_str(written.get()).map_err(|e| ChainError::Malformed {
                path: path.clone(),
                message: format!("records[{i}]: {e}"),
            })?;
        if rec.seq != i as u64 {
            return Err(broken(i, format!("its seq is {}, expected {i}", rec.seq)));
        }
        if rec.prev != head {
            return Err(broken(
                i,
                format!(
                    "it names {} as the record before, which hashes to {}",
                    rec.prev.as_deref().unwrap_or("none"),
                    head.as_deref().unwrap_or("none (it is the first)")
                ),
            ));
        }
        head = Some(hash(written));
        state.apply(&rec);
        records.push(rec);
    }
    if file.head != head {
        let last = file.records.len().saturating_sub(1);
        return Err(broken(
            last,
            format!(
                "the file's head is {}, the last record hashes to {}",
                file.head.as_deref().unwrap_or("none"),
                head.as_deref().unwrap_or("none")
            ),
        ));
    }
    Ok(Chain {
        path,
        rollout: file.rollout,
        records,
        written: file.records,
        head,
        state,
    })
}

impl Chain {
    pub fn state(&self) -> &RolloutState {
        &self.state
    }

    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// The hash of the last record, for an outside anchor.
    pub fn head(&self) -> Option<&str> {
        self.head.as_deref()
    }

    /// Append one transition and write the whole file atomically. On a failed write the
    /// chain in memory is unchanged, as is the file.
    pub fn append(&mut self, at: OffsetDateTime, event: Event) -> Result<(), ChainError> {
        let rec = Record {
            seq: self.records.len() as u64,
            at,
            prev: self.head.clone(),
            event,
        };
        // A record always serializes: no maps with non-string keys, and serde_json
        // writes a non-finite float as null.
        let text = serde_json::to_string(&rec).unwrap_or_default();
        let written = RawValue::from_string(text).map_err(|e| ChainError::Malformed {
            path: self.path.clone(),
            message: format!("record {}: {e}", rec.seq),
        })?;
        let head = hash(&written);
        let mut all = self.written.clone();
        all.push(written);
        let file = File {
            rollout: self.rollout.clone(),
            records: all,
            head: Some(head.clone()),
        };
        let mut bytes = serde_json::to_vec_pretty(&file).unwrap_or_default();
        bytes.push(b'\n');
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| ChainError::Read {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        halo_fsutil::write_atomic(&self.path, &bytes, 0o600)?;
        self.head = Some(head);
        self.state.apply(&rec);
        self.records.push(rec);
        self.written = file.records;
        Ok(())
    }
}
