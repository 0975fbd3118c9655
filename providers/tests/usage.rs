//! Usage extraction on real-shaped answers of each provider wire, and the split property:
//! every cut of the bytes into two or three pieces gives the same accounting as one piece.

use halo_providers::eventstream::{chunk_frame, encode_frame};
use halo_providers::usage::{Accounting, Dialect, Framing, Meter, Usage};

fn meter(dialect: Dialect, framing: Framing, pieces: &[&[u8]]) -> Accounting {
    let mut m = Meter::new(dialect, framing);
    for p in pieces {
        m.feed(p);
    }
    m.finish()
}

/// One piece, every two-way cut and (for short inputs) every three-way cut agree.
fn all_splits_agree(dialect: Dialect, framing: Framing, body: &[u8]) -> Accounting {
    let whole = meter(dialect, framing, &[body]);
    for i in 0..=body.len() {
        let two = meter(dialect, framing, &[&body[..i], &body[i..]]);
        assert_eq!(two, whole, "cut at {i}");
    }
    let step = (body.len() / 97).max(1);
    for i in (0..=body.len()).step_by(step) {
        for j in (i..=body.len()).step_by(step) {
            let three = meter(dialect, framing, &[&body[..i], &body[i..j], &body[j..]]);
            assert_eq!(three, whole, "cuts at {i} and {j}");
        }
    }
    let bytewise: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(meter(dialect, framing, &bytewise), whole, "byte by byte");
    whole
}

/// Every strict prefix of a complete answer is incomplete, and its usage is a subset of
/// the final one (never a different number).
fn prefixes_are_incomplete(dialect: Dialect, framing: Framing, body: &[u8], full: Usage) {
    for i in 0..body.len() {
        let mut m = Meter::new(dialect, framing);
        m.feed(&body[..i]);
        let cut = m.cut();
        assert!(!cut.complete, "cut at {i} is complete");
        let mut m = Meter::new(dialect, framing);
        m.feed(&body[..i]);
        let ended = m.finish();
        if ended.complete {
            assert_eq!(
                ended.usage, full,
                "prefix {i} claims complete with other usage"
            );
        }
    }
}

const ANTHROPIC_JSON: &str = r#"{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Hello! {\"usage\": 1} How can I help?"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,"cache_creation_input_tokens":2051,"cache_read_input_tokens":10240,"cache_creation":{"ephemeral_5m_input_tokens":2051,"ephemeral_1h_input_tokens":0},"output_tokens":503,"service_tier":"standard"}}"#;

fn anthropic_sse() -> String {
    [
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":4000,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        ": a comment line\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"usage: {\\\"output_tokens\\\": 7}\"}}\r\n\r\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    ]
    .concat()
}

#[test]
fn anthropic_json() {
    let a = all_splits_agree(Dialect::Anthropic, Framing::Json, ANTHROPIC_JSON.as_bytes());
    let want = Usage {
        input_tokens: Some(2095),
        output_tokens: Some(503),
        cache_write_tokens: Some(2051),
        cache_read_tokens: Some(10240),
    };
    assert_eq!(
        a,
        Accounting {
            usage: want,
            complete: true
        }
    );
    prefixes_are_incomplete(
        Dialect::Anthropic,
        Framing::Json,
        ANTHROPIC_JSON.as_bytes(),
        want,
    );
}

/// Long text is skipped by the vector search: a usage-shaped run deep inside a string,
/// behind escapes and across 16-byte chunks, is still content, at every cut.
#[test]
fn long_text_is_skipped_and_never_read_as_usage() {
    let text = format!(
        "{}\\n{}\\\"usage\\\":{{\\\"input_tokens\\\":9}} {}",
        "a".repeat(70),
        "b".repeat(33),
        "c".repeat(40)
    );
    let body = format!(
        r#"{{"type":"message","content":[{{"type":"text","text":"{text}"}}],"usage":{{"input_tokens":12,"output_tokens":3}}}}"#
    );
    serde_json::from_str::<serde_json::Value>(&body).expect("the test body is JSON");
    let a = all_splits_agree(Dialect::Anthropic, Framing::Json, body.as_bytes());
    assert_eq!(a.usage.input_tokens, Some(12));
    assert_eq!(a.usage.output_tokens, Some(3));
    assert!(a.complete);
}

#[test]
fn anthropic_sse_merges_start_and_delta() {
    let body = anthropic_sse();
    let a = all_splits_agree(Dialect::Anthropic, Framing::Sse, body.as_bytes());
    let want = Usage {
        input_tokens: Some(25),
        output_tokens: Some(15),
        cache_write_tokens: Some(100),
        cache_read_tokens: Some(4000),
    };
    assert_eq!(
        a,
        Accounting {
            usage: want,
            complete: true
        }
    );
    prefixes_are_incomplete(Dialect::Anthropic, Framing::Sse, body.as_bytes(), want);
}

#[test]
fn anthropic_sse_cut_before_usage_keeps_what_was_seen() {
    let body = anthropic_sse();
    let cut_at = body.find("event: message_delta").unwrap();
    let mut m = Meter::new(Dialect::Anthropic, Framing::Sse);
    m.feed(&body.as_bytes()[..cut_at]);
    let a = m.cut();
    assert!(!a.complete);
    assert_eq!(a.usage.input_tokens, Some(25));
    assert_eq!(
        a.usage.output_tokens,
        Some(1),
        "message_start's count, the last seen"
    );
    // Ended "normally" there (an upstream that closed early): still not complete.
    let mut m = Meter::new(Dialect::Anthropic, Framing::Sse);
    m.feed(&body.as_bytes()[..cut_at]);
    assert!(!m.finish().complete);
}

#[test]
fn sse_event_without_final_blank_line_is_incomplete() {
    // The usage value itself arrived whole, so it is what was seen; but no SSE client
    // dispatches an event without its blank line, so the answer is not complete.
    let body = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n";
    let a = meter(Dialect::Anthropic, Framing::Sse, &[body.as_bytes()]);
    assert_eq!(a.usage.output_tokens, Some(15));
    assert!(!a.complete);
}

#[test]
fn bedrock_event_stream() {
    let events = [
        r#"{"type":"message_start","message":{"id":"msg_bdrk_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":300,"output_tokens":2}}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":9}}"#,
        r#"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":12,"outputTokenCount":9,"invocationLatency":511,"firstByteLatency":310}}"#,
    ];
    let mut body: Vec<u8> = events.iter().flat_map(|e| chunk_frame(e)).collect();
    // A frame of another type is skipped.
    body.extend(encode_frame(
        &[(":message-type", "event"), (":event-type", "metadata")],
        b"{}",
    ));
    let a = all_splits_agree(Dialect::Anthropic, Framing::AwsEventStream, &body);
    let want = Usage {
        input_tokens: Some(12),
        output_tokens: Some(9),
        cache_write_tokens: Some(0),
        cache_read_tokens: Some(300),
    };
    assert_eq!(
        a,
        Accounting {
            usage: want,
            complete: true
        }
    );
    prefixes_are_incomplete(Dialect::Anthropic, Framing::AwsEventStream, &body, want);
}

/// A Converse answer as Bedrock sends it: camelCase usage at the top level (a `usage`
/// key inside a tool's input is content, not usage).
const CONVERSE_JSON: &str = r#"{"output":{"message":{"role":"assistant","content":[{"text":"Hi"},{"toolUse":{"toolUseId":"t1","name":"stats","input":{"usage":{"inputTokens":1}}}}]}},"stopReason":"tool_use","usage":{"inputTokens":125,"outputTokens":60,"totalTokens":3685,"cacheReadInputTokens":3000,"cacheWriteInputTokens":500},"metrics":{"latencyMs":1175}}"#;

#[test]
fn bedrock_converse_json() {
    let a = all_splits_agree(
        Dialect::BedrockConverse,
        Framing::Json,
        CONVERSE_JSON.as_bytes(),
    );
    let want = Usage {
        input_tokens: Some(125),
        output_tokens: Some(60),
        cache_write_tokens: Some(500),
        cache_read_tokens: Some(3000),
    };
    assert_eq!(
        a,
        Accounting {
            usage: want,
            complete: true
        }
    );
    prefixes_are_incomplete(
        Dialect::BedrockConverse,
        Framing::Json,
        CONVERSE_JSON.as_bytes(),
        want,
    );
}

/// converse-stream's frames: the usage is in the last event, `metadata`, plain JSON.
fn converse_stream(with_metadata: bool) -> Vec<u8> {
    let event = |kind: &str, payload: &str| {
        encode_frame(
            &[
                (":message-type", "event"),
                (":event-type", kind),
                (":content-type", "application/json"),
            ],
            payload.as_bytes(),
        )
    };
    let mut body = [
        event("messageStart", r#"{"p":"abcd","role":"assistant"}"#),
        event(
            "contentBlockDelta",
            r#"{"contentBlockIndex":0,"delta":{"text":"Hi, usage is {\"usage\":{\"inputTokens\":9}}"},"p":"ab"}"#,
        ),
        event("contentBlockStop", r#"{"contentBlockIndex":0,"p":"abc"}"#),
        event("messageStop", r#"{"p":"abcdef","stopReason":"end_turn"}"#),
    ]
    .concat();
    if with_metadata {
        body.extend(event(
            "metadata",
            r#"{"metrics":{"latencyMs":842},"p":"abcdefgh","usage":{"cacheReadInputTokens":2048,"cacheWriteInputTokens":0,"inputTokens":17,"outputTokens":11,"totalTokens":2076}}"#,
        ));
    }
    body
}

#[test]
fn bedrock_converse_stream_reads_the_metadata_event() {
    let body = converse_stream(true);
    let a = all_splits_agree(Dialect::BedrockConverse, Framing::AwsEventStream, &body);
    let want = Usage {
        input_tokens: Some(17),
        output_tokens: Some(11),
        cache_write_tokens: Some(0),
        cache_read_tokens: Some(2048),
    };
    assert_eq!(
        a,
        Accounting {
            usage: want,
            complete: true
        }
    );
    prefixes_are_incomplete(
        Dialect::BedrockConverse,
        Framing::AwsEventStream,
        &body,
        want,
    );

    // Cut before its metadata: nothing counted, incomplete (text mentioning usage is
    // content, not usage).
    let a = meter(
        Dialect::BedrockConverse,
        Framing::AwsEventStream,
        &[&converse_stream(false)],
    );
    assert_eq!(
        a,
        Accounting {
            usage: Usage::default(),
            complete: false
        }
    );
    // An Anthropic chunk frame is not a converse event.
    let chunk = chunk_frame(r#"{"type":"message_delta","usage":{"output_tokens":9}}"#);
    let a = meter(Dialect::BedrockConverse, Framing::AwsEventStream, &[&chunk]);
    assert_eq!(a.usage, Usage::default());
}

#[test]
fn bedrock_event_stream_with_bad_crc_is_incomplete() {
    let mut body = chunk_frame(r#"{"type":"message_delta","usage":{"output_tokens":9}}"#);
    let n = body.len();
    body[n - 1] ^= 0xff;
    let a = meter(Dialect::Anthropic, Framing::AwsEventStream, &[&body]);
    assert!(!a.complete);
    assert_eq!(a.usage, Usage::default());
}

const OPENAI_JSON: &str = r#"{"id":"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b","object":"response","created_at":1741476542,"status":"completed","error":null,"model":"gpt-5-codex","output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"In a peaceful grove...","annotations":[]}]}],"parallel_tool_calls":true,"reasoning":{"effort":null,"summary":null},"usage":{"input_tokens":3600,"input_tokens_details":{"cached_tokens":3000},"output_tokens":148,"output_tokens_details":{"reasoning_tokens":64},"total_tokens":3748},"user":null,"metadata":{}}"#;

#[test]
fn openai_responses_json() {
    let a = all_splits_agree(
        Dialect::OpenAiResponses,
        Framing::Json,
        OPENAI_JSON.as_bytes(),
    );
    let want = Usage {
        input_tokens: Some(600),
        output_tokens: Some(148),
        cache_write_tokens: None,
        cache_read_tokens: Some(3000),
    };
    assert_eq!(
        a,
        Accounting {
            usage: want,
            complete: true
        }
    );
    prefixes_are_incomplete(
        Dialect::OpenAiResponses,
        Framing::Json,
        OPENAI_JSON.as_bytes(),
        want,
    );
}

#[test]
fn openai_responses_sse() {
    let body = [
        "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n",
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":9,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi\"}]}],\"usage\":{\"input_tokens\":37,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":11,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":48}}}\n\n",
    ]
    .concat();
    let a = all_splits_agree(Dialect::OpenAiResponses, Framing::Sse, body.as_bytes());
    let want = Usage {
        input_tokens: Some(37),
        output_tokens: Some(11),
        cache_write_tokens: None,
        cache_read_tokens: Some(0),
    };
    assert_eq!(
        a,
        Accounting {
            usage: want,
            complete: true
        }
    );
    prefixes_are_incomplete(
        Dialect::OpenAiResponses,
        Framing::Sse,
        body.as_bytes(),
        want,
    );
}

const GEMINI_JSON: &str = r#"{
  "candidates": [
    {
      "content": {"parts": [{"text": "usageMetadata is a field"}], "role": "model"},
      "finishReason": "STOP",
      "avgLogprobs": -0.05
    }
  ],
  "usageMetadata": {
    "promptTokenCount": 1200,
    "candidatesTokenCount": 80,
    "totalTokenCount": 1300,
    "cachedContentTokenCount": 1000,
    "thoughtsTokenCount": 20,
    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 1200}]
  },
  "modelVersion": "gemini-2.5-pro",
  "responseId": "abc"
}"#;

#[test]
fn gemini_generate_content() {
    let a = all_splits_agree(Dialect::Gemini, Framing::Json, GEMINI_JSON.as_bytes());
    let want = Usage {
        input_tokens: Some(200),
        output_tokens: Some(100),
        cache_write_tokens: None,
        cache_read_tokens: Some(1000),
    };
    assert_eq!(
        a,
        Accounting {
            usage: want,
            complete: true
        }
    );
    prefixes_are_incomplete(Dialect::Gemini, Framing::Json, GEMINI_JSON.as_bytes(), want);
}

#[test]
fn gemini_stream_as_sse_and_as_json_array() {
    let chunks = [
        r#"{"candidates":[{"content":{"parts":[{"text":"Hel"}],"role":"model"}}],"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":1,"totalTokenCount":10},"modelVersion":"gemini-2.5-flash"}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"lo"}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":4,"totalTokenCount":13},"modelVersion":"gemini-2.5-flash"}"#,
    ];
    let want = Usage {
        input_tokens: Some(9),
        output_tokens: Some(4),
        cache_write_tokens: None,
        cache_read_tokens: Some(0),
    };
    let sse: String = chunks
        .iter()
        .map(|c| format!("data: {c}\r\n\r\n"))
        .collect();
    let a = all_splits_agree(Dialect::Gemini, Framing::Sse, sse.as_bytes());
    assert_eq!(
        a,
        Accounting {
            usage: want,
            complete: true
        }
    );
    prefixes_are_incomplete(Dialect::Gemini, Framing::Sse, sse.as_bytes(), want);

    let array = format!("[{},\r\n{}]", chunks[0], chunks[1]);
    let a = all_splits_agree(Dialect::Gemini, Framing::Json, array.as_bytes());
    assert_eq!(
        a,
        Accounting {
            usage: want,
            complete: true
        }
    );
    prefixes_are_incomplete(Dialect::Gemini, Framing::Json, array.as_bytes(), want);

    // Without the finishing chunk the stream is incomplete, with the first chunk's counts.
    let first = format!("data: {}\n\n", chunks[0]);
    let a = meter(Dialect::Gemini, Framing::Sse, &[first.as_bytes()]);
    assert!(!a.complete);
    assert_eq!(a.usage.output_tokens, Some(1));
}

#[test]
fn malformed_or_foreign_answers_yield_no_usage() {
    for body in [
        &b""[..],
        b"not json",
        b"{\"usage\":{\"input_tokens\":1}}}",
        b"{\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}",
        b"{\"usage\":{\"input_tokens\":1}} {\"usage\":{\"input_tokens\":2}}",
    ] {
        let a = meter(Dialect::Anthropic, Framing::Json, &[body]);
        assert!(!a.complete, "{:?}", String::from_utf8_lossy(body));
    }
    // A usage value far larger than any real one is not captured.
    let huge = format!(
        "{{\"usage\":{{\"input_tokens\":1,\"pad\":\"{}\"}}}}",
        "x".repeat(halo_providers::usage::MAX_CAPTURE)
    );
    let a = meter(Dialect::Anthropic, Framing::Json, &[huge.as_bytes()]);
    assert_eq!(a.usage, Usage::default());
    assert!(!a.complete);
}

#[test]
fn cost_from_the_price_table() {
    use halo_policy::types::Price;
    let price = Price {
        input: 3.0,
        output: 15.0,
        cache_write: Some(3.75),
        cache_read: Some(0.30),
    };
    let usage = Usage {
        input_tokens: Some(2095),
        output_tokens: Some(503),
        cache_write_tokens: Some(2051),
        cache_read_tokens: Some(10240),
    };
    let want = (2095.0 * 3.0 + 503.0 * 15.0 + 2051.0 * 3.75 + 10240.0 * 0.30) / 1e6;
    let got = usage.cost_usd(Some(&price)).expect("priced");
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    // No price, or no output count: unknown, never zero.
    assert_eq!(usage.cost_usd(None), None);
    let partial = Usage {
        output_tokens: None,
        ..usage
    };
    assert_eq!(partial.cost_usd(Some(&price)), None);
    // Cache prices unset: cache tokens are billed as input.
    let plain = Price {
        cache_write: None,
        cache_read: None,
        ..price
    };
    let want = ((2095.0 + 2051.0 + 10240.0) * 3.0 + 503.0 * 15.0) / 1e6;
    let got = usage.cost_usd(Some(&plain)).expect("priced");
    assert!((got - want).abs() < 1e-12);
}
