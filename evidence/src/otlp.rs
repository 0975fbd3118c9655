//! OTLP log records to evidence [`Record`]s.
//!
//! One model call is one OTLP log record: what Envoy's OpenTelemetry access logger emits
//! per decided call, with the attributes halo-envoy-config's `evidence` module renders
//! (this module reads exactly those names: [`halo_contract::facts`]). A log
//! record is evidence when it carries `halo.unit`; any other record is counted as
//! ignored, not refused. A harness's own event (its name in a harness's namespace:
//! `claude_code.`, `codex.`, `gemini_cli.`) is read by that harness's mapping table
//! instead ([`crate::harness`]), with the attribution from its resource, and only at the
//! CLI receiver (elsewhere it is ignored). Attribute names are OpenTelemetry's
//! GenAI semantic conventions where one exists, `halo.*` otherwise:
//!
//! | attribute | record field |
//! |---|---|
//! | `halo.ring`, `halo.release`, `halo.experiment`, `halo.variant`, `halo.alias`, `halo.upstream`, `halo.target` | same |
//! | `gen_ai.response.model` (else `gen_ai.request.model`) | model |
//! | `halo.attempts`, `http.response.status_code` | attempts, status |
//! | `gen_ai.server.time_to_first_token` (seconds), `halo.gateway.latency_ms` | ttfb, duration |
//! | `gen_ai.usage.input_tokens` (all prompt tokens, cache included), `gen_ai.usage.output_tokens` | input (minus the cache counts), output |
//! | `gen_ai.usage.cache_creation.input_tokens`, `gen_ai.usage.cache_read.input_tokens` | cache write, cache read |
//! | `halo.cost_usd`, `halo.complete`, `halo.unit` | same |
//!
//! Values may arrive as OTLP ints, doubles, booleans or strings: Envoy's access-log
//! formatters produce strings, and `-` for a value that is not set (a header the filter
//! did not stamp, a fact it did not write), which reads as absent. `halo.source` is never
//! read: the receiver stamps the source. The unit must look like a salted hash (16 to 64
//! lowercase hex digits), so a raw subject sent by mistake is refused rather than stored.

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::LogRecord;

use halo_contract::facts as names;

use crate::{Record, Source, Stamped, harness};

/// Longest string attribute accepted (names, models, digests are far shorter).
pub const MAX_STRING: usize = 512;

/// Why a batch is refused (the whole batch: nothing of it is stored). Names the record
/// and attribute, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("log record {index}: attribute {key} is not {want}")]
    Type {
        index: usize,
        key: &'static str,
        want: &'static str,
    },
    #[error("log record {index}: attribute {key} is longer than {MAX_STRING} bytes")]
    TooLong { index: usize, key: &'static str },
    #[error("log record {index}: halo.unit must be a salted hash (16 to 64 lowercase hex digits)")]
    Unit { index: usize },
}

/// The evidence in one export request, stamped with `source`; `now_unix_ms` stands in
/// for a record without a timestamp. Returns the records and how many log records were
/// not evidence.
pub fn records(
    request: &ExportLogsServiceRequest,
    source: Source,
    now_unix_ms: i64,
) -> Result<(Vec<Stamped>, usize), RecordError> {
    let mut out = Vec::new();
    let mut ignored = 0;
    let mut index = 0;
    for resource in &request.resource_logs {
        let resource_attributes = resource
            .resource
            .as_ref()
            .map(|r| r.attributes.as_slice())
            .unwrap_or_default();
        for scope in &resource.scope_logs {
            for log in &scope.log_records {
                let converted = match harness::classify(log) {
                    // A harness's own event is evidence at the CLI receiver only: at the
                    // gateway's it would vouch as the gateway (and could trip a kill).
                    Some((h, name)) if source == Source::Cli => harness::record(
                        h,
                        name,
                        log,
                        resource_attributes,
                        index,
                        time_unix_ms(log, now_unix_ms),
                    )?,
                    Some(_) => None,
                    None => record(log, index, now_unix_ms)?,
                };
                match converted {
                    Some(record) => out.push(Stamped { source, record }),
                    None => ignored += 1,
                }
                index += 1;
            }
        }
    }
    Ok((out, ignored))
}

/// The number of log records in a request (for refusal counts).
pub fn log_count(request: &ExportLogsServiceRequest) -> usize {
    request
        .resource_logs
        .iter()
        .flat_map(|r| &r.scope_logs)
        .map(|s| s.log_records.len())
        .sum()
}

/// A log record's (or resource's) attributes, read by name.
pub(crate) struct Attrs<'a> {
    pub(crate) list: &'a [KeyValue],
    pub(crate) index: usize,
}

impl<'a> Attrs<'a> {
    pub(crate) fn get(&self, key: &str) -> Option<&'a any_value::Value> {
        self.list
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v: &AnyValue| v.value.as_ref())
    }

    /// A string attribute no longer than [`MAX_STRING`], else `None` (harness records:
    /// read leniently).
    pub(crate) fn text(&self, key: &str) -> Option<&'a str> {
        match self.get(key) {
            Some(any_value::Value::StringValue(s)) if s.len() <= MAX_STRING => Some(s.as_str()),
            _ => None,
        }
    }

    /// A finite non-negative number (an int, a double or a numeric string), else `None`
    /// (harness records: read leniently).
    pub(crate) fn lenient(&self, key: &str) -> Option<f64> {
        let v = match self.get(key)? {
            any_value::Value::IntValue(i) => *i as f64,
            any_value::Value::DoubleValue(d) => *d,
            any_value::Value::StringValue(s) => s.trim().parse::<f64>().ok()?,
            _ => return None,
        };
        (v.is_finite() && v >= 0.0).then_some(v)
    }

    pub(crate) fn string(&self, key: &'static str) -> Result<String, RecordError> {
        match self.get(key) {
            None => Ok(String::new()),
            // Envoy's formatters write "-" for a value that is not set.
            Some(any_value::Value::StringValue(s)) if s == "-" => Ok(String::new()),
            Some(any_value::Value::StringValue(s)) if s.len() <= MAX_STRING => Ok(s.clone()),
            Some(any_value::Value::StringValue(_)) => Err(RecordError::TooLong {
                index: self.index,
                key,
            }),
            Some(_) => Err(self.wrong(key, "a string")),
        }
    }

    fn number(&self, key: &'static str) -> Result<Option<f64>, RecordError> {
        let v = match self.get(key) {
            None => return Ok(None),
            Some(any_value::Value::IntValue(i)) => *i as f64,
            Some(any_value::Value::DoubleValue(d)) => *d,
            // Envoy's formatters write "-" for a value that is not set.
            Some(any_value::Value::StringValue(s)) if s.is_empty() || s == "-" => {
                return Ok(None);
            }
            Some(any_value::Value::StringValue(s)) => s
                .trim()
                .parse::<f64>()
                .map_err(|_| self.wrong(key, "a number"))?,
            Some(_) => return Err(self.wrong(key, "a number")),
        };
        if v.is_finite() && v >= 0.0 {
            Ok(Some(v))
        } else {
            Err(self.wrong(key, "a finite non-negative number"))
        }
    }

    fn count(&self, key: &'static str) -> Result<Option<u64>, RecordError> {
        match self.number(key)? {
            None => Ok(None),
            Some(v) if v.fract() == 0.0 && v <= u64::MAX as f64 => Ok(Some(v as u64)),
            Some(_) => Err(self.wrong(key, "a whole number")),
        }
    }

    fn flag(&self, key: &'static str) -> Result<bool, RecordError> {
        match self.get(key) {
            None => Ok(false),
            Some(any_value::Value::BoolValue(b)) => Ok(*b),
            Some(any_value::Value::StringValue(s)) if s == "true" => Ok(true),
            Some(any_value::Value::StringValue(s)) if s == "false" || s == "-" => Ok(false),
            Some(_) => Err(self.wrong(key, "a boolean")),
        }
    }

    fn wrong(&self, key: &'static str, want: &'static str) -> RecordError {
        RecordError::Type {
            index: self.index,
            key,
            want,
        }
    }
}

pub(crate) fn is_unit_hash(s: &str) -> bool {
    (16..=64).contains(&s.len()) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// When the record says it happened (its time, else when it was observed), else `now`.
fn time_unix_ms(log: &LogRecord, now_unix_ms: i64) -> i64 {
    let nanos = if log.time_unix_nano != 0 {
        log.time_unix_nano
    } else {
        log.observed_time_unix_nano
    };
    if nanos == 0 {
        now_unix_ms
    } else {
        i64::try_from(nanos / 1_000_000).unwrap_or(i64::MAX)
    }
}

fn record(log: &LogRecord, index: usize, now_unix_ms: i64) -> Result<Option<Record>, RecordError> {
    let a = Attrs {
        list: &log.attributes,
        index,
    };
    let unit = a.string(names::UNIT)?;
    if unit.is_empty() {
        return Ok(None);
    }
    if !is_unit_hash(&unit) {
        return Err(RecordError::Unit { index });
    }
    let time_unix_ms = time_unix_ms(log, now_unix_ms);
    let mut model = a.string(names::RESPONSE_MODEL)?;
    if model.is_empty() {
        model = a.string("gen_ai.request.model")?;
    }
    let cache_write = a.count(names::CACHE_WRITE_TOKENS)?;
    let cache_read = a.count(names::CACHE_READ_TOKENS)?;
    let input = a.count(names::INPUT_TOKENS)?.map(|all| {
        all.saturating_sub(cache_write.unwrap_or(0))
            .saturating_sub(cache_read.unwrap_or(0))
    });
    let status = match a.count(names::STATUS)? {
        None => 0,
        Some(s) => u16::try_from(s).map_err(|_| a.wrong(names::STATUS, "a status"))?,
    };
    let attempts = match a.count(names::ATTEMPTS)? {
        None => 1,
        Some(n) => u32::try_from(n).map_err(|_| a.wrong(names::ATTEMPTS, "a count"))?,
    };
    Ok(Some(Record {
        time_unix_ms,
        ring: a.string(names::RING)?,
        release: a.string(names::RELEASE)?,
        experiment: a.string(names::EXPERIMENT)?,
        variant: a.string(names::VARIANT)?,
        alias: a.string(names::ALIAS)?,
        upstream: a.string(names::UPSTREAM)?,
        model,
        target: a.string(names::TARGET)?,
        attempts,
        status,
        ttfb_ms: a.number(names::TIME_TO_FIRST_TOKEN)?.map(|s| s * 1000.0),
        duration_ms: a.number(names::LATENCY_MS)?,
        input_tokens: input,
        output_tokens: a.count(names::OUTPUT_TOKENS)?,
        cache_write_tokens: cache_write,
        cache_read_tokens: cache_read,
        cost_usd: a.number(names::COST_USD)?,
        complete: a.flag(names::COMPLETE)?,
        unit,
    }))
}

/// Attributes for `record` in the names above (the inverse of the decoding; senders in
/// tests, benchmarks and the eval tooling use it).
pub fn attributes(r: &Record) -> Vec<KeyValue> {
    fn kv(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue {
            key: key.to_string(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }
    let s = |key: &str, v: &str| kv(key, any_value::Value::StringValue(v.to_string()));
    let i = |key: &str, v: u64| kv(key, any_value::Value::IntValue(v as i64));
    let d = |key: &str, v: f64| kv(key, any_value::Value::DoubleValue(v));
    let mut out = vec![
        s(names::RING, &r.ring),
        s(names::RELEASE, &r.release),
        s(names::EXPERIMENT, &r.experiment),
        s(names::VARIANT, &r.variant),
        s(names::ALIAS, &r.alias),
        s(names::UPSTREAM, &r.upstream),
        s(names::TARGET, &r.target),
        s(names::RESPONSE_MODEL, &r.model),
        i(names::ATTEMPTS, u64::from(r.attempts)),
        i(names::STATUS, u64::from(r.status)),
        kv(names::COMPLETE, any_value::Value::BoolValue(r.complete)),
        s(names::UNIT, &r.unit),
    ];
    if let Some(v) = r.ttfb_ms {
        out.push(d(names::TIME_TO_FIRST_TOKEN, v / 1000.0));
    }
    if let Some(v) = r.duration_ms {
        out.push(d(names::LATENCY_MS, v));
    }
    if let Some(v) = r.input_tokens {
        let all = v + r.cache_write_tokens.unwrap_or(0) + r.cache_read_tokens.unwrap_or(0);
        out.push(i(names::INPUT_TOKENS, all));
    }
    if let Some(v) = r.output_tokens {
        out.push(i(names::OUTPUT_TOKENS, v));
    }
    if let Some(v) = r.cache_write_tokens {
        out.push(i(names::CACHE_WRITE_TOKENS, v));
    }
    if let Some(v) = r.cache_read_tokens {
        out.push(i(names::CACHE_READ_TOKENS, v));
    }
    if let Some(v) = r.cost_usd {
        out.push(d(names::COST_USD, v));
    }
    out
}

/// An export request carrying `records` as log records (one resource, one scope).
pub fn request(records: &[Record]) -> ExportLogsServiceRequest {
    use opentelemetry_proto::tonic::logs::v1::{ResourceLogs, ScopeLogs};
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: records
                    .iter()
                    .map(|r| LogRecord {
                        time_unix_nano: u64::try_from(r.time_unix_ms).unwrap_or(0) * 1_000_000,
                        attributes: attributes(r),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            time_unix_ms: 1_760_000_000_123,
            ring: "early".into(),
            release: "sha256:ab".into(),
            experiment: "sonnet-canary".into(),
            variant: "treatment".into(),
            alias: "sonnet".into(),
            upstream: "anthropic-direct".into(),
            model: "claude-sonnet-4-5".into(),
            target: "t0".into(),
            attempts: 2,
            status: 200,
            ttfb_ms: Some(250.0),
            duration_ms: Some(1234.5),
            input_tokens: Some(10),
            output_tokens: Some(20),
            cache_write_tokens: Some(30),
            cache_read_tokens: Some(40),
            cost_usd: Some(0.0125),
            complete: true,
            unit: "0123456789abcdef".into(),
        }
    }

    #[test]
    fn round_trip_and_source_is_stamped() {
        let mut req = request(&[sample()]);
        // A record claiming a source does not get it.
        req.resource_logs[0].scope_logs[0].log_records[0]
            .attributes
            .push(KeyValue {
                key: "halo.source".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue("gateway".into())),
                }),
                ..Default::default()
            });
        let (got, ignored) = records(&req, Source::Cli, 0).expect("valid");
        assert_eq!(ignored, 0);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].source, Source::Cli);
        assert_eq!(got[0].record, sample());
    }

    #[test]
    fn strings_from_envoy_formatters_are_numbers() {
        let mut req = request(&[]);
        let s = |k: &str, v: &str| KeyValue {
            key: k.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(v.into())),
            }),
            ..Default::default()
        };
        req.resource_logs[0].scope_logs[0]
            .log_records
            .push(LogRecord {
                attributes: vec![
                    s("halo.unit", "00000000000000ff"),
                    s("gen_ai.usage.input_tokens", "12"),
                    s("gen_ai.usage.output_tokens", "-"),
                    s("http.response.status_code", "503"),
                    s("halo.complete", "false"),
                ],
                ..Default::default()
            });
        req.resource_logs[0].scope_logs[0]
            .log_records
            .push(LogRecord::default());
        let (got, ignored) = records(&req, Source::Gateway, 77).expect("valid");
        assert_eq!(ignored, 1, "a log record without halo.unit is not evidence");
        let r = &got[0].record;
        assert_eq!(
            (r.input_tokens, r.output_tokens, r.status, r.time_unix_ms),
            (Some(12), None, 503, 77)
        );
    }

    #[test]
    fn a_raw_subject_or_a_bad_number_refuses_the_batch() {
        let mut bad = sample();
        bad.unit = "alice@example.com".into();
        let err = records(&request(&[sample(), bad]), Source::Gateway, 0).expect_err("unit");
        assert_eq!(err, RecordError::Unit { index: 1 });
        assert!(!err.to_string().contains("alice"));
        let mut req = request(&[sample()]);
        for kv in &mut req.resource_logs[0].scope_logs[0].log_records[0].attributes {
            if kv.key == "halo.attempts" {
                kv.value = Some(AnyValue {
                    value: Some(any_value::Value::DoubleValue(1.5)),
                });
            }
        }
        assert!(matches!(
            records(&req, Source::Gateway, 0),
            Err(RecordError::Type {
                key: "halo.attempts",
                ..
            })
        ));
    }
}
