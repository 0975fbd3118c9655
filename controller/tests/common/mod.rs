//! Test rig: the acme-corp policy in a real git repo with a bare remote on disk, a
//! recording `gh` stand-in, a webhook receiver on loopback that verifies signatures, and
//! stand-ins for the evidence store and the kill switch (both behind the crate's ports).

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use halo_controller::controller::{Controller, PolicyError, PolicyPort};
use halo_controller::evidence::{EvidenceError, EvidencePort, Sample, Source};
use halo_controller::kill::{KillError, KillPort};
use halo_controller::notify::{self, Format, Webhook};
use halo_controller::pr::GitWriter;
use halo_policy::types::{ExperimentStatus, Org};
use time::OffsetDateTime;

pub const SECRET: &[u8] = b"webhook-secret-for-tests";

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The acme-corp example pushed to a bare repo, and a clone the controller works in.
pub struct PolicyRepo {
    pub dir: tempfile::TempDir,
    pub bare: PathBuf,
    pub clone: PathBuf,
    pub gh: PathBuf,
    pub gh_calls: PathBuf,
}

impl PolicyRepo {
    pub fn new() -> PolicyRepo {
        let dir = tempfile::tempdir().unwrap();
        let bare = dir.path().join("policy.git");
        let clone = dir.path().join("clone");
        git(
            dir.path(),
            &[
                "init",
                "--quiet",
                "--bare",
                "-b",
                "main",
                bare.to_str().unwrap(),
            ],
        );
        git(
            dir.path(),
            &[
                "clone",
                "--quiet",
                bare.to_str().unwrap(),
                clone.to_str().unwrap(),
            ],
        );
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp");
        copy_dir(&example, &clone);
        git(&clone, &["add", "."]);
        git(
            &clone,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "--quiet",
                "-m",
                "policy",
            ],
        );
        git(
            &clone,
            &["push", "--quiet", "origin", "HEAD:refs/heads/main"],
        );
        let gh_calls = dir.path().join("gh-calls");
        std::fs::create_dir(&gh_calls).unwrap();
        let gh = dir.path().join("gh");
        // Like gh: refuses a head branch the remote does not have; prints the PR URL.
        std::fs::write(
            &gh,
            format!(
                r#"#!/bin/sh
set -e
calls="{calls}"
[ -e "$calls/fail" ] && {{ echo "gh: HTTP 502" >&2; exit 1; }}
n=$(ls "$calls" | grep -c '\.args$' || true)
n=$((n + 1))
printf '%s\n' "$@" > "$calls/$n.args"
head=""; body=""
while [ $# -gt 0 ]; do
  case "$1" in
    --head) head="$2"; shift ;;
    --body-file) body="$2"; shift ;;
  esac
  shift
done
git --git-dir="{bare}" rev-parse --verify --quiet "refs/heads/$head" >/dev/null || {{ echo "gh: no branch $head" >&2; exit 1; }}
cp "$body" "$calls/$n.body"
echo "https://github.example/acme/policy/pull/$n"
"#,
                calls = gh_calls.display(),
                bare = bare.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&gh, std::fs::Permissions::from_mode(0o755)).unwrap();
        PolicyRepo {
            dir,
            bare,
            clone,
            gh,
            gh_calls,
        }
    }

    pub fn writer(&self) -> GitWriter {
        let mut w = GitWriter::new(self.clone.clone(), "main");
        w.gh = self.gh.clone().into_os_string();
        w
    }

    /// The org as loaded from the clone (with file sources).
    pub fn org(&self) -> Org {
        halo_policy::load::load_dir(&self.clone).expect("the example policy loads")
    }

    /// Branches on the remote.
    pub fn remote_branches(&self) -> Vec<String> {
        git(
            &self.bare,
            &["for-each-ref", "--format=%(refname:short)", "refs/heads"],
        )
        .lines()
        .map(str::to_string)
        .collect()
    }

    /// A file as committed on a remote branch.
    pub fn remote_file(&self, branch: &str, path: &str) -> String {
        git(&self.bare, &["show", &format!("{branch}:{path}")])
    }

    /// The recorded gh calls: (args, body).
    pub fn gh_calls(&self) -> Vec<(Vec<String>, String)> {
        let mut out = Vec::new();
        for n in 1.. {
            let args = self.gh_calls.join(format!("{n}.args"));
            let Ok(a) = std::fs::read_to_string(&args) else {
                break;
            };
            let body = std::fs::read_to_string(self.gh_calls.join(format!("{n}.body")))
                .unwrap_or_default();
            out.push((a.lines().map(str::to_string).collect(), body));
        }
        out
    }

    /// Replace `text` with `with` in a policy file, commit and push it (the policy a
    /// human merged).
    pub fn edit(&self, path: &str, text: &str, with: &str) {
        let file = self.clone.join(path);
        let content = std::fs::read_to_string(&file).unwrap();
        assert!(content.contains(text), "{path} has no {text:?}");
        std::fs::write(&file, content.replacen(text, with, 1)).unwrap();
        git(&self.clone, &["add", path]);
        git(
            &self.clone,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "--quiet",
                "-m",
                "edit",
            ],
        );
        git(&self.clone, &["push", "--quiet", "origin", "main"]);
    }

    pub fn set_gh_failing(&self, failing: bool) {
        let f = self.gh_calls.join("fail");
        if failing {
            std::fs::write(f, "").unwrap();
        } else {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// The policy "served now": tests swap it between ticks.
pub struct Served(pub Mutex<Arc<Org>>);

impl Served {
    pub fn new(org: Org) -> Arc<Served> {
        Arc::new(Served(Mutex::new(Arc::new(org))))
    }
    pub fn set_status(&self, experiment: &str, status: ExperimentStatus) {
        let mut g = self.0.lock().unwrap();
        let mut org = (**g).clone();
        org.experiments.get_mut(experiment).unwrap().status = status;
        *g = Arc::new(org);
    }
}

impl PolicyPort for Served {
    fn current(&self) -> BoxFuture<'_, Result<Arc<Org>, PolicyError>> {
        let org = self.0.lock().unwrap().clone();
        Box::pin(async move { Ok(org) })
    }
}

/// The evidence store's answer, set by the test (the store itself is the evidence
/// crate's; this speaks the controller's port).
#[derive(Default)]
pub struct Evidence {
    pub samples: Mutex<BTreeMap<(String, String), Vec<Sample>>>,
    pub spend: Mutex<f64>,
    /// Experiments whose evidence was read, in order.
    pub reads: Mutex<Vec<String>>,
}

impl Evidence {
    pub fn reads_of(&self, experiment: &str) -> usize {
        self.reads
            .lock()
            .unwrap()
            .iter()
            .filter(|e| *e == experiment)
            .count()
    }

    pub fn set(&self, experiment: &str, metric: &str, samples: Vec<Sample>) {
        self.samples
            .lock()
            .unwrap()
            .insert((experiment.to_string(), metric.to_string()), samples);
    }
}

impl EvidencePort for Evidence {
    fn samples<'a>(
        &'a self,
        experiment: &'a str,
        metric: &'a str,
        _since: OffsetDateTime,
    ) -> BoxFuture<'a, Result<Vec<Sample>, EvidenceError>> {
        self.reads.lock().unwrap().push(experiment.to_string());
        let s = self
            .samples
            .lock()
            .unwrap()
            .get(&(experiment.to_string(), metric.to_string()))
            .cloned()
            .unwrap_or_default();
        Box::pin(async move { Ok(s) })
    }

    fn spend_usd<'a>(
        &'a self,
        _experiment: &'a str,
        _since: OffsetDateTime,
    ) -> BoxFuture<'a, Result<f64, EvidenceError>> {
        let s = *self.spend.lock().unwrap();
        Box::pin(async move { Ok(s) })
    }
}

/// `n` units per variant: `value(variant, i)`.
pub fn samples(
    variants: &[&str],
    n: usize,
    source: Source,
    value: impl Fn(&str, usize) -> f64,
) -> Vec<Sample> {
    let mut out = Vec::new();
    for v in variants {
        for i in 0..n {
            out.push(Sample {
                variant: v.to_string(),
                unit: format!("{v}-u{i}"),
                value: value(v, i),
                source,
            });
        }
    }
    out
}

/// 0/1 values with `rate` ones, spread evenly.
pub fn rate(i: usize, rate: f64) -> f64 {
    let n = (i + 1) as f64 * rate;
    if n.floor() > (i as f64 * rate).floor() {
        1.0
    } else {
        0.0
    }
}

/// A kill switch stand-in with the server's semantics: a kill lands in a set the
/// controller reads back; failures injected.
#[derive(Default)]
pub struct Kills {
    pub killed: Mutex<BTreeSet<String>>,
    pub calls: AtomicU32,
    pub failing: AtomicBool,
    pub not_served: AtomicBool,
}

impl KillPort for Kills {
    fn is_killed<'a>(&'a self, experiment: &'a str) -> BoxFuture<'a, Result<bool, KillError>> {
        let k = self.killed.lock().unwrap().contains(experiment);
        Box::pin(async move { Ok(k) })
    }
    fn kill<'a>(
        &'a self,
        experiment: &'a str,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), KillError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let r = if self.failing.load(Ordering::SeqCst) {
            Err(KillError("the kill log is not writable".to_string()))
        } else {
            assert!(!reason.is_empty());
            self.killed.lock().unwrap().insert(experiment.to_string());
            Ok(())
        };
        Box::pin(async move { r })
    }
    fn served(&self) -> bool {
        !self.not_served.load(Ordering::SeqCst)
    }
}

/// A webhook receiver on loopback: verifies every request with [`notify::verify`] (401
/// when it fails), fails the first `fail_first` requests with 503, records the rest.
pub struct Receiver {
    pub url: String,
    pub received: Arc<Mutex<Vec<serde_json::Value>>>,
    pub requests: Arc<AtomicU32>,
    pub fail_first: Arc<AtomicU32>,
}

pub async fn receiver() -> Receiver {
    use axum::http::{HeaderMap, StatusCode};
    let received: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let requests: Arc<AtomicU32> = Arc::default();
    let fail_first: Arc<AtomicU32> = Arc::default();
    let (r, q, f) = (received.clone(), requests.clone(), fail_first.clone());
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let (r, q, f) = (r.clone(), q.clone(), f.clone());
            async move {
                q.fetch_add(1, Ordering::SeqCst);
                if f.load(Ordering::SeqCst) > 0 {
                    f.fetch_sub(1, Ordering::SeqCst);
                    return StatusCode::SERVICE_UNAVAILABLE;
                }
                let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
                let now = OffsetDateTime::now_utc().unix_timestamp();
                if notify::verify(
                    SECRET,
                    h(notify::TIMESTAMP_HEADER),
                    h(notify::SIGNATURE_HEADER),
                    &body,
                    now,
                )
                .is_err()
                {
                    return StatusCode::UNAUTHORIZED;
                }
                r.lock()
                    .unwrap()
                    .push(serde_json::from_slice(&body).unwrap());
                StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Receiver {
        url: format!("http://{addr}/hook"),
        received,
        requests,
        fail_first,
    }
}

impl Receiver {
    pub fn webhook(&self, format: Format) -> Webhook {
        let mut w = Webhook::new(self.url.parse().unwrap(), SECRET.to_vec(), format).unwrap();
        w.attempts = 3;
        w.backoff = Duration::from_millis(20);
        w
    }
    pub fn messages(&self) -> Vec<serde_json::Value> {
        self.received.lock().unwrap().clone()
    }
}

/// Everything one controller test needs.
pub struct Rig {
    pub repo: PolicyRepo,
    pub data: tempfile::TempDir,
    pub served: Arc<Served>,
    pub evidence: Arc<Evidence>,
    pub kills: Arc<Kills>,
    pub receiver: Receiver,
}

impl Rig {
    pub async fn new() -> Rig {
        let repo = PolicyRepo::new();
        let served = Served::new(repo.org());
        Rig {
            repo,
            data: tempfile::tempdir().unwrap(),
            served,
            evidence: Arc::default(),
            kills: Arc::default(),
            receiver: receiver().await,
        }
    }

    /// A controller (as after a restart: state read from the data dir).
    pub fn controller(&self, with_key: bool) -> Controller {
        let kill: Option<Arc<dyn KillPort>> = if with_key {
            Some(self.kills.clone())
        } else {
            None
        };
        Controller::open(
            self.data.path(),
            self.served.clone(),
            self.evidence.clone(),
            kill,
            Arc::new(self.repo.writer()),
            Some(Arc::new(self.receiver.webhook(Format::Generic))),
        )
        .unwrap()
    }
}

/// The first running, non-rollout experiment of acme-corp, and its metrics.
pub const EXP: &str = "claude-opus-default";
pub const TREATMENT: &str = "opus-default";
pub const ERRORS: &str = "halo.api.error_rate";
pub const COST: &str = "halo.session.cost_usd";
pub const EDITS: &str = "halo.session.accepted_edits";

/// Evidence where the treatment's error rate is 30% against control's 2%: a breach.
pub fn breach(evidence: &Evidence, source: Source) {
    evidence.set(
        EXP,
        ERRORS,
        samples(&["control", TREATMENT], 400, source, |v, i| {
            rate(i, if v == "control" { 0.02 } else { 0.30 })
        }),
    );
}
