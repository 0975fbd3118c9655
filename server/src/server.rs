//! Startup, and the one place that knows every feature: read keys and tokens, open the
//! store, bind the listeners, start the policy source (the policy dir, watched; with
//! `--xds-listen` it also feeds the xDS server), build each feature from its own parts,
//! register its metrics, mount its routes, and serve until shutdown. Every feature reads
//! the policy the source serves now, never a copy taken at startup.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use halo_xds::PolicySource;
use tokio::net::TcpListener;

use axum::Router;
use axum::routing::get;
use halo_killswitch::KillSwitch;
use halo_metrics::{FnCollector, Registry, Text};
use halo_store::{FileStore, LogStore, MemoryStore};
use serde_json::json;

use crate::auth::{OidcVerifier, http_client};
use crate::budget::BudgetsApi;
use crate::capabilities::Capabilities;
use crate::config::Settings;
use crate::controller::{ControllerApi, ControllerMetrics};
use crate::evidence::SamplesApi;
use crate::fleet::{Devices, FleetApi};
use crate::http::listener::{JsonListener, Peer};
use crate::http::secret::SecretGate;
use crate::http::{AdminAuth, Requests, finish, or_disabled};
use crate::kill::{Kill, KillMetrics, KillParts};
use crate::policy::Policy;
use crate::token::read_token_file;
use crate::xds::{XdsMetrics, policy_error};

/// Every (method, path template) the API listener serves, feature by feature; the
/// OpenAPI test checks the document lists exactly these.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    [
        crate::capabilities::ROUTES,
        crate::kill::ROUTES,
        crate::fleet::ROUTES,
        crate::evidence::ROUTES,
        crate::controller::ROUTES,
        crate::budget::ROUTES,
    ]
    .concat()
}

/// Everything the state holds but the policy: read from settings (every file), with
/// the store and the kill log open.
struct Parts {
    store: Arc<dyn LogStore>,
    killswitch: Option<Arc<KillSwitch>>,
    gateway_token: Option<crate::token::TokenDigest>,
    fleet_token: Option<crate::token::TokenDigest>,
    devices: Devices,
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
    let devices = Devices::open(
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
        devices,
        oidc,
    })
}

/// A running server: its bound addresses and its features.
#[derive(Debug)]
pub struct Running {
    pub api_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The kill switch, with a kill key.
    pub kill: Option<Arc<Kill>>,
    /// The fleet: enrollments, devices, reports.
    pub fleet: Arc<FleetApi>,
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

impl Running {
    /// The kill switch, with a kill key.
    pub fn killswitch(&self) -> Option<&Arc<KillSwitch>> {
        self.kill.as_ref().map(|k| k.switch())
    }

    /// The policy served at this moment.
    pub fn policy_now(&self) -> Arc<halo_xds::Served> {
        Arc::clone(&self.policy.served().borrow())
    }

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
        &settings.controller,
        settings.data_dir.as_deref(),
        &settings.policy_dir,
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
    // The features, each from its own parts.
    let policy = Policy::new(source.served());
    let admin_auth = Arc::new(AdminAuth::new(policy.clone(), parts.oidc));
    let gate = Arc::new(SecretGate::default());
    let devices = Arc::new(parts.devices);
    let kill = parts.killswitch.as_ref().map(|switch| {
        Kill::new(KillParts {
            switch: Arc::clone(switch),
            store: Arc::clone(&parts.store),
            policy: policy.clone(),
            gateway_token: parts.gateway_token.clone(),
            gate: Arc::clone(&gate),
            admin: Arc::clone(&admin_auth),
            devices: Arc::clone(&devices),
        })
    });
    let fleet = Arc::new(FleetApi {
        devices,
        store: Arc::clone(&parts.store),
        policy: policy.clone(),
        fleet_token: parts.fleet_token.clone(),
        gate: Arc::clone(&gate),
        admin: Arc::clone(&admin_auth),
    });
    let controller_api = Arc::new(ControllerApi {
        controller: controller.clone(),
        policy: policy.clone(),
        admin: Arc::clone(&admin_auth),
    });
    let capabilities = Arc::new(Capabilities {
        kill_switch: kill.is_some(),
        fleet_token: parts.fleet_token.is_some(),
        storage: parts.store.describe(),
        policy: policy.clone(),
    });
    let samples_api = samples.map(|store| {
        Arc::new(SamplesApi {
            store,
            admin: Arc::clone(&admin_auth),
        })
    });
    let budgets_api = budget.as_ref().map(|b| {
        Arc::new(BudgetsApi {
            budgets: Arc::clone(&b.budgets),
            admin: Arc::clone(&admin_auth),
        })
    });

    // /metrics: each feature's families, in this order.
    let registry = Registry::default();
    let requests = Arc::new(Requests::default());
    {
        let (requests, gate) = (Arc::clone(&requests), Arc::clone(&gate));
        registry.register(Arc::new(FnCollector(move |out: &mut Text| {
            requests.write_prometheus(out);
            gate.write_prometheus(out);
        })));
    }
    registry.register(Arc::new(KillMetrics(kill.clone())));
    registry.register(Arc::new(XdsMetrics {
        source: Arc::clone(&source),
        host: xds.clone(),
    }));
    if let Some(r) = &receivers {
        let evidence = Arc::clone(&r.evidence);
        registry.register(Arc::new(FnCollector(move |out: &mut Text| {
            evidence.metrics.write_prometheus(out);
        })));
    }
    if let Some(b) = &budget {
        let budgets = Arc::clone(&b.budgets);
        registry.register(Arc::new(FnCollector(move |out: &mut Text| {
            budgets.metrics.write_prometheus(out);
        })));
    }
    if let Some(c) = &controller {
        registry.register(Arc::new(ControllerMetrics(Arc::clone(c))));
    }
    if let Some(m) = &mirror {
        let metrics = Arc::clone(&m.metrics);
        registry.register(Arc::new(FnCollector(move |out: &mut Text| {
            metrics.write_prometheus(out);
        })));
    }

    if let Some(ks) = &parts.killswitch {
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
    let console = crate::console::router(
        crate::console::ConsoleParts {
            admin: Arc::clone(&admin_auth),
            kill: kill.clone(),
            fleet: Arc::clone(&fleet),
            controller: Arc::clone(&controller_api),
            store: Arc::clone(&parts.store),
            xds: xds.clone(),
        },
        console_key,
        settings.console_url.clone(),
    );
    let api_routes = Router::new()
        .merge(Arc::clone(&capabilities).router())
        .merge(or_disabled(
            kill.as_ref().map(Kill::router),
            crate::kill::ROUTES,
            crate::kill::DISABLED,
        ))
        .merge(fleet.router())
        .merge(SamplesApi::router(samples_api))
        .merge(controller_api.router())
        .merge(BudgetsApi::router(budgets_api));
    // The console answers HTML: it is merged after the API's JSON finish.
    let api_app = finish(api_routes, settings.max_body_bytes, Some(requests))
        .merge(console)
        .into_make_service_with_connect_info::<Peer>();
    let registry = Arc::new(registry);
    let admin_routes = Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .route(
            "/metrics",
            get(move || {
                let registry = Arc::clone(&registry);
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4",
                        )],
                        registry.render().await,
                    )
                }
            }),
        )
        .merge(crate::xds::admin_router(xds.clone()));
    let admin_app = finish(admin_routes, settings.max_body_bytes, None);
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
    tracing::info!(%api_addr, %admin_addr, controller = controller.is_some(), kill_switch = kill.is_some(), storage = %capabilities.storage, "halo-server listening");
    Ok(Running {
        api_addr,
        admin_addr,
        kill,
        fleet,
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
