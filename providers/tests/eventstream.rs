//! The Bedrock event stream to Anthropic SSE, fed in every possible split.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use halo_providers::eventstream::{
    DecodeError, Decoder, EventStreamToSse, chunk_frame, crc32, encode_frame,
};

const EVENTS: [&str; 4] = [
    r#"{"type":"message_start","message":{"id":"msg_1","role":"assistant","content":[],"model":"claude"}}"#,
    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hé\n"}}"#,
    r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\":"}}"#,
    r#"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":3}}"#,
];

fn stream() -> Vec<u8> {
    EVENTS.iter().flat_map(|e| chunk_frame(e)).collect()
}

fn expected_sse() -> String {
    EVENTS
        .iter()
        .map(|e| {
            let kind: serde_json::Value = serde_json::from_str(e).expect("json");
            format!(
                "event: {}\ndata: {e}\n\n",
                kind["type"].as_str().expect("type")
            )
        })
        .collect()
}

#[test]
fn crc32_matches_the_standard_check_value() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
}

#[test]
fn whole_stream_in_one_piece() {
    let mut conv = EventStreamToSse::new();
    let out = conv.feed(&stream()).expect("decoded");
    assert_eq!(String::from_utf8(out).expect("utf8"), expected_sse());
    assert_eq!(conv.finish(), Ok(()));
}

#[test]
fn split_at_every_byte_gives_the_same_events() {
    let bytes = stream();
    for cut in 0..=bytes.len() {
        let mut conv = EventStreamToSse::new();
        let mut out = conv.feed(&bytes[..cut]).expect("first part");
        out.extend(conv.feed(&bytes[cut..]).expect("second part"));
        assert_eq!(
            String::from_utf8(out).expect("utf8"),
            expected_sse(),
            "cut at {cut}"
        );
        assert_eq!(conv.finish(), Ok(()));
    }
}

#[test]
fn one_byte_at_a_time_emits_each_event_as_its_frame_completes() {
    let mut conv = EventStreamToSse::new();
    let mut events = 0;
    let mut frame_ends = Vec::new();
    let mut at = 0;
    for e in EVENTS {
        at += chunk_frame(e).len();
        frame_ends.push(at);
    }
    for (i, b) in stream().iter().enumerate() {
        let out = conv.feed(&[*b]).expect("byte");
        if !out.is_empty() {
            events += 1;
            assert_eq!(i + 1, frame_ends[events - 1], "event emitted late or early");
        }
    }
    assert_eq!(events, EVENTS.len());
}

#[test]
fn corrupted_frames_are_refused() {
    let frame = chunk_frame(EVENTS[0]);
    let mut bad_payload = frame.clone();
    let n = bad_payload.len();
    bad_payload[n - 10] ^= 1;
    assert_eq!(
        Decoder::new().feed(&bad_payload),
        Err(DecodeError::MessageCrc)
    );
    let mut bad_prelude = frame.clone();
    bad_prelude[9] ^= 1;
    assert_eq!(
        Decoder::new().feed(&bad_prelude),
        Err(DecodeError::PreludeCrc)
    );
    let mut huge = frame.clone();
    huge[0] = 0x7f;
    assert!(matches!(
        Decoder::new().feed(&huge),
        Err(DecodeError::FrameLength(_))
    ));
    let mut cut = Decoder::new();
    assert_eq!(cut.feed(&frame[..frame.len() - 1]), Ok(vec![]));
    assert_eq!(cut.finish(), Err(DecodeError::Truncated(frame.len() - 1)));
}

#[test]
fn an_exception_frame_becomes_an_anthropic_error_event() {
    let frame = encode_frame(
        &[
            (":message-type", "exception"),
            (":exception-type", "throttlingException"),
            (":content-type", "application/json"),
        ],
        br#"{"message":"Too many requests"}"#,
    );
    let out = EventStreamToSse::new().feed(&frame).expect("decoded");
    assert_eq!(
        String::from_utf8(out).expect("utf8"),
        "event: error\ndata: {\"error\":{\"message\":\"Too many requests\",\"type\":\"rate_limit_error\"},\"type\":\"error\"}\n\n"
    );
}

#[test]
fn a_chunk_without_base64_json_is_an_error() {
    let frame = encode_frame(
        &[(":message-type", "event"), (":event-type", "chunk")],
        br#"{"bytes":"not base64!"}"#,
    );
    assert!(matches!(
        EventStreamToSse::new().feed(&frame),
        Err(DecodeError::Payload(_))
    ));
}
