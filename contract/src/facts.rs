//! The facts the halo filter writes for a call and the attributes of the evidence record
//! Envoy exports for it (spec: low-level design, request path 12 "Deferred metrics";
//! DESIGN.md "The evidence loop"). The filter writes each [`Fact`] into the stream's filter
//! state; halo-envoy-config's access logger turns them and Envoy's own stream facts into
//! one OTLP log record per call; halo-evidence's receiver reads exactly [`ATTRIBUTES`].
//!
//! Names are OpenTelemetry's GenAI semantic conventions where one exists, the spec's
//! `halo.gateway.*` and `halo.*` otherwise. Never a subject, a session id, a prompt or a
//! header value other than the filter's own stamps.

/// The log record's body: the spec's name of the per-call event.
pub const EVENT_NAME: &str = "halo.gateway.requests";

/// What the filter alone knows about a call, each written as one filter-state value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fact {
    /// The salted hash of the verified subject (never the subject).
    Unit,
    /// The model alias the client asked for.
    Alias,
    /// Prompt tokens, every kind (GenAI's `input_tokens` includes the cache's).
    InputTokens,
    OutputTokens,
    CacheWriteTokens,
    CacheReadTokens,
    /// USD, from the policy's price table; absent when unknown (never zero).
    CostUsd,
    /// `true` once the answer ended normally and its final usage was read.
    Complete,
    /// Seconds from the request's headers to the answer's first byte.
    TimeToFirstToken,
    /// The budgets that apply to the verified caller (`budget:subject,...`, halo-policy's
    /// `budgets::encode_keys`): not exported, read by the budget check's descriptors
    /// (`halo_envoy_config::budget`); written only for a budgeted call.
    Budgets,
    /// The client's wire (`anthropic-messages`, ...): the shape of a budget's 429.
    Wire,
    /// The tokens a budget counts (every prompt and output token), from 0 as they arrive.
    BudgetTokens,
    /// The call's cost in micro-USD (an integer: Envoy's hits are), from 0.
    BudgetMicroUsd,
}

impl Fact {
    /// Every exported fact.
    pub const ALL: [Fact; 9] = [
        Fact::Unit,
        Fact::Alias,
        Fact::InputTokens,
        Fact::OutputTokens,
        Fact::CacheWriteTokens,
        Fact::CacheReadTokens,
        Fact::CostUsd,
        Fact::Complete,
        Fact::TimeToFirstToken,
    ];

    /// The budget check's facts (`halo_envoy_config::budget`), not exported.
    pub const BUDGET: [Fact; 4] = [
        Fact::Budgets,
        Fact::Wire,
        Fact::BudgetTokens,
        Fact::BudgetMicroUsd,
    ];

    /// The OTLP attribute it is exported as; `None` for the budget facts.
    pub fn attribute(self) -> Option<&'static str> {
        Some(match self {
            Fact::Unit => UNIT,
            Fact::Alias => ALIAS,
            Fact::InputTokens => INPUT_TOKENS,
            Fact::OutputTokens => OUTPUT_TOKENS,
            Fact::CacheWriteTokens => CACHE_WRITE_TOKENS,
            Fact::CacheReadTokens => CACHE_READ_TOKENS,
            Fact::CostUsd => COST_USD,
            Fact::Complete => COMPLETE,
            Fact::TimeToFirstToken => TIME_TO_FIRST_TOKEN,
            Fact::Budgets | Fact::Wire | Fact::BudgetTokens | Fact::BudgetMicroUsd => return None,
        })
    }

    /// The filter-state key the filter writes it under, as the proxy-wasm ABI names a
    /// property it sets (`wasm.` + the property's name); the native build writes the same
    /// key, so one access log reads both builds.
    pub fn state_key(self) -> &'static str {
        match self {
            Fact::Unit => "wasm.halo_unit",
            Fact::Alias => "wasm.halo_alias",
            Fact::InputTokens => "wasm.halo_input_tokens",
            Fact::OutputTokens => "wasm.halo_output_tokens",
            Fact::CacheWriteTokens => "wasm.halo_cache_write_tokens",
            Fact::CacheReadTokens => "wasm.halo_cache_read_tokens",
            Fact::CostUsd => "wasm.halo_cost_usd",
            Fact::Complete => "wasm.halo_complete",
            Fact::TimeToFirstToken => "wasm.halo_ttft",
            Fact::Budgets => "wasm.halo_budgets",
            Fact::Wire => "wasm.halo_wire",
            Fact::BudgetTokens => "wasm.halo_budget_tokens",
            Fact::BudgetMicroUsd => "wasm.halo_budget_micro_usd",
        }
    }

    /// The property name a proxy-wasm module sets for [`Fact::state_key`].
    pub fn property(self) -> &'static str {
        self.state_key().trim_start_matches(WASM_STATE_PREFIX)
    }
}

/// The prefix Envoy's wasm runtime gives the filter-state key of a property a module sets.
pub const WASM_STATE_PREFIX: &str = "wasm.";

pub const UNIT: &str = "halo.unit";
pub const ALIAS: &str = "halo.alias";
pub const RING: &str = "halo.ring";
pub const RELEASE: &str = "halo.release";
pub const EXPERIMENT: &str = "halo.experiment";
pub const VARIANT: &str = "halo.variant";
pub const UPSTREAM: &str = "halo.upstream";
pub const TARGET: &str = "halo.target";
pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
pub const ATTEMPTS: &str = "halo.attempts";
pub const STATUS: &str = "http.response.status_code";
/// Milliseconds from the request's first byte to the answer's last (Envoy's `DURATION`).
pub const LATENCY_MS: &str = "halo.gateway.latency_ms";
pub const TIME_TO_FIRST_TOKEN: &str = "gen_ai.server.time_to_first_token";
pub const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
pub const CACHE_WRITE_TOKENS: &str = "gen_ai.usage.cache_creation.input_tokens";
pub const CACHE_READ_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
pub const COST_USD: &str = "halo.cost_usd";
pub const COMPLETE: &str = "halo.complete";

/// The names of every attribute the record carries (what the receiver reads).
pub const ATTRIBUTES: [&str; 19] = [
    RING,
    RELEASE,
    EXPERIMENT,
    VARIANT,
    UPSTREAM,
    RESPONSE_MODEL,
    TARGET,
    STATUS,
    ATTEMPTS,
    LATENCY_MS,
    UNIT,
    ALIAS,
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    CACHE_WRITE_TOKENS,
    CACHE_READ_TOKENS,
    COST_USD,
    COMPLETE,
    TIME_TO_FIRST_TOKEN,
];
