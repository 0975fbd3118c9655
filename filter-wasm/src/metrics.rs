//! Metric names. Tags ride in the name as `.<tag>.<value>` pairs, and the bootstrap's
//! `stats_config.stats_tags` (see halo-envoy-config) extracts them, so Prometheus shows
//! `halo_requests{ring="canary",variant="none",status="200"}`. Values never carry a user
//! id, a header or a body: only policy names (rings, variants) and status codes.

/// Requests through the filter, by ring, variant and response status.
pub fn requests(ring: &str, variant: Option<&str>, status: u32) -> String {
    format!(
        "halo.requests.ring.{}.variant.{}.status.{status}",
        clean(ring),
        clean(variant.unwrap_or("none"))
    )
}

/// Local refusals of identity (401, duplicate identity header 400).
pub fn auth_failures() -> String {
    "halo.auth_failures".to_string()
}

/// Kill-list polls by outcome.
pub fn killswitch_fetch(outcome: &str) -> String {
    format!("halo.killswitch_fetch.outcome.{}", clean(outcome))
}

/// Decisions by ring, variant and which layer routed.
pub fn decisions(ring: &str, variant: Option<&str>, source: &str) -> String {
    format!(
        "halo.decisions.ring.{}.variant.{}.source.{}",
        clean(ring),
        clean(variant.unwrap_or("none")),
        clean(source)
    )
}

/// Upstream attempts the per-attempt stage gave another target's model id (failovers
/// to a target with a different model, and first attempts whose endpoint changed model
/// since the request filter's policy).
pub fn attempt_rewrites() -> String {
    "halo.attempt_rewrites".to_string()
}

/// A tag value safe in a dotted stats name and a Prometheus label.
fn clean(value: &str) -> String {
    value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_tags() {
        assert_eq!(
            requests("canary", None, 200),
            "halo.requests.ring.canary.variant.none.status.200"
        );
        assert_eq!(
            decisions("a.b", Some("v 1"), "experiment"),
            "halo.decisions.ring.a_b.variant.v_1.source.experiment"
        );
    }
}
