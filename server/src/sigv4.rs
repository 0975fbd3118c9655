//! SigV4 for the mirror service's Bedrock jobs: the signature the gateway's Envoy gives a
//! Bedrock attempt (`envoy.filters.http.aws_request_signing`, service `bedrock`, the
//! payload hashed into `x-amz-content-sha256`), computed with the AWS SDK's own signer
//! (`aws-sigv4`) so a shadow copy is accepted wherever the live call is.
//!
//! The key pair is the process environment's (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, and `AWS_SESSION_TOKEN` when set), read at each job as Envoy's
//! chain reads it: the first link of the AWS default chain, and the one halo-mesh's
//! rendered deployments set from a Secret. The chain's other links (profile files, web
//! identity, the container and instance metadata endpoints) are not read here.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, SignableBody, SignableRequest, SigningSettings, sign,
};
use aws_sigv4::sign::v4;

/// The AWS service name Bedrock runtime signatures are scoped to.
pub const SERVICE: &str = "bedrock";

/// A key pair to sign with.
#[derive(Clone)]
pub struct AwsKey {
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
}

impl std::fmt::Debug for AwsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsKey")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

impl AwsKey {
    /// The key pair in the environment `env` reads; `None` unless both halves are set and
    /// not empty.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Option<AwsKey> {
        let set = |name: &str| {
            env(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        Some(AwsKey {
            access_key_id: set("AWS_ACCESS_KEY_ID")?,
            secret_access_key: set("AWS_SECRET_ACCESS_KEY")?,
            session_token: set("AWS_SESSION_TOKEN"),
        })
    }
}

/// Why a request could not be signed.
#[derive(Debug, thiserror::Error)]
#[error("SigV4: {0}")]
pub struct SignError(String);

/// The headers SigV4 adds to the request `method url` with `headers` (which must include
/// `host` as it will be sent) and `body`, signed for `region` at `time`:
/// `authorization`, `x-amz-date`, `x-amz-content-sha256` and, with a session token,
/// `x-amz-security-token`. Every header given is signed.
pub fn sign_request(
    method: &str,
    url: &str,
    headers: &[(String, String)],
    body: &[u8],
    region: &str,
    key: &AwsKey,
    time: SystemTime,
) -> Result<Vec<(String, String)>, SignError> {
    let identity = Credentials::new(
        key.access_key_id.clone(),
        key.secret_access_key.clone(),
        key.session_token.clone(),
        None,
        "halo-server",
    )
    .into();
    let mut settings = SigningSettings::default();
    // Sign exactly the headers given: the job's headers are an allowlist already.
    settings.excluded_headers = None;
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(SERVICE)
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| SignError(e.to_string()))?
        .into();
    let signable = SignableRequest::new(
        method,
        url,
        headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        SignableBody::Bytes(body),
    )
    .map_err(|e| SignError(e.to_string()))?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|e| SignError(e.to_string()))?
        .into_parts();
    Ok(instructions
        .headers()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> AwsKey {
        AwsKey::from_env(|name| match name {
            "AWS_ACCESS_KEY_ID" => Some("AKIDHALOTEST0000".into()),
            "AWS_SECRET_ACCESS_KEY" => Some("halo/test/secret+key/0000000000000000000".into()),
            _ => None,
        })
        .unwrap()
    }

    #[test]
    fn a_signed_request_verifies_as_aws_checks_it() {
        let body = br#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":5}"#;
        let mut headers = vec![
            ("host".to_string(), "127.0.0.1:9000".to_string()),
            ("content-type".to_string(), "application/json".to_string()),
        ];
        let path = "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ap%2Fx/invoke";
        let added = sign_request(
            "POST",
            &format!("http://127.0.0.1:9000{path}"),
            &headers,
            body,
            "us-east-1",
            &key(),
            SystemTime::now(),
        )
        .unwrap();
        let names: Vec<&str> = added.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"authorization"), "{names:?}");
        assert!(names.contains(&"x-amz-content-sha256"), "{names:?}");
        headers.extend(added);
        halo_testkit::sigv4::verify(
            "POST",
            path,
            &headers,
            body,
            "us-east-1",
            "AKIDHALOTEST0000",
            "halo/test/secret+key/0000000000000000000",
        )
        .unwrap();
        // Another body than the one signed is refused.
        assert!(
            halo_testkit::sigv4::verify(
                "POST",
                path,
                &headers,
                b"{}",
                "us-east-1",
                "AKIDHALOTEST0000",
                "halo/test/secret+key/0000000000000000000",
            )
            .is_err()
        );
    }

    #[test]
    fn no_key_without_both_halves() {
        assert!(AwsKey::from_env(|n| (n == "AWS_ACCESS_KEY_ID").then(|| "AKID".into())).is_none());
        assert!(AwsKey::from_env(|_| Some("  ".into())).is_none());
        let k = format!("{:?}", key());
        assert!(!k.contains("secret"), "{k}");
    }
}
