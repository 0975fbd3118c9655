//! halo-demo: the local gateway in one command. It composes what the repository already
//! has, on loopback:
//! - halo-server (library) with its xDS listener, serving the policy directory (watched:
//!   edits are validated and pushed, an invalid edit is refused);
//! - an Envoy 1.40 booted from envoy/ads.yaml alone, getting everything from halo-server;
//! - [`halo_testkit::provider::WireProvider`], a provider that needs no keys and speaks
//!   every wire the gateway sends to (Anthropic Messages, Bedrock, OpenAI Responses,
//!   Gemini), keeping nothing of a request, and
//!   [`issuer::DemoIssuer`], a local issuer with a fresh key whose tokens jwt_authn
//!   verifies;
//! - [`overrides::Overrides`]: the policy's upstreams and issuer pointed at those two,
//!   explicitly and printed, never on disk.
//!
//! [`run`] starts everything, sends the first request itself (a bounded poll until Envoy
//! has its configuration), prints how to send it, and serves until Ctrl-C or SIGTERM;
//! `--once` checks the 200, the SSE stream and the 401 without a token, then exits.

pub mod envoy;
pub mod issuer;
pub mod overrides;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use halo_policy::Snapshot;
use halo_policy::types::WireProtocol;
use serde_json::{Value, json};

use crate::envoy::EnvoyProcess;
use crate::issuer::DemoIssuer;
use crate::overrides::Overrides;
use halo_testkit::provider::{Sigv4Key, WireProvider};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub policy_dir: PathBuf,
    /// Envoy's gateway listener.
    pub listen: SocketAddr,
    /// Envoy's admin listener.
    pub envoy_admin: SocketAddr,
    /// halo-server's xDS (ADS) listener.
    pub xds_listen: SocketAddr,
    /// halo-server's API listener.
    pub server_listen: SocketAddr,
    /// halo-server's admin listener (/metrics, /xds/status).
    pub server_admin_listen: SocketAddr,
    /// halo_filter.wasm; default the workspace build.
    pub wasm: Option<PathBuf>,
    /// The demo token's user and groups.
    pub user: String,
    pub groups: Vec<String>,
    pub token_ttl: Duration,
    /// The alias of the first request; default the first alias that serves Anthropic
    /// Messages.
    pub model: Option<String>,
    /// Check the first request (200, stream, 401 without a token) and exit.
    pub once: bool,
}

/// How long Envoy may take to become ready and then to route the first request.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The filter module, or an error saying exactly how to build it.
pub fn filter_wasm(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let path = given.unwrap_or_else(halo_testkit::filter_wasm_path);
    if !path.is_file() {
        bail!(
            "the halo filter module {} is missing; build it once with:\n  \
             cargo build -p halo-filter-wasm --target wasm32-unknown-unknown --release\n\
             (scripts/install.sh does this; or pass --wasm FILE / set HALO_FILTER_WASM)",
            path.display()
        );
    }
    // Envoy resolves the path itself: make it absolute.
    std::path::absolute(&path).with_context(|| format!("resolving {}", path.display()))
}

/// The first alias (in name order) with a target that serves the Anthropic Messages wire.
pub fn first_alias(snap: &Snapshot) -> Option<String> {
    first_alias_for(snap, WireProtocol::AnthropicMessages)
}

/// The first alias (in name order) with a target that serves `wire`.
pub fn first_alias_for(snap: &Snapshot, wire: WireProtocol) -> Option<String> {
    snap.models
        .iter()
        .find(|(_, targets)| {
            targets
                .iter()
                .any(|t| halo_policy::route::can_serve(snap, t, wire))
        })
        .map(|(alias, _)| alias.clone())
}

/// The first alias whose first target's upstream speaks `wire` itself (no translation):
/// `gpt` rather than `default` for Codex. Else the first alias that can serve `wire`.
fn native_alias(snap: &Snapshot, wire: WireProtocol) -> Option<String> {
    use halo_policy::types::UpstreamKind as K;
    let native = |kind: K| match wire {
        WireProtocol::OpenaiResponses => matches!(kind, K::Openai | K::AzureOpenai),
        WireProtocol::Gemini => kind == K::Gemini,
        WireProtocol::AnthropicMessages => kind == K::Anthropic,
        WireProtocol::BedrockInvoke => kind == K::Bedrock,
    };
    snap.models
        .iter()
        .find(|(_, targets)| {
            targets
                .first()
                .and_then(|t| snap.upstreams.get(&t.upstream))
                .is_some_and(|u| native(u.kind))
        })
        .map(|(alias, _)| alias.clone())
        .or_else(|| first_alias_for(snap, wire))
}

/// One shell line per coding tool that points it at the gateway `base` with `token`, as
/// a release would (docs/harnesses.md), but in the environment: Claude Code with each
/// model family it resolves itself sent as the alias of that name, Codex with the
/// gateway as its Responses provider, Gemini CLI with its base URL and key.
pub fn harness_lines(snap: &Snapshot, base: &str, token: &str) -> Vec<String> {
    let mut lines = Vec::new();
    if first_alias_for(snap, WireProtocol::AnthropicMessages).is_some() {
        let mut env = format!("ANTHROPIC_BASE_URL={base} ANTHROPIC_AUTH_TOKEN={token}");
        for family in halo_policy::harness_models::CLAUDE_CODE_FAMILIES {
            if snap.models.contains_key(family.name) {
                env.push_str(&format!(" {}={}", family.env, family.name));
                if family.name == halo_policy::harness_models::CLAUDE_CODE_SMALL_FAST_FAMILY {
                    env.push_str(&format!(
                        " {}={}",
                        halo_policy::harness_models::CLAUDE_CODE_SMALL_FAST_ENV,
                        family.name
                    ));
                }
            }
        }
        lines.push(format!("Claude Code: {env} claude"));
    }
    if let Some(alias) = native_alias(snap, WireProtocol::OpenaiResponses) {
        lines.push(format!(
            "Codex:       HALOS_TOKEN={token} codex -m {alias} -c model_provider=halos \
             -c 'model_providers.halos={{name=\"Halos\",base_url=\"{base}/v1\",wire_api=\"responses\",env_key=\"HALOS_TOKEN\"}}'"
        ));
    }
    if let Some(alias) = native_alias(snap, WireProtocol::Gemini) {
        lines.push(format!(
            "Gemini CLI:  GOOGLE_GEMINI_BASE_URL={base} GEMINI_API_KEY={token} gemini -m {alias}  \
             (with {{\"security\":{{\"auth\":{{\"selectedType\":\"gemini-api-key\"}}}}}} in \
             ~/.gemini/settings.json, as a release writes it system-wide)"
        ));
    }
    lines
}

/// The first request: an Anthropic Messages call of `alias`.
pub fn first_body(alias: &str, stream: bool) -> Value {
    let mut body = json!({
        "model": alias, "max_tokens": 256,
        "messages": [{"role": "user", "content": "Hello, Halos"}],
    });
    if stream {
        body["stream"] = json!(true);
    }
    body
}

/// The curl line for the first request.
pub fn curl_line(base: &str, token: Option<&str>, alias: &str, stream: bool) -> String {
    let auth = token
        .map(|t| format!(" -H 'authorization: Bearer {t}'"))
        .unwrap_or_default();
    let flags = if stream { "-sN" } else { "-s" };
    format!(
        "curl {flags} {base}/v1/messages{auth} -H 'anthropic-version: 2023-06-01' \
         -H 'content-type: application/json' -d '{}'",
        first_body(alias, stream)
    )
}

/// A response as received.
struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

async fn post(
    client: &reqwest::Client,
    base: &str,
    token: Option<&str>,
    body: &Value,
) -> Option<Reply> {
    let mut req = client
        .post(format!("{base}/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.ok()?;
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = resp.text().await.ok()?;
    Some(Reply {
        status,
        content_type,
        body,
    })
}

/// Send the first request until Envoy routes it to the demo provider (bounded: the
/// listener, routes, clusters and the filter's configuration arrive over ADS).
async fn first_request(
    client: &reqwest::Client,
    base: &str,
    token: &str,
    alias: &str,
    envoy: &mut EnvoyProcess,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + FIRST_REQUEST_TIMEOUT;
    let mut last = String::from("no answer");
    loop {
        if let Some(status) = envoy.exited() {
            bail!("Envoy exited ({status}); its log:\n{}", envoy.log_tail(30));
        }
        if let Some(r) = post(client, base, Some(token), &first_body(alias, false)).await {
            if r.status == 200 {
                return serde_json::from_str(&r.body)
                    .with_context(|| format!("the demo provider's reply is not JSON: {}", r.body));
            }
            last = format!("{} {}", r.status, r.body);
        }
        if Instant::now() >= deadline {
            bail!(
                "the first request did not get a 200 in {FIRST_REQUEST_TIMEOUT:?} (last: {last}); \
                 Envoy's log:\n{}",
                envoy.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One call of `alias` on `wire`: the path, the body and the header carrying the token.
fn wire_call(alias: &str, wire: WireProtocol) -> Option<(String, Value, &'static str)> {
    match wire {
        WireProtocol::AnthropicMessages => Some((
            "/v1/messages".into(),
            first_body(alias, false),
            "authorization",
        )),
        WireProtocol::OpenaiResponses => Some((
            "/v1/responses".into(),
            json!({"model": alias, "input": "Hello, Halos"}),
            "authorization",
        )),
        WireProtocol::Gemini => Some((
            format!("/v1beta/models/{alias}:generateContent"),
            json!({"contents": [{"role": "user", "parts": [{"text": "Hello, Halos"}]}]}),
            "x-goog-api-key",
        )),
        WireProtocol::BedrockInvoke => None,
    }
}

/// Every alias of the policy answers 200 on each wire of a coding tool (Anthropic
/// Messages, OpenAI Responses, Gemini) one of its targets can serve; prints the model id
/// each call was sent upstream as.
async fn check_every_alias(
    client: &reqwest::Client,
    base: &str,
    token: &str,
    policy: &Snapshot,
) -> anyhow::Result<()> {
    for (alias, targets) in &policy.models {
        for wire in [
            WireProtocol::AnthropicMessages,
            WireProtocol::OpenaiResponses,
            WireProtocol::Gemini,
        ] {
            if !targets
                .iter()
                .any(|t| halo_policy::route::can_serve(policy, t, wire))
            {
                continue;
            }
            let Some((path, body, header)) = wire_call(alias, wire) else {
                continue;
            };
            let value = if header == "authorization" {
                format!("Bearer {token}")
            } else {
                token.to_string()
            };
            let resp = client
                .post(format!("{base}{path}"))
                .header(header, value)
                .header("anthropic-version", "2023-06-01")
                .json(&body)
                .send()
                .await
                .with_context(|| format!("alias {alias:?} on {path}: the request failed"))?;
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            if status != 200 {
                bail!("alias {alias:?} on {path} got {status}: {text}");
            }
            let sent_as = text
                .split("as model \\\"")
                .nth(1)
                .and_then(|rest| rest.split("\\\"").next())
                .unwrap_or("?");
            println!("check: alias {alias:?} answered 200 on {path} (sent as model {sent_as})");
        }
    }
    Ok(())
}

/// The checks of `--once` beyond the first request: the SSE stream, and 401 without a
/// token.
async fn more_checks(
    client: &reqwest::Client,
    base: &str,
    token: &str,
    alias: &str,
) -> anyhow::Result<()> {
    let r = post(client, base, Some(token), &first_body(alias, true))
        .await
        .context("the streaming request failed")?;
    if r.status != 200
        || !r.content_type.starts_with("text/event-stream")
        || !r.body.contains("event: message_stop")
    {
        bail!(
            "the streaming request got {} {} {:?}",
            r.status,
            r.content_type,
            r.body
        );
    }
    println!("check: 200 text/event-stream through Envoy, ending in message_stop");
    let r = post(client, base, None, &first_body(alias, false))
        .await
        .context("the request without a token failed")?;
    if r.status != 401 {
        bail!(
            "without a token Envoy answered {} (expected 401): {}",
            r.status,
            r.body
        );
    }
    println!("check: 401 without a token");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = ctrl_c.await;
}

/// Start everything, check the first request, print how to send it, serve until a signal
/// (or, with `once`, exit after the checks).
pub async fn run(opts: Options) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let wasm = filter_wasm(opts.wasm.clone())?;
    let policy = halo_xds::source::load_policy(&opts.policy_dir).map_err(|problems| {
        anyhow::anyhow!(
            "policy {} is invalid:\n{}",
            opts.policy_dir.display(),
            problems.join("\n")
        )
    })?;
    let Some(identity) = policy.identity.clone() else {
        bail!(
            "policy {} has no identity in halos.yaml: the demo needs one to mint a token",
            opts.policy_dir.display()
        );
    };
    let alias = match &opts.model {
        Some(m) if policy.models.contains_key(m) => m.clone(),
        Some(m) => bail!("--model {m}: the policy has no such alias"),
        None => first_alias(&policy)
            .context("the policy has no alias that serves the Anthropic Messages wire")?,
    };

    // Envoy gets its listener over ADS and would only log a failed bind: say it first.
    std::net::TcpListener::bind(opts.listen).map_err(|e| {
        anyhow::anyhow!(
            "--listen {}: {e} (Envoy's gateway port; pick another with --listen)",
            opts.listen
        )
    })?;
    let provider = WireProvider::start_with(
        false,
        Some(Sigv4Key {
            region: None,
            access_key: envoy::DEMO_AWS_ACCESS_KEY.into(),
            secret_key: envoy::DEMO_AWS_SECRET_KEY.into(),
        }),
    )
    .await
    .context("starting the demo provider")?;
    let issuer = DemoIssuer::start().await?;
    let overrides = Overrides {
        provider_url: provider.url(),
        issuer_url: issuer.url(),
    };

    let gateway = halo_xds::GatewaySettings {
        listen_address: opts.listen.ip().to_string(),
        listen_port: opts.listen.port(),
        wasm_path: wasm.display().to_string(),
        // Every upstream is the demo provider on loopback: let it receive the SigV4
        // signature (made with the demo's key pair, see envoy::DEMO_AWS_ACCESS_KEY).
        sign_hosts: vec![provider.addr.ip().to_string()],
        // The demo issuer is plain http on loopback, which halo-server's discovery of the
        // JWKS URL refuses (https only): its keys are at the default path, said here.
        jwks_uri: Some(halo_envoy_config::plan::default_jwks_uri(&issuer.url())),
        ..halo_xds::GatewaySettings::default()
    };
    let settings = halo_server::config::Settings {
        listen: opts.server_listen,
        admin_listen: opts.server_admin_listen,
        policy_dir: opts.policy_dir.clone(),
        data_dir: None,
        killswitch_key_file: None,
        gateway_token_file: None,
        token_file: None,
        device_ttl: halo_server::config::DEFAULT_DEVICE_TTL,
        enrollment_ttl: halo_server::config::DEFAULT_ENROLLMENT_TTL,
        oidc_ca_file: None,
        max_body_bytes: halo_server::config::DEFAULT_MAX_BODY_BYTES,
        xds_listen: Some(opts.xds_listen),
        xds_gateway_file: None,
        evidence: Default::default(),
        shadow: Default::default(),
        budget: Default::default(),
        console_url: None,
        controller: Default::default(),
    };
    let server = halo_server::server::start_with(
        &settings,
        halo_server::xds::XdsOptions {
            gateway: Some(gateway),
            transform: Some(overrides.transform()),
        },
    )
    .await
    .context("starting halo-server")?;
    let xds_addr = server
        .xds
        .as_ref()
        .map(|x| x.addr)
        .context("halo-server started without its xDS listener")?;

    let bootstrap = envoy::bootstrap(opts.envoy_admin, xds_addr)?;
    let mut envoy = EnvoyProcess::spawn(&bootstrap, opts.envoy_admin)?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .context("HTTP client")?;

    println!(
        "halo-demo: the local gateway on {} (org {})",
        opts.policy_dir.display(),
        policy.org
    );
    println!(
        "demo mode overrides (the policy on disk is unchanged; edits to it are still validated and pushed, with the same overrides):"
    );
    for line in overrides.describe(&policy) {
        println!("  {line}");
    }
    println!(
        "control plane: halo-server api=http://{} admin=http://{} (/metrics, /xds/status) xds={}",
        server.api_addr, server.admin_addr, xds_addr
    );
    println!(
        "Envoy: {} admin=http://{} log={}",
        envoy.binary.display(),
        opts.envoy_admin,
        envoy.log_path().display()
    );

    envoy.wait_ready(&client, READY_TIMEOUT).await?;
    let host = if opts.listen.ip().is_unspecified() {
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        opts.listen.ip()
    };
    let base = format!("http://{}", SocketAddr::new(host, opts.listen.port()));
    let token = issuer.token(&identity, &opts.user, &opts.groups, opts.token_ttl);
    let reply = first_request(&client, &base, &token, &alias, &mut envoy).await?;
    println!(
        "check: 200 from the demo provider through Envoy: alias {alias:?} was sent as model {}",
        reply["model"]
    );
    if opts.once {
        more_checks(&client, &base, &token, &alias).await?;
        check_every_alias(&client, &base, &token, &policy).await?;
        drop(envoy);
        server.shutdown().await;
        println!("halo-demo: all checks passed");
        return Ok(());
    }

    let groups = if opts.groups.is_empty() {
        String::new()
    } else {
        format!(" in groups {}", opts.groups.join(","))
    };
    println!();
    println!(
        "Gateway ready at {base}. A demo token for {}{groups}, valid {}h, signed by the demo issuer:",
        opts.user,
        opts.token_ttl.as_secs() / 3600
    );
    println!();
    println!("  {}", curl_line(&base, Some(&token), &alias, false));
    println!();
    println!("Streaming (SSE):");
    println!();
    println!("  {}", curl_line(&base, Some(&token), &alias, true));
    println!();
    println!("Point a coding tool at it (one shell line each):");
    println!();
    for line in harness_lines(&policy, &base, &token) {
        println!("  {line}");
    }
    println!();
    println!("Without the token Envoy answers 401. Ctrl-C stops halo-server and Envoy.");

    let mut watch = tokio::time::interval(Duration::from_millis(500));
    let signal = shutdown_signal();
    tokio::pin!(signal);
    let outcome = loop {
        tokio::select! {
            _ = &mut signal => break Ok(()),
            _ = watch.tick() => {
                if let Some(status) = envoy.exited() {
                    break Err(anyhow::anyhow!(
                        "Envoy exited ({status}); its log:\n{}",
                        envoy.log_tail(30)
                    ));
                }
            }
        }
    };
    drop(envoy);
    server.shutdown().await;
    println!(
        "halo-demo: stopped ({} model calls answered)",
        provider.calls()
    );
    outcome
}
