//! What the controller reads: one value per (variant, unit) and metric, with the source
//! that stamped it, behind [`EvidenceSource`] so the store behind it (embedded,
//! PostgreSQL, later ClickHouse) is the evidence crate's business.

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// Who produced a record: the receiver that accepted it stamps this, never the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The gateway receiver (gateway token): the only evidence that may trip the kill.
    Gateway,
    /// CLI telemetry: anyone who reaches the collector can write it.
    Cli,
    /// Eval scores: a model's opinion.
    Eval,
    /// The mirror service's records of a shadow variant's answers.
    Shadow,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Gateway => "gateway",
            Source::Cli => "cli",
            Source::Eval => "eval",
            Source::Shadow => "shadow",
        }
    }
}

/// One value of a metric for one unit (a salted user or session hash) in one variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    pub variant: String,
    pub unit: String,
    pub value: f64,
    pub source: Source,
}

#[derive(Debug, thiserror::Error)]
#[error("evidence for {experiment}: {message}")]
pub struct EvidenceError {
    pub experiment: String,
    pub message: String,
}

/// The evidence store, as the controller sees it.
pub trait EvidenceSource: Send + Sync {
    /// Every (variant, unit) value of `metric` for `experiment` recorded at or after
    /// `since` (the start of the experiment's current run).
    fn samples<'a>(
        &'a self,
        experiment: &'a str,
        metric: &'a str,
        since: OffsetDateTime,
    ) -> BoxFuture<'a, Result<Vec<Sample>, EvidenceError>>;

    /// What the experiment's calls cost since `since`, in USD (for `maxSpendUSD`).
    fn spend_usd<'a>(
        &'a self,
        experiment: &'a str,
        since: OffsetDateTime,
    ) -> BoxFuture<'a, Result<f64, EvidenceError>>;
}
