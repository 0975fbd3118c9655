//! One attempt's request per upstream kind (spec: Providers table).
//!
//! | kind          | client wires served            | what changes                                    |
//! |---------------|--------------------------------|-------------------------------------------------|
//! | orchestrator  | all                            | model only (body, or path segment)              |
//! | anthropic     | all but gemini                 | model only                                      |
//! | openai        | all but gemini                 | model only                                      |
//! | bedrock       | bedrock-invoke                 | model in the path (URL-encoded)                 |
//! | bedrock       | anthropic-messages (messages)  | invoke / invoke-with-response-stream, body: `anthropic_version` bedrock-2023-05-31, no `model`/`stream`, anthropic-beta header -> `anthropic_beta` list; stream answered as AWS event stream, converted to SSE |
//! | vertex        | anthropic-messages (messages)  | `/v1/projects/{p}/locations/{r}/publishers/anthropic/models/{m}:rawPredict` or `:streamRawPredict`, body: `anthropic_version` vertex-2023-10-16, no `model` |
//! | azure-openai  | openai-responses               | `/openai/v1/responses`, or `/openai/responses?api-version=` with apiVersion; model = deployment |
//! | gemini        | gemini                         | model in the path                               |
//!
//! count_tokens has no Bedrock or Vertex equivalent: such targets are skipped for it. On the
//! gemini wire a `key` query parameter (a client credential) is never forwarded.

use halo_policy::admit::{ModelCall, ModelLocation, Operation, splice_model};
use halo_policy::{Upstream, UpstreamKind, WireProtocol};

use crate::eventstream::EVENTSTREAM_CONTENT_TYPE;
use crate::json::RawObject;

/// `anthropic_version` in a Bedrock InvokeModel body for Claude.
pub const BEDROCK_ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";
/// `anthropic_version` in a Vertex rawPredict body for Claude.
pub const VERTEX_ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

/// Client headers that carry a credential: never forwarded to a credentialed kind, even
/// with forwardAuth (the gateway's own credential is added after this stage).
const CLIENT_CREDENTIAL_HEADERS: [&str; 5] = [
    "authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "proxy-authorization",
];

/// The client's request as admit recognised it.
#[derive(Debug, Clone, Copy)]
pub struct Inbound<'a> {
    /// admit's answer for this request (wire, operation, stream, where the model is).
    pub call: &'a ModelCall,
    /// The client's `:path`, query included.
    pub path: &'a str,
    /// The client's body, exactly as admit saw it (the model's byte range refers to it).
    pub body: &'a [u8],
    /// The client's `anthropic-beta` header, if any.
    pub anthropic_beta: Option<&'a str>,
}

/// What to send on this attempt. Apply in order: method and path, `authority` if set,
/// `remove_headers` and every header starting with one of `remove_header_prefixes`, then
/// `set_headers`; the body replaces the client's (drop or fix content-length).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbound {
    pub method: &'static str,
    pub path: String,
    pub body: Vec<u8>,
    /// The `:authority` this kind derives (vertex), or `None` to keep the target's.
    pub authority: Option<String>,
    pub set_headers: Vec<(&'static str, String)>,
    pub remove_headers: Vec<&'static str>,
    pub remove_header_prefixes: Vec<&'static str>,
    /// How the answer must be converted for the client.
    pub response: ResponseConversion,
    /// What the translation left out, by cause (never the content): log once per cause.
    pub dropped: Vec<Dropped>,
}

/// The response conversion an attempt needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseConversion {
    /// The upstream answers in the client's wire.
    None,
    /// A Bedrock `invoke-with-response-stream` answer (AWS event stream) becomes Anthropic
    /// SSE: see [`crate::eventstream::EventStreamToSse`].
    BedrockEventStreamToSse,
}

/// Something a translation did not forward, by cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dropped {
    /// A `key` query parameter on the gemini wire (a client credential).
    QueryCredential,
}

impl Dropped {
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::QueryCredential => "query-credential",
        }
    }
}

/// Why a target cannot serve this request: the attempt is skipped (502 bad_upstream when
/// no target is left).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    #[error("upstream kind {} cannot serve the {} wire", kind.as_str(), wire.as_str())]
    WireNotServed {
        kind: UpstreamKind,
        wire: WireProtocol,
    },
    #[error("upstream kind {} has no count_tokens", kind.as_str())]
    CountTokensUnsupported { kind: UpstreamKind },
    #[error("upstream kind {} cannot serve the {} operation", kind.as_str(), operation.as_str())]
    OperationNotServed {
        kind: UpstreamKind,
        operation: Operation,
    },
    #[error("upstream kind {} needs {setting}", kind.as_str())]
    MissingSetting {
        kind: UpstreamKind,
        setting: &'static str,
    },
    #[error("{0}")]
    BadRequest(String),
}

/// Build this attempt's request for a target of `upstream`'s kind with model `model`.
pub fn translate(inb: &Inbound<'_>, upstream: &Upstream, model: &str) -> Result<Outbound, Skip> {
    let kind = upstream.kind;
    let call = inb.call;
    if !kind.serves(call.wire) {
        return Err(Skip::WireNotServed {
            kind,
            wire: call.wire,
        });
    }
    if call.operation == Operation::CountTokens
        && matches!(kind, UpstreamKind::Bedrock | UpstreamKind::Vertex)
    {
        return Err(Skip::CountTokensUnsupported { kind });
    }
    let mut out = match (kind, call.wire) {
        (UpstreamKind::Bedrock, WireProtocol::AnthropicMessages) => {
            bedrock_from_messages(inb, model)?
        }
        (UpstreamKind::Vertex, _) => vertex_from_messages(inb, upstream, model)?,
        (UpstreamKind::AzureOpenai, _) => azure(inb, upstream, model)?,
        // bedrock on the bedrock wire, gemini on the gemini wire, and the pass-through
        // kinds on any wire they serve: only the model changes.
        _ => pass_through(inb, model)?,
    };
    if kind.is_credentialed() {
        out.remove_headers.extend(CLIENT_CREDENTIAL_HEADERS);
    }
    if kind == UpstreamKind::Bedrock {
        out.remove_header_prefixes.extend(["x-amz-", "x-amzn-"]);
    }
    out.remove_headers.push("content-length");
    Ok(out)
}

fn outbound(path: String, body: Vec<u8>) -> Outbound {
    Outbound {
        method: "POST",
        path,
        body,
        authority: None,
        set_headers: Vec::new(),
        remove_headers: Vec::new(),
        remove_header_prefixes: Vec::new(),
        response: ResponseConversion::None,
        dropped: Vec::new(),
    }
}

/// The client's body with the target's model, and the client's path with the target's
/// model where the wire puts it there.
fn pass_through(inb: &Inbound<'_>, model: &str) -> Result<Outbound, Skip> {
    let call = inb.call;
    let (path, body, dropped) = match call.model_in {
        ModelLocation::Body { start, end } => (
            inb.path.to_string(),
            splice_model(inb.body, start, end, model),
            Vec::new(),
        ),
        ModelLocation::Path => {
            let (path, dropped) = path_with_model(call, inb.path, model)?;
            (path, inb.body.to_vec(), dropped)
        }
    };
    let mut out = outbound(path, body);
    out.dropped = dropped;
    Ok(out)
}

/// A bedrock-invoke or gemini path naming `model` instead of the alias.
fn path_with_model(
    call: &ModelCall,
    path: &str,
    model: &str,
) -> Result<(String, Vec<Dropped>), Skip> {
    let (_, query) = split_query(path);
    let model = encode_path_segment(model);
    let op = operation_path_name(call.wire, call.operation).ok_or_else(|| {
        Skip::BadRequest(format!(
            "{} has no path form on the {} wire",
            call.operation.as_str(),
            call.wire.as_str()
        ))
    })?;
    match call.wire {
        WireProtocol::BedrockInvoke => {
            let mut p = format!("/model/{model}/{op}");
            if let Some(q) = query {
                p.push('?');
                p.push_str(q);
            }
            Ok((p, Vec::new()))
        }
        WireProtocol::Gemini => {
            let (query, dropped) = without_key_param(query);
            let mut p = format!("/v1beta/models/{model}:{op}");
            if !query.is_empty() {
                p.push('?');
                p.push_str(&query);
            }
            Ok((p, dropped))
        }
        _ => Err(Skip::BadRequest(format!(
            "the {} wire has no model in its path",
            call.wire.as_str()
        ))),
    }
}

fn operation_path_name(wire: WireProtocol, op: Operation) -> Option<&'static str> {
    Some(match (wire, op) {
        (WireProtocol::BedrockInvoke, Operation::Invoke) => "invoke",
        (WireProtocol::BedrockInvoke, Operation::InvokeStream) => "invoke-with-response-stream",
        (WireProtocol::BedrockInvoke, Operation::Converse) => "converse",
        (WireProtocol::BedrockInvoke, Operation::ConverseStream) => "converse-stream",
        (WireProtocol::Gemini, Operation::Generate) => "generateContent",
        (WireProtocol::Gemini, Operation::StreamGenerate) => "streamGenerateContent",
        (WireProtocol::Gemini, Operation::CountTokens) => "countTokens",
        _ => return None,
    })
}

fn split_query(path: &str) -> (&str, Option<&str>) {
    match path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path, None),
    }
}

/// The query without any `key=` parameter (Gemini's API-key-in-query form).
fn without_key_param(query: Option<&str>) -> (String, Vec<Dropped>) {
    let Some(query) = query else {
        return (String::new(), Vec::new());
    };
    let mut dropped = Vec::new();
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| {
            let name = p.split_once('=').map_or(*p, |(n, _)| n);
            let is_key = name == "key";
            if is_key && dropped.is_empty() {
                dropped.push(Dropped::QueryCredential);
            }
            !is_key
        })
        .collect();
    (kept.join("&"), dropped)
}

/// Percent-encode one path segment: everything but RFC 3986 unreserved characters, as AWS
/// SDKs encode a Bedrock model id or ARN (`:` -> `%3A`, `/` -> `%2F`).
pub fn encode_path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The client's anthropic-beta header as a JSON list for a body `anthropic_beta`.
fn beta_list(header: &str) -> Option<String> {
    let betas: Vec<&str> = header
        .split(',')
        .map(str::trim)
        .filter(|b| !b.is_empty())
        .collect();
    (!betas.is_empty()).then(|| serde_json::to_string(&betas).unwrap_or_default())
}

fn messages_only(inb: &Inbound<'_>, kind: UpstreamKind) -> Result<(), Skip> {
    if inb.call.operation != Operation::Messages {
        return Err(Skip::OperationNotServed {
            kind,
            operation: inb.call.operation,
        });
    }
    Ok(())
}

fn bedrock_from_messages(inb: &Inbound<'_>, model: &str) -> Result<Outbound, Skip> {
    messages_only(inb, UpstreamKind::Bedrock)?;
    let mut body = RawObject::parse(inb.body).map_err(Skip::BadRequest)?;
    // The model goes into the path; streaming is chosen by the operation.
    body.remove("model");
    body.remove("stream");
    body.set_first(
        "anthropic_version",
        format!("\"{BEDROCK_ANTHROPIC_VERSION}\""),
    );
    // Bedrock takes beta flags in the body, not as a header.
    if let Some(list) = inb.anthropic_beta.and_then(beta_list) {
        body.set_last("anthropic_beta", list);
    }
    let stream = inb.call.stream;
    let op = if stream {
        "invoke-with-response-stream"
    } else {
        "invoke"
    };
    let mut out = outbound(
        format!("/model/{}/{op}", encode_path_segment(model)),
        body.to_bytes(),
    );
    out.set_headers
        .push(("content-type", "application/json".into()));
    out.set_headers.push((
        "accept",
        if stream {
            EVENTSTREAM_CONTENT_TYPE
        } else {
            "application/json"
        }
        .into(),
    ));
    out.remove_headers
        .extend(["anthropic-version", "anthropic-beta"]);
    if stream {
        out.response = ResponseConversion::BedrockEventStreamToSse;
    }
    Ok(out)
}

/// The Vertex AI host for `region`: `aiplatform.googleapis.com` for `global`, else
/// `{region}-aiplatform.googleapis.com`.
pub fn vertex_host(region: &str) -> String {
    if region == "global" {
        "aiplatform.googleapis.com".to_string()
    } else {
        format!("{region}-aiplatform.googleapis.com")
    }
}

fn vertex_from_messages(
    inb: &Inbound<'_>,
    upstream: &Upstream,
    model: &str,
) -> Result<Outbound, Skip> {
    let kind = UpstreamKind::Vertex;
    messages_only(inb, kind)?;
    let project = upstream.project.as_deref().ok_or(Skip::MissingSetting {
        kind,
        setting: "project",
    })?;
    let region = upstream.region.as_deref().ok_or(Skip::MissingSetting {
        kind,
        setting: "region",
    })?;
    let mut body = RawObject::parse(inb.body).map_err(Skip::BadRequest)?;
    // The model goes into the path; Vertex keeps `stream` in the body.
    body.remove("model");
    body.set_first(
        "anthropic_version",
        format!("\"{VERTEX_ANTHROPIC_VERSION}\""),
    );
    let method = if inb.call.stream {
        "streamRawPredict"
    } else {
        "rawPredict"
    };
    let mut out = outbound(
        format!(
            "/v1/projects/{}/locations/{}/publishers/anthropic/models/{}:{method}",
            encode_path_segment(project),
            encode_path_segment(region),
            encode_path_segment(model)
        ),
        body.to_bytes(),
    );
    out.authority = Some(vertex_host(region));
    out.set_headers
        .push(("content-type", "application/json".into()));
    // anthropic-beta stays a header: Vertex reads it there.
    out.remove_headers.push("anthropic-version");
    Ok(out)
}

fn azure(inb: &Inbound<'_>, upstream: &Upstream, model: &str) -> Result<Outbound, Skip> {
    let ModelLocation::Body { start, end } = inb.call.model_in else {
        return Err(Skip::BadRequest(
            "an openai-responses request has its model in the body".into(),
        ));
    };
    let path = match upstream.api_version.as_deref() {
        None => "/openai/v1/responses".to_string(),
        Some(v) => format!("/openai/responses?api-version={}", encode_path_segment(v)),
    };
    // The deployment is the model.
    let mut out = outbound(path, splice_model(inb.body, start, end, model));
    out.set_headers
        .push(("content-type", "application/json".into()));
    Ok(out)
}
