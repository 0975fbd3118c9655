//! halo-server hosting xDS (`--xds-listen`) against a live Envoy booted from envoy/ads.yaml
//! alone: policy-dir edits are pushed (bounded poll), an invalid edit keeps the old policy
//! served and shows in /xds/status, and a kill accepted by the API reaches the filter by
//! push (its poll interval is an hour, so only the push can explain the change).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::gateway::{LiveGateway, ask, start_live, write_gateway};
use support::{Env, serve};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halo_server_pushes_policy_edits_and_kills_to_a_live_envoy() {
    let env = Env::new().await;
    let policy = env.path("policy");
    let live = start_live(&env, env.settings()).await;
    let LiveGateway {
        server,
        envoy,
        port: listen_port,
        client,
        a,
        b,
    } = &live;
    let listen_port = *listen_port;
    let user = env.user_token();

    // The toggle (default on) routes haiku to prov-b through the filter.
    live.until(&user, "prov-b", "haiku-on-b").await;

    // jwt_authn fetches the keys from the discovery document's jwks_uri, not from the
    // <issuer>/.well-known/jwks.json default (pushed once discovered: bounded wait).
    let keys = format!("\"uri\": \"{}/keys\"", env.issuer.issuer);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let dump = tokio::task::block_in_place(|| envoy.admin("/config_dump"));
        if dump.contains(&keys) && !dump.contains(".well-known/jwks.json") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the discovered JWKS URL never reached Envoy; jwt_authn as pushed: {:?}",
            dump.lines()
                .filter(|l| l.contains("\"uri\""))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // A kill accepted by the API reaches the filter by push: back to the gateway route.
    let r = server
        .post(
            "/api/v1/toggles/haiku-b/kill",
            Some(&env.admin_token()),
            json!({"reason": "test"}),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let kill = live.until(&user, "prov-a", "haiku-model").await;
    let r = server
        .post(
            "/api/v1/toggles/haiku-b/unkill",
            Some(&env.admin_token()),
            json!({"reason": "fixed"}),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let unkill = live.until(&user, "prov-b", "haiku-on-b").await;

    // A policy edit is pushed: the toggle goes, haiku's gateway route moves to prov-b.
    std::fs::remove_file(policy.join("toggles/haiku-b.yaml")).expect("rm toggle");
    write_gateway(&env, a, b, "prov-b");
    let edit = live.until(&user, "prov-b", "haiku-model").await;
    eprintln!(
        "kill reached routing in {kill:?}, unkill in {unkill:?}, the policy edit in {edit:?}"
    );

    // An invalid edit (unknown upstream) is refused; the old policy keeps serving.
    write_gateway(&env, a, b, "no-such-upstream");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let st = server
            .running
            .as_ref()
            .and_then(|r| r.xds.as_ref())
            .expect("xds")
            .status();
        if st["source"]["rejected"].as_u64().unwrap_or(0) >= 1 {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the invalid edit was never refused: {st}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert!(
        status["source"]["lastRejection"]
            .to_string()
            .contains("no-such-upstream"),
        "{status}"
    );
    let v = ask(client, listen_port, &user).await.expect("still served");
    assert_eq!(
        (v["provider"].as_str(), v["model"].as_str()),
        (Some("prov-b"), Some("haiku-model"))
    );
}

/// The value of the Prometheus sample whose name and labels are exactly `series`.
fn sample(text: &str, series: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok()).flatten()
    })
}

/// The version label of `halo_policy_served_info`.
fn served_version(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix("halo_policy_served_info{version=\"")?;
        Some(rest.split('"').next()?.to_string())
    })
}

const ACCEPTED: &str = "halo_policy_reloads_total{outcome=\"accepted\"}";
const REFUSED: &str = "halo_policy_reloads_total{outcome=\"refused\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_policy_edit_is_counted_on_metrics_and_the_old_version_keeps_serving() {
    let env = Env::new().await;
    let policy = env.path("policy");
    let mut settings = env.settings_without_kill_switch();
    settings.xds_listen = Some("127.0.0.1:0".parse().expect("addr"));
    let server = serve(&settings).await;
    let xds = server
        .running
        .as_ref()
        .and_then(|r| r.xds.clone())
        .expect("xds on");
    let scrape = || async {
        let r = server
            .http
            .get(format!("{}/metrics", server.admin_base))
            .send()
            .await
            .expect("GET /metrics");
        assert_eq!(r.status(), 200);
        r.text().await.expect("metrics text")
    };
    // Scrape until `done` holds (bounded: the source polls the dir every 250 ms).
    let until = |what: &'static str, done: fn(&str) -> bool| {
        let scrape = &scrape;
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let text = scrape().await;
                if done(&text) {
                    return text;
                }
                assert!(Instant::now() < deadline, "never {what}:\n{text}");
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
    };

    // JWKS discovery runs after the first push and pushes once more (a new settings
    // hash in the snapshot version): wait for it before taking the version that must stay.
    let deadline = Instant::now() + Duration::from_secs(20);
    while xds.status()["source"]["discoveredJwksUri"].is_null() {
        assert!(
            Instant::now() < deadline,
            "the discovered JWKS URL was never pushed: {}",
            xds.status()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        xds.status()["source"]["discoveredJwksUri"],
        format!("{}/keys", env.issuer.issuer)
    );

    let text = scrape().await;
    assert_eq!(sample(&text, ACCEPTED), Some(1), "{text}");
    assert_eq!(sample(&text, REFUSED), Some(0), "{text}");
    assert_eq!(sample(&text, "halo_policy_refused_pending"), Some(0));
    // The ADS server's counters are on the same page (NACKs included).
    assert_eq!(sample(&text, "halo_xds_nacks_total"), Some(0), "{text}");
    let old = served_version(&text).expect("served version");
    let cache_version = xds
        .cache
        .version_for("any-node")
        .expect("a snapshot is set");
    assert!(
        cache_version.starts_with(&old[..16]),
        "{cache_version} vs {old}"
    );

    // An invalid edit (an unknown field) is refused: the counter moves, the version stays.
    std::fs::write(
        policy.join("toggles/broken.yaml"),
        "apiVersion: halos.dev/v1\nkind: Toggle\nname: broken\nowner: a@acme.com\nexpires: 2099-01-01\ndefault: false\naxis: client\nsurprise: 1\n",
    )
    .expect("write broken toggle");
    let text = until("refused the edit", |t| sample(t, REFUSED) == Some(1)).await;
    assert_eq!(served_version(&text).as_deref(), Some(old.as_str()));
    assert_eq!(sample(&text, "halo_policy_refused_pending"), Some(1));
    assert_eq!(sample(&text, ACCEPTED), Some(1));
    assert_eq!(
        xds.cache.version_for("any-node"),
        Some(cache_version.clone())
    );
    assert!(
        xds.status()["source"]["lastRejection"]
            .to_string()
            .contains("surprise"),
        "{}",
        xds.status()
    );

    // Reverted: nothing pending, still the same version, no second refusal.
    std::fs::remove_file(policy.join("toggles/broken.yaml")).expect("rm broken toggle");
    let text = until("cleared the pending refusal", |t| {
        sample(t, "halo_policy_refused_pending") == Some(0)
    })
    .await;
    assert_eq!(sample(&text, REFUSED), Some(1));
    assert_eq!(served_version(&text).as_deref(), Some(old.as_str()));

    // A valid edit is accepted and served under a new version.
    let gateway = policy.join("gateway.yaml");
    let yaml = std::fs::read_to_string(&gateway).expect("gateway.yaml");
    std::fs::write(
        &gateway,
        yaml.replace("timeoutSeconds: 20", "timeoutSeconds: 25"),
    )
    .expect("edit gateway.yaml");
    let text = until("accepted the valid edit", |t| {
        sample(t, ACCEPTED) == Some(2)
    })
    .await;
    let new = served_version(&text).expect("served version");
    assert_ne!(new, old);
    assert_eq!(sample(&text, REFUSED), Some(1));
}
