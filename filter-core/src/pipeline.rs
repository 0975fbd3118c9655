//! The request pipeline as pure functions: what the filter does with what Envoy tells it.
//!
//! Two steps, matching when Envoy calls the filter:
//! - [`on_head`] (request headers): fail closed without identity configuration, identity
//!   (verified claims or the trusted proxy's header), duplicate identity headers, the
//!   announced body size.
//! - [`on_body`] (the whole body, at most maxBodyBytes, with its scan when the glue ran it
//!   while the body arrived): admit (404/400), decision on the
//!   kill-list-applied snapshot, route order and the first servable target, the model
//!   alias rewrite (body or path), hygiene and stamps.
//!
//! The proxy-wasm glue in `lib.rs` only reads Envoy state into these inputs and writes the
//! outputs back.

use std::net::IpAddr;

use halo_policy::Snapshot;
use halo_policy::admit::{self, Admission, ModelLocation, Refusal};
use halo_policy::assign;
use halo_policy::body_scan::{ScanError, TopLevel};
use halo_policy::cluster_names::{self, EndpointFacts};
use halo_policy::decide::{self, Caller, Decision, Subject};
use halo_policy::route;
use halo_policy::types::{Target, WireProtocol};

use crate::account;
use crate::attempt::Note;
use crate::breaker::Failover;
use crate::config::{Config, IdentityMode};
use crate::hygiene;

/// Headers that carry the harness session, in the order they are looked for: Claude Code's
/// and Codex's. The sticky pick keys on user + session so a session keeps its target (and
/// its provider-side prompt cache).
pub const SESSION_HEADERS: [&str; 2] = ["x-claude-code-session-id", "session_id"];

/// Claims jwt_authn verified (read from its dynamic metadata); `None` fields were absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifiedClaims {
    pub user: Option<String>,
    pub email_verified: Option<bool>,
    pub groups: Vec<String>,
}

/// What the filter knows at the request headers.
#[derive(Debug, Clone)]
pub struct Head<'a> {
    pub method: &'a str,
    pub path: &'a str,
    /// Lowercase names, in arrival order; a repeated header appears repeatedly.
    pub headers: &'a [(String, String)],
    pub peer: Option<IpAddr>,
    /// jwt mode: `None` when jwt_authn left no payload (missing or failed token).
    pub claims: Option<VerifiedClaims>,
    pub content_length: Option<u64>,
}

impl<'a> Head<'a> {
    /// The head of a request whose headers (names lowercase) are `headers`.
    pub fn new(
        headers: &'a [(String, String)],
        peer: Option<IpAddr>,
        claims: Option<VerifiedClaims>,
    ) -> Head<'a> {
        Head {
            method: header(headers, ":method").unwrap_or_default(),
            path: header(headers, ":path").unwrap_or_default(),
            headers,
            peer,
            claims,
            content_length: content_length(headers),
        }
    }
}

/// The announced body size, if any (headers with names lowercase).
pub fn content_length(headers: &[(String, String)]) -> Option<u64> {
    header(headers, "content-length").and_then(|v| v.parse().ok())
}

/// A local reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Why, for the metrics (`auth`, `identity_config`, `admit`, `too_large`, `route`).
    pub reason: &'static str,
}

impl Reply {
    fn error(status: u16, error_type: &'static str, message: impl Into<String>) -> Reply {
        let refusal = Refusal {
            status,
            error_type,
            message: message.into(),
        };
        Reply::from_refusal(&refusal, "admit")
    }

    fn from_refusal(refusal: &Refusal, reason: &'static str) -> Reply {
        Reply {
            status: refusal.status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: refusal.body(),
            reason,
        }
    }

    fn unauthenticated(message: &str) -> Reply {
        let mut r = Reply::error(401, "authentication_error", message);
        r.headers
            .push(("www-authenticate".into(), "Bearer realm=\"halos\"".into()));
        r.reason = "auth";
        r
    }

    /// 503 `no_available_target` in the error shape of the client's wire: no target
    /// routes the alias, or every target the request tried failed (a connect error, a
    /// 5xx or a 429: [`crate::request`]'s response path). Claude Code and Codex read
    /// their own shapes' message; Gemini CLI prints Google's error; a Bedrock client
    /// (the AWS SDK) reads the error type from `x-amzn-errortype`.
    pub fn no_available_target(wire: WireProtocol, message: &str) -> Reply {
        const TYPE: &str = "no_available_target";
        let (body, extra) = match wire {
            WireProtocol::AnthropicMessages => (
                serde_json::json!({"type": "error", "error": {"type": TYPE, "message": message}}),
                None,
            ),
            WireProtocol::OpenaiResponses => (
                serde_json::json!({"error": {"type": TYPE, "code": TYPE, "message": message, "param": null}}),
                None,
            ),
            WireProtocol::Gemini => (
                serde_json::json!({"error": {"code": 503, "message": message, "status": "UNAVAILABLE",
                    "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                 "reason": TYPE, "domain": "halos"}]}}),
                None,
            ),
            WireProtocol::BedrockInvoke => (
                serde_json::json!({"message": message}),
                Some(("x-amzn-errortype", "ServiceUnavailableException")),
            ),
        };
        let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
        headers.extend(extra.map(|(n, v)| (n.to_string(), v.to_string())));
        Reply {
            status: 503,
            headers,
            body: body.to_string().into_bytes(),
            reason: "route",
        }
    }

    pub fn too_large(max: u64) -> Reply {
        let mut r = Reply::error(
            413,
            "request_too_large",
            format!("the request body is larger than this gateway's limit of {max} bytes"),
        );
        r.reason = "too_large";
        r
    }
}

/// The request after its headers: who is calling and what to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub caller: Caller,
    /// The sticky route key (user + session); `None` for anonymous callers.
    pub pick_key: Option<String>,
    pub method: String,
    pub path: String,
}

/// Header-time checks. `Err` is the reply to send now.
pub fn on_head(cfg: &Config, head: &Head<'_>) -> Result<Pending, Reply> {
    let Some(mode) = cfg.identity.mode else {
        let mut r = Reply::error(
            503,
            "policy_unavailable",
            "this gateway has no identity configuration (no issuer, no trusted proxies, no mode)",
        );
        r.reason = "identity_config";
        return Err(r);
    };
    if let Some(len) = head.content_length
        && len > cfg.max_body_bytes
    {
        return Err(Reply::too_large(cfg.max_body_bytes));
    }
    let caller = identify(cfg, mode, head)?;
    let pick_key = match &caller {
        Caller::Verified(s) => {
            let session = SESSION_HEADERS
                .iter()
                .find_map(|h| header(head.headers, h))
                .unwrap_or("");
            Some(assign::sticky_key(&s.user, session))
        }
        Caller::Anonymous => None,
    };
    Ok(Pending {
        caller,
        pick_key,
        method: head.method.to_string(),
        path: head.path.to_string(),
    })
}

fn identify(cfg: &Config, mode: IdentityMode, head: &Head<'_>) -> Result<Caller, Reply> {
    let id = &cfg.identity;
    let refuse = |message: &str| {
        if id.allow_anonymous {
            Ok(Caller::Anonymous)
        } else {
            Err(Reply::unauthenticated(message))
        }
    };
    match mode {
        IdentityMode::None => Ok(Caller::Anonymous),
        IdentityMode::Jwt => {
            for name in ["authorization", "x-goog-api-key"] {
                // Envoy folds a repeated Authorization (an inline header) into one value
                // joined by commas; a token never contains one.
                let folded = header(head.headers, name).is_some_and(|v| v.contains(','));
                if count(head.headers, name) > 1 || folded {
                    return Err(duplicate(name));
                }
            }
            let Some(claims) = &head.claims else {
                return refuse(
                    "a valid token from the organisation's identity provider is required",
                );
            };
            let Some(user) = claims.user.as_deref().filter(|u| !u.is_empty()) else {
                return refuse("the token has no user claim");
            };
            if id.user_claim == "email"
                && !id.trust_unverified_email
                && claims.email_verified != Some(true)
            {
                return refuse("the token's email is not verified (email_verified must be true)");
            }
            Ok(Caller::Verified(Subject {
                user: user.to_string(),
                groups: claims.groups.clone(),
            }))
        }
        IdentityMode::TrustedHeader => {
            let user_header = id.identity_header.as_deref().unwrap_or_default();
            for name in [Some(user_header), id.groups_header.as_deref()]
                .into_iter()
                .flatten()
            {
                if count(head.headers, name) > 1 {
                    return Err(duplicate(name));
                }
            }
            let trusted = head
                .peer
                .is_some_and(|ip| id.trusted_proxies.iter().any(|c| c.contains(ip)));
            if !trusted {
                return refuse("identity headers are honoured only from trusted proxies");
            }
            let Some(user) = header(head.headers, user_header).filter(|u| !u.is_empty()) else {
                return refuse("the trusted proxy sent no identity");
            };
            let groups = id
                .groups_header
                .as_deref()
                .and_then(|g| header(head.headers, g))
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            Ok(Caller::Verified(Subject {
                user: user.to_string(),
                groups,
            }))
        }
    }
}

fn duplicate(name: &str) -> Reply {
    let mut r = Reply::error(
        400,
        "invalid_request_error",
        format!("the {name} header was sent more than once"),
    );
    r.reason = "auth";
    r
}

fn count(headers: &[(String, String)], name: &str) -> usize {
    headers.iter().filter(|(n, _)| n == name).count()
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// A body change confined to the body's start: drop its first `drop` bytes and put
/// `prefix` in their place. The model is near the start of a request and the rest (the
/// conversation, up to megabytes) never needs to cross the wasm boundary again: Envoy's
/// body replacement at offset 0 drains and prepends without copying the rest. The
/// default edit drops nothing and adds nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixEdit {
    pub drop: usize,
    pub prefix: Vec<u8>,
}

impl PrefixEdit {
    /// The edit that puts `model` at `body[start..end]` (the model's JSON string); it
    /// needs only `body[..end]`.
    pub fn model(body_head: &[u8], start: usize, end: usize, model: &str) -> PrefixEdit {
        let end = end.min(body_head.len());
        PrefixEdit {
            drop: end,
            prefix: admit::splice_model(&body_head[..end], start, end, model),
        }
    }

    /// Whether the edit leaves `body` as it is (the model written is the one sent).
    pub fn keeps(&self, body: &[u8]) -> bool {
        body.get(..self.drop) == Some(self.prefix.as_slice())
    }

    /// The edited body (what Envoy holds after the edit).
    pub fn apply(&self, body: &[u8]) -> Vec<u8> {
        let mut out = self.prefix.clone();
        out.extend_from_slice(body.get(self.drop..).unwrap_or_default());
        out
    }
}

/// What to send upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    /// The body change, when the model moved into it.
    pub body: Option<PrefixEdit>,
    /// The replacement `:path`, when the model is in the path or a `key` was stripped.
    pub path: Option<String>,
    /// The cluster to route to (the route header's value).
    pub cluster: String,
    /// For the per-attempt stage ([`crate::attempt::Note`]; the glue adds the client's
    /// headers it needs).
    pub attempt_note: Option<Note>,
    /// The first pick's model and kind, for the stage's shortcut on its attempt
    /// ([`crate::attempt::passes_as_left`]).
    pub first_pick: Option<EndpointFacts>,
    /// Headers to set (after removing the client's).
    pub stamps: Vec<(String, String)>,
    /// For the metrics: ring, variant (`none` when unattributed), whether a decision ran.
    pub ring: String,
    pub variant: Option<String>,
    pub decision: Option<Decision>,
    /// The response side's account of a decided model call ([`crate::account`]).
    pub account: Option<account::Call>,
    /// What the breakers need to record the call's attempts; only for a call more than
    /// one target can serve (the spec's breakers exist only then).
    pub failover: Option<Failover>,
}

/// Body-time steps on the kill-list-applied snapshot `snap`. `scanned` is the body's scan
/// when the glue ran it while the body arrived ([`halo_policy::body_scan::Incremental`]);
/// `None` scans here. `now_unix_ms` is the host's clock (an exhausted budget's end is read
/// against it). `admit` is the target breakers' word on whether a call may lead
/// with a target ([`crate::breaker`]), asked in failover order only when more than one
/// target can serve the call.
pub fn on_body(
    cfg: &Config,
    snap: &Snapshot,
    pending: &Pending,
    body: &[u8],
    scanned: Option<Result<TopLevel, ScanError>>,
    now_unix_ms: i64,
    admit: &mut dyn FnMut(&Target) -> bool,
) -> Result<Forward, Reply> {
    let admission = match scanned {
        Some(scanned) => admit::admit_scanned(snap, &pending.method, &pending.path, body, scanned),
        None => admit::admit(snap, &pending.method, &pending.path, body),
    };
    let call = match (admission, &cfg.default_upstream) {
        // No policy route takes it (the model list, or another path): the default
        // upstream, when the gateway has one.
        (Ok(Admission::ListModels), Some(cluster)) => return Ok(to_default(cfg, cluster)),
        (Err(r), Some(cluster)) if r.status == 404 => return Ok(to_default(cfg, cluster)),
        (Ok(Admission::ListModels), None) => return list_models(cfg, snap),
        (Ok(Admission::Model(call)), _) => call,
        (Err(r), _) => return Err(Reply::from_refusal(&r, "admit")),
    };
    let mut call = call;
    let mut decision = decide::decide(snap, &pending.caller, &call.alias);
    // A spent `routeTo` budget of the caller's sends the alias to its cheaper one (the
    // list halo-server pushes); the budget check after this filter cannot move a call.
    if let Caller::Verified(s) = &pending.caller
        && !cfg.budgets_exhausted.is_empty()
    {
        let applying = halo_policy::budgets::applying(snap, s, &decision.ring);
        if let Some((_, to)) = halo_policy::budgets::rerouted(
            &applying,
            &cfg.budgets_exhausted,
            &call.alias,
            now_unix_ms,
        ) {
            call.alias = to.to_string();
            decision = decide::decide(snap, &pending.caller, &call.alias);
        }
    }
    let order = route::route_order(&decision.targets, pending.pick_key.as_deref(), &call.alias);
    if order.is_empty() {
        return Err(Reply::no_available_target(
            call.wire,
            &format!("no target routes {:?}", call.alias),
        ));
    }
    // Which targets can serve this call (wire, count_tokens): the first pick is the first
    // of them, and the aggregate walks only them.
    let class = cluster_names::CallClass::of(call.wire, call.operation);
    let usable: Vec<bool> = decision
        .targets
        .iter()
        .map(|t| class.serves(snap, t))
        .collect();
    let mut candidates = order.iter().filter(|t| usable[t.index]);
    let several = usable.iter().filter(|u| **u).count() > 1;
    let first = if several {
        // A target whose breaker is open leads no call; when every breaker is open, no
        // target is available.
        candidates.find(|t| admit(t.target)).ok_or_else(|| {
            Reply::no_available_target(call.wire, crate::request::ALL_FAILED_MESSAGE)
        })?
    } else {
        candidates.next().ok_or_else(|| {
            let mut r = Reply::error(
                502,
                "bad_upstream",
                "no target of this model can serve this API",
            );
            r.reason = "route";
            r
        })?
    };
    let target = first.target;
    let first_pick = snap.upstreams.get(&target.upstream).map(|u| EndpointFacts {
        model: target.model.clone(),
        kind: u.kind.as_str().to_string(),
        ..EndpointFacts::default()
    });
    // The aggregate cluster for (route scope, alias, first pick, call class): the same
    // name the xDS translator and the standalone bootstrap give it; Envoy walks its
    // failover order.
    let cluster = cluster_names::call_aggregate(
        snap,
        cluster_names::decision_scope(&decision),
        &call.alias,
        &decision.targets,
        first.index,
        class,
    );

    let mut new_body = None;
    let mut path = pending.path.clone();
    if call.model_in == ModelLocation::Path {
        path = rewrite_path_model(&path, call.wire, &target.model);
    }
    if call.wire == WireProtocol::Gemini {
        path = hygiene::strip_key_param(&path);
    }
    let note = match call.model_in {
        ModelLocation::Body { start, end } => {
            // admit recorded where the model sits while it decoded the body: no second
            // parse or walk of a possibly megabyte-long conversation.
            new_body = Some(PrefixEdit::model(body, start, end, &target.model));
            Note::after_splice(&call, &path, start, &target.model)
        }
        ModelLocation::Path => Note::in_path(&call, &path, &target.model),
    };

    let mut stamps = vec![(hygiene::RING.to_string(), decision.ring.clone())];
    if let Some(release) = &decision.release {
        stamps.push((hygiene::RELEASE.to_string(), release.clone()));
    }
    if let Some(a) = &decision.experiment {
        stamps.push((hygiene::EXPERIMENT.to_string(), a.experiment.clone()));
        stamps.push((hygiene::VARIANT.to_string(), a.variant.clone()));
    }
    stamps.push((cfg.route_header.clone(), cluster.clone()));
    Ok(Forward {
        attempt_note: Some(note),
        first_pick,
        body: new_body,
        path: (path != pending.path).then_some(path),
        cluster,
        ring: decision.ring.clone(),
        variant: decision.experiment.as_ref().map(|a| a.variant.clone()),
        stamps,
        account: account_of(snap, pending, &call, &decision),
        failover: several.then(|| Failover {
            alias: call.alias.clone(),
            targets: decision.targets.clone(),
            usable,
            lead: first.index,
            settings: cfg.breaker.clone(),
        }),
        decision: Some(decision),
    })
}

/// The account of a decided call: its unit is the subject hashed with the experiment's
/// salt when the call counts for one, else the ring's ([`assign::unit_salt`]); anonymous
/// callers share the unit of the empty subject.
fn account_of(
    snap: &Snapshot,
    pending: &Pending,
    call: &admit::ModelCall,
    decision: &Decision,
) -> Option<account::Call> {
    let experiment_salt = decision
        .experiment
        .as_ref()
        .and_then(|a| snap.experiment(&a.experiment))
        .map(|e| e.salt.as_str());
    let salt = assign::unit_salt(experiment_salt, &decision.ring);
    let (user, budgets) = match &pending.caller {
        Caller::Verified(s) => {
            let keys: Vec<_> = halo_policy::budgets::applying(snap, s, &decision.ring)
                .into_iter()
                .map(|a| a.key)
                .collect();
            let budgets = (!keys.is_empty()).then(|| halo_policy::budgets::encode_keys(&keys));
            (s.user.as_str(), budgets)
        }
        // Anonymous callers have no subject to budget.
        Caller::Anonymous => ("", None),
    };
    account::Call::new(
        call.wire,
        call.operation,
        assign::unit(&salt, user),
        call.alias.clone(),
        budgets,
    )
}

/// A request no policy route takes, to the default upstream's `cluster` as it came (less
/// the client's credentials without forwardAuth): no decision, no account.
fn to_default(cfg: &Config, cluster: &str) -> Forward {
    Forward {
        attempt_note: None,
        first_pick: None,
        body: None,
        path: None,
        cluster: cluster.to_string(),
        stamps: vec![(cfg.route_header.clone(), cluster.to_string())],
        ring: decide::UNKNOWN_RING.to_string(),
        variant: None,
        decision: None,
        account: None,
        failover: None,
    }
}

/// GET /v1/models passes through, to the upstream of the `default` alias's first target,
/// else the first alias (by name) whose first target speaks the Anthropic wire (Claude
/// Code is the client that lists models), else any: a model list needs no decision, only
/// somewhere to ask.
fn list_models(cfg: &Config, snap: &Snapshot) -> Result<Forward, Reply> {
    let anthropic = |t: &&halo_policy::types::Target| {
        route::can_serve(snap, t, WireProtocol::AnthropicMessages)
    };
    fn first<'s>(
        (alias, t): (&'s String, &'s Vec<halo_policy::types::Target>),
    ) -> Option<(&'s str, &'s halo_policy::types::Target)> {
        t.first().map(|t| (alias.as_str(), t))
    }
    let alias = snap
        .models
        .get_key_value("default")
        .and_then(first)
        .or_else(|| {
            snap.models
                .iter()
                .filter_map(first)
                .find(|(_, t)| anthropic(t))
        })
        .or_else(|| snap.models.iter().find_map(first))
        .map(|(alias, _)| alias);
    let Some(alias) = alias else {
        let mut r = Reply::error(503, "no_available_target", "the policy routes no model");
        r.reason = "route";
        return Err(r);
    };
    // The gateway route's aggregate whose first pick is the alias's first target.
    let cluster = cluster_names::aggregate_cluster(cluster_names::RouteScope::Gateway, alias, 0);
    Ok(Forward {
        attempt_note: None,
        first_pick: None,
        body: None,
        path: None,
        cluster: cluster.clone(),
        stamps: vec![(cfg.route_header.clone(), cluster)],
        ring: decide::UNKNOWN_RING.to_string(),
        variant: None,
        decision: None,
        account: None,
        failover: None,
    })
}

/// Put the target's model id into a path that carries the model (bedrock `/model/{id}/op`,
/// gemini `/v1beta/models/{model}:op`), percent-encoded; the query is kept.
pub fn rewrite_path_model(path: &str, wire: WireProtocol, model: &str) -> String {
    let (base, query) = match path.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (path, None),
    };
    let encoded = percent_encode(model);
    let rewritten = match wire {
        WireProtocol::BedrockInvoke => base
            .strip_prefix("/model/")
            .and_then(|rest| rest.rsplit_once('/'))
            .map(|(_, op)| format!("/model/{encoded}/{op}")),
        WireProtocol::Gemini => base
            .strip_prefix("/v1beta/models/")
            .and_then(|rest| rest.rsplit_once(':'))
            .map(|(_, op)| format!("/v1beta/models/{encoded}:{op}")),
        _ => None,
    }
    .unwrap_or_else(|| base.to_string());
    match query {
        Some(q) => format!("{rewritten}?{q}"),
        None => rewritten,
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
