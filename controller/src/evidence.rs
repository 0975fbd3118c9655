//! What the controller reads: one value per (variant, unit) and metric, with the source
//! that stamped it, behind [`EvidencePort`] so the store behind it (embedded,
//! PostgreSQL, later ClickHouse) is the evidence crate's business.

use futures_util::future::BoxFuture;
use time::OffsetDateTime;

/// The evidence crate's own: a record's source, stamped by the receiver that accepted it
/// (only `Gateway` may trip the kill), and one value of a metric for one unit in one
/// variant.
pub use halo_evidence::{Sample, Source};

#[derive(Debug, thiserror::Error)]
#[error("evidence for {experiment}: {message}")]
pub struct EvidenceError {
    pub experiment: String,
    pub message: String,
}

/// The evidence store, as the controller sees it.
pub trait EvidencePort: Send + Sync {
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
