//! halo-auth against the fake issuer (halo-testkit `oidc`): real HTTPS, real Ed25519
//! tokens, device and PKCE logins, refresh-token rotation and reuse detection,
//! revocation, clock skew, and the token cache.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use halo_auth::oauth::{Client, DeviceStart};
use halo_auth::session::{self, Flow, LoginSettings, Prompt, REFRESH_MARGIN_SECS};
use halo_auth::store::{AuthDir, SecretStore, StoreChoice};
use halo_auth::{Error, jwt, unix_now};
use halo_testkit::oidc::{DEFAULT_AUDIENCE, FakeIssuer};
use serde_json::{Value, json};

const EMAIL: &str = "alice@acme.test";

struct Setup {
    issuer: FakeIssuer,
    _tmp: tempfile::TempDir,
    dir: AuthDir,
    ca: std::path::PathBuf,
}

fn setup() -> Setup {
    let issuer = FakeIssuer::start();
    issuer.set_user(json!({
        "sub": "u-alice", "email": EMAIL, "email_verified": true,
        "groups": ["canary-group", "eng"],
    }));
    let tmp = tempfile::tempdir().expect("tempdir");
    let ca = tmp.path().join("ca.pem");
    std::fs::write(&ca, &issuer.ca_pem).expect("write CA");
    let dir = AuthDir::new(tmp.path().join("halo")).expect("auth dir");
    Setup {
        issuer,
        _tmp: tmp,
        dir,
        ca,
    }
}

impl Setup {
    fn settings(&self, audience: Option<&str>) -> LoginSettings {
        LoginSettings {
            issuer: self.issuer.issuer.clone(),
            client_id: self.issuer.client_id().to_string(),
            audience: audience.map(str::to_string),
            user_claim: "email".into(),
            groups_claim: "groups".into(),
            scope: halo_auth::oauth::DEFAULT_SCOPE.into(),
            ca_file: Some(self.ca.clone()),
            store: StoreChoice::File,
        }
    }

    fn device_login(&self, audience: Option<&str>, now: &dyn Fn() -> i64) -> session::Status {
        session::login(
            &self.dir,
            &self.settings(audience),
            Flow::Device,
            &mut Approver(&self.issuer),
            now,
        )
        .expect("device login")
    }

    fn refresh_token(&self) -> String {
        std::fs::read_to_string(self.dir.path.join("refresh-token")).expect("refresh token file")
    }

    fn refreshes(&self) -> usize {
        self.issuer
            .grants()
            .iter()
            .filter(|g| *g == "refresh_token")
            .count()
    }
}

/// The person at the verification page: approves the code as soon as it is shown.
struct Approver<'a>(&'a FakeIssuer);

impl Prompt for Approver<'_> {
    fn device_code(&mut self, start: &DeviceStart) {
        assert!(start.verification_uri.starts_with(&self.0.issuer));
        assert!(self.0.approve_device(&start.user_code), "code is pending");
    }
    fn open_browser(&mut self, _url: &str) {
        panic!("the device flow opens no browser");
    }
}

/// A browser: follows the authorization URL, the issuer's 302 included, to the loopback
/// redirect.
struct Browser<'a> {
    ca_pem: &'a str,
    visited: Vec<String>,
}

impl Prompt for Browser<'_> {
    fn device_code(&mut self, _start: &DeviceStart) {
        panic!("the browser flow shows no device code");
    }
    fn open_browser(&mut self, url: &str) {
        self.visited.push(url.to_string());
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).expect("CA");
        let client = reqwest::blocking::Client::builder()
            .tls_certs_merge([ca])
            .build()
            .expect("browser client");
        let page = client
            .get(url)
            .send()
            .expect("browser GET")
            .text()
            .expect("page");
        assert!(page.contains("Halos"), "the loopback page answered: {page}");
    }
}

fn claims_of(token: &str) -> Value {
    jwt::claims(token).expect("a JWT")
}

#[test]
fn device_login_then_token_from_cache() {
    let s = setup();
    let status = s.device_login(Some(DEFAULT_AUDIENCE), &unix_now);
    assert_eq!(status.session.user.as_deref(), Some(EMAIL));
    assert_eq!(status.session.groups, ["canary-group", "eng"]);
    assert_eq!(status.session.store, SecretStore::File);
    let grants = s.issuer.grants();
    assert!(
        grants
            .iter()
            .all(|g| g == "urn:ietf:params:oauth:grant-type:device_code")
    );

    let t = session::token(&s.dir, None, &unix_now).expect("token");
    assert!(!t.refreshed, "served from the login's cache");
    let c = claims_of(&t.token);
    assert_eq!(c["iss"], json!(s.issuer.issuer));
    assert_eq!(c["aud"], json!(DEFAULT_AUDIENCE));
    assert_eq!(c["email"], json!(EMAIL));
    assert_eq!(c["groups"], json!(["canary-group", "eng"]));
    // The same token again, still without a call to the issuer.
    let again = session::token(&s.dir, Some(DEFAULT_AUDIENCE), &unix_now).expect("token");
    assert_eq!(again.token, t.token);
    assert_eq!(s.refreshes(), 0);

    #[cfg(unix)]
    for f in ["refresh-token", "tokens.json", "session.json"] {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(s.dir.path.join(f))
            .expect(f)
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
}

#[test]
fn browser_login_with_pkce_on_a_loopback_redirect() {
    let s = setup();
    let mut browser = Browser {
        ca_pem: &s.issuer.ca_pem,
        visited: Vec::new(),
    };
    let status = session::login(
        &s.dir,
        &s.settings(Some(DEFAULT_AUDIENCE)),
        Flow::Browser {
            timeout: Duration::from_secs(30),
        },
        &mut browser,
        &unix_now,
    )
    .expect("browser login");
    assert_eq!(status.session.user.as_deref(), Some(EMAIL));
    let url = &browser.visited[0];
    assert!(url.contains("code_challenge_method=S256"), "{url}");
    assert!(
        url.contains("redirect_uri=http%3A%2F%2F127.0.0.1%3A"),
        "{url}"
    );
    assert_eq!(s.issuer.grants(), ["authorization_code"]);
    let t = session::token(&s.dir, None, &unix_now).expect("token");
    assert_eq!(claims_of(&t.token)["aud"], json!(DEFAULT_AUDIENCE));
}

#[test]
fn a_denied_device_login_is_refused() {
    let s = setup();
    struct Denier<'a>(&'a FakeIssuer);
    impl Prompt for Denier<'_> {
        fn device_code(&mut self, start: &DeviceStart) {
            assert!(self.0.deny_device(&start.user_code));
        }
        fn open_browser(&mut self, _url: &str) {}
    }
    let err = session::login(
        &s.dir,
        &s.settings(None),
        Flow::Device,
        &mut Denier(&s.issuer),
        &unix_now,
    )
    .expect_err("denied");
    assert!(matches!(err, Error::Denied), "{err}");
    assert!(matches!(
        session::token(&s.dir, None, &unix_now),
        Err(Error::NotLoggedIn)
    ));
}

#[test]
fn refresh_rotates_and_a_reused_refresh_token_ends_the_session() {
    let s = setup();
    // Shorter than the refresh margin: every call refreshes.
    s.issuer.set_token_lifetime(REFRESH_MARGIN_SECS - 10);
    s.device_login(Some(DEFAULT_AUDIENCE), &unix_now);
    let first = s.refresh_token();
    let a = session::token(&s.dir, None, &unix_now).expect("token a");
    assert!(a.refreshed);
    let second = s.refresh_token();
    assert_ne!(first, second, "rotated");
    let b = session::token(&s.dir, None, &unix_now).expect("token b");
    assert!(b.refreshed);
    assert_ne!(s.refresh_token(), second, "rotated again");
    assert_eq!(s.refreshes(), 2);
    assert_eq!(s.issuer.live_refresh_tokens(), 1, "old ones are spent");

    // Someone replays a spent refresh token: the issuer ends the whole family.
    let client = Client::new(Some(&s.ca)).expect("client");
    let session = s.dir.session().expect("read").expect("session");
    let replay = client.refresh(&session.endpoints, s.issuer.client_id(), &first, None);
    assert!(matches!(replay, Err(Error::SessionEnded(_))));
    let err = session::token(&s.dir, None, &unix_now).expect_err("family revoked");
    assert!(err.needs_login(), "{err}");
}

#[test]
fn a_revoked_refresh_token_asks_for_login_but_a_fresh_cache_still_serves() {
    let s = setup();
    s.device_login(Some(DEFAULT_AUDIENCE), &unix_now);
    s.issuer.revoke_all_refresh_tokens();
    // The cached token is valid for an hour: no issuer call, no failure.
    session::token(&s.dir, None, &unix_now).expect("cached");
    // An hour later the refresh is refused: log in again.
    let later = || unix_now() + 3600;
    let err = session::token(&s.dir, None, &later).expect_err("revoked");
    assert!(matches!(err, Error::SessionEnded(_)), "{err}");
    assert!(err.needs_login());
}

#[test]
fn clock_skew_neither_sends_stale_tokens_nor_refreshes_every_call() {
    let s = setup();
    // The issuer's clock is 2 h behind this machine: its exp is in our past, yet the
    // token is valid for its full hour from receipt.
    s.issuer.set_clock_offset(-7200);
    s.device_login(Some(DEFAULT_AUDIENCE), &unix_now);
    let t = session::token(&s.dir, None, &unix_now).expect("token");
    assert!(!t.refreshed);
    assert!(claims_of(&t.token)["exp"].as_i64().expect("exp") < unix_now());
    assert!(t.expires_at >= unix_now() + 3600 - 5);

    // This machine's clock is 10 min ahead of the issuer's: same answer, and the refresh
    // comes when the lifetime is nearly used up on this clock.
    s.issuer.set_clock_offset(600);
    let clock = AtomicI64::new(unix_now());
    let now = || clock.load(Ordering::SeqCst);
    let login = s.device_login(Some(DEFAULT_AUDIENCE), &now);
    assert_eq!(login.tokens.len(), 1);
    let before = s.refreshes();
    clock.fetch_add(3600 - REFRESH_MARGIN_SECS - 5, Ordering::SeqCst);
    assert!(
        !session::token(&s.dir, None, &now)
            .expect("cached")
            .refreshed
    );
    clock.fetch_add(10, Ordering::SeqCst);
    assert!(
        session::token(&s.dir, None, &now)
            .expect("refreshed")
            .refreshed
    );
    assert_eq!(s.refreshes(), before + 1);
}

#[test]
fn another_audience_is_asked_for_as_a_resource_and_cached_apart() {
    let s = setup();
    s.device_login(Some(DEFAULT_AUDIENCE), &unix_now);
    let other = session::token(&s.dir, Some("api://other"), &unix_now).expect("other");
    assert!(other.refreshed);
    assert_eq!(claims_of(&other.token)["aud"], json!("api://other"));
    let again = session::token(&s.dir, Some("api://other"), &unix_now).expect("cached");
    assert_eq!(again.token, other.token);
    let default = session::token(&s.dir, None, &unix_now).expect("default");
    assert_eq!(claims_of(&default.token)["aud"], json!(DEFAULT_AUDIENCE));
    assert_eq!(s.refreshes(), 1);
}

#[test]
fn the_client_id_as_audience_serves_the_id_token() {
    let s = setup();
    let client_id = s.issuer.client_id();
    s.device_login(Some(client_id), &unix_now);
    let t = session::token(&s.dir, None, &unix_now).expect("token");
    assert_eq!(claims_of(&t.token)["aud"], json!(client_id));
}

#[test]
fn logout_revokes_at_the_issuer_and_forgets_everything() {
    let s = setup();
    s.device_login(Some(DEFAULT_AUDIENCE), &unix_now);
    assert_eq!(s.issuer.live_refresh_tokens(), 1);
    let (_, revocation) = session::logout(&s.dir)
        .expect("logout")
        .expect("was logged in");
    assert_eq!(revocation, session::Revocation::Revoked);
    assert_eq!(s.issuer.live_refresh_tokens(), 0);
    for f in ["refresh-token", "tokens.json", "session.json"] {
        assert!(!s.dir.path.join(f).exists(), "{f} left behind");
    }
    assert!(matches!(
        session::token(&s.dir, None, &unix_now),
        Err(Error::NotLoggedIn)
    ));
    assert!(session::logout(&s.dir).expect("second logout").is_none());
}

#[test]
fn never_in_a_harness_config_dir() {
    for dir in [
        "/home/a/.claude/halo",
        "/home/a/.gemini",
        "/etc/claude-code/x",
    ] {
        let err = AuthDir::new(Path::new(dir).to_path_buf()).expect_err(dir);
        assert!(err.to_string().contains("harness"), "{err}");
    }
}

#[test]
fn a_wrong_issuer_url_is_refused_at_discovery() {
    let s = setup();
    let mut settings = s.settings(None);
    settings.issuer = format!("{}/other", s.issuer.issuer);
    let err = session::login(
        &s.dir,
        &settings,
        Flow::Device,
        &mut Approver(&s.issuer),
        &unix_now,
    )
    .expect_err("discovery mismatch");
    assert!(matches!(err, Error::BadAnswer { .. }), "{err}");
}
