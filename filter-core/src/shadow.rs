//! Shadow jobs: a copy of a sampled model call, as the shadow variant's target must
//! receive it, for the mirror service (spec: Request path 9, "Mirror").
//!
//! decide names the mirror ([`halo_policy::decide::ShadowMirror`]: a running, unkilled
//! shadow experiment whose assigned variant routes the alias). This module decides
//! whether this step is mirrored and builds the job:
//!
//! - **Which steps**: `turns: first` mirrors the first turn of a session only, read from
//!   the conversation itself: a request that carries no model turn yet (no `assistant`
//!   message, no `model` content, no earlier response or function call). The gateway keeps
//!   no per-session state, so a later turn is recognised by its history, which every
//!   coding tool resends. `turns: all` mirrors every step.
//! - **What a job carries**: the treatment target (upstream, model), the request as an
//!   attempt on that target would send it (the per-attempt stage's own plan:
//!   [`crate::attempt::plan`], the model spliced or the body translated), the wire headers
//!   a translation reads ([`crate::attempt::RESTORED_HEADERS`]) and those the translation
//!   sets, and for evidence the ring, experiment, variant, alias and the salted unit hash.
//! - **What it never carries**: a client credential (Authorization, x-api-key, api-key,
//!   x-goog-api-key, Proxy-Authorization), a cookie, an identity or groups header, an
//!   x-halo-* header, a session id, the user: headers are an allowlist, not a denylist, so
//!   a header this module does not know never travels.
//! - **Bounds**: a request body over `shadow.maxBytes` is not looked at, and a job body
//!   over it is not sent (both counted `too_large`).
//!
//! The job is sent by the request filter with an asynchronous HTTP callout
//! ([`crate::host::Host::dispatch`]) to the mirror service's cluster, which Envoy bounds
//! (the cluster's circuit breakers); the live call never waits for it.

use halo_contract::shadow::ShadowJob;
use halo_policy::Snapshot;
use halo_policy::cluster_names::{CallClass, EndpointFacts};
use halo_policy::decide::ShadowMirror;
use halo_policy::route;
use halo_policy::types::{ShadowTurns, WireProtocol};
use serde::Deserialize;

use crate::attempt::{self, Note, RESTORED_HEADERS, Work};
use crate::config::ShadowSettings;

/// Why a decided mirror sends nothing: the `outcome` of the `shadow_jobs` counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// `turns: first` and the conversation already has a model turn.
    LaterTurn,
    /// The request, or the job built from it, is larger than `shadow.maxBytes`.
    TooLarge,
    /// No target of the shadow route can serve this call (wire, count_tokens), or its
    /// translation refused the request.
    NotServed,
}

impl Skip {
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::LaterTurn => "later_turn",
            Skip::TooLarge => "too_large",
            Skip::NotServed => "not_served",
        }
    }
}

/// The counter outcome of a job handed to Envoy.
pub const SENT: &str = "sent";
/// The counter outcome of a job Envoy refused to start (no such cluster, or the cluster's
/// circuit breaker is open).
pub const NOT_SENT: &str = "not_sent";

/// A shadow job: the envelope (halo-envoy-config's [`ShadowJob`], shared with the mirror
/// service) and the request body for the target, which [`Job::envelope`] writes into it.
#[derive(Debug, Clone)]
pub struct Job {
    pub meta: ShadowJob,
    /// The request body for the target (JSON: every wire's request is a JSON document).
    pub body: Vec<u8>,
}

impl Job {
    /// The body of the POST to the mirror service ([`ShadowJob::encode`]).
    pub fn envelope(&self) -> Vec<u8> {
        self.meta.encode(&self.body)
    }
}

/// What [`build`] needs of the decided call.
pub struct Call<'a> {
    pub snap: &'a Snapshot,
    pub mirror: &'a ShadowMirror,
    pub ring: &'a str,
    /// The caller's user (hashed here into the unit, never carried).
    pub user: &'a str,
    /// The sticky route key (user + session), for the pick among the shadow targets.
    pub pick_key: Option<&'a str>,
    /// The alias the client asked for.
    pub alias: &'a str,
    /// The request filter's note for its first pick and the body as the request filter
    /// leaves it (the first pick's model in it): what every attempt starts from.
    pub note: &'a Note,
    pub body: &'a [u8],
    pub now_unix_ms: u64,
}

/// The job for a decided mirror, or why none is sent.
pub fn build(settings: &ShadowSettings, c: &Call<'_>) -> Result<Job, Skip> {
    if u64::try_from(c.body.len()).unwrap_or(u64::MAX) > settings.max_bytes {
        return Err(Skip::TooLarge);
    }
    if c.mirror.turns == ShadowTurns::First && !first_turn(c.note.wire, c.body) {
        return Err(Skip::LaterTurn);
    }
    let class = CallClass::of(c.note.wire, c.note.op);
    let alias = c.alias;
    let target = route::route_order(&c.mirror.targets, c.pick_key, alias)
        .into_iter()
        .map(|t| t.target)
        .find(|t| class.serves(c.snap, t))
        .ok_or(Skip::NotServed)?;
    let upstream = c
        .snap
        .upstreams
        .get(&target.upstream)
        .ok_or(Skip::NotServed)?;
    let host = halo_policy::validate::parse_http_url(&upstream.url)
        .map(|u| u.host.to_string())
        .unwrap_or_default();
    let facts = EndpointFacts::of(upstream, &target.model, &host);
    let plan = attempt::plan(c.note, Some(&facts));
    // The wire headers the client sent, as every attempt restores them: an allowlist.
    let mut headers: Vec<(String, String)> = plan
        .restore
        .iter()
        .filter(|(name, _)| RESTORED_HEADERS.contains(name))
        .filter_map(|(name, value)| Some((name.to_string(), value.clone()?)))
        .collect();
    let (method, path, body) = match plan.work {
        Work::Skip(_) => return Err(Skip::NotServed),
        Work::None => ("POST".to_string(), plan.path, c.body.to_vec()),
        Work::Splice { start, end, model } => {
            let edit = attempt::rewrite_head(
                c.body.get(..end.min(c.body.len())).unwrap_or_default(),
                start,
                end,
                &model,
            )
            .ok_or(Skip::NotServed)?;
            ("POST".to_string(), plan.path, edit.apply(c.body))
        }
        Work::Translate { upstream, model } => {
            let out = attempt::translate(c.note, &upstream, &model, c.body)
                .map_err(|_| Skip::NotServed)?;
            headers.retain(|(name, _)| {
                !out.remove_headers.contains(&name.as_str())
                    && !out
                        .remove_header_prefixes
                        .iter()
                        .any(|p| name.starts_with(p))
            });
            for (name, value) in out.set_headers {
                headers.retain(|(n, _)| n != name);
                headers.push((name.to_string(), value));
            }
            (out.method.to_string(), out.path, out.body)
        }
    };
    if u64::try_from(body.len()).unwrap_or(u64::MAX) > settings.max_bytes {
        return Err(Skip::TooLarge);
    }
    let salt = c
        .snap
        .experiment(&c.mirror.experiment)
        .map(|e| e.salt.as_str());
    let unit = halo_policy::assign::unit(&halo_policy::assign::unit_salt(salt, c.ring), c.user);
    Ok(Job {
        meta: ShadowJob {
            built_unix_ms: c.now_unix_ms,
            ring: c.ring.to_string(),
            experiment: c.mirror.experiment.clone(),
            variant: c.mirror.variant.clone(),
            alias: alias.to_string(),
            unit,
            upstream: target.upstream.clone(),
            model: target.model.clone(),
            method,
            path,
            stream: c.note.stream,
            headers,
            body: None,
        },
        body,
    })
}

/// The request headers of the callout to the mirror service that carries `job`.
pub fn callout_headers(settings: &ShadowSettings, body_len: usize) -> Vec<(String, String)> {
    vec![
        (":method".into(), "POST".into()),
        (":path".into(), settings.path.clone()),
        (":authority".into(), settings.authority.clone()),
        ("authorization".into(), format!("Bearer {}", settings.token)),
        ("content-type".into(), "application/json".into()),
        ("content-length".into(), body_len.to_string()),
    ]
}

/// Whether a request body of `wire` is the first turn of its conversation: it carries no
/// model turn yet. A body that does not read as that wire's request counts as a later
/// turn (nothing is mirrored on a guess).
pub fn first_turn(wire: WireProtocol, body: &[u8]) -> bool {
    // Only the fields that tell are decoded; every other field is skipped unread.
    #[derive(Deserialize)]
    struct Turn {
        #[serde(default)]
        role: Option<String>,
        #[serde(default, rename = "type")]
        kind: Option<String>,
    }
    #[derive(Deserialize)]
    struct Messages {
        #[serde(default)]
        messages: Vec<Turn>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Input {
        Text(#[allow(dead_code)] String),
        Items(Vec<Turn>),
    }
    #[derive(Deserialize)]
    struct Responses {
        #[serde(default)]
        input: Option<Input>,
        #[serde(default)]
        previous_response_id: Option<serde::de::IgnoredAny>,
    }
    #[derive(Deserialize)]
    struct Contents {
        #[serde(default)]
        contents: Vec<Turn>,
    }
    let said = |t: &Turn, role: &str| t.role.as_deref() == Some(role);
    match wire {
        WireProtocol::AnthropicMessages | WireProtocol::BedrockInvoke => {
            serde_json::from_slice::<Messages>(body)
                .is_ok_and(|m| !m.messages.iter().any(|t| said(t, "assistant")))
        }
        WireProtocol::OpenaiResponses => serde_json::from_slice::<Responses>(body).is_ok_and(|r| {
            r.previous_response_id.is_none()
                && match r.input {
                    None | Some(Input::Text(_)) => true,
                    Some(Input::Items(items)) => !items.iter().any(|t| {
                        said(t, "assistant")
                            || matches!(
                                t.kind.as_deref(),
                                Some("function_call" | "function_call_output" | "reasoning")
                            )
                    }),
                }
        }),
        WireProtocol::Gemini => serde_json::from_slice::<Contents>(body)
            .is_ok_and(|c| !c.contents.iter().any(|t| said(t, "model"))),
    }
}
