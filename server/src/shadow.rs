//! The mirror service (spec: Request path 9 "Mirror"; Trust zones "Shadow token,
//! halo-shadow /mirror"): `POST /mirror` on `--shadow-listen` takes the halo filter's
//! shadow jobs (halo-envoy-config's [`ShadowJob`]) and sends each to the shadow variant's
//! target with the gateway's own credential for it, reads the answer in full and records
//! status, latency, tokens and cost as evidence for the shadow variant, source `shadow`.
//!
//! A mode of halo-server rather than a binary of its own: the job names a policy upstream
//! and the served policy (its URL, kind, credential and prices) is halo-server's, and so
//! is the evidence store the record goes to; one process fewer to deploy and secure.
//!
//! Never in the live path: the filter's callout is answered 202 as soon as the job is
//! queued (Envoy ends a stream's callouts with the stream), and the work happens after.
//! Bounds, each counted in `halo_server_shadow_jobs_total{outcome}`: the queue
//! (`--shadow-queue`; full: 429 `queue_full`), the concurrency (`--shadow-concurrency`
//! jobs sent at once), the age (`--shadow-max-age`: a job older when a worker takes it
//! is dropped, `too_old`), the spend (`--shadow-max-spend-usd` per experiment per UTC
//! day; over it: `over_budget`). Answers are counted by status
//! (`halo_server_shadow_answers_total{status}`).
//!
//! Credentials: what the gateway plan gives the upstream's attempts, decided by the plan's
//! own code ([`halo_envoy_config::credentials::target_credential`]) with the gateway
//! settings halo-server serves over xDS (`upstreamHosts`, `upstreamHeaders`; none without
//! `--xds-listen`): the operator's `upstreamHeaders` (`${VAR}` from this process's
//! environment; one missing: `header_missing`), then the policy upstream's key
//! (environment variable or file, read at use time) in the kind's header, only to a host
//! the plan would send it to (else `key_host_refused`); for vertex, the Google token in the
//! SDS file halo-credentials keeps fresh (`vertexTokenSds`), read at use time and sent as
//! `Authorization` as Envoy's credential injector sends it; for bedrock, a SigV4 signature
//! over the request as sent ([`crate::sigv4`]: the AWS SDK's signer, the environment's key
//! pair), only to an AWS host or one in `signHosts`. A credential the plan names that is
//! not there (key, token file, AWS key pair) is `key_missing`. The job's path is the
//! attempt's (the gateway too sends no upstream URL path prefix).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use halo_contract::shadow::ShadowJob;
use halo_envoy_config::credentials::{
    Hosts, SecretSource, TargetCredential, expand_header_value, target_credential,
};
use halo_evidence::{Record, Source, Stamped, Store};
use halo_policy::types::UpstreamKind;
use halo_providers::usage::{Dialect, Framing, Meter};
use halo_xds::Served;
use tokio::sync::{mpsc, watch};

use crate::http::ApiError;
use crate::http::listener::{JsonListener, Peer};
use crate::http::secret::SecretGate;
use crate::sigv4::{self, AwsKey};
use crate::token::{TokenDigest, read_token_file};
use halo_metrics::{CounterMap, Text};

/// Default `--shadow-concurrency`.
pub const DEFAULT_CONCURRENCY: usize = 4;
/// Default `--shadow-queue`.
pub const DEFAULT_QUEUE: usize = 256;
/// Default `--shadow-max-age`.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(60);
/// Default `--shadow-max-spend-usd` (per experiment per UTC day).
pub const DEFAULT_MAX_SPEND_USD: f64 = 50.0;
/// How long a job's answer may take in all.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(600);

/// The mirror service's settings (halo-server's `--shadow-*` flags).
#[derive(Debug, Clone)]
pub struct ShadowSettings {
    pub listen: Option<SocketAddr>,
    pub token_file: Option<PathBuf>,
    pub concurrency: usize,
    pub queue: usize,
    pub max_age: Duration,
    pub max_spend_usd: f64,
    /// Largest job accepted (the filter's `shadow.maxBytes` plus the envelope).
    pub max_job_bytes: usize,
}

impl Default for ShadowSettings {
    fn default() -> Self {
        ShadowSettings {
            listen: None,
            token_file: None,
            concurrency: DEFAULT_CONCURRENCY,
            queue: DEFAULT_QUEUE,
            max_age: DEFAULT_MAX_AGE,
            max_spend_usd: DEFAULT_MAX_SPEND_USD,
            max_job_bytes: 32 * 1024 * 1024,
        }
    }
}

impl ShadowSettings {
    /// The combinations it needs (the token file is read by [`start`]).
    pub fn check(&self) -> Result<(), String> {
        if self.listen.is_some() && self.token_file.is_none() {
            return Err(
                "--shadow-listen requires --shadow-token-file (the gateways' filter presents it)"
                    .into(),
            );
        }
        if self.concurrency == 0 || self.queue == 0 {
            return Err("--shadow-concurrency and --shadow-queue must be at least 1".into());
        }
        if self.max_spend_usd.is_nan() || self.max_spend_usd < 0.0 {
            return Err("--shadow-max-spend-usd must be a number >= 0".into());
        }
        Ok(())
    }
}

/// Counts for halo-server's /metrics.
#[derive(Debug, Default)]
pub struct ShadowMetrics {
    jobs: CounterMap<&'static str>,
    answers: CounterMap<u16>,
}

impl ShadowMetrics {
    fn job(&self, outcome: &'static str) {
        self.jobs.inc(outcome);
    }

    fn answer(&self, status: u16) {
        self.answers.inc(status);
    }

    /// The count of jobs with `outcome`.
    pub fn jobs(&self, outcome: &'static str) -> u64 {
        self.jobs.get(&outcome)
    }

    /// Its families as Prometheus text (what `/metrics` shows of it).
    pub fn render(&self) -> String {
        let mut text = Text::new();
        self.write_prometheus(&mut text);
        text.finish()
    }

    pub fn write_prometheus(&self, out: &mut Text) {
        out.counters(
            "halo_server_shadow_jobs_total",
            "Shadow jobs by outcome: accepted, queue_full, unauthorized, malformed, too_old, over_budget, unknown_upstream, header_missing, key_missing, key_host_refused, send_failed, recorded, record_failed.",
            &["outcome"],
            &self.jobs,
        );
        out.counters(
            "halo_server_shadow_answers_total",
            "Answers of shadow targets by HTTP status (0: no answer).",
            &["status"],
            &self.answers,
        );
    }
}

/// The running mirror service.
pub struct Mirror {
    pub addr: SocketAddr,
    pub metrics: Arc<ShadowMetrics>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

struct Intake {
    token: TokenDigest,
    queue: mpsc::Sender<ShadowJob>,
    gate: SecretGate,
    metrics: Arc<ShadowMetrics>,
}

/// What a worker needs.
struct Work {
    policy: watch::Receiver<Arc<Served>>,
    /// The served gateway settings' credential settings (none without xDS).
    hosts: Hosts,
    store: Arc<dyn Store>,
    http: reqwest::Client,
    metrics: Arc<ShadowMetrics>,
    max_age: Duration,
    max_spend_usd: f64,
    /// Spend per (experiment, UTC day number).
    spent: Mutex<BTreeMap<(String, i64), f64>>,
}

/// Serve `POST /mirror` on `listener` (bound by the caller from `--shadow-listen`: the
/// xDS gateway settings name its address before the service starts) and start the
/// workers.
pub fn start(
    settings: &ShadowSettings,
    listener: tokio::net::TcpListener,
    policy: watch::Receiver<Arc<Served>>,
    hosts: Hosts,
    upstream_ca_file: Option<&Path>,
    store: Arc<dyn Store>,
) -> anyhow::Result<Mirror> {
    settings.check().map_err(anyhow::Error::msg)?;
    let token_file = settings
        .token_file
        .as_deref()
        .context("--shadow-token-file")?;
    let token = read_token_file("shadow token", token_file)?;
    let addr = listener.local_addr()?;
    let metrics = Arc::new(ShadowMetrics::default());
    let (tx, rx) = mpsc::channel(settings.queue);
    let intake = Arc::new(Intake {
        token,
        queue: tx,
        gate: SecretGate::default(),
        metrics: Arc::clone(&metrics),
    });
    let work = Arc::new(Work {
        policy,
        hosts,
        store,
        http: target_client(upstream_ca_file)?,
        metrics: Arc::clone(&metrics),
        max_age: settings.max_age,
        max_spend_usd: settings.max_spend_usd,
        spent: Mutex::new(BTreeMap::new()),
    });
    let app = axum::Router::new()
        .route("/mirror", axum::routing::post(take))
        .layer(DefaultBodyLimit::max(settings.max_job_bytes))
        .with_state(intake)
        .into_make_service_with_connect_info::<Peer>();
    let mut tasks = vec![tokio::spawn(async move {
        if let Err(e) = axum::serve(JsonListener(listener), app).await {
            tracing::error!(error = %e, "mirror service listener failed");
        }
    })];
    tasks.push(tokio::spawn(run_workers(rx, work, settings.concurrency)));
    tracing::info!(%addr, "mirror service listening");
    Ok(Mirror {
        addr,
        metrics,
        tasks,
    })
}

/// `POST /mirror`: the shadow token (throttled as every shared secret), a strict job, a
/// place in the queue; 202 at once.
async fn take(
    State(intake): State<Arc<Intake>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ip = peer.ip();
    intake.gate.wait(ip).await?;
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let valid = presented.is_some_and(|t| intake.token.matches(t.trim()));
    intake.gate.outcome(ip, valid);
    if !valid {
        intake.metrics.job("unauthorized");
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "a valid shadow token is required (Authorization: Bearer)",
        ));
    }
    let job = ShadowJob::decode(&body).map_err(|why| {
        intake.metrics.job("malformed");
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_job",
            format!("the shadow job is malformed: {why}"),
        )
    })?;
    match intake.queue.try_send(job) {
        Ok(()) => {
            intake.metrics.job("accepted");
            Ok((
                StatusCode::ACCEPTED,
                [(header::CONTENT_TYPE, "application/json")],
                r#"{"accepted":true}"#,
            )
                .into_response())
        }
        Err(_) => {
            intake.metrics.job("queue_full");
            Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "queue_full",
                "the mirror service's queue is full; the job is dropped",
            ))
        }
    }
}

/// The client jobs are sent with: it trusts exactly the gateway's `upstreamCaFile` (as
/// Envoy's upstream TLS does) when halo-server serves gateway settings, else the built-in
/// roots.
fn target_client(upstream_ca_file: Option<&Path>) -> anyhow::Result<reqwest::Client> {
    crate::auth::install_crypto_provider();
    let mut builder = reqwest::Client::builder().timeout(ANSWER_TIMEOUT);
    if let Some(path) = upstream_ca_file {
        let what = || {
            format!(
                "upstreamCaFile {} (the gateway settings): the mirror service verifies targets against it",
                path.display()
            )
        };
        let pem = std::fs::read(path).with_context(what)?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).with_context(what)?;
        anyhow::ensure!(!certs.is_empty(), "{}: no PEM certificate in it", what());
        builder = builder.tls_certs_only(certs);
    }
    builder.build().context("the mirror service's HTTP client")
}

/// Take jobs off the queue, at most `concurrency` at work at once. A slot is taken before
/// a job leaves the queue, so a busy service holds at most `--shadow-queue` waiting jobs
/// (taken first, a job would wait outside the queue's bound).
async fn run_workers(mut rx: mpsc::Receiver<ShadowJob>, work: Arc<Work>, concurrency: usize) {
    let slots = Arc::new(tokio::sync::Semaphore::new(concurrency));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let Some(job) = rx.recv().await else {
            return;
        };
        let work = Arc::clone(&work);
        tokio::spawn(async move {
            let outcome = work.run(job).await;
            work.metrics.job(outcome);
            drop(permit);
        });
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl Work {
    /// Send one job and record its outcome; the outcome's name for the counter.
    async fn run(&self, job: ShadowJob) -> &'static str {
        let now = now_ms();
        let age = now.saturating_sub(i64::try_from(job.built_unix_ms).unwrap_or(i64::MAX));
        if age > i64::try_from(self.max_age.as_millis()).unwrap_or(i64::MAX) {
            return "too_old";
        }
        let day = now.div_euclid(86_400_000);
        if self.spent(&job.experiment, day) >= self.max_spend_usd {
            return "over_budget";
        }
        let served = Arc::clone(&self.policy.borrow());
        let snap = &served.compiled;
        let Some(upstream) = snap.upstreams.get(&job.upstream) else {
            return "unknown_upstream";
        };
        let Ok(url) = halo_policy::validate::parse_http_url(&upstream.url) else {
            return "unknown_upstream";
        };
        let dialect = dialect(upstream.kind, &job.path);
        let scheme = if url.https { "https" } else { "http" };
        let target = format!("{scheme}://{}{}", url.authority, job.path);
        let body = job
            .body
            .as_ref()
            .map(|b| b.get().as_bytes().to_vec())
            .unwrap_or_default();
        let mut headers = job.headers.clone();
        // What the gateway plan gives this upstream's attempts, decided by the plan's own
        // code with the served gateway settings: the operator's headers first, then the
        // gateway's credential (which wins, as in Envoy's chain).
        let env = |var: &str| std::env::var(var).ok();
        for (name, value) in self
            .hosts
            .upstream_headers
            .get(&job.upstream)
            .into_iter()
            .flatten()
        {
            let Ok(value) = expand_header_value(value, env) else {
                return "header_missing";
            };
            set_header(&mut headers, name, value);
        }
        match target_credential(&job.upstream, upstream, &self.hosts) {
            (TargetCredential::None, None) => {}
            // A configured credential the plan will not send to this host.
            (TargetCredential::None, Some(_)) | (TargetCredential::RefuseSigning { .. }, _) => {
                return "key_host_refused";
            }
            (
                TargetCredential::Key {
                    header,
                    bearer,
                    source,
                    ..
                },
                _,
            ) => {
                // Read at use time, as the gateway's per-attempt step does.
                let secret = match &source {
                    SecretSource::Env(var) => std::env::var(var).ok(),
                    SecretSource::File(file) => std::fs::read_to_string(file).ok(),
                };
                let Some(secret) = secret
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                else {
                    return "key_missing";
                };
                let value = if bearer {
                    format!("Bearer {secret}")
                } else {
                    secret
                };
                set_header(&mut headers, header, value);
            }
            // Envoy's credential injector sends the SDS secret's value as it is.
            (TargetCredential::Token { secret, sds_path }, _) => {
                match halo_credentials::sds::read_secret(Path::new(&sds_path), &secret) {
                    Ok(value) => set_header(&mut headers, "authorization", value),
                    Err(e) => {
                        tracing::warn!(upstream = %job.upstream, error = %e, "shadow job: no Google token to send");
                        return "key_missing";
                    }
                }
            }
            // Signed last, over every header sent (Host as sent: set explicitly).
            (TargetCredential::SigV4 { region }, _) => {
                let Some(key) = AwsKey::from_env(env) else {
                    tracing::warn!(upstream = %job.upstream, "shadow job: no AWS key pair in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)");
                    return "key_missing";
                };
                set_header(&mut headers, "host", url.authority.to_string());
                match sigv4::sign_request(
                    &job.method,
                    &target,
                    &headers,
                    &body,
                    &region,
                    &key,
                    std::time::SystemTime::now(),
                ) {
                    Ok(added) => {
                        for (name, value) in added {
                            set_header(&mut headers, &name, value);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(upstream = %job.upstream, error = %e, "shadow job: not signed");
                        return "key_missing";
                    }
                }
            }
        }
        let mut request = self.http.request(
            reqwest::Method::from_bytes(job.method.as_bytes()).unwrap_or(reqwest::Method::POST),
            &target,
        );
        for (name, value) in &headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let started = Instant::now();
        let (status, ttfb, accounting) = match request.body(body).send().await {
            Err(e) => {
                tracing::info!(experiment = %job.experiment, upstream = %job.upstream, error = %e, "shadow job: no answer from the target");
                (0u16, None, None)
            }
            Ok(resp) => {
                let status = resp.status().as_u16();
                let ttfb = started.elapsed();
                let framing = resp
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map_or(Framing::Json, Framing::from_content_type);
                let mut meter = Meter::new(dialect, framing);
                let mut resp = resp;
                let mut whole = true;
                loop {
                    match resp.chunk().await {
                        Ok(Some(piece)) => meter.feed(&piece),
                        Ok(None) => break,
                        Err(_) => {
                            whole = false;
                            break;
                        }
                    }
                }
                let accounting = if whole { meter.finish() } else { meter.cut() };
                (status, Some(ttfb), Some(accounting))
            }
        };
        let duration = started.elapsed();
        self.metrics.answer(status);
        let usage = accounting.as_ref().map(|a| a.usage).unwrap_or_default();
        let cost = usage.cost_usd(snap.price(&job.upstream, &job.model));
        if let Some(c) = cost {
            self.add_spend(&job.experiment, day, c);
        }
        let record = Record {
            time_unix_ms: now,
            ring: job.ring.clone(),
            release: String::new(),
            experiment: job.experiment.clone(),
            variant: job.variant.clone(),
            alias: job.alias.clone(),
            upstream: job.upstream.clone(),
            model: job.model.clone(),
            target: String::new(),
            attempts: 1,
            status,
            ttfb_ms: ttfb.map(|d| d.as_secs_f64() * 1000.0),
            duration_ms: Some(duration.as_secs_f64() * 1000.0),
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cache_write_tokens: usage.cache_write_tokens,
            cache_read_tokens: usage.cache_read_tokens,
            cost_usd: cost,
            complete: accounting.is_some_and(|a| a.complete),
            unit: job.unit.clone(),
        };
        let store = Arc::clone(&self.store);
        let stamped = [Stamped {
            source: Source::Shadow,
            record,
        }];
        match tokio::task::spawn_blocking(move || store.append(&stamped)).await {
            Ok(Ok(_)) if status != 0 => "recorded",
            Ok(Ok(_)) => "send_failed",
            _ => "record_failed",
        }
    }

    fn spent(&self, experiment: &str, day: i64) -> f64 {
        self.spent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(experiment.to_string(), day))
            .copied()
            .unwrap_or(0.0)
    }

    fn add_spend(&self, experiment: &str, day: i64, usd: f64) {
        let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        // Earlier days are done with.
        spent.retain(|(_, d), _| *d >= day);
        *spent.entry((experiment.to_string(), day)).or_insert(0.0) += usd;
    }
}

/// The wire a target of `kind` answers a job for `path` in, for the usage meter: Bedrock
/// answers invoke in Anthropic's Messages shape and converse in its own, Vertex's
/// rawPredict (Claude) in Anthropic's.
fn dialect(kind: UpstreamKind, path: &str) -> Dialect {
    match kind {
        UpstreamKind::Anthropic | UpstreamKind::Orchestrator | UpstreamKind::Vertex => {
            Dialect::Anthropic
        }
        UpstreamKind::Openai | UpstreamKind::AzureOpenai => Dialect::OpenAiResponses,
        UpstreamKind::Gemini => Dialect::Gemini,
        UpstreamKind::Bedrock => halo_policy::admit::operation_of(path)
            .map_or(Dialect::Anthropic, |(wire, op)| Dialect::of(wire, op)),
    }
}

/// Set header `name` (case-insensitive) to `value`, replacing any earlier value.
fn set_header(headers: &mut Vec<(String, String)>, name: &str, value: String) {
    headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    headers.push((name.to_string(), value));
}
