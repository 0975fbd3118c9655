//! state.json: what halod last applied (spec: halod apply loop, step 10).
//!
//! One writer (the agent's single loop task); every save is atomic. It records the
//! applied release digest, the files halod owns, the pointer marks that make a replayed
//! older pointer detectable (seq per channel), the last-known ring and the last accepted
//! kill-list envelope, so a restart can neither be fed an older pointer nor an older list.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::install::Owned;

/// The file name inside the state dir.
pub const STATE_FILE: &str = "state.json";

/// The last pointer accepted on a channel (`ring-<r>` or a variant channel).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PointerMark {
    pub seq: u64,
    pub digest: String,
}

/// The experiment variant this device runs (client axis).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Assignment {
    pub experiment: String,
    pub variant: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct State {
    /// Digest of the release whose files are on disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The ring of the last successful cycle (used when the ring endpoint fails).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<String>,
    /// The groups that came with the ring (used with it when the ring endpoint fails).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// The subject halo-server named with the ring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The client-axis variant applied, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment: Option<Assignment>,
    /// Pointer marks by channel tag.
    #[serde(default)]
    pub marks: BTreeMap<String, PointerMark>,
    /// Files halod wrote: path -> sha256.
    #[serde(default)]
    pub owned: Owned,
    /// The status of the last cycle or kill reaction (what `halod status` shows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<serde_json::Value>,
    /// The last accepted kill-list envelope, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_envelope: Option<String>,
}

/// state.json could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is corrupt: {message}", path.display())]
    Corrupt { path: PathBuf, message: String },
    #[error(transparent)]
    Write(#[from] halo_fsutil::WriteError),
}

impl State {
    /// Load `dir/state.json`; a missing file is the first run (empty state).
    pub fn load(dir: &Path) -> Result<State, StateError> {
        let path = dir.join(STATE_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
                path,
                message: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(source) => Err(StateError::Read { path, source }),
        }
    }

    /// Save atomically to `dir/state.json` (mode 0600: it names the device's files).
    pub fn save(&self, dir: &Path) -> Result<(), StateError> {
        std::fs::create_dir_all(dir).map_err(|source| StateError::Read {
            path: dir.into(),
            source,
        })?;
        let mut bytes = serde_json::to_vec_pretty(self).map_err(|e| StateError::Corrupt {
            path: dir.join(STATE_FILE),
            message: e.to_string(),
        })?;
        bytes.push(b'\n');
        halo_fsutil::write_atomic(&dir.join(STATE_FILE), &bytes, 0o600)?;
        Ok(())
    }

    /// Whether this is the first run (nothing was ever applied).
    pub fn first_run(&self) -> bool {
        self.digest.is_none() && self.ring.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_a_missing_file_is_the_first_run() {
        let dir = tempfile::tempdir().unwrap();
        let empty = State::load(dir.path()).unwrap();
        assert!(empty.first_run());
        let mut state = State {
            digest: Some("sha256:ab".into()),
            ring: Some("canary".into()),
            ..State::default()
        };
        state.marks.insert(
            "ring-canary.pointer".into(),
            PointerMark {
                seq: 7,
                digest: "sha256:ab".into(),
            },
        );
        state
            .owned
            .insert("/etc/codex/config.toml".into(), "00".into());
        state.save(dir.path()).unwrap();
        let back = State::load(dir.path()).unwrap();
        assert_eq!(back, state);
        assert!(!back.first_run());
    }

    #[test]
    fn a_corrupt_or_unknown_state_is_an_error_not_a_reset() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(STATE_FILE), b"{\"digest\": 1}").unwrap();
        assert!(matches!(
            State::load(dir.path()),
            Err(StateError::Corrupt { .. })
        ));
        std::fs::write(dir.path().join(STATE_FILE), b"{\"rogue\": true}").unwrap();
        assert!(matches!(
            State::load(dir.path()),
            Err(StateError::Corrupt { .. })
        ));
    }
}
