//! checkTarget: whether halod may write a file (spec: halod apply loop, step 7).
//!
//! A file is written only when
//! - its path is one of the adapter's managed files or lies inside a managed directory,
//! - its mode is 0644 or lower,
//! - every component that exists, from the root down to the file, is owned by root (or by
//!   the user halod runs as, for a rootless devcontainer), is not group- or
//!   world-writable, and is not a symlink (a planted link could redirect the write).
//!
//! With a root prefix (tests, devcontainers) the prefix stands in for `/`: the checks start
//! at the prefix, and paths in releases stay absolute (`/etc/claude-code/...`).

use std::fs;
use std::path::{Component, Path, PathBuf};

/// Why a target was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("path must be absolute and plain (no '..')")]
    NotAbsolute,
    #[error("path is outside the adapter's managed locations")]
    Unmanaged,
    #[error("mode {0:o} is above 0644")]
    Mode(u32),
    #[error("{} is a symlink", .0.display())]
    Symlink(PathBuf),
    #[error("{path} is owned by uid {1}, not root", path = .0.display())]
    Owner(PathBuf, u32),
    #[error("{path} is group- or world-writable (mode {1:o})", path = .0.display())]
    Writable(PathBuf, u32),
    #[error("{} is not a directory", .0.display())]
    NotDirectory(PathBuf),
    #[error("checking {path}: {1}", path = .0.display())]
    Io(PathBuf, String),
}

/// Where halod writes: a root prefix and the managed locations of the release's adapters.
#[derive(Debug, Clone)]
pub struct Targets {
    root: PathBuf,
    managed: Vec<String>,
}

impl Targets {
    /// `root` is `/` in production. `managed` are absolute paths: a managed file, or a
    /// managed directory when it ends with `/`.
    pub fn new(root: impl Into<PathBuf>, managed: Vec<String>) -> Targets {
        Targets {
            root: root.into(),
            managed,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the release path `path` is a managed location.
    pub fn is_managed(&self, path: &str) -> bool {
        self.managed.iter().any(|m| match m.strip_suffix('/') {
            Some(dir) => path
                .strip_prefix(dir)
                .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1),
            None => path == m,
        })
    }

    /// The on-disk path of the release path `path` (under the root prefix).
    pub fn host_path(&self, path: &str) -> Result<PathBuf, TargetError> {
        let rel = Path::new(path)
            .strip_prefix("/")
            .map_err(|_| TargetError::NotAbsolute)?;
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(TargetError::NotAbsolute);
        }
        Ok(self.root.join(rel))
    }

    /// checkTarget: may halod write `path` with `mode`? Returns the on-disk path.
    pub fn check(&self, path: &str, mode: u32) -> Result<PathBuf, TargetError> {
        let host = self.host_path(path)?;
        if !self.is_managed(path) {
            return Err(TargetError::Unmanaged);
        }
        if mode & !0o644 != 0 {
            return Err(TargetError::Mode(mode));
        }
        // Walk from the root prefix down: every existing component is checked; the first
        // missing one ends the walk (halod creates the rest itself, safely).
        let mut current = self.root.clone();
        check_component(&current, true)?;
        let rel = host.strip_prefix(&self.root).unwrap_or(&host).to_path_buf();
        let count = rel.components().count();
        for (i, component) in rel.components().enumerate() {
            current.push(component);
            let is_dir = i + 1 < count;
            match fs::symlink_metadata(&current) {
                Ok(_) => check_component(&current, is_dir)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) => return Err(TargetError::Io(current, e.to_string())),
            }
        }
        Ok(host)
    }
}

fn check_component(path: &Path, want_dir: bool) -> Result<(), TargetError> {
    let meta =
        fs::symlink_metadata(path).map_err(|e| TargetError::Io(path.into(), e.to_string()))?;
    if meta.file_type().is_symlink() {
        return Err(TargetError::Symlink(path.into()));
    }
    if want_dir && !meta.is_dir() {
        return Err(TargetError::NotDirectory(path.into()));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let uid = meta.uid();
        if uid != 0 && uid != own_uid() {
            return Err(TargetError::Owner(path.into(), uid));
        }
        let mode = meta.mode() & 0o7777;
        // A sticky world-writable directory (/tmp) still lets others plant entries.
        if mode & 0o022 != 0 {
            return Err(TargetError::Writable(path.into(), mode));
        }
    }
    Ok(())
}

#[cfg(unix)]
fn own_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    fn targets(root: &Path) -> Targets {
        Targets::new(
            root,
            vec![
                "/etc/claude-code/managed-settings.json".into(),
                "/etc/codex/".into(),
            ],
        )
    }

    #[test]
    fn managed_files_and_directories_pass() {
        let dir = root();
        let t = targets(dir.path());
        let host = t
            .check("/etc/claude-code/managed-settings.json", 0o644)
            .unwrap();
        assert_eq!(
            host,
            dir.path().join("etc/claude-code/managed-settings.json")
        );
        t.check("/etc/codex/config.toml", 0o600).unwrap();
    }

    #[test]
    fn unmanaged_paths_are_refused() {
        let dir = root();
        let t = targets(dir.path());
        for path in [
            "/etc/passwd",
            "/etc/codex",
            "/etc/codexx/config.toml",
            "/etc/claude-code/other.json",
        ] {
            assert_eq!(t.check(path, 0o644), Err(TargetError::Unmanaged), "{path}");
        }
        assert_eq!(
            t.check("/etc/codex/../passwd", 0o644),
            Err(TargetError::NotAbsolute)
        );
        assert_eq!(t.check("etc/codex/x", 0o644), Err(TargetError::NotAbsolute));
    }

    #[test]
    fn modes_above_0644_are_refused() {
        let dir = root();
        let t = targets(dir.path());
        for mode in [0o755, 0o664, 0o646, 0o4644] {
            assert_eq!(
                t.check("/etc/codex/config.toml", mode),
                Err(TargetError::Mode(mode))
            );
        }
    }

    #[test]
    fn a_planted_symlink_is_refused() {
        let dir = root();
        let elsewhere = root();
        fs::create_dir_all(dir.path().join("etc")).unwrap();
        symlink(elsewhere.path(), dir.path().join("etc/codex")).unwrap();
        let t = targets(dir.path());
        assert!(matches!(
            t.check("/etc/codex/config.toml", 0o644),
            Err(TargetError::Symlink(p)) if p.ends_with("etc/codex")
        ));
        // A link planted as the file itself is refused too.
        fs::create_dir_all(dir.path().join("etc/claude-code")).unwrap();
        symlink(
            "/etc/shadow",
            dir.path().join("etc/claude-code/managed-settings.json"),
        )
        .unwrap();
        assert!(matches!(
            t.check("/etc/claude-code/managed-settings.json", 0o644),
            Err(TargetError::Symlink(_))
        ));
    }

    #[test]
    fn a_world_or_group_writable_parent_is_refused() {
        let dir = root();
        let etc = dir.path().join("etc/codex");
        fs::create_dir_all(&etc).unwrap();
        fs::set_permissions(&etc, fs::Permissions::from_mode(0o777)).unwrap();
        let t = targets(dir.path());
        assert!(matches!(
            t.check("/etc/codex/config.toml", 0o644),
            Err(TargetError::Writable(p, 0o777)) if p == etc
        ));
        fs::set_permissions(&etc, fs::Permissions::from_mode(0o775)).unwrap();
        assert!(matches!(
            t.check("/etc/codex/config.toml", 0o644),
            Err(TargetError::Writable(_, 0o775))
        ));
    }
}
