//! halo-credentials' own test support: the binary as a child process ([`Process`]) and
//! the log check. The Google fakes are halo-testkit's (`google` feature), shared with
//! halo-e2e.

#![allow(dead_code, unused_imports)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub use halo_testkit::google::*;

/// The halo-credentials binary, killed on drop.
pub struct Process {
    child: Child,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl Process {
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Process {
        let dir = tempfile::tempdir().unwrap();
        let stderr = dir.path().join("stderr");
        let mut command = Command::new(env!("CARGO_BIN_EXE_halo-credentials"));
        command
            .args(args)
            .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
            .env_remove("GCE_METADATA_HOST")
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap());
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command.spawn().expect("start halo-credentials");
        Process {
            child,
            stderr,
            _dir: dir,
        }
    }

    /// Run to completion (with a bound) and return the exit code and stderr.
    pub fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
        let mut p = Process::start(args, env);
        let code =
            halo_testkit::wait_until("halo-credentials to exit", Duration::from_secs(30), || {
                p.child.try_wait().ok().flatten()
            });
        (code.code().unwrap_or(-1), p.logs())
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// No token, assertion or key in `logs`.
pub fn assert_no_secret(logs: &str) {
    assert!(
        !logs.contains(TOKEN_PREFIX),
        "a token reached the log:\n{logs}"
    );
    assert!(
        !logs.contains("eyJ"),
        "an assertion reached the log:\n{logs}"
    );
    assert!(!logs.contains("MII"), "a key reached the log:\n{logs}");
}
