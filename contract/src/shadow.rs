//! The shadow job: what the halo filter sends the mirror service (halo-server's
//! `POST /mirror`) for a mirrored call, written once for both sides (the filter's
//! `shadow` module builds it, halo-server's `shadow` module decodes it strictly).
//!
//! One JSON object: the fields of [`ShadowJob`], `body` last. The filter writes the
//! request body into it as it is (it is JSON: the filter's strict scan accepted it, or a
//! translation wrote it), so a long conversation is neither parsed nor re-encoded on the
//! live path ([`ShadowJob::encode`]).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A shadow job. Never a credential, a cookie, an identity header or a user: `headers`
/// are the filter's allowlist, `unit` a salted hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShadowJob {
    /// When the filter built the job, Unix milliseconds (the service drops old jobs).
    pub built_unix_ms: u64,
    pub ring: String,
    pub experiment: String,
    pub variant: String,
    pub alias: String,
    /// The caller's salted hash under the experiment's salt (never the user).
    pub unit: String,
    /// The shadow variant's target: its policy upstream and model id.
    pub upstream: String,
    pub model: String,
    pub method: String,
    /// Path and query for the upstream (the model rewritten where the wire puts it there).
    pub path: String,
    /// The client asked for a streamed answer.
    pub stream: bool,
    /// Allowlisted headers only, names lowercase.
    pub headers: Vec<(String, String)>,
    /// The request body for the target. `None` only while the filter writes the job
    /// ([`ShadowJob::encode`] appends the bytes); a decoded job without one is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Box<RawValue>>,
}

impl ShadowJob {
    /// The job with `body` (JSON bytes) as its last field, written as they are.
    pub fn encode(&self, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(body.len() + 512);
        let head = ShadowJob {
            body: None,
            ..self.clone()
        };
        // A struct of strings, numbers and pairs of strings always serializes.
        let _ = serde_json::to_writer(&mut out, &head);
        if out.last() == Some(&b'}') {
            out.pop();
            out.extend_from_slice(br#","body":"#);
            out.extend_from_slice(body);
            out.push(b'}');
        }
        out
    }

    /// Decode a job strictly: unknown fields, a missing field or body, or invalid JSON are
    /// errors naming the field.
    pub fn decode(bytes: &[u8]) -> Result<ShadowJob, String> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let job: ShadowJob = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            format!("{path}: {}", e.into_inner())
        })?;
        if job.body.is_none() {
            return Err("body: missing field `body`".into());
        }
        Ok(job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_round_trips_with_its_body_as_written_and_is_decoded_strictly() {
        let job = ShadowJob {
            built_unix_ms: 1,
            ring: "general".into(),
            experiment: "e".into(),
            variant: "t".into(),
            alias: "sonnet".into(),
            unit: "u".into(),
            upstream: "b".into(),
            model: "m".into(),
            method: "POST".into(),
            path: "/v1/messages".into(),
            stream: false,
            headers: vec![("content-type".into(), "application/json".into())],
            body: None,
        };
        let body = br#"{"model":"m",  "messages":[]}"#;
        let bytes = job.encode(body);
        let back = ShadowJob::decode(&bytes).expect("decodes");
        assert_eq!(
            back.body.as_ref().map(|b| b.get()),
            Some(r#"{"model":"m",  "messages":[]}"#)
        );
        let same = |j: &ShadowJob| {
            serde_json::to_value(ShadowJob {
                body: None,
                ..j.clone()
            })
        };
        assert_eq!(same(&back).expect("json"), same(&job).expect("json"));
        let no_body = serde_json::to_vec(&job).expect("json");
        assert!(
            ShadowJob::decode(&no_body)
                .expect_err("no body")
                .contains("body")
        );
        let mut extra: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        extra["user"] = serde_json::json!("alice");
        let err = ShadowJob::decode(extra.to_string().as_bytes()).expect_err("unknown");
        assert!(err.contains("user"), "{err}");
    }
}
