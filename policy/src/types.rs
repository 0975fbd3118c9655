//! The policy data model: one Rust type per policy kind, as written in a policy repo.
//!
//! Every document is `apiVersion: halos.dev/v1`. The loader checks `apiVersion`, picks
//! the type by `kind`, removes both keys and decodes the rest strictly into these types:
//! every struct denies unknown fields, so a typo is an error naming the field.
//! Field names are the YAML keys (camelCase, with the spec's `baseURL`, `clientID`
//! and `maxSpendUSD` spelled as the spec spells them).
//!
//! Maps are `BTreeMap` so iteration, compilation and serialization are deterministic.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The one apiVersion every document carries.
pub const API_VERSION: &str = "halos.dev/v1";

/// Free-form settings (harness overrides, toggle fragments): any JSON/YAML value.
pub type Settings = BTreeMap<String, serde_json::Value>;

// ---------------------------------------------------------------------------
// halos.yaml
// ---------------------------------------------------------------------------

/// `halos.yaml` at the root of a policy repo: the organisation and its identity provider.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Root {
    /// Organisation name; releases and ring pointers carry it and halod checks it.
    pub org: String,
    /// The developers' OIDC identity provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
    /// Whether developers may put themselves into opt-in rings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_service: Option<SelfService>,
}

/// The OIDC provider whose JWTs identify developers.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Identity {
    /// Issuer URL (`iss`); its JWKS verifies developer tokens.
    #[serde(default)]
    pub issuer: String,
    /// OAuth client id of the Halos app; the default audience.
    #[serde(rename = "clientID", default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Expected `aud`; defaults to `clientID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// Which claims carry the user and the groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<Claims>,
    /// Groups whose members may use halo-server's admin API.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admin_groups: Vec<String>,
    /// Accept an `email` user claim without `email_verified: true`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub trust_unverified_email: bool,
}

impl Identity {
    /// The audience tokens must carry: `audience`, else `clientID`.
    pub fn effective_audience(&self) -> Option<&str> {
        self.audience.as_deref().or(self.client_id.as_deref())
    }
}

/// Claim names in the developer's JWT.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Claims {
    /// The claim naming the user (default `email`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The claim listing the user's groups (default `groups`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<String>,
}

/// Default user claim.
pub const DEFAULT_USER_CLAIM: &str = "email";
/// Default groups claim.
pub const DEFAULT_GROUPS_CLAIM: &str = "groups";

/// Self-service: developers may join and leave opt-in rings themselves.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SelfService {
    #[serde(default)]
    pub enabled: bool,
}

// ---------------------------------------------------------------------------
// Gateway
// ---------------------------------------------------------------------------

/// A coding tool Halos manages.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Harness {
    ClaudeCode,
    Codex,
    GeminiCli,
}

impl Harness {
    pub const ALL: [Harness; 3] = [Harness::ClaudeCode, Harness::Codex, Harness::GeminiCli];

    pub fn as_str(self) -> &'static str {
        match self {
            Harness::ClaudeCode => "claude-code",
            Harness::Codex => "codex",
            Harness::GeminiCli => "gemini-cli",
        }
    }

    /// The wire a harness speaks when `Gateway.protocols` says nothing.
    pub fn default_protocol(self) -> WireProtocol {
        match self {
            Harness::ClaudeCode => WireProtocol::AnthropicMessages,
            Harness::Codex => WireProtocol::OpenaiResponses,
            Harness::GeminiCli => WireProtocol::Gemini,
        }
    }
}

/// The wire protocol a client speaks to the gateway.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum WireProtocol {
    /// `/v1/messages`, `/v1/messages/count_tokens`.
    AnthropicMessages,
    /// `/v1/responses`.
    OpenaiResponses,
    /// Bedrock runtime `invoke`, `invoke-with-response-stream`, `converse`, `converse-stream`.
    BedrockInvoke,
    /// `/v1beta/models/{model}:{generateContent,streamGenerateContent,countTokens}`.
    Gemini,
}

impl WireProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            WireProtocol::AnthropicMessages => "anthropic-messages",
            WireProtocol::OpenaiResponses => "openai-responses",
            WireProtocol::BedrockInvoke => "bedrock-invoke",
            WireProtocol::Gemini => "gemini",
        }
    }
}

/// The kind of a policy upstream: what it speaks and how it authenticates.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum UpstreamKind {
    Orchestrator,
    Anthropic,
    Bedrock,
    Vertex,
    Openai,
    AzureOpenai,
    Gemini,
}

impl UpstreamKind {
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamKind::Orchestrator => "orchestrator",
            UpstreamKind::Anthropic => "anthropic",
            UpstreamKind::Bedrock => "bedrock",
            UpstreamKind::Vertex => "vertex",
            UpstreamKind::Openai => "openai",
            UpstreamKind::AzureOpenai => "azure-openai",
            UpstreamKind::Gemini => "gemini",
        }
    }

    /// Whether a target of this kind can serve a client speaking `wire`
    /// (the spec's Providers table). A target that cannot is skipped for that client.
    pub fn serves(self, wire: WireProtocol) -> bool {
        use WireProtocol as W;
        match self {
            UpstreamKind::Orchestrator => true,
            UpstreamKind::Anthropic | UpstreamKind::Openai => wire != W::Gemini,
            UpstreamKind::Bedrock => matches!(wire, W::BedrockInvoke | W::AnthropicMessages),
            UpstreamKind::Vertex => wire == W::AnthropicMessages,
            UpstreamKind::AzureOpenai => wire == W::OpenaiResponses,
            UpstreamKind::Gemini => wire == W::Gemini,
        }
    }

    /// Kinds for which the gateway sends a credential of its own.
    pub fn is_credentialed(self) -> bool {
        matches!(
            self,
            UpstreamKind::Bedrock
                | UpstreamKind::Vertex
                | UpstreamKind::Openai
                | UpstreamKind::AzureOpenai
                | UpstreamKind::Gemini
        )
    }
}

/// The Gateway document: where each model alias goes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Gateway {
    /// The URL harnesses are pointed at.
    #[serde(rename = "baseURL", default)]
    pub base_url: String,
    /// The wire each harness speaks (defaults: claude-code anthropic-messages,
    /// codex openai-responses, gemini-cli gemini).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub protocols: BTreeMap<Harness, WireProtocol>,
    /// How harnesses obtain their Halos token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<GatewayAuth>,
    /// Model alias -> route.
    #[serde(default)]
    pub models: BTreeMap<String, ModelRoute>,
    /// Named backends.
    #[serde(default)]
    pub upstreams: BTreeMap<String, Upstream>,
    /// What each upstream charges per model: upstream name -> the model as a target names
    /// it -> prices. A routed model without a price has an unknown cost (never zero).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, BTreeMap<String, Price>>,
    /// Spend and token budgets by name: who they apply to, per which calendar period, and
    /// what happens at the limit (issue #25; see [`crate::budgets`]). Enforced by every
    /// Envoy through halo-server's rate-limit service.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub budgets: BTreeMap<String, Budget>,
    /// How the gateway behaves when the budget service cannot answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_service: Option<BudgetService>,
}

/// A spend or token budget: a limit per calendar period for a ring, a group or a user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Budget {
    /// Who it applies to: a caller named by any list (user, one of their groups, their
    /// ring) is under it.
    pub applies_to: BudgetScope,
    /// `perUser` (default): each caller it applies to has a count of their own;
    /// `pooled`: everyone it applies to shares one count.
    #[serde(default)]
    pub count: BudgetCount,
    /// The calendar period the count covers; it starts again at the next one.
    pub period: BudgetPeriod,
    /// The IANA time zone whose calendar the periods follow (`Europe/Berlin`); default
    /// `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// The limit: USD, tokens, or both (whichever is reached first).
    pub limit: BudgetLimit,
    /// What happens to a call once the limit is reached; default `refuse`.
    #[serde(default)]
    pub at_limit: AtLimit,
}

/// The callers a budget applies to.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BudgetScope {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Ring names: the ring the caller resolves to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rings: Vec<String>,
}

/// Whose calls a budget's count adds up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum BudgetCount {
    #[default]
    PerUser,
    Pooled,
}

/// A calendar period (weeks start on Monday, ISO 8601).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum BudgetPeriod {
    Day,
    Week,
    Month,
}

impl BudgetPeriod {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPeriod::Day => "day",
            BudgetPeriod::Week => "week",
            BudgetPeriod::Month => "month",
        }
    }
}

/// A budget's limit: either or both.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BudgetLimit {
    /// USD, priced with the Gateway's price table (an unpriced call adds no USD).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd: Option<f64>,
    /// Tokens: every prompt token (cache reads and writes included) plus every output token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

/// What happens to a call at a budget's limit.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum AtLimit {
    /// 429 in the client wire's error shape, naming the budget and when it resets.
    #[default]
    Refuse,
    /// Alias -> a cheaper alias the call is sent to instead, once the budget is spent
    /// (gateways fed over xDS get the exhausted list pushed; a gateway without it, such as
    /// a standalone one, refuses the aliases named here as under `refuse`).
    RouteTo(BTreeMap<String, String>),
}

/// The gateway's behaviour towards the budget service (halo-server's rate-limit service).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BudgetService {
    /// When the service cannot answer (down, slow, its store failing): `open` (default)
    /// lets calls through uncounted, `closed` refuses them.
    #[serde(default)]
    pub on_service_down: OnServiceDown,
    /// How long Envoy waits for the budget check, in milliseconds (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u32>,
}

/// What a budget outage does to calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnServiceDown {
    /// A budget protects money over a day or a month: minutes of uncounted calls cost
    /// less than every developer's tools stopping at once.
    #[default]
    Open,
    Closed,
}

/// USD per million tokens, by how the tokens are billed (see halo-providers' `usage`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Price {
    /// Prompt tokens not read from the cache.
    pub input: f64,
    /// Completion tokens, reasoning included.
    pub output: f64,
    /// Prompt tokens written to the cache; unset: the provider does not bill writes apart
    /// (they count as input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    /// Prompt tokens read from the cache; unset: billed as input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
}

impl Price {
    /// The cost in USD of a call's tokens; `None` when input or output is unknown (a
    /// partial count must not look like a cheap call). Cache counts not reported are 0.
    pub fn cost_usd(
        &self,
        input: Option<u64>,
        output: Option<u64>,
        cache_write: Option<u64>,
        cache_read: Option<u64>,
    ) -> Option<f64> {
        let per_token = |n: u64, usd_per_million: f64| n as f64 * usd_per_million / 1e6;
        Some(
            per_token(input?, self.input)
                + per_token(output?, self.output)
                + per_token(
                    cache_write.unwrap_or(0),
                    self.cache_write.unwrap_or(self.input),
                )
                + per_token(
                    cache_read.unwrap_or(0),
                    self.cache_read.unwrap_or(self.input),
                ),
        )
    }
}

/// The most a price may say (USD per million tokens): a larger one is a typo.
pub const MAX_PRICE_USD: f64 = 10_000.0;

impl Gateway {
    /// The price of `model` on `upstream`, when the price table has one.
    pub fn price(&self, upstream: &str, model: &str) -> Option<&Price> {
        self.prices.get(upstream)?.get(model)
    }

    /// The wire `harness` speaks to this gateway.
    pub fn protocol(&self, harness: Harness) -> WireProtocol {
        self.protocols
            .get(&harness)
            .copied()
            .unwrap_or_else(|| harness.default_protocol())
    }
}

/// How harnesses authenticate to the gateway.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GatewayAuth {
    /// A command that prints a fresh Halos JWT (becomes Claude Code's apiKeyHelper and
    /// mints Gemini CLI's GEMINI_API_KEY at shell start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helper_command: Option<String>,
}

/// Where one alias goes: either one `{upstream, model}` or a list of `targets`.
/// Exactly one of the two forms is allowed (validation says so).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelRoute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<Target>,
}

impl ModelRoute {
    /// The route as a list of targets: the single form becomes one target.
    /// Incomplete single forms yield no target (validation reports them).
    pub fn normalized_targets(&self) -> Vec<Target> {
        if !self.targets.is_empty() {
            return self.targets.clone();
        }
        match (&self.upstream, &self.model) {
            (Some(upstream), Some(model)) => vec![Target {
                upstream: upstream.clone(),
                model: model.clone(),
                weight: None,
                priority: 0,
                timeout_seconds: self.timeout_seconds,
            }],
            _ => Vec::new(),
        }
    }
}

/// One target of a route.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Target {
    /// A name in `Gateway.upstreams`.
    pub upstream: String,
    /// The provider's model id (or inference-profile ARN, or Azure deployment).
    pub model: String,
    /// Share within its priority tier; unset counts as 1. Zero is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Tier: lower is tried first.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: u32,
    /// Connect plus response headers; streams are not time-limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
}

impl Target {
    /// The weight used for the pick: unset is 1.
    pub fn effective_weight(&self) -> u32 {
        self.weight.unwrap_or(1)
    }
}

/// A named backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Upstream {
    pub url: String,
    pub kind: UpstreamKind,
    /// AWS region (bedrock only) or GCP region (vertex: us-east5 or global).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// GCP project (vertex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Azure OpenAI api-version; unset uses the v1 path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Where the gateway reads this upstream's secret at use time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<Credential>,
}

/// A reference to a secret held by the gateway host; never the secret itself.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Credential {
    /// Environment variable holding the secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// File holding the secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

// ---------------------------------------------------------------------------
// Profile
// ---------------------------------------------------------------------------

/// Harness settings for a cohort: what halod writes on developer machines.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Profile {
    pub name: String,
    /// Another profile this one starts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extends: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub harnesses: BTreeMap<Harness, HarnessSettings>,
    /// Aliases this cohort may pick in its harness's model menu.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<Permissions>,
    /// MCP servers by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp: BTreeMap<String, McpServer>,
    /// Hooks by event name (for example PreToolUse).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hooks: BTreeMap<String, Vec<Hook>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<Telemetry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Egress>,
}

/// One harness in a profile.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HarnessSettings {
    /// Exact version pin (for example 2.0.14); ranges are refused.
    pub version: String,
    /// Default model: a Gateway alias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Harness-native settings merged over what the adapter renders.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: Settings,
}

/// Tool permissions.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Permissions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ask: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

/// An MCP server: a local command or a remote URL.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct McpServer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Environment for a command server; values should be `${VAR}` references.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// A hook command run on a harness event.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Hook {
    /// Tool-name matcher (harness syntax); unset matches every tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<String>,
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
}

/// Harness telemetry (OpenTelemetry export from the harness).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Telemetry {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Export prompt text. Refused by a guardrail: prompts never leave the machine.
    #[serde(default, skip_serializing_if = "is_false")]
    pub log_prompts: bool,
}

/// Network egress allowed to the harness's tools.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Egress {
    /// Hostnames (exact, or `*.domain`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
}

// ---------------------------------------------------------------------------
// Ring
// ---------------------------------------------------------------------------

/// A cohort of developers. The first ring by `order` whose membership matches wins;
/// the `default` ring takes everyone else.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Ring {
    pub name: String,
    /// Resolution order: lower is checked first. Unique across rings.
    pub order: u32,
    /// The Profile this ring's release renders.
    pub profile: String,
    /// Pinned release digest (`sha256:<64 hex>`); unset means the latest published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    #[serde(default)]
    pub membership: Membership,
}

/// Who is in a ring.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Membership {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Share of all users (0-100), by a sticky hash of the user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<u32>,
    /// Everyone not matched by an earlier ring.
    #[serde(default, skip_serializing_if = "is_false")]
    pub default: bool,
    /// Developers may join through self-service.
    #[serde(default, skip_serializing_if = "is_false")]
    pub opt_in: bool,
}

// ---------------------------------------------------------------------------
// Experiment
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ExperimentType {
    #[default]
    Ab,
    Canary,
    Shadow,
}

/// What an experiment or toggle changes: harness settings on machines, or gateway routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Axis {
    #[default]
    Client,
    Traffic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ExperimentStatus {
    #[default]
    Draft,
    Running,
    Paused,
    Concluded,
}

/// An A/B test, canary or shadow comparison over some rings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Experiment {
    pub name: String,
    #[serde(rename = "type")]
    pub experiment_type: ExperimentType,
    pub axis: Axis,
    pub status: ExperimentStatus,
    /// Rings enrolled; an empty list enrolls none.
    #[serde(default)]
    pub rings: Vec<String>,
    /// Hash salt for variant assignment; changing it reshuffles users.
    pub salt: String,
    /// The first variant named `control` is the baseline.
    pub variants: Vec<Variant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping: Option<Stopping>,
    /// Shadow experiments only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<Shadow>,
}

/// Name of the baseline variant every ab and canary experiment has.
pub const CONTROL_VARIANT: &str = "control";

/// One arm of an experiment.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Variant {
    pub name: String,
    /// Share of the enrolled users (> 0).
    pub weight: u32,
    /// Traffic axis: alias -> route override for users in this variant.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub routes: BTreeMap<String, ModelRoute>,
    /// Client axis: the Profile this variant's release renders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// What the controller watches.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Metrics {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<Metric>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub guardrails: Vec<Metric>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// Higher is better.
    Increase,
    /// Lower is better.
    Decrease,
}

/// A metric and the direction that counts as better.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Metric {
    /// For example halo.api.error_rate or halo.latency.p95.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<Direction>,
    /// Guardrails: the largest tolerated relative regression (0.05 = 5%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
}

/// When the controller stops an experiment.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Stopping {
    /// Samples per arm before any verdict but rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_samples: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_days: Option<u32>,
    #[serde(
        rename = "maxSpendUSD",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_spend_usd: Option<f64>,
    /// Significance level (default 0.05).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alpha: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ShadowTurns {
    /// Only the first turn of a session is mirrored.
    #[default]
    First,
    /// Every step is mirrored.
    All,
}

/// Shadow settings: the treatment variant's routes receive mirrored copies.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Shadow {
    #[serde(default)]
    pub turns: ShadowTurns,
}

// ---------------------------------------------------------------------------
// Toggle
// ---------------------------------------------------------------------------

/// A rule's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Effect {
    On,
    Off,
}

/// A feature flag for a slice of people: client settings fragments or route overrides.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Toggle {
    pub name: String,
    /// Who answers for it (an email or team).
    pub owner: String,
    /// Date (YYYY-MM-DD) after which the toggle must be removed.
    pub expires: String,
    /// Whether the toggle is on for people no rule matches.
    #[serde(default)]
    pub default: bool,
    pub axis: Axis,
    /// Ordered: the first matching rule decides.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<ToggleRule>,
    /// Client axis: per-harness settings fragments merged when on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub client: BTreeMap<Harness, Settings>,
    /// Traffic axis: route overrides applied when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<TrafficToggle>,
}

/// One toggle rule. Every condition it states must hold; an unstated one holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToggleRule {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rings: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// Share of users (0-100), by a sticky hash of the user salted with the toggle name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<u32>,
    pub effect: Effect,
}

/// Route overrides of a traffic toggle.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TrafficToggle {
    #[serde(default)]
    pub routes: BTreeMap<String, ModelRoute>,
}

// ---------------------------------------------------------------------------
// Rollout
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RolloutStatus {
    #[default]
    Pending,
    Running,
    Paused,
    Complete,
    RolledBack,
}

/// A staged change (a release or an alias route) moved ring by ring behind gates.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Rollout {
    pub name: String,
    pub axis: Axis,
    #[serde(default)]
    pub status: RolloutStatus,
    /// Index of the current step.
    #[serde(default)]
    pub step: u32,
    /// The Experiment that carries the change to each step's cohort.
    pub experiment: String,
    pub change: Change,
    /// What a rollback returns to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Baseline>,
    pub steps: Vec<RolloutStep>,
}

/// The change a rollout carries: a release digest (client axis) or an alias route
/// (traffic axis). Exactly one.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Change {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<AliasChange>,
}

/// A new route for one alias.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AliasChange {
    pub name: String,
    pub route: ModelRoute,
}

/// What a rollback restores.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Baseline {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// A percentage of the step's ring gets the change.
    #[default]
    Canary,
    /// The whole ring gets the change.
    Ring,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum OnFailure {
    #[default]
    Rollback,
    Pause,
}

/// One stage of a rollout.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RolloutStep {
    #[serde(default)]
    pub strategy: Strategy,
    /// The ring this step adds to the backing experiment's cohort (one of the
    /// experiment's rings); the rings of earlier steps keep the change.
    pub ring: String,
    /// The change's share of the cohort at this step (1-100); without it, the whole
    /// cohort. No step may narrow a ring an earlier step took whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<u32>,
    /// How long the step soaks before the gates are read (for example 30m, 24h).
    pub bake: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<Gate>,
    #[serde(default)]
    pub on_failure: OnFailure,
}

/// A gate: a metric bound the step must hold before advancing.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Gate {
    pub metric: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
}

// ---------------------------------------------------------------------------
// The whole policy
// ---------------------------------------------------------------------------

/// A policy kind: the `kind:` of a document (halos.yaml has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Kind {
    Root,
    Gateway,
    Profile,
    Ring,
    Experiment,
    Toggle,
    Rollout,
}

impl Kind {
    /// The kinds a `kind:` key may name.
    pub const DOCUMENT_KINDS: [Kind; 6] = [
        Kind::Gateway,
        Kind::Profile,
        Kind::Ring,
        Kind::Experiment,
        Kind::Toggle,
        Kind::Rollout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Root => "halos.yaml",
            Kind::Gateway => "Gateway",
            Kind::Profile => "Profile",
            Kind::Ring => "Ring",
            Kind::Experiment => "Experiment",
            Kind::Toggle => "Toggle",
            Kind::Rollout => "Rollout",
        }
    }

    pub fn from_kind_str(s: &str) -> Option<Kind> {
        Kind::DOCUMENT_KINDS.into_iter().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a document came from: its file (relative to the policy dir) and its 1-based
/// position in that file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct DocumentSource {
    pub file: String,
    pub document: usize,
}

impl std::fmt::Display for DocumentSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (document {})", self.file, self.document)
    }
}

/// A whole policy repo, joined into one value. Named kinds are keyed by name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Org {
    pub root: Root,
    pub gateway: Gateway,
    pub profiles: BTreeMap<String, Profile>,
    pub rings: BTreeMap<String, Ring>,
    pub experiments: BTreeMap<String, Experiment>,
    pub toggles: BTreeMap<String, Toggle>,
    pub rollouts: BTreeMap<String, Rollout>,
    /// Where each document came from, for issue messages. Key: (kind, name); the root
    /// and the Gateway use an empty name.
    pub sources: BTreeMap<(Kind, String), DocumentSource>,
}

impl Org {
    /// The source of a document, if it was loaded from disk.
    pub fn source(&self, kind: Kind, name: &str) -> Option<&DocumentSource> {
        self.sources.get(&(kind, name.to_string()))
    }

    /// Rings in resolution order (by `order`, then name).
    pub fn rings_in_order(&self) -> Vec<&Ring> {
        let mut rings: Vec<&Ring> = self.rings.values().collect();
        rings.sort_by(|a, b| a.order.cmp(&b.order).then_with(|| a.name.cmp(&b.name)));
        rings
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
