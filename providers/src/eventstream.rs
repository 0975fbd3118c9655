//! The Bedrock `invoke-with-response-stream` answer, an AWS event stream, turned into the
//! Anthropic SSE an Anthropic client expects, incrementally: bytes go in as they arrive,
//! in pieces of any size, and each complete frame comes out as one SSE event at once.
//!
//! Frame layout (AWS event stream encoding, all integers big-endian):
//! `total_len u32 | headers_len u32 | prelude_crc u32 | headers | payload | message_crc u32`,
//! where prelude_crc is the CRC-32 (IEEE) of the first 8 bytes and message_crc of
//! everything before it. A header is `name_len u8 | name | type u8 | value`.
//!
//! A `chunk` event's payload is `{"bytes": "<base64 of one Anthropic event JSON>"}`; it
//! becomes `event: <its type>\ndata: <json>\n\n`. An exception frame becomes an Anthropic
//! `error` event. Written here rather than taken from aws-smithy-eventstream, which would
//! bring aws-smithy-types and its dependencies into the wasm module for ~150 lines of
//! framing; every frame is checked against both CRCs.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The content type of an AWS event stream answer.
pub const EVENTSTREAM_CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";

/// Largest frame accepted (AWS caps a message at 16 MiB of payload plus headers).
const MAX_FRAME: usize = 16 * 1024 * 1024 + 128 * 1024;
const PRELUDE: usize = 12;
const MIN_FRAME: usize = PRELUDE + 4;

/// Why the stream cannot be converted; the conversion stops there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("event stream frame of {0} bytes is out of bounds")]
    FrameLength(usize),
    #[error("event stream prelude CRC mismatch")]
    PreludeCrc,
    #[error("event stream message CRC mismatch")]
    MessageCrc,
    #[error("event stream headers are malformed")]
    Headers,
    #[error("event stream chunk payload is malformed: {0}")]
    Payload(String),
    #[error("event stream ended inside a frame ({0} bytes pending)")]
    Truncated(usize),
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// String-valued headers (`:event-type`, `:message-type`, ...); others are skipped.
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Incremental frame decoder.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Add bytes; return every frame now complete, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Frame>, DecodeError> {
        self.buf.extend_from_slice(bytes);
        let mut frames = Vec::new();
        let mut at = 0;
        loop {
            let rest = &self.buf[at..];
            if rest.len() < PRELUDE {
                break;
            }
            let total = be32(&rest[0..4]) as usize;
            if !(MIN_FRAME..=MAX_FRAME).contains(&total) {
                return Err(DecodeError::FrameLength(total));
            }
            if crc32(&rest[0..8]) != be32(&rest[8..12]) {
                return Err(DecodeError::PreludeCrc);
            }
            if rest.len() < total {
                break;
            }
            frames.push(decode_frame(&rest[..total])?);
            at += total;
        }
        self.buf.drain(..at);
        Ok(frames)
    }

    /// The stream ended: an error if a frame was cut off.
    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Truncated(self.buf.len()))
        }
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be16(b: &[u8]) -> usize {
    u16::from_be_bytes([b[0], b[1]]) as usize
}

/// `frame` is exactly one frame whose prelude was checked.
fn decode_frame(frame: &[u8]) -> Result<Frame, DecodeError> {
    let total = frame.len();
    if crc32(&frame[..total - 4]) != be32(&frame[total - 4..]) {
        return Err(DecodeError::MessageCrc);
    }
    let headers_len = be32(&frame[4..8]) as usize;
    let headers_end = PRELUDE
        .checked_add(headers_len)
        .filter(|end| *end <= total - 4)
        .ok_or(DecodeError::Headers)?;
    let headers = decode_headers(&frame[PRELUDE..headers_end])?;
    Ok(Frame {
        headers,
        payload: frame[headers_end..total - 4].to_vec(),
    })
}

fn decode_headers(mut b: &[u8]) -> Result<Vec<(String, String)>, DecodeError> {
    let mut out = Vec::new();
    let take = |b: &mut &[u8], n: usize| -> Result<Vec<u8>, DecodeError> {
        if b.len() < n {
            return Err(DecodeError::Headers);
        }
        let (head, tail) = b.split_at(n);
        *b = tail;
        Ok(head.to_vec())
    };
    while !b.is_empty() {
        let name_len = take(&mut b, 1)?[0] as usize;
        let name = String::from_utf8(take(&mut b, name_len)?).map_err(|_| DecodeError::Headers)?;
        let kind = take(&mut b, 1)?[0];
        match kind {
            0 | 1 => {}
            2 => drop(take(&mut b, 1)?),
            3 => drop(take(&mut b, 2)?),
            4 => drop(take(&mut b, 4)?),
            5 | 8 => drop(take(&mut b, 8)?),
            9 => drop(take(&mut b, 16)?),
            6 | 7 => {
                let len = be16(&take(&mut b, 2)?);
                let value = take(&mut b, len)?;
                if kind == 7 {
                    let value = String::from_utf8(value).map_err(|_| DecodeError::Headers)?;
                    out.push((name, value));
                }
            }
            _ => return Err(DecodeError::Headers),
        }
    }
    Ok(out)
}

/// CRC-32 (IEEE 802.3, reflected, as zlib's crc32).
pub fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &b in bytes {
        crc = TABLE[((crc ^ b as u32) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

#[derive(Deserialize)]
struct Chunk {
    bytes: String,
}

#[derive(Deserialize)]
struct EventType<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
}

/// Bedrock event stream in, Anthropic SSE out.
#[derive(Debug, Default)]
pub struct EventStreamToSse {
    decoder: Decoder,
}

impl EventStreamToSse {
    pub fn new() -> EventStreamToSse {
        EventStreamToSse::default()
    }

    /// Add upstream bytes; return the SSE bytes now ready for the client (possibly none).
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<u8>, DecodeError> {
        let mut out = Vec::new();
        for frame in self.decoder.feed(bytes)? {
            sse_for_frame(&frame, &mut out)?;
        }
        Ok(out)
    }

    /// The upstream stream ended.
    pub fn finish(&self) -> Result<(), DecodeError> {
        self.decoder.finish()
    }
}

fn sse_for_frame(frame: &Frame, out: &mut Vec<u8>) -> Result<(), DecodeError> {
    match frame.header(":message-type") {
        Some("event") => {}
        Some("exception") | Some("error") => {
            let kind = frame
                .header(":exception-type")
                .or_else(|| frame.header(":error-code"))
                .unwrap_or("unknown");
            let message = serde_json::from_slice::<serde_json::Value>(&frame.payload)
                .ok()
                .and_then(|v| {
                    v.get("message")
                        .and_then(|m| m.as_str().map(str::to_string))
                })
                .unwrap_or_else(|| "the upstream stream failed".to_string());
            let error_type = match kind {
                "throttlingException" | "ThrottlingException" => "rate_limit_error",
                "serviceUnavailableException" | "ServiceUnavailableException" => "overloaded_error",
                "validationException" | "ValidationException" => "invalid_request_error",
                _ => "api_error",
            };
            let data = serde_json::json!({
                "type": "error",
                "error": {"type": error_type, "message": message}
            });
            push_event(out, "error", data.to_string().as_bytes());
            return Ok(());
        }
        // Anything else (for example a future initial-response) carries no content.
        _ => return Ok(()),
    }
    if frame.header(":event-type") != Some("chunk") {
        return Ok(());
    }
    let chunk: Chunk =
        serde_json::from_slice(&frame.payload).map_err(|e| DecodeError::Payload(e.to_string()))?;
    let json = base64::engine::general_purpose::STANDARD
        .decode(chunk.bytes.as_bytes())
        .map_err(|e| DecodeError::Payload(e.to_string()))?;
    // The event must be one JSON object with a "type": it becomes the SSE event name.
    let raw: &RawValue =
        serde_json::from_slice(&json).map_err(|e| DecodeError::Payload(e.to_string()))?;
    let kind: EventType<'_> =
        serde_json::from_str(raw.get()).map_err(|e| DecodeError::Payload(e.to_string()))?;
    if kind.kind.is_empty() || kind.kind.contains(['\n', '\r']) {
        return Err(DecodeError::Payload("bad event type".into()));
    }
    push_event(out, kind.kind, raw.get().as_bytes());
    Ok(())
}

fn push_event(out: &mut Vec<u8>, event: &str, data: &[u8]) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
}

/// Encode one frame with string headers (the inverse of [`Decoder`]; for tests and fakes).
pub fn encode_frame(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    for (name, value) in headers {
        h.push(name.len() as u8);
        h.extend_from_slice(name.as_bytes());
        h.push(7);
        h.extend_from_slice(&(value.len() as u16).to_be_bytes());
        h.extend_from_slice(value.as_bytes());
    }
    let total = (PRELUDE + h.len() + payload.len() + 4) as u32;
    let mut f = Vec::with_capacity(total as usize);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&(h.len() as u32).to_be_bytes());
    let prelude_crc = crc32(&f);
    f.extend_from_slice(&prelude_crc.to_be_bytes());
    f.extend_from_slice(&h);
    f.extend_from_slice(payload);
    let crc = crc32(&f);
    f.extend_from_slice(&crc.to_be_bytes());
    f
}

/// A Bedrock `chunk` frame carrying one Anthropic event JSON.
pub fn chunk_frame(event_json: &str) -> Vec<u8> {
    let payload = serde_json::json!({
        "bytes": base64::engine::general_purpose::STANDARD.encode(event_json.as_bytes())
    })
    .to_string();
    encode_frame(
        &[
            (":event-type", "chunk"),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.as_bytes(),
    )
}
