//! Startup: read keys and tokens, open the store, bind both listeners, start the policy
//! source (the policy dir, watched; with `--xds-listen` it also feeds the xDS server) and
//! serve until shutdown. The API reads the policy the source serves now, never a copy
//! taken at startup.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use halo_xds::PolicySource;
use halo_xds::source::SourceError;
use tokio::net::TcpListener;

use crate::api::{AppState, admin_router, router};
use crate::auth::{OidcVerifier, http_client};
use crate::config::Settings;
use crate::fleet::Fleet;
use crate::listener::{JsonListener, Peer};
use crate::metrics::Metrics;
use crate::throttle::Throttle;
use crate::token::read_token_file;
use halo_killswitch::KillSwitch;
use halo_store::{FileStore, LogStore, MemoryStore};

/// The first load of the policy dir failed: every problem, one per line.
pub fn policy_error(e: SourceError) -> anyhow::Error {
    anyhow::anyhow!("policy {} is invalid:\n{}", e.dir, e.problems.join("\n"))
}

/// Everything the state holds but the policy: read from settings (every file), with
/// the store and the kill log open.
struct Parts {
    store: Arc<dyn LogStore>,
    killswitch: Option<Arc<KillSwitch>>,
    gateway_token: Option<crate::token::TokenDigest>,
    fleet_token: Option<crate::token::TokenDigest>,
    fleet: Fleet,
    oidc: OidcVerifier,
}

fn open_parts(settings: &Settings) -> anyhow::Result<Parts> {
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
    // Tokens and the key are read and checked before the data dir is touched (the
    // policy is loaded after: the xDS source needs the kill log open).
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
    let store: Arc<dyn LogStore> = match &settings.data_dir {
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
    let oidc = OidcVerifier::new(http);
    let fleet = Fleet::open(
        Arc::clone(&store),
        settings.device_ttl,
        settings.enrollment_ttl,
    )
    .context("reading enrollments and devices")?;
    Ok(Parts {
        store,
        killswitch,
        gateway_token,
        fleet_token,
        fleet,
        oidc,
    })
}

/// A running server: its bound addresses and shared state.
#[derive(Debug)]
pub struct Running {
    pub api_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub state: Arc<AppState>,
    /// The xDS host, when `--xds-listen` is set.
    pub xds: Option<Arc<crate::xds::XdsHost>>,
    /// The policy dir's watcher: what the API reads (and, with xDS, what is pushed).
    pub policy: Arc<PolicySource>,
    /// The in-process controller, with `--controller`.
    pub controller: Option<Arc<halo_controller::controller::Controller>>,
    /// The evidence receivers, when any `--otlp-*-listen` is set.
    pub evidence: Option<crate::evidence::Receivers>,
    /// The mirror service, with `--shadow-listen`.
    pub shadow: Option<crate::shadow::Mirror>,
    /// The budget service, with `--budget-listen`.
    pub budget: Option<crate::budget::BudgetServer>,
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
        if let Some(r) = self.evidence {
            r.shutdown().await;
        }
        if let Some(b) = self.budget {
            b.shutdown().await;
        }
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
    let parts = open_parts(settings)?;
    let receivers =
        crate::evidence::start(&settings.evidence, settings.data_dir.as_deref()).await?;
    let api = TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding --listen {}", settings.listen))?;
    let admin = TcpListener::bind(settings.admin_listen)
        .await
        .with_context(|| format!("binding --admin-listen {}", settings.admin_listen))?;
    let api_addr = api.local_addr()?;
    let admin_addr = admin.local_addr()?;
    // The mirror service's port is bound first: the xDS gateway settings name it.
    let shadow_listener = match settings.shadow.listen {
        Some(listen) => Some(
            TcpListener::bind(listen)
                .await
                .with_context(|| format!("binding --shadow-listen {listen}"))?,
        ),
        None => None,
    };
    let shadow_addr = match &shadow_listener {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };
    let xds = crate::xds::start(
        settings,
        xds,
        parts.killswitch.as_ref(),
        crate::xds::ServerAddrs {
            api: api_addr,
            shadow: shadow_addr,
        },
        parts.oidc.http().clone(),
    )
    .await?
    .map(Arc::new);
    // Without xDS the API still follows the policy dir, with the same watcher.
    let source = match &xds {
        Some(x) => x.source(),
        None => Arc::new(
            PolicySource::watch(settings.policy_dir.clone(), crate::xds::POLICY_POLL)
                .map_err(policy_error)?,
        ),
    };
    let budget = crate::budget::start(
        &settings.budget,
        settings.evidence.postgres_file.as_deref(),
        settings.data_dir.as_deref(),
        source.served(),
        xds.as_ref().map(|x| x.pushed.clone()),
        settings.evidence.retention,
    )
    .await?;
    let controller = crate::controller::build(
        settings,
        source.served(),
        receivers.as_ref().map(|r| Arc::clone(&r.evidence.store)),
        parts
            .killswitch
            .as_ref()
            .map(|switch| halo_controller::assemble::ServerKill {
                switch: Arc::clone(switch),
                store: Arc::clone(&parts.store),
            }),
    )?;
    let shadow_store = match (&shadow_listener, &receivers) {
        (None, _) => None,
        (Some(_), Some(r)) => Some(Arc::clone(&r.evidence.store)),
        (Some(_), None) => {
            let (pg, dir) = (
                settings.evidence.postgres_file.clone(),
                settings.data_dir.clone(),
            );
            Some(
                tokio::task::spawn_blocking(move || {
                    halo_evidence::open::open_store(pg.as_deref(), dir.as_deref())
                })
                .await
                .context("opening the evidence store")??,
            )
        }
    };
    let samples = receivers
        .as_ref()
        .map(|r| Arc::clone(&r.evidence.store))
        .or_else(|| shadow_store.clone());
    let mirror = match (shadow_listener, shadow_store) {
        (Some(listener), Some(store)) => Some(crate::shadow::start(
            &settings.shadow,
            listener,
            source.served(),
            xds.as_ref().map(|x| x.hosts.clone()).unwrap_or_default(),
            xds.as_ref().map(|x| x.upstream_ca_file.as_path()),
            store,
        )?),
        _ => None,
    };
    let state = Arc::new(AppState {
        policy: source.served(),
        store: parts.store,
        killswitch: parts.killswitch,
        gateway_token: parts.gateway_token,
        fleet_token: parts.fleet_token,
        fleet: parts.fleet,
        oidc: parts.oidc,
        throttle: Throttle::default(),
        metrics: Metrics::default(),
        max_body_bytes: settings.max_body_bytes,
        evidence: receivers.as_ref().map(|r| Arc::clone(&r.evidence)),
        samples,
        budget: budget.as_ref().map(|b| Arc::clone(&b.budgets)),
        controller: controller.clone(),
        shadow: mirror.as_ref().map(|m| Arc::clone(&m.metrics)),
    });
    if let Some(ks) = &state.killswitch {
        ks.spawn_resigner();
        if settings.data_dir.is_some() {
            // `halo controller run` may append kills to this data dir.
            ks.spawn_follower(halo_killswitch::FOLLOW_EVERY);
        }
    }
    let (tx, rx) = tokio::sync::watch::channel(false);
    let stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let console_key = crate::console::session::load_key(settings.data_dir.as_deref())?;
    let api_app = router(Arc::clone(&state))
        .merge(crate::console::router(
            Arc::clone(&state),
            console_key,
            settings.console_url.clone(),
            xds.clone(),
        ))
        .into_make_service_with_connect_info::<Peer>();
    let admin_app = admin_router(Arc::clone(&state), Arc::clone(&source), xds.clone());
    let api_rx = rx.clone();
    let controller_rx = rx.clone();
    let mut tasks = vec![
        tokio::spawn(async move {
            if let Err(e) = axum::serve(JsonListener(api), api_app)
                .with_graceful_shutdown(stop(api_rx))
                .await
            {
                tracing::error!(error = %e, "API listener failed");
            }
        }),
        tokio::spawn(async move {
            if let Err(e) = axum::serve(JsonListener(admin), admin_app)
                .with_graceful_shutdown(stop(rx))
                .await
            {
                tracing::error!(error = %e, "admin listener failed");
            }
        }),
    ];
    if let Some(c) = &controller {
        let (c, interval) = (Arc::clone(c), settings.controller.interval);
        tasks.push(tokio::spawn(async move {
            c.run(interval, stop(controller_rx)).await
        }));
    }
    tracing::info!(%api_addr, %admin_addr, controller = controller.is_some(), kill_switch = state.killswitch.is_some(), storage = %state.store.describe(), "halo-server listening");
    Ok(Running {
        api_addr,
        admin_addr,
        state,
        xds,
        policy: source,
        evidence: receivers,
        shadow: mirror,
        budget,
        controller,
        shutdown: tx,
        tasks,
    })
}
