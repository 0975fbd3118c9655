//! `controller-state.jsonl`: what the controller did, one fsynced line per step, so that
//! every action happens at most once per experiment run, across failures and restarts.
//!
//! A run starts when the controller first sees an experiment `running` and ends when it
//! sees it not running (paused, concluded, removed). Within a run, an action is recorded
//! as decided before any of its steps, and each step (kill, pull request, notification)
//! is recorded when it is done: a restart resumes the steps not yet recorded and never
//! repeats one that was. The in-memory state is a fold over the file.
//!
//! Appends are synchronous (an fsync of one line) on purpose: the tick is cancelled at
//! its budget only at await points, so a record is never written without also being
//! applied in memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::decide::{Decision, Verdict};
use crate::kill::KillOutcome;

/// The state file's name in the data dir.
pub const STATE_FILE: &str = "controller-state.jsonl";

/// One line of the state file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Record {
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    pub experiment: String,
    pub run: u64,
    pub event: Event,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    RunStarted,
    RunEnded,
    /// Humans were told the experiment is killed and held (once per run).
    HeldNotified,
    /// A rollback, promotion or expiry was decided; its steps follow.
    Decided {
        verdict: Box<Verdict>,
    },
    /// The rollback's kill step, whatever its outcome (it is not retried).
    Kill {
        #[serde(rename = "killOutcome")]
        outcome: KillOutcome,
    },
    PullRequest {
        url: String,
    },
    Notified,
}

/// An action in progress or done, within one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActionState {
    pub decision: Decision,
    #[serde(with = "time::serde::rfc3339")]
    pub decided_at: OffsetDateTime,
    pub verdict: Verdict,
    pub kill_outcome: Option<KillOutcome>,
    pub pull_request: Option<String>,
    pub notified: bool,
}

/// One experiment's state.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExperimentState {
    pub run: u64,
    pub open: bool,
    #[serde(with = "time::serde::rfc3339")]
    pub run_started: OffsetDateTime,
    pub held_notified: bool,
    pub action: Option<ActionState>,
}

/// The fold over the file.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct State {
    pub experiments: BTreeMap<String, ExperimentState>,
}

impl State {
    fn apply(&mut self, rec: &Record) {
        if let Event::RunStarted = rec.event {
            self.experiments.insert(
                rec.experiment.clone(),
                ExperimentState {
                    run: rec.run,
                    open: true,
                    run_started: rec.at,
                    held_notified: false,
                    action: None,
                },
            );
            return;
        }
        let Some(exp) = self.experiments.get_mut(&rec.experiment) else {
            return;
        };
        if exp.run != rec.run {
            return;
        }
        match &rec.event {
            Event::RunStarted => {}
            Event::RunEnded => exp.open = false,
            Event::HeldNotified => exp.held_notified = true,
            Event::Decided { verdict } => {
                exp.action = Some(ActionState {
                    decision: verdict.decision,
                    decided_at: rec.at,
                    verdict: (**verdict).clone(),
                    kill_outcome: None,
                    pull_request: None,
                    notified: false,
                })
            }
            Event::Kill { outcome } => {
                if let Some(a) = exp.action.as_mut() {
                    a.kill_outcome = Some(*outcome);
                }
            }
            Event::PullRequest { url } => {
                if let Some(a) = exp.action.as_mut() {
                    a.pull_request = Some(url.clone());
                }
            }
            Event::Notified => {
                if let Some(a) = exp.action.as_mut() {
                    a.notified = true;
                }
            }
        }
    }

    /// The open run of an experiment, if any.
    pub fn open_run(&self, experiment: &str) -> Option<&ExperimentState> {
        self.experiments.get(experiment).filter(|e| e.open)
    }

    /// The number the experiment's next run gets.
    pub fn next_run(&self, experiment: &str) -> u64 {
        self.experiments.get(experiment).map_or(1, |e| e.run + 1)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path} line {line}: {message}")]
    Corrupt {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Write(#[from] halo_fsutil::WriteError),
    #[error("cannot encode a state record: {0}")]
    Encode(String),
}

/// The state file and its fold.
#[derive(Debug)]
pub struct StateLog {
    path: PathBuf,
    state: State,
}

impl StateLog {
    /// Read `controller-state.jsonl` in `dir` (a missing file is an empty state). A line
    /// that does not decode is an error naming the file, the line and the field.
    pub fn open(dir: &Path) -> Result<StateLog, StateError> {
        let path = dir.join(STATE_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => return Err(StateError::Read { path, source }),
        };
        let mut state = State::default();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let de = &mut serde_json::Deserializer::from_str(line);
            let rec: Record =
                serde_path_to_error::deserialize(de).map_err(|e| StateError::Corrupt {
                    path: path.clone(),
                    line: i + 1,
                    message: format!("{}: {}", e.path(), e.inner()),
                })?;
            state.apply(&rec);
        }
        Ok(StateLog { path, state })
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append a record (fsynced) and apply it.
    pub fn append(
        &mut self,
        at: OffsetDateTime,
        experiment: &str,
        run: u64,
        event: Event,
    ) -> Result<(), StateError> {
        let rec = Record {
            at,
            experiment: experiment.to_string(),
            run,
            event,
        };
        let line = serde_json::to_string(&rec).map_err(|e| StateError::Encode(e.to_string()))?;
        halo_fsutil::append_line(&self.path, &line)?;
        self.state.apply(&rec);
        Ok(())
    }
}

/// RFC 3339 for humans and JSON.
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_line_names_file_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(STATE_FILE),
            "{\"at\":\"2026-12-01T00:00:00Z\",\"experiment\":\"e\",\"run\":1,\"event\":{\"kind\":\"run_started\"}}\n\
             {\"at\":\"2026-12-01T00:00:00Z\",\"experiment\":\"e\",\"run\":\"x\",\"event\":{\"kind\":\"notified\"}}\n",
        )
        .unwrap();
        let err = StateLog::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains(STATE_FILE), "{err}");
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("run"), "{err}");
    }

    #[test]
    fn runs_fold_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let t = OffsetDateTime::UNIX_EPOCH;
        let mut log = StateLog::open(dir.path()).unwrap();
        log.append(t, "e", 1, Event::RunStarted).unwrap();
        log.append(t, "e", 1, Event::HeldNotified).unwrap();
        log.append(t, "e", 1, Event::RunEnded).unwrap();
        let reopened = StateLog::open(dir.path()).unwrap();
        assert_eq!(reopened.state(), log.state());
        assert!(reopened.state().open_run("e").is_none());
        assert_eq!(reopened.state().next_run("e"), 2);
    }
}
