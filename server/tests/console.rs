//! The admin console in a real browser: Debian's Chromium, headless, driven over WebDriver
//! by its ChromeDriver, against halo-server in-process and the fake OIDC issuer (real
//! authorization code flow with PKCE, real signed ID tokens). Screenshots of each page go
//! to `target/console-screenshots/` (the ones in docs/console/ come from this test).
//!
//! Needs `chromium` and `chromedriver` on PATH (scripts/install.sh installs them).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use halo_evidence::Source;
use halo_policy::killswitch::verify;
use serde_json::{Value, json};
use support::controller::{UNITS, post_arms};
use support::gateway::start_live;
use support::{Env, GATEWAY_TOKEN, serve};

const EXPERIMENT: &str = "sonnet-bedrock-canary";

/// ChromeDriver on an ephemeral loopback port; killed on drop.
struct Driver {
    child: Child,
    url: String,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn driver() -> Driver {
    let port = free_port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver on PATH (scripts/install.sh installs Debian's chromium-driver)");
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = reqwest::get(format!("{url}/status")).await
            && r.status().is_success()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "chromedriver did not come up on {url}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Driver {
        child,
        url,
        _profile: tempfile::tempdir().unwrap(),
    }
}

async fn browser(driver: &Driver) -> Client {
    let profile = driver._profile.path().display().to_string();
    let caps = json!({
        // The fake issuer's certificate is from a test CA Chromium does not know.
        "acceptInsecureCerts": true,
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--window-size=1280,1000",
                format!("--user-data-dir={profile}"),
            ],
        },
    });
    let Value::Object(caps) = caps else {
        unreachable!()
    };
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a Chromium session")
}

fn shots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    std::fs::write(shots().join(format!("{name}.png")), png).unwrap();
}

async fn h1(c: &Client) -> String {
    c.find(Locator::Css("h1"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn body_text(c: &Client) -> String {
    c.find(Locator::Css("body"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The page's text once it contains `needle` (a click's navigation may still be loading
/// when the click returns): polled for at most 15 s.
async fn wait_text(c: &Client, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        // Between two pages the body may be gone (stale): read again.
        let text = match c.find(Locator::Css("body")).await {
            Ok(b) => b.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "the page never said {needle:?}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every form control (but hidden inputs and buttons) has a label, and the page has one
/// h1: what a screen reader needs to name the controls and find the page.
async fn check_accessible(c: &Client) {
    let v = c
        .execute(
            "const bad = [...document.querySelectorAll('input,textarea,select')]
               .filter(e => e.type !== 'hidden')
               .filter(e => !(e.id && document.querySelector(`label[for='${e.id}']`)) && !e.getAttribute('aria-label'))
               .map(e => e.outerHTML);
             const buttons = [...document.querySelectorAll('button')].filter(b => !b.textContent.trim() && !b.getAttribute('aria-label')).length;
             return {unlabelled: bad, h1: document.querySelectorAll('h1').length, buttons, lang: document.documentElement.lang};",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(v["unlabelled"], json!([]), "controls without a label");
    assert_eq!(v["h1"], 1, "one h1 per page");
    assert_eq!(v["buttons"], 0, "buttons without a name");
    assert_eq!(v["lang"], "en");
}

/// The policy's client is the fake issuer's (the console logs in as identity.clientID).
fn use_fake_client(env: &Env) {
    let root = env.path("policy/halos.yaml");
    let text = std::fs::read_to_string(&root).unwrap();
    std::fs::write(
        &root,
        text.replace("0oa9halos4acmecorp7x", halo_testkit::oidc::CLIENT_ID),
    )
    .unwrap();
}

/// The signed kill list gateways read (verified with the kill-switch key): is it killed?
async fn gateway_kills(env: &Env, base: &str) -> bool {
    served_list(env, base)
        .await
        .experiments()
        .contains(EXPERIMENT)
}

async fn served_list(env: &Env, base: &str) -> halo_policy::killswitch::KillList {
    let r = reqwest::Client::new()
        .get(format!("{base}/api/v1/gateway/killswitch"))
        .bearer_auth(GATEWAY_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let raw = r.bytes().await.unwrap();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    verify(&raw, &env.killswitch_pub, now, None).expect("the served list verifies")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_logs_in_kills_and_unkills_an_experiment_with_a_reason_and_logs_out() {
    let env = Env::new().await;
    use_fake_client(&env);
    env.issuer.set_user(json!({
        "sub": "u-alice", "email": "alice@acme.com", "email_verified": true,
        "groups": ["engineering", "halos-admins"],
    }));
    // The controller runs (it needs an evidence receiver), so the rollout page has a
    // tick to show; the example's session-metric experiments are paused (their evidence
    // is not the gateway store's).
    env.pause_experiments(&["claude-opus-default", "gpt-shadow"]);
    std::fs::write(
        env.path("otlp-gateway.token"),
        "9b8e7d1c2a3f40516e7d8c9b0a1f2e3d4c5b6a79808f7e6d5c4b3a2910f8e7d6",
    )
    .unwrap();
    let mut settings = env.settings();
    settings.evidence.gateway_listen = Some("127.0.0.1:0".parse().unwrap());
    settings.evidence.gateway_token_file = Some(env.path("otlp-gateway.token"));
    settings.controller.enabled = true;
    let server = serve(&settings).await;
    let base = server.base.clone();
    let controller = server.controller();
    controller
        .tick_within_budget(time::OffsetDateTime::now_utc())
        .await
        .expect("the tick succeeds");
    let d = driver().await;
    let c = browser(&d).await;

    // Not signed in: the console sends the browser to the issuer and back.
    c.goto(&format!("{base}/console")).await.unwrap();
    assert_eq!(h1(&c).await, "Overview");
    let text = body_text(&c).await;
    assert!(text.contains("Signed in as alice@acme.com"), "{text}");
    assert!(text.contains(EXPERIMENT), "{text}");
    check_accessible(&c).await;
    shot(&c, "overview").await;

    // The experiment, then a kill without a reason is refused by the form itself (the
    // textarea is required) and by the server.
    c.find(Locator::LinkText(EXPERIMENT))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let text = wait_text(&c, "Why kill").await;
    assert_eq!(h1(&c).await, format!("Experiment {EXPERIMENT}"));
    assert!(
        text.contains("Driven by its rollout: sonnet-bedrock"),
        "the controller's view of a rollout-owned experiment: {text}"
    );
    check_accessible(&c).await;
    shot(&c, "experiment").await;
    let reason = "treatment p95 doubled since 14:05; paging the provider";
    c.find(Locator::Id("kill-reason"))
        .await
        .unwrap()
        .send_keys(reason)
        .await
        .unwrap();
    c.find(Locator::XPath("//button[starts-with(., 'Kill ')]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let text = wait_text(&c, "Killed: every user of this experiment is on control").await;
    assert!(
        text.contains(reason),
        "the audit entry is on the page: {text}"
    );
    shot(&c, "killed").await;
    // What gateways read: the signed kill list names it.
    assert!(gateway_kills(&env, &base).await);
    let audit = env.log_lines("audit.jsonl");
    let last = audit.last().unwrap();
    assert_eq!(
        (last["actor"].as_str(), last["action"].as_str()),
        (Some("alice@acme.com"), Some("kill"))
    );

    // Unkill with a reason.
    c.find(Locator::Id("unkill-reason"))
        .await
        .unwrap()
        .send_keys("provider fixed it")
        .await
        .unwrap();
    c.find(Locator::XPath("//button[starts-with(., 'Unkill ')]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "Live.").await;
    assert!(!gateway_kills(&env, &base).await);

    // The audit log, filtered to this experiment.
    c.goto(&format!("{base}/console/audit?name={EXPERIMENT}"))
        .await
        .unwrap();
    let text = body_text(&c).await;
    assert!(text.contains("2 entries"), "{text}");
    assert!(
        text.contains("provider fixed it") && text.contains(reason),
        "{text}"
    );
    check_accessible(&c).await;
    shot(&c, "audit").await;

    // A toggle, from the overview: killed with a reason, served to gateways, unkilled.
    c.goto(&format!("{base}/console")).await.unwrap();
    c.find(Locator::Id("toggle-reason-deep-reasoning"))
        .await
        .unwrap()
        .send_keys("reasoning budget blown")
        .await
        .unwrap();
    c.find(Locator::XPath("//button[.='Kill deep-reasoning']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "Unkill deep-reasoning").await;
    check_accessible(&c).await;
    shot(&c, "toggle-killed").await;
    assert!(
        served_list(&env, &base)
            .await
            .toggles()
            .contains("deep-reasoning")
    );
    let audit = env.log_lines("audit.jsonl");
    let last = audit.last().unwrap();
    assert_eq!(
        (last["action"].as_str(), last["name"].as_str()),
        (Some("kill"), Some("deep-reasoning")),
        "{last}"
    );
    c.find(Locator::Id("toggle-reason-deep-reasoning"))
        .await
        .unwrap()
        .send_keys("budget raised")
        .await
        .unwrap();
    c.find(Locator::XPath("//button[.='Unkill deep-reasoning']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "Kill deep-reasoning").await;
    assert!(
        !served_list(&env, &base)
            .await
            .toggles()
            .contains("deep-reasoning")
    );

    // The traffic rollout, from the overview's link: its steps, the last tick's gates
    // against their bounds and the bake left, the state file's chain verified.
    c.goto(&format!("{base}/console")).await.unwrap();
    c.find(Locator::LinkText("sonnet-bedrock"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let text = wait_text(&c, "Hash chain verified").await;
    assert_eq!(h1(&c).await, "Rollout sonnet-bedrock");
    assert!(text.contains("at step 1 of 4"), "{text}");
    assert!(text.contains("1 (current)"), "{text}");
    assert!(text.contains("halo.api.error_rate at most 0.02"), "{text}");
    assert!(text.contains("State evaluated: step 1 bakes for"), "{text}");
    assert!(text.contains("no_evidence"), "no records yet: {text}");
    check_accessible(&c).await;
    shot(&c, "rollout").await;
    // Its experiment's page shows the enrolment served, which the rollout sets (step 1:
    // the canary ring whole), not the document's 90/10 over three rings.
    c.find(Locator::LinkText(EXPERIMENT))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let text = wait_text(&c, "Rings and weights as rollout").await;
    assert!(
        text.contains(
            "in rings canary. Rings and weights as rollout sonnet-bedrock sets them at step 1"
        ),
        "{text}"
    );

    // The experiment on its own (its rollout file removed from the policy dir): at each
    // tick the controller evaluates it, and its page draws the interval of treatment -
    // control over the run's ticks. Both arms fail 10% of calls: the band holds zero.
    std::fs::remove_file(env.path("policy").join("rollouts/sonnet-bedrock.yaml")).unwrap();
    let running = server.running.as_ref().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while running
        .policy_now()
        .org
        .rollouts
        .contains_key("sonnet-bedrock")
    {
        assert!(
            Instant::now() < deadline,
            "the policy without the rollout is never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    controller
        .tick_within_budget(time::OffsetDateTime::now_utc())
        .await
        .expect("the tick that starts the run");
    for round in 0..3 {
        post_arms(&server, Source::Gateway, 1, 1, round * 4 * UNITS).await;
        controller
            .tick_within_budget(time::OffsetDateTime::now_utc())
            .await
            .expect("the tick succeeds");
    }
    c.goto(&format!("{base}/console/experiments/{EXPERIMENT}"))
        .await
        .unwrap();
    let text = wait_text(&c, "Over this run").await;
    assert!(text.contains("Run 1, evaluated"), "{text}");
    // Without its rollout, the enrolment is the document's own.
    assert!(
        text.contains("running, in rings canary, early, general."),
        "{text}"
    );
    assert!(
        text.contains(
            "Enrolled this run: 12000 units (canary 6000, control 6000); spend 0.00 USD."
        ),
        "{text}"
    );
    let charts = c.find_all(Locator::Css("svg.chart")).await.unwrap();
    assert!(!charts.is_empty(), "a chart per metric and arm: {text}");
    let label = charts[0]
        .attr("aria-label")
        .await
        .unwrap()
        .unwrap_or_default();
    assert!(label.contains("canary - control over 3 ticks"), "{label}");
    check_accessible(&c).await;
    c.execute(
        "document.querySelector('svg.chart').scrollIntoView({block: 'center'})",
        vec![],
    )
    .await
    .unwrap();
    shot(&c, "experiment-chart").await;

    // A device enrolled and reporting a drifted file: the fleet page shows its ring,
    // release and drift.
    let admin = env.admin_token();
    let r = server
        .post(
            "/api/v1/enrollment-tokens",
            Some(&admin),
            json!({"user": "carol@acme.com", "groups": ["halos-canary"]}),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let r = server
        .post(
            "/api/v1/enroll",
            None,
            json!({"enrollmentToken": r.body["token"], "host": "carol-mbp"}),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let device = r.body["deviceToken"].as_str().unwrap().to_string();
    let digest = format!("sha256:{}", "ab".repeat(32));
    let r = server
        .post(
            "/api/v1/fleet/report",
            Some(&device),
            json!({"outcome": "applied", "ring": "canary", "digest": digest,
                   "drift": ["~/.claude/settings.json"]}),
        )
        .await;
    assert!(r.status < 300, "{:?}", r.body);
    let r = server.get("/api/v1/devices", Some(&admin)).await;
    assert_eq!(
        r.body["devices"][0]["lastReport"]["ring"], "canary",
        "{:?}",
        r.body
    );
    c.goto(&format!("{base}/console/fleet")).await.unwrap();
    let text = body_text(&c).await;
    assert!(
        text.contains("canary") && text.contains("1 file(s) ~/.claude/settings.json"),
        "{text}"
    );
    assert_eq!(h1(&c).await, "Fleet");
    check_accessible(&c).await;
    shot(&c, "fleet").await;

    // The session cookie is sealed: HttpOnly, SameSite=Lax, path /console.
    let cookie = c.get_named_cookie("halo_console").await.unwrap();
    assert_eq!(cookie.http_only(), Some(true));
    assert_eq!(cookie.path(), Some("/console"));
    let sealed = cookie.value().to_string();
    assert!(
        !sealed.contains("alice"),
        "the session is encrypted: {sealed}"
    );

    // A state change without the CSRF token is refused, even with the session cookie.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = http
        .post(format!("{base}/console/experiments/{EXPERIMENT}/kill"))
        .header("cookie", format!("halo_console={sealed}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("reason=forged")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("CSRF"));
    assert!(!gateway_kills(&env, &base).await);
    // A forged or altered cookie goes back to the login.
    let mut forged = sealed.clone();
    forged.replace_range(10..12, if &sealed[10..12] == "AA" { "BB" } else { "AA" });
    let r = http
        .get(format!("{base}/console"))
        .header("cookie", format!("halo_console={forged}"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_redirection(), "{}", r.status());
    assert!(
        r.headers()["location"]
            .to_str()
            .unwrap()
            .starts_with("/console/login")
    );

    // Log out: the cookie is gone.
    c.find(Locator::XPath("//button[.='Log out']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "You are signed out").await;
    assert_eq!(h1(&c).await, "Signed out");
    assert!(c.get_named_cookie("halo_console").await.is_err());
    shot(&c, "signed-out").await;

    // Someone who is not an admin signs in: 403, saying who they are and what is needed.
    env.issuer.set_user(json!({
        "sub": "u-dave", "email": "dave@acme.com", "email_verified": true,
        "groups": ["engineering"],
    }));
    c.goto(&format!("{base}/console")).await.unwrap();
    assert_eq!(h1(&c).await, "Not an admin");
    let text = body_text(&c).await;
    assert!(
        text.contains("dave@acme.com") && text.contains("halos-admins"),
        "{text}"
    );
    shot(&c, "forbidden").await;

    c.close().await.unwrap();
}

/// The console's kill reaching a real Envoy: halo-server serves a small policy over xDS
/// (the `haiku-b` toggle routes haiku to prov-b; the filter's poll is an hour, so only the
/// push can deliver the kill). An admin kills the toggle from the overview and haiku is
/// back on its gateway route (prov-a) at the Envoy; unkilled, it returns to prov-b.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_toggle_killed_in_the_console_reaches_a_live_envoy() {
    let env = Env::new().await;
    use_fake_client(&env);
    env.issuer.set_user(json!({
        "sub": "u-alice", "email": "alice@acme.com", "email_verified": true,
        "groups": ["engineering", "halos-admins"],
    }));
    let live = start_live(&env, env.settings()).await;
    let base = live.server.base.clone();
    let user = env.user_token();
    live.until(&user, "prov-b", "haiku-on-b").await;

    let d = driver().await;
    let c = browser(&d).await;
    c.goto(&format!("{base}/console")).await.unwrap();
    assert_eq!(h1(&c).await, "Overview");
    let text = body_text(&c).await;
    assert!(text.contains("Envoys (xDS)"), "{text}");
    c.find(Locator::Id("toggle-reason-haiku-b"))
        .await
        .unwrap()
        .send_keys("prov-b is degraded")
        .await
        .unwrap();
    c.find(Locator::XPath("//button[.='Kill haiku-b']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "Unkill haiku-b").await;
    let took = live.until(&user, "prov-a", "haiku-model").await;
    eprintln!("the console's kill reached Envoy's routing in {took:?}");

    c.find(Locator::Id("toggle-reason-haiku-b"))
        .await
        .unwrap()
        .send_keys("prov-b recovered")
        .await
        .unwrap();
    c.find(Locator::XPath("//button[.='Unkill haiku-b']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "Kill haiku-b").await;
    live.until(&user, "prov-b", "haiku-on-b").await;
    let audit = env.log_lines("audit.jsonl");
    let actions: Vec<_> = audit
        .iter()
        .map(|a| {
            (
                a["action"].as_str(),
                a["name"].as_str(),
                a["actor"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            (Some("kill"), Some("haiku-b"), Some("alice@acme.com")),
            (Some("unkill"), Some("haiku-b"), Some("alice@acme.com"))
        ]
    );
    c.close().await.unwrap();
}
