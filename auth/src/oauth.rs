//! The OAuth 2.0 / OIDC wire, blocking: discovery, the device authorization grant
//! (RFC 8628), the authorization code grant with PKCE (RFC 7636) on a loopback redirect
//! (RFC 8252), the refresh grant and revocation (RFC 7009). No state: [`crate::session`]
//! decides what to keep.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::{Error, Result};

/// The device-code grant type (RFC 8628 section 3.4).
pub const DEVICE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";
/// Scopes asked for at login: an ID token with the email, and a refresh token.
pub const DEFAULT_SCOPE: &str = "openid email profile offline_access";
/// How long an HTTP call to the issuer may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// The issuer's endpoints, from its discovery document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Endpoints {
    pub issuer: String,
    pub token_endpoint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_authorization_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation_endpoint: Option<String>,
    /// Where the issuer publishes its signing keys (the gateway's jwt_authn fetches them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_uri: Option<String>,
}

/// A successful token endpoint answer (RFC 6749 section 5.1; unknown fields ignored,
/// as the RFC requires of clients).
#[derive(Debug, Clone, Deserialize)]
pub struct TokenResponse {
    pub access_token: String,
    #[serde(default)]
    pub id_token: Option<String>,
    #[serde(default)]
    pub refresh_token: Option<String>,
    #[serde(default)]
    pub expires_in: Option<i64>,
}

/// The device authorization answer (RFC 8628 section 3.2).
#[derive(Debug, Clone, Deserialize)]
pub struct DeviceStart {
    pub device_code: String,
    pub user_code: String,
    pub verification_uri: String,
    #[serde(default)]
    pub verification_uri_complete: Option<String>,
    pub expires_in: u64,
    #[serde(default)]
    pub interval: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct ErrorBody {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

/// True for `https://`, or `http://` to a loopback host (a local issuer in a test or a
/// devcontainer): tokens never cross a network in clear text.
pub fn is_secure_url(url: &str) -> bool {
    if url.starts_with("https://") {
        return true;
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = if authority.starts_with('[') {
        authority.split(']').next().map(|h| format!("{h}]"))
    } else {
        authority.split(':').next().map(str::to_string)
    }
    .unwrap_or_default();
    host == "localhost"
        || host == "[::1]"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// An HTTP client for one issuer.
pub struct Client {
    http: reqwest::blocking::Client,
}

impl Client {
    /// System roots plus the PEM bundle at `ca_file` (an issuer behind a private CA).
    pub fn new(ca_file: Option<&Path>) -> Result<Client> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::blocking::Client::builder()
            .timeout(HTTP_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none());
        if let Some(path) = ca_file {
            let file_err = |message: String| Error::File {
                path: path.to_path_buf(),
                message,
            };
            let pem = std::fs::read(path).map_err(|e| file_err(e.to_string()))?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| file_err(e.to_string()))?;
            if certs.is_empty() {
                return Err(file_err("no PEM certificate in it".into()));
            }
            builder = builder.tls_certs_merge(certs);
        }
        let http = builder
            .build()
            .map_err(|e| Error::Config(format!("building the HTTP client: {e}")))?;
        Ok(Client { http })
    }

    /// The issuer's endpoints from `<issuer>/.well-known/openid-configuration`; the
    /// document must name the same issuer (OIDC Discovery section 4.3).
    pub fn discover(&self, issuer: &str) -> Result<Endpoints> {
        let issuer = issuer.trim_end_matches('/');
        if !is_secure_url(issuer) {
            return Err(Error::Config(format!(
                "issuer {issuer} is not an https URL"
            )));
        }
        let url = format!("{issuer}/.well-known/openid-configuration");
        let resp = self
            .http
            .get(&url)
            .send()
            .map_err(|e| unreachable_err(&url, &e))?;
        let status = resp.status();
        let body = resp.bytes().map_err(|e| unreachable_err(&url, &e))?;
        let bad = |message: String| Error::BadAnswer {
            url: url.clone(),
            message,
        };
        if !status.is_success() {
            return Err(bad(format!("HTTP {status}")));
        }
        let doc: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| bad(e.to_string()))?;
        let field = |name: &str| doc[name].as_str().map(str::to_string);
        let named = field("issuer").unwrap_or_default();
        if named.trim_end_matches('/') != issuer {
            return Err(bad(format!("it names issuer {named:?}, not {issuer}")));
        }
        let endpoints = Endpoints {
            issuer: named,
            token_endpoint: field("token_endpoint")
                .ok_or_else(|| bad("token_endpoint: missing".into()))?,
            device_authorization_endpoint: field("device_authorization_endpoint"),
            authorization_endpoint: field("authorization_endpoint"),
            revocation_endpoint: field("revocation_endpoint"),
            jwks_uri: field("jwks_uri"),
        };
        for (name, url) in [
            ("token_endpoint", Some(&endpoints.token_endpoint)),
            (
                "device_authorization_endpoint",
                endpoints.device_authorization_endpoint.as_ref(),
            ),
            (
                "authorization_endpoint",
                endpoints.authorization_endpoint.as_ref(),
            ),
            (
                "revocation_endpoint",
                endpoints.revocation_endpoint.as_ref(),
            ),
            ("jwks_uri", endpoints.jwks_uri.as_ref()),
        ] {
            if let Some(u) = url
                && !is_secure_url(u)
            {
                return Err(bad(format!("{name}: {u} is not an https URL")));
            }
        }
        Ok(endpoints)
    }

    /// How many keys the JWK Set at `url` holds (an answer without any is an error): a
    /// check that the keys tokens are verified with can be fetched.
    pub fn jwks_keys(&self, url: &str) -> Result<usize> {
        let resp = self
            .http
            .get(url)
            .send()
            .map_err(|e| unreachable_err(url, &e))?;
        let status = resp.status();
        let body = resp.bytes().map_err(|e| unreachable_err(url, &e))?;
        let bad = |message: String| Error::BadAnswer {
            url: url.to_string(),
            message,
        };
        if !status.is_success() {
            return Err(bad(format!("HTTP {status}")));
        }
        let doc: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| bad(e.to_string()))?;
        match doc["keys"].as_array().map(Vec::len) {
            Some(n) if n > 0 => Ok(n),
            _ => Err(bad("no keys in it".into())),
        }
    }

    fn post_form(&self, url: &str, form: &[(&str, &str)]) -> Result<(u16, Vec<u8>)> {
        let resp = self
            .http
            .post(url)
            .header("accept", "application/json")
            .form(form)
            .send()
            .map_err(|e| unreachable_err(url, &e))?;
        let status = resp.status().as_u16();
        let body = resp.bytes().map_err(|e| unreachable_err(url, &e))?;
        Ok((status, body.to_vec()))
    }

    /// POST to the token endpoint; a 2xx is a [`TokenResponse`], an OAuth error body an
    /// `Err(Ok(error body))` so each grant can read its own error codes.
    fn token_call(
        &self,
        url: &str,
        form: &[(&str, &str)],
    ) -> Result<std::result::Result<TokenResponse, (String, Option<String>)>> {
        let (status, body) = self.post_form(url, form)?;
        let bad = |message: String| Error::BadAnswer {
            url: url.to_string(),
            message,
        };
        if (200..300).contains(&status) {
            let t: TokenResponse = serde_json::from_slice(&body).map_err(|e| bad(e.to_string()))?;
            return Ok(Ok(t));
        }
        match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(e) => Ok(Err((e.error, e.error_description))),
            Err(_) => Err(bad(format!("HTTP {status} without an OAuth error body"))),
        }
    }

    /// Start a device authorization.
    pub fn start_device(
        &self,
        endpoints: &Endpoints,
        client_id: &str,
        scope: &str,
    ) -> Result<DeviceStart> {
        let url = endpoints
            .device_authorization_endpoint
            .as_deref()
            .ok_or_else(|| {
                Error::Config(format!(
                    "the issuer {} offers no device authorization endpoint; use the browser login",
                    endpoints.issuer
                ))
            })?;
        let (status, body) = self.post_form(url, &[("client_id", client_id), ("scope", scope)])?;
        if !(200..300).contains(&status) {
            return Err(match serde_json::from_slice::<ErrorBody>(&body) {
                Ok(e) => Error::Refused {
                    error: e.error,
                    description: e.error_description,
                },
                Err(_) => Error::BadAnswer {
                    url: url.into(),
                    message: format!("HTTP {status}"),
                },
            });
        }
        serde_json::from_slice(&body).map_err(|e| Error::BadAnswer {
            url: url.into(),
            message: e.to_string(),
        })
    }

    /// Poll the token endpoint until the user approves or denies, or the code expires
    /// (RFC 8628 section 3.5: `authorization_pending` waits, `slow_down` adds 5 s).
    pub fn poll_device(
        &self,
        endpoints: &Endpoints,
        client_id: &str,
        start: &DeviceStart,
    ) -> Result<TokenResponse> {
        let deadline = Instant::now() + Duration::from_secs(start.expires_in);
        let mut interval = Duration::from_secs(start.interval.unwrap_or(5).max(1));
        loop {
            std::thread::sleep(interval);
            let answer = self.token_call(
                &endpoints.token_endpoint,
                &[
                    ("grant_type", DEVICE_GRANT),
                    ("device_code", &start.device_code),
                    ("client_id", client_id),
                ],
            )?;
            match answer {
                Ok(tokens) => return Ok(tokens),
                Err((e, _)) if e == "authorization_pending" => {}
                Err((e, _)) if e == "slow_down" => interval += Duration::from_secs(5),
                Err((e, _)) if e == "access_denied" => return Err(Error::Denied),
                Err((e, _)) if e == "expired_token" => return Err(Error::TimedOut),
                Err((error, description)) => return Err(Error::Refused { error, description }),
            }
            if Instant::now() + interval > deadline {
                return Err(Error::TimedOut);
            }
        }
    }

    /// The authorization code grant with PKCE on a loopback redirect: listen on
    /// `127.0.0.1:<ephemeral>`, hand the authorization URL to `open` (a browser), wait at
    /// most `timeout` for the redirect, check `state`, redeem the code with the verifier.
    pub fn browser_login(
        &self,
        endpoints: &Endpoints,
        client_id: &str,
        scope: &str,
        timeout: Duration,
        open: &mut dyn FnMut(&str),
    ) -> Result<TokenResponse> {
        let authorize = endpoints.authorization_endpoint.as_deref().ok_or_else(|| {
            Error::Config(format!(
                "the issuer {} offers no authorization endpoint; use the device login",
                endpoints.issuer
            ))
        })?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| Error::Config(format!("listening on loopback for the redirect: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::Config(e.to_string()))?
            .port();
        let redirect_uri = format!("http://127.0.0.1:{port}/callback");
        let verifier = random_b64(32)?;
        let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(sha2::Sha256::digest(verifier.as_bytes()));
        let state = random_b64(16)?;
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("response_type", "code")
            .append_pair("client_id", client_id)
            .append_pair("redirect_uri", &redirect_uri)
            .append_pair("scope", scope)
            .append_pair("state", &state)
            .append_pair("code_challenge", &challenge)
            .append_pair("code_challenge_method", "S256")
            .finish();
        let sep = if authorize.contains('?') { '&' } else { '?' };
        let url = format!("{authorize}{sep}{query}");

        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(stream) = conn else { continue };
                if let Some(params) = answer_redirect(stream) {
                    let _ = tx.send(params);
                    return;
                }
            }
        });
        open(&url);
        let params = rx.recv_timeout(timeout).map_err(|_| Error::TimedOut)?;
        if params.get("state") != Some(&state) {
            return Err(Error::Config(
                "the redirect's state does not match this login; try again".into(),
            ));
        }
        if let Some(error) = params.get("error") {
            if error == "access_denied" {
                return Err(Error::Denied);
            }
            return Err(Error::Refused {
                error: error.clone(),
                description: params.get("error_description").cloned(),
            });
        }
        let code = params
            .get("code")
            .ok_or_else(|| Error::Config("the redirect carried no code".into()))?;
        match self.token_call(
            &endpoints.token_endpoint,
            &[
                ("grant_type", "authorization_code"),
                ("code", code),
                ("redirect_uri", &redirect_uri),
                ("client_id", client_id),
                ("code_verifier", &verifier),
            ],
        )? {
            Ok(tokens) => Ok(tokens),
            Err((error, description)) => Err(Error::Refused { error, description }),
        }
    }

    /// The refresh grant; `resource` (RFC 8707) asks for an access token for that
    /// audience. `invalid_grant` (revoked, expired, reused) ends the session.
    pub fn refresh(
        &self,
        endpoints: &Endpoints,
        client_id: &str,
        refresh_token: &str,
        resource: Option<&str>,
    ) -> Result<TokenResponse> {
        let mut form = vec![
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token),
            ("client_id", client_id),
        ];
        if let Some(r) = resource {
            form.push(("resource", r));
        }
        match self.token_call(&endpoints.token_endpoint, &form)? {
            Ok(tokens) => Ok(tokens),
            Err((error, _)) if error == "invalid_grant" => Err(Error::SessionEnded(error)),
            Err((error, description)) => Err(Error::Refused { error, description }),
        }
    }

    /// Revoke a refresh token (RFC 7009); Ok(false) when the issuer has no revocation
    /// endpoint.
    pub fn revoke(&self, endpoints: &Endpoints, client_id: &str, token: &str) -> Result<bool> {
        let Some(url) = endpoints.revocation_endpoint.as_deref() else {
            return Ok(false);
        };
        let (status, _) = self.post_form(
            url,
            &[
                ("token", token),
                ("token_type_hint", "refresh_token"),
                ("client_id", client_id),
            ],
        )?;
        if (200..300).contains(&status) {
            Ok(true)
        } else {
            Err(Error::BadAnswer {
                url: url.into(),
                message: format!("revocation answered HTTP {status}"),
            })
        }
    }
}

/// The cause chain of a transport error (form bodies carry the secrets, never the URL).
fn unreachable_err(url: &str, err: &reqwest::Error) -> Error {
    let mut message = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    Error::Unreachable {
        url: url.split('?').next().unwrap_or(url).to_string(),
        message,
    }
}

/// `bytes` random bytes, base64url. Without system randomness there is no safe login:
/// the login stops there.
fn random_b64(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)
        .map_err(|e| Error::Config(format!("no system randomness for the login: {e}")))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf))
}

/// Serve one request on the loopback listener: the redirect to `/callback` gets a page
/// telling the user to go back to the terminal and its query parameters are returned;
/// anything else (a favicon) gets 404 and None.
fn answer_redirect(mut stream: TcpStream) -> Option<HashMap<String, String>> {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 2048];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16384 {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let target = head.split_whitespace().nth(1).unwrap_or("");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let (status, page, params) = if path == "/callback" {
        let params: HashMap<String, String> = form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let page = if params.contains_key("code") {
            "Signed in to Halos. You can close this tab and return to the terminal."
        } else {
            "The Halos sign-in did not complete. Return to the terminal for details."
        };
        ("200 OK", page, Some(params))
    } else {
        ("404 Not Found", "Not found.", None)
    };
    let body = format!("<!doctype html><title>Halos</title><p>{page}</p>\n");
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    params
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secure_urls_are_https_or_loopback_http() {
        assert!(is_secure_url("https://idp.example/x"));
        assert!(is_secure_url("http://127.0.0.1:8080/token"));
        assert!(is_secure_url("http://localhost/token"));
        assert!(is_secure_url("http://[::1]:9/token"));
        assert!(!is_secure_url("http://idp.example/token"));
        assert!(!is_secure_url("http://127.0.0.1.evil.example/token"));
        assert!(!is_secure_url("ftp://idp.example"));
    }
}
