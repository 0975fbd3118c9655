//! Token usage read from a provider's answer as it streams by (spec: low-level design,
//! request path 12 "Deferred metrics"; DESIGN.md "The evidence loop", step 1).
//!
//! A [`Meter`] is fed the response body in pieces of any size and never holds the body:
//! it keeps a few bytes of parser state plus the bytes of the one small JSON value it is
//! looking for (a `usage` object, at most [`MAX_CAPTURE`] bytes). Feeding never fails and
//! never changes the bytes: accounting must not be able to break or delay an answer. A
//! malformed answer simply yields no usage, and the result says it is incomplete.
//!
//! What is read, per [`Dialect`] and [`Framing`]:
//! - Anthropic Messages (also Bedrock invoke and Vertex rawPredict, which answer in it):
//!   JSON `usage`; SSE `message_start` (`message.usage`) then `message_delta` (`usage`,
//!   cumulative), each field the latest seen; the AWS event stream carries the same
//!   events base64 in `chunk` frames (decoded with [`crate::eventstream::Decoder`]).
//! - Bedrock Converse: JSON `usage` (camelCase: `inputTokens`, `outputTokens`,
//!   `cacheReadInputTokens`, `cacheWriteInputTokens`); converse-stream is an AWS event
//!   stream whose `metadata` event (its last) carries the same `usage` as plain JSON.
//! - OpenAI Responses: JSON `usage`; SSE `response.usage` of `response.completed` (also
//!   `response.incomplete`/`response.failed`; earlier events carry `null`).
//! - Gemini generateContent / streamGenerateContent: `usageMetadata`, in one JSON object,
//!   in a JSON array of chunks (no `alt=sse`) or in SSE events; the latest wins, and a
//!   stream is complete once a candidate's `finishReason` was seen.
//!
//! Tokens are normalised to what a price table bills ([`Usage`]): `input_tokens` excludes
//! tokens read from the prompt cache (OpenAI's `input_tokens` and Gemini's
//! `promptTokenCount` include them, Anthropic's do not), and Gemini's thinking tokens
//! count as output (OpenAI's `output_tokens` already include reasoning).
//!
//! The JSON reader here is structural, not validating: the response is the provider's and
//! goes to the client unchanged; this only has to find one value reliably. Keys written
//! with escapes are not recognised (providers write these keys plainly).

use serde::Deserialize;

use crate::eventstream::Decoder;

/// The largest usage value kept; a larger one is not a usage object and is ignored.
pub const MAX_CAPTURE: usize = 16 * 1024;
/// Deeper nesting than this stops the reader (the answer is then not metered).
const MAX_DEPTH: usize = 128;
/// Keys longer than this are never one of the keys looked for.
const MAX_KEY: usize = 24;

/// The provider wire an answer is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Anthropic Messages (Anthropic, Bedrock invoke, Vertex rawPredict).
    Anthropic,
    /// Bedrock Converse (`converse`, `converse-stream`).
    BedrockConverse,
    /// OpenAI Responses (OpenAI, Azure OpenAI).
    OpenAiResponses,
    /// Gemini generateContent / streamGenerateContent.
    Gemini,
}

impl Dialect {
    /// The dialect of an answer to `operation` on `wire` (Bedrock invoke and Vertex
    /// rawPredict answer in Anthropic's Messages shape; Bedrock converse in its own).
    pub fn of(
        wire: halo_policy::types::WireProtocol,
        operation: halo_policy::admit::Operation,
    ) -> Dialect {
        use halo_policy::admit::Operation;
        use halo_policy::types::WireProtocol;
        match wire {
            WireProtocol::BedrockInvoke
                if matches!(operation, Operation::Converse | Operation::ConverseStream) =>
            {
                Dialect::BedrockConverse
            }
            WireProtocol::AnthropicMessages | WireProtocol::BedrockInvoke => Dialect::Anthropic,
            WireProtocol::OpenaiResponses => Dialect::OpenAiResponses,
            WireProtocol::Gemini => Dialect::Gemini,
        }
    }
}

/// How the answer is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// One JSON document (an object, or for Gemini's stream without `alt=sse` an array).
    Json,
    /// `text/event-stream`.
    Sse,
    /// `application/vnd.amazon.eventstream` (Bedrock invoke-with-response-stream).
    AwsEventStream,
}

impl Framing {
    /// The framing a response content type announces (parameters ignored).
    pub fn from_content_type(content_type: &str) -> Framing {
        let mime = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match mime.as_str() {
            "text/event-stream" => Framing::Sse,
            crate::eventstream::EVENTSTREAM_CONTENT_TYPE => Framing::AwsEventStream,
            _ => Framing::Json,
        }
    }
}

/// Tokens of one model call, by how they are billed. `None`: not reported (yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens billed at the input price (not read from the cache).
    pub input_tokens: Option<u64>,
    /// Completion tokens, reasoning/thinking included.
    pub output_tokens: Option<u64>,
    /// Prompt tokens written to the cache (Anthropic `cache_creation_input_tokens`).
    pub cache_write_tokens: Option<u64>,
    /// Prompt tokens read from the cache.
    pub cache_read_tokens: Option<u64>,
}

impl Usage {
    /// The call's cost in USD at `price` (the policy's price table); `None` (unknown, never
    /// zero) without a price or without the input and output counts.
    pub fn cost_usd(&self, price: Option<&halo_policy::types::Price>) -> Option<f64> {
        price?.cost_usd(
            self.input_tokens,
            self.output_tokens,
            self.cache_write_tokens,
            self.cache_read_tokens,
        )
    }

    /// Every field `later` reports replaces this one's.
    fn merge(&mut self, later: Usage) {
        fn pick(a: &mut Option<u64>, b: Option<u64>) {
            if b.is_some() {
                *a = b;
            }
        }
        pick(&mut self.input_tokens, later.input_tokens);
        pick(&mut self.output_tokens, later.output_tokens);
        pick(&mut self.cache_write_tokens, later.cache_write_tokens);
        pick(&mut self.cache_read_tokens, later.cache_read_tokens);
    }
}

/// What a metered answer reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Accounting {
    pub usage: Usage,
    /// The answer ended normally and its final usage was read. `false`: cut, malformed or
    /// without usage; `usage` is then what was seen.
    pub complete: bool,
}

/// Reads usage from one answer, incrementally.
#[derive(Debug)]
pub struct Meter {
    dialect: Dialect,
    body: Body,
    usage: Usage,
    final_seen: bool,
    finish_reason_seen: bool,
    broken: bool,
}

#[derive(Debug)]
enum Body {
    Json(JsonTap),
    Sse(Sse),
    EventStream(Decoder),
}

impl Meter {
    pub fn new(dialect: Dialect, framing: Framing) -> Meter {
        let body = match framing {
            Framing::Json => Body::Json(JsonTap::new(paths(dialect))),
            Framing::Sse => Body::Sse(Sse::default()),
            Framing::AwsEventStream => Body::EventStream(Decoder::new()),
        };
        Meter {
            dialect,
            body,
            usage: Usage::default(),
            final_seen: false,
            finish_reason_seen: false,
            broken: false,
        }
    }

    /// The next piece of the answer, as it goes to the client.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.broken {
            return;
        }
        let dialect = self.dialect;
        let mut found = Vec::new();
        match &mut self.body {
            Body::Json(tap) => {
                tap.feed(bytes, &mut found);
                self.broken |= tap.broken;
            }
            Body::Sse(sse) => sse.feed(dialect, bytes, &mut found),
            Body::EventStream(decoder) => match decoder.feed(bytes) {
                Ok(frames) => {
                    for frame in frames {
                        if let Some(json) = event_json(dialect, &frame) {
                            let mut tap = JsonTap::new(paths(dialect));
                            tap.feed(&json, &mut found);
                        }
                    }
                }
                Err(_) => self.broken = true,
            },
        }
        for (path, value) in found {
            self.take(path, &value);
        }
    }

    /// The usage seen so far (each field the latest reported).
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The answer ended normally.
    pub fn finish(mut self) -> Accounting {
        let ended = match &mut self.body {
            Body::Json(tap) => tap.closed && !tap.broken,
            Body::Sse(sse) => sse.at_boundary(),
            Body::EventStream(decoder) => decoder.finish().is_ok(),
        };
        let complete = ended && !self.broken && self.final_seen;
        Accounting {
            usage: self.usage,
            complete,
        }
    }

    /// The answer was cut (reset, timeout, client gone): what was seen, incomplete.
    pub fn cut(self) -> Accounting {
        Accounting {
            usage: self.usage,
            complete: false,
        }
    }

    fn take(&mut self, path: Path, value: &[u8]) {
        match path {
            Path::FinishReason => {
                if !value.starts_with(b"null") {
                    self.finish_reason_seen = true;
                    if self.usage != Usage::default() {
                        self.final_seen = true;
                    }
                }
            }
            Path::Usage { last } => {
                let Some(usage) = parse_usage(self.dialect, value) else {
                    return;
                };
                self.usage.merge(usage);
                match self.dialect {
                    Dialect::Gemini => self.final_seen = self.finish_reason_seen,
                    _ => self.final_seen |= last,
                }
            }
        }
    }
}

/// What a captured value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// A usage object; `last`: this one carries the final counts.
    Usage { last: bool },
    /// Gemini `candidates[].finishReason`.
    FinishReason,
}

type Paths = &'static [(&'static [&'static str], Path)];

/// The key paths (arrays are transparent) of the values read, per dialect. For a JSON
/// answer and for each SSE event alike.
fn paths(dialect: Dialect) -> Paths {
    match dialect {
        Dialect::Anthropic => &[
            (&["usage"], Path::Usage { last: true }),
            (&["message", "usage"], Path::Usage { last: false }),
        ],
        // The JSON answer's `usage`, and the stream's `metadata` event's.
        Dialect::BedrockConverse => &[(&["usage"], Path::Usage { last: true })],
        Dialect::OpenAiResponses => &[
            (&["usage"], Path::Usage { last: true }),
            (&["response", "usage"], Path::Usage { last: true }),
        ],
        Dialect::Gemini => &[
            (&["usageMetadata"], Path::Usage { last: true }),
            (&["candidates", "finishReason"], Path::FinishReason),
        ],
    }
}

#[derive(Deserialize)]
struct AnthropicUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

/// Bedrock Converse's `TokenUsage`: `inputTokens` excludes the cache's tokens, as
/// Anthropic's `input_tokens` does (`totalTokens` is not read).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConverseUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_write_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct OpenAiUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    input_tokens_details: Option<OpenAiInputDetails>,
}

#[derive(Deserialize)]
struct OpenAiInputDetails {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct GeminiUsage {
    prompt_token_count: Option<u64>,
    candidates_token_count: Option<u64>,
    cached_content_token_count: Option<u64>,
    thoughts_token_count: Option<u64>,
}

/// A captured usage value in `dialect`'s shape, normalised; `None` for `null` or a value of
/// another shape.
fn parse_usage(dialect: Dialect, value: &[u8]) -> Option<Usage> {
    match dialect {
        Dialect::Anthropic => {
            let u: AnthropicUsage = serde_json::from_slice(value).ok()?;
            Some(Usage {
                input_tokens: u.input_tokens,
                output_tokens: u.output_tokens,
                cache_write_tokens: u.cache_creation_input_tokens,
                cache_read_tokens: u.cache_read_input_tokens,
            })
        }
        Dialect::BedrockConverse => {
            let u: ConverseUsage = serde_json::from_slice(value).ok()?;
            Some(Usage {
                input_tokens: u.input_tokens,
                output_tokens: u.output_tokens,
                cache_write_tokens: u.cache_write_input_tokens,
                cache_read_tokens: u.cache_read_input_tokens,
            })
        }
        Dialect::OpenAiResponses => {
            let u: OpenAiUsage = serde_json::from_slice(value).ok()?;
            let cached = u.input_tokens_details.and_then(|d| d.cached_tokens);
            Some(Usage {
                input_tokens: u
                    .input_tokens
                    .map(|i| i.saturating_sub(cached.unwrap_or(0))),
                output_tokens: u.output_tokens,
                cache_write_tokens: None,
                cache_read_tokens: cached.or(u.input_tokens.map(|_| 0)),
            })
        }
        Dialect::Gemini => {
            let u: GeminiUsage = serde_json::from_slice(value).ok()?;
            let cached = u.cached_content_token_count;
            let output = match (u.candidates_token_count, u.thoughts_token_count) {
                (None, None) => None,
                (c, t) => Some(c.unwrap_or(0) + t.unwrap_or(0)),
            };
            Some(Usage {
                input_tokens: u
                    .prompt_token_count
                    .map(|p| p.saturating_sub(cached.unwrap_or(0))),
                output_tokens: output,
                cache_write_tokens: None,
                cache_read_tokens: cached.or(u.prompt_token_count.map(|_| 0)),
            })
        }
    }
}

/// The event JSON of an AWS event stream frame that may carry usage: for Bedrock invoke,
/// the Anthropic event a `chunk` frame carries (base64); for converse-stream, the
/// `metadata` event itself (plain JSON). Other frames (content, exceptions) carry none.
fn event_json(dialect: Dialect, frame: &crate::eventstream::Frame) -> Option<Vec<u8>> {
    match dialect {
        Dialect::BedrockConverse => (frame.header(":message-type") == Some("event")
            && frame.header(":event-type") == Some("metadata"))
        .then(|| frame.payload.to_vec()),
        _ => bedrock_chunk(frame),
    }
}

/// The Anthropic event JSON a Bedrock `chunk` frame carries.
fn bedrock_chunk(frame: &crate::eventstream::Frame) -> Option<Vec<u8>> {
    use base64::Engine as _;
    #[derive(Deserialize)]
    struct Chunk<'a> {
        #[serde(borrow)]
        bytes: &'a str,
    }
    if frame.header(":message-type") != Some("event")
        || frame.header(":event-type") != Some("chunk")
    {
        return None;
    }
    let chunk: Chunk<'_> = serde_json::from_slice(&frame.payload).ok()?;
    base64::engine::general_purpose::STANDARD
        .decode(chunk.bytes.as_bytes())
        .ok()
}

/// SSE framing: each event's `data` is streamed into its own [`JsonTap`].
#[derive(Debug, Default)]
struct Sse {
    /// The field name of the current line so far (`None`: past the name).
    field: Option<Vec<u8>>,
    kind: LineKind,
    /// The byte after the `:` of a field is a space to skip.
    skip_space: bool,
    after_cr: bool,
    event: Option<JsonTap>,
    /// At least one data line ended in the current event (a second one adds `\n`).
    data_lines: usize,
    /// Bytes seen since the last event boundary (a blank line).
    pending: bool,
    /// The current `event:` line's value so far (`None`: longer than any name skipped).
    name: Option<Vec<u8>>,
    /// The current event's name says it carries no usage ([`carries_no_usage`]): its
    /// data is passed over unread.
    skip: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum LineKind {
    #[default]
    Name,
    Data,
    /// An `event:` line: the event's name.
    Event,
    Other,
}

/// Whether an SSE event named `name` carries no usage in any wire the meter reads: the
/// many small events of a stream's text (Anthropic's `content_block_delta` and `ping`,
/// OpenAI's `response.*.delta`). Their data is most of a stream's bytes, and reading it
/// byte by byte was most of the accounting's cost on a streamed answer. Any other name,
/// and data before its event's name, is read.
fn carries_no_usage(name: &[u8]) -> bool {
    name == b"content_block_delta" || name == b"ping" || name.ends_with(b".delta")
}

impl Sse {
    fn feed(&mut self, dialect: Dialect, bytes: &[u8], found: &mut Vec<(Path, Vec<u8>)>) {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    i += 1;
                    continue;
                }
            }
            if b == b'\n' || b == b'\r' {
                self.after_cr = b == b'\r';
                self.end_line(dialect, found);
                i += 1;
                continue;
            }
            self.pending = true;
            match self.kind {
                LineKind::Name => {
                    if b == b':' {
                        let name = self.field.take().unwrap_or_default();
                        self.kind = if name == b"data" && self.skip {
                            LineKind::Other
                        } else if name == b"data" {
                            if self.data_lines > 0 {
                                self.tap(dialect).feed(b"\n", found);
                            }
                            LineKind::Data
                        } else if name == b"event" {
                            self.name = Some(Vec::new());
                            LineKind::Event
                        } else {
                            LineKind::Other
                        };
                        self.skip_space = true;
                    } else {
                        let field = self.field.get_or_insert_with(Vec::new);
                        if field.len() < 8 {
                            field.push(b);
                        } else {
                            self.kind = LineKind::Other;
                        }
                    }
                    i += 1;
                }
                LineKind::Data => {
                    let (start, end) = self.value_in(bytes, i);
                    self.tap(dialect).feed(&bytes[start..end], found);
                    i = end;
                }
                LineKind::Event => {
                    let (start, end) = self.value_in(bytes, i);
                    if let Some(name) = self.name.as_mut() {
                        name.extend_from_slice(&bytes[start..end]);
                        if name.len() > 64 {
                            self.name = None;
                        }
                    }
                    i = end;
                }
                LineKind::Other => {
                    i = bytes[i..]
                        .iter()
                        .position(|&c| c == b'\n' || c == b'\r')
                        .map_or(bytes.len(), |p| i + p);
                }
            }
        }
    }

    /// The part of a field's value in `bytes` from `i`: after the space that may follow
    /// the colon, up to the line's end or the piece's.
    fn value_in(&mut self, bytes: &[u8], i: usize) -> (usize, usize) {
        let mut start = i;
        if std::mem::take(&mut self.skip_space) && bytes.get(i) == Some(&b' ') {
            start += 1;
        }
        let end = bytes[start..]
            .iter()
            .position(|&c| c == b'\n' || c == b'\r')
            .map_or(bytes.len(), |p| start + p);
        (start, end)
    }

    fn tap(&mut self, dialect: Dialect) -> &mut JsonTap {
        self.event
            .get_or_insert_with(|| JsonTap::new(paths(dialect)))
    }

    fn end_line(&mut self, dialect: Dialect, found: &mut Vec<(Path, Vec<u8>)>) {
        let blank = self.kind == LineKind::Name && self.field.is_none();
        match self.kind {
            LineKind::Data => self.data_lines += 1,
            // Data already read before the name is kept (a name after data is rare).
            LineKind::Event => {
                self.skip = self.data_lines == 0
                    && self.event.is_none()
                    && self.name.take().is_some_and(|n| carries_no_usage(&n));
            }
            // `data` without a colon is a data line with an empty value.
            LineKind::Name if self.field.as_deref() == Some(b"data") && !self.skip => {
                if self.data_lines > 0 {
                    self.tap(dialect).feed(b"\n", found);
                }
                self.data_lines += 1;
            }
            _ => {}
        }
        self.kind = LineKind::Name;
        self.field = None;
        self.skip_space = false;
        if blank {
            // Event boundary: values complete only at their end were captured by the tap
            // already; a scalar at the very end of the data is closed here.
            if let Some(mut tap) = self.event.take() {
                tap.end(found);
            }
            self.data_lines = 0;
            self.pending = false;
            self.skip = false;
            self.name = None;
        }
    }

    /// The stream ended here: true on an event boundary. A last event without its blank
    /// line is dispatched by no SSE client, so it is not read either.
    fn at_boundary(&self) -> bool {
        !self.pending
    }
}

/// A structural JSON reader that captures the values at a few key paths.
#[derive(Debug)]
struct JsonTap {
    paths: Paths,
    /// One entry per open container: `Some(key)` for an object (its current key, empty
    /// before the first), `None` for an array.
    stack: Vec<Level>,
    lex: Lex,
    key: Vec<u8>,
    capture: Option<Capture>,
    /// The top-level value ended.
    closed: bool,
    broken: bool,
}

#[derive(Debug)]
struct Level {
    object: bool,
    key: Vec<u8>,
    /// The next string in this object is a key.
    expect_key: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    /// Between tokens.
    Between,
    /// Inside a string; `key`: an object key.
    Str { key: bool, escape: bool },
    /// Inside a number or literal.
    Scalar,
}

#[derive(Debug)]
struct Capture {
    path: Path,
    bytes: Vec<u8>,
    /// Stack depth the captured value started at.
    depth: usize,
    overflow: bool,
}

impl JsonTap {
    fn new(paths: Paths) -> JsonTap {
        JsonTap {
            paths,
            stack: Vec::new(),
            lex: Lex::Between,
            key: Vec::new(),
            capture: None,
            closed: false,
            broken: false,
        }
    }

    fn feed(&mut self, bytes: &[u8], found: &mut Vec<(Path, Vec<u8>)>) {
        let mut rest = bytes;
        while let Some((&b, after)) = rest.split_first() {
            if self.broken {
                return;
            }
            // Inside a string value that is not captured nothing is read until its
            // closing quote or an escape: most of an answer is such text, skipped with the
            // body scanner's vector search instead of the state machine per byte (4 KB of
            // text: 388k wasm instructions to 45k, halo-wasm-profile).
            if self.lex
                == (Lex::Str {
                    key: false,
                    escape: false,
                })
                && self.capture.is_none()
            {
                let plain = halo_policy::body_scan::plain_run(rest);
                if plain == rest.len() {
                    return;
                }
                if plain > 0 {
                    rest = &rest[plain..];
                    continue;
                }
            }
            self.byte(b, found);
            rest = after;
        }
    }

    /// The input ended: a scalar running to the end is complete.
    fn end(&mut self, found: &mut Vec<(Path, Vec<u8>)>) {
        if self.lex == Lex::Scalar {
            self.lex = Lex::Between;
            self.value_ended(found);
        }
    }

    fn byte(&mut self, b: u8, found: &mut Vec<(Path, Vec<u8>)>) {
        match self.lex {
            Lex::Str { key, escape } => {
                self.record(b);
                if escape {
                    self.lex = Lex::Str { key, escape: false };
                    if key {
                        self.push_key(b);
                    }
                } else if b == b'\\' {
                    self.lex = Lex::Str { key, escape: true };
                    if key {
                        // Escaped keys are not matched: make this one unmatchable.
                        self.key.resize(MAX_KEY + 1, 0);
                    }
                } else if b == b'"' {
                    self.lex = Lex::Between;
                    if key {
                        if let Some(top) = self.stack.last_mut() {
                            top.key = std::mem::take(&mut self.key);
                            top.expect_key = false;
                        }
                    } else {
                        self.value_ended(found);
                    }
                } else if key {
                    self.push_key(b);
                }
            }
            Lex::Scalar => {
                if matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                    self.lex = Lex::Between;
                    self.value_ended(found);
                    self.byte(b, found);
                } else {
                    self.record(b);
                }
            }
            Lex::Between => match b {
                b' ' | b'\t' | b'\n' | b'\r' | b':' => {
                    self.record(b);
                }
                b',' => {
                    self.record(b);
                    if let Some(top) = self.stack.last_mut()
                        && top.object
                    {
                        top.expect_key = true;
                    }
                }
                b'"' => {
                    let key = self.stack.last().is_some_and(|l| l.object && l.expect_key);
                    if key {
                        self.key.clear();
                        self.record(b);
                    } else {
                        self.value_starts();
                        self.record(b);
                    }
                    self.lex = Lex::Str { key, escape: false };
                }
                b'{' | b'[' => {
                    self.value_starts();
                    self.record(b);
                    if self.stack.len() >= MAX_DEPTH {
                        self.broken = true;
                        return;
                    }
                    self.stack.push(Level {
                        object: b == b'{',
                        key: Vec::new(),
                        expect_key: b == b'{',
                    });
                }
                b'}' | b']' => {
                    self.record(b);
                    if self.stack.pop().is_none() {
                        self.broken = true;
                        return;
                    }
                    self.value_ended(found);
                }
                _ => {
                    self.value_starts();
                    self.record(b);
                    self.lex = Lex::Scalar;
                }
            },
        }
    }

    fn push_key(&mut self, b: u8) {
        if self.key.len() <= MAX_KEY {
            self.key.push(b);
        }
    }

    fn record(&mut self, b: u8) {
        if let Some(c) = &mut self.capture
            && !c.overflow
        {
            if c.bytes.len() >= MAX_CAPTURE {
                c.overflow = true;
                c.bytes = Vec::new();
            } else {
                c.bytes.push(b);
            }
        }
    }

    /// A value begins at the current position: capture it if its path is one looked for.
    fn value_starts(&mut self) {
        if self.capture.is_some() {
            return;
        }
        if self.stack.is_empty() && self.closed {
            // Something after the top-level value: not a JSON document (Gemini's chunk
            // array is one value; SSE data is one value per event).
            self.broken = true;
            return;
        }
        let path = self
            .paths
            .iter()
            .find(|(keys, _)| {
                let mut objects = self.stack.iter().filter(|l| l.object);
                keys.iter()
                    .all(|k| objects.next().is_some_and(|l| l.key == k.as_bytes()))
                    && objects.next().is_none()
            })
            .map(|(_, p)| *p);
        if let Some(path) = path {
            self.capture = Some(Capture {
                path,
                bytes: Vec::new(),
                depth: self.stack.len(),
                overflow: false,
            });
        }
    }

    /// A value (scalar, string or container) just ended.
    fn value_ended(&mut self, found: &mut Vec<(Path, Vec<u8>)>) {
        if self
            .capture
            .as_ref()
            .is_some_and(|c| c.depth == self.stack.len())
            && let Some(c) = self.capture.take()
            && !c.overflow
        {
            found.push((c.path, c.bytes));
        }
        if self.stack.is_empty() {
            self.closed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dialect: Dialect, framing: Framing, body: &[u8]) -> Accounting {
        let mut m = Meter::new(dialect, framing);
        m.feed(body);
        m.finish()
    }

    #[test]
    fn usage_path_inside_content_is_not_usage() {
        let body = br#"{"content":[{"type":"tool_use","input":{"usage":{"input_tokens":999}}}],"usage":{"input_tokens":3,"output_tokens":4}}"#;
        let a = run(Dialect::Anthropic, Framing::Json, body);
        assert_eq!(a.usage.input_tokens, Some(3));
        assert!(a.complete);
    }

    /// A stream's text events are passed over unread (they carry no usage); an event
    /// whose data comes before its name, or with any other name, is read.
    #[test]
    fn text_events_are_passed_over_and_others_read() {
        let stream = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
            // Not usage by its name, though it looks like usage: passed over.
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"usage\":{\"output_tokens\":999}}\n\n",
            "event: ping\r\ndata: {\"usage\":{\"output_tokens\":998}}\r\n\r\n",
            "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n",
            "event: content_block_delta\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let a = run(Dialect::Anthropic, Framing::Sse, stream.as_bytes());
        assert_eq!(a.usage.input_tokens, Some(5));
        // The data before its event's name was read, whatever the name.
        assert_eq!(a.usage.output_tokens, Some(7));
        assert!(a.complete);
        let openai = concat!(
            "event: response.output_text.delta\n",
            "data: {\"type\":\"response.output_text.delta\",\"response\":{\"usage\":{\"input_tokens\":999}}}\n\n",
            "event: response.completed\n",
            "data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":4}}}\n\n",
        );
        let a = run(Dialect::OpenAiResponses, Framing::Sse, openai.as_bytes());
        assert_eq!(
            (a.usage.input_tokens, a.usage.output_tokens),
            (Some(3), Some(4))
        );
    }

    #[test]
    fn a_string_mentioning_usage_is_not_a_key() {
        let body = br#"{"text":"\"usage\": {\"input_tokens\": 9}","usage":{"input_tokens":1,"output_tokens":2}}"#;
        let a = run(Dialect::Anthropic, Framing::Json, body);
        assert_eq!(a.usage.input_tokens, Some(1));
    }

    #[test]
    fn content_type_picks_framing() {
        assert_eq!(
            Framing::from_content_type("text/event-stream; charset=utf-8"),
            Framing::Sse
        );
        assert_eq!(
            Framing::from_content_type("application/vnd.amazon.eventstream"),
            Framing::AwsEventStream
        );
        assert_eq!(
            Framing::from_content_type("application/json"),
            Framing::Json
        );
    }
}
