//! The controller's live fixtures, shared by halo-server's controller tests and `halo
//! controller run`'s: the policy dir made a clone of a bare repo with a recording `gh`, a
//! webhook receiver that keeps what verifies, and a breach posted to a receiver as Envoy
//! exports it.

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use halo_controller::notify::{SIGNATURE_HEADER, TIMESTAMP_HEADER, verify};
use halo_evidence::{Record, Source, otlp};
use prost::Message as _;

use super::{Env, Server};

pub const EXP: &str = "sonnet-bedrock-canary";
pub const OTLP_GATEWAY_TOKEN: &str =
    "9b8e7d1c2a3f40516e7d8c9b0a1f2e3d4c5b6a79808f7e6d5c4b3a2910f8e7d6";
pub const WEBHOOK_SECRET: &str = "controller-webhook-secret-for-the-live-test";
pub const UNITS: usize = 2000;

pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
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

/// The env's policy dir made a clone of a bare repo, with only EXP running and not
/// rollout-owned (the other running experiments name metrics the store does not have).
pub fn policy_repo(env: &Env) -> std::path::PathBuf {
    let policy = env.path("policy");
    std::fs::remove_file(policy.join("rollouts/sonnet-bedrock.yaml")).unwrap();
    env.pause_experiments(&["claude-opus-default", "gpt-shadow"]);
    git_remote(env)
}

/// The env's policy dir, as it is, made a clone of a bare repo (returned), with a
/// recording `gh` in the env's dir.
pub fn git_remote(env: &Env) -> std::path::PathBuf {
    let policy = env.path("policy");
    let bare = env.path("policy.git");
    git(
        env.dir.path(),
        &["init", "--quiet", "--bare", "-b", "main", "policy.git"],
    );
    git(&policy, &["init", "--quiet", "-b", "main"]);
    git(&policy, &["add", "."]);
    git(&policy, &["commit", "--quiet", "-m", "policy"]);
    git(
        &policy,
        &["remote", "add", "origin", bare.to_str().unwrap()],
    );
    git(&policy, &["push", "--quiet", "origin", "main"]);
    // A recording gh: refuses a head branch the remote lacks, prints the PR's URL.
    let gh = env.path("gh");
    std::fs::write(
        &gh,
        format!(
            "#!/bin/sh\nhead=\"\"\nwhile [ $# -gt 0 ]; do [ \"$1\" = --head ] && head=\"$2\"; shift; done\n\
             git --git-dir=\"{}\" rev-parse --verify --quiet \"refs/heads/$head\" >/dev/null || {{ echo \"gh: no branch $head\" >&2; exit 1; }}\n\
             echo https://github.example/acme/policy/pull/1\n",
            bare.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&gh, std::fs::Permissions::from_mode(0o755)).unwrap();
    bare
}

/// A webhook receiver on loopback that keeps the messages whose signature verifies.
pub async fn webhook() -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    let got: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let keep = Arc::clone(&got);
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let keep = Arc::clone(&keep);
                async move {
                    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
                    let now = time::OffsetDateTime::now_utc().unix_timestamp();
                    match verify(
                        WEBHOOK_SECRET.as_bytes(),
                        h(TIMESTAMP_HEADER),
                        h(SIGNATURE_HEADER),
                        &body,
                        now,
                    ) {
                        Ok(()) => {
                            keep.lock()
                                .unwrap()
                                .push(serde_json::from_slice(&body).unwrap());
                            axum::http::StatusCode::OK
                        }
                        Err(_) => axum::http::StatusCode::UNAUTHORIZED,
                    }
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), got)
}

/// `UNITS` units per arm; the canary fails 30% of its calls with a 500.
pub async fn post_breach(server: &Server, source: Source) {
    post_calls(server, source, 3, 0).await;
}

/// `UNITS` units per arm as Envoy exports them; the canary fails `canary_in_10` of every
/// ten calls with a 500, control `control_in_10`. Unit names start at `first_unit`, so
/// successive posts add units rather than repeat them.
pub async fn post_calls(server: &Server, source: Source, canary_in_10: usize, first_unit: usize) {
    post_arms(server, source, canary_in_10, 0, first_unit).await;
}

/// [`post_calls`] with control failing too.
pub async fn post_arms(
    server: &Server,
    source: Source,
    canary_in_10: usize,
    control_in_10: usize,
    first_unit: usize,
) {
    let running = server.running.as_ref().unwrap();
    let addr = running.evidence.as_ref().unwrap().addr(source).unwrap();
    // Stamped now: the controller reads evidence from the start of the experiment's run
    // (its first tick), which has already happened.
    let now = (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64;
    let records: Vec<Record> = (0..2 * UNITS)
        .map(|i| {
            let canary = i % 2 == 1;
            Record {
                time_unix_ms: now,
                ring: "early".into(),
                experiment: EXP.into(),
                variant: if canary { "canary" } else { "control" }.into(),
                alias: "sonnet".into(),
                upstream: "anthropic-direct".into(),
                model: "claude-sonnet-4-5-20250929".into(),
                target: "t0".into(),
                attempts: 1,
                status: if (i / 2) % 10 < if canary { canary_in_10 } else { control_in_10 } {
                    500
                } else {
                    200
                },
                ttfb_ms: Some(100.0 + (i % 50) as f64),
                duration_ms: Some(700.0 + (i % 200) as f64),
                complete: true,
                unit: format!("{:016x}", first_unit + i),
                ..Record::default()
            }
        })
        .collect();
    let client = reqwest::Client::new();
    for chunk in records.chunks(500) {
        let mut req = client
            .post(format!("http://{addr}/v1/logs"))
            .header("content-type", "application/x-protobuf")
            .body(otlp::request(chunk).encode_to_vec());
        if source == Source::Gateway {
            req = req.bearer_auth(OTLP_GATEWAY_TOKEN);
        }
        assert_eq!(req.send().await.unwrap().status(), 200);
    }
}

pub fn remote_branches(bare: &Path) -> String {
    git(
        bare,
        &["for-each-ref", "--format=%(refname:short)", "refs/heads"],
    )
}

/// A rollback acted on once: the pause PR's branch (pausing the experiment) is in the bare
/// repo, and exactly one signed `rollback` message with `kill_outcome` arrived.
pub fn assert_one_rollback(
    bare: &Path,
    messages: &Mutex<Vec<serde_json::Value>>,
    experiment: &str,
    kill_outcome: &str,
) {
    let branch = format!("halo-controller/{experiment}/run-1-rollback");
    let paused = git(
        bare,
        &["show", &format!("{branch}:experiments/{experiment}.yaml")],
    );
    assert!(paused.contains("\nstatus: paused\n"), "{branch}: {paused}");
    let msgs = messages.lock().unwrap().clone();
    assert_eq!(msgs.len(), 1, "one signed message: {msgs:?}");
    assert_eq!(msgs[0]["event"], "rollback");
    assert_eq!(msgs[0]["killOutcome"], kill_outcome);
}
