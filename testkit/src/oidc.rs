//! A fake OIDC identity provider on loopback (feature `oidc`), speaking the real wire:
//! HTTPS with a throwaway CA and a leaf certificate for 127.0.0.1, a discovery document
//! at `/.well-known/openid-configuration`, a JWKS at `/keys`, and JWTs signed with a
//! real Ed25519 key (`alg: EdDSA`, `kid` published in the JWKS).
//!
//! Blocking std threads only, like the rest of the kit. The verifier under test must
//! trust [`FakeIssuer::ca_pem`] (halo-server: `--oidc-ca-file`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::EncodePrivateKey as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};

/// The issuer; stops serving when dropped.
pub struct FakeIssuer {
    /// `https://127.0.0.1:PORT`: put it in the policy's identity.issuer.
    pub issuer: String,
    pub addr: SocketAddr,
    /// PEM of the CA that signed the issuer's TLS certificate.
    pub ca_pem: String,
    /// The key id in the JWKS and in minted tokens' headers.
    pub kid: String,
    key: EncodingKey,
    /// How many times the JWKS was served (to observe caching).
    pub jwks_fetches: Arc<AtomicUsize>,
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
            "id_token_signing_alg_values_supported": ["EdDSA"],
        })
        .to_string();
        let jwks = json!({"keys": [{
            "kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"
        }]})
        .to_string();
        let jwks_fetches = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (fetches, stopped) = (Arc::clone(&jwks_fetches), Arc::clone(&stop));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(tcp) = conn else { continue };
                let (tls, discovery, jwks, fetches) = (
                    Arc::clone(&tls),
                    discovery.clone(),
                    jwks.clone(),
                    Arc::clone(&fetches),
                );
                std::thread::spawn(move || serve_one(tcp, tls, &discovery, &jwks, &fetches));
            }
        });
        FakeIssuer {
            issuer,
            addr,
            ca_pem: ca_cert.pem(),
            kid,
            key: encoding_key(&signing),
            jwks_fetches,
            stop,
        }
    }

    /// A JWT: `claims` merged over `iss`, `iat` and a one-hour `exp`, signed with the
    /// published key.
    pub fn mint(&self, claims: Value) -> String {
        self.sign(claims, &self.key)
    }

    /// The same, signed by a key the JWKS does not publish (under the published kid):
    /// a verifier must refuse it.
    pub fn mint_with_foreign_key(&self, claims: Value) -> String {
        self.sign(claims, &encoding_key(&random_signing_key()))
    }

    fn sign(&self, claims: Value, key: &EncodingKey) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut all = json!({"iss": self.issuer, "iat": now, "exp": now + 3600});
        if let (Some(a), Value::Object(c)) = (all.as_object_mut(), claims) {
            a.extend(c);
        }
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        encode(&header, &all, key).expect("sign JWT")
    }
}

fn serve_one(
    tcp: std::net::TcpStream,
    tls: Arc<rustls::ServerConfig>,
    discovery: &str,
    jwks: &str,
    fetches: &AtomicUsize,
) {
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(conn) = rustls::ServerConnection::new(tls) else {
        return;
    };
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16384 {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let path = head.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = match path {
        "/.well-known/openid-configuration" => ("200 OK", discovery),
        "/keys" => {
            fetches.fetch_add(1, Ordering::SeqCst);
            ("200 OK", jwks)
        }
        _ => ("404 Not Found", "{}"),
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(resp.as_bytes());
    let _ = stream.flush();
    stream.conn.send_close_notify();
    let _ = stream.flush();
}
