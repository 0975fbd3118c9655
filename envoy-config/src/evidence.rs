//! The evidence record of a decided model call as Envoy exports it (spec: low-level
//! design, request path 12 "Deferred metrics"; DESIGN.md "The evidence loop", steps 1
//! and 2): one OTLP log record per call, sent by Envoy's own OpenTelemetry access logger
//! (`envoy.access_loggers.open_telemetry`, OTLP/gRPC) to halo-server's gateway receiver
//! with the gateway token as gRPC metadata. No network call from the filter.
//!
//! Each attribute comes from the one component that knows it:
//! - the filter's [`Fact`]s, written into the stream's filter state as the answer streams
//!   by (usage, cost, time to first token, the salted unit, the alias);
//! - the filter's request stamps (`x-halo-ring`, `-release`, `-experiment`, `-variant`);
//! - the serving endpoint's metadata (`filter_metadata.halo`: upstream, model, target),
//!   which the renderers write on every target endpoint;
//! - Envoy's own stream facts: the status sent, the upstream attempts and the duration.
//!
//! Names are OpenTelemetry's GenAI semantic conventions where one exists, the spec's
//! `halo.gateway.*` and `halo.*` otherwise; halo-evidence's `otlp` module reads exactly
//! these ([`ATTRIBUTES`]). Never a subject, a session id, a prompt or a header value other
//! than the filter's own stamps.

use serde_json::{Value, json};

use crate::plan::{PlanError, ServicePlan};
use halo_contract::facts::*;
use halo_contract::names::METADATA_NAMESPACE;

/// Every attribute of the record with the Envoy format string that fills it.
pub fn attributes() -> Vec<(&'static str, String)> {
    let endpoint = |key: &str| format!("%METADATA(UPSTREAM_HOST:{METADATA_NAMESPACE}:{key})%");
    let mut out = vec![
        (RING, "%REQ(x-halo-ring)%".to_string()),
        (RELEASE, "%REQ(x-halo-release)%".to_string()),
        (EXPERIMENT, "%REQ(x-halo-experiment)%".to_string()),
        (VARIANT, "%REQ(x-halo-variant)%".to_string()),
        (UPSTREAM, endpoint("upstream")),
        (RESPONSE_MODEL, endpoint("model")),
        (TARGET, endpoint("target")),
        (STATUS, "%RESPONSE_CODE%".to_string()),
        (ATTEMPTS, "%UPSTREAM_REQUEST_ATTEMPT_COUNT%".to_string()),
        (LATENCY_MS, "%DURATION%".to_string()),
    ];
    out.extend(Fact::ALL.iter().filter_map(|f| {
        Some((
            f.attribute()?,
            format!("%FILTER_STATE({}:PLAIN)%", f.state_key()),
        ))
    }));
    out
}

/// The cluster of halo-server's gateway receiver (OTLP/gRPC, HTTP/2).
pub const EVIDENCE_CLUSTER: &str = "halo-evidence";

/// Where the gateway sends its evidence: halo-server's gateway receiver and its token.
/// [`crate::plan::GatewaySettings::evidence`], the key `evidence` of the xDS gateway file
/// (`{url, tokenFile}`); `halo envoy bootstrap --evidence-url --evidence-token-file` fills
/// it for the standalone bootstrap.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Export {
    /// The receiver's URL (`http(s)://host:port`; spec :4319).
    pub url: String,
    /// The file holding the OTLP gateway token, read by whoever loads the settings
    /// (halo-server: default its own `--otlp-gateway-token-file`). Never the token itself:
    /// settings files are not secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// The OTLP gateway token, sent as `authorization: Bearer` gRPC metadata; filled from
    /// [`Self::token_file`] by the loader (this crate does no I/O). It is in the rendered
    /// configuration: Envoy's gRPC `initial_metadata` has no file or SDS source, so the
    /// standalone bootstrap is as secret as the token (written owner-only) and in xDS mode
    /// it travels in the pushed listener, as the kill list's gateway token does in the
    /// filter's pushed configuration. Never in Debug output or the plan's JSON.
    #[serde(skip)]
    pub token: String,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("url", &self.url)
            .field("token_file", &self.token_file)
            .field("token", &if self.token.is_empty() { "" } else { REDACTED })
            .finish()
    }
}

/// What a secret is printed as (Debug, the plan's JSON).
pub const REDACTED: &str = "<redacted>";

/// The OpenTelemetry access logger of the model listener: one record per decided model
/// call (a request the filter stamped with a ring), batched by Envoy (flushed each
/// second) over one gRPC stream to [`EVIDENCE_CLUSTER`].
pub fn access_log(export: &Export) -> Value {
    let attributes: Vec<Value> = attributes()
        .into_iter()
        .map(|(key, format)| json!({"key": key, "value": {"string_value": format}}))
        .collect();
    json!({
        "name": ACCESS_LOGGER,
        // Only decided calls: the filter stamps x-halo-ring on those (a refusal, a model
        // list or a health check is not evidence).
        "filter": {"header_filter": {"header": {
            "name": "x-halo-ring",
            "present_match": true,
        }}},
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig",
            "log_name": "halo.gateway",
            "grpc_service": {
                "envoy_grpc": {"cluster_name": EVIDENCE_CLUSTER},
                "initial_metadata": [{"key": "authorization", "value": format!("Bearer {}", export.token)}],
            },
            "buffer_flush_interval": "1s",
            "disable_builtin_labels": true,
            "resource_attributes": {"values": [
                {"key": "service.name", "value": {"string_value": "halo-gateway"}},
            ]},
            "body": {"string_value": EVENT_NAME},
            "attributes": {"values": attributes},
        },
    })
}

/// The access logger's extension name.
pub const ACCESS_LOGGER: &str = "envoy.access_loggers.open_telemetry";

/// The receiver's cluster for `export`: a service cluster of the gateway plan, HTTP/2
/// (gRPC), TLS verified against `ca_file` (ALPN h2) when the URL is https.
pub fn service(export: &Export, ca_file: &str) -> Result<ServicePlan, PlanError> {
    Ok(ServicePlan::new("evidence.url", EVIDENCE_CLUSTER, &export.url, ca_file)?.grpc())
}

/// `log` (an access logger's Envoy JSON) with every gRPC `initial_metadata` value
/// replaced by [`REDACTED`]: how the plan's JSON (the golden file) shows the logger.
pub fn redacted(log: &Value) -> Value {
    let mut log = log.clone();
    if let Some(items) = log
        .pointer_mut("/typed_config/grpc_service/initial_metadata")
        .and_then(Value::as_array_mut)
    {
        for item in items {
            item["value"] = json!(REDACTED);
        }
    }
    log
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_attribute_is_rendered_once_and_named_in_the_list() {
        let rendered: Vec<&str> = attributes().iter().map(|(k, _)| *k).collect();
        assert_eq!(rendered, ATTRIBUTES);
        for f in Fact::ALL.into_iter().chain(Fact::BUDGET) {
            assert!(f.state_key().starts_with(WASM_STATE_PREFIX));
            assert!(!f.property().contains('.'));
        }
    }

    #[test]
    fn the_logger_sends_the_token_as_grpc_metadata_and_logs_only_decided_calls() {
        let export = Export {
            url: "http://127.0.0.1:4319".into(),
            token_file: None,
            token: "t".repeat(32),
        };
        let log = access_log(&export);
        let tc = &log["typed_config"];
        assert_eq!(
            tc["grpc_service"]["envoy_grpc"]["cluster_name"],
            EVIDENCE_CLUSTER
        );
        assert_eq!(
            tc["grpc_service"]["initial_metadata"][0]["value"],
            format!("Bearer {}", "t".repeat(32))
        );
        assert_eq!(
            log["filter"]["header_filter"]["header"]["name"],
            "x-halo-ring"
        );
        let text = log.to_string();
        assert!(!text.contains("x-halo-user"), "never the subject");
        assert!(!redacted(&log).to_string().contains(&"t".repeat(32)));
        assert!(!format!("{export:?}").contains(&"t".repeat(32)));
        let s = service(&export, "/ca.pem").expect("service");
        assert!(s.http2 && s.tls.is_none());
        let s = service(
            &Export {
                url: "https://halo-server.example:4319".into(),
                ..export
            },
            "/ca.pem",
        )
        .expect("service");
        assert_eq!(s.tls.map(|t| t.alpn), Some("h2".to_string()));
    }
}
