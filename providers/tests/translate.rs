//! Golden tests: one per upstream kind and client wire, plus the refusals.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use halo_policy::admit::{ModelCall, ModelLocation, Operation};
use halo_policy::{Upstream, UpstreamKind, WireProtocol};
use halo_providers::{Dropped, Inbound, Outbound, ResponseConversion, Skip, translate};
use serde_json::{Value, json};

const BEDROCK_ARN: &str =
    "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/p7q2opus41bb";
const BEDROCK_ARN_PATH: &str =
    "arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Aapplication-inference-profile%2Fp7q2opus41bb";

fn upstream(kind: UpstreamKind) -> Upstream {
    Upstream {
        url: "https://example.invalid".into(),
        kind,
        region: None,
        project: None,
        api_version: None,
        credential: None,
    }
}

/// A body-model call as admit records it (the model's byte range in `body`).
fn body_call(wire: WireProtocol, operation: Operation, body: &str, stream: bool) -> ModelCall {
    let needle = "\"opus\"";
    let start = body.find(needle).expect("alias in body");
    ModelCall {
        wire,
        operation,
        alias: "opus".into(),
        stream,
        model_in: ModelLocation::Body {
            start,
            end: start + needle.len(),
        },
    }
}

fn path_call(wire: WireProtocol, operation: Operation) -> ModelCall {
    ModelCall {
        wire,
        operation,
        alias: "opus".into(),
        stream: operation.always_streams(),
        model_in: ModelLocation::Path,
    }
}

fn run(
    call: &ModelCall,
    path: &str,
    body: &str,
    beta: Option<&str>,
    up: &Upstream,
    model: &str,
) -> Result<Outbound, Skip> {
    translate(
        &Inbound {
            call,
            path,
            body: body.as_bytes(),
            anthropic_beta: beta,
        },
        up,
        model,
    )
}

fn header<'a>(out: &'a Outbound, name: &str) -> Option<&'a str> {
    out.set_headers
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.as_str())
}

const MESSAGES: &str = r#"{"model":"opus","max_tokens":1024,"stream":true,"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}],"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"12C"}]}],"temperature":0.70}"#;

#[test]
fn anthropic_messages_to_bedrock_streaming() {
    let call = body_call(
        WireProtocol::AnthropicMessages,
        Operation::Messages,
        MESSAGES,
        true,
    );
    let out = run(
        &call,
        "/v1/messages",
        MESSAGES,
        Some("prompt-caching-2024-07-31, token-efficient-tools-2025-02-19"),
        &upstream(UpstreamKind::Bedrock),
        BEDROCK_ARN,
    )
    .expect("translated");
    assert_eq!(out.method, "POST");
    assert_eq!(
        out.path,
        format!("/model/{BEDROCK_ARN_PATH}/invoke-with-response-stream")
    );
    // Golden body: version first, model and stream gone, everything else byte for byte
    // (cache_control, tools, system, tool results, the number's spelling), betas last.
    assert_eq!(
        String::from_utf8(out.body.clone()).expect("utf8"),
        r#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":1024,"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}],"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"12C"}]}],"temperature":0.70,"anthropic_beta":["prompt-caching-2024-07-31","token-efficient-tools-2025-02-19"]}"#
    );
    assert_eq!(
        header(&out, "accept"),
        Some("application/vnd.amazon.eventstream")
    );
    assert_eq!(header(&out, "content-type"), Some("application/json"));
    assert_eq!(out.response, ResponseConversion::BedrockEventStreamToSse);
    for h in [
        "anthropic-beta",
        "anthropic-version",
        "authorization",
        "x-api-key",
        "content-length",
    ] {
        assert!(out.remove_headers.contains(&h), "{h} kept");
    }
    assert!(out.remove_header_prefixes.contains(&"x-amz-"));
    assert!(out.remove_header_prefixes.contains(&"x-amzn-"));
}

#[test]
fn anthropic_messages_to_bedrock_non_streaming() {
    let body = r#"{"model":"opus","max_tokens":5,"messages":[]}"#;
    let call = body_call(
        WireProtocol::AnthropicMessages,
        Operation::Messages,
        body,
        false,
    );
    let out = run(
        &call,
        "/v1/messages",
        body,
        None,
        &upstream(UpstreamKind::Bedrock),
        "anthropic.claude-3-5-sonnet-20240620-v1:0",
    )
    .expect("translated");
    assert_eq!(
        out.path,
        "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/invoke"
    );
    assert_eq!(
        out.body,
        br#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":5,"messages":[]}"#
    );
    assert_eq!(header(&out, "accept"), Some("application/json"));
    assert_eq!(out.response, ResponseConversion::None);
}

#[test]
fn bedrock_wire_to_bedrock_rewrites_the_model_in_the_path_only() {
    let call = path_call(WireProtocol::BedrockInvoke, Operation::InvokeStream);
    let body = r#"{"anthropic_version":"bedrock-2023-05-31","messages":[]}"#;
    let out = run(
        &call,
        "/model/opus/invoke-with-response-stream",
        body,
        None,
        &upstream(UpstreamKind::Bedrock),
        BEDROCK_ARN,
    )
    .expect("translated");
    assert_eq!(
        out.path,
        format!("/model/{BEDROCK_ARN_PATH}/invoke-with-response-stream")
    );
    assert_eq!(out.body, body.as_bytes());
    // The client already speaks the event stream.
    assert_eq!(out.response, ResponseConversion::None);
    for op in [
        Operation::Invoke,
        Operation::Converse,
        Operation::ConverseStream,
    ] {
        let call = path_call(WireProtocol::BedrockInvoke, op);
        let out = run(
            &call,
            "/model/opus/x",
            body,
            None,
            &upstream(UpstreamKind::Bedrock),
            "m:1",
        )
        .expect("ok");
        let name = match op {
            Operation::Invoke => "invoke",
            Operation::Converse => "converse",
            _ => "converse-stream",
        };
        assert_eq!(out.path, format!("/model/m%3A1/{name}"));
    }
}

#[test]
fn anthropic_messages_to_vertex() {
    let mut up = upstream(UpstreamKind::Vertex);
    up.project = Some("acme-ml".into());
    up.region = Some("us-east5".into());
    let call = body_call(
        WireProtocol::AnthropicMessages,
        Operation::Messages,
        MESSAGES,
        true,
    );
    let out = run(
        &call,
        "/v1/messages",
        MESSAGES,
        Some("prompt-caching-2024-07-31"),
        &up,
        "claude-sonnet-4-5@20250929",
    )
    .expect("translated");
    assert_eq!(
        out.path,
        "/v1/projects/acme-ml/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5%4020250929:streamRawPredict"
    );
    assert_eq!(
        out.authority.as_deref(),
        Some("us-east5-aiplatform.googleapis.com")
    );
    let body: Value = serde_json::from_slice(&out.body).expect("json");
    assert_eq!(body["anthropic_version"], "vertex-2023-10-16");
    assert_eq!(body.get("model"), None);
    // Vertex reads `stream` from the body and the betas from the header.
    assert_eq!(body["stream"], true);
    assert_eq!(
        body["system"][0]["cache_control"],
        json!({"type": "ephemeral"})
    );
    assert!(!out.remove_headers.contains(&"anthropic-beta"));
    assert_eq!(out.response, ResponseConversion::None);

    up.region = Some("global".into());
    let body = r#"{"model":"opus","messages":[]}"#;
    let call = body_call(
        WireProtocol::AnthropicMessages,
        Operation::Messages,
        body,
        false,
    );
    let out = run(&call, "/v1/messages", body, None, &up, "claude-opus-4-1").expect("translated");
    assert!(
        out.path
            .ends_with("/locations/global/publishers/anthropic/models/claude-opus-4-1:rawPredict")
    );
    assert_eq!(out.authority.as_deref(), Some("aiplatform.googleapis.com"));
}

#[test]
fn vertex_without_project_or_region_is_skipped() {
    let body = r#"{"model":"opus","messages":[]}"#;
    let call = body_call(
        WireProtocol::AnthropicMessages,
        Operation::Messages,
        body,
        false,
    );
    let mut up = upstream(UpstreamKind::Vertex);
    up.region = Some("us-east5".into());
    assert_eq!(
        run(&call, "/v1/messages", body, None, &up, "m"),
        Err(Skip::MissingSetting {
            kind: UpstreamKind::Vertex,
            setting: "project"
        })
    );
}

#[test]
fn azure_openai_uses_the_deployment_and_the_versioned_path() {
    let body = r#"{"model":"opus","input":"hi","stream":true}"#;
    let call = body_call(
        WireProtocol::OpenaiResponses,
        Operation::Responses,
        body,
        true,
    );
    let mut up = upstream(UpstreamKind::AzureOpenai);
    let out = run(&call, "/v1/responses", body, None, &up, "gpt5-prod").expect("translated");
    assert_eq!(out.path, "/openai/v1/responses");
    assert_eq!(
        out.body,
        br#"{"model":"gpt5-prod","input":"hi","stream":true}"#
    );
    assert!(out.remove_headers.contains(&"authorization"));
    up.api_version = Some("2025-04-01-preview".into());
    let out = run(&call, "/v1/responses", body, None, &up, "gpt5-prod").expect("translated");
    assert_eq!(out.path, "/openai/responses?api-version=2025-04-01-preview");
}

#[test]
fn pass_through_kinds_swap_only_the_model() {
    let body = r#"{ "model" : "opus", "input": "hi" }"#;
    for kind in [
        UpstreamKind::Openai,
        UpstreamKind::Anthropic,
        UpstreamKind::Orchestrator,
    ] {
        let call = body_call(
            WireProtocol::OpenaiResponses,
            Operation::Responses,
            body,
            false,
        );
        let out = run(
            &call,
            "/v1/responses?x=1",
            body,
            None,
            &upstream(kind),
            "gpt-5",
        )
        .expect("ok");
        assert_eq!(out.path, "/v1/responses?x=1");
        assert_eq!(out.body, br#"{ "model" : "gpt-5", "input": "hi" }"#);
        assert_eq!(out.response, ResponseConversion::None);
        // Only credentialed kinds have the client's credentials removed here.
        assert_eq!(
            out.remove_headers.contains(&"authorization"),
            kind == UpstreamKind::Openai
        );
    }
    let body = r#"{"model":"opus","stream":true,"messages":[]}"#;
    let call = body_call(
        WireProtocol::AnthropicMessages,
        Operation::CountTokens,
        body,
        false,
    );
    let out = run(
        &call,
        "/v1/messages/count_tokens",
        body,
        None,
        &upstream(UpstreamKind::Anthropic),
        "claude-x",
    )
    .expect("count_tokens passes through");
    assert_eq!(out.path, "/v1/messages/count_tokens");
    assert_eq!(
        out.body,
        br#"{"model":"claude-x","stream":true,"messages":[]}"#
    );
}

#[test]
fn gemini_rewrites_the_path_model_and_never_forwards_a_key_parameter() {
    let body = r#"{"contents":[{"parts":[{"text":"hi"}]}]}"#;
    let call = path_call(WireProtocol::Gemini, Operation::StreamGenerate);
    let out = run(
        &call,
        "/v1beta/models/opus:streamGenerateContent?alt=sse&key=client-secret",
        body,
        None,
        &upstream(UpstreamKind::Gemini),
        "gemini-2.5-pro",
    )
    .expect("translated");
    assert_eq!(
        out.path,
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    );
    assert_eq!(out.body, body.as_bytes());
    assert_eq!(out.dropped, vec![Dropped::QueryCredential]);
    assert!(out.remove_headers.contains(&"x-goog-api-key"));
    let call = path_call(WireProtocol::Gemini, Operation::CountTokens);
    let out = run(
        &call,
        "/v1beta/models/opus:countTokens",
        body,
        None,
        &upstream(UpstreamKind::Orchestrator),
        "gemini-2.5-pro",
    )
    .expect("orchestrator serves gemini");
    assert_eq!(out.path, "/v1beta/models/gemini-2.5-pro:countTokens");
    assert!(out.dropped.is_empty());
}

#[test]
fn kinds_that_cannot_serve_the_wire_are_skipped() {
    let body = r#"{"model":"opus","input":"hi"}"#;
    let responses = body_call(
        WireProtocol::OpenaiResponses,
        Operation::Responses,
        body,
        false,
    );
    for kind in [
        UpstreamKind::Bedrock,
        UpstreamKind::Vertex,
        UpstreamKind::Gemini,
    ] {
        assert_eq!(
            run(
                &responses,
                "/v1/responses",
                body,
                None,
                &upstream(kind),
                "m"
            ),
            Err(Skip::WireNotServed {
                kind,
                wire: WireProtocol::OpenaiResponses
            })
        );
    }
    let gemini = path_call(WireProtocol::Gemini, Operation::Generate);
    for kind in [
        UpstreamKind::Anthropic,
        UpstreamKind::Openai,
        UpstreamKind::Bedrock,
        UpstreamKind::AzureOpenai,
    ] {
        assert!(matches!(
            run(
                &gemini,
                "/v1beta/models/opus:generateContent",
                "{}",
                None,
                &upstream(kind),
                "m"
            ),
            Err(Skip::WireNotServed { .. })
        ));
    }
}

#[test]
fn count_tokens_is_skipped_for_bedrock_and_vertex() {
    let body = r#"{"model":"opus","messages":[]}"#;
    let call = body_call(
        WireProtocol::AnthropicMessages,
        Operation::CountTokens,
        body,
        false,
    );
    for kind in [UpstreamKind::Bedrock, UpstreamKind::Vertex] {
        assert_eq!(
            run(
                &call,
                "/v1/messages/count_tokens",
                body,
                None,
                &upstream(kind),
                "m"
            ),
            Err(Skip::CountTokensUnsupported { kind })
        );
    }
}

#[test]
fn an_untranslatable_body_is_a_skip_not_a_panic() {
    for body in [
        r#"{"model":"opus","model":"x"}"#,
        r#"[1]"#,
        r#"{"model":"opus""#,
    ] {
        let call = ModelCall {
            wire: WireProtocol::AnthropicMessages,
            operation: Operation::Messages,
            alias: "opus".into(),
            stream: false,
            model_in: ModelLocation::Body { start: 0, end: 0 },
        };
        assert!(matches!(
            run(
                &call,
                "/v1/messages",
                body,
                None,
                &upstream(UpstreamKind::Bedrock),
                "m"
            ),
            Err(Skip::BadRequest(_))
        ));
    }
}
