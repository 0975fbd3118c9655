//! Unit tests of the features: each feature's `router()` driven with
//! `tower::ServiceExt::oneshot` against its own state, without starting the server (the
//! crate's `tests/` start the whole server). The fixtures here are what
//! [`crate::server::start_with`] would give a feature: the policy served now (the
//! acme-corp example, its identity issuer a fake OIDC issuer on loopback), the admin
//! check against that issuer, a log store in memory, a kill switch over it.

mod budget;
mod capabilities;
mod console;
mod controller;
mod evidence;
mod fleet;
mod http;
mod kill;
mod shadow;
mod xds;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use halo_killswitch::KillSwitch;
use halo_store::{Log, LogStore, MemoryStore};
use halo_testkit::oidc::FakeIssuer;
use halo_xds::Served;
use serde_json::{Value, json};
use tokio::sync::watch;
use tower::ServiceExt as _;

use crate::auth::{OidcVerifier, http_client};
use crate::fleet::Devices;
use crate::http::AdminAuth;
use crate::http::listener::Peer;
use crate::policy::Policy;

/// The gateway token the kill feature is given (strong enough for the token rules).
pub(crate) const GATEWAY_TOKEN: &str =
    "3f9a1c7e5b2d8046af13ce97b0d24e6c58a7f31d9e0b6c24f8a5173d0e9c6b12";
/// halod's fleet-wide token, for reports without a device.
pub(crate) const FLEET_TOKEN: &str =
    "c0ffee5a1b2d8046af13ce97b0d24e6c58a7f31d9e0b6c24f8a5173d0e9c6b77";
/// A well-formed token that is none of the above.
pub(crate) const WRONG_TOKEN: &str =
    "9c41e07b3fa2d5688e1b0c7d4f5a2e939c41e07b3fa2d5688e1b0c7d4f5a2e93";

/// The address requests come from unless a test says otherwise.
pub(crate) const PEER: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 40000);

/// The example policy repo every test serves.
fn example_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp")
}

/// What the features of one test share, as the server would build it.
pub(crate) struct Fixture {
    pub issuer: FakeIssuer,
    /// The policy source's side: send a new `Served` to change the policy served now.
    pub served: watch::Sender<Arc<Served>>,
    pub policy: Policy,
    pub admin: Arc<AdminAuth>,
    /// The log store (kill log, audit log, enrollments, devices, reports).
    pub memory: Arc<MemoryStore>,
    pub store: Arc<dyn LogStore>,
    _policy_dir: tempfile::TempDir,
}

impl Fixture {
    pub fn new() -> Fixture {
        let issuer = FakeIssuer::start();
        let dir = tempfile::tempdir().expect("tempdir");
        let served = served_from(&example_dir(), dir.path(), &issuer.issuer);
        let (tx, rx) = watch::channel(Arc::new(served));
        let policy = Policy::new(rx);
        let http = http_client(Some(("oidc-ca.pem", issuer.ca_pem.as_bytes()))).expect("client");
        let admin = Arc::new(AdminAuth::new(policy.clone(), OidcVerifier::new(http)));
        let memory = Arc::new(MemoryStore::default());
        let store: Arc<dyn LogStore> = Arc::clone(&memory) as Arc<dyn LogStore>;
        Fixture {
            issuer,
            served: tx,
            policy,
            admin,
            memory,
            store,
            _policy_dir: dir,
        }
    }

    /// An admin's OIDC token (alice, in `halos-admins`).
    pub fn admin_token(&self) -> String {
        self.issuer.mint(json!({
            "aud": "api://halos", "sub": "u-alice", "email": "alice@acme.com",
            "email_verified": true, "groups": ["engineering", "halos-admins"],
        }))
    }

    /// A developer's valid OIDC token, not an admin's (dave, in `engineering`).
    pub fn user_token(&self) -> String {
        self.issuer.mint(json!({
            "aud": "api://halos", "sub": "u-dave", "email": "dave@acme.com",
            "email_verified": true, "groups": ["engineering"],
        }))
    }

    /// Serve `change(policy now)` from here on (a policy dir edit the source accepted).
    pub fn edit_policy(
        &self,
        change: impl FnOnce(&mut halo_policy::Org, &mut halo_policy::Snapshot),
    ) {
        let now = self.policy.now();
        let (mut org, mut compiled) = (now.org.clone(), now.compiled.clone());
        change(&mut org, &mut compiled);
        let version = compiled.version();
        self.served.send_replace(Arc::new(Served {
            org,
            compiled,
            version,
        }));
    }

    /// Every record of `log`.
    pub fn log(&self, log: Log) -> Vec<Value> {
        self.memory.read_all(log).expect("memory store reads")
    }

    /// Enrollments and devices over the fixture's store, an hour's TTLs.
    pub fn devices(&self) -> Arc<Devices> {
        Arc::new(
            Devices::open(
                Arc::clone(&self.store),
                Duration::from_secs(3600),
                Duration::from_secs(3600),
            )
            .expect("devices open"),
        )
    }
}

/// The acme-corp example copied into `into`, its identity issuer rewritten to `issuer`,
/// loaded and compiled as the policy source serves it.
fn served_from(example: &Path, into: &Path, issuer: &str) -> Served {
    let policy = into.join("policy");
    copy_dir(example, &policy);
    let root = policy.join("halos.yaml");
    let text = std::fs::read_to_string(&root).expect("halos.yaml");
    let rewritten = text.replace("https://acme.okta.com/oauth2/aus9halos2acme7corp", issuer);
    assert_ne!(
        text, rewritten,
        "the example names the issuer this rewrites"
    );
    std::fs::write(&root, rewritten).expect("write halos.yaml");
    let (org, compiled) = halo_policy::load::load_checked(&policy).expect("the example loads");
    let version = compiled.version();
    Served {
        org,
        compiled,
        version,
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// A kill key pair: the switch signs with the first, a gateway verifies with the second.
pub(crate) fn kill_key() -> (ed25519_dalek::SigningKey, ed25519_compact::PublicKey) {
    let pair = halo_policy::keys::generate().expect("key pair");
    (
        halo_policy::keys::signing_key_from_pem(&pair.private_pem).expect("signing key"),
        halo_policy::keys::public_key_from_pem(&pair.public_pem).expect("public key"),
    )
}

/// A kill switch over `store` and the key that verifies its lists.
pub(crate) fn kill_switch(
    store: &Arc<dyn LogStore>,
) -> (Arc<KillSwitch>, ed25519_compact::PublicKey) {
    let (key, public) = kill_key();
    (
        KillSwitch::open(Arc::clone(store), key).expect("kill switch opens"),
        public,
    )
}

/// Unix seconds now.
pub(crate) fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64
}

/// A request from [`PEER`] (its `ConnectInfo`, as the API listener sets it).
pub(crate) fn request(
    method: Method,
    path: &str,
    bearer: Option<&str>,
    body: Option<&Value>,
) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(path);
    if let Some(t) = bearer {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let body = match body {
        Some(v) => {
            b = b.header(header::CONTENT_TYPE, "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    let mut req = b.body(body).expect("request");
    req.extensions_mut().insert(ConnectInfo(Peer(PEER)));
    req
}

pub(crate) fn get(path: &str, bearer: Option<&str>) -> Request<Body> {
    request(Method::GET, path, bearer, None)
}

pub(crate) fn post(path: &str, bearer: Option<&str>, body: &Value) -> Request<Body> {
    request(Method::POST, path, bearer, Some(body))
}

/// `req` as if it came from `addr`.
pub(crate) fn from(mut req: Request<Body>, addr: SocketAddr) -> Request<Body> {
    req.extensions_mut().insert(ConnectInfo(Peer(addr)));
    req
}

/// An answer: status, headers, the body as JSON (`Null` if it is not) and as bytes.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
    pub raw: Bytes,
}

impl Reply {
    pub fn header(&self, name: header::HeaderName) -> &str {
        self.headers
            .get(&name)
            .map(|v| v.to_str().expect("a text header"))
            .unwrap_or_default()
    }

    /// The message of an error answer.
    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or_default()
    }
}

/// Send `req` through `router` (a clone: a router is cheap to clone).
pub(crate) async fn send(router: &Router, req: Request<Body>) -> Reply {
    let resp = router.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let raw = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    Reply {
        status,
        headers,
        body,
        raw,
    }
}

/// `r` is the API's refusal: `status`, a JSON body with `code` and a message.
#[track_caller]
pub(crate) fn assert_error(r: &Reply, status: StatusCode, code: &str) {
    assert_eq!(r.status, status, "{:?}", r.body);
    assert!(
        r.header(header::CONTENT_TYPE)
            .starts_with("application/json"),
        "{:?}",
        r.headers
    );
    assert_eq!(r.body["error"], code, "{:?}", r.body);
    assert!(!r.message().is_empty(), "{:?}", r.body);
}
