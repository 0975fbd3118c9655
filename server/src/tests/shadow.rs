//! The mirror service's bounds (issue 46 item 5), at the service: `POST /mirror` on its
//! own loopback listener (what [`crate::shadow::start`] serves), a fake target on
//! loopback that counts what it is sent and can hold its answers, and an evidence store
//! in a tempdir. Each bound is asserted as a user relies on it: the answer's status and
//! JSON error code, the `halo_server_shadow_jobs_total{outcome}` count, and what reached
//! the target.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use halo_contract::shadow::ShadowJob;
use halo_envoy_config::credentials::Hosts;
use halo_evidence::Store;
use halo_policy::types::{Price, Upstream, UpstreamKind};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::{Fixture, WRONG_TOKEN};
use crate::shadow::{Mirror, ShadowSettings, start};

/// The shadow token the filter presents (strong enough for the token rules).
const SHADOW_TOKEN: &str = "5ad0f00d1b2d8046af13ce97b0d24e6c58a7f31d9e0b6c24f8a5173d0e9c6b12";
/// The policy upstream the jobs name: the fake target, no credential.
const UPSTREAM: &str = "shadow-target";
/// The model the jobs name, priced in the policy.
const MODEL: &str = "shadow-model";
/// How long an outcome may take to show.
const OUTCOME: Duration = Duration::from_secs(10);

/// What the fake target saw.
#[derive(Default)]
struct Seen {
    received: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// A fake Anthropic target on loopback: counts requests, holds each answer while `hold`
/// is true, answers a priced usage.
struct Target {
    addr: SocketAddr,
    seen: Arc<Seen>,
    hold: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Target {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Target {
    async fn start(hold: bool) -> Target {
        let seen = Arc::new(Seen::default());
        let (tx, rx) = watch::channel(hold);
        let state = (Arc::clone(&seen), rx);
        let app = axum::Router::new()
            .route("/v1/messages", axum::routing::post(answer))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the target");
        let addr = listener.local_addr().expect("target addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Target {
            addr,
            seen,
            hold: tx,
            task,
        }
    }

    fn received(&self) -> usize {
        self.seen.received.load(Ordering::SeqCst)
    }

    fn in_flight(&self) -> usize {
        self.seen.in_flight.load(Ordering::SeqCst)
    }

    fn max_in_flight(&self) -> usize {
        self.seen.max_in_flight.load(Ordering::SeqCst)
    }

    /// Answer every held request and every later one at once.
    fn release(&self) {
        self.hold.send_replace(false);
    }
}

async fn answer(
    axum::extract::State((seen, mut hold)): axum::extract::State<(
        Arc<Seen>,
        watch::Receiver<bool>,
    )>,
) -> axum::Json<Value> {
    seen.received.fetch_add(1, Ordering::SeqCst);
    let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let _ = hold.wait_for(|held| !*held).await;
    seen.in_flight.fetch_sub(1, Ordering::SeqCst);
    axum::Json(json!({
        "id": "msg_shadow", "type": "message", "role": "assistant", "model": MODEL,
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 100, "output_tokens": 50},
    }))
}

/// The mirror service over the example policy plus the fake target (upstream
/// [`UPSTREAM`], model [`MODEL`] priced), an evidence store in a tempdir.
struct Harness {
    mirror: Mirror,
    target: Target,
    http: reqwest::Client,
    _fx: Fixture,
    _dir: tempfile::TempDir,
}

async fn harness(hold: bool, settings: impl FnOnce(&mut ShadowSettings)) -> Harness {
    let fx = Fixture::new();
    let target = Target::start(hold).await;
    let url = format!("http://{}", target.addr);
    fx.edit_policy(|_, compiled| {
        compiled.upstreams.insert(
            UPSTREAM.into(),
            Upstream {
                url,
                kind: UpstreamKind::Anthropic,
                region: None,
                project: None,
                api_version: None,
                credential: None,
            },
        );
        compiled.prices.entry(UPSTREAM.into()).or_default().insert(
            MODEL.into(),
            Price {
                input: 3.0,
                output: 15.0,
                cache_write: None,
                cache_read: None,
            },
        );
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("shadow-token");
    std::fs::write(&token_file, format!("{SHADOW_TOKEN}\n")).expect("token file");
    let store: Arc<dyn Store> = Arc::new(
        halo_evidence::sqlite::SqliteStore::open(&dir.path().join("evidence.db"))
            .expect("evidence store"),
    );
    let mut s = ShadowSettings {
        token_file: Some(token_file),
        ..ShadowSettings::default()
    };
    settings(&mut s);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the mirror");
    let mirror = start(
        &s,
        listener,
        fx.served.subscribe(),
        Hosts::default(),
        None,
        store,
    )
    .expect("the mirror service starts");
    Harness {
        mirror,
        target,
        http: reqwest::Client::new(),
        _fx: fx,
        _dir: dir,
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// A job for `experiment` built at `built_unix_ms`, as the filter encodes it.
fn job(experiment: &str, built_unix_ms: u64) -> Vec<u8> {
    ShadowJob {
        built_unix_ms,
        ring: "general".into(),
        experiment: experiment.into(),
        variant: "treatment".into(),
        alias: "sonnet".into(),
        unit: "unit-hash".into(),
        upstream: UPSTREAM.into(),
        model: MODEL.into(),
        method: "POST".into(),
        path: "/v1/messages".into(),
        stream: false,
        headers: vec![("content-type".into(), "application/json".into())],
        body: None,
    }
    .encode(
        br#"{"model":"shadow-model","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
    )
}

fn fresh(experiment: &str) -> Vec<u8> {
    job(experiment, now_ms())
}

/// An answer of the mirror service: status, content type, body as JSON (`Null` if not).
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    content_type: String,
    body: Value,
}

impl Harness {
    fn jobs(&self, outcome: &'static str) -> u64 {
        self.mirror.metrics.jobs(outcome)
    }

    /// `POST /mirror` with `body`, the shadow token `bearer` if any.
    async fn post(&self, bearer: Option<&str>, body: Vec<u8>) -> Answer {
        let mut req = self
            .http
            .post(format!("http://{}/mirror", self.mirror.addr))
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.expect("the mirror service answers");
        let status = StatusCode::from_u16(resp.status().as_u16()).expect("a status");
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let raw = resp.bytes().await.expect("the body");
        Answer {
            status,
            content_type,
            body: serde_json::from_slice(&raw).unwrap_or(Value::Null),
        }
    }

    async fn send(&self, body: Vec<u8>) -> Answer {
        self.post(Some(SHADOW_TOKEN), body).await
    }

    /// Wait (bounded) until `outcome` has been counted `n` times.
    async fn counted(&self, outcome: &'static str, n: u64) {
        eventually(&format!("{n} job(s) counted {outcome}"), || {
            (self.jobs(outcome) >= n).then_some(())
        })
        .await;
        assert_eq!(self.jobs(outcome), n, "{outcome} counted more than {n}");
    }
}

/// Poll `probe` every 20 ms until it answers `Some`, for at most [`OUTCOME`].
async fn eventually<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + OUTCOME;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {OUTCOME:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[track_caller]
fn assert_accepted(a: &Answer) {
    assert_eq!(a.status, StatusCode::ACCEPTED, "{:?}", a.body);
    assert_eq!(a.body, json!({"accepted": true}));
}

/// `a` is the service's refusal: `status`, a JSON body with `error: code` and a message.
#[track_caller]
fn assert_refused(a: &Answer, status: StatusCode, code: &str) {
    assert_eq!(a.status, status, "{:?}", a.body);
    assert!(
        a.content_type.starts_with("application/json"),
        "{}",
        a.content_type
    );
    assert_eq!(a.body["error"], code, "{:?}", a.body);
    assert!(
        !a.body["message"].as_str().unwrap_or_default().is_empty(),
        "{:?}",
        a.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_wrong_shadow_token_is_401_and_counted_unauthorized() {
    let h = harness(false, |_| {}).await;
    let missing = h.post(None, fresh("e")).await;
    assert_refused(&missing, StatusCode::UNAUTHORIZED, "authentication_error");
    let wrong = h.post(Some(WRONG_TOKEN), fresh("e")).await;
    assert_refused(&wrong, StatusCode::UNAUTHORIZED, "authentication_error");
    // Not the scheme the filter uses either.
    let basic = h
        .http
        .post(format!("http://{}/mirror", h.mirror.addr))
        .header("authorization", format!("Basic {SHADOW_TOKEN}"))
        .body(fresh("e"))
        .send()
        .await
        .expect("answers");
    assert_eq!(basic.status().as_u16(), 401);
    assert_eq!(h.jobs("unauthorized"), 3);
    assert_eq!(h.jobs("accepted"), 0);
    // The right token is taken, and only that job reaches the target.
    assert_accepted(&h.send(fresh("e")).await);
    h.counted("recorded", 1).await;
    assert_eq!(h.jobs("accepted"), 1);
    assert_eq!(h.target.received(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_job_is_400_invalid_job_and_counted_malformed() {
    let h = harness(false, |_| {}).await;
    // Not JSON.
    let not_json = h.send(b"not a job".to_vec()).await;
    assert_refused(&not_json, StatusCode::BAD_REQUEST, "invalid_job");
    // A field the contract does not have (a user, say): refused, the field named.
    let mut extra: Value = serde_json::from_slice(&fresh("e")).expect("json");
    extra["user"] = json!("alice@acme.com");
    let unknown = h.send(extra.to_string().into_bytes()).await;
    assert_refused(&unknown, StatusCode::BAD_REQUEST, "invalid_job");
    assert!(
        unknown.body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("user"),
        "{:?}",
        unknown.body
    );
    // No body to send.
    let mut no_body: Value = serde_json::from_slice(&fresh("e")).expect("json");
    no_body.as_object_mut().expect("object").remove("body");
    let bodiless = h.send(no_body.to_string().into_bytes()).await;
    assert_refused(&bodiless, StatusCode::BAD_REQUEST, "invalid_job");
    // A field missing.
    let mut no_upstream: Value = serde_json::from_slice(&fresh("e")).expect("json");
    no_upstream
        .as_object_mut()
        .expect("object")
        .remove("upstream");
    let missing = h.send(no_upstream.to_string().into_bytes()).await;
    assert_refused(&missing, StatusCode::BAD_REQUEST, "invalid_job");
    assert!(
        missing.body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("upstream"),
        "{:?}",
        missing.body
    );
    assert_eq!(h.jobs("malformed"), 4);
    assert_eq!(h.jobs("accepted"), 0);
    // A well-formed job after them is taken and sent; the malformed ones never were.
    assert_accepted(&h.send(fresh("e")).await);
    h.counted("recorded", 1).await;
    assert_eq!(h.target.received(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_429_queue_full_and_the_refused_job_is_never_sent() {
    let h = harness(true, |s| {
        s.queue = 1;
        s.concurrency = 1;
    })
    .await;
    // The one worker slot is taken by a job the target holds.
    assert_accepted(&h.send(fresh("e")).await);
    eventually("the first job at the target", || {
        (h.target.received() == 1).then_some(())
    })
    .await;
    // With the one slot held, the queue (1) takes exactly one more job; the next is
    // refused. (The dispatcher once took a job off the queue before it had a slot for it,
    // so a full service held `--shadow-queue` + 1 waiting jobs.)
    assert_accepted(&h.send(fresh("e")).await);
    let refused = h.send(fresh("e")).await;
    let accepted = 2;
    assert_refused(&refused, StatusCode::TOO_MANY_REQUESTS, "queue_full");
    assert_eq!(h.jobs("queue_full"), 1);
    assert_eq!(h.jobs("accepted"), accepted as u64);
    // Released, the target gets every accepted job and not the refused one.
    h.target.release();
    h.counted("recorded", accepted as u64).await;
    assert_eq!(h.target.received(), accepted);
    // And with room again, jobs are taken.
    assert_accepted(&h.send(fresh("e")).await);
    h.counted("recorded", accepted as u64 + 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_older_than_max_age_is_counted_too_old_and_not_sent() {
    let h = harness(false, |s| s.max_age = Duration::from_secs(5)).await;
    let old = now_ms() - 60_000;
    // Taken at the door (the age is the worker's check), dropped when a worker takes it.
    assert_accepted(&h.send(job("e", old)).await);
    h.counted("too_old", 1).await;
    // A fresh job after it is sent and recorded: the target saw that one only.
    assert_accepted(&h.send(fresh("e")).await);
    h.counted("recorded", 1).await;
    assert_eq!(h.target.received(), 1);
    assert_eq!(h.jobs("too_old"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_shadow_spend_budget_a_job_is_counted_over_budget_and_not_sent() {
    // A budget the first priced answer (100 in, 50 out at 3 and 15 USD per million) spends.
    let h = harness(false, |s| s.max_spend_usd = 0.000_001).await;
    assert_accepted(&h.send(fresh("spendy")).await);
    h.counted("recorded", 1).await;
    assert_eq!(h.target.received(), 1);
    // The experiment's day budget is spent: the next job is dropped, not sent.
    assert_accepted(&h.send(fresh("spendy")).await);
    h.counted("over_budget", 1).await;
    assert_eq!(h.target.received(), 1);
    // The budget is per experiment: another's job is still sent.
    assert_accepted(&h.send(fresh("other")).await);
    h.counted("recorded", 2).await;
    assert_eq!(h.target.received(), 2);
    assert_eq!(h.jobs("over_budget"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_spend_budget_sends_no_job() {
    let h = harness(false, |s| s.max_spend_usd = 0.0).await;
    for _ in 0..3 {
        assert_accepted(&h.send(fresh("e")).await);
    }
    h.counted("over_budget", 3).await;
    assert_eq!(h.target.received(), 0);
    assert_eq!(h.jobs("recorded"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_concurrency_jobs_are_in_flight_at_the_target() {
    const CONCURRENCY: usize = 2;
    const JOBS: usize = 6;
    let h = harness(true, |s| {
        s.concurrency = CONCURRENCY;
        s.queue = 16;
    })
    .await;
    for _ in 0..JOBS {
        assert_accepted(&h.send(fresh("e")).await);
    }
    eventually("the slots filled at the target", || {
        (h.target.in_flight() == CONCURRENCY).then_some(())
    })
    .await;
    // While the target holds them, no further job is sent (observed over a bounded window).
    let window = tokio::time::Instant::now() + Duration::from_millis(300);
    while tokio::time::Instant::now() < window {
        assert_eq!(
            h.target.received(),
            CONCURRENCY,
            "a job was sent beyond the concurrency"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.target.release();
    h.counted("recorded", JOBS as u64).await;
    assert_eq!(h.target.received(), JOBS);
    assert_eq!(h.target.max_in_flight(), CONCURRENCY);
}
