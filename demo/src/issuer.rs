//! The demo identity: a local OIDC issuer with a P-256 key generated at start (never
//! written anywhere), serving its discovery document and JWKS on loopback, and minting
//! ES256 tokens that Envoy's jwt_authn verifies against that JWKS like any IdP's.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use halo_testkit::es256;
use p256::ecdsa::SigningKey;
use serde_json::{Value, json};

/// The key id in the JWKS and in minted tokens.
pub const KID: &str = "halo-demo-1";

#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    #[error("no system randomness for the demo key: {0}")]
    Random(String),
    #[error("binding the demo issuer: {0}")]
    Bind(#[from] std::io::Error),
}

/// A running demo issuer.
pub struct DemoIssuer {
    pub addr: SocketAddr,
    key: SigningKey,
}

impl std::fmt::Debug for DemoIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DemoIssuer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

fn fresh_key() -> Result<SigningKey, IssuerError> {
    // A random 32-byte string is a valid P-256 scalar but for ~2^-128 of them: retry.
    for _ in 0..8 {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| IssuerError::Random(e.to_string()))?;
        if let Ok(key) = SigningKey::from_slice(&seed) {
            return Ok(key);
        }
    }
    Err(IssuerError::Random("no valid P-256 key in 8 draws".into()))
}

/// The JWKS holding the public half of `key`.
fn jwks(key: &SigningKey) -> Value {
    json!({"keys": [es256::jwk(key, KID)]})
}

impl DemoIssuer {
    /// Generate a key and serve `/.well-known/jwks.json` and
    /// `/.well-known/openid-configuration` on `127.0.0.1:0`.
    pub async fn start() -> Result<DemoIssuer, IssuerError> {
        let key = fresh_key()?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let url = format!("http://{addr}");
        let keys = jwks(&key);
        let discovery = json!({
            "issuer": url,
            "jwks_uri": format!("{url}/.well-known/jwks.json"),
            "id_token_signing_alg_values_supported": ["ES256"],
        });
        let app = axum::Router::new()
            .route(
                "/.well-known/jwks.json",
                axum::routing::get(move || {
                    let keys = keys.clone();
                    async move { axum::Json(keys) }
                }),
            )
            .route(
                "/.well-known/openid-configuration",
                axum::routing::get(move || {
                    let d = discovery.clone();
                    async move { axum::Json(d) }
                }),
            );
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "demo issuer stopped");
            }
        });
        Ok(DemoIssuer { addr, key })
    }

    /// `http://127.0.0.1:PORT`: the issuer (`iss`) the demo policy trusts.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A token for `user` in `groups`, with the policy's audience and claim names.
    pub fn token(
        &self,
        identity: &halo_policy::types::Identity,
        user: &str,
        groups: &[String],
        ttl: Duration,
    ) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let claims = identity.claims.clone().unwrap_or_default();
        let user_claim = claims.user.unwrap_or_else(|| "email".into());
        let groups_claim = claims.groups.unwrap_or_else(|| "groups".into());
        let mut body = json!({
            "iss": self.url(),
            "sub": format!("demo-{user}"),
            "email_verified": true,
            "iat": now,
            "exp": now + ttl.as_secs(),
        });
        if let Some(aud) = identity.effective_audience() {
            body["aud"] = json!(aud);
        }
        body[user_claim] = json!(user);
        body[groups_claim] = json!(groups);
        es256::sign(&self.key, KID, &body)
    }
}
