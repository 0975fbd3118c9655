//! The xDS host (`--xds-listen`): halo-xds's ADS server on its own port, fed by the
//! policy source (the policy dir, watched by content hash every 250 ms) and the kill
//! switch (every signed envelope goes into the filter's configuration at once; the
//! filter verifies it with the kill public key, and its poll of GET
//! /api/v1/gateway/killswitch stays as the fallback) and the budget service (the exhausted
//! `routeTo` budgets, `budgetsExhausted`, likewise at once). Without `jwksUri` in the gateway
//! settings, the JWKS URL Envoy fetches keys from is the served issuer's discovery
//! document's `jwks_uri` ([`discover_jwks`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use halo_xds::{
    GatewaySettings, JwksUris, PolicySource, Pushed, Served, SnapshotCache, SourceStatus, Transform,
};
use serde_json::json;
use tokio::sync::watch;

use futures_util::future::BoxFuture;
use halo_killswitch::KillSwitch;
use halo_metrics::{Collect, Text};

use crate::config::Settings;
use crate::http::{Disabled, or_disabled};

/// How often the policy dir's content hash is checked.
pub const POLICY_POLL: Duration = Duration::from_millis(250);

/// How soon an issuer's discovery document that could not be read is read again.
pub const JWKS_RETRY: Duration = Duration::from_secs(30);

/// A running xDS host.
pub struct XdsHost {
    pub addr: SocketAddr,
    pub cache: SnapshotCache,
    /// The served gateway settings' credential settings (`upstreamHosts`,
    /// `upstreamHeaders`, `signHosts`, `vertexTokenSds`): the mirror service sends the
    /// gateway's requests with them.
    pub hosts: halo_envoy_config::credentials::Hosts,
    /// The served gateway settings' `upstreamCaFile`: the mirror service verifies a
    /// target's certificate against it, as the gateway's Envoy does.
    pub upstream_ca_file: PathBuf,
    source: Arc<PolicySource>,
    /// What is pushed with the policy: the kill list (from the kill switch) and the
    /// exhausted budgets (from the budget service).
    pub pushed: watch::Sender<Pushed>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for XdsHost {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl std::fmt::Debug for XdsHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsHost")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl XdsHost {
    /// The policy source's status and every node's xDS status.
    pub fn status(&self) -> serde_json::Value {
        let source: SourceStatus = self.source.status();
        json!({"source": source, "nodes": self.cache.status()})
    }

    /// The policy source feeding this host (halo-server's API reads the same one).
    pub fn source(&self) -> Arc<PolicySource> {
        Arc::clone(&self.source)
    }
}

/// The first load of the policy dir failed: every problem, one per line.
pub fn policy_error(e: halo_xds::source::SourceError) -> anyhow::Error {
    anyhow::anyhow!("policy {} is invalid:\n{}", e.dir, e.problems.join("\n"))
}

/// The xDS status route, on the admin listener.
pub const ADMIN_ROUTES: &[(&str, &str)] = &[("GET", "/xds/status")];

/// Its answer without `--xds-listen`.
pub const DISABLED: Disabled = Disabled {
    status: axum::http::StatusCode::NOT_FOUND,
    code: "not_found",
    message: "xDS is off (--xds-listen)",
};

/// `/xds/status`: the policy served, the last refused edit, each Envoy's versions.
pub fn admin_router(host: Option<Arc<XdsHost>>) -> axum::Router {
    let served = host.map(|host| {
        axum::Router::new().route(
            "/xds/status",
            axum::routing::get(move || {
                let host = Arc::clone(&host);
                async move { axum::Json(host.status()) }
            }),
        )
    });
    or_disabled(served, ADMIN_ROUTES, DISABLED)
}

/// The policy source's part of `/metrics` (`halo_policy_*`), then, with `--xds-listen`,
/// the ADS server's (`halo_xds_*`: pushes, ACKs, NACKs...).
pub struct XdsMetrics {
    pub source: Arc<PolicySource>,
    pub host: Option<Arc<XdsHost>>,
}

impl Collect for XdsMetrics {
    fn collect<'a>(&'a self, out: &'a mut Text) -> BoxFuture<'a, ()> {
        self.source.status().write_prometheus(out);
        if let Some(host) = &self.host {
            host.cache.metrics().write_prometheus(out);
        }
        Box::pin(async {})
    }
}

/// What an embedding host (halo-demo) may set beyond [`Settings`].
#[derive(Clone, Default)]
pub struct XdsOptions {
    /// Gateway settings to use instead of `--xds-gateway-file` (the kill-switch fill-in
    /// still applies).
    pub gateway: Option<GatewaySettings>,
    /// Applied to every compiled policy before it is served (see
    /// [`halo_xds::source::Transform`]).
    pub transform: Option<Transform>,
}

impl std::fmt::Debug for XdsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsOptions")
            .field("gateway", &self.gateway)
            .field("transform", &self.transform.is_some())
            .finish()
    }
}

/// This server's bound addresses the gateway settings may name.
#[derive(Debug, Clone, Copy)]
pub struct ServerAddrs {
    /// The API (the kill list's poll URL).
    pub api: SocketAddr,
    /// The mirror service, with `--shadow-listen`.
    pub shadow: Option<SocketAddr>,
}

/// The gateway settings: the file's, with the filter's kill-switch settings (public key,
/// gateway token) and the poll URL filled in from this server when the kill switch is on,
/// the mirror service's URL (`shadowUrl`) and the filter's shadow token filled in when
/// this server runs the mirror service (a file's own `shadowUrl`, `token` or `tokenEnv`
/// wins), and the evidence export's and the budget service's tokens read from their
/// `tokenFile` (relative to the gateway file), by default this server's
/// `--otlp-gateway-token-file` and `--budget-token-file`.
fn gateway_settings(
    settings: &Settings,
    given: Option<GatewaySettings>,
    addrs: ServerAddrs,
) -> anyhow::Result<GatewaySettings> {
    let mut gs: GatewaySettings = match (given, &settings.xds_gateway_file) {
        (Some(gs), _) => gs,
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            // YAML or JSON, strictly, as `halo envoy bootstrap --gateway-settings` reads
            // its file: serde-saphyr's message names the unknown or mistyped key.
            serde_saphyr::from_str(&text)
                .map_err(|e| anyhow::anyhow!("--xds-gateway-file {}: {e}", path.display()))?
        }
        (None, None) => GatewaySettings::default(),
    };
    let base = settings
        .xds_gateway_file
        .as_deref()
        .and_then(std::path::Path::parent)
        .unwrap_or(std::path::Path::new(""));
    // A gRPC service's token: its `tokenFile` (relative to the gateway file), else this
    // server's own token file for that service.
    let fill = |export: Option<&mut halo_envoy_config::evidence::Export>,
                own: Option<&std::path::Path>,
                what: &'static str,
                missing: &'static str|
     -> anyhow::Result<()> {
        let Some(export) = export.filter(|e| e.token.is_empty()) else {
            return Ok(());
        };
        let file = export
            .token_file
            .as_deref()
            .map(|f| base.join(f))
            .or_else(|| own.map(std::path::Path::to_path_buf))
            .context(missing)?;
        export.token = crate::token::read_token(what, &file)?;
        Ok(())
    };
    fill(
        gs.evidence.as_mut(),
        settings.evidence.gateway_token_file.as_deref(),
        "OTLP gateway token",
        "gateway settings: evidence needs tokenFile, or halo-server's --otlp-gateway-token-file",
    )?;
    fill(
        gs.budgets.as_mut(),
        settings.budget.token_file.as_deref(),
        "budget token",
        "gateway settings: budgets needs tokenFile, or halo-server's --budget-token-file",
    )?;
    if let (Some(key_file), Some(token_file)) =
        (&settings.killswitch_key_file, &settings.gateway_token_file)
        && settings.kill_switch_enabled()
    {
        let pem = std::fs::read_to_string(key_file)
            .with_context(|| format!("reading {}", key_file.display()))?;
        let key = halo_policy::keys::signing_key_from_pem(&pem)
            .with_context(|| format!("kill-switch key {}", key_file.display()))?;
        let public = halo_policy::keys::KeyPair::from_signing_key(&key)
            .context("kill-switch public key")?
            .public_pem
            .clone();
        let token = std::fs::read_to_string(token_file)
            .with_context(|| format!("reading {}", token_file.display()))?
            .trim()
            .to_string();
        let ks = filter_object(&mut gs, "killSwitch")?;
        ks["pubkey"] = json!(public);
        if ks.get("token").is_none() {
            ks["token"] = json!(token);
        }
        if gs.killswitch_url.is_none() {
            gs.killswitch_url = Some(format!("http://{}/api/v1/gateway/killswitch", addrs.api));
        }
    }
    if let (Some(addr), Some(token_file)) = (addrs.shadow, &settings.shadow.token_file) {
        let sh = filter_object(&mut gs, "shadow")?;
        if sh.get("token").is_none() && sh.get("tokenEnv").is_none() {
            sh["token"] = json!(crate::token::read_token("shadow token", token_file)?);
        }
        if gs.shadow_url.is_none() {
            gs.shadow_url = Some(format!("http://{addr}/mirror"));
        }
    }
    Ok(gs)
}

/// The object `filterSettings.<key>`, made empty if absent.
fn filter_object<'a>(
    gs: &'a mut GatewaySettings,
    key: &str,
) -> anyhow::Result<&'a mut serde_json::Value> {
    if !gs.filter_settings.is_object() {
        anyhow::bail!("gateway settings: filterSettings must be an object");
    }
    let v = &mut gs.filter_settings[key];
    if !v.is_object() {
        *v = json!({});
    }
    Ok(v)
}

/// Keep `uris` holding the served issuer's JWKS URL, read from its OIDC discovery
/// document when the served policy names a new issuer, and again every [`JWKS_RETRY`]
/// while it cannot be read. Until then the plan's default (`<issuer>/.well-known/jwks.json`)
/// is served: a warning says so, and one says when the keys themselves cannot be read,
/// since Envoy then refuses every valid token (401).
async fn discover_jwks(
    http: reqwest::Client,
    mut served: watch::Receiver<Arc<Served>>,
    uris: watch::Sender<JwksUris>,
) {
    loop {
        let issuer = served
            .borrow_and_update()
            .compiled
            .identity
            .as_ref()
            .map(|i| i.issuer.clone())
            .filter(|i| !i.is_empty());
        let mut failed = false;
        if let Some(issuer) = issuer
            && !uris.borrow().contains_key(&issuer)
        {
            match crate::auth::discovered_jwks_uri(&http, &issuer).await {
                Ok(uri) => {
                    if let Err(e) = crate::auth::jwks_key_count(&http, &uri).await {
                        tracing::warn!(%issuer, error = %e, "the issuer's keys cannot be read from here: until Envoy can, it refuses every token (401)");
                    }
                    tracing::info!(%issuer, jwks_uri = %uri, "JWKS URL from the issuer's discovery document");
                    uris.send_modify(|m| {
                        m.insert(issuer, uri);
                    });
                }
                Err(e) => {
                    failed = true;
                    tracing::warn!(%issuer, error = %e, "cannot read the issuer's OIDC discovery document: Envoy is given <issuer>/.well-known/jwks.json; set jwksUri in the xDS gateway settings if the keys are elsewhere (else every valid token is refused, 401)");
                }
            }
        }
        let more = if failed {
            tokio::select! {
                c = served.changed() => c.is_ok(),
                () = tokio::time::sleep(JWKS_RETRY) => true,
            }
        } else {
            served.changed().await.is_ok()
        };
        if !more {
            return;
        }
    }
}

/// Bind `--xds-listen`, serve the policy dir and the kill list. `http` reads the issuer's
/// discovery document (the OIDC CA trusted).
pub async fn start(
    settings: &Settings,
    options: XdsOptions,
    killswitch: Option<&Arc<KillSwitch>>,
    addrs: ServerAddrs,
    http: reqwest::Client,
) -> anyhow::Result<Option<XdsHost>> {
    let Some(listen) = settings.xds_listen else {
        return Ok(None);
    };
    let gs = gateway_settings(settings, options.gateway, addrs)?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding --xds-listen {listen}"))?;
    let addr = listener.local_addr()?;
    let cache = SnapshotCache::new();
    let (pushed, rx) = watch::channel(Pushed::default());
    let mut tasks = Vec::new();
    if let Some(ks) = killswitch {
        let mut signed = ks.subscribe();
        let text = |s: &halo_killswitch::SignedList| String::from_utf8(s.envelope.to_vec()).ok();
        pushed.send_modify(|p| p.kill_list = text(&signed.borrow_and_update()));
        let tx = pushed.clone();
        tasks.push(tokio::spawn(async move {
            while signed.changed().await.is_ok() {
                let envelope = text(&signed.borrow_and_update());
                tx.send_modify(|p| p.kill_list = envelope);
            }
        }));
    }
    let discover = gs.jwks_uri.is_none();
    let hosts = gs.hosts();
    let upstream_ca_file = PathBuf::from(&gs.upstream_ca_file);
    let (jwks_tx, jwks_rx) = watch::channel(JwksUris::new());
    let source = PolicySource::spawn_transformed(
        settings.policy_dir.clone(),
        POLICY_POLL,
        gs,
        cache.clone(),
        rx,
        jwks_rx,
        options.transform,
    )
    .map_err(policy_error)?;
    if discover {
        tasks.push(tokio::spawn(discover_jwks(http, source.served(), jwks_tx)));
    }
    let serving = cache.clone();
    tasks.push(tokio::spawn(async move {
        if let Err(e) = halo_xds::serve(listener, serving).await {
            tracing::error!(error = %e, "xDS listener failed");
        }
    }));
    tracing::info!(%addr, "xDS (ADS) listening");
    Ok(Some(XdsHost {
        addr,
        cache,
        hosts,
        upstream_ca_file,
        source: Arc::new(source),
        pushed,
        tasks,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(file: &std::path::Path) -> Settings {
        Settings {
            listen: "127.0.0.1:0".parse().expect("addr"),
            admin_listen: "127.0.0.1:0".parse().expect("addr"),
            policy_dir: "policy".into(),
            data_dir: None,
            killswitch_key_file: None,
            gateway_token_file: None,
            token_file: None,
            device_ttl: Duration::from_secs(60),
            enrollment_ttl: Duration::from_secs(60),
            oidc_ca_file: None,
            max_body_bytes: 4096,
            xds_listen: Some("127.0.0.1:0".parse().expect("addr")),
            xds_gateway_file: Some(file.to_path_buf()),
            evidence: Default::default(),
            shadow: Default::default(),
            budget: Default::default(),
            console_url: None,
            controller: Default::default(),
        }
    }

    /// The gateway file is YAML or JSON, strict, and a `halo envoy bootstrap
    /// --gateway-settings` file is one as it is (the README's example).
    #[test]
    fn the_gateway_file_is_yaml_or_json_and_strict() {
        let dir = tempfile::tempdir().expect("tempdir");
        let addr = ServerAddrs {
            api: "127.0.0.1:1".parse().expect("addr"),
            shadow: None,
        };
        let yaml = dir.path().join("gw.yaml");
        std::fs::write(
            &yaml,
            "listenPort: 10000\nupstreamHeaders:\n  llm-orchestrator: {x-api-key: \"${ORCH_KEY}\"}\nupstreamHosts: [llm.acme.internal]\nvertexTokenSds: /etc/halos/secrets/vertex-token.json\n",
        )
        .expect("write");
        let gs = gateway_settings(&settings(&yaml), None, addr).expect("YAML reads");
        assert_eq!(gs.listen_port, 10000);
        assert_eq!(gs.upstream_hosts, vec!["llm.acme.internal".to_string()]);
        assert_eq!(gs.wasm_path, GatewaySettings::default().wasm_path);

        let json = dir.path().join("gw.json");
        std::fs::write(&json, r#"{"listenAddress": "127.0.0.1", "maxAttempts": 2}"#)
            .expect("write");
        let gs = gateway_settings(&settings(&json), None, addr).expect("JSON reads");
        assert_eq!(gs.listen_address, "127.0.0.1");
        assert_eq!(gs.max_attempts, 2);

        std::fs::write(&yaml, "listenPort: 10000\nwasmPth: /x.wasm\n").expect("write");
        let err = gateway_settings(&settings(&yaml), None, addr)
            .expect_err("a misspelt key is refused")
            .to_string();
        assert!(err.contains("wasmPth"), "{err}");
        assert!(err.contains("gw.yaml"), "{err}");
    }

    /// `evidence` in the gateway file: its token comes from `tokenFile` (relative to the
    /// file) or the server's own gateway receiver token; never from the file itself.
    #[test]
    fn the_evidence_token_is_read_from_its_file_or_the_receivers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let addr = ServerAddrs {
            api: "127.0.0.1:1".parse().expect("addr"),
            shadow: None,
        };
        let token = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
        std::fs::write(dir.path().join("otlp.token"), format!("{token}\n")).expect("write");
        let gw = dir.path().join("gw.yaml");
        std::fs::write(
            &gw,
            "evidence: {url: \"http://halo-server:4319\", tokenFile: otlp.token}\n",
        )
        .expect("write");
        let gs = gateway_settings(&settings(&gw), None, addr).expect("reads");
        let export = gs.evidence.expect("evidence");
        assert_eq!(
            (export.url.as_str(), export.token.as_str()),
            ("http://halo-server:4319", token)
        );

        std::fs::write(&gw, "evidence: {url: \"http://halo-server:4319\"}\n").expect("write");
        let err = gateway_settings(&settings(&gw), None, addr)
            .expect_err("no token anywhere")
            .to_string();
        assert!(err.contains("--otlp-gateway-token-file"), "{err}");
        let mut with_receiver = settings(&gw);
        with_receiver.evidence.gateway_token_file = Some(dir.path().join("otlp.token"));
        let gs = gateway_settings(&with_receiver, None, addr).expect("the receiver's token");
        assert_eq!(gs.evidence.expect("evidence").token, token);

        std::fs::write(dir.path().join("otlp.token"), "secret").expect("write");
        let err = gateway_settings(&with_receiver, None, addr)
            .expect_err("a weak token is refused")
            .to_string();
        assert!(err.contains("openssl rand"), "{err}");

        std::fs::write(&gw, "evidence: {url: \"http://h:4319\", token: x}\n").expect("write");
        let err = gateway_settings(&with_receiver, None, addr)
            .expect_err("the token itself is not a key")
            .to_string();
        assert!(err.contains("token"), "{err}");
    }

    /// With the mirror service on (`--shadow-listen`), the served settings name it
    /// (`shadowUrl`) and carry its token; a gateway file's own URL and token win.
    #[test]
    fn the_mirror_service_is_filled_in() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = "7a6b5c4d3e2f10f9e8d7c6b5a49382716a5b4c3d2e1f0f9e8d7c6b5a4938271a";
        std::fs::write(dir.path().join("shadow.token"), format!("{token}\n")).expect("write");
        let gw = dir.path().join("gw.yaml");
        std::fs::write(&gw, "listenPort: 10000\n").expect("write");
        let mut with_mirror = settings(&gw);
        with_mirror.shadow.token_file = Some(dir.path().join("shadow.token"));
        let addrs = ServerAddrs {
            api: "127.0.0.1:1".parse().expect("addr"),
            shadow: Some("127.0.0.1:4320".parse().expect("addr")),
        };
        let gs = gateway_settings(&with_mirror, None, addrs).expect("reads");
        assert_eq!(
            gs.shadow_url.as_deref(),
            Some("http://127.0.0.1:4320/mirror")
        );
        assert_eq!(gs.filter_settings["shadow"]["token"], token);

        std::fs::write(
            &gw,
            "shadowUrl: \"http://mirror.internal:4320/mirror\"\nfilterSettings: {shadow: {tokenEnv: SHADOW_TOKEN, maxBytes: 1000}}\n",
        )
        .expect("write");
        let gs = gateway_settings(&with_mirror, None, addrs).expect("reads");
        assert_eq!(
            gs.shadow_url.as_deref(),
            Some("http://mirror.internal:4320/mirror")
        );
        assert_eq!(
            gs.filter_settings["shadow"],
            json!({"tokenEnv": "SHADOW_TOKEN", "maxBytes": 1000})
        );

        // Without the mirror service nothing is added.
        std::fs::write(&gw, "listenPort: 10000\n").expect("write");
        let gs = gateway_settings(
            &with_mirror,
            None,
            ServerAddrs {
                shadow: None,
                ..addrs
            },
        )
        .expect("reads");
        assert!(gs.shadow_url.is_none());
        assert!(gs.filter_settings.get("shadow").is_none());
    }
}
