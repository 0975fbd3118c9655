//! Shadow experiments through a real Envoy (issue #24): the filter builds a job for each
//! eligible step of an enrolled caller and hands it to Envoy as a callout to the mirror
//! service's cluster, and the live call never waits for it. One Envoy for the binary
//! (the build under test: `HALO_FILTER=native` runs the native one).
//!
//! The mirror service here is a recording endpoint speaking the `POST /mirror` wire (the
//! envelope of halo-filter-core's `shadow`), so each test can see exactly what left the
//! gateway and can make the service slow, failing or gone.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use halo_e2e::shadow::{ARRIVAL, Mirror, Mode, SHADOW_TOKEN};
use halo_e2e::*;
use halo_policy::Snapshot;
use serde_json::{Value, json};

/// The test policy plus three shadow experiments, each on its own alias whose live target
/// is prov-a: `sh-first` (turns: first), `sh-all` (turns: all), `sh-killed` (killed by the
/// kill list from the start). Every variant weight is on the treatment, so every caller
/// in the rings is mirrored.
fn snapshot(issuer: &str, p: &Providers) -> Snapshot {
    let mut snap = test_snapshot(issuer, p);
    for (name, alias, turns) in [
        ("sh-first", "sh1", "first"),
        ("sh-all", "sh2", "all"),
        ("sh-killed", "sh3", "all"),
    ] {
        snap = halo_e2e::shadow::with_experiment(snap, name, alias, turns);
    }
    snap
}

struct Setup {
    issuer: Issuer,
    providers: Providers,
    mirror: Mirror,
    _kill: KillServer,
    gw: Gateway,
}

async fn setup() -> Setup {
    let issuer = Issuer::start().await;
    let providers = Providers::start().await;
    let mirror = Mirror::start().await;
    let kill = KillServer::start().await;
    kill.serve_kills(&["sh-killed"], &[]);
    let gw = Gateway::start(
        snapshot(&issuer.url, &providers),
        GatewayOptions {
            settings: json!({
                "killSwitch": {"token": KILL_TOKEN, "pubkey": kill.pubkey_pem(), "intervalSeconds": 1},
                // A service that took 20 s to take a job would hold a live call that
                // waited for it 20 s: the bound below sees it.
                "shadow": {"token": SHADOW_TOKEN, "maxBytes": 64 * 1024, "timeoutMs": 20_000},
            }),
            killswitch_url: Some(kill.url.clone()),
            shadow_url: Some(mirror.url.clone()),
            ..GatewayOptions::default()
        },
    );
    let s = Setup {
        issuer,
        providers,
        mirror,
        _kill: kill,
        gw,
    };
    // The kill list is in force once a killed experiment's call goes to control.
    let deadline = Instant::now() + ARRIVAL;
    while series(&s.gw, "halo_killswitch_fetch{halo_outcome=\"accepted\"}") == 0 {
        assert!(
            Instant::now() < deadline,
            "the kill list was never accepted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s
}

impl Setup {
    fn token(&self) -> String {
        bearer(&self.issuer.token("alice@acme.test", &[]))
    }

    /// A Claude Code call for `alias` from alice with every header a job must not carry.
    async fn call(&self, body: &Value) -> (Answer, Duration) {
        let token = self.token();
        let started = Instant::now();
        let answer = self
            .gw
            .post(
                "/v1/messages",
                &[
                    ("authorization", token.as_str()),
                    ("x-api-key", "client-key-do-not-forward"),
                    ("cookie", "sid=cookie-do-not-forward"),
                    ("x-claude-code-session-id", "session-do-not-forward"),
                    ("x-halo-experiment", "forged-do-not-forward"),
                    ("anthropic-version", "2023-06-01"),
                    ("content-type", "application/json"),
                ],
                body,
            )
            .await;
        (answer, started.elapsed())
    }
}

fn first_turn(alias: &str, marker: &str) -> Value {
    json!({"model": alias, "max_tokens": 5, "messages": [{"role": "user", "content": marker}]})
}

fn later_turn(alias: &str, marker: &str) -> Value {
    json!({"model": alias, "max_tokens": 5, "messages": [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": marker}]})
}

fn series(gw: &Gateway, name: &str) -> u64 {
    gw.filter_series()
        .iter()
        .filter(|(k, _)| k.starts_with(name))
        .map(|(_, v)| v)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_jobs_through_envoy() {
    let s = setup().await;

    // 1. A first turn of an enrolled caller is mirrored once, as the treatment's target
    //    must receive it, with none of the client's credentials or identity.
    let (answer, _) = s.call(&first_turn("sh1", "marker-first-1")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        answer.json()["model"],
        "sh1-live",
        "the live call is control's"
    );
    let job = s.mirror.wait_for("marker-first-1").await;
    assert_eq!(
        job.authorization.as_deref(),
        Some(format!("Bearer {SHADOW_TOKEN}").as_str())
    );
    let e = &job.envelope;
    assert_eq!(e["experiment"], "sh-first");
    assert_eq!(e["variant"], "treatment");
    assert_eq!(e["upstream"], "prov-b");
    assert_eq!(e["model"], "sh1-treatment");
    assert_eq!(e["body"]["model"], "sh1-treatment");
    assert_eq!(e["path"], "/v1/messages");
    assert_eq!(
        e["headers"],
        json!([
            ["anthropic-version", "2023-06-01"],
            ["content-type", "application/json"],
            ["accept", "*/*"]
        ])
    );
    let text = e.to_string();
    for never in ["do-not-forward", "alice@acme.test", "Bearer ey"] {
        assert!(!text.contains(never), "{never} in a job: {text}");
    }
    // The treatment's provider is not called by the gateway itself: the job is the
    // mirror service's to send.
    assert!(
        s.providers
            .b
            .seen()
            .iter()
            .all(|r| r.json()["model"] != "sh1-treatment")
    );

    // 2. A later turn is not mirrored with turns: first (a first turn sent after it
    //    arrives, so the later one would have too), and is with turns: all.
    s.call(&later_turn("sh1", "marker-later-1")).await;
    s.call(&first_turn("sh1", "marker-first-2")).await;
    s.mirror.wait_for("marker-first-2").await;
    assert!(s.mirror.with_marker("marker-later-1").is_empty());
    s.call(&later_turn("sh2", "marker-later-all")).await;
    let job = s.mirror.wait_for("marker-later-all").await;
    assert_eq!(job.envelope["experiment"], "sh-all");
    assert_eq!(job.envelope["body"]["messages"][1]["role"], "assistant");
    assert_eq!(
        s.mirror.with_marker("marker-first-1").len(),
        1,
        "mirrored once"
    );

    // 3. A killed shadow experiment mirrors nothing. The list is accepted by one VM's
    //    poll and adopted by the others on their next tick: a round is a killed call
    //    then a mirrored one (which arrives after it would have); once a round shows the
    //    kill in force, later killed calls stay unmirrored.
    let deadline = Instant::now() + ARRIVAL;
    for round in 0.. {
        s.call(&first_turn("sh3", &format!("marker-killed-{round}")))
            .await;
        s.call(&first_turn("sh1", &format!("marker-after-killed-{round}")))
            .await;
        s.mirror
            .wait_for(&format!("marker-after-killed-{round}"))
            .await;
        if s.mirror
            .with_marker(&format!("marker-killed-{round}"))
            .is_empty()
        {
            break;
        }
        assert!(Instant::now() < deadline, "the kill never took effect");
    }
    for i in 0..3 {
        s.call(&first_turn("sh3", &format!("marker-still-killed-{i}")))
            .await;
    }
    s.call(&first_turn("sh1", "marker-after-still-killed"))
        .await;
    s.mirror.wait_for("marker-after-still-killed").await;
    assert!(s.mirror.with_marker("marker-still-killed").is_empty());

    // 4. Over maxBytes: not mirrored, counted; the call is served.
    let big = "x".repeat(70 * 1024);
    let (answer, _) = s
        .call(&first_turn("sh1", &format!("marker-big{big}")))
        .await;
    assert_eq!(answer.status, 200);
    assert!(series(&s.gw, "halo_shadow_jobs{halo_outcome=\"too_large\"}") >= 1);

    // 5. A job outlives its live call: the service takes 500 ms to acknowledge a job, the
    //    provider answers at once, so each live call ends first; every job is still
    //    delivered and acknowledged (Envoy cancels a stream's own callouts when the
    //    stream ends: the native module's jobs were lost so).
    let acked = || {
        s.gw.envoy
            .stat("cluster.halo-shadow.upstream_rq_2xx")
            .unwrap_or(0)
    };
    let before = acked();
    s.mirror.set(Mode::Slow(Duration::from_millis(500)));
    for i in 0..5 {
        let (answer, _) = s
            .call(&first_turn("sh1", &format!("marker-outlives-{i}")))
            .await;
        assert_eq!(answer.status, 200);
    }
    let deadline = Instant::now() + ARRIVAL;
    while acked() < before + 5 {
        assert!(
            Instant::now() < deadline,
            "{} of 5 jobs acknowledged after their live calls ended",
            acked() - before
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.mirror.set(Mode::Take);

    // 6. The live call's answer is the same bytes and on time whatever the mirror
    //    service does: taking, slow (10 s), failing (500), stopped.
    let reference = |marker: &str| first_turn("sh1", marker);
    let (baseline, baseline_time) = s.call(&reference("marker-ref")).await;
    s.mirror.wait_for("marker-ref").await;
    let bound = baseline_time + Duration::from_secs(2);
    let check = |(answer, took): (Answer, Duration), what: &str| {
        assert_eq!(answer.status, baseline.status, "{what}");
        // The provider echoes the model and path: byte-identical to the reference call.
        assert_eq!(answer.body, baseline.body, "{what}: the answer changed");
        assert!(
            took < bound,
            "{what}: the live call took {took:?} (reference {baseline_time:?})"
        );
    };
    s.mirror.set(Mode::Slow(Duration::from_secs(10)));
    for i in 0..3 {
        check(
            s.call(&reference("marker-ref")).await,
            &format!("slow mirror, call {i}"),
        );
    }
    s.mirror.set(Mode::Fail);
    check(s.call(&reference("marker-ref")).await, "failing mirror");
    s.mirror.stop();
    check(s.call(&reference("marker-ref")).await, "stopped mirror");

    // Counted: jobs built and handed over, in the filter's series; their fate in Envoy's
    // own stats of the mirror service's cluster. Requests started, not completed: the
    // native module's callouts end with their stream (a job the service already holds
    // is then counted as a reset, not a completion).
    assert!(series(&s.gw, "halo_shadow_jobs{halo_outcome=\"sent\"}") >= 4);
    assert!(series(&s.gw, "halo_shadow_jobs{halo_outcome=\"later_turn\"}") >= 1);
    assert!(
        s.gw.prometheus_sum("envoy_cluster_upstream_rq_total{envoy_cluster_name=\"halo-shadow\"}")
            >= 4
    );
}

/// acme-corp's `gpt-shadow` end to end, with halo-server as the mirror service: Envoy fed
/// over xDS by halo-server (which fills the mirror service's URL and token into the
/// gateway settings it serves: the gateway file names neither), a
/// Codex call of a caller the experiment samples is answered by control's target, and
/// halo-server sends the copy to the treatment's target (`gpt-5.1-codex`) and records
/// its answer as evidence for the `gpt-5-1` variant, source `shadow`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acme_corps_gpt_shadow_is_mirrored_by_halo_server_and_recorded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy");
    halo_testkit::copy_dir(
        &halo_testkit::workspace_root().join("examples/acme-corp"),
        &policy,
    );
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("data dir");
    let token_file = dir.path().join("shadow.token");
    std::fs::write(&token_file, SHADOW_TOKEN).expect("token file");
    let issuer = Issuer::start().await;
    let wire = halo_testkit::provider::WireProvider::start(true)
        .await
        .expect("wire provider");
    // The policy as written (https upstreams, Okta), pointed at this test's fakes after
    // validation; openai's key is a file (the others' dropped: the fakes take no key).
    let key_file = dir.path().join("openai.key");
    std::fs::write(&key_file, "sk-openai-gateway-key\n").expect("key file");
    let key_path = key_file.display().to_string();
    let (iss, url) = (issuer.url.clone(), wire.url());
    let loopback: halo_xds::source::Transform = Arc::new(move |mut snap: halo_policy::Snapshot| {
        if let Some(id) = snap.identity.as_mut() {
            id.issuer = iss.clone();
        }
        for (name, u) in snap.upstreams.iter_mut() {
            u.url = url.clone();
            u.credential = (name == "openai").then(|| halo_policy::types::Credential {
                env: None,
                file: Some(key_path.clone()),
            });
        }
        snap
    });
    // The gateway file names neither the mirror service nor its token: halo-server fills
    // both in from --shadow-listen and --shadow-token-file. Its credential settings apply
    // to the mirrored copy as to the gateway's own attempts: the loopback fake may
    // receive keys (upstreamHosts), and openai's attempts carry an operator header.
    let listen_port = halo_testkit::free_port();
    let gateway_file = dir.path().join("xds-gateway.yaml");
    std::fs::write(
        &gateway_file,
        format!(
            "listenAddress: 127.0.0.1\nlistenPort: {listen_port}\nwasmPath: {}\n\
             upstreamHosts: [127.0.0.1]\n\
             upstreamHeaders: {{openai: {{x-acme-org: acme-shadow}}}}\n",
            halo_testkit::filter_module().display()
        ),
    )
    .expect("gateway file");
    let settings = halo_server::config::Settings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        admin_listen: "127.0.0.1:0".parse().expect("addr"),
        policy_dir: policy,
        data_dir: Some(data.clone()),
        killswitch_key_file: None,
        gateway_token_file: None,
        token_file: None,
        device_ttl: Duration::from_secs(3600),
        enrollment_ttl: Duration::from_secs(3600),
        oidc_ca_file: None,
        max_body_bytes: 4096,
        xds_listen: Some("127.0.0.1:0".parse().expect("addr")),
        xds_gateway_file: Some(gateway_file),
        evidence: Default::default(),
        budget: Default::default(),
        shadow: halo_server::shadow::ShadowSettings {
            listen: Some("127.0.0.1:0".parse().expect("addr")),
            token_file: Some(token_file),
            ..Default::default()
        },
        console_url: None,
        controller: Default::default(),
    };
    let server = halo_server::server::start_with(
        &settings,
        halo_server::xds::XdsOptions {
            gateway: None,
            transform: Some(loopback.clone()),
        },
    )
    .await
    .expect("halo-server starts");
    let ads = server.xds.as_ref().expect("xDS host").addr.port();
    let snap =
        loopback(halo_xds::source::load_policy(&settings.policy_dir).expect("acme-corp policy"));
    let gw = halo_e2e::xds::gateway_of(ads, listen_port, &snap).await;

    // A canary-ring developer (group halos-canary) the experiment samples (20%).
    let experiment = snap.experiment("gpt-shadow").expect("gpt-shadow");
    let treatment = experiment
        .variants
        .iter()
        .position(|v| v.name == "gpt-5-1")
        .expect("variant");
    let user = (0..10_000)
        .map(|i| format!("dev{i}@acme.com"))
        .find(|u| halo_policy::decide::assigned_variant(experiment, u) == Some(treatment))
        .expect("a sampled user");
    let token = bearer(&issuer.token(&user, &["halos-canary"]));
    let answer = gw
        .post(
            "/v1/responses",
            &[("authorization", token.as_str())],
            &json!({"model": "gpt", "input": "write a test"}),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());

    // Control's target answered; the treatment's got halo-server's copy.
    let deadline = Instant::now() + ARRIVAL;
    let models = loop {
        let models: Vec<String> = wire.received().iter().filter_map(|r| r.model()).collect();
        if models.iter().any(|m| m == "gpt-5.1-codex") {
            break models;
        }
        assert!(
            Instant::now() < deadline,
            "no shadow call reached the treatment; seen {models:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        models.iter().filter(|m| *m == "gpt-5-codex").count(),
        1,
        "{models:?}"
    );
    let copy = wire
        .received()
        .into_iter()
        .find(|r| r.model().as_deref() == Some("gpt-5.1-codex"))
        .expect("the copy");
    assert_eq!(copy.path, "/v1/responses");
    // The gateway's own key for openai (never the caller's token) and the operator's
    // header, as Envoy gives control's attempt.
    assert_eq!(
        copy.header("authorization"),
        Some("Bearer sk-openai-gateway-key")
    );
    assert_eq!(copy.header("x-acme-org"), Some("acme-shadow"));
    let live = wire
        .received()
        .into_iter()
        .find(|r| r.model().as_deref() == Some("gpt-5-codex"))
        .expect("the live call");
    assert_eq!(live.header("authorization"), copy.header("authorization"));
    assert_eq!(live.header("x-acme-org"), Some("acme-shadow"));

    // Recorded for the shadow variant, source shadow, with the answer's tokens.
    let store = halo_evidence::open::open_store(None, Some(&data)).expect("store");
    let query = halo_evidence::SampleQuery {
        experiment: "gpt-shadow".into(),
        metric: halo_evidence::Metric::ErrorRate,
        since_unix_ms: 0,
        until_unix_ms: i64::MAX,
    };
    let deadline = Instant::now() + ARRIVAL;
    let samples = loop {
        let samples = store.samples(&query).expect("samples");
        if !samples.is_empty() {
            break samples;
        }
        assert!(Instant::now() < deadline, "no shadow evidence recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(samples.len(), 1, "{samples:?}");
    assert_eq!(samples[0].variant, "gpt-5-1");
    assert_eq!(samples[0].source, halo_evidence::Source::Shadow);
    assert_eq!(samples[0].value, 0.0, "the treatment answered");
    let metrics = &server.shadow.as_ref().expect("shadow metrics").metrics;
    assert_eq!(metrics.jobs("recorded"), 1);
    server.shutdown().await;
}
