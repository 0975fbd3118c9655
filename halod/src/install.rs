//! Writing a release's files (spec: halod apply loop, steps 7-9).
//!
//! Every file goes through checkTarget ([`Targets::check`]); one that fails is refused and
//! reported, and the rest still apply. A file is written only when its content differs
//! from what is on disk, atomically (temp, fsync, rename). When the release did not
//! change but the disk did, the file is rewritten and flagged as drift: someone edited a
//! managed file by hand. Files the previous release owned that this one does not ship are
//! removed, but only inside managed locations.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::target::{TargetError, Targets};

/// A file a release wants on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredFile {
    /// Absolute path as the release names it (`/etc/codex/config.toml`).
    pub path: String,
    pub mode: u32,
    pub content: Vec<u8>,
}

/// Files halod owns: release path -> sha256 (hex) of the content it wrote.
pub type Owned = BTreeMap<String, String>;

/// What one apply did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub written: Vec<String>,
    pub unchanged: Vec<String>,
    /// Rewritten because the disk differed while the release did not change.
    pub drift: Vec<String>,
    pub refused: Vec<(String, String)>,
    pub removed: Vec<String>,
    /// Files that could not be written or removed (I/O), with the reason.
    pub failed: Vec<(String, String)>,
    /// What halod owns after this apply.
    pub owned: Owned,
}

impl ApplyReport {
    /// True when every file of the release is on disk as the release says.
    pub fn complete(&self) -> bool {
        self.refused.is_empty() && self.failed.is_empty()
    }
}

/// sha256 hex of `bytes`.
pub fn content_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// How a file reaches the disk: `halo_fsutil::write_atomic` (temp, fsync, rename,
/// fsync the directory). A seam so tests can cut the power between write and rename.
pub type Writer = dyn Fn(&Path, &[u8], u32) -> Result<(), String> + Send + Sync;

/// The production writer.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    halo_fsutil::write_atomic(path, bytes, mode).map_err(|e| e.to_string())
}

/// Apply `desired` over what `previous` recorded. `release_changed` says whether the
/// release digest differs from the last applied one (drift is only meaningful when not).
pub fn apply(
    targets: &Targets,
    desired: &[DesiredFile],
    previous: &Owned,
    release_changed: bool,
) -> ApplyReport {
    apply_with(targets, desired, previous, release_changed, &write_atomic)
}

/// [`apply`] with an explicit writer.
pub fn apply_with(
    targets: &Targets,
    desired: &[DesiredFile],
    previous: &Owned,
    release_changed: bool,
    writer: &Writer,
) -> ApplyReport {
    let mut report = ApplyReport::default();
    for file in desired {
        match ensure_file(targets, file, previous, release_changed, writer) {
            Ok(Outcome::Unchanged) => report.unchanged.push(file.path.clone()),
            Ok(Outcome::Written) => report.written.push(file.path.clone()),
            Ok(Outcome::Drift) => report.drift.push(file.path.clone()),
            Err(Failure::Refused(e)) => {
                report.refused.push((file.path.clone(), e.to_string()));
                continue;
            }
            Err(Failure::Io(e)) => {
                report.failed.push((file.path.clone(), e));
                // Keep ownership of what we had: a later cycle retries it.
                if let Some(hash) = previous.get(&file.path) {
                    report.owned.insert(file.path.clone(), hash.clone());
                }
                continue;
            }
        }
        report
            .owned
            .insert(file.path.clone(), content_hash(&file.content));
    }
    for (path, hash) in previous {
        if desired.iter().any(|f| &f.path == path) {
            continue;
        }
        match remove_stale(targets, path) {
            Ok(true) => report.removed.push(path.clone()),
            Ok(false) => {}
            Err(e) => {
                report.failed.push((path.clone(), e));
                report.owned.insert(path.clone(), hash.clone());
            }
        }
    }
    report
}

enum Outcome {
    Unchanged,
    Written,
    Drift,
}

enum Failure {
    Refused(TargetError),
    Io(String),
}

fn ensure_file(
    targets: &Targets,
    file: &DesiredFile,
    previous: &Owned,
    release_changed: bool,
    writer: &Writer,
) -> Result<Outcome, Failure> {
    let host = targets
        .check(&file.path, file.mode)
        .map_err(Failure::Refused)?;
    let want = content_hash(&file.content);
    let on_disk = fs::read(&host).ok().map(|b| content_hash(&b));
    if on_disk.as_deref() == Some(want.as_str()) {
        return Ok(Outcome::Unchanged);
    }
    if let Some(parent) = host.parent() {
        fs::create_dir_all(parent).map_err(|e| Failure::Io(e.to_string()))?;
        // A directory we just created must pass checkTarget too (umask could have made
        // it group-writable).
        targets
            .check(&file.path, file.mode)
            .map_err(Failure::Refused)?;
    }
    writer(&host, &file.content, file.mode).map_err(Failure::Io)?;
    let drift = !release_changed
        && previous.get(&file.path) == Some(&want)
        && on_disk.as_deref() != Some(want.as_str());
    Ok(if drift {
        Outcome::Drift
    } else {
        Outcome::Written
    })
}

/// Remove a file the previous release owned. Only managed paths that pass checkTarget
/// are touched; anything else is left alone (and dropped from ownership).
fn remove_stale(targets: &Targets, path: &str) -> Result<bool, String> {
    let Ok(host) = targets.check(path, 0o644) else {
        return Ok(false);
    };
    match fs::remove_file(&host) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn setup() -> (tempfile::TempDir, Targets) {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let targets = Targets::new(
            dir.path(),
            vec![
                "/etc/codex/".into(),
                "/etc/claude-code/managed-settings.json".into(),
            ],
        );
        (dir, targets)
    }

    fn file(path: &str, content: &str) -> DesiredFile {
        DesiredFile {
            path: path.into(),
            mode: 0o644,
            content: content.as_bytes().to_vec(),
        }
    }

    #[test]
    fn writes_only_what_changed_and_flags_drift() {
        let (dir, targets) = setup();
        let desired = vec![
            file("/etc/codex/config.toml", "model = \"gpt\"\n"),
            file("/etc/claude-code/managed-settings.json", "{}\n"),
        ];
        let first = apply(&targets, &desired, &Owned::new(), true);
        assert_eq!(first.written.len(), 2);
        assert!(first.complete());

        let second = apply(&targets, &desired, &first.owned, false);
        assert_eq!(second.unchanged.len(), 2, "{second:?}");
        assert!(second.written.is_empty());

        let codex = dir.path().join("etc/codex/config.toml");
        fs::write(&codex, "model = \"hand-edited\"\n").unwrap();
        let third = apply(&targets, &desired, &second.owned, false);
        assert_eq!(third.drift, vec!["/etc/codex/config.toml".to_string()]);
        assert_eq!(fs::read_to_string(&codex).unwrap(), "model = \"gpt\"\n");
    }

    #[test]
    fn a_refused_file_does_not_stop_the_others() {
        let (dir, targets) = setup();
        fs::create_dir_all(dir.path().join("etc/claude-code")).unwrap();
        fs::set_permissions(
            dir.path().join("etc/claude-code"),
            fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        let desired = vec![
            file("/etc/claude-code/managed-settings.json", "{}\n"),
            file("/etc/codex/config.toml", "x = 1\n"),
            file("/etc/passwd", "root::0:0::/:/bin/sh\n"),
        ];
        let report = apply(&targets, &desired, &Owned::new(), true);
        assert_eq!(report.written, vec!["/etc/codex/config.toml".to_string()]);
        let refused: Vec<&str> = report.refused.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            refused,
            ["/etc/claude-code/managed-settings.json", "/etc/passwd"]
        );
        assert!(!dir.path().join("etc/passwd").exists());
        assert!(!report.owned.contains_key("/etc/passwd"));
    }

    #[test]
    fn stale_files_are_removed_only_inside_managed_locations() {
        let (dir, targets) = setup();
        let v1 = vec![
            file("/etc/codex/config.toml", "a\n"),
            file("/etc/codex/extra.toml", "b\n"),
        ];
        let first = apply(&targets, &v1, &Owned::new(), true);
        // A tampered state file claims ownership of an unmanaged file: never removed.
        let mut owned = first.owned.clone();
        fs::create_dir_all(dir.path().join("etc")).unwrap();
        fs::write(dir.path().join("etc/hosts"), "127.0.0.1 localhost\n").unwrap();
        owned.insert("/etc/hosts".into(), content_hash(b"x"));
        let v2 = vec![file("/etc/codex/config.toml", "a\n")];
        let second = apply(&targets, &v2, &owned, true);
        assert_eq!(second.removed, vec!["/etc/codex/extra.toml".to_string()]);
        assert!(!dir.path().join("etc/codex/extra.toml").exists());
        assert!(dir.path().join("etc/hosts").exists());
        assert_eq!(second.owned.len(), 1);
    }
}
