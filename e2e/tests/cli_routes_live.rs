//! `halo gateway routes` agrees with a live Envoy (halo-xds, envoy/ads.yaml alone, the
//! halo filter): for each user and session, the target the table marks "hit when
//! healthy" for a weighted alias is the one the gateway actually sends the request to.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use halo_e2e::{Gateway, Issuer, Providers, bearer, client_builder};
use halo_testkit::envoy::Envoy;
use halo_testkit::{free_port, workspace_root};
use halo_xds::{GatewaySettings, NodeKey, SnapshotCache, snapshot_of};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_halo-e2e-cli");
/// The policy's issuer (the guardrail wants https); the fake's JWKS is given to Envoy as
/// jwksUri and its tokens carry this `iss`.
const ISSUER: &str = "https://issuer.acme.test";

fn token(issuer: &Issuer, user: &str) -> String {
    let mut claims = issuer.claims(user, &[]);
    claims["iss"] = json!(ISSUER);
    bearer(&issuer.mint(&claims))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let dest = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).expect("copy");
        }
    }
}

/// acme-corp's identity and profiles, with a Gateway whose upstreams are the fakes and
/// no experiments, toggles or rollouts (so the weighted pick alone decides).
fn policy_dir(dir: &Path, issuer: &str, p: &Providers) {
    copy_dir(&workspace_root().join("examples/acme-corp"), dir);
    for sub in ["experiments", "toggles", "rollouts"] {
        let _ = std::fs::remove_dir_all(dir.join(sub));
    }
    let root = dir.join("halos.yaml");
    let text = std::fs::read_to_string(&root)
        .expect("halos.yaml")
        .replace("https://acme.okta.com/oauth2/aus9halos2acme7corp", issuer);
    std::fs::write(&root, text).expect("write halos.yaml");
    let one = |alias: &str| format!("  {alias}: {{targets: [{{upstream: prov-a, model: m}}]}}\n");
    let mut gw = format!(
        "apiVersion: halos.dev/v1\nkind: Gateway\nbaseURL: https://gw.test\n\
         protocols: {{claude-code: anthropic-messages, codex: openai-responses, gemini-cli: gemini}}\n\
         upstreams:\n  prov-a: {{url: \"{}\", kind: anthropic}}\n  prov-b: {{url: \"{}\", kind: anthropic}}\n\
         models:\n  weighted:\n    targets:\n      - {{upstream: prov-a, model: model-a, weight: 70}}\n      - {{upstream: prov-b, model: model-b, weight: 30}}\n",
        p.a.url, p.b.url
    );
    for alias in ["default", "sonnet", "opus", "haiku", "gpt", "gemini-pro"] {
        gw.push_str(&one(alias));
    }
    std::fs::write(dir.join("gateway.yaml"), gw).expect("write gateway.yaml");
}

/// The upstream `halo gateway routes` marks as hit when healthy for `alias`.
fn cli_first_pick(dir: &Path, user: &str, session: &str, alias: &str) -> String {
    let out = Command::new(BIN)
        .args(["gateway", "routes", "--policy-dir"])
        .arg(dir)
        .args(["--user", user, "--session", session])
        .output()
        .expect("run halo");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(alias) && l.contains("hit when healthy"))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap_or_else(|| panic!("no first pick for {alias} in:\n{text}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_routes_agrees_with_the_live_envoy_for_each_user_and_session() {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("policy");
    policy_dir(&dir, ISSUER, &p);
    let snap = halo_xds::source::load_policy(&dir).unwrap_or_else(|e| panic!("{e:#?}"));

    let port = free_port();
    let settings = GatewaySettings {
        listen_address: "127.0.0.1".into(),
        listen_port: port,
        wasm_path: halo_testkit::filter_module().display().to_string(),
        jwks_uri: Some(format!("{}/.well-known/jwks.json", issuer.url)),
        ..GatewaySettings::default()
    };
    let cache = SnapshotCache::new();
    cache.set(
        NodeKey::Default,
        snapshot_of(&snap, &settings).expect("translate"),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let ads_port = listener.local_addr().expect("addr").port();
    tokio::spawn(halo_xds::serve(listener, cache.clone()));
    let admin = free_port();
    let yaml =
        halo_envoy_config::ads::AdsBootstrap::loopback("halo-gateway", ads_port, admin).render();
    let envoy = tokio::task::block_in_place(|| Envoy::start(&yaml, admin));
    let gw = Gateway {
        envoy,
        port,
        base: format!("http://127.0.0.1:{port}"),
        snapshot: snap,
        client: client_builder()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("client"),
    };
    let body = json!({"model": "weighted", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    // Wait for the listener (bounded).
    let warm = token(&issuer, "warm@acme.com");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while gw
        .client
        .post(format!("{}/v1/messages", gw.base))
        .header("authorization", &warm)
        .json(&body)
        .send()
        .await
        .map(|r| r.status() != 200)
        .unwrap_or(true)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "listener never served:\n{}",
            gw.envoy.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut seen = std::collections::BTreeSet::new();
    for n in 0..24 {
        let user = format!("dev{n}@acme.com");
        let session = format!("session-{n}");
        let expected = cli_first_pick(&dir, &user, &session, "weighted");
        let token = token(&issuer, &user);
        let a = gw
            .post(
                "/v1/messages",
                &[
                    ("authorization", &token),
                    ("x-claude-code-session-id", &session),
                ],
                &body,
            )
            .await;
        assert_eq!(a.status, 200, "{}", a.text());
        assert_eq!(
            a.json()["provider"].as_str(),
            Some(expected.as_str()),
            "{user} {session}"
        );
        seen.insert(expected);
    }
    assert_eq!(seen.len(), 2, "both targets picked for some user: {seen:?}");
}
