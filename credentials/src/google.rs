//! Google Application Default Credentials, the two sources a gateway host has: a
//! service-account key file (an RS256-signed JWT assertion exchanged at the key's
//! `token_uri`, RFC 7523) and the metadata server (GCE, GKE workload identity, Cloud Run).
//!
//! Nothing here logs. Errors name files, fields, URLs, HTTP statuses and OAuth error codes,
//! never a key, an assertion, a token or a response body.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rsa::pkcs1::EncodeRsaPrivateKey;
use rsa::pkcs8::DecodePrivateKey;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The scope Vertex AI needs.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// RFC 7523's grant type: a JWT assertion exchanged for an access token.
pub const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// The metadata server every Google runtime exposes.
pub const METADATA_DEFAULT: &str = "http://metadata.google.internal";
/// The default service account's token, below the metadata server's base URL.
pub const METADATA_TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
/// Google accepts assertions valid for at most an hour.
const ASSERTION_LIFETIME: Duration = Duration::from_secs(3600);
/// Access tokens are short strings; a larger body is not a token response.
const MAX_RESPONSE: usize = 64 * 1024;

/// Why no token was minted.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the service-account key file {}: {source}", path.display())]
    ReadKey {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Key { path: PathBuf, message: String },
    #[error(
        "{}: credential type {kind:?} is not supported (only \"service_account\" keys; \
         on Google Cloud use the metadata server)",
        path.display()
    )]
    UnsupportedType { path: PathBuf, kind: String },
    #[error("cannot sign the token assertion: {0}")]
    Sign(String),
    #[error("{what} {url}: {message}")]
    Http {
        what: &'static str,
        url: String,
        message: String,
    },
    #[error("{what} {url} answered {status}{}", oauth_error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default())]
    Rejected {
        what: &'static str,
        url: String,
        status: u16,
        /// The OAuth `error` code (e.g. `invalid_grant`), never its description.
        oauth_error: Option<String>,
    },
    #[error("{what} {url}: {message}")]
    BadResponse {
        what: &'static str,
        url: String,
        message: String,
    },
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error("invalid metadata server URL {url:?}: {message}")]
    MetadataUrl { url: String, message: String },
}

/// An OAuth access token. Its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct AccessToken(String);

impl AccessToken {
    /// The token itself: for the SDS file only.
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessToken(<redacted>)")
    }
}

/// A freshly minted token and how long Google says it lives.
#[derive(Debug, Clone)]
pub struct Minted {
    pub token: AccessToken,
    pub expires_in: Duration,
}

/// A service-account key file, decoded strictly: Google's fields and no others. The
/// optional ones are accepted so a key downloaded from the console loads as is; only the
/// signer, the account and the token URI are used.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: String,
    private_key: String,
    client_email: String,
    token_uri: String,
    #[serde(default)]
    private_key_id: Option<String>,
    #[serde(default)]
    project_id: Option<String>,
    #[serde(default)]
    client_id: Option<String>,
    #[serde(default)]
    auth_uri: Option<String>,
    #[serde(default)]
    auth_provider_x509_cert_url: Option<String>,
    #[serde(default)]
    client_x509_cert_url: Option<String>,
    #[serde(default)]
    universe_domain: Option<String>,
}

/// A usable service-account key: the signer, who it is, where tokens come from.
pub struct ServiceAccountKey {
    path: PathBuf,
    key: EncodingKey,
    key_id: Option<String>,
    client_email: String,
    token_uri: String,
}

impl std::fmt::Debug for ServiceAccountKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountKey")
            .field("path", &self.path)
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
}

impl ServiceAccountKey {
    /// Read and check the key file at `path`.
    pub fn load(path: &Path) -> Result<ServiceAccountKey, Error> {
        let bytes = std::fs::read(path).map_err(|source| Error::ReadKey {
            path: path.to_path_buf(),
            source,
        })?;
        ServiceAccountKey::parse(path, &bytes)
    }

    /// Check key file bytes; `path` only names the file in errors.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<ServiceAccountKey, Error> {
        let key_error = |message: String| Error::Key {
            path: path.to_path_buf(),
            message,
        };
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| key_error(format!("not a JSON key file: {e}")))?;
        // Other ADC file types (authorized_user, external_account, ...) get a clear
        // "unsupported" instead of an unknown-field error about their own fields.
        match value.get("type").and_then(Value::as_str) {
            Some("service_account") => {}
            Some(other) => {
                return Err(Error::UnsupportedType {
                    path: path.to_path_buf(),
                    kind: other.to_string(),
                });
            }
            None => return Err(key_error("type: missing (want \"service_account\")".into())),
        }
        let file: KeyFile = serde_path_to_error::deserialize(value).map_err(|e| {
            let field = e.path().to_string();
            key_error(format!("{field}: {}", e.into_inner()))
        })?;
        if file.client_email.trim().is_empty() {
            return Err(key_error("client_email: empty".into()));
        }
        check_token_uri(&file.token_uri).map_err(|m| key_error(format!("token_uri: {m}")))?;
        let key = rsa_key(&file.private_key).map_err(|m| key_error(format!("private_key: {m}")))?;
        Ok(ServiceAccountKey {
            path: path.to_path_buf(),
            key,
            key_id: file.private_key_id.filter(|k| !k.is_empty()),
            client_email: file.client_email,
            token_uri: file.token_uri,
        })
    }

    pub fn client_email(&self) -> &str {
        &self.client_email
    }

    pub fn token_uri(&self) -> &str {
        &self.token_uri
    }

    /// The signed assertion: iss = the service account, scope = cloud-platform, aud =
    /// token_uri, valid for an hour from `now`.
    pub fn assertion(&self, now: SystemTime) -> Result<String, Error> {
        let iat = now
            .duration_since(UNIX_EPOCH)
            .map_err(|_| Error::Sign("the clock is before 1970".into()))?
            .as_secs();
        let mut header = Header::new(Algorithm::RS256);
        header.kid = self.key_id.clone();
        let claims = Claims {
            iss: &self.client_email,
            scope: SCOPE,
            aud: &self.token_uri,
            iat,
            exp: iat + ASSERTION_LIFETIME.as_secs(),
        };
        jsonwebtoken::encode(&header, &claims, &self.key).map_err(|e| Error::Sign(e.to_string()))
    }

    /// Exchange a fresh assertion for an access token at `token_uri`.
    pub async fn mint(&self, http: &reqwest::Client, now: SystemTime) -> Result<Minted, Error> {
        const WHAT: &str = "token endpoint";
        let assertion = self.assertion(now)?;
        let response = http
            .post(&self.token_uri)
            .form(&[
                ("grant_type", JWT_BEARER),
                ("assertion", assertion.as_str()),
            ])
            .send()
            .await
            .map_err(|e| Error::Http {
                what: WHAT,
                url: self.token_uri.clone(),
                message: without_url(e),
            })?;
        token_response(WHAT, &self.token_uri, response).await
    }
}

/// The service-account key's PKCS#8 PEM, as jsonwebtoken's RustCrypto backend wants it
/// (PKCS#1 DER). Errors never quote the key.
fn rsa_key(pem_text: &str) -> Result<EncodingKey, String> {
    let block = pem::parse(pem_text).map_err(|_| "not a PEM block".to_string())?;
    let der = match block.tag() {
        "PRIVATE KEY" => rsa::PrivateKey::from_pkcs8_der(block.contents())
            .map_err(|_| "not an RSA PKCS#8 private key".to_string())?
            .to_pkcs1_der()
            .map_err(|_| "cannot re-encode the RSA key".to_string())?
            .as_bytes()
            .to_vec(),
        // Google's keys are PKCS#8; a PKCS#1 key is accepted as is.
        "RSA PRIVATE KEY" => {
            use rsa::pkcs1::DecodeRsaPrivateKey;
            rsa::PrivateKey::from_pkcs1_der(block.contents())
                .map_err(|_| "not an RSA PKCS#1 private key".to_string())?;
            block.contents().to_vec()
        }
        other => return Err(format!("PEM block {other:?}, want \"PRIVATE KEY\"")),
    };
    Ok(EncodingKey::from_rsa_der(&der))
}

/// The assertion is a credential for an hour: only https, or plain http to loopback
/// (tests, a local emulator).
fn check_token_uri(uri: &str) -> Result<(), String> {
    check_url(uri, true)
}

fn check_url(uri: &str, https_required_off_loopback: bool) -> Result<(), String> {
    let url = reqwest::Url::parse(uri).map_err(|e| format!("{uri:?} is not a URL: {e}"))?;
    let host = url
        .host_str()
        .ok_or_else(|| format!("{uri:?} names no host"))?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match url.scheme() {
        "https" => Ok(()),
        "http" if loopback || !https_required_off_loopback => Ok(()),
        other => Err(format!(
            "{uri:?}: scheme {other:?} (want https, or http to loopback)"
        )),
    }
}

/// The metadata server: `GET <base>/computeMetadata/v1/instance/service-accounts/default/token`
/// with `Metadata-Flavor: Google`.
#[derive(Debug, Clone)]
pub struct MetadataServer {
    url: String,
}

impl MetadataServer {
    /// `base` is the server's root, e.g. `http://metadata.google.internal`. Plain http is
    /// how the metadata server is spoken to (it is link-local).
    pub fn new(base: &str) -> Result<MetadataServer, Error> {
        check_url(base, false).map_err(|message| Error::MetadataUrl {
            url: base.to_string(),
            message,
        })?;
        Ok(MetadataServer {
            url: format!("{}{METADATA_TOKEN_PATH}", base.trim_end_matches('/')),
        })
    }

    /// The server Google's libraries would use: `GCE_METADATA_HOST` (host[:port]) if
    /// set, else metadata.google.internal.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<MetadataServer, Error> {
        match env("GCE_METADATA_HOST").filter(|h| !h.is_empty()) {
            Some(host) => MetadataServer::new(&format!("http://{host}")),
            None => MetadataServer::new(METADATA_DEFAULT),
        }
    }

    pub fn token_url(&self) -> &str {
        &self.url
    }

    pub async fn mint(&self, http: &reqwest::Client) -> Result<Minted, Error> {
        const WHAT: &str = "metadata server";
        let response = http
            .get(&self.url)
            .header("metadata-flavor", "Google")
            .send()
            .await
            .map_err(|e| Error::Http {
                what: WHAT,
                url: self.url.clone(),
                message: without_url(e),
            })?;
        // A real metadata server says who it is; anything else (a captive portal, a
        // proxy) is not one.
        let flavor = response
            .headers()
            .get("metadata-flavor")
            .and_then(|v| v.to_str().ok());
        if response.status().is_success() && flavor != Some("Google") {
            return Err(Error::BadResponse {
                what: WHAT,
                url: self.url.clone(),
                message: "no `Metadata-Flavor: Google` header: not a metadata server".into(),
            });
        }
        token_response(WHAT, &self.url, response).await
    }
}

/// What both sources answer (unknown fields such as `id_token` or `scope` are Google's
/// to add).
#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    expires_in: u64,
    token_type: String,
}

async fn token_response(
    what: &'static str,
    url: &str,
    response: reqwest::Response,
) -> Result<Minted, Error> {
    let status = response.status();
    let body = read_capped(response).await.map_err(|message| Error::Http {
        what,
        url: url.to_string(),
        message,
    })?;
    if !status.is_success() {
        return Err(Error::Rejected {
            what,
            url: url.to_string(),
            status: status.as_u16(),
            oauth_error: oauth_error(&body),
        });
    }
    let bad = |message: String| Error::BadResponse {
        what,
        url: url.to_string(),
        message,
    };
    // serde_json's messages can quote a string value: report the field only.
    let parsed: TokenResponse = serde_json::from_slice(&body).map_err(|e| {
        bad(format!(
            "not a token response (line {}, column {}: {:?})",
            e.line(),
            e.column(),
            e.classify()
        ))
    })?;
    if !parsed.token_type.eq_ignore_ascii_case("bearer") {
        return Err(bad("token_type is not Bearer".into()));
    }
    let token = parsed.access_token;
    // It goes into an HTTP header: visible ASCII only, and not empty.
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad("access_token is empty or not visible ASCII".into()));
    }
    if parsed.expires_in == 0 {
        return Err(bad("expires_in is 0".into()));
    }
    Ok(Minted {
        token: AccessToken(token),
        expires_in: Duration::from_secs(parsed.expires_in),
    })
}

async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(without_url)? {
        if body.len() + chunk.len() > MAX_RESPONSE {
            return Err(format!("answer larger than {MAX_RESPONSE} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The OAuth `error` code if it is one (a short identifier), never the description.
fn oauth_error(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let code = value.get("error")?.as_str()?;
    (code.len() <= 64 && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .then(|| code.to_string())
}

/// reqwest's messages repeat the URL (which the caller already names).
fn without_url(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}

/// Where tokens come from.
#[derive(Debug)]
pub enum TokenSource {
    /// A service-account key file, re-read at every refresh so a rotated key is picked up.
    KeyFile(PathBuf),
    MetadataServer(MetadataServer),
}

impl TokenSource {
    /// Application Default Credentials order: `GOOGLE_APPLICATION_CREDENTIALS` names a
    /// key file, else the metadata server (`GCE_METADATA_HOST` or the default).
    pub fn adc(env: impl Fn(&str) -> Option<String>) -> Result<TokenSource, Error> {
        match env("GOOGLE_APPLICATION_CREDENTIALS").filter(|p| !p.is_empty()) {
            Some(path) => Ok(TokenSource::KeyFile(PathBuf::from(path))),
            None => Ok(TokenSource::MetadataServer(MetadataServer::from_env(env)?)),
        }
    }

    /// Check the source before the first refresh (a key file must load).
    pub fn check(&self) -> Result<(), Error> {
        match self {
            TokenSource::KeyFile(path) => ServiceAccountKey::load(path).map(|_| ()),
            TokenSource::MetadataServer(_) => Ok(()),
        }
    }

    /// A short description for logs: a path or a URL, never a secret.
    pub fn describe(&self) -> String {
        match self {
            TokenSource::KeyFile(path) => format!("service-account key file {}", path.display()),
            TokenSource::MetadataServer(m) => format!("metadata server {}", m.token_url()),
        }
    }

    pub async fn mint(&self, http: &reqwest::Client, now: SystemTime) -> Result<Minted, Error> {
        match self {
            TokenSource::KeyFile(path) => ServiceAccountKey::load(path)?.mint(http, now).await,
            TokenSource::MetadataServer(m) => m.mint(http).await,
        }
    }
}

/// The HTTP client both sources use: system roots, bounded time, no redirects (a token
/// endpoint that redirects would take the assertion elsewhere).
pub fn http_client() -> Result<reqwest::Client, Error> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .connect_timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| Error::Client(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_PEM: &str = include_str!("../../testkit/data/google/test-sa-key.pem");

    fn key_json(extra: &str) -> String {
        let pem = serde_json::to_string(KEY_PEM).unwrap();
        format!(
            r#"{{"type":"service_account","project_id":"p","private_key_id":"kid1",
            "private_key":{pem},"client_email":"sa@p.iam.gserviceaccount.com",
            "client_id":"1","auth_uri":"https://accounts.google.com/o/oauth2/auth",
            "token_uri":"https://oauth2.googleapis.com/token",
            "auth_provider_x509_cert_url":"https://www.googleapis.com/oauth2/v1/certs",
            "client_x509_cert_url":"https://x","universe_domain":"googleapis.com"{extra}}}"#
        )
    }

    fn parse(text: &str) -> Result<ServiceAccountKey, Error> {
        ServiceAccountKey::parse(Path::new("sa.json"), text.as_bytes())
    }

    #[test]
    fn a_google_key_file_decodes() {
        let key = parse(&key_json("")).unwrap();
        assert_eq!(key.client_email(), "sa@p.iam.gserviceaccount.com");
        assert_eq!(key.token_uri(), "https://oauth2.googleapis.com/token");
        assert_eq!(key.key_id.as_deref(), Some("kid1"));
    }

    #[test]
    fn an_unknown_field_is_named() {
        let err = parse(&key_json(r#","extra_field":1"#))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sa.json") && err.contains("extra_field"),
            "{err}"
        );
    }

    #[test]
    fn other_adc_types_are_refused_by_type() {
        let err = parse(r#"{"type":"authorized_user","refresh_token":"r","client_secret":"s"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("authorized_user") && err.contains("not supported"),
            "{err}"
        );
        assert!(!err.contains("refresh_token"), "{err}");
    }

    #[test]
    fn a_missing_required_field_is_named() {
        let text = key_json("").replace(r#""client_email":"sa@p.iam.gserviceaccount.com","#, "");
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("client_email"), "{err}");
    }

    #[test]
    fn a_bad_private_key_is_refused_without_quoting_it() {
        let text = key_json("").replace("MII", "XXMII");
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("private_key"), "{err}");
        assert!(!err.contains("XXMII"), "the key is quoted: {err}");
    }

    #[test]
    fn a_plain_http_token_uri_is_refused_off_loopback() {
        let text = key_json("").replace(
            "https://oauth2.googleapis.com/token",
            "http://oauth2.googleapis.com/token",
        );
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("token_uri"), "{err}");
        let text = key_json("").replace(
            "https://oauth2.googleapis.com/token",
            "http://127.0.0.1:9/token",
        );
        parse(&text).unwrap();
    }

    #[test]
    fn the_assertion_carries_googles_claims() {
        let key = parse(&key_json("")).unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let jwt = key.assertion(now).unwrap();
        let header = jsonwebtoken::decode_header(&jwt).unwrap();
        assert_eq!(header.alg, Algorithm::RS256);
        assert_eq!(header.kid.as_deref(), Some("kid1"));
        let payload = jwt.split('.').nth(1).unwrap();
        let claims: Value =
            serde_json::from_slice(&base64_url_decode(payload).expect("base64url payload"))
                .unwrap();
        assert_eq!(claims["iss"], "sa@p.iam.gserviceaccount.com");
        assert_eq!(claims["scope"], SCOPE);
        assert_eq!(claims["aud"], "https://oauth2.googleapis.com/token");
        assert_eq!(claims["iat"], 1_800_000_000u64);
        assert_eq!(claims["exp"], 1_800_003_600u64);
    }

    fn base64_url_decode(s: &str) -> Option<Vec<u8>> {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s)
            .ok()
    }

    #[test]
    fn adc_prefers_google_application_credentials_then_the_metadata_server() {
        let source = TokenSource::adc(|k| {
            (k == "GOOGLE_APPLICATION_CREDENTIALS").then(|| "/keys/sa.json".to_string())
        })
        .unwrap();
        assert!(matches!(source, TokenSource::KeyFile(p) if p == Path::new("/keys/sa.json")));
        let source = TokenSource::adc(|_| None).unwrap();
        assert!(matches!(&source, TokenSource::MetadataServer(m)
            if m.token_url() == "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"));
        let source =
            TokenSource::adc(|k| (k == "GCE_METADATA_HOST").then(|| "127.0.0.1:8080".to_string()))
                .unwrap();
        assert!(matches!(&source, TokenSource::MetadataServer(m)
            if m.token_url().starts_with("http://127.0.0.1:8080/computeMetadata/")));
    }

    #[test]
    fn only_oauth_error_codes_are_kept() {
        assert_eq!(
            oauth_error(br#"{"error":"invalid_grant","error_description":"Invalid JWT"}"#),
            Some("invalid_grant".to_string())
        );
        assert_eq!(
            oauth_error(br#"{"error":"Bad thing: secret-ish text"}"#),
            None
        );
        assert_eq!(oauth_error(b"<html>"), None);
    }

    #[test]
    fn access_tokens_do_not_debug_print() {
        let t = AccessToken("ya29.secret".into());
        assert!(!format!("{t:?}").contains("ya29"));
    }
}

/// Tokens for other modules' unit tests.
#[cfg(test)]
pub(crate) mod tests_support {
    pub fn token(value: &str) -> super::AccessToken {
        super::AccessToken(value.to_string())
    }
}
