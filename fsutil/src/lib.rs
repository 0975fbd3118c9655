//! halo-fsutil: every durable write Halos makes goes through here.
//!
//! - [`write_atomic`]: a temp file in the target's directory, fsync, rename over the
//!   target, fsync the directory. A reader (or a machine that lost power) sees the old
//!   file or the new one, never half of one.
//! - [`create_new`]: create a file that must not exist yet, with its mode set at creation
//!   (a private key is never world-readable, not even for an instant).
//! - [`append_line`]: one line appended to a log and fsynced before returning, so an
//!   append that returned is on disk (the kill log and the audit log rely on it).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A failed write, naming the file and the step.
#[derive(Debug, thiserror::Error)]
#[error("{step} {}: {source}", path.display())]
pub struct WriteError {
    pub step: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn at<'p>(step: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> WriteError + 'p {
    move |source| WriteError {
        step,
        path: path.to_path_buf(),
        source,
    }
}

/// Write `bytes` to `path` atomically, the new file getting `mode` (on Unix).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), WriteError> {
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .ok_or_else(|| WriteError {
            step: "naming",
            path: path.to_path_buf(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"),
        })?
        .to_string_lossy()
        .into_owned();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    // A temp file of this name can only be left by a dead process that had our pid (a
    // power cut between write and rename): it is garbage, and create_new would fail on it.
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut file = create_new(&tmp, mode)?;
        file.write_all(bytes).map_err(at("writing", &tmp))?;
        file.sync_all().map_err(at("syncing", &tmp))?;
        fs::rename(&tmp, path).map_err(at("renaming over", path))?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Create `path`, failing if it exists, with `mode` on Unix.
pub fn create_new(path: &Path, mode: u32) -> Result<File, WriteError> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    options.open(path).map_err(at("creating", path))
}

/// Append `line` plus a newline to `path` (created with mode 0600 if missing) and fsync
/// it before returning. `line` must not contain a newline.
pub fn append_line(path: &Path, line: &str) -> Result<(), WriteError> {
    if line.contains('\n') {
        return Err(WriteError {
            step: "appending to",
            path: path.to_path_buf(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "a log line holds a newline"),
        });
    }
    let existed = path.exists();
    let mut options = OpenOptions::new();
    options.append(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(at("opening", path))?;
    let mut record = String::with_capacity(line.len() + 1);
    record.push_str(line);
    record.push('\n');
    // One write call: concurrent appenders (O_APPEND) never interleave within a line.
    file.write_all(record.as_bytes())
        .map_err(at("appending to", path))?;
    file.sync_data().map_err(at("syncing", path))?;
    if !existed {
        sync_dir(parent_dir(path))?;
    }
    Ok(())
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// A rename or a new file is durable only once its directory entry is.
fn sync_dir(dir: &Path) -> Result<(), WriteError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(at("syncing directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_the_file_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.json");
        write_atomic(&path, b"old", 0o644).unwrap();
        write_atomic(&path, b"new", 0o644).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "only the target remains");
    }

    #[cfg(unix)]
    #[test]
    fn write_atomic_sets_the_mode_at_creation() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        write_atomic(&path, b"s", 0o600).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("target");
        write_atomic(&path, b"old", 0o644).unwrap();
        // Renaming a file over a non-empty directory fails after the temp file was
        // written and synced: the moment a crash would hit.
        let blocked = dir.path().join("blocked");
        fs::create_dir(&blocked).unwrap();
        fs::write(blocked.join("x"), b"x").unwrap();
        let err = write_atomic(&blocked, b"new", 0o644).unwrap_err();
        assert_eq!(err.step, "renaming over");
        assert_eq!(fs::read(&path).unwrap(), b"old");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            names.iter().all(|n| !n.contains(".tmp-")),
            "temp file removed: {names:?}"
        );
    }

    #[test]
    fn create_new_refuses_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        create_new(&path, 0o600).unwrap();
        let err = create_new(&path, 0o600).unwrap_err();
        assert_eq!(err.source.kind(), io::ErrorKind::AlreadyExists);
    }

    #[test]
    fn append_line_appends_whole_lines_and_refuses_embedded_newlines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        append_line(&path, r#"{"a":1}"#).unwrap();
        append_line(&path, r#"{"a":2}"#).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "{\"a\":1}\n{\"a\":2}\n");
        assert!(append_line(&path, "two\nlines").is_err());
        assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 2);
    }
}
