//! Shared secrets presented as bearer tokens: the gateway token (ADR-0009, final
//! amendment), the fleet token, enrollment and device tokens.
//!
//! Operator-chosen tokens must look random, because the old "length times log2 of the
//! distinct characters" estimate accepted passphrases. [`check_strength`] is the rule;
//! every refusal names `openssl rand -hex 32`. Tokens are held only as sha256 digests and
//! compared in constant time, so neither memory dumps nor response timing give one away.

use std::fmt;
use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The command every refusal recommends.
pub const GENERATE_HINT: &str = "openssl rand -hex 32";

/// Minimum length in characters (padding excluded).
pub const MIN_LEN: usize = 32;
/// Minimum strength: charset bits times length.
pub const MIN_BITS: usize = 128;
/// A run of this many repeated or consecutive characters is refused.
pub const MAX_RUN: usize = 8;

/// Why a token was refused; the message never contains the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WeakToken {
    #[error("it is empty")]
    Empty,
    #[error("it is {0} characters long; at least {MIN_LEN} are required")]
    TooShort(usize),
    #[error(
        "it contains characters outside hex or base64/base64url (letters, digits and + / or - _, with = padding only at the end)"
    )]
    Charset,
    #[error("it mixes the base64 (+ /) and base64url (- _) alphabets")]
    MixedAlphabets,
    #[error("it has {0} bits by charset bits times length; at least {MIN_BITS} are required")]
    TooFewBits(usize),
    #[error("it has a run of {MAX_RUN} or more repeated characters")]
    Repeated,
    #[error("it has a run of {MAX_RUN} or more consecutive characters (like abcdefgh or 12345678)")]
    Consecutive,
    #[error("it has only {found} distinct characters; at least {needed} are required for {kind}")]
    TooFewDistinct {
        found: usize,
        needed: usize,
        kind: &'static str,
    },
    #[error("a base64 token must mix upper case, lower case and digits")]
    Base64Classes,
}

/// Check that an operator-chosen token looks random (ADR-0009, amended 2026-10-22):
/// 32+ hex or base64/base64url characters only, at least 128 bits by charset bits times
/// length, no run of 8 repeated or consecutive characters, at least 8 (hex) or 16
/// (base64) distinct characters, and for base64 upper case, lower case and digits.
pub fn check_strength(token: &str) -> Result<(), WeakToken> {
    if token.is_empty() {
        return Err(WeakToken::Empty);
    }
    let bytes = token.as_bytes();
    // Padding is allowed only as a suffix of at most two '='.
    let body = token.trim_end_matches('=');
    let padding = bytes.len() - body.len();
    let is_hex = padding == 0 && body.bytes().all(|b| b.is_ascii_hexdigit());
    if !is_hex {
        if padding > 2
            || !body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+/-_".contains(&b))
        {
            return Err(WeakToken::Charset);
        }
        let std_alpha = body.bytes().any(|b| b == b'+' || b == b'/');
        let url_alpha = body.bytes().any(|b| b == b'-' || b == b'_');
        if std_alpha && url_alpha {
            return Err(WeakToken::MixedAlphabets);
        }
    }
    let len = body.chars().count();
    if len < MIN_LEN {
        return Err(WeakToken::TooShort(len));
    }
    let bits = len * if is_hex { 4 } else { 6 };
    if bits < MIN_BITS {
        return Err(WeakToken::TooFewBits(bits));
    }
    // Hex is case-insensitive: "aB" is two symbols, not four.
    let norm: Vec<u8> = if is_hex {
        body.bytes().map(|b| b.to_ascii_lowercase()).collect()
    } else {
        body.bytes().collect()
    };
    check_runs(&norm)?;
    let mut seen = [false; 256];
    for &b in &norm {
        seen[usize::from(b)] = true;
    }
    let distinct = seen.iter().filter(|s| **s).count();
    let (needed, kind) = if is_hex { (8, "hex") } else { (16, "base64") };
    if distinct < needed {
        return Err(WeakToken::TooFewDistinct {
            found: distinct,
            needed,
            kind,
        });
    }
    if !is_hex {
        let upper = norm.iter().any(u8::is_ascii_uppercase);
        let lower = norm.iter().any(u8::is_ascii_lowercase);
        let digit = norm.iter().any(u8::is_ascii_digit);
        if !(upper && lower && digit) {
            return Err(WeakToken::Base64Classes);
        }
    }
    Ok(())
}

fn check_runs(s: &[u8]) -> Result<(), WeakToken> {
    let (mut same, mut up, mut down) = (1usize, 1usize, 1usize);
    for w in s.windows(2) {
        let (a, b) = (w[0], w[1]);
        same = if b == a { same + 1 } else { 1 };
        up = if a.checked_add(1) == Some(b) {
            up + 1
        } else {
            1
        };
        down = if b.checked_add(1) == Some(a) {
            down + 1
        } else {
            1
        };
        if same >= MAX_RUN {
            return Err(WeakToken::Repeated);
        }
        if up >= MAX_RUN || down >= MAX_RUN {
            return Err(WeakToken::Consecutive);
        }
    }
    Ok(())
}

/// A secret held only as its sha256 digest.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TokenDigest([u8; 32]);

impl TokenDigest {
    pub fn of(token: &str) -> TokenDigest {
        TokenDigest(Sha256::digest(token.as_bytes()).into())
    }

    /// Constant-time comparison of `presented`'s digest with this one.
    pub fn matches(&self, presented: &str) -> bool {
        TokenDigest::of(presented).0.ct_eq(&self.0).into()
    }

    /// Lowercase hex, as stored in the data dir.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(s: &str) -> Option<TokenDigest> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(TokenDigest(out))
    }
}

impl fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A digest of a low-entropy secret is still sensitive; never print it.
        f.write_str("TokenDigest(<redacted>)")
    }
}

/// Why a token file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read {what} file {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("{what} in {path} is refused: {reason}; generate one with `{GENERATE_HINT}`")]
    Weak {
        what: &'static str,
        path: String,
        reason: WeakToken,
    },
}

/// Read an operator token file (one token; surrounding whitespace ignored), check its
/// strength and keep only its digest.
pub fn read_token_file(what: &'static str, path: &Path) -> Result<TokenDigest, TokenFileError> {
    read_token(what, path).map(|token| TokenDigest::of(&token))
}

/// The token in `path` itself, checked as [`read_token_file`] checks it: for a token this
/// server presents rather than verifies (the OTLP gateway token Envoy sends, pushed over
/// xDS).
pub fn read_token(what: &'static str, path: &Path) -> Result<String, TokenFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
        what,
        path: path.display().to_string(),
        source,
    })?;
    let token = text.trim();
    check_strength(token).map_err(|reason| TokenFileError::Weak {
        what,
        path: path.display().to_string(),
        reason,
    })?;
    Ok(token.to_string())
}

/// A fresh random token for enrollment and device credentials: 32 bytes as 64 hex
/// characters (256 bits), which passes [`check_strength`].
pub fn mint() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The ADR's table of accepted and refused gateway tokens (TestReadGatewayTokens).
    #[test]
    fn gateway_token_table() {
        let accepted = [
            // openssl rand -hex 32
            "3f9a1c7e5b2d8046af13ce97b0d24e6c58a7f31d9e0b6c24f8a5173d0e9c6b12",
            // openssl rand -hex 16 (exactly 32 hex characters, 128 bits)
            "9c41e07b3fa2d5688e1b0c7d4f5a2e93",
            // upper-case hex is still hex
            "9C41E07B3FA2D5688E1B0C7D4F5A2E93",
            // openssl rand -base64 32
            "q8Vh1Zr0Ty3Kp6Lx9Bn2Wc5Ms7Qd4Fg0Hj8Rk1Ee3Ua=",
            // base64url without padding
            "Xk3_p9Lq-Zr7Tb2Nc5Vm8Hd1Fj4Gs6Wy0Qa",
        ];
        for t in accepted {
            assert_eq!(check_strength(t), Ok(()), "{t} should be accepted");
        }
        let refused: [(&str, WeakToken); 12] = [
            // The two passphrases the final review found the old estimate accepted.
            (
                "halos-gateway-token-production-2026",
                WeakToken::Base64Classes,
            ),
            ("abcdefghijklmnopqrstuvwxyz012345", WeakToken::Consecutive),
            ("", WeakToken::Empty),
            ("9c41e07b3fa2d5688e1b0c7d4f5a2e9", WeakToken::TooShort(31)),
            ("9c41e07b 3fa2d5688e1b0c7d4f5a2e93x", WeakToken::Charset),
            ("9c41e07b3fa2d5688e1b0c7d4f5a2e93!", WeakToken::Charset),
            (
                "Xk3_p9Lq-Zr7Tb2Nc5Vm8Hd1Fj4Gs6W+y0Qa",
                WeakToken::MixedAlphabets,
            ),
            (
                "9c41e07b3fa2d0000000088e1b0c7d4f5a2e93",
                WeakToken::Repeated,
            ),
            (
                "9c41e07b3fa2d01234567e1b0c7d4f5a2e93",
                WeakToken::Consecutive,
            ),
            (
                "9c41e07b3fa2d76543210e1b0c7d4f5a2e93",
                WeakToken::Consecutive,
            ),
            (
                "abababababababababababababababab",
                WeakToken::TooFewDistinct {
                    found: 2,
                    needed: 8,
                    kind: "hex",
                },
            ),
            (
                "Xy1Zw2Xy1Zw2Xy1Zw2Xy1Zw2Xy1Zw2Xy",
                WeakToken::TooFewDistinct {
                    found: 6,
                    needed: 16,
                    kind: "base64",
                },
            ),
        ];
        for (t, why) in refused {
            assert_eq!(check_strength(t), Err(why), "{t:?} should be refused");
        }
    }

    #[test]
    fn refusal_names_openssl_and_never_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.token");
        std::fs::write(&path, "halos-gateway-token-production-2026\n").unwrap();
        let err = read_token_file("gateway token", &path)
            .unwrap_err()
            .to_string();
        assert!(err.contains("openssl rand -hex 32"), "{err}");
        assert!(!err.contains("production-2026"), "{err}");
    }

    #[test]
    fn minted_tokens_are_strong_and_digests_compare() {
        let t = mint().unwrap();
        assert_eq!(check_strength(&t), Ok(()));
        let d = TokenDigest::of(&t);
        assert!(d.matches(&t));
        assert!(!d.matches(&mint().unwrap()));
        assert_eq!(TokenDigest::from_hex(&d.to_hex()), Some(d));
    }
}
