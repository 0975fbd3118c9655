//! The per-attempt stage: each upstream attempt gets its own target's request.
//!
//! Envoy walks a route's failover order itself (an aggregate cluster and a retry policy),
//! so the request filter, which runs once, can only shape the request for the first pick.
//! The same module, configured with `{"stage": "attempt"}`, also runs as an upstream HTTP
//! filter on every aggregate cluster: once per attempt, after Envoy chose the endpoint.
//! It reads that endpoint's metadata (`filter_metadata.halo`: `model`, `kind`, and the
//! upstream settings a translation reads: `region`, `project`, `apiVersion`; written by the
//! xDS translator and the standalone bootstrap) and builds the attempt's request:
//!
//! - a kind that takes the client's wire as is (orchestrator, anthropic, openai, bedrock on
//!   the bedrock wire, gemini): only the model changes, spliced where the request filter
//!   noted it ([`Work::Splice`], no copy of the body beyond its head) or rewritten in the
//!   path;
//! - a kind that needs another request (bedrock for an Anthropic client, vertex,
//!   azure-openai): [`halo_providers::translate`] on the whole body ([`Work::Translate`]);
//! - a kind that cannot serve the client's wire or operation: [`Work::Skip`] (answered
//!   502 bad_upstream by the stage: an upstream filter's own answer is not retried by
//!   Envoy, so the request ends there).
//!
//! The request filter leaves a [`Note`] in a filter-state property of the request
//! ([`ATTEMPT_PROPERTY`], JSON), not a header: Envoy hands every attempt's upstream filters
//! the SAME request header map (`:path` and headers changed by attempt 1 are what attempt 2
//! sees), while the body starts fresh for each attempt (a copy of what the request filter
//! left). So the note carries everything the stage needs from the original request: the
//! model's place and id, wire, operation, stream flag, the `:path` as the request filter
//! left it and the client's values of the headers a translation changes
//! ([`RESTORED_HEADERS`]); every attempt first puts those back, then applies its own
//! changes. A client cannot set filter state.

use halo_policy::admit::{ModelCall, ModelLocation, Operation};
use halo_policy::cluster_names::EndpointFacts;
use halo_policy::types::{Upstream, UpstreamKind, WireProtocol};
use halo_providers::{Inbound, Outbound, Skip};
use serde::{Deserialize, Serialize};

use crate::pipeline::PrefixEdit;

/// The request filter's note to the per-attempt stage: a filter-state property of the
/// request (Envoy's `wasm.` namespace), which every attempt's upstream filter can read.
pub const ATTEMPT_PROPERTY: &str = "halo_attempt";

/// Headers some translation changes or removes: every attempt starts from the client's
/// values (or their absence).
pub const RESTORED_HEADERS: [&str; 4] = [
    "anthropic-version",
    "anthropic-beta",
    "content-type",
    "accept",
];

/// Client headers carrying a credential: never sent to a credentialed kind, whatever
/// forwardAuth says (the gateway's own credential is added after this stage). With
/// forwardAuth the request filter keeps them and notes them, so a pass-through target
/// later in the failover order still gets them.
pub const CLIENT_CREDENTIAL_HEADERS: [&str; 5] = [
    "authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "proxy-authorization",
];

/// Where the model id sits in the request the router replays to each attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelAt {
    /// `body[start..end]` is the model's JSON string, quotes included.
    Body { start: usize, end: usize },
    /// The model is a path segment of the wire (bedrock `/model/{id}/op`, gemini).
    Path,
}

/// What the request filter wrote, and what the stage needs of the original request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Note {
    pub at: ModelAt,
    /// The model id the request filter wrote (the first pick's).
    pub model: String,
    pub wire: WireProtocol,
    pub op: Operation,
    pub stream: bool,
    /// `:path` as the request filter left it (model rewritten, gemini `key` stripped).
    pub path: String,
    /// The client's values of [`RESTORED_HEADERS`] it sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
}

impl Note {
    /// The property value: two lines for [`passes_as_left`], then the note as JSON. The
    /// first line is `first_pick`'s [`EndpointFacts::identity`] when an attempt on that
    /// endpoint sends the request exactly as the request filter leaves it (empty
    /// otherwise); the second is the `:path` the request filter left.
    pub fn encode(&self, first_pick: Option<&EndpointFacts>) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        if let Some(facts) =
            first_pick.filter(|facts| plan(self, Some(facts)).keeps_filtered_request(self))
        {
            facts.write_identity(&mut out);
        }
        out.push(b'\n');
        out.extend_from_slice(self.path.as_bytes());
        out.push(b'\n');
        // A note of strings and numbers always serializes.
        let _ = serde_json::to_writer(&mut out, self);
        out
    }

    /// Read a value written by [`Note::encode`]; `None` for anything else.
    pub fn decode(value: &[u8]) -> Option<Note> {
        let json = value.splitn(3, |&b| b == b'\n').nth(2)?;
        let note: Note = serde_json::from_slice(json).ok()?;
        match note.at {
            ModelAt::Body { start, end } if start >= end => None,
            _ => Some(note),
        }
    }

    /// The note for a body after [`halo_policy::admit::splice_model`] wrote `model` at
    /// `start`: the range of the JSON string now there.
    pub fn after_splice(call: &ModelCall, path: &str, start: usize, model: &str) -> Note {
        let len = serde_json::to_string(model).map_or(model.len() + 2, |s| s.len());
        Note {
            at: ModelAt::Body {
                start,
                end: start + len,
            },
            ..Note::in_path(call, path, model)
        }
    }

    /// The note for a model in the path (`path` already names it).
    pub fn in_path(call: &ModelCall, path: &str, model: &str) -> Note {
        Note {
            at: ModelAt::Path,
            model: model.to_string(),
            wire: call.wire,
            op: call.operation,
            stream: call.stream,
            path: path.to_string(),
            headers: Vec::new(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Whether an attempt needs nothing from the stage, read from the property `value` (what
/// [`Note::encode`] wrote), the endpoint's facts as written (`facts`) and the request's
/// `:path`, without decoding either: the endpoint is the one the request filter shaped the
/// request for, and no earlier attempt changed the shared header map (the `:path` is the
/// one the filter left; see [`Plan::keeps_filtered_request`]). Then the full [`plan`]
/// would keep the request too, so the common first attempt costs two reads and two
/// compares.
pub fn passes_as_left(value: &[u8], facts: Option<&[u8]>, path: Option<&str>) -> bool {
    let mut lines = value.splitn(3, |&b| b == b'\n');
    let (Some(identity), Some(left_path), Some(facts), Some(path)) =
        (lines.next(), lines.next(), facts, path)
    else {
        return false;
    };
    !identity.is_empty() && facts.starts_with(identity) && left_path == path.as_bytes()
}

/// The upstream a translation needs, from the chosen endpoint's facts.
fn upstream_of(facts: &EndpointFacts) -> Option<Upstream> {
    let kind: UpstreamKind =
        serde_json::from_value(serde_json::Value::String(facts.kind.clone())).ok()?;
    Some(Upstream {
        url: String::new(),
        kind,
        region: facts.region.clone(),
        project: facts.project.clone(),
        api_version: facts.api_version.clone(),
        credential: None,
    })
}

/// What an attempt needs besides the header reset.
#[derive(Debug, Clone, PartialEq)]
pub enum Work {
    /// Send as is.
    None,
    /// Replace `body[start..end]` with `model` as a JSON string, once the body is in.
    Splice {
        start: usize,
        end: usize,
        model: String,
    },
    /// Translate the whole body for this upstream and model, once the body is in.
    Translate {
        upstream: Box<Upstream>,
        model: String,
    },
    /// This target cannot serve the request.
    Skip(Skip),
}

/// The attempt's plan, decided at request-headers time.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Each [`RESTORED_HEADERS`] entry set to the client's value or removed.
    pub restore: Vec<(&'static str, Option<String>)>,
    /// `:path` for this attempt (set when it differs from the current one).
    pub path: String,
    /// `:authority` for an attempt that is SigV4-signed, set before the signer runs (Envoy's
    /// auto_host_rewrite writes the same value, but only after the upstream filters).
    pub authority: Option<String>,
    /// Headers to remove, and every header starting with one of `remove_prefixes`.
    pub remove: Vec<&'static str>,
    pub remove_prefixes: Vec<&'static str>,
    pub work: Work,
}

impl Plan {
    /// Whether this plan writes nothing into a request the request filter left as it is:
    /// same `:path`, no work on the body, nothing to remove, no credential to put back,
    /// no signing host. On the first attempt to the first pick this is the common case,
    /// and the stage then skips every header write (each is a call out of the VM).
    ///
    /// The caller must also know that no earlier attempt changed the shared header map.
    /// Every change an attempt makes that matters to a later one comes with another
    /// `:path` (a translation, or a model in the path), so a `:path` equal to the note's
    /// is that proof; a splice only drops `content-length`, which Envoy then frames.
    pub fn keeps_filtered_request(&self, note: &Note) -> bool {
        matches!(self.work, Work::None)
            && self.path == note.path
            && self.authority.is_none()
            && self.remove.is_empty()
            && self.remove_prefixes.is_empty()
            && self
                .restore
                .iter()
                .all(|(header, _)| RESTORED_HEADERS.contains(header))
    }
}

/// Whether `kind` needs another request than the client's for `wire`.
pub fn translates(kind: UpstreamKind, wire: WireProtocol) -> bool {
    matches!(
        (kind, wire),
        (UpstreamKind::Bedrock, WireProtocol::AnthropicMessages)
            | (UpstreamKind::Vertex, _)
            | (UpstreamKind::AzureOpenai, _)
    )
}

/// The plan for an attempt on the endpoint described by `facts`. An endpoint without them
/// (a cluster not rendered by Halos) gets the request as the request filter left it.
pub fn plan(note: &Note, facts: Option<&EndpointFacts>) -> Plan {
    let mut restore: Vec<(&'static str, Option<String>)> = RESTORED_HEADERS
        .iter()
        .map(|h| (*h, note.header(h).map(str::to_string)))
        .collect();
    // With forwardAuth the client's credential is in the note: put it back on every
    // attempt (the credential chain's reset strips it from the shared header map), and
    // take it off again below for kinds that get the gateway's own credential.
    restore.extend(
        CLIENT_CREDENTIAL_HEADERS
            .iter()
            .filter_map(|h| Some((*h, Some(note.header(h)?.to_string())))),
    );
    let mut out = Plan {
        restore,
        path: note.path.clone(),
        authority: None,
        remove: Vec::new(),
        remove_prefixes: Vec::new(),
        work: Work::None,
    };
    let Some(facts) = facts else {
        return out;
    };
    let model = facts.model.as_str();
    let upstream = upstream_of(facts);
    if let Some(u) = &upstream {
        let kind = u.kind;
        if !kind.serves(note.wire) {
            out.work = Work::Skip(Skip::WireNotServed {
                kind,
                wire: note.wire,
            });
            return out;
        }
        if note.op == Operation::CountTokens
            && matches!(kind, UpstreamKind::Bedrock | UpstreamKind::Vertex)
        {
            out.work = Work::Skip(Skip::CountTokensUnsupported { kind });
            return out;
        }
        if kind.is_credentialed() {
            out.remove.extend(CLIENT_CREDENTIAL_HEADERS);
        }
        if kind == UpstreamKind::Bedrock {
            out.remove_prefixes.extend(["x-amz-", "x-amzn-"]);
            out.authority = Some(facts.host.clone()).filter(|h| !h.is_empty());
        }
        if translates(kind, note.wire) {
            out.work = Work::Translate {
                upstream: Box::new(u.clone()),
                model: model.to_string(),
            };
            return out;
        }
    }
    match note.at {
        ModelAt::Body { .. } if model == note.model => {}
        ModelAt::Body { start, end } => {
            out.work = Work::Splice {
                start,
                end,
                model: model.to_string(),
            };
        }
        ModelAt::Path => {
            out.path = crate::pipeline::rewrite_path_model(&note.path, note.wire, model);
        }
    }
    out
}

/// The translated request for `body` (the body as the request filter left it: the note's
/// range holds the first pick's model).
pub fn translate(
    note: &Note,
    upstream: &Upstream,
    model: &str,
    body: &[u8],
) -> Result<Outbound, Skip> {
    let call = ModelCall {
        wire: note.wire,
        operation: note.op,
        alias: note.model.clone(),
        stream: note.stream,
        model_in: match note.at {
            ModelAt::Body { start, end } => ModelLocation::Body { start, end },
            ModelAt::Path => ModelLocation::Path,
        },
    };
    let inbound = Inbound {
        call: &call,
        path: &note.path,
        body,
        anthropic_beta: note.header("anthropic-beta"),
    };
    halo_providers::translate(&inbound, upstream, model)
}

/// The edit putting `model` at `head[start..end]`, where `head` is the body's first
/// `end` bytes (or all of it), or `None` when that range does not hold a JSON string (the
/// body is not the one the note was written for): the attempt is then sent as is rather
/// than corrupted.
pub fn rewrite_head(head: &[u8], start: usize, end: usize, model: &str) -> Option<PrefixEdit> {
    let span = head.get(start..end)?;
    if span.len() < 2 || span[0] != b'"' || span[span.len() - 1] != b'"' {
        return None;
    }
    Some(PrefixEdit::model(head, start, end, model))
}

/// The client's values of the headers an attempt restores ([`RESTORED_HEADERS`]) and,
/// when hygiene kept them (forwardAuth), its credentials, for [`Note::headers`]: from the
/// request headers as the request filter read them, less what hygiene removes.
pub fn noted_headers(headers: &[(String, String)], removals: &[String]) -> Vec<(String, String)> {
    RESTORED_HEADERS
        .iter()
        .chain(CLIENT_CREDENTIAL_HEADERS.iter())
        .filter(|h| !removals.iter().any(|r| r == *h))
        .filter_map(|h| headers.iter().find(|(n, _)| n == h).cloned())
        .collect()
}

/// True when an attempt's answer is to be converted to SSE: a 200 carrying Bedrock's
/// event stream. Any other answer (an error in JSON) goes to the client as written.
pub fn converts_answer(status: Option<&str>, content_type: Option<&str>) -> bool {
    status == Some("200")
        && content_type
            .is_some_and(|v| v.starts_with(halo_providers::eventstream::EVENTSTREAM_CONTENT_TYPE))
}

/// One piece of a Bedrock answer converted to the SSE events it completes. `Err` carries
/// the reason to log once the stream turned unreadable; the events then end with an SSE
/// `error` event, and the caller drops the converter.
pub fn convert_piece(
    conv: &mut halo_providers::eventstream::EventStreamToSse,
    piece: &[u8],
) -> Result<Vec<u8>, (Vec<u8>, String)> {
    conv.feed(piece).map_err(|e| {
        let why = e.to_string();
        (sse_error(&why), why)
    })
}

/// The events that close a converted stream: nothing, or an SSE `error` event when the
/// stream ended inside an event.
pub fn finish_conversion(conv: &halo_providers::eventstream::EventStreamToSse) -> Vec<u8> {
    conv.finish()
        .map_or_else(|e| sse_error(&e.to_string()), |()| Vec::new())
}

/// An Anthropic SSE `error` event.
pub fn sse_error(message: &str) -> Vec<u8> {
    let data =
        serde_json::json!({"type": "error", "error": {"type": "api_error", "message": message}});
    format!("event: error\ndata: {data}\n\n").into_bytes()
}

/// True the first time a translation drop `cause` is reported in this process (or VM),
/// so each cause is logged once.
pub fn first_report_of(cause: &'static str) -> bool {
    static REPORTED: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut reported = REPORTED.lock().unwrap_or_else(|e| e.into_inner());
    if reported.contains(&cause) {
        return false;
    }
    reported.push(cause);
    true
}

/// The 502 an attempt that cannot be served is answered with.
pub fn skip_reply(skip: &Skip) -> Vec<u8> {
    serde_json::json!({"type": "error", "error": {"type": "bad_upstream", "message": skip.to_string()}})
        .to_string()
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_note_keeps_the_clients_restored_headers_and_kept_credentials_only() {
        let h = |n: &str, v: &str| (n.to_string(), v.to_string());
        let headers = vec![
            h(":path", "/v1/messages"),
            h("anthropic-version", "2023-06-01"),
            h("authorization", "Bearer t"),
            h("x-other", "1"),
        ];
        let noted = noted_headers(&headers, &["authorization".to_string()]);
        assert!(
            noted
                .iter()
                .all(|(n, _)| n != "authorization" && n != "x-other")
        );
        let kept = noted_headers(&headers, &[]);
        assert!(kept.contains(&h("authorization", "Bearer t")), "{kept:?}");
    }

    #[test]
    fn only_a_200_event_stream_is_converted_and_a_bad_stream_ends_in_an_sse_error() {
        let es = halo_providers::eventstream::EVENTSTREAM_CONTENT_TYPE;
        assert!(converts_answer(Some("200"), Some(es)));
        assert!(!converts_answer(Some("400"), Some(es)));
        assert!(!converts_answer(Some("200"), Some("application/json")));
        assert!(!converts_answer(None, None));
        let mut conv = halo_providers::eventstream::EventStreamToSse::new();
        // A frame whose declared length is absurdly small is unreadable.
        let (events, why) = convert_piece(&mut conv, &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0])
            .expect_err("unreadable");
        assert!(!why.is_empty());
        let text = String::from_utf8(events).expect("utf8");
        assert!(text.starts_with("event: error\n"), "{text}");
        // A stream cut inside a frame closes with an error event; a clean one with nothing.
        let mut cut = halo_providers::eventstream::EventStreamToSse::new();
        let _ = convert_piece(&mut cut, &[0, 0]);
        assert!(!finish_conversion(&cut).is_empty());
        let clean = halo_providers::eventstream::EventStreamToSse::new();
        assert!(finish_conversion(&clean).is_empty());
    }

    fn call(wire: WireProtocol, op: Operation, stream: bool) -> ModelCall {
        ModelCall {
            wire,
            operation: op,
            alias: "a".into(),
            stream,
            model_in: ModelLocation::Path,
        }
    }

    fn messages_note(model: &str) -> Note {
        let mut n = Note::after_splice(
            &call(WireProtocol::AnthropicMessages, Operation::Messages, true),
            "/v1/messages",
            9,
            model,
        );
        n.headers = vec![
            ("anthropic-version".into(), "2023-06-01".into()),
            ("anthropic-beta".into(), "b1,b2".into()),
        ];
        n
    }

    fn endpoint(model: &str, kind: &str) -> EndpointFacts {
        EndpointFacts {
            model: model.into(),
            kind: kind.into(),
            host: format!("{kind}.example"),
            region: Some("us-east-1".into()),
            ..EndpointFacts::default()
        }
    }

    #[test]
    fn notes_round_trip_and_garbage_is_ignored() {
        let n = messages_note("claude \"x\"");
        let first = endpoint("claude \"x\"", "anthropic");
        assert_eq!(Note::decode(&n.encode(Some(&first))), Some(n.clone()));
        assert_eq!(Note::decode(&n.encode(None)), Some(n));
        let p = Note::in_path(
            &call(WireProtocol::BedrockInvoke, Operation::Invoke, false),
            "/model/a.m%3A0/invoke",
            "a.m:0",
        );
        assert_eq!(Note::decode(&p.encode(None)), Some(p));
        let mut bad_range = messages_note("m");
        bad_range.at = ModelAt::Body { start: 5, end: 5 };
        let json_alone = serde_json::to_vec(&messages_note("m")).expect("json");
        for bad in [
            &b""[..],
            b"body 1 2 m",
            b"\n\n{}",
            &json_alone,
            &bad_range.encode(None),
        ] {
            assert_eq!(Note::decode(bad), None, "{bad:?}");
        }
    }

    /// The stage's shortcut against the full plan: it lets an attempt pass only when the
    /// plan would keep the request and the `:path` is the one the request filter left, and
    /// it does on the first pick of a pass-through target.
    #[test]
    fn an_attempt_passes_as_left_only_where_the_plan_keeps_the_request() {
        let notes = [
            messages_note("m-a"),
            {
                let mut n = messages_note("m-a");
                n.headers.push(("x-api-key".into(), "client-key".into()));
                n
            },
            Note::in_path(
                &call(WireProtocol::BedrockInvoke, Operation::Invoke, false),
                "/model/m-a/invoke",
                "m-a",
            ),
            Note::in_path(
                &call(WireProtocol::Gemini, Operation::Generate, false),
                "/v1beta/models/m-a:generateContent",
                "m-a",
            ),
        ];
        let kinds = [
            "anthropic",
            "bedrock",
            "openai",
            "vertex",
            "gemini",
            "orchestrator",
        ];
        // The first pick's facts as the request filter has them: model and kind only.
        let firsts: Vec<EndpointFacts> = kinds
            .iter()
            .flat_map(|k| {
                ["m-a", "m-b"].map(|m| EndpointFacts {
                    model: m.into(),
                    kind: (*k).into(),
                    ..EndpointFacts::default()
                })
            })
            .collect();
        // The picked endpoints' facts as the renderers write them, with and without a host
        // and the translation settings.
        let endpoints: Vec<EndpointFacts> = kinds
            .iter()
            .flat_map(|k| {
                [
                    endpoint("m-a", k),
                    endpoint("m-b", k),
                    EndpointFacts {
                        host: String::new(),
                        region: None,
                        ..endpoint("m-a", k)
                    },
                ]
            })
            .collect();
        let mut passed = 0;
        for note in &notes {
            for first in &firsts {
                let value = note.encode(Some(first));
                for picked in &endpoints {
                    let facts = picked.encode();
                    for path in [note.path.as_str(), "/changed"] {
                        let fast = passes_as_left(&value, Some(facts.as_bytes()), Some(path));
                        let full = plan(note, Some(picked)).keeps_filtered_request(note)
                            && path == note.path;
                        assert!(
                            !fast || full,
                            "{note:?} first {first:?} picked {picked:?} {path}"
                        );
                        if fast {
                            passed += 1;
                        }
                    }
                }
            }
        }
        assert!(passed > 0, "the first pick of a pass-through target passes");
        let note = messages_note("m-a");
        let first = endpoint("m-a", "anthropic");
        let value = note.encode(Some(&first));
        let facts = first.encode();
        assert!(passes_as_left(
            &value,
            Some(facts.as_bytes()),
            Some("/v1/messages")
        ));
        // Without the endpoint's facts or the path: the full plan decides.
        assert!(!passes_as_left(&value, None, Some("/v1/messages")));
        assert!(!passes_as_left(&value, Some(facts.as_bytes()), None));
    }

    #[test]
    fn every_attempt_restores_the_clients_headers_and_path() {
        let note = messages_note("m-a");
        let p = plan(&note, Some(&endpoint("m-a", "anthropic")));
        assert_eq!(p.path, "/v1/messages");
        assert_eq!(p.work, Work::None);
        assert!(p.remove.is_empty(), "anthropic keeps forwarded auth");
        assert!(
            p.restore
                .contains(&("anthropic-beta", Some("b1,b2".into())))
        );
        assert!(p.restore.contains(&("content-type", None)));
    }

    #[test]
    fn a_forwarded_client_credential_returns_for_pass_through_kinds_only() {
        let mut note = messages_note("m-a");
        note.headers.push(("x-api-key".into(), "client-key".into()));
        let pass = plan(&note, Some(&endpoint("m-a", "anthropic")));
        assert!(
            pass.restore
                .contains(&("x-api-key", Some("client-key".into())))
        );
        assert!(!pass.remove.contains(&"x-api-key"));
        // A credentialed kind: restored by the same loop, then removed before its own.
        let keyed = plan(&note, Some(&endpoint("m-b", "openai")));
        assert!(keyed.remove.contains(&"x-api-key"));
        // Without forwardAuth nothing was noted: nothing comes back.
        let plain = plan(&messages_note("m-a"), Some(&endpoint("m-a", "anthropic")));
        assert!(plain.restore.iter().all(|(h, _)| *h != "x-api-key"));
    }

    #[test]
    fn another_model_of_a_pass_through_kind_is_spliced() {
        let body = br#"{"model":"m-a","max_tokens":1}"#;
        let note = messages_note("m-a");
        let Work::Splice { start, end, model } =
            plan(&note, Some(&endpoint("m-bb", "openai"))).work
        else {
            panic!("a different model is a splice");
        };
        let edit = rewrite_head(&body[..end], start, end, &model).expect("a string is there");
        assert_eq!(edit.apply(body), br#"{"model":"m-bb","max_tokens":1}"#);
        assert_eq!(rewrite_head(body, 0, 5, "x"), None);
        assert_eq!(rewrite_head(body, 9, 99, "x"), None);
        // No metadata: as the request filter left it.
        assert_eq!(plan(&note, None).work, Work::None);
    }

    #[test]
    fn a_path_model_is_rewritten_from_the_noted_path() {
        let note = Note::in_path(
            &call(WireProtocol::BedrockInvoke, Operation::Invoke, false),
            "/model/a.m%3A0/invoke",
            "a.m:0",
        );
        let p = plan(&note, Some(&endpoint("b.m:1", "bedrock")));
        assert_eq!(p.path, "/model/b.m%3A1/invoke");
        assert_eq!(p.remove_prefixes, ["x-amz-", "x-amzn-"]);
        assert!(p.remove.contains(&"authorization"));
        assert_eq!(
            plan(&note, Some(&endpoint("a.m:0", "bedrock"))).path,
            note.path
        );
    }

    #[test]
    fn bedrock_for_an_anthropic_client_is_translated_per_attempt() {
        let note = messages_note("m-a");
        let body = br#"{"model":"m-a","max_tokens":1,"stream":true,"messages":[]}"#;
        let Work::Translate { upstream, model } =
            plan(&note, Some(&endpoint("us.anthropic.claude:0", "bedrock"))).work
        else {
            panic!("bedrock translates the messages wire");
        };
        let out = translate(&note, &upstream, &model, body).expect("translated");
        assert_eq!(
            out.path,
            "/model/us.anthropic.claude%3A0/invoke-with-response-stream"
        );
        let v: serde_json::Value = serde_json::from_slice(&out.body).expect("json");
        assert_eq!(v["anthropic_version"], "bedrock-2023-05-31");
        assert_eq!(v["anthropic_beta"], serde_json::json!(["b1", "b2"]));
        assert!(v.get("model").is_none());
        assert_eq!(
            out.response,
            halo_providers::ResponseConversion::BedrockEventStreamToSse
        );
    }

    #[test]
    fn targets_that_cannot_serve_are_skipped() {
        let note = messages_note("m-a");
        assert!(matches!(
            plan(&note, Some(&endpoint("g", "gemini"))).work,
            Work::Skip(Skip::WireNotServed { .. })
        ));
        let mut count = note.clone();
        count.op = Operation::CountTokens;
        let skip = plan(&count, Some(&endpoint("m", "bedrock"))).work;
        let Work::Skip(skip) = skip else {
            panic!("count_tokens is skipped for bedrock")
        };
        let reply: serde_json::Value = serde_json::from_slice(&skip_reply(&skip)).expect("json");
        assert_eq!(reply["error"]["type"], "bad_upstream");
    }

    #[test]
    fn only_an_attempt_that_changes_nothing_skips_the_header_writes() {
        let note = messages_note("m-a");
        assert!(plan(&note, Some(&endpoint("m-a", "anthropic"))).keeps_filtered_request(&note));
        assert!(plan(&note, None).keeps_filtered_request(&note));
        // Another model (a splice), a translation, a signing host: work to do.
        for (model, kind) in [("m-b", "anthropic"), ("m-a", "bedrock"), ("m-a", "vertex")] {
            let p = plan(&note, Some(&endpoint(model, kind)));
            assert!(!p.keeps_filtered_request(&note), "{model} on {kind}");
        }
        // A bedrock-wire client on its first pick: the signer needs the host first.
        let bedrock = Note::in_path(
            &call(WireProtocol::BedrockInvoke, Operation::Invoke, false),
            "/model/a.m%3A0/invoke",
            "a.m:0",
        );
        let p = plan(&bedrock, Some(&endpoint("a.m:0", "bedrock")));
        assert_eq!(p.authority.as_deref(), Some("bedrock.example"));
        assert!(!p.keeps_filtered_request(&bedrock));
        // A forwarded client credential goes back on every attempt.
        let mut forwarded = messages_note("m-a");
        forwarded
            .headers
            .push(("x-api-key".into(), "client-key".into()));
        let p = plan(&forwarded, Some(&endpoint("m-a", "anthropic")));
        assert!(!p.keeps_filtered_request(&forwarded));
    }
}
