//! The console's two cookies, sealed (AES-256-GCM through the `cookie` crate's private
//! jar: encrypted and authenticated, so a client can neither read nor forge them):
//! - `halo_console_login`: the state, nonce and PKCE verifier of one login in flight
//!   (10 minutes);
//! - `halo_console`: the session: who, until when, and the CSRF token its forms carry
//!   (8 hours).
//!
//! Both are HttpOnly, SameSite=Lax, Path=/console, and Secure unless the console is served
//! over plain HTTP on loopback (a laptop or the demo). The key lives in the data dir
//! (`console-cookie.key`, 64 random bytes, 0600) so sessions survive a restart; without a
//! data dir it is random per process.

use std::path::Path;

use axum_extra::extract::cookie::{Cookie, Key, SameSite};
use base64::Engine;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

pub const SESSION_COOKIE: &str = "halo_console";
pub const LOGIN_COOKIE: &str = "halo_console_login";
/// How long a session lasts; then the admin logs in again.
pub const SESSION_LIFETIME: time::Duration = time::Duration::hours(8);
/// How long a login may take at the identity provider.
pub const LOGIN_LIFETIME: time::Duration = time::Duration::minutes(10);
/// The key file's name in the data dir.
pub const KEY_FILE: &str = "console-cookie.key";

/// A logged-in admin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Session {
    pub user: String,
    /// The groups claim at login; each request checks them against the adminGroups of
    /// the policy served then.
    pub groups: Vec<String>,
    /// Unix seconds.
    pub exp: i64,
    /// Every state-changing form carries this; compared in constant time.
    pub csrf: String,
}

/// One login in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Login {
    pub state: String,
    pub nonce: String,
    pub verifier: String,
    pub redirect_uri: String,
    /// Where to go after the login (a /console path).
    pub next: String,
    pub exp: i64,
}

/// `n` random bytes, base64url without padding.
pub fn random(n: usize) -> Result<String, getrandom::Error> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf))
}

/// The PKCE S256 challenge of a verifier (RFC 7636 4.2).
pub fn challenge(verifier: &str) -> String {
    use sha2::Digest;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier))
}

/// Whether two secrets are equal, in constant time.
pub fn same_secret(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    !a.is_empty() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// The sealing key: read from the data dir, created there on first use; random per process
/// without a data dir.
pub fn load_key(data_dir: Option<&Path>) -> anyhow::Result<Key> {
    use anyhow::Context;
    let Some(dir) = data_dir else {
        let mut bytes = [0u8; 64];
        getrandom::fill(&mut bytes).context("system randomness")?;
        return Ok(Key::from(&bytes));
    };
    let path = dir.join(KEY_FILE);
    if let Ok(bytes) = std::fs::read(&path) {
        if bytes.len() != 64 {
            anyhow::bail!(
                "{}: the console cookie key must be 64 bytes, it has {}; remove it to make a new one (every console session ends)",
                path.display(),
                bytes.len()
            );
        }
        return Ok(Key::from(&bytes));
    }
    let mut bytes = [0u8; 64];
    getrandom::fill(&mut bytes).context("system randomness")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    halo_fsutil::write_atomic(&path, &bytes, 0o600)?;
    Ok(Key::from(&bytes))
}

/// A sealed cookie's attributes.
pub fn cookie(
    name: &'static str,
    value: String,
    lifetime: time::Duration,
    secure: bool,
) -> Cookie<'static> {
    Cookie::build((name, value))
        .path("/console")
        .http_only(true)
        .secure(secure)
        .same_site(SameSite::Lax)
        .max_age(lifetime)
        .build()
}

/// The cookie that removes `name` (same path, so the browser matches it).
pub fn removal(name: &'static str) -> Cookie<'static> {
    Cookie::build((name, "")).path("/console").build()
}

pub fn now_unix() -> i64 {
    OffsetDateTime::now_utc().unix_timestamp()
}

/// Decode a sealed cookie's JSON; `None` when it is absent, expired or not ours.
pub fn decode<T: serde::de::DeserializeOwned>(
    value: Option<&str>,
    exp: impl Fn(&T) -> i64,
) -> Option<T> {
    let v: T = serde_json::from_str(value?).ok()?;
    (exp(&v) > now_unix()).then_some(v)
}
