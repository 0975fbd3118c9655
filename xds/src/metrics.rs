//! Counters of the ADS server, rendered in the Prometheus text format by the host.

use std::fmt::Write as _;
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
        let mut out = String::new();
        let counters: [(&str, &str, u64); 6] = [
            (
                "pushes_total",
                "Discovery responses sent.",
                self.pushes.get(),
            ),
            ("acks_total", "Responses Envoy accepted.", self.acks.get()),
            (
                "nacks_total",
                "Responses Envoy rejected (error_detail set).",
                self.nacks.get(),
            ),
            (
                "stale_requests_total",
                "Requests answering an outdated nonce (ignored).",
                self.stale.get(),
            ),
            (
                "snapshots_set_total",
                "Snapshots set by the host.",
                self.snapshots_set.get(),
            ),
            (
                "streams_total",
                "ADS streams opened.",
                self.streams_total.get(),
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP halo_xds_{name} {help}");
            let _ = writeln!(out, "# TYPE halo_xds_{name} counter");
            let _ = writeln!(out, "halo_xds_{name} {value}");
        }
        let _ = writeln!(out, "# HELP halo_xds_streams_active ADS streams open now.");
        let _ = writeln!(out, "# TYPE halo_xds_streams_active gauge");
        let _ = writeln!(out, "halo_xds_streams_active {}", self.streams_active.get());
        out
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
