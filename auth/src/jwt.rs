//! Reading a JWT's claims without verifying it. The client received the token straight
//! from the issuer's token endpoint over verified TLS (OIDC Core 3.1.3.7 lets TLS stand
//! in for the signature check there); the gateway verifies every token it is sent.

use base64::Engine as _;
use serde_json::Value;

/// The payload of a compact JWS, or None if `token` is not one.
pub fn claims(token: &str) -> Option<Value> {
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    v.is_object().then_some(v)
}

/// The `aud` claim as a list (a string or an array of strings).
pub fn audiences(claims: &Value) -> Vec<String> {
    match &claims["aud"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_payload_and_refuses_non_jwts() {
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"aud":["a","b"],"email":"x@y"}"#);
        let c = claims(&format!("e30.{payload}.c2ln")).expect("claims");
        assert_eq!(audiences(&c), ["a", "b"]);
        assert!(claims("opaque-token").is_none());
        assert!(claims("a.b.c.d").is_none());
        assert!(claims("e30.!!!.x").is_none());
    }
}
