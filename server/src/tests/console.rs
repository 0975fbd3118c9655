//! The console's refusals at the HTTP level (issue 46 item 6).
//!
//! The console's router against its features' own states (kill, fleet, controller), as
//! [`crate::server::start_with`] builds it, driven with `oneshot`. Sessions are either
//! sealed here with the console's own [`session`] types and the same [`Key`], or made by
//! the real code flow against the fake issuer.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use axum::response::IntoResponse as _;
use axum_extra::extract::cookie::{Cookie, Key, PrivateCookieJar};
use halo_killswitch::{KillSwitch, Target};
use halo_store::Log;
use serde_json::json;

use super::{Fixture, GATEWAY_TOKEN, Reply, kill_switch, now, send};
use crate::console::session::{self, LOGIN_COOKIE, Login, SESSION_COOKIE, Session};
use crate::console::{ConsoleParts, router};
use crate::controller::ControllerApi;
use crate::fleet::{Devices, FleetApi};
use crate::http::secret::SecretGate;
use crate::kill::{Kill, KillParts};
use crate::token::TokenDigest;

/// The Host a loopback browser sends (no `--console-url`).
const LOOPBACK: &str = "127.0.0.1:8443";
const CSRF: &str = "the-sessions-csrf-token-0123456789abcdef";
const OPUS: &str = "claude-opus-default";

struct ConsoleFx {
    fx: Fixture,
    switch: Arc<KillSwitch>,
    devices: Arc<Devices>,
    key: Key,
    router: Router,
}

fn console_fx(url: Option<&str>) -> ConsoleFx {
    let fx = Fixture::new();
    let (switch, _) = kill_switch(&fx.store);
    let devices = fx.devices();
    let gate = Arc::new(SecretGate::default());
    let kill = Kill::new(KillParts {
        switch: Arc::clone(&switch),
        store: Arc::clone(&fx.store),
        policy: fx.policy.clone(),
        gateway_token: Some(TokenDigest::of(GATEWAY_TOKEN)),
        gate: Arc::clone(&gate),
        admin: Arc::clone(&fx.admin),
        devices: Arc::clone(&devices),
    });
    let fleet = Arc::new(FleetApi {
        devices: Arc::clone(&devices),
        store: Arc::clone(&fx.store),
        policy: fx.policy.clone(),
        fleet_token: None,
        gate,
        admin: Arc::clone(&fx.admin),
    });
    let controller = Arc::new(ControllerApi {
        controller: None,
        policy: fx.policy.clone(),
        admin: Arc::clone(&fx.admin),
    });
    let key = Key::generate();
    let router = router(
        ConsoleParts {
            admin: Arc::clone(&fx.admin),
            kill: Some(kill),
            fleet,
            controller,
            store: Arc::clone(&fx.store),
            xds: None,
        },
        key.clone(),
        url.map(str::to_string),
    );
    ConsoleFx {
        fx,
        switch,
        devices,
        key,
        router,
    }
}

/// `name=value` of a cookie sealed with `key`, as the console's jar would send it.
fn seal(key: &Key, name: &'static str, value: String) -> String {
    let resp = PrivateCookieJar::new(key.clone())
        .add(Cookie::new(name, value))
        .into_response();
    let set = resp
        .headers()
        .get(header::SET_COOKIE)
        .expect("a set-cookie")
        .to_str()
        .expect("text");
    set.split(';').next().expect("name=value").to_string()
}

/// An admin's session (alice, in `halos-admins`) ending at `exp`.
fn admin_session(exp: i64) -> Session {
    Session {
        user: "alice@acme.com".to_string(),
        groups: vec!["engineering".to_string(), "halos-admins".to_string()],
        exp,
        csrf: CSRF.to_string(),
    }
}

fn session_cookie(key: &Key, s: &Session) -> String {
    seal(key, SESSION_COOKIE, serde_json::to_string(s).expect("json"))
}

/// A console request from a loopback browser, with `cookie` and `origin` if given.
fn req(
    method: Method,
    path: &str,
    cookie: Option<&str>,
    origin: Option<&str>,
    form: Option<&str>,
) -> Request<Body> {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, LOOPBACK);
    if let Some(c) = cookie {
        b = b.header(header::COOKIE, c);
    }
    if let Some(o) = origin {
        b = b.header(header::ORIGIN, o);
    }
    let body = match form {
        Some(f) => {
            b = b.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
            Body::from(f.to_string())
        }
        None => Body::empty(),
    };
    b.body(body).expect("request")
}

/// Every `set-cookie` of an answer.
fn set_cookies(r: &Reply) -> Vec<String> {
    r.headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().expect("text").to_string())
        .collect()
}

/// The `set-cookie` that sets `name` to a value (not its removal).
fn set_cookie<'a>(cookies: &'a [String], name: &str) -> Option<&'a String> {
    cookies
        .iter()
        .find(|c| c.starts_with(&format!("{name}=")) && !c.starts_with(&format!("{name}=;")))
}

fn html(r: &Reply) -> String {
    String::from_utf8(r.raw.to_vec()).expect("utf-8")
}

#[track_caller]
fn assert_to_login(r: &Reply) {
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", html(r));
    assert!(
        r.header(header::LOCATION).starts_with("/console/login"),
        "{:?}",
        r.headers
    );
}

#[track_caller]
fn assert_no_script(path: &str, r: &Reply) {
    let page = html(r).to_ascii_lowercase();
    assert!(
        r.header(header::CONTENT_TYPE).starts_with("text/html"),
        "{path}: {:?}",
        r.headers
    );
    assert!(!page.contains("<script"), "{path} has a script: {page}");
    assert!(!page.contains("javascript:"), "{path}: {page}");
}

impl ConsoleFx {
    async fn send(&self, r: Request<Body>) -> Reply {
        send(&self.router, r).await
    }

    fn valid(&self) -> String {
        session_cookie(&self.key, &admin_session(now() + 3600))
    }

    fn nothing_written(&self) {
        assert!(self.fx.log(Log::Killswitch).is_empty());
        assert!(self.fx.log(Log::Audit).is_empty());
    }

    async fn opus_killed(&self) -> bool {
        self.switch
            .state()
            .await
            .is_killed(Target::Experiment, OPUS)
    }

    /// An enrolled device's id.
    async fn enrolled(&self) -> String {
        let minted = self
            .devices
            .mint_enrollment("alice@acme.com", Some("dave@acme.com".into()), vec![])
            .await
            .expect("mint");
        self.devices
            .enroll(&minted.token, Some("laptop-1".into()))
            .await
            .expect("enroll")
            .device_id
    }

    async fn revoked(&self, id: &str) -> bool {
        self.devices
            .list()
            .await
            .iter()
            .find(|d| d.id == id)
            .expect("the device is listed")
            .revoked
    }

    /// Let the fake issuer's client log in as the console (the example's clientID is
    /// Okta's) and sign `claims` in at the browser.
    fn issuer_user(&self, claims: serde_json::Value) {
        let client_id = self.fx.issuer.client_id().to_string();
        self.fx.edit_policy(|org, _| {
            org.root.identity.as_mut().expect("identity").client_id = Some(client_id);
        });
        self.fx.issuer.set_user(claims);
    }
}

/// The fake issuer's answer to an authorization request: the 302's `code` and `state`.
async fn authorize(fx: &Fixture, url: &str) -> (String, String) {
    crate::auth::http_client(None).expect("crypto provider");
    let client = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(fx.issuer.ca_pem.as_bytes()).expect("ca"),
        )
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let resp = client.get(url).send().await.expect("authorize");
    assert_eq!(resp.status(), reqwest::StatusCode::FOUND, "{resp:?}");
    let location = resp.headers()[reqwest::header::LOCATION]
        .to_str()
        .expect("text")
        .to_string();
    let query = location.split_once('?').expect("a query").1;
    let q: std::collections::HashMap<String, String> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    (
        q.get("code").cloned().expect("a code"),
        q.get("state").cloned().expect("a state"),
    )
}

fn alice() -> serde_json::Value {
    json!({
        "sub": "u-alice", "email": "alice@acme.com", "email_verified": true,
        "groups": ["engineering", "halos-admins"],
    })
}

// ---------------------------------------------------------------------------
// No session, an expired one, a forged one
// ---------------------------------------------------------------------------

#[tokio::test]
async fn every_page_without_a_session_cookie_redirects_to_the_login() {
    let c = console_fx(None);
    for path in [
        "/console",
        "/console/audit",
        "/console/fleet",
        "/console/experiments/claude-opus-default",
        "/console/rollouts/sonnet-bedrock",
    ] {
        let r = c.send(req(Method::GET, path, None, None, None)).await;
        assert_to_login(&r);
        let expected = form_urlencoded::Serializer::new(String::new())
            .append_pair("next", path)
            .finish();
        assert_eq!(
            r.header(header::LOCATION),
            format!("/console/login?{expected}"),
            "{path}"
        );
    }
}

#[tokio::test]
async fn an_expired_or_forged_session_goes_back_to_the_login_not_a_500() {
    let c = console_fx(None);
    let expired = session_cookie(&c.key, &admin_session(now() - 1));
    let other_key = session_cookie(&Key::generate(), &admin_session(now() + 3600));
    let unsealed = format!(
        "{SESSION_COOKIE}={}",
        serde_json::to_string(&admin_session(now() + 3600)).expect("json")
    );
    let garbage = format!("{SESSION_COOKIE}=AAAA%%not-base64");
    for cookie in [&expired, &other_key, &unsealed, &garbage] {
        let r = c
            .send(req(Method::GET, "/console", Some(cookie), None, None))
            .await;
        assert_to_login(&r);
        // A state change with such a cookie does nothing either.
        let r = c
            .send(req(
                Method::POST,
                "/console/experiments/claude-opus-default/kill",
                Some(cookie),
                None,
                Some(&format!("csrf={CSRF}&reason=test")),
            ))
            .await;
        assert_to_login(&r);
    }
    c.nothing_written();
    assert!(!c.opus_killed().await);
    // The same session, sealed with the console's key and not expired, is let in.
    let r = c
        .send(req(Method::GET, "/console", Some(&c.valid()), None, None))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", html(&r));
}

#[tokio::test]
async fn a_session_whose_groups_the_policy_dropped_is_403_not_the_page() {
    let c = console_fx(None);
    let mut s = admin_session(now() + 3600);
    s.groups = vec!["engineering".to_string()];
    let r = c
        .send(req(
            Method::GET,
            "/console",
            Some(&session_cookie(&c.key, &s)),
            None,
            None,
        ))
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(html(&r).contains("alice@acme.com"), "{}", html(&r));
}

// ---------------------------------------------------------------------------
// The login's state and nonce
// ---------------------------------------------------------------------------

fn pending(redirect_uri: &str) -> Login {
    Login {
        state: "the-login-state-0123456789".to_string(),
        nonce: "the-login-nonce-0123456789".to_string(),
        verifier: "the-login-verifier-0123456789abcdefghijklmnop".to_string(),
        redirect_uri: redirect_uri.to_string(),
        next: "/console/fleet".to_string(),
        exp: now() + 600,
    }
}

fn login_cookie(key: &Key, l: &Login) -> String {
    seal(key, LOGIN_COOKIE, serde_json::to_string(l).expect("json"))
}

/// The fake issuer's authorization URL for `l` (what the login redirects to).
fn authorization_url(fx: &Fixture, l: &Login, nonce: &str) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("response_type", "code")
        .append_pair("client_id", fx.issuer.client_id())
        .append_pair("redirect_uri", &l.redirect_uri)
        .append_pair("scope", "openid email profile")
        .append_pair("state", &l.state)
        .append_pair("nonce", nonce)
        .append_pair("code_challenge", &session::challenge(&l.verifier))
        .append_pair("code_challenge_method", "S256")
        .finish();
    format!("{}/authorize?{query}", fx.issuer.issuer)
}

#[tokio::test]
async fn the_real_code_flow_on_loopback_signs_in_with_a_non_secure_session_cookie() {
    let c = console_fx(None);
    c.issuer_user(alice());
    let r = c
        .send(req(
            Method::GET,
            "/console/login?next=%2Fconsole%2Ffleet",
            None,
            None,
            None,
        ))
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", html(&r));
    let cookies = set_cookies(&r);
    let login = set_cookie(&cookies, LOGIN_COOKIE).expect("the login cookie");
    assert!(!login.contains("Secure"), "{login}");
    assert!(login.contains("HttpOnly"), "{login}");
    let login = login.split(';').next().expect("name=value").to_string();
    let location = r.header(header::LOCATION).to_string();
    assert!(
        location.contains("code_challenge_method=S256"),
        "{location}"
    );
    let (code, state) = authorize(&c.fx, &location).await;
    let r = c
        .send(req(
            Method::GET,
            &format!("/console/callback?code={code}&state={state}"),
            Some(&login),
            None,
            None,
        ))
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", html(&r));
    assert_eq!(r.header(header::LOCATION), "/console/fleet");
    let cookies = set_cookies(&r);
    let s = set_cookie(&cookies, SESSION_COOKIE).expect("a session cookie");
    assert!(!s.contains("Secure"), "plain HTTP on loopback: {s}");
    assert!(s.contains("HttpOnly") && s.contains("SameSite=Lax"), "{s}");
    let s = s.split(';').next().expect("name=value");
    let r = c
        .send(req(Method::GET, "/console/fleet", Some(s), None, None))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", html(&r));
}

#[tokio::test]
async fn a_callback_whose_state_is_not_the_logins_is_refused_and_sets_no_session() {
    let c = console_fx(None);
    c.issuer_user(alice());
    let l = pending(&format!("http://{LOOPBACK}/console/callback"));
    let (code, _) = authorize(&c.fx, &authorization_url(&c.fx, &l, &l.nonce)).await;
    let cookie = login_cookie(&c.key, &l);
    for state in ["another-login-state-9876543210", ""] {
        let r = c
            .send(req(
                Method::GET,
                &format!("/console/callback?code={code}&state={state}"),
                Some(&cookie),
                None,
                None,
            ))
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", html(&r));
        assert!(html(&r).contains("state mismatch"), "{}", html(&r));
        assert!(
            set_cookie(&set_cookies(&r), SESSION_COOKIE).is_none(),
            "{:?}",
            r.headers
        );
    }
    // Without the login cookie (another browser), or with one sealed by another key.
    for cookie in [None, Some(login_cookie(&Key::generate(), &l))] {
        let r = c
            .send(req(
                Method::GET,
                &format!("/console/callback?code={code}&state={}", l.state),
                cookie.as_deref(),
                None,
                None,
            ))
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", html(&r));
        assert!(set_cookie(&set_cookies(&r), SESSION_COOKIE).is_none());
    }
}

#[tokio::test]
async fn a_callback_whose_id_token_carries_another_nonce_is_refused_and_sets_no_session() {
    let c = console_fx(None);
    c.issuer_user(alice());
    let l = pending(&format!("http://{LOOPBACK}/console/callback"));
    let (code, state) = authorize(
        &c.fx,
        &authorization_url(&c.fx, &l, "a-nonce-of-another-login"),
    )
    .await;
    let r = c
        .send(req(
            Method::GET,
            &format!("/console/callback?code={code}&state={state}"),
            Some(&login_cookie(&c.key, &l)),
            None,
            None,
        ))
        .await;
    assert!(r.status.is_client_error(), "{}: {}", r.status, html(&r));
    assert!(html(&r).contains("nonce"), "{}", html(&r));
    assert!(set_cookie(&set_cookies(&r), SESSION_COOKIE).is_none());
}

// ---------------------------------------------------------------------------
// The Secure flag
// ---------------------------------------------------------------------------

#[tokio::test]
async fn with_an_https_console_url_both_cookies_are_secure() {
    let c = console_fx(Some("https://console.acme.com/"));
    c.issuer_user(alice());
    // The login cookie (any Host: the URL is configured).
    let r = c
        .send(req(Method::GET, "/console/login", None, None, None))
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", html(&r));
    assert!(
        r.header(header::LOCATION)
            .contains("redirect_uri=https%3A%2F%2Fconsole.acme.com%2Fconsole%2Fcallback"),
        "{:?}",
        r.headers
    );
    let cookies = set_cookies(&r);
    let login = set_cookie(&cookies, LOGIN_COOKIE).expect("the login cookie");
    assert!(login.contains("Secure"), "{login}");
    // The session cookie (the fake issuer redirects to loopback only: the login in
    // flight names a loopback redirect, the console's URL is still https).
    let l = pending(&format!("http://{LOOPBACK}/console/callback"));
    let (code, state) = authorize(&c.fx, &authorization_url(&c.fx, &l, &l.nonce)).await;
    let r = c
        .send(req(
            Method::GET,
            &format!("/console/callback?code={code}&state={state}"),
            Some(&login_cookie(&c.key, &l)),
            None,
            None,
        ))
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", html(&r));
    let cookies = set_cookies(&r);
    let s = set_cookie(&cookies, SESSION_COOKIE).expect("a session cookie");
    assert!(s.contains("Secure"), "{s}");
}

#[tokio::test]
async fn without_a_console_url_a_non_loopback_host_gets_no_login() {
    let c = console_fx(None);
    let r = c
        .send(
            Request::builder()
                .uri("/console/login")
                .header(header::HOST, "console.acme.com")
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", html(&r));
    assert!(html(&r).contains("--console-url"), "{}", html(&r));
    assert!(set_cookies(&r).is_empty(), "{:?}", r.headers);
}

// ---------------------------------------------------------------------------
// CSRF and Origin
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_kill_or_unkill_without_the_csrf_token_or_with_a_wrong_one_is_refused() {
    let c = console_fx(None);
    let cookie = c.valid();
    for path in [
        "/console/experiments/claude-opus-default/kill",
        "/console/experiments/claude-opus-default/unkill",
        "/console/toggles/deep-reasoning/kill",
        "/console/toggles/deep-reasoning/unkill",
    ] {
        for form in [
            "reason=test",
            "csrf=&reason=test",
            "csrf=not-the-sessions-token&reason=test",
        ] {
            let r = c
                .send(req(Method::POST, path, Some(&cookie), None, Some(form)))
                .await;
            assert_eq!(
                r.status,
                StatusCode::FORBIDDEN,
                "{path} {form}: {}",
                html(&r)
            );
            assert!(html(&r).contains("CSRF"), "{}", html(&r));
        }
    }
    c.nothing_written();
    assert!(!c.opus_killed().await);
}

#[tokio::test]
async fn a_revoke_without_the_csrf_token_or_with_a_wrong_one_is_refused() {
    let c = console_fx(None);
    let id = c.enrolled().await;
    let cookie = c.valid();
    for form in ["", "csrf=", "csrf=not-the-sessions-token"] {
        let r = c
            .send(req(
                Method::POST,
                &format!("/console/devices/{id}/revoke"),
                Some(&cookie),
                None,
                Some(form),
            ))
            .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{form}: {}", html(&r));
    }
    assert!(!c.revoked(&id).await);
    assert!(c.fx.log(Log::Audit).is_empty());
}

#[tokio::test]
async fn a_post_from_a_foreign_origin_is_refused_even_with_the_right_csrf_token() {
    let c = console_fx(None);
    let id = c.enrolled().await;
    let cookie = c.valid();
    for origin in ["https://evil.example", "http://127.0.0.1:9999", "null"] {
        let r = c
            .send(req(
                Method::POST,
                "/console/experiments/claude-opus-default/kill",
                Some(&cookie),
                Some(origin),
                Some(&format!("csrf={CSRF}&reason=test")),
            ))
            .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{origin}: {}", html(&r));
        assert!(html(&r).contains("another site"), "{}", html(&r));
        let r = c
            .send(req(
                Method::POST,
                &format!("/console/devices/{id}/revoke"),
                Some(&cookie),
                Some(origin),
                Some(&format!("csrf={CSRF}")),
            ))
            .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{origin}: {}", html(&r));
    }
    c.nothing_written();
    assert!(!c.opus_killed().await);
    assert!(!c.revoked(&id).await);
    // The console's own Origin with the token is done (post/redirect/get).
    let r = c
        .send(req(
            Method::POST,
            "/console/experiments/claude-opus-default/kill",
            Some(&cookie),
            Some(&format!("http://{LOOPBACK}")),
            Some(&format!("csrf={CSRF}&reason=test")),
        ))
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", html(&r));
    assert_eq!(
        r.header(header::LOCATION),
        "/console/experiments/claude-opus-default#kill"
    );
    assert!(c.opus_killed().await);
    assert_eq!(c.fx.log(Log::Killswitch).len(), 1);
}

// ---------------------------------------------------------------------------
// Device revoke
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_device_revoke_route_revokes_the_device_and_audits_it() {
    let c = console_fx(None);
    let id = c.enrolled().await;
    let other = c.enrolled().await;
    let r = c
        .send(req(
            Method::POST,
            &format!("/console/devices/{id}/revoke"),
            Some(&c.valid()),
            None,
            Some(&format!("csrf={CSRF}")),
        ))
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", html(&r));
    assert_eq!(r.header(header::LOCATION), "/console/fleet");
    assert!(c.revoked(&id).await);
    assert!(!c.revoked(&other).await, "only that device");
    let audit = c.fx.log(Log::Audit);
    let entry = audit
        .iter()
        .find(|a| a["action"] == "revoke-device")
        .expect("the revoke is audited");
    assert_eq!(entry["device"], id.as_str());
    assert_eq!(entry["actor"], "alice@acme.com");
    // The fleet page shows it revoked, the audit page shows the entry.
    let r = c
        .send(req(
            Method::GET,
            "/console/fleet",
            Some(&c.valid()),
            None,
            None,
        ))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(html(&r).contains("revoked"), "{}", html(&r));
    let r = c
        .send(req(
            Method::GET,
            "/console/audit?action=revoke-device",
            Some(&c.valid()),
            None,
            None,
        ))
        .await;
    assert!(html(&r).contains(&id), "{}", html(&r));
    // An unknown device is a page saying so, not a 500.
    let r = c
        .send(req(
            Method::POST,
            "/console/devices/dev-unknown/revoke",
            Some(&c.valid()),
            None,
            Some(&format!("csrf={CSRF}")),
        ))
        .await;
    assert!(r.status.is_client_error(), "{}: {}", r.status, html(&r));
}

// ---------------------------------------------------------------------------
// Readable without JavaScript
// ---------------------------------------------------------------------------

#[tokio::test]
async fn every_page_is_html_without_a_script() {
    let c = console_fx(None);
    c.enrolled().await;
    let cookie = c.valid();
    // Something in the audit log and the kill state, so their tables have rows.
    let r = c
        .send(req(
            Method::POST,
            "/console/experiments/claude-opus-default/kill",
            Some(&cookie),
            None,
            Some(&format!("csrf={CSRF}&reason=test")),
        ))
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", html(&r));
    let org = c.fx.policy.now().org.clone();
    let mut paths: Vec<String> = vec![
        "/console".into(),
        "/console/audit".into(),
        "/console/fleet".into(),
    ];
    paths.extend(
        org.experiments
            .keys()
            .map(|e| format!("/console/experiments/{e}")),
    );
    paths.extend(
        org.rollouts
            .keys()
            .map(|r| format!("/console/rollouts/{r}")),
    );
    for path in &paths {
        let r = c
            .send(req(Method::GET, path, Some(&cookie), None, None))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", html(&r));
        assert_no_script(path, &r);
        // Every action is a plain form post.
        let page = html(&r);
        assert_eq!(
            page.matches("<form").count(),
            page.matches("method=\"post\"").count() + page.matches("method=\"get\"").count(),
            "{path}: {page}"
        );
    }
    // The pages without a session, and the refusals.
    let r = c
        .send(req(Method::GET, "/console/logged-out", None, None, None))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_no_script("/console/logged-out", &r);
    let r = c
        .send(req(
            Method::POST,
            "/console/toggles/deep-reasoning/kill",
            Some(&cookie),
            None,
            Some("reason=x"),
        ))
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_no_script("the CSRF refusal", &r);
    let r = c
        .send(req(
            Method::GET,
            "/console/callback?state=x&code=y",
            None,
            None,
            None,
        ))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_no_script("the failed sign-in", &r);
    let r = c
        .send(req(
            Method::GET,
            "/console/experiments/nope",
            Some(&cookie),
            None,
            None,
        ))
        .await;
    assert_no_script("an unknown experiment", &r);
}
