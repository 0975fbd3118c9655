//! HTTPS in front of the harness's plain-http fakes: a throwaway CA ([`TestCa`]) that
//! issues leaf certificates, and a TLS-terminating TCP front ([`TlsFront`]) forwarding
//! to a fake provider, issuer or kill-list server. Envoy is not told about the CA unless a
//! test configures it, so the fronts are exactly "a server whose CA Envoy does not trust".

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A CA of this test only: its PEM is written to a file Envoy can read.
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    dir: tempfile::TempDir,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().expect("CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("CA certificate");
        let dir = tempfile::tempdir().expect("CA dir");
        std::fs::write(dir.path().join("ca.pem"), cert.pem()).expect("write CA file");
        TestCa {
            issuer: rcgen::Issuer::new(params, key),
            dir,
        }
    }

    /// The CA's PEM file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// An https front on a free loopback port for the `http://` URL `backend`, with a
    /// certificate for `names` (DNS names or IP literals) from this CA.
    pub async fn front(&self, backend: &str, names: &[&str]) -> TlsFront {
        let key = rcgen::KeyPair::generate().expect("leaf key");
        let leaf = rcgen::CertificateParams::new(
            names.iter().map(|n| n.to_string()).collect::<Vec<String>>(),
        )
        .expect("leaf params")
        .signed_by(&key, &self.issuer)
        .expect("leaf certificate");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .expect("TLS config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let rest = backend
            .strip_prefix("http://")
            .expect("the backend is a plain-http fake");
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let backend: SocketAddr = authority.parse().expect("the backend is IP:port");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let handshakes = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let (ok, bad) = (handshakes.clone(), refused.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, ok, bad) = (acceptor.clone(), ok.clone(), bad.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        // The client refused the certificate (or sent no TLS).
                        bad.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    ok.fetch_add(1, Ordering::SeqCst);
                    if let Ok(mut up) = tokio::net::TcpStream::connect(backend).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                    }
                });
            }
        });
        TlsFront {
            port: addr.port(),
            path: path.to_string(),
            handshakes,
            refused,
        }
    }
}

/// A TLS front: counts completed and failed handshakes.
pub struct TlsFront {
    pub port: u16,
    /// The backend URL's path (kept in [`TlsFront::url`]).
    path: String,
    handshakes: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

impl TlsFront {
    /// `https://<host>:<port><backend path>`; `host` must be one of the certificate's
    /// names for the handshake to be accepted by a verifying client.
    pub fn url(&self, host: &str) -> String {
        format!("https://{host}:{}{}", self.port, self.path)
    }

    /// Handshakes that completed (a client trusted the certificate).
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }

    /// Handshakes the client broke off (it did not trust the certificate).
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }
}
