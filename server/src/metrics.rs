//! Prometheus metrics, rendered by hand in the text exposition format (a handful of
//! counters does not need a metrics framework).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    kill_changes: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    secret_failures: Mutex<BTreeMap<&'static str, u64>>,
}

/// Gauges read at scrape time.
#[derive(Debug, Default)]
pub struct Gauges {
    pub killed_experiments: usize,
    pub killed_toggles: usize,
    pub blocked_addresses: usize,
    pub kill_switch_enabled: bool,
}

fn bump<K: Ord>(m: &Mutex<BTreeMap<K, u64>>, k: K) {
    *m.lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(k)
        .or_insert(0) += 1;
}

impl Metrics {
    /// One request, by route template (never the raw path: names and ids stay out).
    pub fn request(&self, method: &str, route: &str, status: u16) {
        bump(
            &self.requests,
            (method.to_string(), route.to_string(), status),
        );
    }

    pub fn kill_change(&self, action: &'static str, target: &'static str) {
        bump(&self.kill_changes, (action, target));
    }

    pub fn secret_failure(&self, kind: &'static str) {
        bump(&self.secret_failures, kind);
    }

    pub fn render(&self, g: &Gauges) -> String {
        let mut out = String::new();
        out.push_str("# HELP halo_server_http_requests_total HTTP requests by route template and status.\n# TYPE halo_server_http_requests_total counter\n");
        for ((m, r, s), n) in self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "halo_server_http_requests_total{{method=\"{m}\",route=\"{}\",status=\"{s}\"}} {n}",
                escape(r)
            );
        }
        out.push_str("# HELP halo_server_kill_changes_total Accepted kills and unkills.\n# TYPE halo_server_kill_changes_total counter\n");
        for ((a, t), n) in self
            .kill_changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "halo_server_kill_changes_total{{action=\"{a}\",target=\"{t}\"}} {n}"
            );
        }
        out.push_str("# HELP halo_server_secret_failures_total Refused shared-secret attempts (gateway, fleet, enrollment, device tokens).\n# TYPE halo_server_secret_failures_total counter\n");
        for (k, n) in self
            .secret_failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(out, "halo_server_secret_failures_total{{kind=\"{k}\"}} {n}");
        }
        let _ = write!(
            out,
            "# HELP halo_server_killed Experiments and toggles killed now.\n# TYPE halo_server_killed gauge\nhalo_server_killed{{target=\"experiment\"}} {}\nhalo_server_killed{{target=\"toggle\"}} {}\n# HELP halo_server_blocked_addresses Addresses blocked for failed token attempts.\n# TYPE halo_server_blocked_addresses gauge\nhalo_server_blocked_addresses {}\n# HELP halo_server_kill_switch_enabled Whether the kill switch is served.\n# TYPE halo_server_kill_switch_enabled gauge\nhalo_server_kill_switch_enabled {}\n",
            g.killed_experiments,
            g.killed_toggles,
            g.blocked_addresses,
            u8::from(g.kill_switch_enabled)
        );
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}
