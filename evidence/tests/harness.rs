//! The harness mapping tables (halo_evidence::harness) on what the pinned harnesses
//! really export: `tests/data/harness/*.json` are OTLP/JSON log batches captured from
//! Claude Code 2.1.332, Codex 0.171.0 and Gemini CLI 0.61.0 run by e2e/tests/harnesses.rs,
//! trimmed (ids, prompts and the system prompt removed) and given the halo attribution
//! halod writes (`halo.*` resource attributes; Claude Code also copies them onto each
//! record).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use halo_evidence::otlp::{RecordError, records};
use halo_evidence::{Record, Source};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::LogRecord;

const UNIT: &str = "5f2c0e8d9a7b6c4d3e2f1a0b9c8d7e6f";

fn captured(harness: &str) -> ExportLogsServiceRequest {
    let path = format!(
        "{}/tests/data/harness/{harness}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_slice(&std::fs::read(&path).unwrap()).expect("an OTLP/JSON batch")
}

fn attributed(r: &Record) {
    assert_eq!(
        (
            r.ring.as_str(),
            r.experiment.as_str(),
            r.variant.as_str(),
            r.unit.as_str()
        ),
        ("general", "cc-effort", "treatment", UNIT)
    );
    assert!(r.release.starts_with("sha256:"));
}

fn s(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

/// Drop the halo attribution from the resource and every record.
fn unattributed(mut req: ExportLogsServiceRequest) -> ExportLogsServiceRequest {
    for rl in &mut req.resource_logs {
        if let Some(r) = &mut rl.resource {
            r.attributes.retain(|kv| !kv.key.starts_with("halo."));
        }
        for sl in &mut rl.scope_logs {
            for log in &mut sl.log_records {
                log.attributes.retain(|kv| !kv.key.starts_with("halo."));
            }
        }
    }
    req
}

#[test]
fn claude_codes_api_request_is_one_record_and_its_prompt_event_is_not() {
    let (got, ignored) = records(&captured("claude-code"), Source::Cli, 0).unwrap();
    assert_eq!(
        (got.len(), ignored),
        (1, 1),
        "api_request in, user_prompt out"
    );
    let r = &got[0].record;
    assert_eq!(got[0].source, Source::Cli);
    attributed(r);
    assert_eq!(r.model, "claude-sonnet-4-5-20250929");
    assert_eq!((r.status, r.complete, r.attempts), (200, true, 1));
    assert_eq!(
        (
            r.input_tokens,
            r.output_tokens,
            r.cache_read_tokens,
            r.cache_write_tokens
        ),
        (Some(1435), Some(19), Some(0), Some(0))
    );
    assert_eq!((r.duration_ms, r.ttfb_ms), (Some(71.0), Some(16.0)));
    assert!((r.cost_usd.unwrap() - 0.00765).abs() < 1e-9);
    assert_eq!(
        r.time_unix_ms / 1000,
        1_796_222_880,
        "the record's own time"
    );
}

#[test]
fn codex_usage_event_is_one_record_and_its_successful_requests_are_not() {
    let (got, ignored) = records(&captured("codex"), Source::Cli, 0).unwrap();
    // /models request, the prompt, the /responses request (200), the usage-less
    // response.completed: ignored; the response.completed with usage: the record.
    assert_eq!((got.len(), ignored), (1, 4));
    let r = &got[0].record;
    attributed(r);
    assert_eq!(r.model, "gpt", "Codex names the model it was given");
    assert_eq!((r.status, r.complete), (200, true));
    assert_eq!(
        (
            r.input_tokens,
            r.output_tokens,
            r.cache_read_tokens,
            r.cache_write_tokens
        ),
        (Some(3120), Some(19), Some(0), Some(0))
    );
    assert_eq!(r.cost_usd, None, "no estimate sent: unknown, never 0");
}

#[test]
fn gemini_clis_api_response_is_one_record_and_genai_details_are_not() {
    let (got, ignored) = records(&captured("gemini-cli"), Source::Cli, 0).unwrap();
    assert_eq!((got.len(), ignored), (1, 4));
    let r = &got[0].record;
    attributed(r);
    assert_eq!(r.model, "gemini-2.5-pro");
    assert_eq!((r.status, r.complete), (200, true));
    assert_eq!(
        (r.input_tokens, r.output_tokens, r.cache_read_tokens),
        (Some(72), Some(19), Some(0))
    );
    assert_eq!(r.duration_ms, Some(67.0));
}

#[test]
fn without_the_attribution_every_harness_record_is_ignored() {
    for harness in ["claude-code", "codex", "gemini-cli"] {
        let req = unattributed(captured(harness));
        let total = halo_evidence::otlp::log_count(&req);
        let (got, ignored) = records(&req, Source::Cli, 0).unwrap();
        assert_eq!((got.len(), ignored), (0, total), "{harness}");
    }
}

#[test]
fn cache_counts_are_taken_out_of_input_and_thinking_is_output() {
    let mut req = captured("gemini-cli");
    for log in &mut req.resource_logs[0].scope_logs[0].log_records {
        for kv in &mut log.attributes {
            let v = match kv.key.as_str() {
                "input_token_count" => "1000",
                "cached_content_token_count" => "600",
                "thoughts_token_count" => "30",
                _ => continue,
            };
            *kv = s(&kv.key, v);
        }
    }
    let (got, _) = records(&req, Source::Cli, 0).unwrap();
    let r = &got[0].record;
    assert_eq!(
        (r.input_tokens, r.cache_read_tokens, r.output_tokens),
        (Some(400), Some(600), Some(49))
    );
}

/// Error events, in the names each harness documents (none was provoked live).
#[test]
fn error_events_are_failed_calls_with_their_status() {
    let resource = |req: &ExportLogsServiceRequest| {
        req.resource_logs[0]
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .clone()
    };
    let cases: [(&str, LogRecord, u16); 5] = [
        (
            "claude-code",
            LogRecord {
                body: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(
                        "claude_code.api_error".into(),
                    )),
                }),
                attributes: vec![
                    s("event.name", "api_error"),
                    s("model", "claude-sonnet-4-5"),
                    s("status_code", "529"),
                    s("duration_ms", "120"),
                    s("error", "Overloaded"),
                ],
                ..Default::default()
            },
            529,
        ),
        (
            "claude-code",
            LogRecord {
                body: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(
                        "claude_code.api_error".into(),
                    )),
                }),
                attributes: vec![s("status_code", "undefined"), s("error", "socket hang up")],
                ..Default::default()
            },
            0,
        ),
        (
            "codex",
            LogRecord {
                attributes: vec![
                    s("event.name", "codex.api_request"),
                    s("endpoint", "/responses"),
                    s("http.response.status_code", "503"),
                    s("error.message", "upstream unavailable"),
                ],
                ..Default::default()
            },
            503,
        ),
        (
            "codex",
            LogRecord {
                attributes: vec![
                    s("event.name", "codex.api_request"),
                    s("endpoint", "/responses"),
                    s("error.message", "connection refused"),
                ],
                ..Default::default()
            },
            0,
        ),
        (
            "gemini-cli",
            LogRecord {
                attributes: vec![
                    s("event.name", "gemini_cli.api_error"),
                    s("model", "gemini-2.5-pro"),
                    s("status_code", "429"),
                ],
                ..Default::default()
            },
            429,
        ),
    ];
    for (harness, log, status) in cases {
        let mut req = captured(harness);
        let res = resource(&req);
        req.resource_logs[0].scope_logs[0].log_records = vec![log];
        req.resource_logs[0].resource.as_mut().unwrap().attributes = res;
        let (got, ignored) = records(&req, Source::Cli, 0).unwrap();
        assert_eq!((got.len(), ignored), (1, 0), "{harness} {status}");
        let r = &got[0].record;
        assert!(r.is_error(), "{harness} {status}");
        assert_eq!((r.status, r.complete), (status, false), "{harness}");
        attributed(r);
    }
}

#[test]
fn harness_events_are_evidence_at_the_cli_receiver_only() {
    for source in [Source::Gateway, Source::Eval, Source::Shadow] {
        let req = captured("claude-code");
        let (got, ignored) = records(&req, source, 0).unwrap();
        assert_eq!((got.len(), ignored), (0, 2), "{source}");
    }
}

#[test]
fn a_raw_user_as_unit_refuses_the_batch() {
    let mut req = captured("codex");
    for kv in &mut req.resource_logs[0].resource.as_mut().unwrap().attributes {
        if kv.key == "halo.unit" {
            *kv = s("halo.unit", "dev@acme.test");
        }
    }
    let err = records(&req, Source::Cli, 0).expect_err("a subject is not a unit");
    assert!(matches!(err, RecordError::Unit { .. }));
    assert!(!err.to_string().contains("acme"));
}
