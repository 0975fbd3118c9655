//! admit: which client wire and operation a request is, and whether its model is a policy
//! alias (spec: Request path, step 5 "admit"; Endpoints). Also the body model rewrite.
//!
//! Served paths (the query string is ignored for matching and never read):
//!
//! | wire              | method and path                                          | model |
//! |-------------------|----------------------------------------------------------|-------|
//! | anthropic-messages| POST `/v1/messages`, POST `/v1/messages/count_tokens`    | body  |
//! | openai-responses  | POST `/v1/responses`                                     | body  |
//! | bedrock-invoke    | POST `/model/{id}/invoke`, `/invoke-with-response-stream`, `/converse`, `/converse-stream` | path, percent-decoded |
//! | gemini            | POST `/v1beta/models/{model}:generateContent`, `:streamGenerateContent`, `:countTokens` | path, percent-decoded |
//! | (passthrough)     | GET `/v1/models`                                         | none  |
//!
//! `/v1/messages/batches` and everything under it is refused with 400 (a batch would escape
//! per-request routing and the allowlist). Any other path, or a served path with another
//! method, is 404. A missing, unparseable or non-alias model is 400 (fail closed). Error
//! bodies use the Anthropic error shape every supported harness displays.

use serde::Serialize;

use crate::body_scan::{self, TopLevel};
use crate::snapshot::Snapshot;
use crate::types::WireProtocol;

/// What a model call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// anthropic-messages `/v1/messages`.
    Messages,
    /// anthropic-messages `/v1/messages/count_tokens` or gemini `:countTokens`.
    CountTokens,
    /// bedrock `invoke`.
    Invoke,
    /// bedrock `invoke-with-response-stream`.
    InvokeStream,
    /// bedrock `converse`.
    Converse,
    /// bedrock `converse-stream`.
    ConverseStream,
    /// openai-responses `/v1/responses`.
    Responses,
    /// gemini `:generateContent`.
    Generate,
    /// gemini `:streamGenerateContent`.
    StreamGenerate,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Messages => "messages",
            Operation::CountTokens => "count_tokens",
            Operation::Invoke => "invoke",
            Operation::InvokeStream => "invoke_stream",
            Operation::Converse => "converse",
            Operation::ConverseStream => "converse_stream",
            Operation::Responses => "responses",
            Operation::Generate => "generate",
            Operation::StreamGenerate => "stream_generate",
        }
    }

    /// Operations whose response is a stream whatever the body says.
    pub fn always_streams(self) -> bool {
        matches!(
            self,
            Operation::InvokeStream | Operation::ConverseStream | Operation::StreamGenerate
        )
    }
}

/// Where the client put the model: the part of the request the alias rewrite changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelLocation {
    /// The top-level `model` of the JSON body: `body[start..end]` is its JSON string,
    /// quotes included, in the body admit was given (see [`splice_model`]).
    Body { start: usize, end: usize },
    /// A path segment (bedrock model id, gemini model).
    Path,
}

/// An admitted model call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelCall {
    pub wire: WireProtocol,
    pub operation: Operation,
    /// The policy alias the client asked for (decoded).
    pub alias: String,
    /// Whether the client asked for a streamed response.
    pub stream: bool,
    pub model_in: ModelLocation,
}

/// What a request is allowed to be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Admission {
    /// GET `/v1/models`: forwarded as is; no decision, no model.
    ListModels,
    /// A call for a policy alias.
    Model(ModelCall),
}

impl Admission {
    pub fn model_call(&self) -> Option<&ModelCall> {
        match self {
            Admission::Model(call) => Some(call),
            Admission::ListModels => None,
        }
    }
}

/// A refused request: the status and Anthropic-shaped error to answer with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {error_type}: {message}")]
pub struct Refusal {
    pub status: u16,
    pub error_type: &'static str,
    pub message: String,
}

/// Longest piece of a client-supplied model echoed back in an error message.
const ECHO_LIMIT: usize = 128;

impl Refusal {
    pub fn not_found() -> Refusal {
        Refusal {
            status: 404,
            error_type: "not_found_error",
            message: "not found: this gateway serves model calls and GET /v1/models only"
                .to_string(),
        }
    }

    pub fn invalid_request(message: impl Into<String>) -> Refusal {
        Refusal {
            status: 400,
            error_type: "invalid_request_error",
            message: message.into(),
        }
    }

    /// `{"type":"error","error":{"type":...,"message":...}}`.
    pub fn body(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Inner<'a> {
            #[serde(rename = "type")]
            error_type: &'a str,
            message: &'a str,
        }
        #[derive(Serialize)]
        struct Outer<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            error: Inner<'a>,
        }
        let outer = Outer {
            kind: "error",
            error: Inner {
                error_type: self.error_type,
                message: &self.message,
            },
        };
        // Two string fields cannot fail to serialize.
        serde_json::to_vec(&outer).unwrap_or_default()
    }
}

/// Recognise the request and check its model against the policy's aliases.
pub fn admit(snap: &Snapshot, method: &str, path: &str, body: &[u8]) -> Result<Admission, Refusal> {
    admit_with(snap, method, path, body, body_scan::scan)
}

/// Whether [`admit`] reads this request's body: a POST to a wire that carries its model
/// in the body. Only then is a body worth scanning while it arrives
/// ([`body_scan::Incremental`]); every other request's body is never read.
pub fn body_carries_model(method: &str, path: &str) -> bool {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    method == "POST"
        && !(path == "/v1/messages/batches" || path.starts_with("/v1/messages/batches/"))
        && recognise(path).is_some_and(|r| matches!(r.model, Found::InBody))
}

/// The wire and operation a served model-call path is (the query string ignored), as
/// [`admit`] recognises it; `None` for any other path. For a caller that has the path of
/// a request already admitted and translated, such as the mirror service metering a
/// shadow job's answer.
pub fn operation_of(path: &str) -> Option<(WireProtocol, Operation)> {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    recognise(path).map(|r| (r.wire, r.operation))
}

/// [`admit`] for a caller that has already scanned `body` (with
/// [`body_scan::Incremental`] while it arrived): `scanned` must be what
/// `body_scan::scan(body)` returns. It is read only where admit would scan, the
/// body-model wires; elsewhere it is ignored, as admit ignores the body there.
pub fn admit_scanned(
    snap: &Snapshot,
    method: &str,
    path: &str,
    body: &[u8],
    scanned: Result<TopLevel, body_scan::ScanError>,
) -> Result<Admission, Refusal> {
    admit_with(snap, method, path, body, |_| scanned)
}

/// admit, with the body scan it runs for body-model wires (only those call `scan`).
fn admit_with(
    snap: &Snapshot,
    method: &str,
    path: &str,
    body: &[u8],
    scan: impl FnOnce(&[u8]) -> Result<TopLevel, body_scan::ScanError>,
) -> Result<Admission, Refusal> {
    let path = path.split_once('?').map_or(path, |(p, _)| p);

    if path == "/v1/messages/batches" || path.starts_with("/v1/messages/batches/") {
        return Err(Refusal::invalid_request(
            "the Message Batches API is not served through this gateway",
        ));
    }
    if path == "/v1/models" {
        return if method == "GET" {
            Ok(Admission::ListModels)
        } else {
            Err(Refusal::not_found())
        };
    }

    let Some(route) = recognise(path) else {
        return Err(Refusal::not_found());
    };
    if method != "POST" {
        return Err(Refusal::not_found());
    }

    let (alias, stream, model_in) = match route.model {
        Found::InBody => {
            let probe = probe_body(body, scan(body))?;
            let (alias, (start, end)) = probe
                .model
                .ok_or_else(|| Refusal::invalid_request("the request body has no \"model\""))?;
            (
                alias,
                probe.stream && !matches!(route.operation, Operation::CountTokens),
                ModelLocation::Body { start, end },
            )
        }
        Found::InPath(raw) => (
            decode_path_model(raw)?,
            route.operation.always_streams(),
            ModelLocation::Path,
        ),
    };
    if !snap.models.contains_key(&alias) {
        return Err(Refusal::invalid_request(format!(
            "model {:?} is not available: use a model alias from your organisation's policy",
            truncate(&alias)
        )));
    }
    Ok(Admission::Model(ModelCall {
        wire: route.wire,
        operation: route.operation,
        alias,
        stream,
        model_in,
    }))
}

#[derive(Clone, Copy)]
enum Found<'p> {
    InBody,
    /// The raw (still percent-encoded) model segment.
    InPath(&'p str),
}

struct Recognised<'p> {
    wire: WireProtocol,
    operation: Operation,
    model: Found<'p>,
}

fn recognise(path: &str) -> Option<Recognised<'_>> {
    let body = |wire, operation| {
        Some(Recognised {
            wire,
            operation,
            model: Found::InBody,
        })
    };
    match path {
        "/v1/messages" => return body(WireProtocol::AnthropicMessages, Operation::Messages),
        "/v1/messages/count_tokens" => {
            return body(WireProtocol::AnthropicMessages, Operation::CountTokens);
        }
        "/v1/responses" => return body(WireProtocol::OpenaiResponses, Operation::Responses),
        _ => {}
    }
    if let Some(rest) = path.strip_prefix("/model/") {
        // The id is everything up to the last segment; AWS clients percent-encode it, but an
        // unencoded ARN (with '/') is accepted too: the alias check is exact either way.
        let (model, op) = rest.rsplit_once('/')?;
        let operation = match op {
            "invoke" => Operation::Invoke,
            "invoke-with-response-stream" => Operation::InvokeStream,
            "converse" => Operation::Converse,
            "converse-stream" => Operation::ConverseStream,
            _ => return None,
        };
        return Some(Recognised {
            wire: WireProtocol::BedrockInvoke,
            operation,
            model: Found::InPath(model),
        });
    }
    if let Some(rest) = path.strip_prefix("/v1beta/models/") {
        let (model, op) = rest.rsplit_once(':')?;
        if model.contains('/') {
            return None;
        }
        let operation = match op {
            "generateContent" => Operation::Generate,
            "streamGenerateContent" => Operation::StreamGenerate,
            "countTokens" => Operation::CountTokens,
            _ => return None,
        };
        return Some(Recognised {
            wire: WireProtocol::Gemini,
            operation,
            model: Found::InPath(model),
        });
    }
    None
}

fn decode_path_model(raw: &str) -> Result<String, Refusal> {
    let decoded = percent_decode(raw).ok_or_else(|| {
        Refusal::invalid_request("the model id in the path is not valid percent-encoding")
    })?;
    if decoded.is_empty() {
        return Err(Refusal::invalid_request("the path names no model"));
    }
    Ok(decoded)
}

/// RFC 3986 percent-decoding of one path segment ('+' stays '+'); `None` on a malformed
/// escape or a result that is not UTF-8.
fn percent_decode(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hi = hex_value(*bytes.get(i + 1)?)?;
            let lo = hex_value(*bytes.get(i + 2)?)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(ECHO_LIMIT) {
        Some((end, _)) => &s[..end],
        None => s,
    }
}

struct BodyFacts {
    /// The model and the byte range of its JSON string in the body.
    model: Option<(String, (usize, usize))>,
    stream: bool,
}

/// The raw top-level `model` value's span, `None` when absent or `null` (as the serde
/// `Option<&RawValue>` probe that [`body_scan`] replaced read it).
fn model_span(body: &[u8], top: &TopLevel) -> Option<(usize, usize)> {
    top.model
        .filter(|&(start, end)| body.get(start..end) != Some(b"null".as_slice()))
}

fn probe_body(
    body: &[u8],
    scanned: Result<TopLevel, body_scan::ScanError>,
) -> Result<BodyFacts, Refusal> {
    let top = scanned.map_err(|e| Refusal::invalid_request(e.to_string()))?;
    let model = match model_span(body, &top) {
        None => None,
        Some((start, end)) => {
            // Only the model's own bytes are decoded (and checked: escapes, surrogates).
            let model = serde_json::from_slice::<String>(&body[start..end])
                .map_err(|_| Refusal::invalid_request("\"model\" must be a string"))?;
            Some((model, (start, end)))
        }
    };
    Ok(BodyFacts {
        model,
        stream: top
            .stream
            .is_some_and(|(start, end)| &body[start..end] == b"true"),
    })
}

/// Why a body's model could not be rewritten.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    #[error("{0}")]
    Body(String),
    #[error("the request body has no \"model\"")]
    NoModel,
}

/// Replace the top-level `"model"` value of a JSON object body with `model`.
///
/// Only the bytes of that one value change: every other byte (key order, whitespace,
/// number spelling, string escapes) is kept exactly, so the upstream sees what the client
/// sent apart from the model, prompt-cache prefixes are untouched, and nothing is
/// re-serialised. (A decode into `serde_json::Value` would sort keys and respell numbers
/// and escapes, since preserve_order is not enabled.) After [`admit`], use
/// [`splice_model`] with the range it recorded instead: no second parse.
pub fn rewrite_body_model(body: &[u8], model: &str) -> Result<Vec<u8>, RewriteError> {
    let top = body_scan::scan(body).map_err(|e| RewriteError::Body(e.to_string()))?;
    let (start, end) = model_span(body, &top).ok_or(RewriteError::NoModel)?;
    Ok(splice_model(body, start, end, model))
}

/// `body` with `body[start..end]` (the model's JSON string, from
/// [`ModelLocation::Body`]) replaced by `model` as a JSON string. Costs one copy of the
/// body and no parse, which is what keeps a megabyte conversation cheap.
pub fn splice_model(body: &[u8], start: usize, end: usize, model: &str) -> Vec<u8> {
    let (start, end) = (start.min(body.len()), end.min(body.len()).max(start));
    // Serializing a str cannot fail.
    let replacement = serde_json::to_string(model).unwrap_or_default();
    let mut out = Vec::with_capacity(body.len() - (end - start) + replacement.len());
    out.extend_from_slice(&body[..start]);
    out.extend_from_slice(replacement.as_bytes());
    out.extend_from_slice(&body[end..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testkit::*;

    fn snap() -> Snapshot {
        SnapBuilder::new()
            .model("opus", vec![target("anthropic", "claude-opus")])
            .model(
                "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/p7q2",
                vec![target(
                    "bedrock",
                    "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/real",
                )],
            )
            .model("gemini-pro", vec![target("gemini", "gemini-2.5-pro")])
            .build()
    }

    fn call(method: &str, path: &str, body: &str) -> ModelCall {
        match admit(&snap(), method, path, body.as_bytes()) {
            Ok(Admission::Model(call)) => call,
            other => panic!("{method} {path} {body}: {other:?}"),
        }
    }

    fn refused(method: &str, path: &str, body: &str) -> Refusal {
        admit(&snap(), method, path, body.as_bytes()).expect_err("must be refused")
    }

    #[test]
    fn only_body_model_posts_have_their_body_scanned() {
        for (method, path) in [
            ("POST", "/v1/messages"),
            ("POST", "/v1/messages/count_tokens?beta=true"),
            ("POST", "/v1/responses"),
        ] {
            assert!(body_carries_model(method, path), "{method} {path}");
        }
        for (method, path) in [
            ("GET", "/v1/messages"),
            ("GET", "/v1/models"),
            ("POST", "/v1/messages/batches"),
            ("POST", "/model/m/invoke"),
            ("POST", "/v1beta/models/g:generateContent"),
            ("POST", "/elsewhere"),
        ] {
            assert!(!body_carries_model(method, path), "{method} {path}");
        }
    }

    #[test]
    fn anthropic_messages_and_count_tokens() {
        let c = call(
            "POST",
            "/v1/messages",
            r#"{"model":"sonnet","stream":true,"messages":[]}"#,
        );
        assert_eq!(
            c,
            ModelCall {
                wire: WireProtocol::AnthropicMessages,
                operation: Operation::Messages,
                alias: "sonnet".into(),
                stream: true,
                model_in: ModelLocation::Body { start: 9, end: 17 },
            }
        );
        assert!(!call("POST", "/v1/messages", r#"{"model":"sonnet"}"#).stream);
        assert!(
            !call(
                "POST",
                "/v1/messages",
                r#"{"model":"sonnet","stream":"true"}"#
            )
            .stream
        );
        let c = call(
            "POST",
            "/v1/messages/count_tokens?beta=true",
            r#"{"model":"opus","stream":true}"#,
        );
        assert_eq!(
            (c.operation, c.alias.as_str(), c.stream),
            (Operation::CountTokens, "opus", false)
        );
    }

    #[test]
    fn openai_responses() {
        let c = call(
            "POST",
            "/v1/responses",
            r#" {"input":"hi","stream":true,"model":"opus"}"#,
        );
        assert_eq!(
            (c.wire, c.operation, c.stream),
            (WireProtocol::OpenaiResponses, Operation::Responses, true)
        );
        let body = r#" {"input":"hi","stream":true,"model":"opus"}"#;
        let ModelLocation::Body { start, end } = c.model_in else {
            panic!("the model is in the body");
        };
        assert_eq!(&body[start..end], "\"opus\"");
        assert_eq!(
            splice_model(body.as_bytes(), start, end, "gpt-5"),
            br#" {"input":"hi","stream":true,"model":"gpt-5"}"#
        );
    }

    #[test]
    fn bedrock_operations_take_the_model_from_the_path() {
        for (op, operation, stream) in [
            ("invoke", Operation::Invoke, false),
            ("invoke-with-response-stream", Operation::InvokeStream, true),
            ("converse", Operation::Converse, false),
            ("converse-stream", Operation::ConverseStream, true),
        ] {
            let c = call("POST", &format!("/model/sonnet/{op}"), "");
            assert_eq!(c.wire, WireProtocol::BedrockInvoke);
            assert_eq!(
                (c.operation, c.stream, c.alias.as_str()),
                (operation, stream, "sonnet")
            );
            assert_eq!(c.model_in, ModelLocation::Path);
        }
    }

    #[test]
    fn url_encoded_bedrock_arns_survive() {
        let arn = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/p7q2";
        let encoded =
            "arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Aapplication-inference-profile%2Fp7q2";
        let c = call("POST", &format!("/model/{encoded}/invoke"), "{}");
        assert_eq!(c.alias, arn);
        // Lowercase escapes and an unencoded ARN name the same alias.
        let c = call(
            "POST",
            &format!("/model/{}/converse", encoded.replace("%2F", "%2f")),
            "{}",
        );
        assert_eq!(c.alias, arn);
        assert_eq!(
            call("POST", &format!("/model/{arn}/converse"), "{}").alias,
            arn
        );
        // An ARN that is not an alias is refused, and a broken escape is a 400.
        let r = refused(
            "POST",
            "/model/arn%3Aaws%3Abedrock%3Aus-west-2%3A1%3Afoundation-model%2Fx/invoke",
            "{}",
        );
        assert_eq!(r.status, 400);
        assert_eq!(refused("POST", "/model/son%2/invoke", "").status, 400);
        assert_eq!(refused("POST", "/model/%FF/invoke", "").status, 400);
        assert_eq!(refused("POST", "/model//invoke", "").status, 400);
        assert_eq!(
            refused("POST", "/model/sonnet/invoke-async", "").status,
            404
        );
    }

    #[test]
    fn gemini_operations_take_the_model_from_the_path() {
        for (op, operation, stream) in [
            ("generateContent", Operation::Generate, false),
            ("streamGenerateContent", Operation::StreamGenerate, true),
            ("countTokens", Operation::CountTokens, false),
        ] {
            let c = call(
                "POST",
                &format!("/v1beta/models/gemini-pro:{op}?alt=sse"),
                "{}",
            );
            assert_eq!(c.wire, WireProtocol::Gemini);
            assert_eq!(
                (c.operation, c.stream, c.alias.as_str()),
                (operation, stream, "gemini-pro")
            );
        }
        assert_eq!(
            call("POST", "/v1beta/models/gemini%2Dpro:generateContent", "{}").alias,
            "gemini-pro"
        );
        assert_eq!(
            refused("POST", "/v1beta/models/gemini-pro:embedContent", "{}").status,
            404
        );
        assert_eq!(
            refused("POST", "/v1beta/models/a/b:generateContent", "{}").status,
            404
        );
        assert_eq!(
            refused(
                "POST",
                "/v1beta/models/gemini-2.5-pro:generateContent",
                "{}"
            )
            .status,
            400
        );
    }

    #[test]
    fn batches_are_refused_with_400() {
        for (method, path) in [
            ("POST", "/v1/messages/batches"),
            ("GET", "/v1/messages/batches?limit=1"),
            ("GET", "/v1/messages/batches/msgbatch_01/results"),
        ] {
            let r = refused(method, path, r#"{"requests":[]}"#);
            assert_eq!(
                (r.status, r.error_type),
                (400, "invalid_request_error"),
                "{path}"
            );
        }
    }

    #[test]
    fn list_models_is_a_passthrough() {
        assert_eq!(
            admit(&snap(), "GET", "/v1/models", b""),
            Ok(Admission::ListModels)
        );
        assert_eq!(
            admit(&snap(), "GET", "/v1/models?limit=5", b"")
                .ok()
                .and_then(|a| a.model_call().cloned()),
            None
        );
        assert_eq!(refused("POST", "/v1/models", "").status, 404);
    }

    #[test]
    fn every_other_path_or_method_is_404() {
        for (method, path) in [
            ("POST", "/v1/complete"),
            ("POST", "/v1/messages/"),
            ("POST", "/v1/messages/batchesx"),
            ("POST", "/v1/%6Dessages"),
            ("GET", "/v1/messages"),
            ("POST", "/healthz"),
            ("POST", "/"),
            ("POST", ""),
            ("GET", "/v1/models/claude"),
        ] {
            let r = refused(method, path, r#"{"model":"sonnet"}"#);
            assert_eq!(
                (r.status, r.error_type),
                (404, "not_found_error"),
                "{method} {path}"
            );
        }
    }

    #[test]
    fn unknown_missing_or_unparseable_models_are_400() {
        for body in [
            r#"{"model":"claude-opus-4-1-20250805"}"#,
            r#"{"messages":[]}"#,
            r#"{"model":null}"#,
            r#"{"model":7}"#,
            r#"{"model":"sonnet""#,
            r#"["sonnet", true]"#,
            r#"{"model":"sonnet","model":"opus"}"#,
            "",
        ] {
            let r = refused("POST", "/v1/messages", body);
            assert_eq!(
                (r.status, r.error_type),
                (400, "invalid_request_error"),
                "{body}"
            );
        }
        let r = refused("POST", "/v1/messages", r#"{"model":"gpt-5"}"#);
        assert!(r.message.contains("\"gpt-5\""), "{}", r.message);
        // A long unknown model is echoed only in part.
        let long = format!(r#"{{"model":"{}"}}"#, "x".repeat(10_000));
        assert!(refused("POST", "/v1/messages", &long).message.len() < 400);
    }

    #[test]
    fn body_probe_is_strict_about_the_model() {
        // Two top-level models, however spelled, are refused: the gateway and the provider
        // must never read different models from one body.
        for body in [
            r#"{"model":"opus","model":"sonnet"}"#,
            r#"{"model":"opus","mod\u0065l":"sonnet"}"#,
            r#"{"stream":false,"model":"opus","stream":true}"#,
        ] {
            let r = refused("POST", "/v1/messages", body);
            assert!(
                r.message
                    .starts_with("the request body is not valid JSON: duplicate field"),
                "{body}: {}",
                r.message
            );
        }
        // A nested model is just content.
        let c = call(
            "POST",
            "/v1/messages",
            r#"{"messages":[{"model":"sonnet"}],"model":"opus"}"#,
        );
        assert_eq!(c.alias, "opus");
        // An escaped model names its decoded alias; the span is the raw string.
        let body = r#"{"model":"op\u0075s"}"#;
        let c = call("POST", "/v1/messages", body);
        assert_eq!(c.alias, "opus");
        assert_eq!(c.model_in, ModelLocation::Body { start: 9, end: 20 });
        for (body, message) in [
            (r#"{"model":7}"#, "\"model\" must be a string"),
            (r#"{"model":["opus"]}"#, "\"model\" must be a string"),
            (r#"{"model":"\uD800"}"#, "\"model\" must be a string"),
            (r#"{"model":null}"#, "the request body has no \"model\""),
            (
                r#"{"model":"opus",}"#,
                "the request body is not valid JSON: ",
            ),
            (
                r#"{"model":"opus"} {}"#,
                "the request body is not valid JSON: ",
            ),
            (r#"["opus"]"#, "the request body is not a JSON object"),
        ] {
            let r = refused("POST", "/v1/messages", body);
            assert!(r.message.starts_with(message), "{body}: {}", r.message);
        }
    }

    #[test]
    fn refusal_body_has_the_anthropic_error_shape() {
        let body = Refusal::invalid_request("model \"x\" is not available").body();
        assert_eq!(
            String::from_utf8(body).expect("utf-8"),
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"model \"x\" is not available"}}"#
        );
        let v: serde_json::Value =
            serde_json::from_slice(&Refusal::not_found().body()).expect("json");
        assert_eq!(v["error"]["type"], "not_found_error");
    }

    #[test]
    fn rewrite_changes_only_the_model_bytes() {
        let body = br#"{ "z": 1.50, "model" : "sonnet", "a": "caf\u00e9", "n": {"model":"keep"} }"#;
        let out = rewrite_body_model(body, "claude-sonnet-4-5").expect("rewritten");
        assert_eq!(
            String::from_utf8(out).expect("utf-8"),
            r#"{ "z": 1.50, "model" : "claude-sonnet-4-5", "a": "caf\u00e9", "n": {"model":"keep"} }"#
        );
        // Escaped key spelling and a model needing escapes.
        let out = rewrite_body_model(br#"{"mod\u0065l":"x"}"#, "a\"b").expect("rewritten");
        assert_eq!(out, br#"{"mod\u0065l":"a\"b"}"#);
    }

    #[test]
    fn rewrite_refuses_what_admit_refuses() {
        assert_eq!(
            rewrite_body_model(br#"{"x":1}"#, "m"),
            Err(RewriteError::NoModel)
        );
        assert!(matches!(
            rewrite_body_model(b"[1]", "m"),
            Err(RewriteError::Body(_))
        ));
        assert!(matches!(
            rewrite_body_model(br#"{"model":"a","model":"b"}"#, "m"),
            Err(RewriteError::Body(_))
        ));
        assert!(matches!(
            rewrite_body_model(br#"{"model":"a"} x"#, "m"),
            Err(RewriteError::Body(_))
        ));
    }

    #[test]
    fn admit_scanned_is_admit_without_the_scan() {
        let s = snap();
        let cases = [
            ("POST", "/v1/messages", r#"{"model":"opus","stream":true}"#),
            (
                "POST",
                "/v1/messages/count_tokens",
                r#"{"model":"opus","stream":true}"#,
            ),
            ("POST", "/v1/responses", r#"{"model":"gpt-5"}"#),
            ("POST", "/v1/messages", r#"{"model":"opus","model":"opus"}"#),
            ("POST", "/v1/messages", r#"{"model":"opus""#),
            ("POST", "/v1/messages", r#"{"model":7}"#),
            ("POST", "/v1/messages", "[]"),
            ("GET", "/v1/messages", r#"{"model":"opus"}"#),
            ("POST", "/v1/messages/batches", r#"{"model":"opus"}"#),
            ("GET", "/v1/models", "not json"),
            ("POST", "/model/opus/invoke", "not json"),
            ("POST", "/v1beta/models/gemini-pro:generateContent", "{"),
            ("POST", "/nowhere", "{}"),
        ];
        for (method, path, body) in cases {
            let body = body.as_bytes();
            let mut inc = body_scan::Incremental::new();
            for end in 0..=body.len() {
                if inc.feed(&body[..end]).is_err() {
                    break;
                }
            }
            let scanned = inc.finish(body);
            assert_eq!(
                admit_scanned(&s, method, path, body, scanned),
                admit(&s, method, path, body),
                "{method} {path}"
            );
        }
        // Path-model wires and the model list never read the scan, as admit never reads
        // their body: a refused scan changes nothing there.
        let refused = Err(body_scan::ScanError::NotAnObject);
        for (method, path) in [
            ("GET", "/v1/models"),
            ("POST", "/model/opus/invoke"),
            ("POST", "/v1beta/models/gemini-pro:generateContent"),
        ] {
            assert_eq!(
                admit_scanned(&s, method, path, b"{}", refused),
                admit(&s, method, path, b"{}"),
                "{method} {path}"
            );
        }
        // A body-model wire takes the scan it is given (the caller's, not a second one).
        let r = admit_scanned(&s, "POST", "/v1/messages", br#"{"model":"opus"}"#, refused);
        assert_eq!(
            r,
            Err(Refusal::invalid_request(
                "the request body is not a JSON object"
            ))
        );
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b+c").as_deref(), Some("a b+c"));
        assert_eq!(percent_decode("%E2%9C%93").as_deref(), Some("\u{2713}"));
        assert_eq!(percent_decode("%"), None);
        assert_eq!(percent_decode("%G0"), None);
    }
}
