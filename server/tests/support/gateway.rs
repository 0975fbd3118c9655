//! A live gateway for halo-server's tests: loopback model providers, a small policy (two
//! providers, a haiku alias, the `haiku-b` toggle routing it to prov-b), halo-server
//! serving it over xDS, and a real Envoy booted from envoy/ads.yaml alone. Shared by the
//! xDS tests and the console's (a kill from the browser reaching Envoy).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use halo_server::config::Settings;
use halo_testkit::envoy::Envoy;
use halo_testkit::free_port;
use serde_json::{Value, json};

use super::{Env, Server, serve};

/// A loopback model provider answering `{"provider": name, "model": <body's model>,
/// "usage": ...}`: every call reports [`USAGE_TOKENS`] tokens (10 in, 90 out).
pub fn provider(name: &'static str) -> String {
    provider_failing(name, 0)
}

/// [`provider`], answering 500 (Anthropic's `api_error` shape) to `fail_in_10` of every
/// ten calls, in call order.
pub fn provider_failing(name: &'static str, fail_in_10: usize) -> String {
    provider_with(name, fail_in_10, Duration::ZERO)
}

/// [`provider_failing`], each answer `delay` late.
pub fn provider_with(name: &'static str, fail_in_10: usize, delay: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind provider");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let calls = std::sync::Arc::clone(&calls);
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
                    let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    std::thread::sleep(delay);
                    let (status, reply) = if n % 10 < fail_in_10 {
                        (
                            "500 Internal Server Error",
                            json!({"type": "error", "error": {"type": "api_error", "message": "injected"}}),
                        )
                    } else {
                        (
                            "200 OK",
                            json!({"provider": name, "model": body["model"],
                            "usage": {"input_tokens": 10, "output_tokens": USAGE_TOKENS - 10}}),
                        )
                    };
                    let reply = reply.to_string();
                    let _ = write!(
                        conn,
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}",
                        reply.len()
                    );
                    buf.drain(..end + 4 + used);
                }
            });
        }
    });
    url
}

/// The tokens each successful answer of [`provider`] reports.
pub const USAGE_TOKENS: u64 = 100;

/// A whole chunked body: its bytes and how many input bytes it took; `None` if incomplete.
pub fn dechunk(mut input: &[u8]) -> Option<(Vec<u8>, usize)> {
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

pub const GATEWAY: &str = r#"apiVersion: halos.dev/v1
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

pub const TOGGLE: &str = r#"apiVersion: halos.dev/v1
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

pub fn write_gateway(env: &Env, a: &str, b: &str, haiku: &str) {
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

pub async fn ask(client: &reqwest::Client, port: u16, token: &str) -> Option<Value> {
    ask_raw(client, port, token)
        .await
        .filter(|(s, _)| *s == 200)
        .map(|(_, v)| v)
}

pub async fn ask_raw(client: &reqwest::Client, port: u16, token: &str) -> Option<(u16, Value)> {
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
pub async fn until(
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

/// halo-server and Envoy around the small policy.
pub struct LiveGateway {
    pub server: Server,
    pub envoy: Envoy,
    /// Envoy's listener.
    pub port: u16,
    pub client: reqwest::Client,
    /// The providers' URLs.
    pub a: String,
    pub b: String,
}

/// What differs between live gateways.
pub struct Live {
    /// Policy files besides halos.yaml, the rings and the profiles (relative path, text).
    pub files: Vec<(&'static str, String)>,
    /// prov-a and prov-b answer 500 to this many of every ten calls.
    pub a_fails_in_10: usize,
    pub b_fails_in_10: usize,
    /// prov-b answers this late.
    pub b_delay: Duration,
    /// Keys added to the xDS gateway settings file.
    pub gateway_file: Value,
    /// YAML appended to the Gateway document (top-level keys: budgets, prices...).
    pub gateway_yaml: String,
}

impl Default for Live {
    /// The `haiku-b` toggle, healthy providers.
    fn default() -> Self {
        Live {
            files: vec![("toggles/haiku-b.yaml", TOGGLE.to_string())],
            a_fails_in_10: 0,
            b_fails_in_10: 0,
            b_delay: Duration::ZERO,
            gateway_file: json!({}),
            gateway_yaml: String::new(),
        }
    }
}

/// Write the small policy into `env`'s policy dir, start halo-server with `settings`
/// plus xDS (the filter's poll an hour, so only a push can deliver a kill), and an Envoy
/// fed by it.
pub async fn start_live(env: &Env, settings: Settings) -> LiveGateway {
    start_live_with(env, settings, Live::default()).await
}

/// [`start_live`] with its policy files, the providers' failures and gateway settings
/// given.
pub async fn start_live_with(env: &Env, mut settings: Settings, live: Live) -> LiveGateway {
    let policy = env.path("policy");
    for dir in ["experiments", "toggles", "rollouts"] {
        let _ = std::fs::remove_dir_all(policy.join(dir));
    }
    let (a, b) = (
        provider_failing("prov-a", live.a_fails_in_10),
        provider_with("prov-b", live.b_fails_in_10, live.b_delay),
    );
    write_gateway(env, &a, &b, "prov-a");
    if !live.gateway_yaml.is_empty() {
        let path = policy.join("gateway.yaml");
        let text = std::fs::read_to_string(&path).expect("gateway.yaml");
        std::fs::write(&path, text + &live.gateway_yaml).expect("gateway.yaml");
    }
    for (path, text) in &live.files {
        let path = policy.join(path);
        std::fs::create_dir_all(path.parent().expect("a file in a dir")).expect("policy dir");
        std::fs::write(path, text).expect("policy file");
    }
    if let Err(problems) = halo_xds::source::load_policy(&policy) {
        panic!("test policy invalid: {problems:#?}");
    }
    let port = free_port();
    let gateway_file = env.path("xds-gateway.json");
    let mut file = json!({
        "listenAddress": "127.0.0.1", "listenPort": port,
        "wasmPath": halo_testkit::filter_module().display().to_string(),
        "upstreamCaFile": env.path("oidc-ca.pem").display().to_string(),
        // No jwksUri: halo-server reads the issuer's discovery document, whose
        // jwks_uri is {issuer}/keys.
        // The poll is the fallback; an hour means only the push can deliver a kill.
        "filterSettings": {"killSwitch": {"intervalSeconds": 3600}},
    });
    if let (Some(file), Some(extra)) = (file.as_object_mut(), live.gateway_file.as_object()) {
        file.extend(extra.clone());
    }
    std::fs::write(&gateway_file, file.to_string()).expect("gateway settings");
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
    let yaml =
        halo_envoy_config::ads::AdsBootstrap::loopback("halo-gateway", xds_port, admin).render();
    let envoy = tokio::task::block_in_place(|| Envoy::start(&yaml, admin));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    LiveGateway {
        server,
        envoy,
        port,
        client,
        a,
        b,
    }
}

impl LiveGateway {
    /// Ask as `token` until haiku reaches `provider`/`model` (bounded); how long it took.
    pub async fn until(&self, token: &str, provider: &str, model: &str) -> Duration {
        until(&self.client, self.port, token, provider, model, &self.envoy).await
    }
}
