//! Pull requests against the policy repo: the controller's durable output. Nothing here
//! merges; a human does.
//!
//! [`GitWriter`] commits on a new branch in a temporary worktree of a local clone of the
//! policy repo, pushes the branch and runs `gh pr create`. The edit is one line: the
//! experiment document's top-level `status:` (comments and layout are kept).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::future::BoxFuture;
use halo_policy::types::ExperimentStatus;

#[derive(Debug, thiserror::Error)]
pub enum PrError {
    #[error("{file}: no Experiment document named {experiment} with a top-level status line")]
    NoStatusLine { file: String, experiment: String },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Write(#[from] halo_fsutil::WriteError),
    #[error("`{command}` failed: {message}")]
    Command { command: String, message: String },
    #[error("`{command}` did not finish within {seconds} s")]
    Timeout { command: String, seconds: u64 },
    #[error("cannot make a temporary worktree: {0}")]
    TempDir(std::io::Error),
}

/// One pull request to open.
#[derive(Debug, Clone, PartialEq)]
pub struct PrRequest {
    pub experiment: String,
    /// The experiment's file, relative to the policy directory.
    pub file: PathBuf,
    pub status: ExperimentStatus,
    pub branch: String,
    pub title: String,
    pub body: String,
}

/// Opens pull requests; returns the PR's URL.
pub trait PullRequests: Send + Sync {
    fn open<'a>(&'a self, request: &'a PrRequest) -> BoxFuture<'a, Result<String, PrError>>;
}

/// Set the top-level `status:` of the Experiment document named `experiment` in a
/// multi-document YAML file. Pure; keeps every other byte.
pub fn set_status(
    yaml: &str,
    file: &str,
    experiment: &str,
    status: ExperimentStatus,
) -> Result<String, PrError> {
    let word = match status {
        ExperimentStatus::Draft => "draft",
        ExperimentStatus::Running => "running",
        ExperimentStatus::Paused => "paused",
        ExperimentStatus::Concluded => "concluded",
    };
    let lines: Vec<&str> = yaml.split_inclusive('\n').collect();
    // Documents are separated by lines starting with `---`.
    let mut start = 0;
    let mut bounds = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with("---") {
            bounds.push((start, i));
            start = i + 1;
        }
    }
    bounds.push((start, lines.len()));
    let top = |l: &str, key: &str| {
        l.strip_prefix(key)
            .and_then(|r| r.strip_prefix(':'))
            .map(|r| {
                r.split('#')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .trim_matches(['"', '\''].as_ref())
                    .to_string()
            })
    };
    for (from, to) in bounds {
        let doc = &lines[from..to];
        let is_it = doc
            .iter()
            .any(|l| top(l, "kind").as_deref() == Some("Experiment"))
            && doc
                .iter()
                .any(|l| top(l, "name").as_deref() == Some(experiment));
        if !is_it {
            continue;
        }
        let Some(pos) = doc.iter().position(|l| top(l, "status").is_some()) else {
            continue;
        };
        let old = doc[pos];
        let comment = old.find(" #").map(|i| old[i..].trim_end()).unwrap_or("");
        let newline = if old.ends_with('\n') { "\n" } else { "" };
        let replaced = if comment.is_empty() {
            format!("status: {word}{newline}")
        } else {
            format!("status: {word} {}{newline}", comment.trim_start())
        };
        let mut out = String::with_capacity(yaml.len() + 8);
        for (i, l) in lines.iter().enumerate() {
            if i == from + pos {
                out.push_str(&replaced);
            } else {
                out.push_str(l);
            }
        }
        return Ok(out);
    }
    Err(PrError::NoStatusLine {
        file: file.to_string(),
        experiment: experiment.to_string(),
    })
}

/// Opens PRs with git and gh.
#[derive(Debug, Clone)]
pub struct GitWriter {
    /// A local clone of the policy repo (its remote is where branches are pushed).
    pub repo: PathBuf,
    /// The policy directory inside the repo ("" when the repo is the policy directory).
    pub policy_subdir: PathBuf,
    pub remote: String,
    /// The branch PRs target.
    pub base: String,
    /// The gh program (a recording stand-in in tests).
    pub gh: OsString,
    /// Each git or gh command's time limit (the tick's budget bounds the whole).
    pub command_timeout: Duration,
}

impl GitWriter {
    pub fn new(repo: PathBuf, base: &str) -> GitWriter {
        GitWriter {
            repo,
            policy_subdir: PathBuf::new(),
            remote: "origin".to_string(),
            base: base.to_string(),
            gh: OsString::from("gh"),
            command_timeout: Duration::from_secs(60),
        }
    }

    async fn run(&self, program: &OsStr, args: &[&OsStr], cwd: &Path) -> Result<String, PrError> {
        let command = std::iter::once(program)
            .chain(args.iter().copied())
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        let child = tokio::process::Command::new(program)
            .args(args)
            .current_dir(cwd)
            .env("GIT_TERMINAL_PROMPT", "0")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(self.command_timeout, child)
            .await
            .map_err(|_| PrError::Timeout {
                command: command.clone(),
                seconds: self.command_timeout.as_secs(),
            })?
            .map_err(|e| PrError::Command {
                command: command.clone(),
                message: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(PrError::Command {
                command,
                message: format!(
                    "{}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    async fn git(&self, cwd: &Path, args: &[&str]) -> Result<String, PrError> {
        let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        self.run(OsStr::new("git"), &args, cwd).await
    }

    /// Commit the edit on `req.branch` and push it, unless the remote has that branch
    /// already (a PR that failed after the push is retried without a second commit).
    async fn push_branch(&self, req: &PrRequest, wt: &Path) -> Result<(), PrError> {
        let pushed = self
            .git(
                &self.repo,
                &["ls-remote", "--heads", &self.remote, &req.branch],
            )
            .await?;
        if !pushed.trim().is_empty() {
            return Ok(());
        }
        let tracking = format!("refs/remotes/{}/{}", self.remote, self.base);
        let wt_str = wt.to_string_lossy();
        self.git(
            &self.repo,
            &[
                "fetch",
                "--quiet",
                &self.remote,
                &format!("+refs/heads/{}:{tracking}", self.base),
            ],
        )
        .await?;
        self.git(
            &self.repo,
            &[
                "worktree",
                "add",
                "--quiet",
                "-B",
                &req.branch,
                &wt_str,
                &tracking,
            ],
        )
        .await?;
        let rel = self.policy_subdir.join(&req.file);
        let path = wt.join(&rel);
        let yaml = std::fs::read_to_string(&path).map_err(|source| PrError::Read {
            path: path.clone(),
            source,
        })?;
        let edited = set_status(&yaml, &rel.to_string_lossy(), &req.experiment, req.status)?;
        halo_fsutil::write_atomic(&path, edited.as_bytes(), 0o644)?;
        let rel_str = rel.to_string_lossy();
        self.git(wt, &["add", "--", &rel_str]).await?;
        self.git(
            wt,
            &[
                "-c",
                "user.name=halo controller",
                "-c",
                "user.email=halo-controller@localhost",
                "commit",
                "--quiet",
                "-m",
                &req.title,
            ],
        )
        .await?;
        self.git(
            wt,
            &[
                "push",
                "--quiet",
                &self.remote,
                &format!("refs/heads/{0}:refs/heads/{0}", req.branch),
            ],
        )
        .await?;
        Ok(())
    }

    async fn open_in(&self, req: &PrRequest, tmp: &Path) -> Result<String, PrError> {
        self.push_branch(req, &tmp.join("worktree")).await?;
        let body = tmp.join("pr-body.md");
        halo_fsutil::write_atomic(&body, req.body.as_bytes(), 0o600)?;
        let args: Vec<OsString> = vec![
            "pr".into(),
            "create".into(),
            "--base".into(),
            self.base.clone().into(),
            "--head".into(),
            req.branch.clone().into(),
            "--title".into(),
            req.title.clone().into(),
            "--body-file".into(),
            body.into_os_string(),
        ];
        let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        let out = self.run(&self.gh, &args, &self.repo).await?;
        // gh prints the PR's URL as its last line.
        Ok(out.lines().last().unwrap_or("").trim().to_string())
    }
}

use std::ffi::OsStr;

impl PullRequests for GitWriter {
    fn open<'a>(&'a self, req: &'a PrRequest) -> BoxFuture<'a, Result<String, PrError>> {
        Box::pin(async move {
            let tmp = tempfile::tempdir().map_err(PrError::TempDir)?;
            let result = self.open_in(req, tmp.path()).await;
            let wt = tmp.path().join("worktree");
            // Always leave the clone as it was: no worktree, no local branch.
            let wt_str = wt.to_string_lossy();
            let _ = self
                .git(&self.repo, &["worktree", "remove", "--force", &wt_str])
                .await;
            let _ = self.git(&self.repo, &["branch", "-D", &req.branch]).await;
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_status_edits_only_that_documents_status() {
        let yaml = "# head\nkind: Experiment\nname: a\nstatus: running   # live\n---\nkind: Experiment\nname: b\nstatus: running\nvariants:\n  - status: x\n";
        let out = set_status(yaml, "f.yaml", "b", ExperimentStatus::Paused).unwrap();
        assert_eq!(
            out,
            "# head\nkind: Experiment\nname: a\nstatus: running   # live\n---\nkind: Experiment\nname: b\nstatus: paused\nvariants:\n  - status: x\n"
        );
        let out = set_status(yaml, "f.yaml", "a", ExperimentStatus::Concluded).unwrap();
        assert!(out.contains("status: concluded # live\n"), "{out}");
        let err = set_status(yaml, "f.yaml", "c", ExperimentStatus::Paused).unwrap_err();
        assert!(err.to_string().contains("f.yaml"));
    }
}
