//! One filter configuration (one `http_filters` entry): the request filter's settings,
//! policy and counters, or the per-attempt stage's; and its ticker, which polls the kill
//! list and hands the request counters to Envoy.
//!
//! Envoy builds a configuration on the main thread and hands it to every worker, so what
//! changes after that (the kill list in force, the counts) sits behind a lock. There is
//! one kill list per configuration, not one per worker as in the wasm build: a native
//! module shares the process's memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use halo_filter_core::config::{Config, KillSwitchSettings, Plugin as Decoded};
use halo_filter_core::host::{Level, Telemetry};
use halo_filter_core::killstate::{Enforced, FetchOutcome};
use halo_filter_core::metrics::{self, Counter, Definition};
use halo_filter_core::request::Policy;
use halo_policy::Snapshot;

use crate::ffi::envoy::{ConfigHandle, ConfigPtr, MainThread, Scheduler, log};

/// A filter configuration.
pub enum Plugin {
    Request(Box<RequestPlugin>),
    Attempt(Box<AttemptPlugin>),
}

/// Counter ids of one configuration (defined while Envoy builds it: later is too late),
/// and the request counts waiting for the next tick.
#[derive(Default)]
pub struct Meter {
    pub requests: Option<usize>,
    pub auth_failures: Option<usize>,
    pub decisions: Option<usize>,
    pub killswitch_fetch: Option<usize>,
    pub attempt_rewrites: Option<usize>,
    pub panics: Option<usize>,
    pub tokens: Option<usize>,
    pub cost_micro_usd: Option<usize>,
    pub upstream_auth_errors: Option<usize>,
    pub shadow_jobs: Option<usize>,
    /// Counts waiting for the next tick.
    pub tally: Tally,
    /// Shadow jobs waiting for the main thread.
    pub outbox: Outbox,
}

impl Meter {
    /// The id of `counter` in this configuration (`None`: not defined here).
    pub fn id(&self, counter: &Counter<'_>) -> Option<usize> {
        match counter {
            Counter::Requests { .. } => self.requests,
            Counter::AuthFailures => self.auth_failures,
            Counter::Decisions { .. } => self.decisions,
            Counter::KillswitchFetch { .. } => self.killswitch_fetch,
            Counter::AttemptRewrites => self.attempt_rewrites,
            Counter::Panics => self.panics,
            Counter::Tokens { .. } => self.tokens,
            Counter::CostMicroUsd { .. } => self.cost_micro_usd,
            Counter::UpstreamAuthErrors { .. } => self.upstream_auth_errors,
            Counter::ShadowJobs { .. } => self.shadow_jobs,
        }
    }
}

fn define(envoy: ConfigHandle<'_>, d: Definition) -> Option<usize> {
    let labels: Vec<String> = d.tags.iter().map(|t| metrics::label(t)).collect();
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    envoy.define_counter(&d.stat_name(), &labels)
}

/// The per-attempt stage's counts, handed to Envoy by a request filter configuration's
/// tick under its own counters.
///
/// Why not counters of the stage's configuration: Envoy gives an upstream filter its
/// cluster's stats scope, so they would be `cluster.<aggregate>.halo.attempt_rewrites`
/// (Prometheus `envoy_cluster_halo_attempt_rewrites{envoy_cluster_name=...}`), not the
/// `halo_attempt_rewrites` the wasm build exports. The module is loaded once per process,
/// so the stage and the request filter share this; the first configuration to tick takes
/// the counts, and each is handed over once.
pub struct StageCounts {
    attempt_rewrites: AtomicU64,
    panics: AtomicU64,
}

pub static STAGE_COUNTS: StageCounts = StageCounts {
    attempt_rewrites: AtomicU64::new(0),
    panics: AtomicU64::new(0),
};

impl StageCounts {
    /// Add `amount` to `counter` (the stage counts only attempt rewrites and panics).
    pub fn add(&self, counter: &Counter<'_>, amount: u64) {
        let slot = match counter {
            Counter::AttemptRewrites => &self.attempt_rewrites,
            Counter::Panics => &self.panics,
            _ => return,
        };
        slot.fetch_add(amount, Ordering::Relaxed);
    }

    /// The counts since the last take: (attempt rewrites, panics).
    fn take(&self) -> (u64, u64) {
        (
            self.attempt_rewrites.swap(0, Ordering::Relaxed),
            self.panics.swap(0, Ordering::Relaxed),
        )
    }
}

/// Request counts kept in the module and handed to Envoy on each tick (once a second).
/// An increment with labels costs Envoy a stat-name lookup, about 4,500 instructions, on
/// every request otherwise; Prometheus sees the counts at most a second late.
#[derive(Default)]
pub struct Tally(Mutex<HashMap<(usize, Vec<String>), u64>>);

impl Tally {
    /// Add `amount` to counter `id` with `labels`.
    pub fn add<S: AsRef<str>>(&self, id: Option<usize>, labels: &[S], amount: u64) {
        let Some(id) = id else { return };
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Looked up by borrowed labels first: no allocation for a combination seen before.
        if let Some(n) = counts
            .iter_mut()
            .find(|((i, l), _)| {
                *i == id
                    && l.iter()
                        .map(String::as_str)
                        .eq(labels.iter().map(AsRef::as_ref))
            })
            .map(|(_, n)| n)
        {
            *n += amount;
            return;
        }
        counts.insert(
            (id, labels.iter().map(|l| l.as_ref().to_string()).collect()),
            amount,
        );
    }

    fn take(&self) -> HashMap<(usize, Vec<String>), u64> {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *counts)
    }
}

/// Shadow jobs on their way from a stream to the main thread, which starts each as a
/// configuration-level callout. Why not the stream's own callout: Envoy cancels a
/// stream's callouts when the stream ends, so a live call answered before its job was
/// delivered (a fast provider, a service slow to take it) lost the job
/// (e2e/tests/shadow.rs, "a job outlives its live call"). A configuration's callout
/// belongs to no stream. The cost is one cross-thread wake per job; the main thread does
/// the job's HTTP work, bounded as every job by the `halo-shadow` cluster's breakers.
#[derive(Default)]
pub struct Outbox {
    jobs: Mutex<OutboxJobs>,
    /// Set while the configuration lives (cleared by [`RequestPlugin::stop`], so the
    /// scheduler is deleted with the ticker, on the main thread).
    waker: Mutex<Option<Arc<Scheduler>>>,
}

#[derive(Default)]
struct OutboxJobs {
    waiting: std::collections::VecDeque<OutboxJob>,
    bytes: usize,
}

/// One job as the stream handed it over.
pub struct OutboxJob {
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

/// The most job bytes waiting for the main thread; more is refused (counted `not_sent`
/// by the core). The main thread is woken per job, so this holds only a burst.
const OUTBOX_MAX_BYTES: usize = 64 * 1024 * 1024;

/// The event that wakes the main thread for waiting shadow jobs.
pub const SHADOW_EVENT: u64 = 2;

impl Outbox {
    /// Hand `job` to the main thread; false when it cannot take it (the configuration is
    /// going away, or too much is waiting).
    pub fn push(&self, job: OutboxJob) -> bool {
        let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner());
        let Some(waker) = waker.as_ref() else {
            return false;
        };
        {
            let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            let size = job.body.len();
            if jobs.bytes.saturating_add(size) > OUTBOX_MAX_BYTES {
                return false;
            }
            jobs.bytes += size;
            jobs.waiting.push_back(job);
        }
        waker.wake(SHADOW_EVENT);
        true
    }

    /// Every job waiting now.
    fn take(&self) -> Vec<OutboxJob> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.bytes = 0;
        jobs.waiting.drain(..).collect()
    }
}

/// The request filter's configuration.
pub struct RequestPlugin {
    pub cfg: Config,
    pub meter: Meter,
    /// The snapshot with the kill list in force applied, swapped when a list is accepted
    /// (read by every request: a read lock, apart from the kill state's).
    effective: RwLock<Arc<Snapshot>>,
    kill: Mutex<Enforced>,
    /// Stopped when Envoy destroys the configuration, even while streams still hold it.
    ticker: Mutex<Option<Ticker>>,
    poll: Mutex<PollState>,
    envoy: ConfigPtr,
}

/// The kill-list poll's schedule and the callout in flight.
struct PollState {
    next: Instant,
    inflight: Option<u64>,
}

/// The per-attempt stage's configuration.
pub struct AttemptPlugin {
    pub meter: Meter,
}

/// The event the ticker thread schedules on the main thread.
pub const TICK_EVENT: u64 = 1;

/// How often the main thread is woken to hand over counts and see whether a poll is due.
const TICK: Duration = Duration::from_secs(1);

/// Wakes the main thread every [`TICK`]: a thread that sleeps, and Envoy's configuration
/// scheduler (its commit is the one call allowed from any thread).
/// The scheduler is shared with the thread and deleted with its last holder, which is
/// the ticker once the thread has ended.
struct Ticker {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    scheduler: Arc<Scheduler>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl Plugin {
    /// Decode a configuration; `Err` is the reason to refuse it (logged by the caller).
    ///
    /// Called from `config_new` (main thread) with its configuration pointer.
    pub fn new(ptr: ConfigPtr, main: &MainThread<'_>, bytes: &[u8]) -> Result<Plugin, String> {
        let envoy = ptr.on(main);
        let env = |name: &str| std::env::var(name).ok();
        let cfg = match Decoded::from_bytes_with_env(bytes, &env).map_err(|e| e.to_string())? {
            Decoded::Attempt => {
                // No counters of its own: its counts go to [`STAGE_COUNTS`].
                return Ok(Plugin::Attempt(Box::new(AttemptPlugin {
                    meter: Meter::default(),
                })));
            }
            Decoded::Request(cfg) => *cfg,
        };
        let meter = Meter {
            requests: define(envoy, metrics::REQUESTS),
            auth_failures: define(envoy, metrics::AUTH_FAILURES),
            decisions: define(envoy, metrics::DECISIONS),
            killswitch_fetch: define(envoy, metrics::KILLSWITCH_FETCH),
            attempt_rewrites: define(envoy, metrics::ATTEMPT_REWRITES),
            panics: define(envoy, metrics::PANICS),
            tokens: define(envoy, metrics::TOKENS),
            cost_micro_usd: define(envoy, metrics::COST_MICRO_USD),
            upstream_auth_errors: define(envoy, metrics::UPSTREAM_AUTH_ERRORS),
            shadow_jobs: define(envoy, metrics::SHADOW_JOBS),
            tally: Tally::default(),
            outbox: Outbox::default(),
        };
        let start = Starting {
            envoy,
            meter: &meter,
        };
        let enforced = Enforced::start(&cfg, now_secs(), &start);
        let plugin = RequestPlugin {
            effective: RwLock::new(enforced.effective().clone()),
            kill: Mutex::new(enforced),
            ticker: Mutex::new(None),
            poll: Mutex::new(PollState {
                next: Instant::now(),
                inflight: None,
            }),
            envoy: ptr,
            meter,
            cfg,
        };
        let ticker = Ticker::start(envoy);
        *plugin
            .meter
            .outbox
            .waker
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(ticker.scheduler.clone());
        *plugin.ticker.lock().unwrap_or_else(|e| e.into_inner()) = Some(ticker);
        Ok(Plugin::Request(Box::new(plugin)))
    }
}

/// Logs and counts of a configuration being built (before its [`RequestPlugin`] exists).
struct Starting<'a> {
    envoy: ConfigHandle<'a>,
    meter: &'a Meter,
}

impl Telemetry for Starting<'_> {
    fn log(&self, level: Level, message: &str) {
        log(level, message);
    }

    fn add(&self, counter: Counter<'_>, amount: u64) {
        if let Some(id) = self.meter.id(&counter) {
            self.envoy.increment(id, &counter.values(), amount);
        }
    }
}

impl Ticker {
    fn start(envoy: ConfigHandle<'_>) -> Ticker {
        let scheduler = Arc::new(envoy.scheduler());
        let (stop, stopped) = mpsc::channel::<()>();
        let waker = scheduler.clone();
        let thread = std::thread::Builder::new()
            .name("halo-ticker".into())
            .spawn(move || {
                loop {
                    waker.wake(TICK_EVENT);
                    match stopped.recv_timeout(TICK) {
                        Err(mpsc::RecvTimeoutError::Timeout) => continue,
                        _ => break,
                    }
                }
            })
            .ok();
        Ticker {
            stop: Some(stop),
            thread,
            scheduler,
        }
    }
}

impl RequestPlugin {
    /// Envoy is destroying this configuration (main thread): stop the ticker and delete
    /// its scheduler now. Streams still in flight may hold the configuration a while
    /// longer, and the last of them may end on a worker thread; the scheduler must not
    /// outlive Envoy's side of the configuration, nor be deleted from a worker.
    pub fn stop(&self, _main: &MainThread<'_>) {
        // No stream wakes the scheduler after this; jobs still waiting are dropped.
        self.meter
            .outbox
            .waker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(self.meter.outbox.take());
        let ticker = self.ticker.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(ticker);
    }

    /// Start every waiting shadow job as a configuration-level callout (main thread). Its
    /// answer comes to `config_http_callout_done`, where only the kill-list poll's id is
    /// read; a job Envoy refuses to start is logged (the core counted it `sent` when the
    /// stream handed it over).
    pub fn send_shadow_jobs(&self, main: &MainThread<'_>) {
        let envoy = self.envoy.on(main);
        for job in self.meter.outbox.take() {
            let headers: Vec<(&str, &str)> = job
                .headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            if envoy
                .call_out(&job.cluster, &headers, &job.body, job.timeout_ms)
                .is_none()
            {
                log(
                    Level::Warn,
                    &format!(
                        "halo: Envoy refused a shadow job's callout to cluster {}",
                        job.cluster
                    ),
                );
            }
        }
    }

    fn telemetry<'h>(&'h self, main: &'h MainThread<'_>) -> Starting<'h> {
        Starting {
            envoy: self.envoy.on(main),
            meter: &self.meter,
        }
    }

    /// A tick (main thread): hand the counts to Envoy, and poll the kill list when due
    /// and no poll is in flight.
    pub fn on_tick(&self, main: &MainThread<'_>) {
        let envoy = self.envoy.on(main);
        for ((id, labels), n) in self.meter.tally.take() {
            envoy.increment(id, &labels, n);
        }
        let (rewrites, panics) = STAGE_COUNTS.take();
        for (id, n) in [
            (self.meter.attempt_rewrites, rewrites),
            (self.meter.panics, panics),
        ] {
            if let Some(id) = id.filter(|_| n > 0) {
                envoy.increment(id, &[] as &[&str], n);
            }
        }
        let Some(ks) = self.cfg.kill_switch.as_ref().filter(|k| k.key.is_ok()) else {
            return;
        };
        let mut poll = self.poll.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if poll.inflight.is_some() || now < poll.next {
            return;
        }
        poll.next = now + Duration::from_secs(u64::from(ks.interval_secs.max(1)));
        match call_out(envoy, ks) {
            Some(id) => poll.inflight = Some(id),
            None => self.telemetry(main).count(Counter::KillswitchFetch {
                outcome: FetchOutcome::HttpError.as_str(),
            }),
        }
    }
}

/// Call the kill-list server (a configuration-level callout; its answer comes to
/// `config_http_callout_done`).
fn call_out(envoy: ConfigHandle<'_>, ks: &KillSwitchSettings) -> Option<u64> {
    {
        let auth = format!("Bearer {}", ks.token);
        let headers: Vec<(&str, &str)> = vec![
            (":method", "GET"),
            (":path", ks.path.as_str()),
            (":authority", ks.authority.as_str()),
            ("host", ks.authority.as_str()),
            ("authorization", auth.as_str()),
            ("accept", "application/json"),
        ];
        envoy.call_out(&ks.cluster, &headers, &[], 5_000)
    }
}

impl RequestPlugin {
    /// A poll's answer (main thread): verify, apply, count. `status` is `None` when the
    /// call failed.
    pub fn on_poll_answer(&self, main: &MainThread<'_>, id: u64, status: Option<u16>, body: &[u8]) {
        {
            let mut poll = self.poll.lock().unwrap_or_else(|e| e.into_inner());
            if poll.inflight != Some(id) {
                return;
            }
            poll.inflight = None;
        }
        let mut kill = self.kill.lock().unwrap_or_else(|e| e.into_inner());
        if kill.on_poll_answer(&self.cfg, status, body, now_secs(), &self.telemetry(main)) {
            let next = kill.effective().clone();
            *self.effective.write().unwrap_or_else(|e| e.into_inner()) = next;
        }
    }
}

impl Policy for RequestPlugin {
    fn config(&self) -> &Config {
        &self.cfg
    }

    /// The snapshot in force for a new request.
    fn snapshot(&self) -> Arc<Snapshot> {
        self.effective
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

// A configuration is shared by every worker thread.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<RequestPlugin>();
    shared::<AttemptPlugin>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tally_counts_per_counter_and_labels_and_starts_again_after_a_take() {
        let t = Tally::default();
        t.add(Some(1), &["general", "none", "200"], 1);
        t.add(Some(1), &["general", "none", "200"], 1);
        t.add(Some(1), &["canary", "none", "200"], 1);
        t.add(Some(2), &["general", "none", "200"], 1);
        t.add(Some(3), &["general", "none", "a", "input"], 4125);
        t.add(Some(3), &["general", "none", "a", "input"], 30);
        t.add(None, &["ignored"], 1);
        let counts = t.take();
        let key = |id: usize, l: &[&str]| (id, l.iter().map(|s| s.to_string()).collect());
        assert_eq!(counts.len(), 4);
        assert_eq!(counts[&key(3, &["general", "none", "a", "input"])], 4155);
        assert_eq!(counts[&key(1, &["general", "none", "200"])], 2);
        assert_eq!(counts[&key(1, &["canary", "none", "200"])], 1);
        assert_eq!(counts[&key(2, &["general", "none", "200"])], 1);
        assert!(t.take().is_empty());
    }
}
