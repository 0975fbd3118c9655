//! Counters of the ADS server, rendered in the Prometheus text format by the host.

use halo_metrics::{Kind, Text};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What the ADS server counts.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Discovery responses sent.
    pub pushes: Counter,
    /// Requests that accepted the response they answer.
    pub acks: Counter,
    /// Requests that rejected the response they answer (error_detail set).
    pub nacks: Counter,
    /// Requests answering a nonce that is no longer the latest (ignored, per the protocol).
    pub stale: Counter,
    /// Snapshots set by the host.
    pub snapshots_set: Counter,
    pub streams_total: Counter,
    pub streams_active: Gauge,
}

impl Metrics {
    /// The Prometheus text exposition of every counter, names prefixed `halo_xds_`.
    pub fn render_prometheus(&self) -> String {
        let mut text = Text::new();
        self.write_prometheus(&mut text);
        text.finish()
    }

    /// [`Metrics::render_prometheus`] into a host's exposition.
    pub fn write_prometheus(&self, out: &mut Text) {
        let counters: [(&str, &str, u64); 6] = [
            (
                "halo_xds_pushes_total",
                "Discovery responses sent.",
                self.pushes.get(),
            ),
            (
                "halo_xds_acks_total",
                "Responses Envoy accepted.",
                self.acks.get(),
            ),
            (
                "halo_xds_nacks_total",
                "Responses Envoy rejected (error_detail set).",
                self.nacks.get(),
            ),
            (
                "halo_xds_stale_requests_total",
                "Requests answering an outdated nonce (ignored).",
                self.stale.get(),
            ),
            (
                "halo_xds_snapshots_set_total",
                "Snapshots set by the host.",
                self.snapshots_set.get(),
            ),
            (
                "halo_xds_streams_total",
                "ADS streams opened.",
                self.streams_total.get(),
            ),
        ];
        for (name, help, value) in counters {
            out.single(name, Kind::Counter, help, value);
        }
        out.single(
            "halo_xds_streams_active",
            Kind::Gauge,
            "ADS streams open now.",
            self.streams_active.get(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_counter_with_help_and_type() {
        let m = Metrics::default();
        m.nacks.inc();
        m.streams_active.inc();
        let text = m.render_prometheus();
        assert!(text.contains("# TYPE halo_xds_nacks_total counter\nhalo_xds_nacks_total 1\n"));
        assert!(text.contains("halo_xds_streams_active 1\n"));
        assert_eq!(text.lines().filter(|l| l.starts_with("# HELP")).count(), 7);
    }
}
