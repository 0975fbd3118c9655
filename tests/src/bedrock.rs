//! A fake Bedrock runtime that checks SigV4 like AWS does: it recomputes the signature of
//! every request it receives with the AWS SDK's own signer (`aws-sigv4`) from the
//! request's method, escaped path, signed headers, `x-amz-date` and the SHA-256 of the body
//! it actually received, and answers 403 `InvalidSignatureException` on any mismatch.
//! A request that verifies gets the configured status (200 with an Anthropic message, or
//! 503 to make the gateway fail over).

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings, sign,
};
use aws_sigv4::sign::v4;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;

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

/// Check a request's SigV4 `Authorization` header by signing the same request again with
/// `aws-sigv4` (service `bedrock`) and comparing the results byte for byte.
pub fn verify(
    method: &str,
    path_and_query: &str,
    headers: &[(String, String)],
    body: &[u8],
    region: &str,
    access_key: &str,
    secret_key: &str,
) -> Result<(), String> {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let authorization = header("authorization").ok_or("no Authorization header")?;
    let rest = authorization
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or("Authorization is not AWS4-HMAC-SHA256")?;
    let mut credential = None;
    let mut signed_headers = None;
    for part in rest.split(',') {
        let part = part.trim();
        if let Some(v) = part.strip_prefix("Credential=") {
            credential = Some(v);
        } else if let Some(v) = part.strip_prefix("SignedHeaders=") {
            signed_headers = Some(v);
        }
    }
    let credential = credential.ok_or("no Credential")?;
    let scope: Vec<&str> = credential.split('/').collect();
    if scope.len() != 5 || scope[0] != access_key {
        return Err(format!("unexpected credential scope {credential}"));
    }
    if scope[2] != region || scope[3] != "bedrock" || scope[4] != "aws4_request" {
        return Err(format!("wrong region or service in {credential}"));
    }
    let amz_date = header("x-amz-date").ok_or("no x-amz-date")?;
    let time = parse_amz_date(amz_date)?;
    let host = header("host").ok_or("no host")?;

    // The signer adds x-amz-date and x-amz-content-sha256 itself (from `time` and the body
    // received); every other signed header is taken from the request as received.
    let mut to_sign = Vec::new();
    for name in signed_headers.ok_or("no SignedHeaders")?.split(';') {
        if matches!(name, "x-amz-date" | "x-amz-content-sha256") {
            continue;
        }
        let value = header(name).ok_or_else(|| format!("signed header {name} not received"))?;
        to_sign.push((name, value));
    }

    let identity = Credentials::new(access_key, secret_key, None, None, "halo-e2e").into();
    let mut settings = SigningSettings::default();
    // Sign exactly what the sender listed: no default exclusions (user-agent and co.).
    settings.excluded_headers = None;
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    settings.percent_encoding_mode = PercentEncodingMode::Double;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("bedrock")
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| format!("signing params: {e}"))?
        .into();
    let uri = format!("http://{host}{path_and_query}");
    let signable =
        SignableRequest::new(method, &uri, to_sign.into_iter(), SignableBody::Bytes(body))
            .map_err(|e| format!("signable request: {e}"))?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|e| format!("sign: {e}"))?
        .into_parts();
    let (_, expected_hash) = instructions
        .headers()
        .find(|(n, _)| n.eq_ignore_ascii_case("x-amz-content-sha256"))
        .ok_or("signer produced no payload hash")?;
    if header("x-amz-content-sha256") != Some(expected_hash) {
        return Err("x-amz-content-sha256 is not the SHA-256 of the body received".into());
    }
    let (_, expected) = instructions
        .headers()
        .find(|(n, _)| n.eq_ignore_ascii_case("authorization"))
        .ok_or("signer produced no Authorization")?;
    if expected != authorization {
        return Err(format!(
            "signature mismatch: received {authorization:?}, computed {expected:?}"
        ));
    }
    Ok(())
}

fn parse_amz_date(s: &str) -> Result<SystemTime, String> {
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let dt =
        time::PrimitiveDateTime::parse(s, &format).map_err(|e| format!("x-amz-date {s:?}: {e}"))?;
    let secs = u64::try_from(dt.assume_utc().unix_timestamp())
        .map_err(|_| format!("x-amz-date {s:?} is before 1970"))?;
    Ok(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}
