//! The signed kill list through a real Envoy: polled with dispatch_http_call, verified with
//! halo-policy, shared across workers, last list kept on failure.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use halo_e2e::*;
use halo_testkit::wait_until;
use serde_json::{Value, json};

/// Bound for "within one poll" (interval 1 s here) plus Envoy scheduling slack.
const POLL_BOUND: Duration = Duration::from_secs(10);

fn msg(model: &str) -> Value {
    json!({"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
}

struct Setup {
    issuer: Issuer,
    kill: KillServer,
    _p: Providers,
    gw: Gateway,
    /// A user in the canary arm of sonnet-canary.
    canary_user: String,
}

async fn setup_with(pubkey: Option<String>, concurrency: u32) -> Setup {
    let issuer = Issuer::start().await;
    let p = Providers::start().await;
    let kill = KillServer::start().await;
    kill.go_down();
    let snap = test_snapshot(&issuer.url, &p);
    let canary_user = (0..10_000)
        .map(|i| format!("cand{i}@acme.test"))
        .find(|u| {
            let e = snap.experiment("sonnet-canary").expect("experiment");
            halo_policy::decide::assigned_variant(e, u) == Some(1)
        })
        .expect("a canary user");
    let gw = Gateway::start(
        snap,
        GatewayOptions {
            settings: json!({"killSwitch": {
                "token": KILL_TOKEN,
                "pubkey": pubkey.unwrap_or_else(|| kill.pubkey_pem()),
                "intervalSeconds": 1,
            }}),
            killswitch_url: Some(kill.url.clone()),
            concurrency,
            ..GatewayOptions::default()
        },
    );
    Setup {
        issuer,
        kill,
        _p: p,
        gw,
        canary_user,
    }
}

impl Setup {
    /// (model the provider saw, x-halo-experiment the provider saw) for `user` asking
    /// `alias`, over a fresh connection (so any worker may take it).
    async fn route(&self, user: &str, groups: &[&str], alias: &str) -> (String, Option<String>) {
        let token = bearer(&self.issuer.token(user, groups));
        let client = client_builder().build().expect("client");
        let resp = client
            .post(format!("{}/v1/messages", self.gw.base))
            .header("authorization", token)
            .body(msg(alias).to_string())
            .send()
            .await
            .expect("request");
        assert_eq!(resp.status().as_u16(), 200);
        let provider = resp
            .headers()
            .get("x-provider")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body: Value =
            serde_json::from_slice(&resp.bytes().await.expect("body")).unwrap_or(Value::Null);
        let all = [&self._p.a, &self._p.b];
        let seen = all
            .iter()
            .find(|p| p.name == provider)
            .and_then(|p| p.seen().pop())
            .expect("the provider saw it");
        (
            body["model"].as_str().unwrap_or("").to_string(),
            seen.header("x-halo-experiment").map(String::from),
        )
    }

    async fn sonnet(&self) -> (String, Option<String>) {
        let user = self.canary_user.clone();
        self.route(&user, &[], "sonnet").await
    }

    fn outcome(&self, outcome: &str) -> u64 {
        self.gw.prometheus_sum(&format!(
            "halo_killswitch_fetch{{halo_outcome=\"{outcome}\"}}"
        ))
    }

    async fn wait_sonnet(&self, model: &str) {
        let deadline = std::time::Instant::now() + POLL_BOUND;
        loop {
            if self.sonnet().await.0 == model {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "sonnet never routed to {model}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

const CANARY: &str = "sonnet-canary-model";
const CONTROL: &str = "claude-sonnet-4-5-20250929";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_experiment_and_toggle_within_one_poll_and_unkill_restores() {
    let s = setup_with(None, 1).await;
    // Never fetched (server down): nothing is killed.
    assert_eq!(
        s.sonnet().await,
        (CANARY.to_string(), Some("sonnet-canary".to_string()))
    );
    assert_eq!(
        s.route("dana@acme.test", &["ds"], "haiku").await.0,
        "haiku-b-model"
    );

    s.kill.serve_kills(&["sonnet-canary"], &["haiku-b"]);
    s.wait_sonnet(CONTROL).await;
    // Killed: control routing and no experiment headers.
    assert_eq!(s.sonnet().await, (CONTROL.to_string(), None));
    assert_eq!(
        s.route("dana@acme.test", &["ds"], "haiku").await.0,
        "claude-haiku-4-5"
    );

    s.kill.serve_kills(&[], &[]);
    s.wait_sonnet(CANARY).await;
    assert_eq!(s.sonnet().await.1.as_deref(), Some("sonnet-canary"));
    assert_eq!(
        s.route("dana@acme.test", &["ds"], "haiku").await.0,
        "haiku-b-model"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_future_and_replayed_envelopes_are_refused() {
    let s = setup_with(None, 1).await;
    s.kill.serve(s.kill.envelope(&["sonnet-canary"], &[], -660));
    wait_until("a stale refusal", POLL_BOUND, || {
        (s.outcome("stale") > 0).then_some(())
    });
    assert_eq!(s.sonnet().await.0, CANARY, "stale list refused");

    s.kill.serve(s.kill.envelope(&["sonnet-canary"], &[], 300));
    wait_until("a future refusal", POLL_BOUND, || {
        (s.outcome("future") > 0).then_some(())
    });
    assert_eq!(s.sonnet().await.0, CANARY, "future list refused");

    // Accept a kill, then replay an older (validly signed) list that un-kills.
    let older = s.kill.envelope(&[], &[], -30);
    s.kill.serve_kills(&["sonnet-canary"], &[]);
    s.wait_sonnet(CONTROL).await;
    s.kill.serve(older);
    wait_until("a replay refusal", POLL_BOUND, || {
        (s.outcome("replayed") > 0).then_some(())
    });
    assert_eq!(s.sonnet().await.0, CONTROL, "replayed list refused");

    // A list signed by another key is refused too.
    let other = ed25519_dalek::SigningKey::from_bytes(&[0x44; 32]);
    let payload = halo_policy::killswitch::KillPayload {
        version: 99,
        experiments: Default::default(),
        toggles: Default::default(),
        issued_at: time::OffsetDateTime::now_utc(),
    };
    s.kill
        .serve(halo_policy::killswitch::sign(&payload, &other).expect("sign"));
    wait_until("a signature refusal", POLL_BOUND, || {
        (s.outcome("bad_signature") > 0).then_some(())
    });
    assert_eq!(s.sonnet().await.0, CONTROL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_going_down_keeps_the_last_list() {
    let s = setup_with(None, 1).await;
    s.kill.serve_kills(&["sonnet-canary"], &[]);
    s.wait_sonnet(CONTROL).await;
    let before = s.outcome("http_error");
    s.kill.go_down();
    wait_until("failed polls", POLL_BOUND, || {
        (s.outcome("http_error") >= before + 2).then_some(())
    });
    assert_eq!(s.sonnet().await, (CONTROL.to_string(), None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_is_shared_across_worker_vms() {
    let s = setup_with(None, 2).await;
    s.kill.serve_kills(&["sonnet-canary"], &[]);
    s.wait_sonnet(CONTROL).await;
    // Within one tick every worker holds it: twenty fresh connections all see the kill.
    let deadline = std::time::Instant::now() + POLL_BOUND;
    'outer: loop {
        for _ in 0..20 {
            if s.sonnet().await.0 != CONTROL {
                assert!(
                    std::time::Instant::now() < deadline,
                    "a worker never adopted the list"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue 'outer;
            }
        }
        break;
    }
    // One poll per interval for the whole Envoy, not one per worker.
    let accepted = s.outcome("accepted");
    assert_eq!(accepted, 1, "one worker accepted, the other adopted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_key_keeps_traffic_flowing_with_the_header() {
    let s = setup_with(
        Some("-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n".into()),
        1,
    )
    .await;
    s.kill.serve_kills(&["sonnet-canary"], &[]);
    let token = bearer(&s.issuer.token(&s.canary_user, &[]));
    let a =
        s.gw.post(
            "/v1/messages",
            &[("authorization", &token), ("x-halo-killswitch", "ok")],
            &msg("sonnet"),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text());
    // Unkilled (the list cannot be verified) and flagged, with the client's copy gone.
    assert_eq!(a.json()["model"], CANARY);
    let seen = s._p.b.seen().pop().expect("routed");
    let flags: Vec<_> = seen
        .headers
        .iter()
        .filter(|(n, _)| n == "x-halo-killswitch")
        .collect();
    assert_eq!(flags.len(), 1, "{flags:?}");
    assert_eq!(flags[0].1, "misconfigured");
}
