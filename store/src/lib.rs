//! halo-store: halo-server's durable state behind a trait, named append-only logs of JSON
//! records ([`LogStore`]).
//!
//! Everything halo-server keeps is a history (kills and unkills, the audit trail,
//! enrollment tokens, devices, fleet reports) whose current state is a fold over its
//! records, so the one primitive is "append a record durably, read them all back".
//! [`FileStore`] keeps one JSONL file per log in the data dir and fsyncs every append
//! before returning: a reply that says "accepted" is never lost by a crash. A shared
//! database (several replicas) implements the same two methods with one table per log.
//! [`MemoryStore`] serves when no --data-dir is given (nothing survives a restart) and
//! lets tests inject failures.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The logs halo-server keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Log {
    /// Kill and unkill records; last record per experiment or toggle wins (ADR-0009).
    Killswitch,
    /// Who changed what, when and why.
    Audit,
    /// One-time enrollment tokens: minted and used.
    Enrollments,
    /// Devices: enrolled and revoked.
    Devices,
    /// Fleet status reports (halod's status line).
    Reports,
}

impl Log {
    pub const ALL: [Log; 5] = [
        Log::Killswitch,
        Log::Audit,
        Log::Enrollments,
        Log::Devices,
        Log::Reports,
    ];

    /// The file name in the data dir.
    pub fn file_name(self) -> &'static str {
        match self {
            Log::Killswitch => "killswitch.jsonl",
            Log::Audit => "audit.jsonl",
            Log::Enrollments => "enrollments.jsonl",
            Log::Devices => "devices.jsonl",
            Log::Reports => "reports.jsonl",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} line {line}: not a JSON record: {message}")]
    Corrupt {
        path: String,
        line: usize,
        message: String,
    },
    #[error("cannot encode a record: {0}")]
    Encode(String),
    #[error("{0}")]
    Unavailable(String),
}

/// Durable append-only logs.
pub trait LogStore: Send + Sync + 'static {
    /// Append one record; returns only once it is durable.
    fn append(&self, log: Log, record: &serde_json::Value) -> Result<(), StoreError>;
    /// Every record of `log`, oldest first.
    fn read_all(&self, log: Log) -> Result<Vec<serde_json::Value>, StoreError>;
    /// Append the record `next` makes from every record so far, with no other append to
    /// `log` in between, from this process or another sharing the data dir
    /// (`halo controller run` appends kills to the log a halo-server serves). Returns
    /// every record, the new one last, once it is durable.
    fn append_next(
        &self,
        log: Log,
        next: &mut dyn FnMut(&[serde_json::Value]) -> Result<serde_json::Value, StoreError>,
    ) -> Result<Vec<serde_json::Value>, StoreError>;
    /// Where the data lives, for logs and /capabilities.
    fn describe(&self) -> String;
}

/// One JSONL file per log in a directory; every append is written with one `write` and
/// fsynced before it returns.
///
/// Several processes may share the directory (halo-server, and `halo controller run`
/// appending kills): each append holds an exclusive lock on the log file (`flock`), each
/// read a shared one, so a reader never sees half a record and [`LogStore::append_next`]
/// reads and appends with nobody in between.
#[derive(Debug)]
pub struct FileStore {
    dir: PathBuf,
}

impl FileStore {
    /// Open (creating) the data dir. A torn last line, left by a crash in the middle of
    /// an append that was never acknowledged, is cut off; a malformed line anywhere else
    /// is an error, because silently skipping it could forget a kill.
    pub fn open(dir: &Path) -> Result<FileStore, StoreError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| StoreError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        for log in Log::ALL {
            let path = dir.join(log.file_name());
            let mut file = open_options().read(true).open(&path).map_err(io(&path))?;
            repair_torn_tail(&mut file).map_err(io(&path))?;
        }
        // New files are durable only once their directory entries are.
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))?;
        let store = FileStore {
            dir: dir.to_path_buf(),
        };
        for log in Log::ALL {
            store.read_all(log)?;
        }
        Ok(store)
    }

    fn path(&self, log: Log) -> PathBuf {
        self.dir.join(log.file_name())
    }

    /// The log file, locked (exclusively to append, shared to read) until the handle is
    /// dropped. Advisory: it orders the processes that take it, which are all ours.
    fn lock(&self, log: Log, exclusive: bool) -> Result<File, StoreError> {
        let path = self.path(log);
        let io = |source| StoreError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = open_options().read(true).open(&path).map_err(io)?;
        if exclusive {
            file.lock().map_err(io)?;
        } else {
            file.lock_shared().map_err(io)?;
        }
        Ok(file)
    }

    fn read_unlocked(&self, log: Log) -> Result<Vec<serde_json::Value>, StoreError> {
        let path = self.path(log);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(StoreError::Io {
                    path: path.display().to_string(),
                    source,
                });
            }
        };
        let mut out = Vec::new();
        for (i, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|source| StoreError::Io {
                path: path.display().to_string(),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let value = serde_json::from_str(&line).map_err(|e| StoreError::Corrupt {
                path: path.display().to_string(),
                line: i + 1,
                message: e.to_string(),
            })?;
            out.push(value);
        }
        Ok(out)
    }

    fn append_unlocked(&self, log: Log, record: &serde_json::Value) -> Result<(), StoreError> {
        // Compact JSON escapes every newline, so a record is always one line.
        let line = serde_json::to_string(record).map_err(|e| StoreError::Encode(e.to_string()))?;
        // halo-fsutil opens the file per append: a file replaced or made unwritable under
        // us fails this append (and the caller's fail-closed rule) instead of writing to a
        // stale handle. One write, then fsync, before returning.
        halo_fsutil::append_line(&self.path(log), &line)
            .map_err(|e| StoreError::Unavailable(e.to_string()))
    }
}

fn open_options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.append(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Device and enrollment records hold token digests: owner only.
        o.mode(0o600);
    }
    o
}

fn repair_torn_tail(file: &mut File) -> std::io::Result<()> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut reader = BufReader::new(&mut *file);
    let mut good = 0u64;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        if line.last() == Some(&b'\n') {
            good += n as u64;
        } else {
            break;
        }
    }
    if good < len {
        file.set_len(good)?;
        file.sync_all()?;
    }
    file.seek(SeekFrom::End(0))?;
    Ok(())
}

impl LogStore for FileStore {
    fn append(&self, log: Log, record: &serde_json::Value) -> Result<(), StoreError> {
        let _lock = self.lock(log, true)?;
        self.append_unlocked(log, record)
    }

    fn read_all(&self, log: Log) -> Result<Vec<serde_json::Value>, StoreError> {
        let _lock = self.lock(log, false)?;
        self.read_unlocked(log)
    }

    fn append_next(
        &self,
        log: Log,
        next: &mut dyn FnMut(&[serde_json::Value]) -> Result<serde_json::Value, StoreError>,
    ) -> Result<Vec<serde_json::Value>, StoreError> {
        let _lock = self.lock(log, true)?;
        let mut records = self.read_unlocked(log)?;
        let record = next(&records)?;
        self.append_unlocked(log, &record)?;
        records.push(record);
        Ok(records)
    }

    fn describe(&self) -> String {
        format!("files in {}", self.dir.display())
    }
}

/// Logs in memory: used without --data-dir (nothing survives a restart) and in tests.
#[derive(Debug, Default)]
pub struct MemoryStore {
    logs: Mutex<std::collections::BTreeMap<Log, Vec<serde_json::Value>>>,
    failing: Mutex<std::collections::BTreeSet<Log>>,
}

impl MemoryStore {
    /// Make appends to `log` fail (or succeed again), to exercise fail-closed paths.
    pub fn set_failing(&self, log: Log, failing: bool) {
        let mut f = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        if failing {
            f.insert(log);
        } else {
            f.remove(&log);
        }
    }
}

impl MemoryStore {
    fn check_failing(&self, log: Log) -> Result<(), StoreError> {
        if self
            .failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&log)
        {
            return Err(StoreError::Unavailable(format!(
                "{} is failing",
                log.file_name()
            )));
        }
        Ok(())
    }
}

impl LogStore for MemoryStore {
    fn append(&self, log: Log, record: &serde_json::Value) -> Result<(), StoreError> {
        self.check_failing(log)?;
        self.logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(log)
            .or_default()
            .push(record.clone());
        Ok(())
    }

    fn append_next(
        &self,
        log: Log,
        next: &mut dyn FnMut(&[serde_json::Value]) -> Result<serde_json::Value, StoreError>,
    ) -> Result<Vec<serde_json::Value>, StoreError> {
        let mut logs = self.logs.lock().unwrap_or_else(|p| p.into_inner());
        let records = logs.entry(log).or_default();
        let record = next(records)?;
        self.check_failing(log)?;
        records.push(record);
        Ok(records.clone())
    }

    fn read_all(&self, log: Log) -> Result<Vec<serde_json::Value>, StoreError> {
        Ok(self
            .logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&log)
            .cloned()
            .unwrap_or_default())
    }

    fn describe(&self) -> String {
        "memory (no --data-dir: nothing survives a restart)".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Write;

    #[test]
    fn appends_survive_reopen_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        store.append(Log::Killswitch, &json!({"seq": 1})).unwrap();
        store.append(Log::Killswitch, &json!({"seq": 2})).unwrap();
        drop(store);
        // A crash mid-append leaves a line without its newline.
        let path = dir.path().join("killswitch.jsonl");
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"seq\": 3").unwrap();
        drop(f);
        let store = FileStore::open(dir.path()).unwrap();
        assert_eq!(
            store.read_all(Log::Killswitch).unwrap(),
            vec![json!({"seq": 1}), json!({"seq": 2})]
        );
        store.append(Log::Killswitch, &json!({"seq": 3})).unwrap();
        assert_eq!(store.read_all(Log::Killswitch).unwrap().len(), 3);
    }

    /// Two stores on one dir stand for two processes (halo-server and `halo controller
    /// run`): each file lock is per open file, so they exclude each other like processes.
    #[test]
    fn appenders_sharing_a_dir_never_take_the_same_next_record() {
        let dir = tempfile::tempdir().unwrap();
        let stores = [
            std::sync::Arc::new(FileStore::open(dir.path()).unwrap()),
            std::sync::Arc::new(FileStore::open(dir.path()).unwrap()),
        ];
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let store = std::sync::Arc::clone(&stores[t % 2]);
                std::thread::spawn(move || {
                    for _ in 0..25 {
                        store
                            .append_next(Log::Killswitch, &mut |records| {
                                Ok(json!({"seq": records.len() + 1}))
                            })
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let seqs: Vec<u64> = stores[0]
            .read_all(Log::Killswitch)
            .unwrap()
            .iter()
            .map(|r| r["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, (1..=100).collect::<Vec<_>>());
    }

    #[test]
    fn a_corrupt_middle_line_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("audit.jsonl"), "{\"a\":1}\nnot json\n{}\n").unwrap();
        let err = FileStore::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("audit.jsonl line 2"), "{err}");
    }
}
