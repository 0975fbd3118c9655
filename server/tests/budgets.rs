//! Budgets enforced by every Envoy (issue #25), live: one halo-server serving the policy
//! over xDS and its budget service (the rate-limit service, counts in its store), one
//! Envoy fed over xDS and a second booted from the standalone bootstrap of the same plan,
//! both asking that service. The same test body runs with either filter build
//! (`HALO_FILTER=native` for the dynamic module).
//!
//! What a user relies on: calls through either Envoy add to one count; the call after the
//! count reaches the limit gets a 429 in its wire's shape naming the budget and its reset,
//! with Retry-After; other users are unaffected; a spent `routeTo` budget sends its
//! caller's alias to the cheaper one on the xDS Envoy (the exhausted list is pushed) and
//! is refused rather than overspent where the list does not reach (the standalone
//! Envoy); the next period starts from zero, back on the normal route; and with the
//! budget service stopped calls pass, counted by Envoy.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use halo_envoy_config::bootstrap::{Standalone, standalone};
use halo_envoy_config::evidence::Export;
use halo_envoy_config::plan::GatewaySettings;
use halo_testkit::envoy::Envoy;
use halo_testkit::free_port;
use serde_json::{Value, json};
use support::gateway::{Live, USAGE_TOKENS, start_live_with};
use support::{Env, GATEWAY_TOKEN};

/// Dave's daily token budget: five calls of [`USAGE_TOKENS`].
const LIMIT: u64 = 5 * USAGE_TOKENS;

/// A generous check timeout: on a loaded 2-core machine even the default 1 s can pass, and
/// Envoy then drops that call's spend (fail open), which is not what this test is about.
const SERVICE: &str = "budgetService: {timeoutMs: 2000}\n";

/// Erin's daily token budget, two calls; at its limit `sonnet` goes to `haiku`.
const ERIN_LIMIT: u64 = 2 * USAGE_TOKENS;

fn budget_yaml() -> String {
    format!(
        "budgets:\n  dave-daily:\n    appliesTo: {{users: [dave@acme.com]}}\n    period: day\n    timeZone: Europe/Berlin\n    limit: {{tokens: {LIMIT}}}\n  erin-daily:\n    appliesTo: {{users: [erin@acme.com]}}\n    period: day\n    limit: {{tokens: {ERIN_LIMIT}}}\n    atLimit: {{routeTo: {{sonnet: haiku}}}}\n{SERVICE}"
    )
}

/// One haiku call on `port` over a connection of its own: status, headers, JSON body.
async fn call(port: u16, token: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    call_model(port, token, "haiku").await
}

/// A call for `model` on `port` over a connection of its own: status, headers, JSON body
/// (the fake provider's answer names the model it was sent).
async fn call_model(
    port: u16,
    token: &str,
    model: &str,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let r = client
        .post(format!("http://127.0.0.1:{port}/v1/messages"))
        .bearer_auth(token)
        .json(&json!({"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("the gateway answers");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.json().await.unwrap_or(Value::Null))
}

/// Wait (bounded) until `f` holds.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// halo-server's settings with the budget service on a free port: the settings, the
/// service's URL and its token file.
fn with_budget_service(env: &Env) -> (halo_server::config::Settings, String, std::path::PathBuf) {
    let token_file = env.path("budget.token");
    std::fs::write(&token_file, format!("{GATEWAY_TOKEN}\n")).expect("budget token");
    let budget_port = free_port();
    let mut settings = env.settings();
    settings.budget.listen = Some(format!("127.0.0.1:{budget_port}").parse().expect("addr"));
    settings.budget.token_file = Some(token_file.clone());
    (
        settings,
        format!("http://127.0.0.1:{budget_port}"),
        token_file,
    )
}

/// The running budget service of `gw`'s halo-server.
fn budget_service(
    gw: &support::gateway::LiveGateway,
) -> std::sync::Arc<halo_server::budget::Budgets> {
    std::sync::Arc::clone(
        &gw.server
            .running
            .as_ref()
            .and_then(|r| r.budget.as_ref())
            .expect("the budget service")
            .budgets,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_are_one_count_across_envoys_refused_in_the_wire_shape_and_reset_by_period() {
    let env = Env::new().await;
    let (settings, budget_url, token_file) = with_budget_service(&env);
    let mut gw = start_live_with(
        &env,
        settings,
        Live {
            files: vec![],
            gateway_file: json!({"budgets": {"url": budget_url, "tokenFile": token_file}}),
            gateway_yaml: budget_yaml(),
            ..Live::default()
        },
    )
    .await;
    let alice = env.admin_token();
    let dave = env.user_token();
    // The xDS Envoy routes (alice has no budget: her calls count nowhere).
    gw.until(&alice, "prov-a", "haiku-model").await;

    // The second Envoy: the standalone bootstrap of the same policy and service.
    let snap = halo_xds::source::load_policy(&env.path("policy")).expect("policy");
    let port2 = free_port();
    let admin2 = free_port();
    let bootstrap = standalone(
        &snap,
        &Standalone {
            gateway: GatewaySettings {
                listen_address: "127.0.0.1".into(),
                listen_port: port2,
                wasm_path: halo_testkit::filter_module().display().to_string(),
                upstream_ca_file: env.path("oidc-ca.pem").display().to_string(),
                jwks_uri: Some(format!("{}/keys", env.issuer.issuer)),
                budgets: Some(Export {
                    url: budget_url.clone(),
                    token_file: None,
                    token: GATEWAY_TOKEN.into(),
                }),
                ..GatewaySettings::default()
            },
            admin_address: "127.0.0.1".into(),
            admin_port: admin2,
        },
    )
    .expect("standalone bootstrap");
    let envoy2 = tokio::task::block_in_place(|| Envoy::start(&bootstrap.to_string(), admin2));
    let deadline = Instant::now() + Duration::from_secs(20);
    while call(port2, &alice).await.0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the standalone Envoy never answered 200"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let service = budget_service(&gw);
    let spent = || service.metrics.spent_tokens();
    assert_eq!(spent(), 0, "alice's calls are not budgeted");

    // Dave's calls alternate between the Envoys; each one's spend lands before the next.
    let ports = [gw.port, port2];
    for i in 0..5u64 {
        let (status, _, body) = call(ports[i as usize % 2], &dave).await;
        assert_eq!(status, 200, "call {i} within the budget: {body}");
        until(&format!("call {i}'s spend (counted {})", spent()), || {
            spent() == (i + 1) * USAGE_TOKENS
        })
        .await;
    }
    for (envoy, name) in [(&gw.envoy, "xds"), (&envoy2, "standalone")] {
        let ok = envoy.stat_sum("ratelimit\\.halo_budget\\.ok");
        assert!(ok >= 2, "the {name} Envoy checked dave's calls: {ok}");
    }

    // The count reached the limit: the next call, through either Envoy, is refused.
    for port in ports {
        let (status, headers, body) = call(port, &dave).await;
        assert_eq!(status, 429, "{body}");
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
        let message = body["error"]["message"].as_str().expect("a message");
        assert!(
            message.starts_with(&format!(
                "halo budget dave-daily ({LIMIT} tokens per day, Europe/Berlin) is spent; it resets at "
            )),
            "{message}"
        );
        assert_eq!(headers["x-halo-budget"], "dave-daily");
        let retry: u64 = headers["retry-after"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("seconds");
        assert!((1..=25 * 3600).contains(&retry), "retry-after {retry}");
    }
    // Exact to one call: refused calls add nothing.
    assert_eq!(spent(), LIMIT);
    // Another user is unaffected.
    assert_eq!(call(gw.port, &alice).await.0, 200);
    // The API (`halo budget status`) shows the same count, spent.
    let status = gw
        .server
        .get(
            "/api/v1/budgets/status?user=dave@acme.com&groups=engineering",
            Some(&alice),
        )
        .await;
    assert_eq!(status.status, 200, "{:?}", status.body);
    let b = &status.body["budgets"][0];
    assert_eq!(b["name"], "dave-daily", "{}", status.body);
    assert_eq!(b["spentTokens"], LIMIT);
    assert_eq!(b["spent"], true);
    let none = gw
        .server
        .get("/api/v1/budgets/status?user=alice@acme.com", Some(&alice))
        .await;
    assert_eq!(none.body["budgets"], json!([]), "{:?}", none.body);

    // Route to cheaper: erin's budget sends `sonnet` to `haiku` once spent.
    let erin = env.issuer.mint(json!({
        "aud": "api://halos", "sub": "u-erin", "email": "erin@acme.com",
        "email_verified": true, "groups": ["engineering"],
    }));
    let before = spent();
    for i in 0..2u64 {
        let (status, _, body) = call_model(gw.port, &erin, "sonnet").await;
        assert_eq!(status, 200, "erin's call {i} within the budget: {body}");
        assert_eq!(body["model"], "m", "sonnet's own target: {body}");
        until("erin's spend", || {
            spent() == before + (i + 1) * USAGE_TOKENS
        })
        .await;
    }
    // Spent: the exhausted list reaches the xDS Envoy (one push), and from then on erin's
    // sonnet calls are served by haiku's target. Before the push a call is refused, never
    // served by sonnet's target past the limit.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _, body) = call_model(gw.port, &erin, "sonnet").await;
        if status == 200 {
            assert_eq!(
                body["model"], "haiku-model",
                "routed to the cheaper alias: {body}"
            );
            break;
        }
        assert_eq!(
            status, 429,
            "before the push: refused, not overspent: {body}"
        );
        assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
        assert!(
            Instant::now() < deadline,
            "the exhausted list never reached the xDS Envoy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(service.exhausted().len(), 1, "erin's count alone is listed");
    assert!(
        !service.exhausted()[0].subject.contains("erin"),
        "the list carries the salted key, never the user"
    );
    // Calls routed to the cheaper alias still count (the budget stays spent).
    until("erin's routed spend", || spent() > before + ERIN_LIMIT).await;
    // Others on the same alias keep its target.
    let (status, _, body) = call_model(gw.port, &alice, "sonnet").await;
    assert_eq!((status, &body["model"]), (200, &json!("m")), "{body}");
    // The standalone Envoy has no push: it refuses erin's sonnet with the budget's
    // message, and serves the cheaper alias she is routed to.
    let (status, headers, body) = call_model(port2, &erin, "sonnet").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(headers["x-halo-budget"], "erin-daily");
    let (status, _, body) = call_model(port2, &erin, "haiku").await;
    assert_eq!(
        (status, &body["model"]),
        (200, &json!("haiku-model")),
        "{body}"
    );

    // The next period (the service's clock a day on) starts from zero.
    let xds = &gw
        .server
        .running
        .as_ref()
        .expect("running")
        .xds
        .as_ref()
        .expect("xds")
        .cache;
    let acked = || {
        xds.status()
            .iter()
            .flat_map(|n| n.types.values())
            .map(|t| (t.sent_version.clone(), t.acked_version.clone()))
            .collect::<Vec<_>>()
    };
    let with_erin = acked();
    service.clock.advance(24 * 3600 * 1000);
    let (status, _, body) = call(port2, &dave).await;
    assert_eq!(status, 200, "a new day: {body}");
    // Erin's entry ends with its period: the list is pushed empty (Envoy acknowledges it)
    // and her sonnet calls are sonnet's again.
    until("erin's entry to expire", || service.exhausted().is_empty()).await;
    until("Envoy to acknowledge the empty list", || {
        let now = acked();
        now != with_erin && now.iter().all(|(sent, acked)| sent == acked)
    })
    .await;
    let (status, _, body) = call_model(gw.port, &erin, "sonnet").await;
    assert_eq!(
        (status, &body["model"]),
        (200, &json!("m")),
        "a new day: {body}"
    );

    // The budget service stops: calls pass, and Envoy counts each unchecked call.
    let before = gw
        .envoy
        .stat_sum("ratelimit\\.halo_budget\\.failure_mode_allowed");
    drop(service);
    let running = gw.server.running.as_mut().expect("running");
    running.budget.take().expect("budget").shutdown().await;
    for _ in 0..3 {
        let (status, _, body) = call(gw.port, &dave).await;
        assert_eq!(status, 200, "fail open: {body}");
    }
    let after = gw
        .envoy
        .stat_sum("ratelimit\\.halo_budget\\.failure_mode_allowed");
    assert!(
        after >= before + 3,
        "failure_mode_allowed {before} -> {after}"
    );
    // What an operator alerts on, in Prometheus: per route cluster, summed.
    let unchecked: u64 = gw
        .envoy
        .prometheus()
        .lines()
        .filter(|l| l.starts_with("envoy_cluster_ratelimit_halo_budget_failure_mode_allowed{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(unchecked, after, "the Prometheus name counts the same");
    drop(envoy2);
}

/// How far over a limit 50 concurrent calls land (issue #25's benchmark; BENCHMARKS.md
/// "Budgets"): frank's budget is ten calls, fifty are sent at once through the xDS Envoy.
/// Every call whose check runs before the earlier spends land is admitted, so the count
/// ends at (admitted calls) × [`USAGE_TOKENS`]: printed, not asserted beyond what holds
/// whatever the timing (every admitted call counted, at least the limit reached).
/// Run: `cargo test -p halo-server --test budgets -- --ignored --nocapture` (and with
/// `HALO_FILTER=native`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints the overshoot of 50 concurrent calls"]
async fn fifty_concurrent_calls_overshoot() {
    const CALLS: usize = 50;
    const FRANK_LIMIT: u64 = 10 * USAGE_TOKENS;
    let env = Env::new().await;
    let (settings, budget_url, token_file) = with_budget_service(&env);
    let gw = start_live_with(
        &env,
        settings,
        Live {
            files: vec![],
            gateway_file: json!({"budgets": {"url": budget_url, "tokenFile": token_file}}),
            gateway_yaml: format!(
                "budgets:\n  frank-daily:\n    appliesTo: {{users: [frank@acme.com]}}\n    period: day\n    limit: {{tokens: {FRANK_LIMIT}}}\n{SERVICE}"
            ),
            ..Live::default()
        },
    )
    .await;
    gw.until(&env.admin_token(), "prov-a", "haiku-model").await;
    let frank = env.issuer.mint(json!({
        "aud": "api://halos", "sub": "u-frank", "email": "frank@acme.com",
        "email_verified": true, "groups": ["engineering"],
    }));
    let service = budget_service(&gw);
    let started = Instant::now();
    let calls: Vec<_> = (0..CALLS)
        .map(|_| {
            let frank = frank.clone();
            let port = gw.port;
            tokio::spawn(async move { call(port, &frank).await.0 })
        })
        .collect();
    let mut statuses = Vec::new();
    for c in calls {
        statuses.push(c.await.expect("a call"));
    }
    let took = started.elapsed();
    let served = statuses.iter().filter(|s| **s == 200).count() as u64;
    let refused = statuses.iter().filter(|s| **s == 429).count();
    until("every served call's spend", || {
        service.metrics.spent_tokens() == served * USAGE_TOKENS
    })
    .await;
    let count = service.metrics.spent_tokens();
    println!(
        "budgets overshoot ({} filter): {CALLS} concurrent calls of {USAGE_TOKENS} tokens against a {FRANK_LIMIT}-token budget: {served} served, {refused} refused (429), count {count} = {:.1}x the limit, in {took:?}",
        if halo_testkit::filter_is_native() {
            "native"
        } else {
            "wasm"
        },
        count as f64 / FRANK_LIMIT as f64
    );
    // How long Envoy waited for the budget service (every check and every stream-done
    // spend, the burst included): what the default `timeoutMs` must cover. Histograms
    // show after Envoy's stats flush (5 s).
    let times = || {
        gw.envoy
            .admin("/stats?filter=cluster\\.halo-budget\\.upstream_rq_time")
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while times().contains("No recorded values") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "budget service calls as Envoy timed them (ms):\n{}",
        times().trim()
    );
    assert_eq!(served as usize + refused, CALLS, "{statuses:?}");
    assert!(count >= FRANK_LIMIT, "fifty calls reach a ten-call budget");
}
