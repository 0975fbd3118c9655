//! halo-auth: the developer's own Halos login, for every harness on the machine.
//!
//! `halo auth login` signs in at the policy's OIDC issuer once, with the OAuth 2.0 device
//! authorization grant (RFC 8628, for terminals and SSH sessions) or the authorization
//! code grant with PKCE on a loopback redirect (RFC 7636, RFC 8252, when a browser is at
//! hand). The refresh token goes to the OS credential store ([`store`]); `halo auth token`
//! then prints a token the gateway accepts, from a cache while it has more than a minute
//! left, else after a refresh (rotation-safe: one refresh at a time, under a file lock).
//!
//! - [`oauth`]: the wire: discovery, the two login grants, refresh, revocation.
//! - [`store`]: where things live: the session file, the token cache, the refresh token.
//! - [`session`]: login completion, `token`, `status`, `logout`.
//!
//! The CLI (`halo auth ...`) is glue over [`session`]; halod can reuse the same calls.
//! Time comes in as a parameter (unix seconds) so skew and expiry are testable.

pub mod jwt;
pub mod oauth;
pub mod session;
pub mod store;

use std::path::PathBuf;

/// Why an auth operation failed. [`Error::needs_login`] tells a caller to send the
/// developer to `halo auth login`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not logged in")]
    NotLoggedIn,
    #[error("the session has ended: the issuer refused the refresh token ({0})")]
    SessionEnded(String),
    #[error("cannot reach the issuer at {url}: {message}")]
    Unreachable { url: String, message: String },
    #[error("the issuer's answer from {url} is not usable: {message}")]
    BadAnswer { url: String, message: String },
    #[error("the issuer refused: {error}{}", description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Refused {
        error: String,
        description: Option<String>,
    },
    #[error("the sign-in was denied")]
    Denied,
    #[error("the sign-in was not completed in time")]
    TimedOut,
    #[error("the issuer gave no token for audience {audience} (it gave: {got})")]
    Audience { audience: String, got: String },
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("the OS credential store: {0}")]
    Keyring(String),
    #[error("{0}")]
    Config(String),
}

impl Error {
    /// True when only a new `halo auth login` fixes it.
    pub fn needs_login(&self) -> bool {
        matches!(self, Error::NotLoggedIn | Error::SessionEnded(_))
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Unix seconds now (the CLI's clock; library calls take time as a parameter).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
