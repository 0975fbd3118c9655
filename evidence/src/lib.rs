//! halo-evidence: what happened on each model call, kept and queryable (spec: low-level
//! design, request path 12 and controller loop 4; DESIGN.md "The evidence loop", steps
//! 3 and 4).
//!
//! - [`Record`]: one model call's facts (ring, variant, tokens, cost, latency, outcome) and
//!   the salted unit hash; never a subject, prompt, header or session id.
//! - [`otlp`]: OTLP log records (what Envoy's OpenTelemetry access logger, the harnesses
//!   and evals send) to [`Record`]s, with the [`Source`] the receiver stamps.
//! - [`harness`]: the mapping table of each harness's own per-call events (Claude Code,
//!   Codex, Gemini CLI) that [`otlp`] applies to a harness's records.
//! - [`Store`]: one trait, two backends: [`sqlite::SqliteStore`] (embedded, the default:
//!   a file in halo-server's data dir, nothing else to run) and [`postgres::PgStore`]
//!   (PostgreSQL at scale). Both pass the same test suite (`tests/store.rs`).
//! - [`BudgetStore`]: the budget counts halo-server's rate-limit service adds to and checks,
//!   in the same backends (one table, `budget_counts`).
//! - [`Store::samples`]: the controller's query: for (experiment, metric, window) one
//!   value per (variant, unit, source).
//!
//! Blocking APIs: both database clients block, so async callers (halo-server's
//! receivers) run them on tokio's blocking pool. Writes are batched: one transaction
//! per received batch, all or nothing, so a crash loses only unacknowledged batches.

pub mod harness;
pub mod open;
pub mod otlp;
pub mod postgres;
pub mod sqlite;

use std::fmt;
use std::str::FromStr;

/// Who vouches for a record: stamped by the receiver it arrived at, never read from it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The gateway (Envoy) itself, with the gateway token: the only source that may trip
    /// a kill automatically.
    Gateway,
    /// A harness's own telemetry (forgeable by whoever reaches the receiver).
    Cli,
    /// An evaluation (a model's opinion).
    Eval,
    /// halo-server's mirror service: the shadow variant's target answering a mirrored
    /// copy of a call (its status, latency, tokens, cost). Made by the control plane, but
    /// not the gateway's: it never trips a kill automatically.
    Shadow,
}

impl Source {
    pub const ALL: [Source; 4] = [Source::Gateway, Source::Cli, Source::Eval, Source::Shadow];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Gateway => "gateway",
            Source::Cli => "cli",
            Source::Eval => "eval",
            Source::Shadow => "shadow",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Source {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Source, UnknownName> {
        Source::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnknownName(s.to_string()))
    }
}

/// A name that is not one of an enum's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown name {0:?}")]
pub struct UnknownName(pub String);

/// One model call, as stored.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Record {
    /// When the call started, Unix milliseconds.
    pub time_unix_ms: i64,
    pub ring: String,
    /// The release (signed bundle digest) the caller runs, when known.
    pub release: String,
    /// Experiment and variant; empty when the call was in none.
    pub experiment: String,
    pub variant: String,
    /// The model alias the client asked for, the upstream and model that served it, and
    /// the target (cluster) name.
    pub alias: String,
    pub upstream: String,
    pub model: String,
    pub target: String,
    /// Upstream attempts (1 without failover).
    pub attempts: u32,
    /// HTTP status sent to the client; 0 when none was (reset before headers).
    pub status: u16,
    /// Time to the first response byte and to the end, milliseconds.
    pub ttfb_ms: Option<f64>,
    pub duration_ms: Option<f64>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub cache_write_tokens: Option<u64>,
    pub cache_read_tokens: Option<u64>,
    /// USD; `None` when unknown (no price, or counts missing): never zero for unknown.
    pub cost_usd: Option<f64>,
    /// The answer ended normally and its final usage was read.
    pub complete: bool,
    /// The salted hash of the verified subject (the experiment's unit of assignment).
    pub unit: String,
}

impl Record {
    /// An error for the error-rate metric: no answer, a 5xx, or a 429 (the arm could not
    /// serve the call).
    pub fn is_error(&self) -> bool {
        is_error_status(self.status)
    }
}

/// The error definition both backends' SQL implement too (see [`Metric::ErrorRate`]).
pub fn is_error_status(status: u16) -> bool {
    status == 0 || status == 429 || status >= 500
}

/// A record with the source its receiver stamped.
#[derive(Debug, Clone, PartialEq)]
pub struct Stamped {
    pub source: Source,
    pub record: Record,
}

/// What a sample measures, per (variant, unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// Share of the unit's calls that failed ([`is_error_status`]).
    ErrorRate,
    /// Percentiles of the unit's time to first byte / total duration (continuous,
    /// linearly interpolated, as PostgreSQL's `percentile_cont`).
    TtfbP50,
    TtfbP95,
    DurationP50,
    DurationP95,
    /// Sum of the unit's tokens (every kind).
    Tokens,
    /// Sum of the unit's cost; a unit with any call of unknown cost has no sample.
    Cost,
}

impl Metric {
    pub const ALL: [Metric; 7] = [
        Metric::ErrorRate,
        Metric::TtfbP50,
        Metric::TtfbP95,
        Metric::DurationP50,
        Metric::DurationP95,
        Metric::Tokens,
        Metric::Cost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Metric::ErrorRate => "error_rate",
            Metric::TtfbP50 => "ttfb_p50",
            Metric::TtfbP95 => "ttfb_p95",
            Metric::DurationP50 => "duration_p50",
            Metric::DurationP95 => "duration_p95",
            Metric::Tokens => "tokens",
            Metric::Cost => "cost",
        }
    }

    /// The percentile column and fraction of a latency metric.
    fn percentile(self) -> Option<(&'static str, f64)> {
        match self {
            Metric::TtfbP50 => Some(("ttfb_ms", 0.5)),
            Metric::TtfbP95 => Some(("ttfb_ms", 0.95)),
            Metric::DurationP50 => Some(("duration_ms", 0.5)),
            Metric::DurationP95 => Some(("duration_ms", 0.95)),
            _ => None,
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Metric {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Metric, UnknownName> {
        Metric::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnknownName(s.to_string()))
    }
}

/// One value per (variant, unit) and source: what the controller's tests consume.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    pub variant: String,
    /// The salted unit hash.
    pub unit: String,
    pub value: f64,
    pub source: Source,
}

/// The samples query: records of `experiment` with `since_unix_ms <= time < until_unix_ms`.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleQuery {
    pub experiment: String,
    pub metric: Metric,
    pub since_unix_ms: i64,
    pub until_unix_ms: i64,
}

/// Why the store failed. Messages name the backend and operation, never record content.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("postgres: {0}")]
    Postgres(#[from] ::postgres::Error),
    #[error("the store's schema is version {found}, newer than this build's {known}")]
    SchemaTooNew { found: i64, known: i64 },
    #[error("the store is unusable: {0}")]
    Poisoned(&'static str),
}

/// Where evidence is kept.
pub trait Store: Send + Sync {
    /// Store a batch in one transaction: all of it or none. Returns the number stored.
    fn append(&self, batch: &[Stamped]) -> Result<usize, StoreError>;
    /// The controller's samples, ordered by variant, unit and source.
    fn samples(&self, query: &SampleQuery) -> Result<Vec<Sample>, StoreError>;
    /// Retention: delete records older than `before_unix_ms`; returns how many.
    fn prune(&self, before_unix_ms: i64) -> Result<u64, StoreError>;
    /// How many records are stored (for tests, metrics and benchmarks).
    fn count(&self) -> Result<u64, StoreError>;
}

/// An amount added to one budget's count in one calendar period (halo-server's
/// rate-limit service, issue #25). The subject is the salted key halo-policy's `budgets`
/// gives (or `pool`), never a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spend {
    pub budget: String,
    pub subject: String,
    /// The period's start, Unix milliseconds (the budget's calendar, its time zone).
    pub period_start_ms: i64,
    pub tokens: u64,
    pub micro_usd: u64,
}

/// Which count: a budget, a subject, a period.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CountKey {
    pub budget: String,
    pub subject: String,
    pub period_start_ms: i64,
}

/// A count: what was spent so far in a period (zero when nothing was).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counted {
    pub tokens: u64,
    pub micro_usd: u64,
}

/// The budget counts' table, the same migration in both backends.
pub(crate) const BUDGET_COUNTS_SCHEMA: &str = "
CREATE TABLE budget_counts (
    budget TEXT NOT NULL,
    subject TEXT NOT NULL,
    period_start_ms BIGINT NOT NULL,
    tokens BIGINT NOT NULL DEFAULT 0,
    micro_usd BIGINT NOT NULL DEFAULT 0,
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (budget, subject, period_start_ms)
);
CREATE INDEX budget_counts_period ON budget_counts (period_start_ms);
";

/// A spend added to its count in one statement, atomic per row, so concurrent replicas
/// add and never overwrite. Both backends speak it (SQLite since 3.24; its `$n` are
/// numbered parameters bound in order).
pub(crate) const UPSERT_COUNT: &str = "INSERT INTO budget_counts \
    (budget, subject, period_start_ms, tokens, micro_usd, updated_ms) \
    VALUES ($1, $2, $3, $4, $5, $6) \
    ON CONFLICT (budget, subject, period_start_ms) DO UPDATE SET \
    tokens = budget_counts.tokens + excluded.tokens, \
    micro_usd = budget_counts.micro_usd + excluded.micro_usd, \
    updated_ms = excluded.updated_ms";

/// Budget counts, kept beside the evidence in the same database, so every halo-server
/// replica (on PostgreSQL) and every Envoy behind them adds to one count. Unlike the
/// evidence, which is the per-call ledger, a count is one row per (budget, subject,
/// period), added to in place.
pub trait BudgetStore: Send + Sync {
    /// Add each spend to its count, all in one transaction.
    fn add_spend(&self, spends: &[Spend], now_unix_ms: i64) -> Result<(), StoreError>;
    /// The counts of `keys`, in their order.
    fn counted(&self, keys: &[CountKey]) -> Result<Vec<Counted>, StoreError>;
    /// Delete the counts of periods that started before `before_unix_ms`; how many.
    fn prune_counts(&self, before_unix_ms: i64) -> Result<u64, StoreError>;
}

/// Both traits of a backend: the evidence and the budget counts, in one database.
pub trait Backend: Store + BudgetStore {}
impl<T: Store + BudgetStore> Backend for T {}

/// The continuous percentile `q` (0..=1) of sorted `values`, linearly interpolated
/// between closest ranks (PostgreSQL's `percentile_cont`). `None` when empty.
pub fn percentile_cont(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    let frac = pos - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// The per-variant summary `halo evidence query` prints: n, mean and a 95% interval of
/// the mean (normal approximation, sample standard deviation), one per variant and source.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    pub variant: String,
    /// Who vouched for these samples ([`Source::as_str`]): a shadow variant's answers to
    /// mirrored copies (`shadow`) are not the live calls of a variant (`gateway`), so the
    /// two are never averaged together.
    pub source: String,
    pub n: u64,
    pub mean: f64,
    pub low: f64,
    pub high: f64,
}

/// Summaries of `samples` per variant and source (sorted by variant, then source).
pub fn summarize(samples: &[Sample]) -> Vec<Summary> {
    let mut by_variant: std::collections::BTreeMap<(&str, Source), Vec<f64>> = Default::default();
    for s in samples {
        by_variant
            .entry((&s.variant, s.source))
            .or_default()
            .push(s.value);
    }
    by_variant
        .into_iter()
        .map(|((variant, source), values)| {
            let n = values.len() as f64;
            let mean = values.iter().sum::<f64>() / n;
            let var = if values.len() > 1 {
                values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)
            } else {
                0.0
            };
            let half = 1.96 * (var / n).sqrt();
            Summary {
                variant: variant.to_string(),
                source: source.as_str().to_string(),
                n: values.len() as u64,
                mean,
                low: mean - half,
                high: mean + half,
            }
        })
        .collect()
}

/// The SQL (shared by both backends) of a non-percentile metric: the per-group value and
/// the HAVING clause.
/// `None` for the percentile metrics.
pub(crate) fn aggregate(metric: Metric) -> Option<(&'static str, &'static str)> {
    Some(match metric {
        // The SQL form of crate::is_error_status.
        Metric::ErrorRate => (
            "CAST(AVG(CASE WHEN status = 0 OR status = 429 OR status >= 500 THEN 1.0 ELSE 0.0 END) \
             AS DOUBLE PRECISION)",
            "",
        ),
        Metric::Tokens => (
            // Summed as floats: an integer sum can overflow (both engines then fail).
            "SUM(CAST(COALESCE(input_tokens, 0) AS DOUBLE PRECISION) \
             + CAST(COALESCE(output_tokens, 0) AS DOUBLE PRECISION) \
             + CAST(COALESCE(cache_write_tokens, 0) AS DOUBLE PRECISION) \
             + CAST(COALESCE(cache_read_tokens, 0) AS DOUBLE PRECISION))",
            "",
        ),
        // A unit with any call of unknown cost has no cost sample (unknown is not zero).
        Metric::Cost => (
            "CAST(SUM(cost_usd) AS DOUBLE PRECISION)",
            "HAVING COUNT(cost_usd) = COUNT(*)",
        ),
        Metric::TtfbP50 | Metric::TtfbP95 | Metric::DurationP50 | Metric::DurationP95 => {
            return None;
        }
    })
}

/// Both backends return samples in one order: variant, unit, source (bytewise, not by a
/// database collation).
pub(crate) fn sort_samples(samples: &mut [Sample]) {
    samples.sort_by(|a, b| (&a.variant, &a.unit, a.source).cmp(&(&b.variant, &b.unit, b.source)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_matches_postgres_percentile_cont() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile_cont(&v, 0.5), Some(2.5));
        let p95 = percentile_cont(&v, 0.95).expect("some");
        assert!((p95 - 3.85).abs() < 1e-12, "{p95}");
        assert_eq!(percentile_cont(&[7.0], 0.95), Some(7.0));
        assert_eq!(percentile_cont(&[], 0.5), None);
    }

    #[test]
    fn names_round_trip() {
        for m in Metric::ALL {
            assert_eq!(m.as_str().parse::<Metric>(), Ok(m));
        }
        for s in Source::ALL {
            assert_eq!(s.as_str().parse::<Source>(), Ok(s));
        }
        assert!("p99".parse::<Metric>().is_err());
    }

    #[test]
    fn summary_interval() {
        let s = |variant: &str, value, source| Sample {
            variant: variant.into(),
            unit: "u".into(),
            value,
            source,
        };
        let got = summarize(&[
            s("a", 1.0, Source::Gateway),
            s("a", 3.0, Source::Gateway),
            s("b", 5.0, Source::Gateway),
            s("b", 7.0, Source::Shadow),
        ]);
        assert_eq!(got[0].n, 2);
        assert_eq!(got[0].mean, 2.0);
        let half = 1.96 * (2.0f64 / 2.0).sqrt();
        assert!((got[0].high - (2.0 + half)).abs() < 1e-12);
        assert_eq!((got[1].low, got[1].high), (5.0, 5.0));
        // A variant's shadow samples are their own row, never averaged with its live ones.
        assert_eq!(got.len(), 3);
        assert_eq!(
            (got[2].variant.as_str(), got[2].source.as_str()),
            ("b", "shadow")
        );
        assert_eq!(got[2].mean, 7.0);
    }
}
