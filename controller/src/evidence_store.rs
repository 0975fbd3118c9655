//! The evidence port ([`EvidencePort`]) over halo-evidence's [`Store`]: the samples
//! query for (experiment, metric, since now), one value per (variant, unit, source).
//!
//! Policy metric names ([`metric`]): `halo.api.error_rate` is the store's error rate and
//! `halo.latency.p50`/`p95` its total-duration percentiles (the spec: the gateway's
//! `halo.gateway.requests` and `latency_ms` "feed halo.api.error_rate and halo.latency.*");
//! the store's own names (`error_rate`, `ttfb_p95`, `tokens`, `cost`...) are accepted as
//! they are. Session, client and eval metrics are not in the store yet: an experiment
//! that names one fails its evaluation with a message naming the metric.
//! The store's clients block (SQLite, rust-postgres), so each query runs on tokio's
//! blocking pool.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use halo_evidence::{Metric, SampleQuery, Store};
use time::OffsetDateTime;

use crate::evidence::{EvidenceError, EvidencePort, Sample, Source};

/// The controller's evidence, read from the store the receivers write.
pub struct StoreEvidence(pub Arc<dyn Store>);

fn unix_ms(t: OffsetDateTime) -> i64 {
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

/// The store's metric for a policy metric name.
pub fn metric(name: &str) -> Option<Metric> {
    match name {
        "halo.api.error_rate" => Some(Metric::ErrorRate),
        "halo.latency.p50" => Some(Metric::DurationP50),
        "halo.latency.p95" => Some(Metric::DurationP95),
        other => other.parse().ok(),
    }
}

impl StoreEvidence {
    async fn query(
        &self,
        experiment: &str,
        metric: Metric,
        since: OffsetDateTime,
    ) -> Result<Vec<Sample>, EvidenceError> {
        let error = |message: String| EvidenceError {
            experiment: experiment.to_string(),
            message,
        };
        let query = SampleQuery {
            experiment: experiment.to_string(),
            metric,
            since_unix_ms: unix_ms(since),
            until_unix_ms: i64::MAX,
        };
        let store = Arc::clone(&self.0);
        let samples = tokio::task::spawn_blocking(move || store.samples(&query))
            .await
            .map_err(|e| error(format!("the query task failed: {e}")))?
            .map_err(|e| error(format!("{metric}: {e}")))?;
        Ok(samples)
    }
}

impl EvidencePort for StoreEvidence {
    fn samples<'a>(
        &'a self,
        experiment: &'a str,
        metric: &'a str,
        since: OffsetDateTime,
    ) -> BoxFuture<'a, Result<Vec<Sample>, EvidenceError>> {
        Box::pin(async move {
            let metric = self::metric(metric).ok_or_else(|| EvidenceError {
                experiment: experiment.to_string(),
                message: format!(
                    "metric {metric:?} is not one the evidence store computes (halo.api.error_rate, halo.latency.p50, halo.latency.p95, {})",
                    Metric::ALL.map(Metric::as_str).join(", ")
                ),
            })?;
            self.query(experiment, metric, since).await
        })
    }

    /// The cost samples summed per source, the largest sum: each source sees the same
    /// calls from its own side, so adding sources would count a call twice. A unit with a
    /// call of unknown cost has no cost sample (unknown is never zero).
    fn spend_usd<'a>(
        &'a self,
        experiment: &'a str,
        since: OffsetDateTime,
    ) -> BoxFuture<'a, Result<f64, EvidenceError>> {
        Box::pin(async move {
            let samples = self.query(experiment, Metric::Cost, since).await?;
            let mut per_source = std::collections::BTreeMap::<Source, f64>::new();
            for s in samples.iter().filter(|s| s.value.is_finite()) {
                *per_source.entry(s.source).or_default() += s.value;
            }
            Ok(per_source.into_values().fold(0.0, f64::max))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use halo_evidence::{Record, Stamped};

    fn stamped(source: halo_evidence::Source, variant: &str, unit: u32, cost: f64) -> Stamped {
        Stamped {
            source,
            record: Record {
                time_unix_ms: 1_760_000_000_000,
                experiment: "exp".into(),
                variant: variant.into(),
                status: if unit.is_multiple_of(2) { 200 } else { 503 },
                attempts: 1,
                cost_usd: Some(cost),
                complete: true,
                unit: format!("{unit:016x}"),
                ..Record::default()
            },
        }
    }

    #[tokio::test]
    async fn samples_and_spend_from_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = halo_evidence::sqlite::SqliteStore::open(&dir.path().join("e.db")).unwrap();
        use halo_evidence::Source as S;
        store
            .append(&[
                stamped(S::Gateway, "control", 2, 0.5),
                stamped(S::Gateway, "treatment", 3, 1.0),
                stamped(S::Cli, "treatment", 3, 1.0),
                stamped(S::Cli, "treatment", 5, 9.0),
            ])
            .unwrap();
        let evidence = StoreEvidence(Arc::new(store));
        let since = OffsetDateTime::from_unix_timestamp(1_759_000_000).unwrap();
        let samples = evidence
            .samples("exp", "halo.api.error_rate", since)
            .await
            .unwrap();
        assert_eq!(samples.len(), 4);
        assert_eq!(
            (
                samples[0].variant.as_str(),
                samples[0].value,
                samples[0].source
            ),
            ("control", 0.0, Source::Gateway)
        );
        assert!(
            samples
                .iter()
                .any(|s| s.source == Source::Cli && s.value == 1.0)
        );
        // Gateway saw 1.5 USD, the CLI 10: the larger, not the sum.
        assert_eq!(evidence.spend_usd("exp", since).await.unwrap(), 10.0);
        // A later window sees nothing; an unknown metric is an error naming it.
        let later = OffsetDateTime::from_unix_timestamp(1_761_000_000).unwrap();
        assert!(
            evidence
                .samples("exp", "error_rate", later)
                .await
                .unwrap()
                .is_empty()
        );
        let err = evidence
            .samples("exp", "halo.client.crash_rate", since)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("halo.client.crash_rate"), "{err}");
    }
}
