//! A fake Bedrock runtime that checks SigV4 like AWS does: it recomputes the signature of
//! every request it receives with the AWS SDK's own signer (`aws-sigv4`) from the
//! request's method, escaped path, signed headers, `x-amz-date` and the SHA-256 of the body
//! it actually received, and answers 403 `InvalidSignatureException` on any mismatch.
//! A request that verifies gets the configured status (200 with an Anthropic message, or
//! 503 to make the gateway fail over).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::{Arc, Mutex};

pub use halo_testkit::sigv4::verify;

use crate::{Seen, serve};

/// The key pair the gateway's Envoy is given in its environment, and the fake checks with.
pub const ACCESS_KEY: &str = "AKIDHALOTEST0000";
pub const SECRET_KEY: &str = "halo/test/secret+key/0000000000000000000";

/// One request the fake received and whether its signature verified.
#[derive(Debug, Clone)]
pub struct Signed {
    pub seen: Seen,
    /// `Ok` when the signature matched; otherwise why not.
    pub verdict: Result<(), String>,
}

struct BedrockState {
    region: String,
    answer: StatusCode,
    seen: Mutex<Vec<Signed>>,
}

/// A fake `bedrock-runtime` on loopback.
pub struct FakeBedrock {
    pub url: String,
    pub port: u16,
    state: Arc<BedrockState>,
}

impl FakeBedrock {
    /// Start a fake for `region` answering verified requests with `answer`.
    pub async fn start(region: &str, answer: StatusCode) -> FakeBedrock {
        let state = Arc::new(BedrockState {
            region: region.to_string(),
            answer,
            seen: Mutex::new(Vec::new()),
        });
        let router = axum::Router::new()
            .fallback(handler)
            .with_state(state.clone());
        let addr = serve(router).await;
        FakeBedrock {
            url: format!("http://{addr}"),
            port: addr.port(),
            state,
        }
    }

    pub fn seen(&self) -> Vec<Signed> {
        self.state.seen.lock().expect("seen lock").clone()
    }

    pub fn count(&self) -> usize {
        self.state.seen.lock().expect("seen lock").len()
    }
}

async fn handler(
    State(state): State<Arc<BedrockState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_string(), |p| p.as_str().to_string());
    let header_list: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let verdict = verify(
        method.as_str(),
        &path,
        &header_list,
        &body,
        &state.region,
        ACCESS_KEY,
        SECRET_KEY,
    );
    let ok = verdict.is_ok();
    state.seen.lock().expect("seen lock").push(Signed {
        seen: Seen {
            method: method.to_string(),
            path,
            headers: header_list,
            body: body.to_vec(),
        },
        verdict,
    });
    if !ok {
        return (
            StatusCode::FORBIDDEN,
            [("x-amzn-errortype", "InvalidSignatureException")],
            json!({"message": "The request signature we calculated does not match the signature you provided."})
                .to_string(),
        )
            .into_response();
    }
    if state.answer != StatusCode::OK {
        return (
            state.answer,
            [("x-amzn-errortype", "ServiceUnavailableException")],
            json!({"message": "Bedrock is unavailable"}).to_string(),
        )
            .into_response();
    }
    if uri.path().ends_with("/invoke-with-response-stream") {
        return stream_answer();
    }
    (
        [("content-type", "application/json")],
        json!({
            "id": "msg_bedrock_1", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": "signed and served"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 3, "output_tokens": 3}
        })
        .to_string(),
    )
        .into_response()
}

/// The Anthropic events of [`stream_answer`], in order.
pub const STREAM_EVENTS: [&str; 6] = [
    r#"{"type":"message_start","message":{"id":"msg_bedrock_s","type":"message","role":"assistant","content":[],"usage":{"input_tokens":3,"output_tokens":0}}}"#,
    r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"signed and "}}"#,
    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"streamed"}}"#,
    r#"{"type":"content_block_stop","index":0}"#,
    r#"{"type":"message_stop"}"#,
];

/// An `invoke-with-response-stream` answer: one AWS event stream `chunk` frame per event,
/// each sent as its own body chunk, the last frame split across two chunks.
fn stream_answer() -> Response {
    let mut pieces: Vec<Vec<u8>> = STREAM_EVENTS
        .iter()
        .map(|e| halo_providers::eventstream::chunk_frame(e))
        .collect();
    if let Some(last) = pieces.pop() {
        let (a, b) = last.split_at(last.len() / 2);
        pieces.push(a.to_vec());
        pieces.push(b.to_vec());
    }
    let stream = futures_util::stream::iter(
        pieces
            .into_iter()
            .map(|p| Ok::<_, std::convert::Infallible>(Bytes::from(p))),
    );
    (
        [(
            "content-type",
            halo_providers::eventstream::EVENTSTREAM_CONTENT_TYPE,
        )],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}
