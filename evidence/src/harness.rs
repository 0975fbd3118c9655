//! A harness's own per-call telemetry to evidence [`Record`]s: one mapping table per
//! harness (Claude Code, Codex, Gemini CLI), read off what the pinned versions really
//! export (captured in `tests/data/harness/`, trimmed; `e2e/tests/harnesses.rs` runs
//! them live).
//!
//! A harness log record is evidence only when it is one of its harness's per-call events
//! and carries the halo attribution halod gives the harness as OpenTelemetry resource
//! attributes (`halo.ring`, `halo.release`, `halo.experiment`, `halo.variant`,
//! `halo.unit`: the names of the gateway's records, [`halo_contract::facts`]).
//! Claude Code copies resource attributes onto every log record, Codex and Gemini CLI
//! keep them on the resource, so the record's own attribute is read first, then the
//! resource's. Every other event of a harness (prompts, tool calls, configuration) is
//! ignored even when it carries the attribution: only a model call is a sample. A
//! harness's event is evidence at the CLI receiver only ([`crate::otlp::records`] with
//! `Source::Cli`): another receiver's source would vouch for it.
//!
//! | harness | event | record |
//! |---|---|---|
//! | Claude Code | `claude_code.api_request` (log body) | status 200: `model`, `input_tokens` (cache excluded), `output_tokens`, `cache_read_tokens`, `cache_creation_tokens`, `cost_usd`, `duration_ms`, `ttft_ms` |
//! | Claude Code | `claude_code.api_error` | status `status_code` (0 without one): `model`, `duration_ms` |
//! | Codex | `codex.sse_event` with `event.kind` `response.completed` and usage | status 200: `model`, `input_token_count` (cache included), `output_token_count`, `cached_token_count`, `cache_write_token_count`, `usage.estimated_usd` |
//! | Codex | `codex.api_request` to `/responses` that failed (no 2xx, or `error.message`) | status `http.response.status_code` (0 without one): `model`, `duration_ms` |
//! | Gemini CLI | `gemini_cli.api_response` | status `status_code` (200 without one): `model`, `input_token_count` (cache included), `output_token_count` + `thoughts_token_count`, `cached_content_token_count`, `duration_ms` |
//! | Gemini CLI | `gemini_cli.api_error` | status `status_code` (0 without one): `model`, `duration_ms` |
//!
//! Counts are normalised as the gateway's are (what a price bills): input without cache
//! reads and writes, thinking tokens as output. Cost is the harness's own estimate where
//! it reports one (Claude Code, Codex), else unknown, never zero. A harness's numbers are
//! read leniently (a value that is not a number is left unknown: the receiver does not
//! own the harness's schema, and refusing the batch would print an exporter error in the
//! developer's terminal); the unit is not: a `halo.unit` that is not a salted hash
//! refuses the batch, as on every receiver. What is never read: user ids, emails, session,
//! conversation and prompt ids, prompts, responses; a [`Record`] has no field for them.
//! The model is the one the harness names (Codex names the policy alias it was given).

use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::LogRecord;

use halo_contract::facts as names;

use crate::Record;
use crate::otlp::{Attrs, RecordError};

/// One harness's mapping table.
#[derive(Debug)]
pub struct Harness {
    /// The policy's harness name.
    pub name: &'static str,
    /// The prefix of every event name it exports: an event in this namespace is this
    /// harness's (evidence or ignored), never read as a gateway record.
    pub namespace: &'static str,
    pub events: &'static [Event],
}

/// Which calls an event stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An answered call: status from `status` when given, else 200; complete.
    Answered,
    /// A failed call: status from `status`, 0 without one.
    Failed,
    /// A request event that is a record only when it failed (no 2xx status, or an
    /// `error.message`): its success is recorded by the answer event.
    FailedOnly,
}

/// One per-call event and where each [`Record`] field is read from.
#[derive(Debug)]
pub struct Event {
    pub name: &'static str,
    /// Only when each attribute has this value.
    pub when: &'static [(&'static str, &'static str)],
    /// Only when this attribute is present.
    pub requires: Option<&'static str>,
    pub outcome: Outcome,
    pub status: Option<&'static str>,
    pub model: &'static str,
    pub duration_ms: Option<&'static str>,
    pub ttft_ms: Option<&'static str>,
    /// Prompt tokens, and whether that count includes the cache's reads and writes.
    pub input: Option<&'static str>,
    pub input_includes_cache: bool,
    /// Summed (Gemini CLI reports thinking tokens apart from output).
    pub output: &'static [&'static str],
    pub cache_read: Option<&'static str>,
    pub cache_write: Option<&'static str>,
    pub cost_usd: Option<&'static str>,
}

const NONE: Event = Event {
    name: "",
    when: &[],
    requires: None,
    outcome: Outcome::Answered,
    status: None,
    model: "model",
    duration_ms: Some("duration_ms"),
    ttft_ms: None,
    input: None,
    input_includes_cache: false,
    output: &[],
    cache_read: None,
    cache_write: None,
    cost_usd: None,
};

/// Claude Code 2.1: the log body names the event (`event.name` is unprefixed).
pub const CLAUDE_CODE: Harness = Harness {
    name: "claude-code",
    namespace: "claude_code.",
    events: &[
        Event {
            name: "claude_code.api_request",
            ttft_ms: Some("ttft_ms"),
            input: Some("input_tokens"),
            output: &["output_tokens"],
            cache_read: Some("cache_read_tokens"),
            cache_write: Some("cache_creation_tokens"),
            cost_usd: Some("cost_usd"),
            ..NONE
        },
        Event {
            name: "claude_code.api_error",
            outcome: Outcome::Failed,
            status: Some("status_code"),
            ..NONE
        },
    ],
};

/// Codex 0.171: `event.name`; usage arrives on the stream's `response.completed` event
/// (sent twice, the second with usage), the request's outcome on `codex.api_request`.
pub const CODEX: Harness = Harness {
    name: "codex",
    namespace: "codex.",
    events: &[
        Event {
            name: "codex.sse_event",
            when: &[("event.kind", "response.completed")],
            requires: Some("input_token_count"),
            duration_ms: None,
            input: Some("input_token_count"),
            input_includes_cache: true,
            output: &["output_token_count"],
            cache_read: Some("cached_token_count"),
            cache_write: Some("cache_write_token_count"),
            cost_usd: Some("usage.estimated_usd"),
            ..NONE
        },
        Event {
            name: "codex.api_request",
            when: &[("endpoint", "/responses")],
            outcome: Outcome::FailedOnly,
            status: Some("http.response.status_code"),
            ..NONE
        },
    ],
};

/// Gemini CLI 0.61: `event.name` (the body is a sentence).
pub const GEMINI_CLI: Harness = Harness {
    name: "gemini-cli",
    namespace: "gemini_cli.",
    events: &[
        Event {
            name: "gemini_cli.api_response",
            status: Some("status_code"),
            input: Some("input_token_count"),
            input_includes_cache: true,
            output: &["output_token_count", "thoughts_token_count"],
            cache_read: Some("cached_content_token_count"),
            ..NONE
        },
        Event {
            name: "gemini_cli.api_error",
            outcome: Outcome::Failed,
            status: Some("status_code"),
            ..NONE
        },
    ],
};

/// Every harness's table.
pub const HARNESSES: [&Harness; 3] = [&CLAUDE_CODE, &CODEX, &GEMINI_CLI];

/// The harness whose namespace the log record's event is in, with the event's name:
/// `event.name` when it is namespaced, else a string body.
pub(crate) fn classify(log: &LogRecord) -> Option<(&'static Harness, &str)> {
    let event_name = log
        .attributes
        .iter()
        .find(|kv| kv.key == "event.name")
        .and_then(|kv| string_value(kv));
    let body = match log.body.as_ref().and_then(|b| b.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => Some(s.as_str()),
        _ => None,
    };
    [event_name, body].into_iter().flatten().find_map(|name| {
        HARNESSES
            .into_iter()
            .find(|h| name.starts_with(h.namespace))
            .map(|h| (h, name))
    })
}

fn string_value(kv: &KeyValue) -> Option<&str> {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => Some(s.as_str()),
        _ => None,
    }
}

/// The evidence in one harness log record (`None`: not a per-call event, or no halo
/// attribution). `resource` is its resource's attributes.
pub(crate) fn record(
    harness: &Harness,
    name: &str,
    log: &LogRecord,
    resource: &[KeyValue],
    index: usize,
    time_unix_ms: i64,
) -> Result<Option<Record>, RecordError> {
    let a = Attrs {
        list: &log.attributes,
        index,
    };
    let Some(event) = harness.events.iter().find(|e| {
        e.name == name
            && e.when.iter().all(|(k, v)| a.text(k) == Some(*v))
            && e.requires.is_none_or(|k| a.get(k).is_some())
    }) else {
        return Ok(None);
    };
    // The attribution: the record's own attribute, else the resource's.
    let r = Attrs {
        list: resource,
        index,
    };
    let halo = |key: &'static str| -> Result<String, RecordError> {
        let own = a.string(key)?;
        if own.is_empty() {
            r.string(key)
        } else {
            Ok(own)
        }
    };
    let unit = halo(names::UNIT)?;
    if unit.is_empty() {
        return Ok(None);
    }
    if !crate::otlp::is_unit_hash(&unit) {
        return Err(RecordError::Unit { index });
    }
    let status = event
        .status
        .and_then(|k| a.lenient(k))
        .filter(|s| (100.0..600.0).contains(s))
        .map(|s| s as u16);
    let error_message = a.get("error.message").is_some();
    let status = match event.outcome {
        Outcome::Answered => status.unwrap_or(200),
        Outcome::Failed => status.unwrap_or(0),
        Outcome::FailedOnly => match status {
            Some(s) if (200..300).contains(&s) && !error_message => return Ok(None),
            Some(s) => s,
            None => 0,
        },
    };
    let count = |k: Option<&str>| k.and_then(|k| a.lenient(k)).map(|v| v as u64);
    let cache_read = count(event.cache_read);
    let cache_write = count(event.cache_write);
    let input = count(event.input).map(|n| {
        if event.input_includes_cache {
            n.saturating_sub(cache_read.unwrap_or(0))
                .saturating_sub(cache_write.unwrap_or(0))
        } else {
            n
        }
    });
    let outputs: Vec<u64> = event
        .output
        .iter()
        .filter_map(|k| a.lenient(k))
        .map(|v| v as u64)
        .collect();
    let output = (!outputs.is_empty()).then(|| outputs.iter().sum());
    Ok(Some(Record {
        time_unix_ms,
        ring: halo(names::RING)?,
        release: halo(names::RELEASE)?,
        experiment: halo(names::EXPERIMENT)?,
        variant: halo(names::VARIANT)?,
        model: a.text(event.model).unwrap_or_default().to_string(),
        attempts: 1,
        status,
        ttfb_ms: event.ttft_ms.and_then(|k| a.lenient(k)),
        duration_ms: event.duration_ms.and_then(|k| a.lenient(k)),
        input_tokens: input,
        output_tokens: output,
        cache_write_tokens: cache_write,
        cache_read_tokens: cache_read,
        cost_usd: event.cost_usd.and_then(|k| a.lenient(k)),
        complete: event.outcome == Outcome::Answered,
        unit,
        ..Record::default()
    }))
}
