//! The admin console: server-rendered pages under `/console` on the API listener, for the
//! admins the API serves (the policy's identity, its adminGroups).
//!
//! Login is the OIDC authorization code flow with PKCE (RFC 7636) against the served
//! policy's issuer, as a public client (identity.clientID): `state` ties the callback to
//! the login cookie, `nonce` ties the ID token to it, and the ID token is verified as the
//! API verifies admin tokens (the issuer's JWKS, `iss`, `aud` = clientID, `exp`), then
//! the admin group rule. The session is a sealed cookie ([`session`]). Every state change
//! is a POST carrying the session's CSRF token (and, when the browser sends one, an
//! `Origin` equal to the console's); kill and unkill call the kill feature's own
//! [`Kill::change`], and a revocation the fleet's [`FleetApi::revoke`], so the rules and
//! the audit are the API's. The console is a view over those features and the
//! controller's: it owns no state but its cookie key.
//!
//! The console's URL: `--console-url`, else the request's Host when it is a loopback
//! address (plain HTTP is accepted only there). Answers are HTML, never the API's JSON:
//! an expired or forged cookie goes back to the login, a non-admin gets 403 saying who
//! they are and which groups the console needs.

pub mod pages;
pub mod session;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRef, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum_extra::extract::cookie::{Key, PrivateCookieJar};
use futures_util::future::BoxFuture;
use maud::{Markup, html};
use serde::Serialize;
use serde_json::Value;

use crate::auth::{Admin, AuthError};
use crate::controller::ControllerApi;
use crate::fleet::FleetApi;
use crate::http::{AdminAuth, ApiError};
use crate::kill::{self, Kill};
use crate::xds::XdsHost;
use halo_killswitch::{Action, Target};
use halo_store::Log;
use halo_store::LogStore;
use pages::{Viewer, killed_cell, page, problem};
use session::{LOGIN_COOKIE, LOGIN_LIFETIME, Login, SESSION_COOKIE, SESSION_LIFETIME, Session};

/// Most audit records a page shows (newest first).
const AUDIT_PAGE: usize = 500;

/// What the console's handlers share.
#[derive(Clone)]
pub struct Console {
    admin: Arc<AdminAuth>,
    kill: Option<Arc<Kill>>,
    fleet: Arc<FleetApi>,
    controller: Arc<ControllerApi>,
    /// The log store: its audit log and its description.
    store: Arc<dyn LogStore>,
    key: Key,
    /// `--console-url`, without a trailing slash.
    url: Option<String>,
    xds: Option<Arc<XdsHost>>,
}

impl FromRef<Console> for Key {
    fn from_ref(c: &Console) -> Key {
        c.key.clone()
    }
}

/// What the console shows and acts on: the features it is a view of.
pub struct ConsoleParts {
    pub admin: Arc<AdminAuth>,
    pub kill: Option<Arc<Kill>>,
    pub fleet: Arc<FleetApi>,
    pub controller: Arc<ControllerApi>,
    pub store: Arc<dyn LogStore>,
    pub xds: Option<Arc<XdsHost>>,
}

impl Console {
    fn policy(&self) -> Arc<halo_xds::Served> {
        self.admin.policy().now()
    }

    fn killswitch(&self) -> Option<&Arc<halo_killswitch::KillSwitch>> {
        self.kill.as_ref().map(|k| k.switch())
    }

    fn controller(&self) -> Option<&Arc<halo_controller::controller::Controller>> {
        self.controller.controller.as_ref()
    }
}

/// The console's routes, with their state.
pub fn router(parts: ConsoleParts, key: Key, url: Option<String>) -> Router {
    let ConsoleParts {
        admin,
        kill,
        fleet: fleet_api,
        controller,
        store,
        xds,
    } = parts;
    let console = Console {
        admin,
        kill,
        fleet: fleet_api,
        controller,
        store,
        key,
        url: url.map(|u| u.trim_end_matches('/').to_string()),
        xds,
    };
    Router::new()
        .route("/console", get(overview))
        .route("/console/login", get(login))
        .route("/console/callback", get(callback))
        .route("/console/logout", post(logout))
        .route("/console/logged-out", get(logged_out))
        .route("/console/experiments/{name}", get(experiment))
        .route("/console/rollouts/{name}", get(rollout))
        .route(
            "/console/experiments/{name}/kill",
            post(change(Action::Kill, Target::Experiment)),
        )
        .route(
            "/console/experiments/{name}/unkill",
            post(change(Action::Unkill, Target::Experiment)),
        )
        .route(
            "/console/toggles/{name}/kill",
            post(change(Action::Kill, Target::Toggle)),
        )
        .route(
            "/console/toggles/{name}/unkill",
            post(change(Action::Unkill, Target::Toggle)),
        )
        .route("/console/audit", get(audit))
        .route("/console/fleet", get(fleet))
        .route("/console/devices/{id}/revoke", post(revoke))
        .with_state(console)
}

/// A refusal: the page to answer instead (boxed: a response is large, refusals rare).
pub struct Refusal(Box<Response>);

impl From<Response> for Refusal {
    fn from(r: Response) -> Refusal {
        Refusal(Box::new(r))
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        *self.0
    }
}

/// An HTML answer with a status.
fn html_answer(status: StatusCode, markup: Markup) -> Response {
    let mut resp = (status, markup).into_response();
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    resp
}

fn problem_answer(status: StatusCode, title: &str, message: &str) -> Response {
    html_answer(
        status,
        problem(title, message, Some(("/console", "Back to the console"))),
    )
}

/// A refusal of the shared core, as a page.
fn api_problem(e: &ApiError) -> Response {
    let title = match e.status() {
        StatusCode::UNPROCESSABLE_ENTITY => "Not done: the form needs a change",
        StatusCode::NOT_FOUND => "Not found",
        _ => "Not done",
    };
    problem_answer(
        e.status(),
        title,
        &format!("{} ({})", e.message(), e.code()),
    )
}

/// A word of a serde enum (`ab`, `traffic`, `running`).
fn word<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

// ---------------------------------------------------------------------------
// Who is asking
// ---------------------------------------------------------------------------

/// The console's own URL for this request, and whether its cookies must be Secure.
fn base(console: &Console, headers: &HeaderMap) -> Result<(String, bool), Refusal> {
    if let Some(url) = &console.url {
        return Ok((url.clone(), url.starts_with("https://")));
    }
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let name = host.rsplit_once(':').map_or(host, |(name, port)| {
        if port.chars().all(|c| c.is_ascii_digit()) {
            name
        } else {
            host
        }
    });
    if matches!(name, "127.0.0.1" | "localhost" | "[::1]") {
        return Ok((format!("http://{host}"), false));
    }
    Err(Refusal::from(problem_answer(
        StatusCode::SERVICE_UNAVAILABLE,
        "The console needs its URL",
        "Start halo-server with --console-url https://<the address admins open>: the login's redirect and the cookies' Secure flag follow from it (plain HTTP is used only on loopback).",
    )))
}

/// The session in the cookie, re-checked against the policy served now; else the answer
/// to give (a redirect to the login, or 403).
async fn viewer(console: &Console, jar: &PrivateCookieJar, uri: &Uri) -> Result<Session, Refusal> {
    let session: Option<Session> = session::decode(
        jar.get(SESSION_COOKIE).as_ref().map(|c| c.value()),
        |s: &Session| s.exp,
    );
    let Some(session) = session else {
        let next = uri.path_and_query().map_or("/console", |p| p.as_str());
        let q = form_urlencoded::Serializer::new(String::new())
            .append_pair("next", next)
            .finish();
        return Err(Redirect::to(&format!("/console/login?{q}"))
            .into_response()
            .into());
    };
    let policy = console.policy();
    let identity = policy.org.root.identity.as_ref();
    let Some(identity) = identity else {
        return Err(problem_answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "No identity",
            "The served policy has no identity (halos.yaml identity): nobody can be an admin.",
        )
        .into());
    };
    // A policy edit that drops the admin's group ends their access at once.
    if !session
        .groups
        .iter()
        .any(|g| identity.admin_groups.iter().any(|a| a == g))
    {
        return Err(forbidden(&session.user, &identity.admin_groups).into());
    }
    Ok(session)
}

/// A handler that takes a [`Session`] runs only for a signed-in admin; anyone else gets
/// the sign-in redirect or the 403 page.
impl FromRequestParts<Console> for Session {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, console: &Console) -> Result<Session, Refusal> {
        let jar = match PrivateCookieJar::<Key>::from_request_parts(parts, console).await {
            Ok(jar) => jar,
            Err(never) => match never {},
        };
        viewer(console, &jar, &parts.uri).await
    }
}

fn forbidden(user: &str, groups: &[String]) -> Response {
    html_answer(
        StatusCode::FORBIDDEN,
        problem(
            "Not an admin",
            &format!(
                "You are signed in as {user}, who is in none of the groups the console needs: {}. Ask an owner of the policy repo to add you to one (halos.yaml identity.adminGroups).",
                groups.join(", ")
            ),
            Some(("/console/login", "Sign in as someone else")),
        ),
    )
}

/// Parse a urlencoded form strictly: only `allowed` keys, each at most once.
fn form(body: &Bytes, allowed: &[&str]) -> Result<HashMap<String, String>, Refusal> {
    let mut out = HashMap::new();
    for (k, v) in form_urlencoded::parse(body) {
        if !allowed.contains(&k.as_ref()) || out.contains_key(k.as_ref()) {
            return Err(problem_answer(
                StatusCode::BAD_REQUEST,
                "Bad form",
                &format!("the form field {k:?} is unknown or repeated"),
            )
            .into());
        }
        out.insert(k.into_owned(), v.into_owned());
    }
    Ok(out)
}

/// The CSRF rule for a state change: the form's token is the session's, and an `Origin`
/// the browser sent is the console's own.
fn check_csrf(
    console: &Console,
    headers: &HeaderMap,
    session: &Session,
    fields: &HashMap<String, String>,
) -> Result<(), Refusal> {
    let refused = |why: &str| -> Refusal {
        problem_answer(
            StatusCode::FORBIDDEN,
            "Refused: not sent by this console",
            &format!("{why}; reload the page and submit the form again"),
        )
        .into()
    };
    let sent = fields.get("csrf").map(String::as_str).unwrap_or("");
    if !session::same_secret(sent, &session.csrf) {
        return Err(refused(
            "the form's CSRF token is missing or not this session's",
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let (url, _) = base(console, headers)?;
        if origin != url {
            return Err(refused("the request came from another site"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Login and logout
// ---------------------------------------------------------------------------

/// A `next` that stays inside the console.
fn safe_next(next: Option<&String>) -> String {
    match next {
        Some(n)
            if n.starts_with("/console")
                && !n.contains("//")
                && !n.contains('\\')
                && !n.starts_with("/console/log") =>
        {
            n.clone()
        }
        _ => "/console".to_string(),
    }
}

async fn login(
    State(console): State<Console>,
    headers: HeaderMap,
    jar: PrivateCookieJar,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (url, secure) = match base(&console, &headers) {
        Ok(b) => b,
        Err(r) => return r.into_response(),
    };
    let policy = console.policy();
    let identity = policy.org.root.identity.as_ref();
    let client_id = match identity.and_then(|i| i.client_id.clone()) {
        Some(c) => c,
        None => {
            return problem_answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "No login",
                "The served policy's identity has no clientID: the console logs in as that OAuth client.",
            );
        }
    };
    let endpoints = match console.admin.oidc().endpoints(identity).await {
        Ok(e) => e,
        Err(e) => return auth_problem(&e),
    };
    let (Ok(state), Ok(nonce), Ok(verifier)) = (
        session::random(24),
        session::random(24),
        session::random(32),
    ) else {
        return problem_answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            "No randomness",
            "the system's random source failed",
        );
    };
    let redirect_uri = format!("{url}/console/callback");
    let pending = Login {
        state: state.clone(),
        nonce: nonce.clone(),
        verifier: verifier.clone(),
        redirect_uri: redirect_uri.clone(),
        next: safe_next(q.get("next")),
        exp: session::now_unix() + LOGIN_LIFETIME.whole_seconds(),
    };
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("response_type", "code")
        .append_pair("client_id", &client_id)
        .append_pair("redirect_uri", &redirect_uri)
        .append_pair("scope", "openid email profile")
        .append_pair("state", &state)
        .append_pair("nonce", &nonce)
        .append_pair("code_challenge", &session::challenge(&verifier))
        .append_pair("code_challenge_method", "S256")
        .finish();
    let sep = if endpoints.authorization.contains('?') {
        '&'
    } else {
        '?'
    };
    let value = serde_json::to_string(&pending).unwrap_or_default();
    let jar = jar.add(session::cookie(LOGIN_COOKIE, value, LOGIN_LIFETIME, secure));
    (
        jar,
        Redirect::to(&format!("{}{sep}{query}", endpoints.authorization)),
    )
        .into_response()
}

fn auth_problem(e: &AuthError) -> Response {
    match e {
        AuthError::Unauthenticated(m) => {
            problem_answer(StatusCode::UNAUTHORIZED, "Not signed in", m)
        }
        AuthError::Forbidden(m) => problem_answer(StatusCode::FORBIDDEN, "Not an admin", m),
        AuthError::Unavailable(m) => problem_answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "The identity provider is unavailable",
            m,
        ),
    }
}

async fn callback(
    State(console): State<Console>,
    headers: HeaderMap,
    jar: PrivateCookieJar,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (_, secure) = match base(&console, &headers) {
        Ok(b) => b,
        Err(r) => return r.into_response(),
    };
    let again = |message: &str| {
        html_answer(
            StatusCode::BAD_REQUEST,
            problem(
                "Sign-in failed",
                message,
                Some(("/console/login", "Sign in again")),
            ),
        )
    };
    let pending: Option<Login> = session::decode(
        jar.get(LOGIN_COOKIE).as_ref().map(|c| c.value()),
        |l: &Login| l.exp,
    );
    let Some(pending) = pending else {
        return again("this sign-in has expired or was started in another browser");
    };
    let jar = jar.remove(session::removal(LOGIN_COOKIE));
    if !session::same_secret(q.get("state").map_or("", String::as_str), &pending.state) {
        return (
            jar,
            again("the answer does not belong to this sign-in (state mismatch)"),
        )
            .into_response();
    }
    if let Some(error) = q.get("error") {
        return (jar, again(&format!("the identity provider said: {error}"))).into_response();
    }
    let Some(code) = q.get("code") else {
        return (jar, again("the identity provider sent no code")).into_response();
    };
    let policy = console.policy();
    let identity = policy.org.root.identity.as_ref();
    let oidc = console.admin.oidc();
    let admin: Result<Admin, AuthError> = async {
        let endpoints = oidc.endpoints(identity).await?;
        let id_token = oidc
            .redeem_code(
                identity,
                &endpoints.token,
                code,
                &pending.verifier,
                &pending.redirect_uri,
            )
            .await?;
        oidc.verify_id_token(identity, &id_token, &pending.nonce)
            .await
    }
    .await;
    let admin = match admin {
        Ok(a) => a,
        Err(e) => return (jar, auth_problem(&e)).into_response(),
    };
    let Ok(csrf) = session::random(32) else {
        return problem_answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            "No randomness",
            "the system's random source failed",
        );
    };
    let s = Session {
        user: admin.user,
        groups: admin.groups,
        exp: session::now_unix() + SESSION_LIFETIME.whole_seconds(),
        csrf,
    };
    let value = serde_json::to_string(&s).unwrap_or_default();
    let jar = jar.add(session::cookie(
        SESSION_COOKIE,
        value,
        SESSION_LIFETIME,
        secure,
    ));
    (jar, Redirect::to(&pending.next)).into_response()
}

async fn logout(
    State(console): State<Console>,
    headers: HeaderMap,
    jar: PrivateCookieJar,
    uri: Uri,
    body: Bytes,
) -> Response {
    let session = match viewer(&console, &jar, &uri).await {
        Ok(s) => s,
        // Not signed in (or no longer an admin): logging out is still fine.
        Err(_) => {
            return (
                jar.remove(session::removal(SESSION_COOKIE)),
                Redirect::to("/console/logged-out"),
            )
                .into_response();
        }
    };
    let fields = match form(&body, &["csrf"]) {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_csrf(&console, &headers, &session, &fields) {
        return r.into_response();
    }
    (
        jar.remove(session::removal(SESSION_COOKIE)),
        Redirect::to("/console/logged-out"),
    )
        .into_response()
}

async fn logged_out() -> Response {
    html_answer(
        StatusCode::OK,
        page(
            "Signed out",
            None,
            html! {
                p.notice { "You are signed out of the console. Your identity provider's own session is unchanged." }
                p { a href="/console/login" { "Sign in again" } }
            },
        ),
    )
}

// ---------------------------------------------------------------------------
// Pages
// ---------------------------------------------------------------------------

async fn overview(State(console): State<Console>, s: Session) -> Response {
    let policy = console.policy();
    let org = &policy.org;
    let kills = match console.killswitch() {
        Some(ks) => Some(ks.state().await),
        None => None,
    };
    let is_killed =
        |target: Target, name: &str| kills.as_ref().is_some_and(|k| k.is_killed(target, name));
    let has_switch = kills.is_some();
    let mut rings: Vec<_> = org.rings.values().collect();
    rings.sort_by_key(|r| r.order);
    let nodes = console.xds.as_ref().map(|x| x.cache.status());
    let rollout_states: HashMap<String, String> = console
        .controller()
        .map(|c| {
            c.status()
                .rollouts
                .into_iter()
                .map(|(name, r)| (name, r.state))
                .collect()
        })
        .unwrap_or_default();
    let body = html! {
        p { "Policy " code { (org.root.org) } ", version " code { (policy.version) } "." }
        section aria-labelledby="caps" {
            h2 #caps { "Capabilities" }
            ul {
                li { "Kill switch: " @if console.killswitch().is_some() { span.ok { "on" } } @else { span.killed { "off (start halo-server with --killswitch-key-file)" } } }
                li { "Storage: " (console.store.describe()) }
                li { "xDS: " @if console.xds.is_some() { "serving" } @else { "off" } }
            }
        }
        section aria-labelledby="rings" {
            h2 #rings { "Rings" }
            table {
                thead { tr { th scope="col" { "Ring" } th scope="col" { "Order" } th scope="col" { "Profile" } th scope="col" { "Release" } } }
                tbody {
                    @for r in &rings {
                        tr { td { (r.name) } td { (r.order) } td { (r.profile) } td { code { (r.release.as_deref().unwrap_or("latest")) } } }
                    }
                }
            }
        }
        section aria-labelledby="experiments" {
            h2 #experiments { "Experiments" }
            table {
                thead { tr { th scope="col" { "Experiment" } th scope="col" { "Type" } th scope="col" { "Axis" } th scope="col" { "Status" } th scope="col" { "Rings" } th scope="col" { "Kill switch" } } }
                tbody {
                    @for e in org.experiments.values() {
                        tr {
                            td { a href={ "/console/experiments/" (e.name) } { (e.name) } }
                            td { (word(&e.experiment_type)) }
                            td { (word(&e.axis)) }
                            td { (word(&e.status)) }
                            td { (halo_policy::compile::enrollment(org, e).0.join(", ")) }
                            td { (killed_cell(is_killed(Target::Experiment, &e.name))) }
                        }
                    }
                }
            }
        }
        section aria-labelledby="rollouts" {
            h2 #rollouts { "Rollouts" }
            table {
                thead { tr { th scope="col" { "Rollout" } th scope="col" { "Axis" } th scope="col" { "Status" } th scope="col" { "Step" } th scope="col" { "Experiment" } th scope="col" { "Last tick" } } }
                tbody {
                    @for r in org.rollouts.values() {
                        tr {
                            td { a href={ "/console/rollouts/" (r.name) } { (r.name) } }
                            td { (word(&r.axis)) }
                            td { (word(&r.status)) }
                            td { (r.step) " of " (r.steps.len()) }
                            td { a href={ "/console/experiments/" (r.experiment) } { (r.experiment) } }
                            td { (rollout_states.get(&r.name).map_or("-", String::as_str)) }
                        }
                    }
                }
            }
        }
        section aria-labelledby="toggles" {
            h2 #toggles { "Toggles" }
            table {
                thead { tr { th scope="col" { "Toggle" } th scope="col" { "Kill switch" } @if has_switch { th scope="col" { "Change" } } } }
                tbody {
                    @for t in org.toggles.keys() {
                        @let killed = is_killed(Target::Toggle, t);
                        tr {
                            td { (t) }
                            td { (killed_cell(killed)) }
                            @if has_switch {
                                td {
                                    @let (verb, path) = if killed { ("Unkill", "unkill") } else { ("Kill", "kill") };
                                    form method="post" action={ "/console/toggles/" (t) "/" (path) } {
                                        input type="hidden" name="csrf" value=(s.csrf);
                                        label for={ "toggle-reason-" (t) } { "Why " (path) " " (t) }
                                        input #{ "toggle-reason-" (t) } type="text" name="reason" required;
                                        button type="submit" { (verb) " " (t) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if let Some(nodes) = nodes {
            section aria-labelledby="envoys" {
                h2 #envoys { "Envoys (xDS)" }
                table {
                    thead { tr { th scope="col" { "Node" } th scope="col" { "Streams" } th scope="col" { "ACKed clusters version" } th scope="col" { "Last NACK" } } }
                    tbody {
                        @for n in &nodes {
                            @let cds = n.types.get("cds");
                            tr {
                                td { code { (n.node) } }
                                td { (n.connected_streams) }
                                td { code { (cds.and_then(|t| t.acked_version.as_deref()).unwrap_or("-")) } }
                                td { (if n.types.values().any(|t| t.last_nack.is_some()) { "yes" } else { "none" }) }
                            }
                        }
                    }
                }
            }
        }
    };
    html_answer(
        StatusCode::OK,
        page(
            "Overview",
            Some(&Viewer {
                user: &s.user,
                csrf: &s.csrf,
            }),
            body,
        ),
    )
}

/// The audit records about `name` (newest first, at most `limit`).
fn audit_records(
    console: &Console,
    filter: impl Fn(&Value) -> bool,
    limit: usize,
) -> Result<Vec<Value>, String> {
    let all = console
        .store
        .read_all(Log::Audit)
        .map_err(|e| e.to_string())?;
    Ok(all
        .into_iter()
        .rev()
        .filter(|r| filter(r))
        .take(limit)
        .collect())
}

fn audit_table(records: &[Value]) -> Markup {
    let field = |r: &Value, k: &str| match r.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    };
    html! {
        table {
            thead { tr { th scope="col" { "When" } th scope="col" { "Who" } th scope="col" { "Action" } th scope="col" { "What" } th scope="col" { "Reason" } } }
            tbody {
                @for r in records {
                    tr {
                        td { (field(r, "at")) }
                        td { (field(r, "actor")) }
                        td { (field(r, "action")) }
                        td { (field(r, "target")) " " (field(r, "name")) (field(r, "device")) }
                        td { (field(r, "reason")) }
                    }
                }
            }
        }
    }
}

async fn experiment(
    State(console): State<Console>,
    s: Session,
    Path(name): Path<String>,
) -> Response {
    let policy = console.policy();
    let Some(e) = policy.org.experiments.get(&name) else {
        return problem_answer(
            StatusCode::NOT_FOUND,
            "Not found",
            &format!("the served policy has no experiment named {name:?}"),
        );
    };
    let kill = match console.killswitch() {
        Some(ks) => ks.state().await.experiments.get(&name).cloned(),
        None => None,
    };
    let records = match audit_records(
        &console,
        |r| r.get("name").and_then(Value::as_str) == Some(name.as_str()),
        20,
    ) {
        Ok(r) => r,
        Err(e) => {
            return problem_answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Audit log unreadable",
                &e,
            );
        }
    };
    // What is served: a rollout driving the experiment sets its rings and split.
    let (rings, weights) = halo_policy::compile::enrollment(&policy.org, e);
    let driver = policy
        .org
        .rollouts
        .values()
        .find(|r| r.experiment == name && halo_policy::compile::rollout_cohort(r).is_some());
    let total: u32 = weights.iter().sum();
    let report = console
        .controller()
        .and_then(|c| c.status().experiments.get(&name).cloned());
    let history = console
        .controller()
        .map(|c| c.history(&name))
        .unwrap_or_default();
    let viewer = Viewer {
        user: &s.user,
        csrf: &s.csrf,
    };
    let body = html! {
        p {
            (word(&e.experiment_type)) " experiment on the " (word(&e.axis)) " axis, " strong { (word(&e.status)) } ", in rings " (rings.join(", ")) "."
            @if let Some(r) = driver {
                " Rings and weights as rollout " a href={ "/console/rollouts/" (r.name) } { (r.name) } " sets them at step " (r.step) " (the document says rings " (e.rings.join(", ")) ")."
            }
        }
        section aria-labelledby="variants" {
            h2 #variants { "Variants" }
            table {
                thead { tr { th scope="col" { "Variant" } th scope="col" { "Weight" } th scope="col" { "Share" } th scope="col" { "Changes" } } }
                tbody {
                    @for (v, weight) in e.variants.iter().zip(weights.iter().copied()) {
                        tr {
                            td { (v.name) }
                            td { (weight) }
                            td { (format!("{:.0}%", if total > 0 { f64::from(weight) * 100.0 / f64::from(total) } else { 0.0 })) }
                            td {
                                @for (alias, route) in &v.routes {
                                    (alias) " → " (route.normalized_targets().iter().map(|t| format!("{}/{}", t.upstream, t.model)).collect::<Vec<_>>().join(", ")) br;
                                }
                                @if let Some(p) = &v.profile { "profile " (p) }
                            }
                        }
                    }
                }
            }
        }
        section aria-labelledby="controller" {
            h2 #controller { "Controller" }
            @match (console.controller(), &report) {
                (None, _) => p.notice { "This halo-server runs no controller (--controller)." },
                (Some(_), None) => p { "Not evaluated yet (the controller evaluates running experiments at each tick)." },
                (Some(_), Some(rep)) => {
                    @if rep.state == "rollout" {
                        p { "Driven by its rollout: " @for r in policy.org.rollouts.values().filter(|r| r.experiment == name) { a href={ "/console/rollouts/" (r.name) } { (r.name) } " " } }
                    } @else {
                        p {
                            "Run " (rep.run) ", " strong { (rep.state) }
                            @if let Some(v) = rep.verdict.as_ref().or(rep.action.as_ref().map(|a| &a.verdict)) { ": " strong { (v.decision.as_str()) } ", " (v.reason) }
                            @if let Some(e) = &rep.error { ": " (e) }
                            "."
                        }
                        @if !rep.units.is_empty() || rep.spend_usd.is_some() {
                            p {
                                "Enrolled this run: " (rep.units.values().sum::<u64>()) " units ("
                                (rep.units.iter().map(|(v, n)| format!("{v} {n}")).collect::<Vec<_>>().join(", "))
                                "); spend " (rep.spend_usd.map_or("-".to_string(), |s| format!("{s:.2} USD"))) "."
                            }
                        }
                        @if let Some(a) = &rep.action {
                            p { "Action: " (a.decision.as_str()) "; kill " (a.kill_outcome.map_or("-", |k| k.as_str())) "; pull request " (pages::pr_link(a.pull_request.as_deref())) "; notified " (if a.notified { "yes" } else { "not yet" }) "." }
                        }
                        @if let Some(v) = rep.verdict.as_ref().or(rep.action.as_ref().map(|a| &a.verdict)) {
                            @if !v.table.is_empty() { (pages::evidence_table(&v.table)) }
                        }
                        @if !history.is_empty() {
                            h3 { "Over this run" }
                            p { "Each treatment arm's always-valid interval of treatment - control at every tick (" (history.len()) " so far): the band leaving zero is where the controller can decide." }
                            (pages::interval_charts(&history))
                        }
                    }
                }
            }
        }
        section aria-labelledby="kill" {
            h2 #kill { "Kill switch" }
            @if console.killswitch().is_none() {
                p.notice { "The kill switch is off on this server (--killswitch-key-file)." }
            } @else if let Some(k) = &kill {
                p.killed role="status" { "Killed: every user of this experiment is on control. Killed by " (k.by) " at " (k.killed_at) ": " (k.reason) }
                form method="post" action={ "/console/experiments/" (name) "/unkill" } {
                    input type="hidden" name="csrf" value=(viewer.csrf);
                    label for="unkill-reason" { "Why unkill (goes into the kill log and the audit log)" }
                    textarea #unkill-reason name="reason" required rows="2" {}
                    button type="submit" { "Unkill " (name) }
                }
            } @else {
                p.ok role="status" { "Live." }
                form method="post" action={ "/console/experiments/" (name) "/kill" } {
                    input type="hidden" name="csrf" value=(viewer.csrf);
                    label for="kill-reason" { "Why kill (goes into the kill log and the audit log)" }
                    textarea #kill-reason name="reason" required rows="2" {}
                    button type="submit" { "Kill " (name) }
                }
            }
        }
        section aria-labelledby="audit" {
            h2 #audit { "Audit log for this experiment" }
            @if records.is_empty() { p { "No entries." } } @else { (audit_table(&records)) }
        }
    };
    html_answer(
        StatusCode::OK,
        page(&format!("Experiment {name}"), Some(&viewer), body),
    )
}

/// A rollout: its steps with their gates and bounds, the current step, the controller's
/// last evaluation (each gate's value against its bound, the bake left), the move decided
/// at this step with its actions, and whether its state file's hash chain verifies: the
/// same facts as `GET /api/v1/rollouts/{name}` (`ControllerApi::rollout_view`).
async fn rollout(State(console): State<Console>, s: Session, Path(name): Path<String>) -> Response {
    let policy = console.policy();
    let Some(r) = policy.org.rollouts.get(&name) else {
        return problem_answer(
            StatusCode::NOT_FOUND,
            "Not found",
            &format!("the served policy has no rollout named {name:?}"),
        );
    };
    let view = console.controller.rollout_view(&name);
    let report = view.report.as_ref();
    let evaluation = report.and_then(|rep| {
        rep.evaluation
            .as_ref()
            .or(rep.action.as_ref().map(|a| &a.evaluation))
    });
    let bound = |min: Option<f64>, max: Option<f64>| match (min, max) {
        (Some(min), Some(max)) => format!("between {min} and {max}"),
        (Some(min), None) => format!("at least {min}"),
        (None, Some(max)) => format!("at most {max}"),
        (None, None) => "-".to_string(),
    };
    let viewer = Viewer {
        user: &s.user,
        csrf: &s.csrf,
    };
    let body = html! {
        p { (word(&r.axis)) " rollout, " strong { (word(&r.status)) } ", at step " (r.step) " of " (r.steps.len()) ", carried by experiment " a href={ "/console/experiments/" (r.experiment) } { (r.experiment) } "." }
        section aria-labelledby="state" {
            h2 #state { "State file" }
            @match &view.chain {
                None => p.notice { "Not read: this halo-server runs no controller (--controller)." },
                Some(Ok(chain)) => p.ok role="status" { "Hash chain verified: " (chain.records().len()) " record(s), head " code { (chain.head().unwrap_or("none")) } "." },
                Some(Err(e)) => p.killed role="status" { "Refused, the rollout is held: " (e) },
            }
        }
        section aria-labelledby="steps" {
            h2 #steps { "Steps" }
            table {
                thead { tr { th scope="col" { "Step" } th scope="col" { "Ring" } th scope="col" { "Percent" } th scope="col" { "Bake" } th scope="col" { "Gates" } th scope="col" { "On failure" } } }
                tbody {
                    @for (i, step) in r.steps.iter().enumerate() {
                        tr {
                            td { (i) @if i as u32 == r.step { " (current)" } }
                            td { (step.ring) }
                            td { (step.percent.map_or("-".to_string(), |p| format!("{p}%"))) }
                            td { (step.bake) }
                            td { (step.gates.iter().map(|g| format!("{} {}", g.metric, bound(g.min, g.max))).collect::<Vec<_>>().join("; ")) }
                            td { (word(&step.on_failure)) }
                        }
                    }
                }
            }
        }
        section aria-labelledby="tick" {
            h2 #tick { "Last evaluation" }
            @match (report, evaluation) {
                (Some(rep), Some(e)) => {
                    p { "State " strong { (rep.state) } ": " (e.reason) "." }
                    table {
                        thead { tr { th scope="col" { "Gate" } th scope="col" { "Bound" } th scope="col" { "Value" } th scope="col" { "Units" } th scope="col" { "State" } th scope="col" { "Evidence" } } }
                        tbody {
                            @for g in &e.gates {
                                tr {
                                    td { (g.metric) }
                                    td { (bound(g.min, g.max)) }
                                    td { (g.value.map_or("-".to_string(), |v| format!("{v:.4}"))) }
                                    td { (g.n) }
                                    td { (word(&g.state)) }
                                    td { (g.sources.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")) }
                                }
                            }
                        }
                    }
                    @if let Some(a) = &rep.action {
                        p { "Decided at step " (a.step) ": " strong { (a.evaluation.action.as_str()) } "; kill " (a.kill_outcome.map_or("-", |k| k.as_str())) "; pull request " (pages::pr_link(a.pull_request.as_deref())) "; notified " (if a.notified { "yes" } else { "not yet" }) "." }
                    }
                }
                (Some(rep), None) => p { "State " strong { (rep.state) } ": " (rep.error.as_deref().unwrap_or("")) },
                _ => p { "Not evaluated yet." },
            }
        }
    };
    html_answer(
        StatusCode::OK,
        page(&format!("Rollout {name}"), Some(&viewer), body),
    )
}

/// The handler of one kill or unkill form: `action` on a `target` named in the path.
fn change(
    action: Action,
    target: Target,
) -> impl Fn(State<Console>, Session, HeaderMap, Path<String>, Bytes) -> BoxFuture<'static, Response>
+ Clone
+ Send
+ Sync
+ 'static {
    move |state, s, headers, name, body| {
        Box::pin(change_one(state, s, headers, name, body, action, target))
    }
}

async fn change_one(
    State(console): State<Console>,
    s: Session,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
    action: Action,
    target: Target,
) -> Response {
    let fields = match form(&body, &["csrf", "reason"]) {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_csrf(&console, &headers, &s, &fields) {
        return r.into_response();
    }
    let admin = Admin {
        user: s.user.clone(),
        groups: s.groups.clone(),
    };
    let reason = fields.get("reason").map(String::as_str).unwrap_or("");
    let changed = match &console.kill {
        Some(k) => k.change(&admin, action, target, &name, reason).await,
        None => Err(ApiError::new(
            kill::DISABLED.status,
            kill::DISABLED.code,
            kill::DISABLED.message,
        )),
    };
    match changed {
        // Post/redirect/get: the page shows the new state and the audit entry.
        Ok(_) => match target {
            Target::Experiment => {
                Redirect::to(&format!("/console/experiments/{name}#kill")).into_response()
            }
            Target::Toggle => Redirect::to("/console#toggles").into_response(),
        },
        Err(e) => api_problem(&e),
    }
}

async fn audit(
    State(console): State<Console>,
    s: Session,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let get = |k: &str| q.get(k).map(|v| v.trim().to_string()).unwrap_or_default();
    let (action, name, actor) = (get("action"), get("name"), get("actor"));
    let matches = |r: &Value, k: &str, want: &str| {
        want.is_empty()
            || r.get(k)
                .and_then(Value::as_str)
                .is_some_and(|v| v.contains(want))
    };
    let records = match audit_records(
        &console,
        |r| {
            matches(r, "action", &action)
                && (matches(r, "name", &name) || matches(r, "device", &name))
                && matches(r, "actor", &actor)
        },
        AUDIT_PAGE,
    ) {
        Ok(r) => r,
        Err(e) => {
            return problem_answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Audit log unreadable",
                &e,
            );
        }
    };
    let body = html! {
        form method="get" action="/console/audit" role="search" {
            label for="f-action" { "Action (kill, unkill, revoke-device, ...)" }
            input #f-action type="text" name="action" value=(action);
            label for="f-name" { "Experiment, toggle or device" }
            input #f-name type="text" name="name" value=(name);
            label for="f-actor" { "Who" }
            input #f-actor type="text" name="actor" value=(actor);
            button type="submit" { "Filter" }
        }
        p { (records.len()) " entries, newest first (at most " (AUDIT_PAGE) ")." }
        (audit_table(&records))
    };
    html_answer(
        StatusCode::OK,
        page(
            "Audit log",
            Some(&Viewer {
                user: &s.user,
                csrf: &s.csrf,
            }),
            body,
        ),
    )
}

async fn fleet(State(console): State<Console>, s: Session) -> Response {
    let devices = console.fleet.devices.list().await;
    let viewer = Viewer {
        user: &s.user,
        csrf: &s.csrf,
    };
    let body = html! {
        p { (devices.len()) " devices enrolled." }
        table {
            thead { tr { th scope="col" { "Device" } th scope="col" { "User" } th scope="col" { "Groups" } th scope="col" { "Host" } th scope="col" { "Enrolled" } th scope="col" { "Expires" } th scope="col" { "Last report" } th scope="col" { "Ring" } th scope="col" { "Release" } th scope="col" { "Drift" } th scope="col" { "State" } } }
            tbody {
                @for d in &devices {
                    tr {
                        td { code { (d.id) } }
                        td { (d.user.as_deref().unwrap_or("-")) }
                        td { (d.groups.join(", ")) }
                        td { (d.host.as_deref().unwrap_or("-")) }
                        td { (pages::minute(&d.enrolled_at)) }
                        td { (pages::minute(&d.expires_at)) }
                        td { (d.last_report_at.as_deref().map_or("never".to_string(), pages::minute)) }
                        @let r = d.last_report.clone().unwrap_or_default();
                        td { (r.ring.as_deref().unwrap_or("-")) }
                        td { @if let Some(digest) = &r.digest { code title=(digest) { (digest.get(..19).unwrap_or(digest)) } } @else { "-" } }
                        td { @if r.drift.is_empty() { "none" } @else { span.killed { (r.drift.len()) " file(s)" } " " (r.drift.join(", ")) } }
                        td {
                            @if d.revoked { span.killed { "revoked" } } @else {
                                form method="post" action={ "/console/devices/" (d.id) "/revoke" } {
                                    input type="hidden" name="csrf" value=(viewer.csrf);
                                    button type="submit" aria-label={ "Revoke device " (d.id) } { "Revoke" }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    html_answer(StatusCode::OK, page("Fleet", Some(&viewer), body))
}

async fn revoke(
    State(console): State<Console>,
    s: Session,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let fields = match form(&body, &["csrf"]) {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_csrf(&console, &headers, &s, &fields) {
        return r.into_response();
    }
    let admin = Admin {
        user: s.user.clone(),
        groups: s.groups.clone(),
    };
    match console.fleet.revoke(&admin, &id).await {
        Ok(_) => Redirect::to("/console/fleet").into_response(),
        Err(e) => api_problem(&e),
    }
}
