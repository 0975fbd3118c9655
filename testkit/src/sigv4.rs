//! SigV4 checked as AWS checks it: a request's signature recomputed with the AWS SDK's own
//! signer (`aws-sigv4`, service `bedrock`) from the method, escaped path, the signed
//! headers as received, `x-amz-date` and the SHA-256 of the body received. The e2e fake
//! Bedrock and halo-demo's provider both verify with it.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings, sign,
};
use aws_sigv4::sign::v4;

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

    let identity = Credentials::new(access_key, secret_key, None, None, "halo-testkit").into();
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
