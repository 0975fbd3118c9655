//! Budget enforcement in Envoy (issue #25; docs/design/budgets.md): Envoy's own global
//! rate limiting, `envoy.filters.http.ratelimit` after the halo filter, asking
//! halo-server's rate-limit service (`envoy.service.ratelimit.v3`, gRPC over the
//! [`BUDGET_CLUSTER`]).
//!
//! The descriptors come from the halo filter's facts only, never from a client's header:
//! the budgets that apply to the verified caller ([`Fact::Budgets`], halo-policy's
//! `budgets::applying`), the client's wire (the 429's shape) and, at stream end, the call's
//! tokens and micro-USD. A call the filter did not budget has no `Budgets` fact, so its
//! descriptors are not produced and Envoy asks nothing.
//!
//! Two moments, each a descriptor with a `phase` entry:
//! - `check`, at request time, adds 0: the service answers OVER_LIMIT, with the 429's
//!   body and headers, when any applying budget is spent (a spent `routeTo` budget lets
//!   through the calls on the aliases it sends callers to: the `alias` entry);
//! - `spend-tokens` and `spend-micro-usd`, when the stream is done
//!   (`apply_on_stream_done`): each adds the amount the filter wrote as `hits_addend`.
//!   Only the filter-level `rate_limits` carry a response-derived `hits_addend` in Envoy
//!   1.40 (the route-level ones drop it: verified in the design spike).

use serde_json::{Value, json};

use halo_contract::budget::*;
use halo_contract::facts::Fact;

use crate::evidence::Export;
use crate::plan::{PlanError, ServicePlan};

/// The rate-limit service's cluster (gRPC, HTTP/2).
pub const BUDGET_CLUSTER: &str = "halo-budget";
/// The ratelimit filter's stat prefix: Envoy counts
/// `cluster.<route cluster>.ratelimit.halo_budget.{ok,over_limit,error,failure_mode_allowed}`.
pub const STAT_PREFIX: &str = "halo_budget";
/// The ratelimit filter's name in the chain.
pub const FILTER_NAME: &str = "envoy.filters.http.ratelimit";

/// What the policy says of the check (`budgetService`), resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check {
    /// Refuse calls when the service cannot answer (`onServiceDown: closed`).
    pub fail_closed: bool,
    pub timeout_ms: u32,
}

impl Check {
    /// The check the policy's `budgetService` asks for (defaults when unset).
    pub fn of(snap: &halo_policy::Snapshot) -> Check {
        let service = snap.budget_service.unwrap_or_default();
        Check {
            fail_closed: service.on_service_down == halo_policy::types::OnServiceDown::Closed,
            timeout_ms: service
                .timeout_ms
                .unwrap_or(halo_policy::budgets::DEFAULT_TIMEOUT_MS),
        }
    }
}

/// A descriptor entry read from the filter state `fact` (absent: no descriptor).
fn from_fact(name: &str, fact: Fact) -> Value {
    json!({"extension": {
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.matching.common_inputs.network.v3.FilterStateInput",
            "key": fact.state_key(),
        },
    }})
}

fn phase(value: &str) -> Value {
    json!({"generic_key": {"descriptor_key": PHASE, "descriptor_value": value}})
}

/// The ratelimit filter (Envoy JSON `{name, typed_config}`) for `check`, its gRPC calls
/// carrying the service's token as `authorization` metadata.
pub fn ratelimit_filter(check: Check, service: &Export) -> Value {
    let spend = |p: &str, fact: Fact| {
        json!({
            "actions": [phase(p), from_fact(BUDGETS, Fact::Budgets)],
            "apply_on_stream_done": true,
            "hits_addend": {"format": format!("%FILTER_STATE({}:PLAIN)%", fact.state_key())},
        })
    };
    json!({
        "name": FILTER_NAME,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": DOMAIN,
            "stat_prefix": STAT_PREFIX,
            "failure_mode_deny": check.fail_closed,
            "timeout": format!("{}.{:03}s", check.timeout_ms / 1000, check.timeout_ms % 1000),
            "rate_limits": [
                {
                    "actions": [phase(PHASE_CHECK), from_fact(BUDGETS, Fact::Budgets), from_fact(WIRE, Fact::Wire), from_fact(ALIAS, Fact::Alias)],
                    "hits_addend": {"number": 0},
                },
                spend(PHASE_SPEND_TOKENS, Fact::BudgetTokens),
                spend(PHASE_SPEND_MICRO_USD, Fact::BudgetMicroUsd),
            ],
            "rate_limit_service": {
                "transport_api_version": "V3",
                "grpc_service": {
                    "envoy_grpc": {"cluster_name": BUDGET_CLUSTER},
                    "initial_metadata": [{"key": "authorization", "value": format!("Bearer {}", service.token)}],
                },
            },
        },
    })
}

/// `filter` with its gRPC metadata values redacted: how the plan's JSON shows it.
pub fn redacted(filter: &Value) -> Value {
    let mut filter = filter.clone();
    if let Some(items) = filter
        .pointer_mut("/typed_config/rate_limit_service/grpc_service/initial_metadata")
        .and_then(Value::as_array_mut)
    {
        for item in items {
            item["value"] = json!(crate::evidence::REDACTED);
        }
    }
    filter
}

/// The rate-limit service's cluster: HTTP/2 (gRPC), TLS verified against `ca_file` when
/// the URL is https.
pub fn service(export: &Export, ca_file: &str) -> Result<ServicePlan, PlanError> {
    Ok(ServicePlan::new("budgets.url", BUDGET_CLUSTER, &export.url, ca_file)?.grpc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_reads_only_the_filters_facts_and_spends_at_stream_end() {
        let export = Export {
            url: "http://127.0.0.1:4321".into(),
            token_file: None,
            token: "t".repeat(32),
        };
        let f = ratelimit_filter(
            Check {
                fail_closed: false,
                timeout_ms: 200,
            },
            &export,
        );
        let tc = &f["typed_config"];
        assert_eq!(tc["timeout"], "0.200s");
        assert_eq!(tc["failure_mode_deny"], false);
        let limits = tc["rate_limits"].as_array().expect("rate_limits");
        assert_eq!(limits.len(), 3);
        assert!(limits[0].get("apply_on_stream_done").is_none());
        assert_eq!(
            limits[1]["hits_addend"]["format"],
            "%FILTER_STATE(wasm.halo_budget_tokens:PLAIN)%"
        );
        // Every entry is the filter's (a generic key or a filter-state fact): no header.
        let text = tc["rate_limits"].to_string();
        assert!(!text.contains("header"), "{text}");
        assert!(!redacted(&f).to_string().contains(&"t".repeat(32)));
        let s = service(&export, "/ca.pem").expect("service");
        assert!(s.http2);
    }
}
