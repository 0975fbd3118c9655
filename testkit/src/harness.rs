//! The real coding tools (Claude Code, Codex, Gemini CLI) for live tests.
//!
//! [`pinned`] reads the versions `scripts/install.sh` installs (`scripts/harnesses.txt`,
//! one cache directory per harness and version); [`Pinned::binary`] finds the installed
//! command. [`run`] starts one non-interactively and waits, bounded:
//! - a throwaway HOME (and working directory), and an environment built from nothing but
//!   PATH, HOME, the harness's own switches for telemetry and update checks
//!   ([`Pinned::quiet_env`]) and what the test passes: a developer's own settings or
//!   credentials cannot leak in;
//! - the files a release renders, at their real system-wide paths (`/etc/claude-code/...`,
//!   `/etc/codex/...`), seen by that process alone: it runs in a private mount namespace
//!   where an overlay lays the files over the machine's `/etc`. The machine's `/etc` is
//!   never written, so tests and engineers running side by side do not see each other's
//!   managed settings. Needs root (or CAP_SYS_ADMIN) and overlayfs, as the test machine has.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The list scripts/install.sh installs from.
const HARNESSES_TXT: &str = include_str!("../../scripts/harnesses.txt");

/// One pinned harness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinned {
    /// The policy's harness name: `claude-code`, `codex`, `gemini-cli`.
    pub harness: String,
    /// The npm package.
    pub package: String,
    /// The exact version.
    pub version: String,
    /// The command the package installs.
    pub command: String,
}

/// Every pinned harness, in file order.
pub fn pinned() -> Vec<Pinned> {
    HARNESSES_TXT
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(
                f.len(),
                4,
                "scripts/harnesses.txt: {l:?} is not `harness package version command`"
            );
            Pinned {
                harness: f[0].into(),
                package: f[1].into(),
                version: f[2].into(),
                command: f[3].into(),
            }
        })
        .collect()
}

/// The pinned `harness` (`claude-code`, `codex`, `gemini-cli`).
pub fn pinned_for(harness: &str) -> Pinned {
    pinned()
        .into_iter()
        .find(|p| p.harness == harness)
        .unwrap_or_else(|| panic!("{harness} is not in scripts/harnesses.txt"))
}

/// Where scripts/install.sh installs harnesses (`HALO_HARNESS_CACHE`, else
/// `~/.cache/halos/harnesses`).
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HALO_HARNESS_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".cache/halos/harnesses")
}

impl Pinned {
    /// The installed command; panics saying how to install it when it is missing.
    pub fn binary(&self) -> PathBuf {
        let dir = cache_dir().join(format!("{}-{}", self.harness, self.version));
        let bin = dir.join("node_modules/.bin").join(&self.command);
        assert!(
            dir.join(".installed").is_file() && bin.is_file(),
            "{}@{} is not installed at {}; run `bash scripts/install.sh`",
            self.package,
            self.version,
            dir.display()
        );
        bin
    }

    /// The harness's own switches that keep a run quiet and offline: no telemetry, no
    /// error reports, no update checks. (Codex and Gemini CLI have settings, not
    /// variables, for these: see [`Pinned::home_files`].)
    pub fn quiet_env(&self) -> Vec<(String, String)> {
        let pairs: &[(&str, &str)] = match self.harness.as_str() {
            "claude-code" => &[
                ("DISABLE_TELEMETRY", "1"),
                ("DISABLE_ERROR_REPORTING", "1"),
                ("DISABLE_AUTOUPDATER", "1"),
                ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            ],
            // Headless runs refuse an untrusted folder; the throwaway HOME is one.
            "gemini-cli" => &[("GEMINI_CLI_TRUST_WORKSPACE", "true")],
            _ => &[],
        };
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// User-level files (relative to HOME) that switch off what has no variable:
    /// Codex's update check and analytics, Gemini CLI's usage statistics and updates.
    /// They hold no gateway settings: those come only from the release's files.
    pub fn home_files(&self) -> Vec<(String, Vec<u8>)> {
        match self.harness.as_str() {
            "codex" => vec![(
                ".codex/config.toml".into(),
                b"check_for_update_on_startup = false\n\n[analytics]\nenabled = false\n".to_vec(),
            )],
            "gemini-cli" => vec![(
                ".gemini/settings.json".into(),
                br#"{"general": {"disableAutoUpdate": true, "disableUpdateNag": true}, "privacy": {"usageStatisticsEnabled": false}}"#
                    .to_vec(),
            )],
            _ => vec![],
        }
    }
}

/// One run of a harness.
#[derive(Debug, Clone)]
pub struct Run {
    /// argv[0]: usually [`Pinned::binary`]; `sh` for a login-shell style run.
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Extra environment (after PATH, HOME and `quiet_env`).
    pub env: Vec<(String, String)>,
    /// Directories put first on PATH (a helper command's stand-in, for example).
    pub path_first: Vec<PathBuf>,
    /// Files at absolute paths under `/etc` (a release's files for linux).
    pub etc_files: Vec<(String, Vec<u8>)>,
    /// Files relative to the throwaway HOME.
    pub home_files: Vec<(String, Vec<u8>)>,
    pub timeout: Duration,
}

/// What a run printed and how it ended.
#[derive(Debug, Clone)]
pub struct Output {
    /// The exit code; `None` when killed (see `timed_out`).
    pub code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub duration: Duration,
}

impl Output {
    /// Both streams, for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "exit {:?} (timed out: {}) after {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.timed_out, self.duration, self.stdout, self.stderr
        )
    }
}

fn write_tree(root: &Path, files: &[(String, Vec<u8>)]) {
    for (rel, content) in files {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create a test file's directory");
        }
        std::fs::write(&path, content).expect("write a test file");
    }
}

/// The shell line run inside the private mount namespace: lay `$1` over /etc, then exec
/// the rest of the arguments.
const OVERLAY_AND_EXEC: &str =
    "mount -t overlay halos-test -o lowerdir=\"$1\":/etc /etc || exit 97; shift; exec \"$@\"";

/// Run `run` and wait for it (at most `run.timeout`; then it is killed). Blocking: call
/// it from `spawn_blocking` in async tests.
pub fn run(run: &Run) -> Output {
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let home = scratch.path().join("home");
    let etc = scratch.path().join("etc");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::create_dir_all(&etc).expect("etc layer");
    let etc_rel: Vec<(String, Vec<u8>)> = run
        .etc_files
        .iter()
        .map(|(path, content)| {
            let rel = path
                .strip_prefix("/etc/")
                .unwrap_or_else(|| panic!("{path} is not under /etc"));
            (rel.to_string(), content.clone())
        })
        .collect();
    write_tree(&etc, &etc_rel);
    write_tree(&home, &run.home_files);

    let mut path: Vec<PathBuf> = run.path_first.clone();
    if let Some(node) = which("node") {
        path.extend(node.parent().map(Path::to_path_buf));
    }
    path.extend(["/usr/local/bin", "/usr/bin", "/bin"].map(PathBuf::from));
    let path = std::env::join_paths(path).expect("PATH");

    let stdout = scratch.path().join("stdout");
    let stderr = scratch.path().join("stderr");
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(OVERLAY_AND_EXEC)
        .arg("sh")
        .arg(&etc)
        .arg(&run.program)
        .args(&run.args)
        .env_clear()
        .env("PATH", path)
        .env("HOME", &home)
        .env("TERM", "dumb")
        .envs(run.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(&home)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"));
    let started = Instant::now();
    let mut child = cmd.spawn().expect("spawn unshare (util-linux)");
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the harness") {
            break Some(status);
        }
        if started.elapsed() >= run.timeout {
            timed_out = true;
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let duration = started.elapsed();
    let read = |p: &Path| {
        let mut s = String::new();
        let _ = std::fs::File::open(p).and_then(|mut f| f.read_to_string(&mut s));
        s
    };
    let out = Output {
        code: status.and_then(|s| s.code()),
        timed_out,
        stdout: read(&stdout),
        stderr: read(&stderr),
        duration,
    };
    assert_ne!(
        out.code,
        Some(97),
        "could not lay the release's files over /etc (needs root and overlayfs): {}",
        out.describe()
    );
    out
}

/// `name` on the caller's PATH.
fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_harness_is_pinned_exactly() {
        let names: Vec<String> = pinned().into_iter().map(|p| p.harness).collect();
        assert_eq!(names, ["claude-code", "codex", "gemini-cli"]);
        for p in pinned() {
            assert!(
                p.version.split('.').count() == 3
                    && p.version.split('.').all(|n| n.parse::<u64>().is_ok()),
                "{} is not an exact version",
                p.version
            );
        }
    }
}
