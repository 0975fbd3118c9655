//! Admin authentication: an OIDC bearer JWT from the policy's identity issuer.
//!
//! The token's signature is checked natively (jsonwebtoken) against the issuer's JWKS,
//! which is found through the issuer's discovery document
//! (`{issuer}/.well-known/openid-configuration` -> `jwks_uri`) and cached. A token whose
//! `kid` is not in the cached set triggers one refetch (key rotation), at most every
//! [`REFETCH_MIN`], so forged kids cannot make the server hammer the IdP. `iss`, `aud`
//! (identity.audience, else clientID) and `exp` are required. The groups claim
//! (identity.claims.groups, default `groups`) must contain one of identity.adminGroups:
//! otherwise 403. Only asymmetric algorithms are accepted, so a JWKS can never be used as
//! an HMAC secret.

use std::sync::Arc;
use std::time::{Duration, Instant};

use halo_policy::types::{DEFAULT_GROUPS_CLAIM, DEFAULT_USER_CLAIM, Identity};
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use serde::Deserialize;
use tokio::sync::Mutex;

/// A cached JWKS is used for this long before it is fetched again.
pub const JWKS_TTL: Duration = Duration::from_secs(600);
/// Minimum time between fetches triggered by an unknown `kid`.
pub const REFETCH_MIN: Duration = Duration::from_secs(30);
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Clock skew allowed on exp and nbf.
const LEEWAY_SECS: u64 = 60;

const ALLOWED: [Algorithm; 8] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::EdDSA,
];

/// A verified administrator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    /// The user claim (default `email`), else `sub`: the actor in the logs.
    pub user: String,
    /// The groups claim (the console's session keeps it to re-check each request).
    pub groups: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// 401: no token, or a token that does not verify.
    #[error("{0}")]
    Unauthenticated(String),
    /// 403: a valid token of someone who is not an admin.
    #[error("{0}")]
    Forbidden(String),
    /// 503: the server cannot check tokens (no identity in policy, IdP unreachable).
    #[error("{0}")]
    Unavailable(String),
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum SetupError {
    #[error("cannot read the OIDC CA file {path}: {message}")]
    CaFile { path: String, message: String },
    #[error("cannot build the HTTP client for the identity provider: {0}")]
    Client(String),
}

/// Install the process-wide TLS crypto provider (ring) once; later calls are no-ops.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// An HTTP client for the identity provider: system roots plus an optional extra CA
/// (`--oidc-ca-file`, for an IdP behind a private CA).
pub fn http_client(ca_pem: Option<(&str, &[u8])>) -> Result<reqwest::Client, SetupError> {
    install_crypto_provider();
    let mut builder = reqwest::Client::builder()
        .timeout(FETCH_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none());
    if let Some((path, pem)) = ca_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| SetupError::CaFile {
            path: path.to_string(),
            message: e.to_string(),
        })?;
        if certs.is_empty() {
            return Err(SetupError::CaFile {
                path: path.to_string(),
                message: "no PEM certificate in it".to_string(),
            });
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder
        .build()
        .map_err(|e| SetupError::Client(e.to_string()))
}

#[derive(Debug)]
struct Cache {
    /// The issuer the keys are of: a policy edit that changes it drops them.
    issuer: String,
    keys: Option<(Instant, Arc<JwkSet>)>,
    last_fetch: Option<Instant>,
}

/// Verifies admin bearer tokens against the served policy's identity provider (passed
/// per call, so a policy edit applies to the next call).
#[derive(Debug)]
pub struct OidcVerifier {
    http: reqwest::Client,
    cache: Mutex<Cache>,
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
    #[serde(default)]
    authorization_endpoint: Option<String>,
    #[serde(default)]
    token_endpoint: Option<String>,
}

/// Where a browser logs in and where its code is redeemed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    pub authorization: String,
    pub token: String,
}

fn require_identity(identity: Option<&Identity>) -> Result<&Identity, AuthError> {
    identity.ok_or_else(|| {
        AuthError::Unavailable(
            "the served policy has no identity (halos.yaml identity): the admin API is unavailable"
                .to_string(),
        )
    })
}

impl OidcVerifier {
    pub fn new(http: reqwest::Client) -> OidcVerifier {
        OidcVerifier {
            http,
            cache: Mutex::new(Cache {
                issuer: String::new(),
                keys: None,
                last_fetch: None,
            }),
        }
    }

    /// Check an `Authorization` header value and the admin group rule against
    /// `identity`, the served policy's; `None` makes every admin call 503.
    pub async fn verify_admin(
        &self,
        identity: Option<&Identity>,
        authorization: Option<&str>,
    ) -> Result<Admin, AuthError> {
        let identity = require_identity(identity)?;
        let token = bearer(authorization).ok_or_else(|| {
            AuthError::Unauthenticated(
                "an admin call needs `Authorization: Bearer <OIDC token>` from the policy's identity issuer"
                    .to_string(),
            )
        })?;
        let audience = identity.effective_audience().ok_or_else(|| {
            AuthError::Unavailable("the policy's identity has no audience or clientID".to_string())
        })?;
        let claims = self.verify_jwt(identity, token, audience).await?;
        admin_from_claims(identity, &claims)
    }

    /// Check the ID token of the console's login (OIDC Core 3.1.3.7): signed by the
    /// issuer, `aud` the policy's clientID, unexpired, carrying the `nonce` the login
    /// sent; then the admin group rule, as for the API.
    pub async fn verify_id_token(
        &self,
        identity: Option<&Identity>,
        id_token: &str,
        nonce: &str,
    ) -> Result<Admin, AuthError> {
        let identity = require_identity(identity)?;
        let client_id = identity.client_id.as_deref().ok_or_else(|| {
            AuthError::Unavailable(
                "the policy's identity has no clientID: the console cannot log in".to_string(),
            )
        })?;
        let claims = self.verify_jwt(identity, id_token, client_id).await?;
        let sent = claims.get("nonce").and_then(|v| v.as_str()).unwrap_or("");
        if sent.is_empty()
            || !bool::from(subtle::ConstantTimeEq::ct_eq(
                sent.as_bytes(),
                nonce.as_bytes(),
            ))
        {
            return Err(AuthError::Unauthenticated(
                "the ID token does not carry this login's nonce".to_string(),
            ));
        }
        admin_from_claims(identity, &claims)
    }

    /// The issuer's authorization and token endpoints, from its discovery document.
    pub async fn endpoints(&self, identity: Option<&Identity>) -> Result<Endpoints, AuthError> {
        let identity = require_identity(identity)?;
        let d = discover(&self.http, &identity.issuer).await.map_err(|e| {
            AuthError::Unavailable(format!(
                "cannot read the identity provider's discovery document: {e}"
            ))
        })?;
        match (d.authorization_endpoint, d.token_endpoint) {
            (Some(authorization), Some(token))
                if authorization.starts_with("https://") && token.starts_with("https://") =>
            {
                Ok(Endpoints {
                    authorization,
                    token,
                })
            }
            _ => Err(AuthError::Unavailable(
                "the identity provider's discovery document has no https authorization_endpoint and token_endpoint"
                    .to_string(),
            )),
        }
    }

    /// Redeem an authorization code with its PKCE verifier (RFC 7636) at the token
    /// endpoint, as a public client; the ID token it answers.
    pub async fn redeem_code(
        &self,
        identity: Option<&Identity>,
        token_endpoint: &str,
        code: &str,
        verifier: &str,
        redirect_uri: &str,
    ) -> Result<String, AuthError> {
        let identity = require_identity(identity)?;
        let client_id = identity.client_id.as_deref().unwrap_or("");
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "authorization_code")
            .append_pair("code", code)
            .append_pair("code_verifier", verifier)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("client_id", client_id)
            .finish();
        let resp = self
            .http
            .post(token_endpoint)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .send()
            .await
            .map_err(|e| AuthError::Unavailable(format!("POST {token_endpoint}: {e}")))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| AuthError::Unavailable(format!("POST {token_endpoint}: {e}")))?;
        #[derive(Deserialize)]
        struct TokenAnswer {
            id_token: Option<String>,
            error: Option<String>,
        }
        let answer: TokenAnswer = serde_json::from_slice(&bytes).map_err(|e| {
            AuthError::Unavailable(format!(
                "POST {token_endpoint}: HTTP {status}, not JSON: {e}"
            ))
        })?;
        match (status.is_success(), answer.id_token, answer.error) {
            (true, Some(id), _) => Ok(id),
            (true, None, _) => Err(AuthError::Unauthenticated(
                "the token endpoint answered no id_token (is the openid scope allowed?)"
                    .to_string(),
            )),
            (false, _, e) => Err(AuthError::Unauthenticated(format!(
                "the identity provider refused the code: {}",
                e.unwrap_or_else(|| format!("HTTP {status}"))
            ))),
        }
    }

    /// Verify a JWT's signature (the issuer's JWKS), `iss`, `aud` and `exp`; its claims.
    async fn verify_jwt(
        &self,
        identity: &Identity,
        token: &str,
        audience: &str,
    ) -> Result<serde_json::Map<String, serde_json::Value>, AuthError> {
        let header = decode_header(token)
            .map_err(|_| AuthError::Unauthenticated("the bearer token is not a JWT".to_string()))?;
        if !ALLOWED.contains(&header.alg) {
            return Err(AuthError::Unauthenticated(format!(
                "JWT algorithm {:?} is not accepted (asymmetric algorithms only)",
                header.alg
            )));
        }
        let kid = header.kid.clone().unwrap_or_default();
        let keys = self.keys_for(identity, &kid).await?;
        let candidates: Vec<_> = keys
            .keys
            .iter()
            .filter(|k| kid.is_empty() || k.common.key_id.as_deref() == Some(kid.as_str()))
            .filter(|k| !matches!(k.algorithm, AlgorithmParameters::OctetKey(_)))
            .collect();
        if candidates.is_empty() {
            return Err(AuthError::Unauthenticated(
                "the JWT's key id is not in the issuer's JWKS".to_string(),
            ));
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[identity.issuer.as_str()]);
        validation.set_audience(&[audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = LEEWAY_SECS;
        let mut last_err = None;
        for jwk in candidates {
            let Ok(key) = DecodingKey::from_jwk(jwk) else {
                continue;
            };
            match decode::<serde_json::Map<String, serde_json::Value>>(token, &key, &validation) {
                Ok(data) => return Ok(data.claims),
                Err(e) => last_err = Some(e),
            }
        }
        Err(AuthError::Unauthenticated(match last_err {
            Some(e) => format!("the JWT does not verify: {e}"),
            None => "no usable key in the issuer's JWKS for this JWT".to_string(),
        }))
    }

    async fn keys_for(&self, identity: &Identity, kid: &str) -> Result<Arc<JwkSet>, AuthError> {
        let mut cache = self.cache.lock().await;
        if cache.issuer != identity.issuer {
            cache.issuer.clone_from(&identity.issuer);
            cache.keys = None;
            cache.last_fetch = None;
        }
        let now = Instant::now();
        if let Some((at, keys)) = &cache.keys {
            let fresh = now.duration_since(*at) < JWKS_TTL;
            let has_kid = kid.is_empty() || keys.find(kid).is_some();
            let may_refetch = cache
                .last_fetch
                .is_none_or(|t| now.duration_since(t) >= REFETCH_MIN);
            if fresh && (has_kid || !may_refetch) {
                return Ok(Arc::clone(keys));
            }
        }
        cache.last_fetch = Some(now);
        match self.fetch(identity).await {
            Ok(keys) => {
                let keys = Arc::new(keys);
                cache.keys = Some((now, Arc::clone(&keys)));
                Ok(keys)
            }
            Err(e) => {
                // Keep using the last good set: an IdP blip must not lock admins out.
                if let Some((_, keys)) = &cache.keys {
                    tracing::warn!(error = %e, "JWKS refresh failed; using the cached keys");
                    return Ok(Arc::clone(keys));
                }
                Err(AuthError::Unavailable(format!(
                    "cannot fetch the identity provider's keys: {e}"
                )))
            }
        }
    }

    async fn fetch(&self, identity: &Identity) -> Result<JwkSet, String> {
        let uri = discovered_jwks_uri(&self.http, &identity.issuer).await?;
        get_json(&self.http, &uri).await
    }

    /// The HTTP client the verifier reads the issuer with (the OIDC CA trusted).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }
}

/// `issuer`'s discovery document (`{issuer}/.well-known/openid-configuration`), checked
/// to name that issuer (OIDC Discovery section 4.3).
async fn discover(http: &reqwest::Client, issuer: &str) -> Result<Discovery, String> {
    let issuer = issuer.trim_end_matches('/');
    let discovery: Discovery =
        get_json(http, &format!("{issuer}/.well-known/openid-configuration")).await?;
    if discovery.issuer.trim_end_matches('/') != issuer {
        return Err(format!(
            "the discovery document names issuer {:?}, not the policy's",
            discovery.issuer
        ));
    }
    Ok(discovery)
}

/// The `jwks_uri` of `issuer`'s discovery document: where its signing keys are (Okta's
/// and Azure AD's are not at `<issuer>/.well-known/jwks.json`). https only.
pub async fn discovered_jwks_uri(http: &reqwest::Client, issuer: &str) -> Result<String, String> {
    let discovery = discover(http, issuer).await?;
    if !discovery.jwks_uri.starts_with("https://") {
        return Err("the discovery document's jwks_uri is not https".to_string());
    }
    Ok(discovery.jwks_uri)
}

/// How many keys the JWK Set at `uri` holds; none is an error.
pub async fn jwks_key_count(http: &reqwest::Client, uri: &str) -> Result<usize, String> {
    let keys: JwkSet = get_json(http, uri).await?;
    match keys.keys.len() {
        0 => Err(format!("GET {uri}: no keys in it")),
        n => Ok(n),
    }
}

async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
) -> Result<T, String> {
    let resp = http
        .get(url)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("GET {url}: HTTP {}", resp.status()));
    }
    let bytes = resp.bytes().await.map_err(|e| format!("GET {url}: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("GET {url}: {e}"))
}

fn admin_from_claims(
    identity: &Identity,
    claims: &serde_json::Map<String, serde_json::Value>,
) -> Result<Admin, AuthError> {
    let claim_names = identity.claims.clone().unwrap_or_default();
    let groups_claim = claim_names
        .groups
        .as_deref()
        .unwrap_or(DEFAULT_GROUPS_CLAIM);
    let user_claim = claim_names.user.as_deref().unwrap_or(DEFAULT_USER_CLAIM);
    let user = claims
        .get(user_claim)
        .and_then(|v| v.as_str())
        .or_else(|| claims.get("sub").and_then(|v| v.as_str()))
        .unwrap_or("")
        .to_string();
    let groups: Vec<&str> = match claims.get(groups_claim) {
        Some(serde_json::Value::Array(items)) => items.iter().filter_map(|v| v.as_str()).collect(),
        Some(serde_json::Value::String(one)) => vec![one.as_str()],
        _ => Vec::new(),
    };
    if user.is_empty() {
        return Err(AuthError::Unauthenticated(format!(
            "the JWT has neither a {user_claim} nor a sub claim"
        )));
    }
    if !groups
        .iter()
        .any(|g| identity.admin_groups.iter().any(|a| a == g))
    {
        return Err(AuthError::Forbidden(format!(
            "{user} is not an admin: the {groups_claim} claim contains none of the policy's adminGroups ({})",
            identity.admin_groups.join(", ")
        )));
    }
    let groups = groups.into_iter().map(str::to_string).collect();
    Ok(Admin { user, groups })
}

/// The token of an `Authorization: Bearer <token>` header value.
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    let value = authorization?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}
