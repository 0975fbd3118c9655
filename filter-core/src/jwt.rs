//! Verified claims for the native build.
//!
//! The dynamic-module ABI reads only top-level scalar metadata, and jwt_authn keeps the
//! verified payload as a nested struct. So jwt_authn is also told to forward the verified
//! payload in [`PAYLOAD_HEADER`] (`forward_payload_header`: base64url JSON, set only for a
//! token it verified). jwt_authn removes a client's copy of that header from every request
//! before it verifies (seen in 1.40: a forged copy never arrives), and the filter believes
//! the header only when jwt_authn's metadata holds the payload key, that is, only when
//! jwt_authn verified a token on this request; more than one value is refused. The
//! hygiene strips every `x-halo-*` header before the upstream.
//!
//! So this build needs the jwt_authn the renderers write (with `forward_payload_header`):
//! a hand-written jwt_authn without it would leave a client's copy in place.

use crate::pipeline::VerifiedClaims;
use base64::Engine;
use serde_json::Value;

/// The header jwt_authn's `forward_payload_header` writes the verified payload to.
pub const PAYLOAD_HEADER: &str = halo_contract::names::JWT_PAYLOAD_HEADER;

/// What the request carries of a verified token.
#[derive(Debug, PartialEq, Eq)]
pub enum Verified {
    /// jwt_authn verified no token.
    None,
    /// The claims of the token jwt_authn verified.
    Claims(VerifiedClaims),
    /// Verified, but the payload header is missing, repeated or unreadable.
    Unreadable,
}

/// The claims of a verified payload: `values` are the [`PAYLOAD_HEADER`] values, read only
/// when jwt_authn's metadata says it verified a token.
pub fn claims(values: &[String], user_claim: &str, groups_claim: &str) -> Verified {
    let [value] = values else {
        return Verified::Unreadable;
    };
    let Ok(bytes) =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(value.trim_end_matches('='))
    else {
        return Verified::Unreadable;
    };
    let Ok(Value::Object(payload)) = serde_json::from_slice::<Value>(&bytes) else {
        return Verified::Unreadable;
    };
    let user = payload
        .get(user_claim)
        .and_then(Value::as_str)
        .map(str::to_string);
    let email_verified = match payload.get("email_verified") {
        Some(Value::Bool(b)) => Some(*b),
        Some(Value::String(s)) => Some(s == "true"),
        _ => None,
    };
    let groups = match payload.get(groups_claim) {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        Some(Value::String(s)) if !s.is_empty() => vec![s.clone()],
        _ => Vec::new(),
    };
    if user.is_none() {
        return Verified::None;
    }
    Verified::Claims(VerifiedClaims {
        user,
        email_verified,
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(v: &Value) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    }

    #[test]
    fn reads_user_verification_and_groups() {
        let p = encode(&serde_json::json!({
            "email": "dave@acme.test", "email_verified": true, "groups": ["eng", "canary"]
        }));
        assert_eq!(
            claims(&[p], "email", "groups"),
            Verified::Claims(VerifiedClaims {
                user: Some("dave@acme.test".into()),
                email_verified: Some(true),
                groups: vec!["eng".into(), "canary".into()],
            })
        );
    }

    #[test]
    fn a_repeated_or_garbled_payload_is_unreadable() {
        let p = encode(&serde_json::json!({"email": "a@b"}));
        assert_eq!(
            claims(&[p.clone(), p], "email", "groups"),
            Verified::Unreadable
        );
        assert_eq!(claims(&[], "email", "groups"), Verified::Unreadable);
        assert_eq!(
            claims(&["%%%".into()], "email", "groups"),
            Verified::Unreadable
        );
        let not_object = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("[1]");
        assert_eq!(
            claims(&[not_object], "email", "groups"),
            Verified::Unreadable
        );
    }

    #[test]
    fn a_payload_without_the_user_claim_names_no_one() {
        let p = encode(&serde_json::json!({"sub": "x"}));
        assert_eq!(claims(&[p], "email", "groups"), Verified::None);
    }
}
