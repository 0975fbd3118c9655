//! The demo provider: a model provider on loopback speaking the Anthropic Messages wire,
//! so the gateway can be tried without provider keys. `POST /v1/messages` answers a
//! message (JSON) or, with `"stream": true`, the same message as Anthropic's SSE events;
//! `POST /model/{id}/invoke` (Bedrock's InvokeModel, same body) answers the JSON message;
//! `POST /v1/messages/count_tokens` counts words. Everything else is a 404 in Anthropic's
//! error shape. The reply names the model id the gateway put in the body, which shows
//! which policy target the request took. Nothing is logged: bodies and headers stay here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// A running demo provider.
#[derive(Debug, Clone)]
pub struct DemoProvider {
    pub addr: SocketAddr,
    calls: Arc<AtomicU64>,
}

impl DemoProvider {
    /// Serve on `127.0.0.1:0` until the runtime stops.
    pub async fn start() -> std::io::Result<DemoProvider> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let calls = Arc::new(AtomicU64::new(0));
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(calls.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "demo provider stopped");
            }
        });
        Ok(DemoProvider { addr, calls })
    }

    /// `http://127.0.0.1:PORT`, what every upstream points at in demo mode.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Model calls answered so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
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

async fn handle(
    State(calls): State<Arc<AtomicU64>>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    let path = uri.path();
    if method == Method::GET && path == "/v1/models" {
        return axum::Json(json!({"data": [], "has_more": false})).into_response();
    }
    let bedrock_model = path
        .strip_prefix("/model/")
        .and_then(|rest| rest.strip_suffix("/invoke"));
    let known = path == "/v1/messages" || path == "/v1/messages/count_tokens";
    if method != Method::POST || !(known || bedrock_model.is_some()) {
        return error(
            StatusCode::NOT_FOUND,
            "not_found_error",
            "the Halos demo provider speaks the Anthropic Messages API only (POST /v1/messages)",
        );
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
    let input_tokens = words(&request["messages"]);
    if path == "/v1/messages/count_tokens" {
        return axum::Json(json!({"input_tokens": input_tokens})).into_response();
    }
    let model = match bedrock_model {
        Some(m) => m.to_string(),
        None => match request["model"].as_str() {
            Some(m) => m.to_string(),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "model: field required",
                );
            }
        },
    };
    if !request["messages"].is_array() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "messages: field required",
        );
    }
    let n = calls.fetch_add(1, Ordering::Relaxed) + 1;
    let id = format!("msg_demo_{n:06}");
    let text = format!(
        "Hello from the Halos demo provider. The gateway sent this request as model \
         \"{model}\"; no real model was called."
    );
    let output_tokens = text.split_whitespace().count();
    if request["stream"] == json!(true) && bedrock_model.is_none() {
        return stream(&id, &model, &text, input_tokens, output_tokens);
    }
    axum::Json(json!({
        "id": id, "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }))
    .into_response()
}

/// Whitespace-separated words in every text of `messages` (a stand-in for tokens).
fn words(messages: &Value) -> usize {
    let Some(list) = messages.as_array() else {
        return 0;
    };
    list.iter()
        .map(|m| match &m["content"] {
            Value::String(s) => s.split_whitespace().count(),
            Value::Array(blocks) => blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .map(|s| s.split_whitespace().count())
                .sum(),
            _ => 0,
        })
        .sum()
}

fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// The message as Anthropic's SSE events, one text delta per word.
fn stream(id: &str, model: &str, text: &str, input: usize, output: usize) -> Response {
    let mut events = vec![
        event(
            "message_start",
            &json!({"type": "message_start", "message": {
                "id": id, "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": input, "output_tokens": 1}}}),
        ),
        event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
        ),
        event("ping", &json!({"type": "ping"})),
    ];
    let mut first = true;
    for word in text.split(' ') {
        let piece = if first {
            word.to_string()
        } else {
            format!(" {word}")
        };
        first = false;
        events.push(event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": piece}}),
        ));
    }
    events.push(event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(event(
        "message_delta",
        &json!({"type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": output}}),
    ));
    events.push(event("message_stop", &json!({"type": "message_stop"})));
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
