//! The budget service (issue #25; docs/design/budgets.md): Envoy's rate-limit service
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, gRPC) on
//! `--budget-listen`, which every gateway's ratelimit filter asks (halo-envoy-config's
//! `budget` module writes that filter).
//!
//! Counts live in the evidence store's database ([`BudgetStore`]: the embedded SQLite of
//! `--data-dir`, or the PostgreSQL of `--evidence-postgres-file`, which several replicas
//! share), one row per (budget, subject, calendar period). The period comes from the
//! budget's time zone and [`Clock`], which tests move forward.
//!
//! Per call, two requests arrive. At request time the `check` descriptor names the
//! applying budgets (the filter's answer of `halo_policy::budgets::applying`) and the
//! client's wire: if any is spent, the answer is OVER_LIMIT with the whole 429 (the body
//! in the wire's error shape, naming the budget, its period and reset; `retry-after`).
//! When the stream is done, the `spend-*` descriptors carry the call's tokens and
//! micro-USD as `hits_addend`, which are added in one transaction; Envoy ignores that
//! answer.
//!
//! A budget whose `atLimit` is `routeTo` moves its spent callers instead of refusing
//! them: the service keeps the exhausted list (the spent (budget, subject) pairs of such
//! budgets, each until its period ends), which goes into every xDS gateway's filter
//! configuration at once ([`halo_xds::Pushed`]); the filter then sends the aliases the
//! budget names to the cheaper ones before routing. A call that reaches the check on a
//! spent `routeTo` budget still names the expensive alias only when its gateway has not
//! got the list (the moment between the crossing and the push, a restart of this service,
//! a standalone gateway, which has no push): it is refused as under `refuse`, and the pair
//! is listed, so the budget never overspends by more than a `refuse` budget would.
//!
//! When the store fails, the policy's `budgetService.onServiceDown` decides: `open`
//! (default) answers OK, `closed` answers OVER_LIMIT with a 429 saying so; either way it is
//! counted (`halo_server_budget_checks_total{outcome="fail_open"|"fail_closed"}`) and
//! logged once per outage. When the service itself is unreachable, Envoy applies the same
//! setting (`failure_mode_deny`) and counts `ratelimit.halo_budget.failure_mode_allowed`.
//!
//! Nothing here logs a user, a subject key or a header value.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use anyhow::Context as _;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use halo_contract::budget as names;
use halo_evidence::{BudgetStore, CountKey, Spend};
use halo_policy::budgets::{self, BudgetKey, Exhausted, Period, Spent};
use halo_policy::types::{AtLimit, OnServiceDown, WireProtocol};
use halo_xds::{Pushed, Served};
use tokio::sync::watch;

use crate::auth::Admin;
use crate::http::admin::AdminState;
use crate::http::{AdminAuth, ApiError, Disabled, or_disabled};
use crate::token::{TokenDigest, read_token_file};
use halo_metrics::{CounterMap, Kind, Text};

/// The budget service's settings (`--budget-listen`, `--budget-token-file`).
#[derive(Debug, Clone, Default)]
pub struct BudgetSettings {
    pub listen: Option<SocketAddr>,
    pub token_file: Option<PathBuf>,
}

/// The service's clock: the system's, plus an offset only a test sets (through the
/// library: there is no flag), so "the next period" can be reached without waiting.
#[derive(Debug, Default)]
pub struct Clock {
    offset_ms: AtomicI64,
}

impl Clock {
    /// Unix milliseconds now.
    pub fn now_ms(&self) -> i64 {
        let system = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        system.saturating_add(self.offset_ms.load(Ordering::Relaxed))
    }

    /// Move the clock `ms` forward.
    pub fn advance(&self, ms: i64) {
        self.offset_ms.fetch_add(ms, Ordering::Relaxed);
    }
}

/// What the service counted, for /metrics.
#[derive(Debug, Default)]
pub struct BudgetMetrics {
    checks: CounterMap<&'static str>,
    spent_tokens: AtomicU64,
    spent_micro_usd: AtomicU64,
    store_errors: AtomicU64,
}

impl BudgetMetrics {
    fn check(&self, outcome: &'static str) {
        self.checks.inc(outcome);
    }

    /// Checks answered with `outcome` (ok, over, fail_open, fail_closed).
    pub fn checks(&self, outcome: &'static str) -> u64 {
        self.checks.get(&outcome)
    }

    /// Tokens added to budget counts since start.
    pub fn spent_tokens(&self) -> u64 {
        self.spent_tokens.load(Ordering::Relaxed)
    }

    /// Its families as Prometheus text (what `/metrics` shows of it).
    pub fn render(&self) -> String {
        let mut text = Text::new();
        self.write_prometheus(&mut text);
        text.finish()
    }

    pub fn write_prometheus(&self, out: &mut Text) {
        out.counters(
            "halo_server_budget_checks_total",
            "Budget checks by outcome (ok, over, fail_open, fail_closed).",
            &["outcome"],
            &self.checks,
        );
        out.family(
            "halo_server_budget_spend_total",
            Kind::Counter,
            "Amounts added to budget counts.",
        )
        .sample(
            "halo_server_budget_spend_total",
            &[("unit", "tokens")],
            self.spent_tokens.load(Ordering::Relaxed),
        )
        .sample(
            "halo_server_budget_spend_total",
            &[("unit", "micro_usd")],
            self.spent_micro_usd.load(Ordering::Relaxed),
        );
        out.single(
            "halo_server_budget_store_errors_total",
            Kind::Counter,
            "Budget store reads or writes that failed.",
            self.store_errors.load(Ordering::Relaxed),
        );
    }
}

/// The service's state, shared by its requests.
pub struct Budgets {
    policy: watch::Receiver<Arc<Served>>,
    store: Arc<dyn BudgetStore>,
    token: TokenDigest,
    pub clock: Clock,
    pub metrics: BudgetMetrics,
    /// The store is failing: logged once per outage.
    failing: AtomicBool,
    /// The exhausted list: spent counts of `routeTo` budgets, until their period ends.
    exhausted: std::sync::Mutex<BTreeMap<BudgetKey, i64>>,
    /// Where the list goes: the xDS host's push (none without `--xds-listen`).
    push: Option<watch::Sender<Pushed>>,
}

impl std::fmt::Debug for Budgets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budgets").finish_non_exhaustive()
    }
}

/// The running service: its address and state.
#[derive(Debug)]
pub struct BudgetServer {
    pub addr: SocketAddr,
    pub budgets: Arc<Budgets>,
    shutdown: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl BudgetServer {
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}

/// How often entries whose period has ended leave the exhausted list.
const EXPIRE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// How often counts older than the retention are deleted.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);
/// Counts are kept at least this long whatever the retention: a month's count must
/// outlive its month.
const MIN_COUNT_RETENTION: std::time::Duration = std::time::Duration::from_secs(32 * 24 * 3600);

/// Open the counts' store and serve on `--budget-listen`; `None` when it is not set. The
/// exhausted list goes to `push` (the xDS host's), when there is one. Counts of periods
/// that started more than `retention` ago (the evidence retention, at least 32 days) are
/// deleted every hour.
pub async fn start(
    settings: &BudgetSettings,
    postgres_file: Option<&std::path::Path>,
    data_dir: Option<&std::path::Path>,
    policy: watch::Receiver<Arc<Served>>,
    push: Option<watch::Sender<Pushed>>,
    retention: std::time::Duration,
) -> anyhow::Result<Option<BudgetServer>> {
    let Some(listen) = settings.listen else {
        return Ok(None);
    };
    let token_file = settings.token_file.as_deref().context(
        "--budget-listen requires --budget-token-file (only gateways may add to budgets)",
    )?;
    let token = read_token_file("budget token", token_file)?;
    let (p, d) = (
        postgres_file.map(std::path::Path::to_path_buf),
        data_dir.map(std::path::Path::to_path_buf),
    );
    // The PostgreSQL client blocks (it runs its own runtime): opened off the async threads.
    let store = tokio::task::spawn_blocking(move || {
        halo_evidence::open::open_backend(p.as_deref(), d.as_deref())
    })
    .await
    .context("opening the budget store")??;
    let budgets = Arc::new(Budgets {
        policy,
        store: store as Arc<dyn BudgetStore>,
        token,
        clock: Clock::default(),
        metrics: BudgetMetrics::default(),
        failing: AtomicBool::new(false),
        exhausted: std::sync::Mutex::new(BTreeMap::new()),
        push,
    });
    // The list loses an entry when its period ends (the service's clock): the caller is
    // back on the normal route. The task ends with the service.
    let weak = Arc::downgrade(&budgets);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EXPIRE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(b) = weak.upgrade() else { return };
            b.expire();
        }
    });
    let weak = Arc::downgrade(&budgets);
    let keep = i64::try_from(retention.max(MIN_COUNT_RETENTION).as_millis()).unwrap_or(i64::MAX);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PRUNE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(b) = weak.upgrade() else { return };
            let before = b.clock.now_ms().saturating_sub(keep);
            let store = Arc::clone(&b.store);
            drop(b);
            match tokio::task::spawn_blocking(move || store.prune_counts(before)).await {
                Ok(Ok(n)) if n > 0 => {
                    tracing::info!(pruned = n, "budget counts past the retention deleted")
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "budget count retention failed"),
                _ => {}
            }
        }
    });
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding --budget-listen {listen}"))?;
    let addr = listener.local_addr()?;
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let service = RateLimitServiceServer::new(Service(Arc::clone(&budgets)));
    let task = tokio::spawn(async move {
        let stop = async move {
            let _ = rx.wait_for(|v| *v).await;
        };
        if let Err(e) = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                stop,
            )
            .await
        {
            tracing::error!(error = %e, "budget service failed");
        }
    });
    tracing::info!(%addr, "budget service listening");
    Ok(Some(BudgetServer {
        addr,
        budgets,
        shutdown: tx,
        task,
    }))
}

/// A descriptor's entries by key.
fn entries(d: &RateLimitDescriptor) -> BTreeMap<&str, &str> {
    d.entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect()
}

/// The client's wire as the filter wrote it (Anthropic's shape when unknown).
fn wire(name: Option<&str>) -> WireProtocol {
    name.and_then(|n| serde_json::from_value(serde_json::Value::String(n.to_string())).ok())
        .unwrap_or(WireProtocol::AnthropicMessages)
}

/// A budget key resolved against the policy in force: its budget and current period.
struct Resolved<'a> {
    key: BudgetKey,
    budget: &'a halo_policy::types::Budget,
    period: Period,
}

impl Budgets {
    fn resolve<'a>(
        &self,
        snap: &'a halo_policy::Snapshot,
        keys: Vec<BudgetKey>,
        now: i64,
    ) -> Vec<Resolved<'a>> {
        keys.into_iter()
            .filter_map(|key| {
                // A budget the policy no longer has (changed mid-call) is not counted.
                let budget = snap.budgets.get(&key.budget)?;
                let period = budgets::period(budget, now).ok()?;
                Some(Resolved {
                    key,
                    budget,
                    period,
                })
            })
            .collect()
    }

    fn count_key(r: &Resolved<'_>) -> CountKey {
        CountKey {
            budget: r.key.budget.clone(),
            subject: r.key.subject.clone(),
            period_start_ms: r.period.start_ms,
        }
    }

    /// The store answered: an outage, if there was one, is over.
    fn store_ok(&self) {
        if self.failing.swap(false, Ordering::Relaxed) {
            tracing::info!("budget store reachable again");
        }
    }

    fn store_failed(&self, e: &dyn std::fmt::Display, on_down: OnServiceDown) {
        self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
        if !self.failing.swap(true, Ordering::Relaxed) {
            tracing::error!(error = %e, on_service_down = ?on_down, "budget store failing: budget checks fail {}", match on_down { OnServiceDown::Open => "open (calls pass uncounted)", OnServiceDown::Closed => "closed (calls are refused)" });
        }
    }

    /// Add the spent `routeTo` budgets among `spent` to the exhausted list (until their
    /// period ends), and push the list when it changed.
    fn list_exhausted<'a, 'b: 'a>(&self, spent: impl Iterator<Item = &'a Resolved<'b>>) {
        let mut list = self.exhausted.lock().unwrap_or_else(|p| p.into_inner());
        let mut changed = false;
        for r in spent.filter(|r| matches!(r.budget.at_limit, AtLimit::RouteTo(_))) {
            if list.insert(r.key.clone(), r.period.end_ms) != Some(r.period.end_ms) {
                changed = true;
            }
        }
        if changed {
            self.publish(&list);
        }
    }

    /// Drop the entries whose period has ended (the service's clock), and push the list
    /// when it changed.
    fn expire(&self) {
        let now = self.clock.now_ms();
        let mut list = self.exhausted.lock().unwrap_or_else(|p| p.into_inner());
        let before = list.len();
        list.retain(|_, until| *until > now);
        if list.len() != before {
            self.publish(&list);
        }
    }

    fn publish(&self, list: &BTreeMap<BudgetKey, i64>) {
        let entries = exhausted_entries(list);
        tracing::info!(
            exhausted = entries.len(),
            "exhausted routeTo budgets changed"
        );
        if let Some(push) = &self.push {
            push.send_modify(|p| p.budgets_exhausted = entries);
        }
    }

    /// The exhausted list now (what the gateways are pushed).
    pub fn exhausted(&self) -> Vec<Exhausted> {
        exhausted_entries(&self.exhausted.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The request-time check of one descriptor.
    async fn check(&self, d: &RateLimitDescriptor) -> RateLimitResponse {
        let e = entries(d);
        let served = Arc::clone(&self.policy.borrow());
        let snap = &served.compiled;
        let on_down = snap.budget_service.unwrap_or_default().on_service_down;
        let wire = wire(e.get(names::WIRE).copied());
        let alias = e.get(names::ALIAS).copied().unwrap_or_default();
        let keys = budgets::decode_keys(e.get(names::BUDGETS).copied().unwrap_or_default())
            .unwrap_or_default();
        let now = self.clock.now_ms();
        let resolved = self.resolve(snap, keys, now);
        let store = Arc::clone(&self.store);
        let count_keys: Vec<CountKey> = resolved.iter().map(Self::count_key).collect();
        let counted = tokio::task::spawn_blocking(move || store.counted(&count_keys)).await;
        let counted = match counted {
            Ok(Ok(c)) => {
                self.store_ok();
                c
            }
            Ok(Err(err)) => {
                self.store_failed(&err, on_down);
                return self.unavailable(on_down, wire);
            }
            Err(err) => {
                self.store_failed(&err, on_down);
                return self.unavailable(on_down, wire);
            }
        };
        // Every applying budget is checked; of those spent, the message names the one that
        // resets first (the earliest a retry can succeed... for that budget). A spent
        // `routeTo` budget lets through the calls already on its cheaper aliases.
        let spent: Vec<&Resolved<'_>> = resolved
            .iter()
            .zip(counted)
            .filter(|(r, c)| {
                budgets::is_spent(
                    &r.budget.limit,
                    Spent {
                        tokens: c.tokens,
                        micro_usd: c.micro_usd,
                    },
                )
            })
            .map(|(r, _)| r)
            .collect();
        // A gateway still asking with the expensive alias has not got the list yet.
        self.list_exhausted(spent.iter().copied());
        let spent = spent
            .into_iter()
            .filter(|r| !budgets::serves_at_limit(r.budget, alias))
            .min_by_key(|r| r.period.end_ms);
        match spent {
            None => {
                self.metrics.check("ok");
                ok()
            }
            Some(r) => {
                self.metrics.check("over");
                let message = budgets::spent_message(&r.key.budget, r.budget, &r.period);
                let seconds = ((r.period.end_ms - now).max(0) + 999) / 1000;
                over_limit(wire, &message, seconds, Some(&r.key.budget))
            }
        }
    }

    fn unavailable(&self, on_down: OnServiceDown, wire: WireProtocol) -> RateLimitResponse {
        match on_down {
            OnServiceDown::Open => {
                self.metrics.check("fail_open");
                ok()
            }
            OnServiceDown::Closed => {
                self.metrics.check("fail_closed");
                over_limit(
                    wire,
                    "halo budgets cannot be checked now (the budget store is failing) and this gateway refuses unchecked calls; retry shortly",
                    30,
                    None,
                )
            }
        }
    }

    /// The stream-done additions: every `spend-*` descriptor, in one transaction.
    async fn spend(&self, descriptors: &[RateLimitDescriptor]) {
        let served = Arc::clone(&self.policy.borrow());
        let snap = &served.compiled;
        let now = self.clock.now_ms();
        let mut spends: BTreeMap<CountKey, Spend> = BTreeMap::new();
        for d in descriptors {
            let e = entries(d);
            let amount = d.hits_addend.map_or(0, |h| h.value);
            let tokens = match e.get(names::PHASE).copied() {
                Some(names::PHASE_SPEND_TOKENS) => true,
                Some(names::PHASE_SPEND_MICRO_USD) => false,
                _ => continue,
            };
            // Refunds are not sent (no holds yet): a negative amount is ignored.
            if amount == 0 || d.is_negative_hits {
                continue;
            }
            let keys = budgets::decode_keys(e.get(names::BUDGETS).copied().unwrap_or_default())
                .unwrap_or_default();
            for r in self.resolve(snap, keys, now) {
                let key = Self::count_key(&r);
                let s = spends.entry(key.clone()).or_insert_with(|| Spend {
                    budget: key.budget,
                    subject: key.subject,
                    period_start_ms: key.period_start_ms,
                    tokens: 0,
                    micro_usd: 0,
                });
                if tokens {
                    s.tokens += amount;
                } else {
                    s.micro_usd += amount;
                }
            }
        }
        if spends.is_empty() {
            return;
        }
        let spends: Vec<Spend> = spends.into_values().collect();
        let (t, m) = spends
            .iter()
            .fold((0, 0), |(t, m), s| (t + s.tokens, m + s.micro_usd));
        // The counts of `routeTo` budgets are read back after the addition: one that is
        // now spent joins the exhausted list at once (the next call is moved).
        let routed: Vec<CountKey> = spends
            .iter()
            .filter(|s| {
                snap.budgets
                    .get(&s.budget)
                    .is_some_and(|b| matches!(b.at_limit, AtLimit::RouteTo(_)))
            })
            .map(|s| CountKey {
                budget: s.budget.clone(),
                subject: s.subject.clone(),
                period_start_ms: s.period_start_ms,
            })
            .collect();
        let store = Arc::clone(&self.store);
        let on_down = snap.budget_service.unwrap_or_default().on_service_down;
        let added = tokio::task::spawn_blocking(move || {
            store.add_spend(&spends, now)?;
            if routed.is_empty() {
                return Ok(Vec::new());
            }
            store
                .counted(&routed)
                .map(|c| routed.into_iter().zip(c).collect())
        })
        .await;
        match added {
            Ok(Ok(routed)) => {
                self.store_ok();
                self.metrics.spent_tokens.fetch_add(t, Ordering::Relaxed);
                self.metrics.spent_micro_usd.fetch_add(m, Ordering::Relaxed);
                let spent: Vec<BudgetKey> = routed
                    .into_iter()
                    .filter(|(k, c)| {
                        snap.budgets.get(&k.budget).is_some_and(|b| {
                            budgets::is_spent(
                                &b.limit,
                                Spent {
                                    tokens: c.tokens,
                                    micro_usd: c.micro_usd,
                                },
                            )
                        })
                    })
                    .map(|(k, _)| BudgetKey {
                        budget: k.budget,
                        subject: k.subject,
                    })
                    .collect();
                if !spent.is_empty() {
                    let resolved = self.resolve(snap, spent, now);
                    self.list_exhausted(resolved.iter());
                }
            }
            Ok(Err(err)) => self.store_failed(&err, on_down),
            Err(err) => self.store_failed(&err, on_down),
        }
    }
}

fn exhausted_entries(list: &BTreeMap<BudgetKey, i64>) -> Vec<Exhausted> {
    list.iter()
        .map(|(k, until)| Exhausted {
            budget: k.budget.clone(),
            subject: k.subject.clone(),
            until_ms: *until,
        })
        .collect()
}

fn ok() -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        ..RateLimitResponse::default()
    }
}

fn header(key: &str, value: &str) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value: value.to_string(),
        ..HeaderValue::default()
    }
}

/// OVER_LIMIT with the whole 429: the wire's body, `retry-after`, and the budget's name.
fn over_limit(
    wire: WireProtocol,
    message: &str,
    retry_after_s: i64,
    budget: Option<&str>,
) -> RateLimitResponse {
    let (body, extra) = budgets::spent_reply(wire, message, retry_after_s);
    let mut headers = vec![
        header("content-type", "application/json"),
        header("retry-after", &retry_after_s.to_string()),
    ];
    headers.extend(extra.into_iter().map(|(k, v)| header(k, v)));
    headers.extend(budget.map(|b| header("x-halo-budget", b)));
    RateLimitResponse {
        overall_code: Code::OverLimit as i32,
        statuses: vec![DescriptorStatus {
            code: Code::OverLimit as i32,
            duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: retry_after_s,
                nanos: 0,
            }),
            ..DescriptorStatus::default()
        }],
        response_headers_to_add: headers,
        raw_body: body,
        ..RateLimitResponse::default()
    }
}

struct Service(Arc<Budgets>);

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let authorized = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| self.0.token.matches(t.trim()));
        if !authorized {
            return Err(tonic::Status::unauthenticated(
                "the budget service requires the gateway's budget token",
            ));
        }
        let request = request.into_inner();
        if request.domain != names::DOMAIN {
            return Err(tonic::Status::invalid_argument(format!(
                "unknown rate-limit domain {:?} (this service answers {:?})",
                request.domain,
                names::DOMAIN
            )));
        }
        let check = request
            .descriptors
            .iter()
            .find(|d| entries(d).get(names::PHASE) == Some(&names::PHASE_CHECK));
        let response = match check {
            Some(d) => self.0.check(d).await,
            None => {
                self.0.spend(&request.descriptors).await;
                ok()
            }
        };
        Ok(tonic::Response::new(response))
    }
}

/// `GET /api/v1/budgets/status` parameters: the user, and their groups comma-separated
/// (the verifier's claims; the API cannot see a token of theirs).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusParams {
    pub user: String,
    #[serde(default)]
    pub groups: Option<String>,
}

/// One budget that applies to the user, with this period's count.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetStatus {
    pub name: String,
    /// `USD 50 per day, Europe/Berlin`.
    pub describe: String,
    pub limit: halo_policy::types::BudgetLimit,
    pub pooled: bool,
    pub period_start_ms: i64,
    pub resets_at: String,
    pub spent_tokens: u64,
    pub spent_usd: f64,
    /// Calls under it are refused now.
    pub spent: bool,
}

/// The budget service's API route.
pub const ROUTES: &[(&str, &str)] = &[("GET", "/api/v1/budgets/status")];

/// Its answer without `--budget-listen`.
pub const DISABLED: Disabled = Disabled {
    status: axum::http::StatusCode::NOT_FOUND,
    code: "budgets_disabled",
    message: "this halo-server runs no budget service (see --budget-listen)",
};

/// The budgets' status as the API serves it.
pub struct BudgetsApi {
    pub budgets: Arc<Budgets>,
    pub admin: Arc<AdminAuth>,
}

impl AdminState for BudgetsApi {
    fn admin_auth(&self) -> &AdminAuth {
        &self.admin
    }
}

impl BudgetsApi {
    /// The status route, or its refusal without the service.
    pub fn router(api: Option<Arc<BudgetsApi>>) -> axum::Router {
        let served = api.map(|api| {
            axum::Router::new()
                .route("/api/v1/budgets/status", axum::routing::get(status))
                .with_state(api)
        });
        or_disabled(served, ROUTES, DISABLED)
    }
}

/// The budgets that apply to a user (the filter's answer) and their counts now: what
/// `halo budget status --user U` prints. Admin only: it names the user.
async fn status(
    axum::extract::State(api): axum::extract::State<Arc<BudgetsApi>>,
    _admin: Admin,
    query: Result<axum::extract::Query<StatusParams>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    use axum::http::StatusCode;
    let Ok(axum::extract::Query(params)) = query else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "user is required; groups is a comma-separated list",
        ));
    };
    let budgets = &api.budgets;
    let subject = halo_policy::decide::Subject {
        user: params.user.clone(),
        groups: params
            .groups
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .filter(|g| !g.is_empty())
            .map(str::to_string)
            .collect(),
    };
    let served = Arc::clone(&budgets.policy.borrow());
    let snap = &served.compiled;
    let ring = halo_policy::decide::resolve_ring(snap, &subject)
        .map_or(halo_policy::decide::UNKNOWN_RING, |r| r.name.as_str());
    let now = budgets.clock.now_ms();
    let keys = budgets::applying(snap, &subject, ring)
        .into_iter()
        .map(|a| a.key)
        .collect();
    let resolved = budgets.resolve(snap, keys, now);
    let count_keys: Vec<CountKey> = resolved.iter().map(Budgets::count_key).collect();
    let store = Arc::clone(&budgets.store);
    let counted = tokio::task::spawn_blocking(move || store.counted(&count_keys))
        .await
        .ok()
        .and_then(Result::ok)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "budget_store_failed",
                "the budget store cannot be read now",
            )
        })?;
    let list: Vec<BudgetStatus> = resolved
        .iter()
        .zip(counted)
        .map(|(r, c)| BudgetStatus {
            name: r.key.budget.clone(),
            describe: budgets::describe(r.budget),
            limit: r.budget.limit,
            pooled: r.key.subject == budgets::POOL,
            period_start_ms: r.period.start_ms,
            resets_at: r.period.resets_at.clone(),
            spent_tokens: c.tokens,
            spent_usd: c.micro_usd as f64 / 1e6,
            spent: budgets::is_spent(
                &r.budget.limit,
                Spent {
                    tokens: c.tokens,
                    micro_usd: c.micro_usd,
                },
            ),
        })
        .collect();
    Ok(axum::Json(serde_json::json!({
        "user": params.user,
        "ring": ring,
        "budgets": list,
    })))
}
