//! A model provider on loopback that speaks every wire the gateway sends to, well enough
//! for the real coding tools: halo-demo's provider (no keys needed) and the live harness
//! tests' fake. It answers, naming the model id the gateway put in the request (which
//! shows the policy target a call took):
//! - Anthropic Messages: `POST /v1/messages` (JSON, or SSE with `"stream": true`),
//!   `POST /v1/messages/count_tokens`; a `?beta=true` query is accepted;
//! - Bedrock runtime: `POST /model/{id}/invoke` (the Anthropic message as JSON),
//!   `invoke-with-response-stream` (its events in AWS event stream `chunk` frames),
//!   `converse` and `converse-stream`; with a key pair set ([`Sigv4Key`]) every Bedrock
//!   call's SigV4 signature is verified ([`crate::sigv4::verify`]) and a bad or missing
//!   one gets AWS's 403 `InvalidSignatureException`;
//! - OpenAI Responses: `POST /v1/responses` (JSON, or SSE with `"stream": true`);
//! - Gemini: `POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent`
//!   (SSE with `alt=sse`, else a JSON array) and `:countTokens`;
//! - `GET /v1/models` and `GET /v1beta/models`: an empty list.
//!
//! Anything else is a 404 in Anthropic's error shape. With recording on (tests), every
//! request is kept, headers and body, for the test to read; halo-demo turns it off, so
//! nothing of a request is kept or logged.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One request the provider received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Lowercase names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The model the request names: the body's `model`, or the one in a Bedrock or
    /// Gemini path.
    pub fn model(&self) -> Option<String> {
        let path = self.path.split('?').next().unwrap_or("");
        if let Some(m) = bedrock_model(path) {
            return Some(m.1);
        }
        if let Some(m) = gemini_model(path) {
            return Some(m.0);
        }
        let body: Value = serde_json::from_slice(&self.body).ok()?;
        body["model"].as_str().map(str::to_string)
    }

    /// The usage this provider reported for this model call: (input, output) tokens,
    /// every wire alike (the request's words, the answer's words).
    pub fn usage(&self) -> Option<(u64, u64)> {
        let body: Value = serde_json::from_slice(&self.body).ok()?;
        let model = self.model()?;
        let output = answer_text(&model).split_whitespace().count();
        Some((words(&body) as u64, output as u64))
    }
}

/// The AWS key pair (and region) Bedrock calls must be signed with.
#[derive(Debug, Clone)]
pub struct Sigv4Key {
    /// `None`: any region, as the signature's credential scope names it (one provider
    /// stands in for every Bedrock upstream of a policy).
    pub region: Option<String>,
    pub access_key: String,
    pub secret_key: String,
}

struct Shared {
    record: bool,
    sigv4: Option<Sigv4Key>,
    calls: AtomicU64,
    received: Mutex<Vec<Received>>,
}

/// A running provider.
#[derive(Clone)]
pub struct WireProvider {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl WireProvider {
    /// Serve on `127.0.0.1:0` until the runtime stops; `record` keeps every request.
    pub async fn start(record: bool) -> std::io::Result<WireProvider> {
        WireProvider::start_with(record, None).await
    }

    /// [`WireProvider::start`], verifying every Bedrock call's signature with `sigv4`.
    pub async fn start_with(
        record: bool,
        sigv4: Option<Sigv4Key>,
    ) -> std::io::Result<WireProvider> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            record,
            sigv4,
            calls: AtomicU64::new(0),
            received: Mutex::new(Vec::new()),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(WireProvider { addr, shared })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Model calls answered so far.
    pub fn calls(&self) -> u64 {
        self.shared.calls.load(Ordering::Relaxed)
    }

    /// Every request received so far (empty unless recording).
    pub fn received(&self) -> Vec<Received> {
        self.shared
            .received
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }
}

fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({"type": "error", "error": {"type": kind, "message": message}});
    (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// `(operation, model id)` of a Bedrock runtime path, the id percent-decoded.
fn bedrock_model(path: &str) -> Option<(&str, String)> {
    let rest = path.strip_prefix("/model/")?;
    let (id, op) = rest.rsplit_once('/')?;
    matches!(
        op,
        "invoke" | "invoke-with-response-stream" | "converse" | "converse-stream"
    )
    .then(|| (op, percent_decode(id)))
}

/// `(model, method)` of a Gemini path.
fn gemini_model(path: &str) -> Option<(String, &str)> {
    let rest = path.strip_prefix("/v1beta/models/")?;
    let (model, method) = rest.split_once(':')?;
    Some((model.to_string(), method))
}

/// The region in a SigV4 `Authorization` header's credential scope (empty if none).
fn scope_region(headers: &HeaderMap) -> String {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|a| a.split("Credential=").nth(1))
        .and_then(|c| c.split('/').nth(2))
        .unwrap_or("")
        .to_string()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if shared.record
        && let Ok(mut received) = shared.received.lock()
    {
        received.push(Received {
            method: method.to_string(),
            path: uri
                .path_and_query()
                .map_or_else(|| uri.path().to_string(), |p| p.as_str().to_string()),
            headers: headers
                .iter()
                .map(|(n, v)| (n.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                .collect(),
            body: body.to_vec(),
        });
    }
    let path = uri.path();
    let query = uri.query().unwrap_or("");
    if method == Method::GET && (path == "/v1/models" || path == "/v1beta/models") {
        return axum::Json(json!({"data": [], "models": [], "has_more": false})).into_response();
    }
    if method != Method::POST {
        return not_found();
    }
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "the body must be a JSON object",
            );
        }
    };
    let stream = request["stream"] == json!(true);
    if path == "/v1/messages/count_tokens" {
        return axum::Json(json!({"input_tokens": words(&request)})).into_response();
    }
    if let Some((model, method)) = gemini_model(path) {
        return match method {
            "countTokens" => axum::Json(json!({"totalTokens": words(&request)})).into_response(),
            "generateContent" => gemini(&shared, &model, &request, Gemini::Json),
            "streamGenerateContent" if query.contains("alt=sse") => {
                gemini(&shared, &model, &request, Gemini::Sse)
            }
            "streamGenerateContent" => gemini(&shared, &model, &request, Gemini::Array),
            _ => not_found(),
        };
    }
    if let Some((op, model)) = bedrock_model(path) {
        if let Some(key) = &shared.sigv4 {
            let path_and_query = uri
                .path_and_query()
                .map_or_else(|| uri.path().to_string(), |p| p.as_str().to_string());
            let received: Vec<(String, String)> = headers
                .iter()
                .map(|(n, v)| (n.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                .collect();
            let region = key.region.clone().unwrap_or_else(|| scope_region(&headers));
            if let Err(why) = crate::sigv4::verify(
                method.as_str(),
                &path_and_query,
                &received,
                &body,
                &region,
                &key.access_key,
                &key.secret_key,
            ) {
                return (
                    StatusCode::FORBIDDEN,
                    [
                        ("x-amzn-errortype", "InvalidSignatureException"),
                        ("content-type", "application/json"),
                    ],
                    json!({"message": format!("The request signature we calculated does not match the signature you provided ({why}).")})
                        .to_string(),
                )
                    .into_response();
            }
        }
        return match op {
            "converse" => converse(&shared, &model, &request),
            "converse-stream" => converse_stream(&shared, &model, &request),
            "invoke-with-response-stream" => invoke_stream(&shared, &model, &request),
            _ => messages(&shared, &model, &request, false),
        };
    }
    let Some(model) = request["model"].as_str().map(str::to_string) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "model: field required",
        );
    };
    match path {
        "/v1/messages" => messages(&shared, &model, &request, stream),
        "/v1/responses" | "/responses" => responses(&shared, &model, &request, stream),
        _ => not_found(),
    }
}

fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found_error",
        "the Halos wire provider serves Anthropic Messages, Bedrock invoke/converse, OpenAI Responses and Gemini",
    )
}

/// The answer text, naming the model the request reached this provider as.
fn answer(shared: &Shared, model: &str) -> (u64, String) {
    let n = shared.calls.fetch_add(1, Ordering::Relaxed) + 1;
    (n, answer_text(model))
}

/// The text every answer carries.
fn answer_text(model: &str) -> String {
    format!(
        "Hello from the Halos demo provider. The gateway sent this request as model \
         \"{model}\"; no real model was called."
    )
}

/// Whitespace-separated words of every text in the request (a stand-in for tokens):
/// Anthropic and Bedrock `messages`, Responses `input`, Gemini `contents`.
fn words(request: &Value) -> usize {
    fn count(v: &Value) -> usize {
        match v {
            Value::String(s) => s.split_whitespace().count(),
            Value::Array(items) => items.iter().map(count).sum(),
            Value::Object(map) => map
                .iter()
                .filter(|(k, _)| matches!(k.as_str(), "text" | "content" | "parts"))
                .map(|(_, v)| count(v))
                .sum(),
            _ => 0,
        }
    }
    count(&request["messages"]) + count(&request["input"]) + count(&request["contents"])
}

fn sse(events: Vec<Bytes>) -> Response {
    let body = Body::from_stream(futures_util::stream::iter(
        events.into_iter().map(Ok::<_, std::io::Error>),
    ));
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// Anthropic Messages (also Bedrock invoke's body): JSON or SSE.
fn messages(shared: &Shared, model: &str, request: &Value, stream: bool) -> Response {
    if !request["messages"].is_array() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "messages: field required",
        );
    }
    let input = words(request);
    let (n, text) = answer(shared, model);
    let id = format!("msg_demo_{n:06}");
    let output = text.split_whitespace().count();
    if !stream {
        return axum::Json(json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": input, "output_tokens": output},
        }))
        .into_response();
    }
    sse(message_events(&id, model, &text, input, output)
        .into_iter()
        .map(|(name, data)| event(name, &data))
        .collect())
}

/// Anthropic's stream events for one text answer, one delta per word.
fn message_events(
    id: &str,
    model: &str,
    text: &str,
    input: usize,
    output: usize,
) -> Vec<(&'static str, Value)> {
    let mut events = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {
                "id": id, "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": input, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
        ),
        ("ping", json!({"type": "ping"})),
    ];
    for (i, word) in text.split(' ').enumerate() {
        let piece = if i == 0 {
            word.to_string()
        } else {
            format!(" {word}")
        };
        events.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": piece}}),
        ));
    }
    events.push((
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push((
        "message_delta",
        json!({"type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": output}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events
}

fn eventstream(frames: Vec<Vec<u8>>) -> Response {
    let body = Body::from_stream(futures_util::stream::iter(
        frames
            .into_iter()
            .map(|f| Ok::<_, std::io::Error>(Bytes::from(f))),
    ));
    Response::builder()
        .status(StatusCode::OK)
        .header(
            "content-type",
            halo_providers::eventstream::EVENTSTREAM_CONTENT_TYPE,
        )
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Bedrock InvokeModelWithResponseStream: Anthropic's events in `chunk` frames.
fn invoke_stream(shared: &Shared, model: &str, request: &Value) -> Response {
    let input = words(request);
    let (n, text) = answer(shared, model);
    let output = text.split_whitespace().count();
    let id = format!("msg_demo_{n:06}");
    eventstream(
        message_events(&id, model, &text, input, output)
            .into_iter()
            .map(|(_, data)| halo_providers::eventstream::chunk_frame(&data.to_string()))
            .collect(),
    )
}

/// Bedrock ConverseStream: its own events, one frame each.
fn converse_stream(shared: &Shared, model: &str, request: &Value) -> Response {
    let input = words(request);
    let (_, text) = answer(shared, model);
    let output = text.split_whitespace().count();
    let events = [
        ("messageStart", json!({"role": "assistant"})),
        (
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"text": text}}),
        ),
        ("contentBlockStop", json!({"contentBlockIndex": 0})),
        ("messageStop", json!({"stopReason": "end_turn"})),
        (
            "metadata",
            json!({"usage": {"inputTokens": input, "outputTokens": output,
                             "totalTokens": input + output},
                   "metrics": {"latencyMs": 1}}),
        ),
    ];
    eventstream(
        events
            .iter()
            .map(|(kind, data)| {
                halo_providers::eventstream::encode_frame(
                    &[
                        (":event-type", kind),
                        (":content-type", "application/json"),
                        (":message-type", "event"),
                    ],
                    data.to_string().as_bytes(),
                )
            })
            .collect(),
    )
}

/// Bedrock Converse.
fn converse(shared: &Shared, model: &str, request: &Value) -> Response {
    let input = words(request);
    let (_, text) = answer(shared, model);
    let output = text.split_whitespace().count();
    axum::Json(json!({
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": input, "outputTokens": output, "totalTokens": input + output},
        "metrics": {"latencyMs": 1},
    }))
    .into_response()
}

/// OpenAI Responses: JSON, or the SSE events Codex reads.
fn responses(shared: &Shared, model: &str, request: &Value, stream: bool) -> Response {
    let input = words(request);
    let (n, text) = answer(shared, model);
    let output = text.split_whitespace().count();
    let item = json!({
        "type": "message", "id": format!("msg_demo_{n:06}"), "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    });
    let response = json!({
        "id": format!("resp_demo_{n:06}"), "object": "response", "created_at": 0,
        "status": "completed", "model": model, "output": [item.clone()],
        "usage": {"input_tokens": input, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": input + output},
    });
    if !stream {
        return axum::Json(response).into_response();
    }
    let mut created = response.clone();
    created["status"] = json!("in_progress");
    created["output"] = json!([]);
    sse(vec![
        event(
            "response.created",
            &json!({"type": "response.created", "response": created}),
        ),
        event(
            "response.output_item.done",
            &json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        ),
        event(
            "response.completed",
            &json!({"type": "response.completed", "response": response}),
        ),
    ])
}

enum Gemini {
    Json,
    Sse,
    Array,
}

/// Gemini generateContent / streamGenerateContent.
fn gemini(shared: &Shared, model: &str, request: &Value, form: Gemini) -> Response {
    if !request["contents"].is_array() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "contents: field required",
        );
    }
    let input = words(request);
    let (_, text) = answer(shared, model);
    let output = text.split_whitespace().count();
    let reply = json!({
        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                        "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": input, "candidatesTokenCount": output,
                          "totalTokenCount": input + output},
        "modelVersion": model,
    });
    match form {
        Gemini::Json => axum::Json(reply).into_response(),
        Gemini::Array => axum::Json(json!([reply])).into_response(),
        Gemini::Sse => sse(vec![Bytes::from(format!("data: {reply}\r\n\r\n"))]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_read_from_paths_and_bodies() {
        let r = |path: &str, body: &str| Received {
            method: "POST".into(),
            path: path.into(),
            headers: vec![],
            body: body.as_bytes().to_vec(),
        };
        assert_eq!(
            r("/model/arn%3Aaws%3Ax%2Fp/invoke", "{}")
                .model()
                .as_deref(),
            Some("arn:aws:x/p")
        );
        assert_eq!(
            r(
                "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
                "{}"
            )
            .model()
            .as_deref(),
            Some("gemini-2.5-pro")
        );
        assert_eq!(
            r("/v1/messages?beta=true", r#"{"model":"m"}"#)
                .model()
                .as_deref(),
            Some("m")
        );
        assert_eq!(percent_decode("a%2"), "a%2");
    }
}
