//! halo-server hosting xDS (`--xds-listen`) against a live Envoy booted from envoy/ads.yaml
//! alone: policy-dir edits are pushed (bounded poll), an invalid edit keeps the old policy
//! served and shows in /xds/status, and a kill accepted by the API reaches the filter by
//! push (its poll interval is an hour, so only the push can explain the change).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use halo_testkit::envoy::Envoy;
use halo_testkit::{free_port, workspace_root};
use serde_json::{Value, json};
use support::{Env, serve};

/// A loopback model provider answering `{"provider": name, "model": <body's model>}`.
fn provider(name: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind provider");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    let Ok(n) = conn.read(&mut chunk) else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let rest = &buf[end + 4..];
                    let (body, used) = if head.contains("transfer-encoding: chunked") {
                        match dechunk(rest) {
                            Some(x) => x,
                            None => continue,
                        }
                    } else {
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if rest.len() < len {
                            continue;
                        }
                        (rest[..len].to_vec(), len)
                    };
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let reply = json!({"provider": name, "model": body["model"]}).to_string();
                    let _ = write!(
                        conn,
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}",
                        reply.len()
                    );
                    buf.drain(..end + 4 + used);
                }
            });
        }
    });
    url
}

/// A whole chunked body: its bytes and how many input bytes it took; `None` if incomplete.
fn dechunk(mut input: &[u8]) -> Option<(Vec<u8>, usize)> {
    let total = input.len();
    let mut out = Vec::new();
    loop {
        let line = input.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&input[..line]).ok()?.trim(), 16).ok()?;
        input = &input[line + 2..];
        if size == 0 {
            if input.len() < 2 {
                return None;
            }
            return Some((out, total - input.len() + 2));
        }
        if input.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&input[..size]);
        input = &input[size + 2..];
    }
}

const GATEWAY: &str = r#"apiVersion: halos.dev/v1
kind: Gateway
baseURL: https://gw.test
protocols:
  claude-code: anthropic-messages
  codex: openai-responses
  gemini-cli: gemini
upstreams:
  prov-a: {url: "A", kind: anthropic}
  prov-b: {url: "B", kind: anthropic}
models:
  haiku:
    targets:
      - {upstream: HAIKU, model: haiku-model}
  # The aliases the example profiles name (kept from acme-corp).
  default: {targets: [{upstream: prov-a, model: m}]}
  sonnet: {targets: [{upstream: prov-a, model: m}]}
  opus: {targets: [{upstream: prov-a, model: m}]}
  gpt: {targets: [{upstream: prov-a, model: m}]}
  gemini-pro: {targets: [{upstream: prov-a, model: m}]}
"#;

const TOGGLE: &str = r#"apiVersion: halos.dev/v1
kind: Toggle
name: haiku-b
owner: platform-ai@acme.com
expires: 2099-03-31
default: true
axis: traffic
traffic:
  routes:
    haiku:
      targets:
        - {upstream: prov-b, model: haiku-on-b}
"#;

fn write_gateway(env: &Env, a: &str, b: &str, haiku: &str) {
    let text = GATEWAY
        .replace("\"A\"", &format!("\"{a}\""))
        .replace("\"B\"", &format!("\"{b}\""))
        .replace("HAIKU", haiku);
    halo_fsutil::write_atomic(
        &env.path("policy").join("gateway.yaml"),
        text.as_bytes(),
        0o644,
    )
    .expect("write gateway.yaml");
}

async fn ask(client: &reqwest::Client, port: u16, token: &str) -> Option<Value> {
    ask_raw(client, port, token)
        .await
        .filter(|(s, _)| *s == 200)
        .map(|(_, v)| v)
}

async fn ask_raw(client: &reqwest::Client, port: u16, token: &str) -> Option<(u16, Value)> {
    let r = client
        .post(format!("http://127.0.0.1:{port}/v1/messages"))
        .bearer_auth(token)
        .json(&json!({"model": "haiku", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.json().await.unwrap_or(Value::Null)))
}

/// Ask until the answer names `provider` and `model` (bounded); how long it took.
async fn until(
    client: &reqwest::Client,
    port: u16,
    token: &str,
    provider: &str,
    model: &str,
    envoy: &Envoy,
) -> Duration {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(20);
    loop {
        if let Some(v) = ask(client, port, token).await
            && v["provider"] == provider
            && v["model"] == model
        {
            return start.elapsed();
        }
        if Instant::now() >= deadline {
            let last = ask_raw(client, port, token).await;
            let logs = envoy.logs();
            let tail: Vec<&str> = logs.lines().rev().take(40).collect();
            panic!(
                "never routed to {provider}/{model}; last answer {last:?}; Envoy log tail:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halo_server_pushes_policy_edits_and_kills_to_a_live_envoy() {
    let env = Env::new().await;
    let policy = env.path("policy");
    for dir in ["experiments", "toggles", "rollouts"] {
        let _ = std::fs::remove_dir_all(policy.join(dir));
    }
    let (a, b) = (provider("prov-a"), provider("prov-b"));
    write_gateway(&env, &a, &b, "prov-a");
    std::fs::create_dir_all(policy.join("toggles")).expect("toggles dir");
    std::fs::write(policy.join("toggles/haiku-b.yaml"), TOGGLE).expect("toggle");
    if let Err(problems) = halo_xds::source::load_policy(&policy) {
        panic!("test policy invalid: {problems:#?}");
    }

    let listen_port = free_port();
    let gateway_file = env.path("xds-gateway.json");
    std::fs::write(
        &gateway_file,
        json!({
            "listenAddress": "127.0.0.1", "listenPort": listen_port,
            "wasmPath": halo_testkit::filter_module().display().to_string(),
            "upstreamCaFile": env.path("oidc-ca.pem").display().to_string(),
            // No jwksUri: halo-server reads the issuer's discovery document, whose
            // jwks_uri is {issuer}/keys.
            // The poll is the fallback; an hour means only the push can deliver a kill.
            "filterSettings": {"killSwitch": {"intervalSeconds": 3600}},
        })
        .to_string(),
    )
    .expect("gateway settings");
    let mut settings = env.settings();
    settings.xds_listen = Some("127.0.0.1:0".parse().expect("addr"));
    settings.xds_gateway_file = Some(gateway_file);
    let server = serve(&settings).await;
    let xds_port = server
        .running
        .as_ref()
        .and_then(|r| r.xds.as_ref())
        .expect("xds on")
        .addr
        .port();

    let admin = free_port();
    let yaml = std::fs::read_to_string(workspace_root().join("envoy/ads.yaml"))
        .expect("ads.yaml")
        .replace("port_value: 18000", &format!("port_value: {xds_port}"))
        .replace("port_value: 9901", &format!("port_value: {admin}"));
    let envoy = tokio::task::block_in_place(|| Envoy::start(&yaml, admin));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let user = env.user_token();

    // The toggle (default on) routes haiku to prov-b through the filter.
    until(&client, listen_port, &user, "prov-b", "haiku-on-b", &envoy).await;

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
    let kill = until(&client, listen_port, &user, "prov-a", "haiku-model", &envoy).await;
    let r = server
        .post(
            "/api/v1/toggles/haiku-b/unkill",
            Some(&env.admin_token()),
            json!({"reason": "fixed"}),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let unkill = until(&client, listen_port, &user, "prov-b", "haiku-on-b", &envoy).await;

    // A policy edit is pushed: the toggle goes, haiku's gateway route moves to prov-b.
    std::fs::remove_file(policy.join("toggles/haiku-b.yaml")).expect("rm toggle");
    write_gateway(&env, &a, &b, "prov-b");
    let edit = until(&client, listen_port, &user, "prov-b", "haiku-model", &envoy).await;
    eprintln!(
        "kill reached routing in {kill:?}, unkill in {unkill:?}, the policy edit in {edit:?}"
    );

    // An invalid edit (unknown upstream) is refused; the old policy keeps serving.
    write_gateway(&env, &a, &b, "no-such-upstream");
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
    let v = ask(&client, listen_port, &user)
        .await
        .expect("still served");
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
