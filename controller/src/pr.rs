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
    #[error("{file}: no {kind} document named {name} with a top-level {key} line")]
    NoField {
        file: String,
        kind: &'static str,
        name: String,
        key: &'static str,
    },
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

/// One line of a policy document to change: the top-level `key:` of the `kind` document
/// named `name` in `file` (relative to the policy directory).
#[derive(Debug, Clone, PartialEq)]
pub struct Edit {
    pub file: PathBuf,
    /// The document's kind as written (`Experiment`, `Rollout`).
    pub kind: &'static str,
    pub name: String,
    pub key: &'static str,
    pub value: String,
}

impl Edit {
    /// Set an experiment's status.
    pub fn experiment_status(file: PathBuf, name: &str, status: ExperimentStatus) -> Edit {
        let word = match status {
            ExperimentStatus::Draft => "draft",
            ExperimentStatus::Running => "running",
            ExperimentStatus::Paused => "paused",
            ExperimentStatus::Concluded => "concluded",
        };
        Edit {
            file,
            kind: "Experiment",
            name: name.to_string(),
            key: "status",
            value: word.to_string(),
        }
    }

    /// Set a rollout's `status` or `step`.
    pub fn rollout(file: PathBuf, name: &str, key: &'static str, value: String) -> Edit {
        Edit {
            file,
            kind: "Rollout",
            name: name.to_string(),
            key,
            value,
        }
    }
}

/// One pull request to open: its edits, all in one commit.
#[derive(Debug, Clone, PartialEq)]
pub struct PrRequest {
    pub edits: Vec<Edit>,
    pub branch: String,
    pub title: String,
    pub body: String,
}

/// Opens pull requests; returns the PR's URL.
pub trait PullRequests: Send + Sync {
    fn open<'a>(&'a self, request: &'a PrRequest) -> BoxFuture<'a, Result<String, PrError>>;
}

/// Set the top-level `key:` of the `kind` document named `name` in a multi-document YAML
/// file (`file` names it in errors). Pure; keeps every other byte, and a comment on the
/// line. A `step` the document leaves out (it defaults to 0) is written after its `name:`
/// line; any other missing key is an error.
pub fn set_field(yaml: &str, file: &str, edit: &Edit) -> Result<String, PrError> {
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
    let value = &edit.value;
    for (from, to) in bounds {
        let doc = &lines[from..to];
        let is_it = doc
            .iter()
            .any(|l| top(l, "kind").as_deref() == Some(edit.kind))
            && doc
                .iter()
                .any(|l| top(l, "name").as_deref() == Some(edit.name.as_str()));
        if !is_it {
            continue;
        }
        let (at, replaced) = match doc.iter().position(|l| top(l, edit.key).is_some()) {
            Some(pos) => {
                let old = doc[pos];
                let comment = old.find(" #").map(|i| old[i..].trim_end()).unwrap_or("");
                let newline = if old.ends_with('\n') { "\n" } else { "" };
                let line = if comment.is_empty() {
                    format!("{}: {value}{newline}", edit.key)
                } else {
                    format!("{}: {value} {}{newline}", edit.key, comment.trim_start())
                };
                (from + pos, line)
            }
            None if edit.key == "step" => {
                let Some(pos) = doc.iter().position(|l| top(l, "name").is_some()) else {
                    continue;
                };
                let mut name_line = doc[pos].to_string();
                if !name_line.ends_with('\n') {
                    name_line.push('\n');
                }
                // Replace the name line by itself plus the new key.
                let line = format!("{name_line}{}: {value}\n", edit.key);
                (from + pos, line)
            }
            None => continue,
        };
        let mut out = String::with_capacity(yaml.len() + 16);
        for (i, l) in lines.iter().enumerate() {
            if i == at {
                out.push_str(&replaced);
            } else {
                out.push_str(l);
            }
        }
        return Ok(out);
    }
    Err(PrError::NoField {
        file: file.to_string(),
        kind: edit.kind,
        name: edit.name.clone(),
        key: edit.key,
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
            // git says some refusals ("nothing to commit") on stdout.
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stdout = String::from_utf8_lossy(&out.stdout);
            let said = if stderr.trim().is_empty() {
                stdout.trim()
            } else {
                stderr.trim()
            };
            return Err(PrError::Command {
                command,
                message: format!("{}: {said}", out.status),
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
        for edit in &req.edits {
            let rel = self.policy_subdir.join(&edit.file);
            let path = wt.join(&rel);
            let yaml = std::fs::read_to_string(&path).map_err(|source| PrError::Read {
                path: path.clone(),
                source,
            })?;
            let edited = set_field(&yaml, &rel.to_string_lossy(), edit)?;
            halo_fsutil::write_atomic(&path, edited.as_bytes(), 0o644)?;
            let rel_str = rel.to_string_lossy();
            self.git(wt, &["add", "--", &rel_str]).await?;
        }
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
    fn set_field_edits_only_that_documents_line() {
        let yaml = "# head\nkind: Experiment\nname: a\nstatus: running   # live\n---\nkind: Experiment\nname: b\nstatus: running\nvariants:\n  - status: x\n";
        let edit = |name: &str, s| Edit::experiment_status("f.yaml".into(), name, s);
        let out = set_field(yaml, "f.yaml", &edit("b", ExperimentStatus::Paused)).unwrap();
        assert_eq!(
            out,
            "# head\nkind: Experiment\nname: a\nstatus: running   # live\n---\nkind: Experiment\nname: b\nstatus: paused\nvariants:\n  - status: x\n"
        );
        let out = set_field(yaml, "f.yaml", &edit("a", ExperimentStatus::Concluded)).unwrap();
        assert!(out.contains("status: concluded # live\n"), "{out}");
        let err = set_field(yaml, "f.yaml", &edit("c", ExperimentStatus::Paused)).unwrap_err();
        assert!(err.to_string().contains("f.yaml"));
        // A Rollout of the same name is not the experiment.
        let rollout = Edit::rollout("f.yaml".into(), "a", "status", "paused".into());
        assert!(set_field(yaml, "f.yaml", &rollout).is_err());
    }

    #[test]
    fn a_rollouts_step_is_replaced_or_written_after_its_name() {
        let yaml =
            "kind: Rollout\nname: r\nstatus: running\nstep: 1                 # now\nsteps: []\n";
        let step = |v: &str| Edit::rollout("r.yaml".into(), "r", "step", v.into());
        let out = set_field(yaml, "r.yaml", &step("2")).unwrap();
        assert_eq!(
            out,
            "kind: Rollout\nname: r\nstatus: running\nstep: 2 # now\nsteps: []\n"
        );
        let without = "kind: Rollout\nname: r\nstatus: running\nsteps: []\n";
        let out = set_field(without, "r.yaml", &step("1")).unwrap();
        assert_eq!(
            out,
            "kind: Rollout\nname: r\nstep: 1\nstatus: running\nsteps: []\n"
        );
    }
}
