//! ES256 (P-256) JSON Web Tokens and the JWK that verifies them: what a fake or demo
//! OIDC issuer hands Envoy's jwt_authn. One implementation for the e2e harness's issuer
//! and halo-demo's demo identity.

use base64::Engine as _;
use p256::ecdsa::SigningKey;
use p256::ecdsa::signature::Signer as _;
use serde_json::{Value, json};

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The public JWK of `key` with key id `kid` (`alg: ES256`, `use: sig`).
pub fn jwk(key: &SigningKey, kid: &str) -> Value {
    let public = p256::PublicKey::from(key.verifying_key());
    let mut jwk: Value = serde_json::from_str(&public.to_jwk_string()).unwrap_or(Value::Null);
    jwk["kid"] = json!(kid);
    jwk["alg"] = json!("ES256");
    jwk["use"] = json!("sig");
    jwk
}

/// `claims` as a compact JWT signed by `key`, header `kid`.
pub fn sign(key: &SigningKey, kid: &str, claims: &Value) -> String {
    let header = json!({"alg": "ES256", "typ": "JWT", "kid": kid});
    let input = format!(
        "{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    );
    let signature: p256::ecdsa::Signature = key.sign(input.as_bytes());
    format!("{input}.{}", b64url(&signature.to_bytes()))
}
