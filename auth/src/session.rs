//! The login's life: [`login`], [`token`], [`status`], [`logout`].
//!
//! Expiry is kept on this machine's clock: receipt time plus the token's lifetime
//! (`expires_in`, else `exp - iat`), never the issuer's `exp` read against the local
//! clock, so a laptop whose clock is off by minutes neither sends expired tokens nor
//! refreshes on every call. A token is served from the cache while it has more than
//! [`REFRESH_MARGIN_SECS`] left.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::oauth::{Client, DeviceStart, TokenResponse};
use crate::store::{AuthDir, CachedToken, SecretStore, Session, StoreChoice};
use crate::{Error, Result, jwt};

/// Refresh when the cached token expires within this many seconds.
pub const REFRESH_MARGIN_SECS: i64 = 60;
/// The token cache key when no audience is asked for.
const ANY_AUDIENCE: &str = "*";

/// Where and how to log in.
#[derive(Debug, Clone)]
pub struct LoginSettings {
    pub issuer: String,
    pub client_id: String,
    /// The audience the gateway expects (the policy's identity.audience, else clientID).
    pub audience: Option<String>,
    /// The policy's identity.claims.user (default `email`).
    pub user_claim: String,
    /// The policy's identity.claims.groups (default `groups`).
    pub groups_claim: String,
    pub scope: String,
    pub ca_file: Option<PathBuf>,
    pub store: StoreChoice,
}

/// Which grant signs the developer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// RFC 8628: a code typed in at a URL, from any device.
    Device,
    /// Authorization code + PKCE with a loopback redirect, in this machine's browser.
    Browser { timeout: Duration },
}

/// What a login shows the developer: the device code, or the URL a browser opens.
pub trait Prompt {
    fn device_code(&mut self, start: &DeviceStart);
    fn open_browser(&mut self, url: &str);
}

/// The result of `login` and `status`.
#[derive(Debug, Clone)]
pub struct Status {
    pub session: Session,
    /// Where the refresh token is, described.
    pub store: String,
    /// Cached tokens: audience and expiry (unix seconds, local clock).
    pub tokens: Vec<(String, i64)>,
    /// Why the OS credential store was not used (login with `Auto` only).
    pub store_fallback: Option<String>,
}

/// A token for a harness.
#[derive(Debug, Clone)]
pub struct Token {
    pub token: String,
    pub expires_at: i64,
    /// True when this call refreshed it.
    pub refreshed: bool,
    /// Set when a refresh failed and a still-valid cached token is served anyway.
    pub warning: Option<String>,
}

fn cache_key(audience: Option<&str>) -> String {
    audience.unwrap_or(ANY_AUDIENCE).to_string()
}

/// Sign in with `flow`, keep the refresh token and cache the first token. The credential
/// store is checked first, so a login never ends with a refresh token nowhere to keep.
pub fn login(
    dir: &AuthDir,
    settings: &LoginSettings,
    flow: Flow,
    prompt: &mut dyn Prompt,
    now: &dyn Fn() -> i64,
) -> Result<Status> {
    let (store, mut fallback) = match settings.store {
        StoreChoice::File => (SecretStore::File, None),
        StoreChoice::Keyring => {
            crate::store::os_store()?;
            (SecretStore::Keyring, None)
        }
        StoreChoice::Auto => match crate::store::os_store() {
            Ok(_) => (SecretStore::Keyring, None),
            Err(e) => (SecretStore::File, Some(e.to_string())),
        },
    };
    let client = Client::new(settings.ca_file.as_deref())?;
    let endpoints = client.discover(&settings.issuer)?;
    let tokens = match flow {
        Flow::Device => {
            let start = client.start_device(&endpoints, &settings.client_id, &settings.scope)?;
            prompt.device_code(&start);
            client.poll_device(&endpoints, &settings.client_id, &start)?
        }
        Flow::Browser { timeout } => client.browser_login(
            &endpoints,
            &settings.client_id,
            &settings.scope,
            timeout,
            &mut |url| prompt.open_browser(url),
        )?,
    };
    let refresh = tokens.refresh_token.as_deref().ok_or_else(|| {
        Error::Config(
            "the issuer issued no refresh token: allow the refresh_token grant for this client and the offline_access scope".into(),
        )
    })?;
    let mut session = Session {
        issuer: settings.issuer.trim_end_matches('/').to_string(),
        client_id: settings.client_id.clone(),
        endpoints,
        audience: settings.audience.clone(),
        user_claim: settings.user_claim.clone(),
        groups_claim: settings.groups_claim.clone(),
        ca_file: settings.ca_file.clone(),
        store,
        user: None,
        groups: Vec::new(),
        logged_in_at: now(),
    };
    let (cached, claims) = pick(&session, &tokens, session.audience.as_deref(), now())?;
    // Who: the ID token speaks for the user; the served token's claims otherwise.
    let who = tokens
        .id_token
        .as_deref()
        .and_then(jwt::claims)
        .unwrap_or_else(|| claims.clone());
    session.user = who[&session.user_claim].as_str().map(str::to_string);
    session.groups = string_list(&who[&session.groups_claim]);

    // A previous login's refresh token goes, wherever it was.
    if let Some(old) = dir.session()? {
        let _ = dir.secrets(old.store, &old.issuer, &old.client_id).delete();
    }
    let kept = dir
        .secrets(session.store, &session.issuer, &session.client_id)
        .set(refresh);
    match kept {
        Ok(()) => {}
        // The store answered the probe but would not keep the token (locked, refused).
        Err(e) if settings.store == StoreChoice::Auto && session.store == SecretStore::Keyring => {
            fallback = Some(e.to_string());
            session.store = SecretStore::File;
            dir.secrets(SecretStore::File, &session.issuer, &session.client_id)
                .set(refresh)?;
        }
        Err(e) => return Err(e),
    }
    dir.write_session(&session)?;
    let mut cache = crate::store::TokenCache::new();
    cache.insert(cache_key(session.audience.as_deref()), cached);
    dir.write_tokens(&cache)?;
    let mut status = status(dir)?;
    status.store_fallback = fallback;
    Ok(status)
}

fn string_list(v: &Value) -> Vec<String> {
    match v {
        Value::Array(a) => a
            .iter()
            .filter_map(|g| g.as_str().map(str::to_string))
            .collect(),
        Value::String(s) => vec![s.clone()],
        _ => Vec::new(),
    }
}

/// The token the gateway expects for `audience` out of a token response: the access
/// token if its `aud` has it, else the ID token if its `aud` has it (an audience equal to
/// the client id). It must come from the session's issuer and name the user.
fn pick(
    session: &Session,
    tokens: &TokenResponse,
    audience: Option<&str>,
    now: i64,
) -> Result<(CachedToken, Value)> {
    let candidates = [
        (Some(tokens.access_token.as_str()), tokens.expires_in),
        (tokens.id_token.as_deref(), None),
    ];
    let mut seen = Vec::new();
    for (token, expires_in) in candidates {
        let Some(token) = token else { continue };
        let claims = jwt::claims(token);
        let fits = match (audience, &claims) {
            (None, _) => true,
            (Some(a), Some(c)) => jwt::audiences(c).iter().any(|x| x == a),
            (Some(_), None) => false,
        };
        if !fits {
            let auds = claims.as_ref().map(jwt::audiences).unwrap_or_default();
            seen.push(if auds.is_empty() {
                "an opaque token".to_string()
            } else {
                format!("aud {}", auds.join(","))
            });
            continue;
        }
        let claims = claims.unwrap_or(Value::Null);
        if claims.is_object() {
            let iss = claims["iss"].as_str().unwrap_or("");
            if iss.trim_end_matches('/') != session.issuer {
                return Err(Error::BadAnswer {
                    url: session.endpoints.token_endpoint.clone(),
                    message: format!("the token's iss is {iss:?}, not {}", session.issuer),
                });
            }
            if claims.get(&session.user_claim).is_none() {
                return Err(Error::Config(format!(
                    "the issuer's token has no `{}` claim, which the gateway reads as the user (identity.claims.user); configure the issuer to include it",
                    session.user_claim
                )));
            }
        }
        let lifetime =
            expires_in.or_else(|| Some(claims["exp"].as_i64()? - claims["iat"].as_i64()?));
        let expires_at = match lifetime {
            Some(l) => now + l,
            None => claims["exp"].as_i64().unwrap_or(now),
        };
        return Ok((
            CachedToken {
                token: token.to_string(),
                expires_at,
            },
            claims,
        ));
    }
    Err(Error::Audience {
        audience: audience.unwrap_or("").to_string(),
        got: seen.join("; "),
    })
}

/// A token for `audience` (default: the session's): from the cache while it has more
/// than [`REFRESH_MARGIN_SECS`] left, else refreshed (one process at a time).
pub fn token(dir: &AuthDir, audience: Option<&str>, now: &dyn Fn() -> i64) -> Result<Token> {
    let session = dir.session()?.ok_or(Error::NotLoggedIn)?;
    let audience = audience.or(session.audience.as_deref());
    let key = cache_key(audience);
    // A cached token with more than the margin left, as served.
    let fresh = |t: Option<&CachedToken>| {
        t.filter(|t| t.expires_at - now() > REFRESH_MARGIN_SECS)
            .map(|t| Token {
                token: t.token.clone(),
                expires_at: t.expires_at,
                refreshed: false,
                warning: None,
            })
    };
    if let Some(t) = fresh(dir.tokens()?.get(&key)) {
        return Ok(t);
    }
    let _lock = dir.lock()?;
    // Another process may have refreshed while this one waited for the lock.
    let mut cache = dir.tokens()?;
    let cached = cache.get(&key).cloned();
    if let Some(t) = fresh(cached.as_ref()) {
        return Ok(t);
    }
    let secrets = dir.secrets(session.store, &session.issuer, &session.client_id);
    let refresh = secrets.get()?.ok_or(Error::NotLoggedIn)?;
    let client = Client::new(session.ca_file.as_deref())?;
    // The session's own audience comes with the login's tokens; another one is asked for
    // as a resource (RFC 8707).
    let resource = audience.filter(|a| Some(*a) != session.audience.as_deref());
    let answer = client.refresh(&session.endpoints, &session.client_id, &refresh, resource);
    let tokens = match answer {
        Ok(t) => t,
        Err(e) if !e.needs_login() => {
            // The issuer is unreachable or odd: a token that is still valid serves.
            if let Some(t) = cached.filter(|t| t.expires_at > now()) {
                return Ok(Token {
                    token: t.token,
                    expires_at: t.expires_at,
                    refreshed: false,
                    warning: Some(format!("could not refresh ({e}); serving the cached token")),
                });
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    // Keep the rotated refresh token before anything else: the old one is spent.
    if let Some(rotated) = tokens.refresh_token.as_deref()
        && rotated != refresh
    {
        secrets.set(rotated)?;
    }
    let (fresh_token, _) = pick(&session, &tokens, audience, now())?;
    cache.retain(|_, t| t.expires_at > now());
    cache.insert(key, fresh_token.clone());
    dir.write_tokens(&cache)?;
    Ok(Token {
        token: fresh_token.token,
        expires_at: fresh_token.expires_at,
        refreshed: true,
        warning: None,
    })
}

/// Who is logged in, where, and until when the cached tokens last.
pub fn status(dir: &AuthDir) -> Result<Status> {
    let session = dir.session()?.ok_or(Error::NotLoggedIn)?;
    let tokens = dir
        .tokens()?
        .into_iter()
        .map(|(aud, t)| (aud, t.expires_at))
        .collect();
    Ok(Status {
        store: session.store.describe(&dir.path),
        session,
        tokens,
        store_fallback: None,
    })
}

/// What `logout` did at the issuer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revocation {
    Revoked,
    /// The issuer has no revocation endpoint: the refresh token lives on there until it
    /// expires.
    NotSupported,
    /// Revocation failed (the local copy is gone anyway).
    Failed(String),
    /// No refresh token was stored.
    NothingToRevoke,
}

/// Revoke the refresh token at the issuer and forget everything local. Not logged in is
/// not an error: `Ok(None)`.
pub fn logout(dir: &AuthDir) -> Result<Option<(Session, Revocation)>> {
    let Some(session) = dir.session()? else {
        return Ok(None);
    };
    let _lock = dir.lock()?;
    let secrets = dir.secrets(session.store, &session.issuer, &session.client_id);
    let revocation = match secrets.get() {
        Ok(Some(refresh)) => match Client::new(session.ca_file.as_deref())
            .and_then(|c| c.revoke(&session.endpoints, &session.client_id, &refresh))
        {
            Ok(true) => Revocation::Revoked,
            Ok(false) => Revocation::NotSupported,
            Err(e) => Revocation::Failed(e.to_string()),
        },
        Ok(None) => Revocation::NothingToRevoke,
        Err(e) => Revocation::Failed(e.to_string()),
    };
    secrets.delete()?;
    dir.clear()?;
    Ok(Some((session, revocation)))
}
