//! The evidence receivers and store (spec: low-level design "Trust zones and keys";
//! DESIGN.md "The evidence loop", steps 3 and 4).
//!
//! Four OTLP log receivers, one per trust zone, each its own listener so a network policy
//! can expose them separately: CLI (`--otlp-cli-listen`, spec :4317, and
//! `--otlp-cli-http-listen`, spec :4318; token optional), gateway (`--otlp-gateway-listen`,
//! :4319; token required) and eval (`--otlp-eval-listen`, :4320; token required, and it
//! must differ from the gateway's). Every listener speaks both OTLP/gRPC
//! (`LogsService/Export`, HTTP/2) and OTLP/HTTP (`POST /v1/logs`, HTTP/1.1, protobuf or
//! JSON), so Envoy's gRPC access logger and a harness's HTTP exporter reach any of them.
//! OTLP/HTTP metrics and traces (`/v1/metrics`, `/v1/traces`) are acknowledged and
//! dropped, counted as `ignored_batches`: a harness exports all three signals to the one
//! endpoint it is given (Gemini CLI does), and a 404 would print an exporter error in
//! the developer's terminal on every export. The
//! receiver stamps the source of its zone; a record's own `halo.source` is never read.
//!
//! They live in halo-server rather than a collector binary: the store is halo-server's
//! (its data dir, or the PostgreSQL it is given), the samples query is served by its
//! admin API, and /metrics counts per source in one place; nothing else to deploy.
//!
//! A batch is decoded, converted whole ([`halo_evidence::otlp::records`]) and written in
//! one transaction before the answer: a refused or failed batch stores nothing, and an
//! acknowledged one is on disk. Refusals: no or a wrong token 401 (gRPC UNAUTHENTICATED),
//! a batch over `--otlp-max-batch-bytes` 413 (gRPC: tonic's OUT_OF_RANGE), malformed
//! protobuf or records 400 (INVALID_ARGUMENT); HTTP bodies are JSON with an error code.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use halo_evidence::otlp;
use halo_evidence::{Source, Store};
use halo_metrics::{CounterMap, Text};
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use prost::Message as _;
use serde_json::json;

use crate::auth::Admin;
use crate::http::admin::AdminState;
use crate::http::{AdminAuth, ApiError, Disabled, or_disabled};
use crate::token::{TokenDigest, read_token_file};

/// Default largest batch (encoded OTLP request) accepted.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Default retention of evidence records.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(90 * 24 * 3600);

/// The evidence settings, resolved from halo-server's flags (`--otlp-*`,
/// `--evidence-*`; [`crate::config::Flags`] documents each).
#[derive(Debug, Clone)]
pub struct EvidenceSettings {
    pub cli_listen: Option<SocketAddr>,
    pub cli_http_listen: Option<SocketAddr>,
    pub cli_token_file: Option<PathBuf>,
    pub gateway_listen: Option<SocketAddr>,
    pub gateway_token_file: Option<PathBuf>,
    pub eval_listen: Option<SocketAddr>,
    pub eval_token_file: Option<PathBuf>,
    pub max_batch_bytes: usize,
    pub postgres_file: Option<PathBuf>,
    pub retention: Duration,
}

impl Default for EvidenceSettings {
    fn default() -> Self {
        EvidenceSettings {
            cli_listen: None,
            cli_http_listen: None,
            cli_token_file: None,
            gateway_listen: None,
            gateway_token_file: None,
            eval_listen: None,
            eval_token_file: None,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            postgres_file: None,
            retention: DEFAULT_RETENTION,
        }
    }
}

impl EvidenceSettings {
    fn any_receiver(&self) -> bool {
        self.cli_listen.is_some()
            || self.cli_http_listen.is_some()
            || self.gateway_listen.is_some()
            || self.eval_listen.is_some()
    }

    /// The combinations the trust zones require (the token files are read by [`start`]).
    pub fn check(&self) -> Result<(), String> {
        if self.gateway_listen.is_some() && self.gateway_token_file.is_none() {
            return Err(
                "--otlp-gateway-listen requires --otlp-gateway-token-file (only gateways may send gateway evidence)".into(),
            );
        }
        if self.eval_listen.is_some() && self.eval_token_file.is_none() {
            return Err("--otlp-eval-listen requires --otlp-eval-token-file".into());
        }
        if self.max_batch_bytes < 1024 {
            return Err("--otlp-max-batch-bytes must be at least 1024".into());
        }
        if self.retention.is_zero() {
            return Err("--evidence-retention must be positive".into());
        }
        Ok(())
    }
}

/// Counters per source for /metrics: log records received, refused and stored.
#[derive(Debug, Default)]
pub struct EvidenceMetrics {
    counts: CounterMap<(&'static str, &'static str)>,
}

impl EvidenceMetrics {
    fn add(&self, what: &'static str, source: Source, n: usize) {
        if n == 0 {
            return;
        }
        self.counts.add((what, source.as_str()), n as u64);
    }

    /// The count of `what` (received, refused, stored, ignored) for `source`.
    pub fn get(&self, what: &'static str, source: Source) -> u64 {
        self.counts.get(&(what, source.as_str()))
    }

    /// Its families as Prometheus text (what `/metrics` shows of it).
    pub fn render(&self) -> String {
        let mut text = Text::new();
        self.write_prometheus(&mut text);
        text.finish()
    }

    pub fn write_prometheus(&self, out: &mut Text) {
        out.counters(
            "halo_server_evidence_records_total",
            "OTLP log records by outcome (received, refused, stored, ignored) and the source the receiver stamped.",
            &["outcome", "source"],
            &self.counts,
        );
    }
}

/// The evidence store and the receivers' shared state.
pub struct Evidence {
    pub store: Arc<dyn Store>,
    pub metrics: EvidenceMetrics,
    max_batch_bytes: usize,
}

impl std::fmt::Debug for Evidence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Evidence").finish_non_exhaustive()
    }
}

/// Running receivers: their bound addresses by source.
#[derive(Debug)]
pub struct Receivers {
    pub evidence: Arc<Evidence>,
    pub addrs: Vec<(Source, SocketAddr)>,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Receivers {
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// The first address serving `source`.
    pub fn addr(&self, source: Source) -> Option<SocketAddr> {
        self.addrs
            .iter()
            .find(|(s, _)| *s == source)
            .map(|(_, a)| *a)
    }
}

/// Open the store and bind the configured receivers. `None` when no receiver is set.
pub async fn start(
    settings: &EvidenceSettings,
    data_dir: Option<&std::path::Path>,
) -> anyhow::Result<Option<Receivers>> {
    if !settings.any_receiver() {
        return Ok(None);
    }
    settings.check().map_err(anyhow::Error::msg)?;
    // Tokens first: a weak or missing token refuses startup before anything is bound.
    let read =
        |what, p: &Option<PathBuf>| p.as_deref().map(|p| read_token_file(what, p)).transpose();
    let cli_token = read("OTLP CLI token", &settings.cli_token_file)?;
    let gateway_token = read("OTLP gateway token", &settings.gateway_token_file)?;
    let eval_token = read("OTLP eval token", &settings.eval_token_file)?;
    if let (Some(g), Some(e)) = (&gateway_token, &eval_token)
        && g == e
    {
        anyhow::bail!(
            "the OTLP eval token must differ from the gateway token (eval evidence must not pass for the gateway's)"
        );
    }
    // The PostgreSQL client blocks (it runs its own runtime): opened off the async threads.
    let (s, d) = (settings.clone(), data_dir.map(std::path::Path::to_path_buf));
    let store = tokio::task::spawn_blocking(move || {
        halo_evidence::open::open_store(s.postgres_file.as_deref(), d.as_deref())
    })
    .await
    .context("opening the evidence store")??;
    let evidence = Arc::new(Evidence {
        store,
        metrics: EvidenceMetrics::default(),
        max_batch_bytes: settings.max_batch_bytes,
    });
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut addrs = Vec::new();
    let mut tasks = Vec::new();
    let zones = [
        (settings.cli_listen, Source::Cli, cli_token.clone()),
        (settings.cli_http_listen, Source::Cli, cli_token),
        (settings.gateway_listen, Source::Gateway, gateway_token),
        (settings.eval_listen, Source::Eval, eval_token),
    ];
    for (listen, source, token) in zones {
        let Some(listen) = listen else { continue };
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the {source} evidence receiver {listen}"))?;
        let addr = listener.local_addr()?;
        addrs.push((source, addr));
        let zone = Arc::new(Zone {
            source,
            token,
            evidence: Arc::clone(&evidence),
        });
        tasks.push(tokio::spawn(serve(listener, zone, rx.clone())));
    }
    tasks.push(tokio::spawn(prune_loop(
        Arc::clone(&evidence.store),
        settings.retention,
        rx,
    )));
    tracing::info!(receivers = ?addrs, "evidence receivers listening");
    Ok(Some(Receivers {
        evidence,
        addrs,
        shutdown: tx,
        tasks,
    }))
}

async fn prune_loop(
    store: Arc<dyn Store>,
    retention: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let before = now_ms() - i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let s = Arc::clone(&store);
        match tokio::task::spawn_blocking(move || s.prune(before)).await {
            Ok(Ok(n)) if n > 0 => tracing::info!(pruned = n, "evidence retention"),
            Ok(Err(e)) => tracing::warn!(error = %e, "evidence retention failed"),
            _ => {}
        }
        tokio::select! {
            _ = stop.wait_for(|v| *v) => return,
            _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// One receiver: its source and token.
struct Zone {
    source: Source,
    token: Option<TokenDigest>,
    evidence: Arc<Evidence>,
}

/// Why a batch was refused.
#[derive(Debug)]
enum Refusal {
    Unauthenticated,
    TooLarge,
    Malformed(String),
    Store,
}

impl Zone {
    fn authorized(&self, authorization: Option<&str>) -> bool {
        match &self.token {
            None => true,
            Some(digest) => authorization
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|t| digest.matches(t.trim())),
        }
    }

    /// Convert and store one batch; the count of log records stored.
    async fn ingest(&self, request: ExportLogsServiceRequest) -> Result<usize, Refusal> {
        let m = &self.evidence.metrics;
        let total = otlp::log_count(&request);
        m.add("received", self.source, total);
        let (records, ignored) = match otlp::records(&request, self.source, now_ms()) {
            Ok(r) => r,
            Err(e) => {
                m.add("refused", self.source, total);
                return Err(Refusal::Malformed(e.to_string()));
            }
        };
        m.add("ignored", self.source, ignored);
        let store = Arc::clone(&self.evidence.store);
        let n = records.len();
        let result = tokio::task::spawn_blocking(move || store.append(&records)).await;
        match result {
            Ok(Ok(_)) => {
                m.add("stored", self.source, n);
                Ok(n)
            }
            Ok(Err(e)) => {
                m.add("refused", self.source, total);
                tracing::error!(error = %e, source = %self.source, "storing evidence failed");
                Err(Refusal::Store)
            }
            Err(_) => {
                m.add("refused", self.source, total);
                Err(Refusal::Store)
            }
        }
    }

    fn refuse(&self, r: &Refusal) {
        if matches!(r, Refusal::Unauthenticated | Refusal::TooLarge) {
            // Nothing was decoded: count the attempt, not records.
            self.evidence.metrics.add("refused_batches", self.source, 1);
        }
    }
}

/// The gRPC service of one zone.
struct GrpcZone(Arc<Zone>);

#[tonic::async_trait]
impl LogsService for GrpcZone {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        let auth = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if !self.0.authorized(auth) {
            self.0.refuse(&Refusal::Unauthenticated);
            return Err(tonic::Status::unauthenticated(
                "this receiver requires its bearer token",
            ));
        }
        match self.0.ingest(request.into_inner()).await {
            Ok(_) => Ok(tonic::Response::new(ExportLogsServiceResponse::default())),
            Err(Refusal::Malformed(m)) => Err(tonic::Status::invalid_argument(m)),
            Err(Refusal::Store) => Err(tonic::Status::unavailable(
                "the evidence store failed; retry",
            )),
            Err(Refusal::Unauthenticated | Refusal::TooLarge) => {
                Err(tonic::Status::internal("unreachable refusal"))
            }
        }
    }
}

/// A refusal of the OTLP/HTTP receivers and the samples API, in the API's error shape.
fn error(status: StatusCode, code: &'static str, message: impl Into<String>) -> Response {
    ApiError::new(status, code, message).into_response()
}

/// How an OTLP/HTTP body is encoded; the answer is encoded the same way (OTLP/HTTP
/// requires receivers to take both: Gemini CLI sends JSON, Envoy and Claude Code's
/// `http/protobuf` send protobuf).
#[derive(Clone, Copy, PartialEq)]
enum Encoding {
    Protobuf,
    Json,
}

impl Encoding {
    fn of(content_type: &str) -> Option<Encoding> {
        let media = content_type.split(';').next().unwrap_or("").trim();
        if media.eq_ignore_ascii_case("application/x-protobuf") {
            Some(Encoding::Protobuf)
        } else if media.eq_ignore_ascii_case("application/json") {
            Some(Encoding::Json)
        } else {
            None
        }
    }

    fn decode(self, body: &[u8]) -> Result<ExportLogsServiceRequest, String> {
        match self {
            Encoding::Protobuf => ExportLogsServiceRequest::decode(body).map_err(|e| e.to_string()),
            Encoding::Json => serde_json::from_slice(body).map_err(|e| e.to_string()),
        }
    }

    /// Full success: an empty ExportLogsServiceResponse (no `partialSuccess`).
    fn accepted(self) -> Response {
        match self {
            Encoding::Protobuf => (
                [(header::CONTENT_TYPE, "application/x-protobuf")],
                ExportLogsServiceResponse::default().encode_to_vec(),
            )
                .into_response(),
            Encoding::Json => ([(header::CONTENT_TYPE, "application/json")], "{}").into_response(),
        }
    }
}

/// OTLP/HTTP logs, binary protobuf (`application/x-protobuf`) or JSON (`application/json`,
/// OTLP's JSON mapping: hex ids, 64-bit integers as strings or numbers).
async fn http_logs(State(zone): State<Arc<Zone>>, headers: HeaderMap, body: Bytes) -> Response {
    let encoding = match admit(&zone, &headers) {
        Ok(e) => e,
        Err(refusal) => return *refusal,
    };
    let request = match encoding.decode(&body) {
        Ok(r) => r,
        Err(e) => {
            zone.evidence.metrics.add("refused_batches", zone.source, 1);
            let code = match encoding {
                Encoding::Protobuf => "malformed_protobuf",
                Encoding::Json => "malformed_json",
            };
            return error(
                StatusCode::BAD_REQUEST,
                code,
                format!("the body is not an OTLP ExportLogsServiceRequest: {e}"),
            );
        }
    };
    match zone.ingest(request).await {
        Ok(_) => encoding.accepted(),
        Err(Refusal::Malformed(m)) => error(StatusCode::BAD_REQUEST, "malformed_record", m),
        Err(Refusal::Store) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "the evidence store failed; retry",
        ),
        Err(Refusal::Unauthenticated | Refusal::TooLarge) => {
            error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "unexpected")
        }
    }
}

/// OTLP/HTTP metrics or traces: not evidence. Authorized and acknowledged like logs,
/// then dropped undecoded (counted), so a harness exporting every signal to the one
/// endpoint it was given logs no exporter errors.
async fn http_discard(State(zone): State<Arc<Zone>>, headers: HeaderMap) -> Response {
    match admit(&zone, &headers) {
        Ok(encoding) => {
            zone.evidence.metrics.add("ignored_batches", zone.source, 1);
            encoding.accepted()
        }
        Err(refusal) => *refusal,
    }
}

/// The checks every OTLP/HTTP request passes first: the zone's token (401), then an
/// encoding OTLP/HTTP defines (415).
fn admit(zone: &Zone, headers: &HeaderMap) -> Result<Encoding, Box<Response>> {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if !zone.authorized(auth) {
        zone.refuse(&Refusal::Unauthenticated);
        return Err(Box::new(error(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "this receiver requires its bearer token",
        )));
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    Encoding::of(content_type).ok_or_else(|| {
        Box::new(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "OTLP/HTTP is accepted as application/x-protobuf or application/json",
        ))
    })
}

async fn too_large(zone: Arc<Zone>, response: Response) -> Response {
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
        zone.refuse(&Refusal::TooLarge);
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "batch_too_large",
            format!(
                "the batch is over {} bytes; send smaller batches",
                zone.evidence.max_batch_bytes
            ),
        );
    }
    response
}

async fn serve(
    listener: tokio::net::TcpListener,
    zone: Arc<Zone>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let limit = zone.evidence.max_batch_bytes;
    let z = Arc::clone(&zone);
    let http = axum::Router::new()
        .route("/v1/logs", post(http_logs))
        .route("/v1/metrics", post(http_discard))
        .route("/v1/traces", post(http_discard))
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::map_response(move |r: Response| {
            let z = Arc::clone(&z);
            async move { too_large(z, r).await }
        }))
        .with_state(Arc::clone(&zone));
    let grpc = LogsServiceServer::new(GrpcZone(Arc::clone(&zone))).max_decoding_message_size(limit);
    let routes = tonic::service::Routes::from(http).add_service(grpc);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let result = tonic::transport::Server::builder()
        .accept_http1(true)
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = stop.wait_for(|v| *v).await;
        })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, source = %zone.source, "evidence receiver failed");
    }
}

/// The samples API's routes.
pub const ROUTES: &[(&str, &str)] = &[("GET", "/api/v1/evidence/samples")];

/// Its answer without a store to read.
pub const DISABLED: Disabled = Disabled {
    status: StatusCode::NOT_FOUND,
    code: "evidence_disabled",
    message: "this halo-server runs no evidence receiver or mirror service (see --otlp-gateway-listen, --shadow-listen)",
};

/// The samples API (`halo evidence query`): the store the receivers write, else the
/// mirror service's (a halo-server that only mirrors still answers for its shadow
/// variants).
pub struct SamplesApi {
    pub store: Arc<dyn Store>,
    pub admin: Arc<AdminAuth>,
}

impl AdminState for SamplesApi {
    fn admin_auth(&self) -> &AdminAuth {
        &self.admin
    }
}

impl SamplesApi {
    /// The samples route, or its refusal without a store.
    pub fn router(api: Option<Arc<SamplesApi>>) -> axum::Router {
        let served = api.map(|api| {
            axum::Router::new()
                .route("/api/v1/evidence/samples", axum::routing::get(samples))
                .with_state(api)
        });
        or_disabled(served, ROUTES, DISABLED)
    }
}

/// `GET /api/v1/evidence/samples?experiment=X&metric=M[&since=24h]` (admin): the
/// per-variant summary of the samples of the last `since` (default 24h).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplesParams {
    pub experiment: String,
    pub metric: String,
    pub since: Option<String>,
}

async fn samples(
    State(api): State<Arc<SamplesApi>>,
    _admin: Admin,
    query: Result<axum::extract::Query<SamplesParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(axum::extract::Query(params)) = query else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "experiment and metric are required; since is a duration like 24h",
        );
    };
    let Ok(metric) = params.metric.parse::<halo_evidence::Metric>() else {
        let names: Vec<&str> = halo_evidence::Metric::ALL
            .iter()
            .map(|m| m.as_str())
            .collect();
        return error(
            StatusCode::BAD_REQUEST,
            "unknown_metric",
            format!("metric must be one of {}", names.join(", ")),
        );
    };
    let since = match params.since.as_deref().map(humantime::parse_duration) {
        None => Duration::from_secs(24 * 3600),
        Some(Ok(d)) => d,
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_since",
                "since must be a duration like 24h or 7d",
            );
        }
    };
    let store = &api.store;
    let until = now_ms();
    let query = halo_evidence::SampleQuery {
        experiment: params.experiment.clone(),
        metric,
        since_unix_ms: until - i64::try_from(since.as_millis()).unwrap_or(i64::MAX),
        until_unix_ms: until + 1,
    };
    let store = Arc::clone(store);
    match tokio::task::spawn_blocking(move || store.samples(&query)).await {
        Ok(Ok(samples)) => {
            let summary = halo_evidence::summarize(&samples);
            axum::Json(json!({
                "experiment": params.experiment,
                "metric": metric.as_str(),
                "since": humantime::format_duration(since).to_string(),
                "samples": samples.len(),
                "variants": summary,
            }))
            .into_response()
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "evidence query failed");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "the evidence store failed",
            )
        }
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the query task failed",
        ),
    }
}
