//! A fake OIDC identity provider on loopback (feature `oidc`), speaking the real wire:
//! HTTPS with a throwaway CA and a leaf certificate for 127.0.0.1, a discovery document
//! at `/.well-known/openid-configuration`, a JWKS at `/keys` (and at
//! `/.well-known/jwks.json`, where Envoy's bootstrap looks by default), and JWTs signed
//! with a real Ed25519 key (`alg: EdDSA`, `kid` published in the JWKS).
//!
//! It is also an OAuth 2.0 authorization server for one public client
//! ([`FakeIssuer::client_id`]), so a login client can be tested end to end:
//! - `POST /device`: device authorization (RFC 8628); a test approves or denies the
//!   user code with [`FakeIssuer::approve_device`] / [`FakeIssuer::deny_device`], as the
//!   person at the browser would.
//! - `GET /authorize`: authorization code with PKCE (RFC 7636, S256 only) to a loopback
//!   redirect (RFC 8252). The signed-in user is [`FakeIssuer::set_user`]'s; the answer is
//!   the 302 to the redirect URI a browser would follow.
//! - `POST /token`: the device-code, authorization-code and refresh-token grants. Every
//!   refresh rotates the refresh token; presenting a used one again revokes its whole
//!   family (the reuse detection of the OAuth security BCP). `resource` (RFC 8707) picks
//!   the access token's audience.
//! - `POST /revoke`: token revocation (RFC 7009).
//!
//! The issuer's clock can be skewed ([`FakeIssuer::set_clock_offset`]) and the access
//! token lifetime shortened ([`FakeIssuer::set_token_lifetime`]). Blocking std threads
//! only, like the rest of the kit. The client under test must trust
//! [`FakeIssuer::ca_pem`] (halo-server: `--oidc-ca-file`).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::EncodePrivateKey as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};
use sha2::Digest as _;

/// The one OAuth client the issuer knows (a public client: no secret).
pub const CLIENT_ID: &str = "halo-cli";
/// The access token audience when the client asks for none (`resource`).
pub const DEFAULT_AUDIENCE: &str = "api://halos";

/// The issuer; stops serving when dropped.
pub struct FakeIssuer {
    /// `https://127.0.0.1:PORT`: put it in the policy's identity.issuer.
    pub issuer: String,
    pub addr: SocketAddr,
    /// PEM of the CA that signed the issuer's TLS certificate.
    pub ca_pem: String,
    /// The key id in the JWKS and in minted tokens' headers.
    pub kid: String,
    key: Arc<EncodingKey>,
    /// How many times the JWKS was served (to observe caching).
    pub jwks_fetches: Arc<AtomicUsize>,
    state: Arc<Mutex<AuthState>>,
    stop: Arc<AtomicBool>,
}

impl Drop for FakeIssuer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn random_signing_key() -> SigningKey {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).expect("system randomness");
    SigningKey::from_bytes(&seed)
}

fn encoding_key(key: &SigningKey) -> EncodingKey {
    EncodingKey::from_ed_der(key.to_pkcs8_der().expect("pkcs8").as_bytes())
}

fn random_token(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("system randomness");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf)
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// One pending device authorization.
struct DeviceGrant {
    device_code: String,
    user_code: String,
    scope: String,
    /// None while pending; Some(true) approved, Some(false) denied.
    decision: Option<bool>,
    claims: Value,
    redeemed: bool,
}

/// One issued authorization code.
struct CodeGrant {
    redirect_uri: String,
    challenge: String,
    scope: String,
    claims: Value,
    /// The authorization request's `nonce`, put in the ID token (OIDC Core 3.1.2.1).
    nonce: Option<String>,
}

/// One issued refresh token.
struct RefreshGrant {
    family: u64,
    claims: Value,
    scope: String,
    used: bool,
}

#[derive(Default)]
struct AuthState {
    user: Option<Value>,
    lifetime_secs: i64,
    clock_offset_secs: i64,
    devices: Vec<DeviceGrant>,
    codes: HashMap<String, CodeGrant>,
    refresh: HashMap<String, RefreshGrant>,
    revoked_families: Vec<u64>,
    next_family: u64,
    /// The `grant_type` of every token request, in order.
    grants: Vec<String>,
}

impl FakeIssuer {
    /// Start serving on an ephemeral loopback port.
    pub fn start() -> FakeIssuer {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "halo testkit CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA cert");
        let ca = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate().expect("leaf key");
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .expect("leaf params")
            .signed_by(&leaf_key, &ca)
            .expect("leaf cert");
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
            )
            .expect("TLS config");
        let tls = Arc::new(tls);

        let signing = random_signing_key();
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(signing.verifying_key().as_bytes());
        let kid = "testkit-key-1".to_string();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let issuer = format!("https://{addr}");
        let discovery = json!({
            "issuer": issuer,
            "jwks_uri": format!("{issuer}/keys"),
            "authorization_endpoint": format!("{issuer}/authorize"),
            "token_endpoint": format!("{issuer}/token"),
            "device_authorization_endpoint": format!("{issuer}/device"),
            "revocation_endpoint": format!("{issuer}/revoke"),
            "grant_types_supported": [
                "authorization_code", "refresh_token",
                "urn:ietf:params:oauth:grant-type:device_code",
            ],
            "code_challenge_methods_supported": ["S256"],
            "id_token_signing_alg_values_supported": ["EdDSA"],
        })
        .to_string();
        let jwks = json!({"keys": [{
            "kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"
        }]})
        .to_string();
        let jwks_fetches = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Mutex::new(AuthState {
            lifetime_secs: 3600,
            ..AuthState::default()
        }));
        let key = Arc::new(encoding_key(&signing));
        let server = Arc::new(Server {
            issuer: issuer.clone(),
            kid: kid.clone(),
            key: Arc::clone(&key),
            discovery,
            jwks,
            fetches: Arc::clone(&jwks_fetches),
            state: Arc::clone(&state),
        });
        let stopped = Arc::clone(&stop);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(tcp) = conn else { continue };
                let (tls, server) = (Arc::clone(&tls), Arc::clone(&server));
                std::thread::spawn(move || server.serve_one(tcp, tls));
            }
        });
        FakeIssuer {
            issuer,
            addr,
            ca_pem: ca_cert.pem(),
            kid,
            key,
            jwks_fetches,
            state,
            stop,
        }
    }

    /// The OAuth client id the issuer accepts.
    pub fn client_id(&self) -> &'static str {
        CLIENT_ID
    }

    fn state(&self) -> MutexGuard<'_, AuthState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The person who signs in at the browser: these claims (for example `sub`, `email`,
    /// `email_verified`, `groups`) go into every token issued for their grants.
    pub fn set_user(&self, claims: Value) {
        self.state().user = Some(claims);
    }

    /// Access and ID token lifetime (`expires_in`), default 3600 s.
    pub fn set_token_lifetime(&self, secs: i64) {
        self.state().lifetime_secs = secs;
    }

    /// Skew the issuer's clock: `iat` and `exp` of issued tokens move by `secs`.
    pub fn set_clock_offset(&self, secs: i64) {
        self.state().clock_offset_secs = secs;
    }

    /// The user code of the newest pending device authorization, if any.
    pub fn pending_user_code(&self) -> Option<String> {
        self.state()
            .devices
            .iter()
            .rev()
            .find(|d| d.decision.is_none())
            .map(|d| d.user_code.clone())
    }

    /// The user at the verification page approves `user_code` as [`Self::set_user`]'s
    /// user. False if no pending authorization has that code or no user is set.
    pub fn approve_device(&self, user_code: &str) -> bool {
        let mut state = self.state();
        let Some(user) = state.user.clone() else {
            return false;
        };
        match state
            .devices
            .iter_mut()
            .find(|d| d.user_code == user_code && d.decision.is_none())
        {
            Some(d) => {
                d.decision = Some(true);
                d.claims = user;
                true
            }
            None => false,
        }
    }

    /// The user at the verification page denies `user_code`.
    pub fn deny_device(&self, user_code: &str) -> bool {
        let mut state = self.state();
        match state
            .devices
            .iter_mut()
            .find(|d| d.user_code == user_code && d.decision.is_none())
        {
            Some(d) => {
                d.decision = Some(false);
                true
            }
            None => false,
        }
    }

    /// Revoke every refresh token issued so far (an admin ending all sessions).
    pub fn revoke_all_refresh_tokens(&self) {
        let mut state = self.state();
        let families: Vec<u64> = state.refresh.values().map(|r| r.family).collect();
        state.revoked_families.extend(families);
    }

    /// How many refresh tokens are live (issued, not used, not revoked).
    pub fn live_refresh_tokens(&self) -> usize {
        let state = self.state();
        state
            .refresh
            .values()
            .filter(|r| !r.used && !state.revoked_families.contains(&r.family))
            .count()
    }

    /// The `grant_type` of every token request served, in order.
    pub fn grants(&self) -> Vec<String> {
        self.state().grants.clone()
    }

    /// A JWT: `claims` merged over `iss`, `iat` and a one-hour `exp`, signed with the
    /// published key.
    pub fn mint(&self, claims: Value) -> String {
        sign(&self.issuer, &self.kid, claims, &self.key, 0)
    }

    /// The same, signed by a key the JWKS does not publish (under the published kid):
    /// a verifier must refuse it.
    pub fn mint_with_foreign_key(&self, claims: Value) -> String {
        sign(
            &self.issuer,
            &self.kid,
            claims,
            &encoding_key(&random_signing_key()),
            0,
        )
    }
}

fn sign(issuer: &str, kid: &str, claims: Value, key: &EncodingKey, offset: i64) -> String {
    let now = unix_now() + offset;
    let mut all = json!({"iss": issuer, "iat": now, "exp": now + 3600});
    if let (Some(a), Value::Object(c)) = (all.as_object_mut(), claims) {
        a.extend(c);
    }
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(kid.to_string());
    encode(&header, &all, key).expect("sign JWT")
}

/// What the connection threads share.
struct Server {
    issuer: String,
    kid: String,
    key: Arc<EncodingKey>,
    discovery: String,
    jwks: String,
    fetches: Arc<AtomicUsize>,
    state: Arc<Mutex<AuthState>>,
}

/// A parsed request: method, path, query and form body as pairs.
struct Request {
    method: String,
    path: String,
    query: HashMap<String, String>,
    form: HashMap<String, String>,
}

/// An answer: status line, extra headers, JSON (or other) body.
struct Answer {
    status: &'static str,
    headers: Vec<(String, String)>,
    body: String,
}

fn json_answer(status: &'static str, body: Value) -> Answer {
    Answer {
        status,
        headers: Vec::new(),
        body: body.to_string(),
    }
}

fn oauth_error(error: &str, description: &str) -> Answer {
    json_answer(
        "400 Bad Request",
        json!({"error": error, "error_description": description}),
    )
}

fn pairs(text: &str) -> HashMap<String, String> {
    form_urlencoded::parse(text.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn read_request(stream: &mut impl Read) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 65536 {
            return None;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut words = head.split_whitespace();
    let method = words.next()?.to_string();
    let target = words.next()?.to_string();
    let length = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    Some(Request {
        method,
        path: path.to_string(),
        query: pairs(query),
        form: pairs(&body),
    })
}

impl Server {
    fn serve_one(&self, tcp: std::net::TcpStream, tls: Arc<rustls::ServerConfig>) {
        let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
        let Ok(conn) = rustls::ServerConnection::new(tls) else {
            return;
        };
        let mut stream = rustls::StreamOwned::new(conn, tcp);
        let Some(req) = read_request(&mut stream) else {
            return;
        };
        let answer = self.route(&req);
        let mut resp = format!(
            "HTTP/1.1 {}\r\nContent-Type: application/json\r\nCache-Control: no-store\r\nContent-Length: {}\r\nConnection: close\r\n",
            answer.status,
            answer.body.len()
        );
        for (n, v) in &answer.headers {
            resp.push_str(&format!("{n}: {v}\r\n"));
        }
        resp.push_str("\r\n");
        resp.push_str(&answer.body);
        let _ = stream.write_all(resp.as_bytes());
        let _ = stream.flush();
        stream.conn.send_close_notify();
        let _ = stream.flush();
    }

    fn state(&self) -> MutexGuard<'_, AuthState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn route(&self, req: &Request) -> Answer {
        match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/.well-known/openid-configuration") => Answer {
                status: "200 OK",
                headers: Vec::new(),
                body: self.discovery.clone(),
            },
            ("GET", "/keys" | "/.well-known/jwks.json") => {
                self.fetches.fetch_add(1, Ordering::SeqCst);
                Answer {
                    status: "200 OK",
                    headers: Vec::new(),
                    body: self.jwks.clone(),
                }
            }
            ("POST", "/device") => self.device(&req.form),
            ("GET", "/authorize") => self.authorize(&req.query),
            ("POST", "/token") => self.token(&req.form),
            ("POST", "/revoke") => self.revoke(&req.form),
            _ => json_answer("404 Not Found", json!({})),
        }
    }

    fn device(&self, form: &HashMap<String, String>) -> Answer {
        if form.get("client_id").map(String::as_str) != Some(CLIENT_ID) {
            return json_answer("401 Unauthorized", json!({"error": "invalid_client"}));
        }
        let device_code = random_token(32);
        let letters = random_token(8)
            .to_ascii_uppercase()
            .replace(['-', '_'], "X");
        let user_code = format!("{}-{}", &letters[..4], &letters[4..8]);
        self.state().devices.push(DeviceGrant {
            device_code: device_code.clone(),
            user_code: user_code.clone(),
            scope: form.get("scope").cloned().unwrap_or_default(),
            decision: None,
            claims: Value::Null,
            redeemed: false,
        });
        let page = format!("{}/activate", self.issuer);
        json_answer(
            "200 OK",
            json!({
                "device_code": device_code,
                "user_code": user_code,
                "verification_uri": page,
                "verification_uri_complete": format!("{page}?user_code={user_code}"),
                "expires_in": 600,
                "interval": 1,
            }),
        )
    }

    fn authorize(&self, q: &HashMap<String, String>) -> Answer {
        let get = |k: &str| q.get(k).map(String::as_str).unwrap_or("");
        // Errors before a trusted redirect URI is known are shown, not redirected.
        if get("client_id") != CLIENT_ID {
            return oauth_error("invalid_client", "unknown client_id");
        }
        let redirect = get("redirect_uri");
        if !redirect.starts_with("http://127.0.0.1:") && !redirect.starts_with("http://[::1]:") {
            return oauth_error("invalid_request", "redirect_uri must be a loopback URI");
        }
        let state = get("state");
        let back = |params: &[(&str, &str)]| {
            let mut url = format!("{redirect}?");
            let mut ser = form_urlencoded::Serializer::new(String::new());
            for (k, v) in params {
                ser.append_pair(k, v);
            }
            url.push_str(&ser.finish());
            Answer {
                status: "302 Found",
                headers: vec![("Location".to_string(), url)],
                body: String::new(),
            }
        };
        if get("response_type") != "code"
            || get("code_challenge_method") != "S256"
            || get("code_challenge").is_empty()
        {
            return back(&[
                ("error", "invalid_request"),
                (
                    "error_description",
                    "response_type code with PKCE S256 required",
                ),
                ("state", state),
            ]);
        }
        let mut st = self.state();
        let Some(user) = st.user.clone() else {
            return back(&[("error", "access_denied"), ("state", state)]);
        };
        let code = random_token(24);
        st.codes.insert(
            code.clone(),
            CodeGrant {
                redirect_uri: redirect.to_string(),
                challenge: get("code_challenge").to_string(),
                scope: get("scope").to_string(),
                claims: user,
                nonce: q.get("nonce").cloned(),
            },
        );
        back(&[("code", &code), ("state", state)])
    }

    fn token(&self, form: &HashMap<String, String>) -> Answer {
        let get = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
        let grant = get("grant_type").to_string();
        let mut st = self.state();
        st.grants.push(grant.clone());
        if get("client_id") != CLIENT_ID {
            return json_answer("401 Unauthorized", json!({"error": "invalid_client"}));
        }
        let mut nonce = None;
        let (claims, scope, family) = match grant.as_str() {
            "urn:ietf:params:oauth:grant-type:device_code" => {
                let code = get("device_code");
                let Some(d) = st.devices.iter_mut().find(|d| d.device_code == code) else {
                    return oauth_error("invalid_grant", "unknown device_code");
                };
                match d.decision {
                    None => {
                        return oauth_error("authorization_pending", "waiting for the user");
                    }
                    Some(false) => return oauth_error("access_denied", "the user said no"),
                    Some(true) if d.redeemed => {
                        return oauth_error("invalid_grant", "device_code already used");
                    }
                    Some(true) => {
                        d.redeemed = true;
                        (d.claims.clone(), d.scope.clone(), None)
                    }
                }
            }
            "authorization_code" => {
                let Some(c) = st.codes.remove(get("code")) else {
                    return oauth_error("invalid_grant", "unknown or used code");
                };
                if c.redirect_uri != get("redirect_uri") {
                    return oauth_error("invalid_grant", "redirect_uri mismatch");
                }
                let digest = sha2::Sha256::digest(get("code_verifier").as_bytes());
                let computed = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest);
                if computed != c.challenge {
                    return oauth_error("invalid_grant", "PKCE verification failed");
                }
                nonce = c.nonce;
                (c.claims, c.scope, None)
            }
            "refresh_token" => {
                let presented = get("refresh_token").to_string();
                let Some(r) = st.refresh.get_mut(&presented) else {
                    return oauth_error("invalid_grant", "unknown refresh token");
                };
                let family = r.family;
                if r.used {
                    // Reuse of a rotated token: someone else holds a copy. End the family.
                    st.revoked_families.push(family);
                    return oauth_error("invalid_grant", "refresh token reused");
                }
                r.used = true;
                let (claims, scope) = (r.claims.clone(), r.scope.clone());
                if st.revoked_families.contains(&family) {
                    return oauth_error("invalid_grant", "refresh token revoked");
                }
                (claims, scope, Some(family))
            }
            _ => return oauth_error("unsupported_grant_type", "unknown grant_type"),
        };
        let family = family.unwrap_or_else(|| {
            st.next_family += 1;
            st.next_family
        });
        let refresh = random_token(32);
        st.refresh.insert(
            refresh.clone(),
            RefreshGrant {
                family,
                claims: claims.clone(),
                scope: scope.clone(),
                used: false,
            },
        );
        let (lifetime, offset) = (st.lifetime_secs, st.clock_offset_secs);
        drop(st);
        let audience = match get("resource") {
            "" => DEFAULT_AUDIENCE,
            r => r,
        };
        let now = unix_now() + offset;
        let timed = |aud: &str| {
            let mut c = claims.clone();
            if let Value::Object(m) = &mut c {
                m.insert("aud".into(), json!(aud));
                m.insert("iat".into(), json!(now));
                m.insert("exp".into(), json!(now + lifetime));
                m.insert("client_id".into(), json!(CLIENT_ID));
            }
            c
        };
        let access = sign(&self.issuer, &self.kid, timed(audience), &self.key, offset);
        let mut id_claims = timed(CLIENT_ID);
        if let (Some(n), Value::Object(m)) = (nonce, &mut id_claims) {
            m.insert("nonce".into(), json!(n));
        }
        let id = sign(&self.issuer, &self.kid, id_claims, &self.key, offset);
        json_answer(
            "200 OK",
            json!({
                "access_token": access,
                "id_token": id,
                "refresh_token": refresh,
                "token_type": "Bearer",
                "expires_in": lifetime,
                "scope": scope,
            }),
        )
    }

    fn revoke(&self, form: &HashMap<String, String>) -> Answer {
        let mut st = self.state();
        if let Some(family) = form
            .get("token")
            .and_then(|t| st.refresh.get(t))
            .map(|r| r.family)
        {
            st.revoked_families.push(family);
        }
        // RFC 7009: 200 whether or not the token was known.
        json_answer("200 OK", json!({}))
    }
}
