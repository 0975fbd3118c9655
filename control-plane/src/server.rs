//! Startup: load and validate the policy, read keys and tokens, open the store, bind
//! both listeners and serve until shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, bail};
use halo_policy::issue::has_errors;
use halo_policy::load::{LoadError, load_dir};
use halo_policy::validate::validate;
use tokio::net::TcpListener;

use crate::api::{AppState, ServedPolicy, admin_router, router};
use crate::auth::{OidcVerifier, http_client};
use crate::config::Settings;
use crate::fleet::Fleet;
use crate::killswitch::KillSwitch;
use crate::metrics::Metrics;
use crate::store::{FileStore, MemoryStore, Store};
use crate::throttle::Throttle;
use crate::token::read_token_file;

/// Load and validate the policy directory; every problem is in the error.
pub fn load_policy(dir: &std::path::Path) -> anyhow::Result<ServedPolicy> {
    let org = match load_dir(dir) {
        Ok(org) => org,
        Err(LoadError::Invalid(issues)) => {
            let lines: Vec<String> = issues.iter().map(|i| i.to_string()).collect();
            bail!("policy {} is invalid:\n{}", dir.display(), lines.join("\n"));
        }
        Err(e) => return Err(e).with_context(|| format!("loading policy {}", dir.display())),
    };
    let issues = validate(&org);
    if has_errors(&issues) {
        let lines: Vec<String> = issues
            .iter()
            .filter(|i| i.is_error())
            .map(|i| i.to_string())
            .collect();
        bail!("policy {} is invalid:\n{}", dir.display(), lines.join("\n"));
    }
    let snapshot = halo_policy::compile(&org);
    let version = snapshot.version();
    Ok(ServedPolicy {
        org,
        snapshot,
        version,
    })
}

/// Build the shared state from settings (reads every file; nothing is bound yet).
pub fn build_state(settings: &Settings) -> anyhow::Result<Arc<AppState>> {
    let policy = load_policy(&settings.policy_dir)?;
    let gateway_token = settings
        .gateway_token_file
        .as_deref()
        .map(|p| read_token_file("gateway token", p))
        .transpose()?;
    let fleet_token = settings
        .token_file
        .as_deref()
        .map(|p| read_token_file("fleet token", p))
        .transpose()?;
    // Everything is read and checked before the data dir is touched.
    let kill_key = match &settings.killswitch_key_file {
        Some(path) if settings.kill_switch_enabled() => {
            let pem = std::fs::read_to_string(path)
                .with_context(|| format!("reading kill-switch key {}", path.display()))?;
            Some(
                halo_policy::keys::signing_key_from_pem(&pem)
                    .with_context(|| format!("kill-switch key {}", path.display()))?,
            )
        }
        _ => None,
    };
    let store: Arc<dyn Store> = match &settings.data_dir {
        Some(dir) => Arc::new(
            FileStore::open(dir).with_context(|| format!("opening data dir {}", dir.display()))?,
        ),
        None => {
            tracing::warn!("no --data-dir: enrollments, devices and reports live in memory only");
            Arc::new(MemoryStore::default())
        }
    };
    let killswitch = match kill_key {
        Some(key) => {
            Some(KillSwitch::open(Arc::clone(&store), key).context("opening the kill log")?)
        }
        None => None,
    };
    let ca = match &settings.oidc_ca_file {
        Some(p) => Some((
            p.display().to_string(),
            std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
        )),
        None => None,
    };
    let http = http_client(ca.as_ref().map(|(p, b)| (p.as_str(), b.as_slice())))?;
    let oidc = OidcVerifier::new(policy.org.root.identity.clone(), http);
    let fleet = Fleet::open(
        Arc::clone(&store),
        settings.device_ttl,
        settings.enrollment_ttl,
    )
    .context("reading enrollments and devices")?;
    Ok(Arc::new(AppState {
        policy,
        store,
        killswitch,
        gateway_token,
        fleet_token,
        fleet,
        oidc,
        throttle: Throttle::default(),
        metrics: Metrics::default(),
        max_body_bytes: settings.max_body_bytes,
    }))
}

/// A running server: its bound addresses and shared state.
#[derive(Debug)]
pub struct Running {
    pub api_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub state: Arc<AppState>,
    /// The xDS host, when `--xds-listen` is set.
    pub xds: Option<Arc<crate::xds::XdsHost>>,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

impl Running {
    /// Stop both listeners and wait for them.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Wait until both listeners stop (they stop only on shutdown or error).
    pub async fn wait(mut self) {
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

/// Bind both listeners and serve in the background.
pub async fn start(settings: &Settings) -> anyhow::Result<Running> {
    start_with(settings, crate::xds::XdsOptions::default()).await
}

/// [`start`] for an embedding host: `xds` adds gateway settings and a policy transform
/// to the xDS host (used only with `settings.xds_listen`).
pub async fn start_with(
    settings: &Settings,
    xds: crate::xds::XdsOptions,
) -> anyhow::Result<Running> {
    let state = build_state(settings)?;
    let api = TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding --listen {}", settings.listen))?;
    let admin = TcpListener::bind(settings.admin_listen)
        .await
        .with_context(|| format!("binding --admin-listen {}", settings.admin_listen))?;
    let api_addr = api.local_addr()?;
    let admin_addr = admin.local_addr()?;
    if let Some(ks) = &state.killswitch {
        ks.spawn_resigner();
    }
    let xds = crate::xds::start(settings, xds, &state, api_addr)
        .await?
        .map(Arc::new);
    let (tx, rx) = tokio::sync::watch::channel(false);
    let stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let api_app = router(Arc::clone(&state)).into_make_service_with_connect_info::<SocketAddr>();
    let admin_app = admin_router(Arc::clone(&state), xds.clone());
    let api_rx = rx.clone();
    let tasks = vec![
        tokio::spawn(async move {
            if let Err(e) = axum::serve(api, api_app)
                .with_graceful_shutdown(stop(api_rx))
                .await
            {
                tracing::error!(error = %e, "API listener failed");
            }
        }),
        tokio::spawn(async move {
            if let Err(e) = axum::serve(admin, admin_app)
                .with_graceful_shutdown(stop(rx))
                .await
            {
                tracing::error!(error = %e, "admin listener failed");
            }
        }),
    ];
    tracing::info!(%api_addr, %admin_addr, kill_switch = state.killswitch.is_some(), storage = %state.store.describe(), "halo-server listening");
    Ok(Running {
        api_addr,
        admin_addr,
        state,
        xds,
        shutdown: tx,
        tasks,
    })
}
