//! A fake OIDC issuer on loopback, speaking the real wire: HTTPS (a throwaway CA and a
//! leaf for 127.0.0.1), `/.well-known/openid-configuration` and a JWKS, and JWTs signed
//! with a real Ed25519 key (`alg: EdDSA`). Self-contained so it can move into the shared
//! test kit: dependencies are tokio, tokio-rustls, rustls (ring), rcgen, jsonwebtoken,
//! ed25519-dalek, base64, serde_json and halo-policy (key generation).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub struct FakeIssuer {
    pub issuer: String,
    pub addr: SocketAddr,
    /// PEM of the CA that signed the issuer's TLS certificate.
    pub ca_pem: String,
    pub kid: String,
    key: EncodingKey,
    /// Requests served for the JWKS (to observe caching).
    pub jwks_fetches: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeIssuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeIssuer {
    pub async fn start() -> FakeIssuer {
        let _ = rustls::crypto::ring::default_provider().install_default();
        // TLS: a CA and a leaf for 127.0.0.1, both fresh per issuer.
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "halo test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer_ca = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&leaf_key, &issuer_ca)
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

        // Signing key: ed25519, published as an OKP JWK.
        let pair = halo_policy::keys::generate().unwrap();
        let signing = halo_policy::keys::signing_key_from_pem(&pair.private_pem).unwrap();
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(signing.verifying_key().as_bytes());
        let key = ed_key(&signing);
        let kid = "test-key-1".to_string();

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
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
        let fetches = Arc::clone(&jwks_fetches);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let (discovery, jwks, fetches) =
                    (discovery.clone(), jwks.clone(), Arc::clone(&fetches));
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16384 {
                        match tls.read(&mut chunk).await {
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
                        _ => ("404 Not Found", "{}".to_string()),
                    };
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = tls.write_all(resp.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        FakeIssuer {
            issuer,
            addr,
            ca_pem: ca_cert.pem(),
            kid,
            key,
            jwks_fetches,
            task,
        }
    }

    /// A JWT with `claims` merged over iss, iat and a one-hour exp, signed by the
    /// published key.
    pub fn mint(&self, claims: Value) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut all = json!({"iss": self.issuer, "iat": now, "exp": now + 3600});
        if let (Some(a), Value::Object(c)) = (all.as_object_mut(), claims) {
            a.extend(c);
        }
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        encode(&header, &all, &self.key).unwrap()
    }

    /// A JWT signed by a key the JWKS does not publish (same kid): must be refused.
    pub fn mint_with_foreign_key(&self, claims: Value) -> String {
        let pair = halo_policy::keys::generate().unwrap();
        let key = ed_key(&halo_policy::keys::signing_key_from_pem(&pair.private_pem).unwrap());
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut all = json!({"iss": self.issuer, "iat": now, "exp": now + 3600});
        if let (Some(a), Value::Object(c)) = (all.as_object_mut(), claims) {
            a.extend(c);
        }
        encode(&header, &all, &key).unwrap()
    }
}

fn ed_key(signing: &ed25519_dalek::SigningKey) -> EncodingKey {
    use ed25519_dalek::pkcs8::EncodePrivateKey as _;
    EncodingKey::from_ed_der(signing.to_pkcs8_der().unwrap().as_bytes())
}
