//! A recording mirror service for the live tests and the gateway bench: it speaks the
//! `POST /mirror` wire (the envelope of halo-filter-core's `shadow`) and keeps every job
//! it receives, so a test can see exactly what left the gateway, and can be made slow,
//! failing or gone to show the live call does not notice.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use halo_policy::Snapshot;
use serde_json::{Value, json};

/// The shadow token the tests' gateways and mirror services share (the gateway token's
/// strength rules: 64 hex digits).
pub const SHADOW_TOKEN: &str = "3f9a1c0e5b7d2468ace013579bdf24683f9a1c0e5b7d2468ace013579bdf2468";

/// How long a job may take to arrive (Envoy sends it while the live call runs).
pub const ARRIVAL: Duration = Duration::from_secs(10);

/// How the recording mirror service answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 202, as halo-server takes a job.
    Take,
    /// Answers 202 after this long.
    Slow(Duration),
    /// 500.
    Fail,
}

/// One job as the mirror service received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub authorization: Option<String>,
    pub envelope: Value,
}

/// The recording mirror service on a loopback port.
#[derive(Clone)]
pub struct Mirror {
    pub url: String,
    /// Every job received, when started with [`Mirror::start`]; [`Mirror::start_counting`]
    /// keeps none (the bench sends thousands of megabyte jobs).
    jobs: Option<Arc<Mutex<Vec<Received>>>>,
    received: Arc<AtomicU64>,
    mode: Arc<Mutex<Mode>>,
    task: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl Mirror {
    /// A mirror service that keeps every job (for [`Mirror::wait_for`]).
    pub async fn start() -> Mirror {
        Mirror::start_with(true).await
    }

    /// A mirror service that only counts the jobs it receives ([`Mirror::received`]).
    pub async fn start_counting() -> Mirror {
        Mirror::start_with(false).await
    }

    async fn start_with(keep: bool) -> Mirror {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let url = format!("http://{}/mirror", listener.local_addr().expect("addr"));
        let jobs = keep.then(|| Arc::new(Mutex::new(Vec::new())));
        let received = Arc::new(AtomicU64::new(0));
        let mode = Arc::new(Mutex::new(Mode::Take));
        let (j, n, m) = (jobs.clone(), received.clone(), mode.clone());
        let router = axum::Router::new()
            .route(
                "/mirror",
                axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                    let (j, n, m) = (j.clone(), n.clone(), m.clone());
                    async move {
                        n.fetch_add(1, Ordering::Relaxed);
                        if let Some(j) = j {
                            j.lock().expect("jobs").push(Received {
                                authorization: headers
                                    .get("authorization")
                                    .and_then(|v| v.to_str().ok())
                                    .map(str::to_string),
                                envelope: serde_json::from_slice(&body).unwrap_or(Value::Null),
                            });
                        }
                        let mode = *m.lock().expect("mode");
                        match mode {
                            Mode::Take => StatusCode::ACCEPTED.into_response(),
                            Mode::Slow(d) => {
                                tokio::time::sleep(d).await;
                                StatusCode::ACCEPTED.into_response()
                            }
                            Mode::Fail => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                        }
                    }
                }),
            )
            .layer(axum::extract::DefaultBodyLimit::disable());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Mirror {
            url,
            jobs,
            received,
            mode,
            task: Arc::new(Mutex::new(Some(task))),
        }
    }

    /// How the service answers from now on.
    pub fn set(&self, mode: Mode) {
        *self.mode.lock().expect("mode") = mode;
    }

    /// Stop listening: connections are refused from now on.
    pub fn stop(&self) {
        if let Some(task) = self.task.lock().expect("task").take() {
            task.abort();
        }
    }

    /// The jobs received so far (none kept by a counting mirror).
    pub fn jobs(&self) -> Vec<Received> {
        self.jobs
            .as_ref()
            .map(|j| j.lock().expect("jobs").clone())
            .unwrap_or_default()
    }

    /// How many jobs arrived (kept or not).
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// The jobs whose body carries `marker` (each request of a test carries its own).
    pub fn with_marker(&self, marker: &str) -> Vec<Received> {
        self.jobs()
            .into_iter()
            .filter(|j| j.envelope["body"].to_string().contains(marker))
            .collect()
    }

    /// The first job carrying `marker`, waiting up to [`ARRIVAL`] for it.
    pub async fn wait_for(&self, marker: &str) -> Received {
        let deadline = Instant::now() + ARRIVAL;
        loop {
            if let Some(job) = self.with_marker(marker).into_iter().next() {
                return job;
            }
            assert!(
                Instant::now() < deadline,
                "no job carrying {marker} within {ARRIVAL:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `snap` plus a running shadow experiment `name` on `alias` over both rings, every
/// caller sampled into its treatment (prov-b, model `<alias>-treatment`). An alias the
/// policy lacks is added with its live target on prov-a (model `<alias>-live`).
pub fn with_experiment(snap: Snapshot, name: &str, alias: &str, turns: &str) -> Snapshot {
    let mut doc = serde_json::to_value(snap).expect("snapshot json");
    if doc["models"].get(alias).is_none() {
        doc["models"][alias] = json!([{"upstream": "prov-a", "model": format!("{alias}-live")}]);
    }
    doc["experiments"]
        .as_array_mut()
        .expect("experiments")
        .push(json!({"name": name, "type": "shadow", "axis": "traffic", "status": "running",
               "rings": ["canary", "general"], "salt": format!("{name}-salt"), "shadowTurns": turns,
               "variants": [{"name": "control", "weight": 0},
                            {"name": "treatment", "weight": 100,
                             "routes": {alias: [{"upstream": "prov-b", "model": format!("{alias}-treatment")}]}}]}));
    Snapshot::from_bytes(doc.to_string().as_bytes()).expect("snapshot decodes")
}
