//! `halo istio render` and `halo envoy-gateway render`: the mesh manifests rendered from a
//! policy repo (halo-mesh renders; this module reads the policy and flags and writes).
//!
//! Two modes (`--mode`): `service` (the default: the halo gateway deployed as a mesh
//! service, halo-server driving it over xDS; the only mode that serves every policy
//! feature) and `in-proxy` (the filter inside the mesh's own Envoy, which refuses alias
//! targets needing the per-attempt stage).
//!
//! The kill-list poll is configured with `--kill-switch-pubkey`: halo-server's in-cluster
//! Service, the public key inline (public), the gateway token by reference only (the proxy
//! environment variable HALO_GATEWAY_TOKEN, filled from a Secret by the operator).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use clap::Subcommand;
use halo_fsutil::write_atomic;
use halo_mesh::envoy_gateway::{self, GatewayOptions};
use halo_mesh::istio::{self, Delivery, IstioOptions};
use halo_mesh::service::ServiceOptions;
use halo_mesh::{Image, KillSwitchRef, to_yaml};
use halo_policy::compile;
use serde_json::{Map, Value, json};

use crate::Failure;
use crate::policy_dir::load_valid;

#[derive(Debug, Subcommand)]
pub enum IstioCommand {
    /// One YAML stream. `--mode service` (default): halo-server, the halo gateway and the
    /// Istio routing to it (PeerAuthentication, DestinationRule, VirtualService,
    /// ServiceEntry per external host). `--mode in-proxy`: EnvoyFilter (or WasmPlugin),
    /// RequestAuthentication, ServiceEntry + DestinationRule per upstream and the
    /// VirtualService.
    Render(IstioArgs),
}

#[derive(Debug, Subcommand)]
pub enum EnvoyGatewayCommand {
    /// One YAML stream. `--mode service` (default): halo-server, the halo gateway and the
    /// HTTPRoute to it. `--mode in-proxy`: EnvoyExtensionPolicy, EnvoyPatchPolicy,
    /// SecurityPolicy, Backend + BackendTLSPolicy per upstream, HTTPRoute and
    /// BackendTrafficPolicy.
    Render(GatewayArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// The halo gateway as a mesh service (Envoy driven over xDS by halo-server): every
    /// policy feature.
    Service,
    /// The filter inside the mesh's own Envoy: single pass-through targets only.
    InProxy,
}

/// Flags of the service mode.
#[derive(Debug, clap::Args)]
pub struct ServiceArgs {
    /// service (default: the halo gateway as a mesh service, every policy feature) or
    /// in-proxy (the filter in the mesh's own Envoy).
    #[arg(long, value_enum, default_value = "service")]
    mode: Mode,
    /// Envoy 1.40's image for the gateway pods, pinned by digest (service mode).
    #[arg(long, value_name = "IMAGE")]
    envoy_image: Option<String>,
    /// halo-server's image, pinned by digest (service mode).
    #[arg(long, value_name = "IMAGE")]
    server_image: Option<String>,
    /// halo-credentials' image (service mode, a policy routing to Vertex).
    #[arg(long, value_name = "IMAGE")]
    credentials_image: Option<String>,
    /// Gateway replicas (service mode).
    #[arg(long, value_name = "N", default_value_t = 2)]
    replicas: u32,
    /// halo-server's data claim size (service mode).
    #[arg(long, value_name = "SIZE", default_value = "10Gi")]
    data_size: String,
    /// Secret holding provider keys under the policy's credential.env names (service mode).
    #[arg(long, value_name = "SECRET", default_value = "halo-provider-keys")]
    provider_keys_secret: String,
    /// Namespace allowed to reach the admin ports (service mode).
    #[arg(long, value_name = "NS", default_value = "monitoring")]
    monitoring_namespace: String,
}

/// Flags both renderers share.
#[derive(Debug, clap::Args)]
pub struct CommonArgs {
    #[arg(long, value_name = "DIR", env = "HALO_POLICY_DIR")]
    policy_dir: PathBuf,
    /// The filter image, pinned: oci://REGISTRY/REPOSITORY@sha256:<digest>
    /// (`halo wasm publish` prints it; the service mode mounts the `-compat` one).
    #[arg(long, value_name = "OCI_REF")]
    image: String,
    /// Hostname developers call (repeatable; default: any).
    #[arg(long = "host", value_name = "HOST")]
    hosts: Vec<String>,
    /// IfNotPresent or Always.
    #[arg(long, value_name = "POLICY", default_value = "IfNotPresent")]
    image_pull_policy: String,
    /// Secret holding the registry credentials.
    #[arg(long, value_name = "SECRET")]
    image_pull_secret: Option<String>,
    /// The identity provider's JWKS URL (default: <issuer>/.well-known/jwks.json).
    #[arg(long, value_name = "URL")]
    jwks_uri: Option<String>,
    /// Route callers whose token fails verification anonymously (ring unknown).
    #[arg(long)]
    allow_unverified: bool,
    /// Largest model-call body in bytes (default 32 MiB); larger is 413.
    #[arg(long, value_name = "BYTES")]
    max_body_bytes: Option<u64>,
    /// halo-server's kill-list verification key (ed25519 public key, PEM): configures the
    /// filter's kill-list poll to halo-server's Service. The gateway token is never
    /// rendered: set HALO_GATEWAY_TOKEN on the gateway pods from a Secret.
    #[arg(long, value_name = "FILE")]
    kill_switch_pubkey: Option<PathBuf>,
    /// halo-server's Service FQDN (the kill-list poll's target).
    #[arg(
        long,
        value_name = "FQDN",
        default_value = "halo-server.halos.svc.cluster.local"
    )]
    kill_switch_service: String,
    /// halo-server's API port.
    #[arg(long, value_name = "PORT", default_value_t = halo_mesh::control_plane::API_PORT)]
    kill_switch_port: u16,
    /// Kill-list poll interval in seconds (default 10).
    #[arg(long, value_name = "SECONDS")]
    kill_switch_interval: Option<u32>,
    /// Output file (written atomically), or - for standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE", default_value = "-")]
    output: PathBuf,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum DeliveryArg {
    /// EnvoyFilter (EXTENSION_CONFIG + HTTP_FILTER) setting allow_on_headers_stop_iteration.
    EnvoyFilter,
    /// WasmPlugin: cannot set allow_on_headers_stop_iteration; model calls hang.
    WasmPlugin,
}

#[derive(Debug, clap::Args)]
pub struct IstioArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    service: ServiceArgs,
    /// Namespace of every rendered object: the halo gateway's (service mode, default
    /// halos) or the Istio gateway workload's (in-proxy mode, default istio-system).
    #[arg(long)]
    namespace: Option<String>,
    /// Workload label of the gateway running the filter, KEY=VALUE (repeatable).
    #[arg(
        long = "selector",
        value_name = "KEY=VALUE",
        default_value = "istio=ingressgateway"
    )]
    selectors: Vec<String>,
    /// Istio Gateway the VirtualService binds to, NAMESPACE/NAME (repeatable).
    #[arg(
        long = "gateway",
        value_name = "NS/NAME",
        default_value = "istio-system/halo-gateway"
    )]
    gateways: Vec<String>,
    /// How the filter is attached: envoy-filter (works) or wasm-plugin (kept for when
    /// Istio's WasmPlugin exposes allow_on_headers_stop_iteration).
    #[arg(long, value_enum, default_value = "envoy-filter")]
    delivery: DeliveryArg,
    /// A Secret in the gateway's namespace holding the private CA (`ca.crt`) that signed
    /// the https upstreams' certificates; default: the proxy's system CA bundle.
    #[arg(long, value_name = "SECRET")]
    upstream_ca_credential: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct GatewayArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    service: ServiceArgs,
    /// Namespace of the Gateway (and of every rendered object).
    #[arg(long, default_value = "halos")]
    namespace: String,
    /// The Gateway API Gateway the policies and the HTTPRoute attach to.
    #[arg(long, value_name = "NAME", default_value = "halo-gateway")]
    gateway: String,
    /// The Gateway's Envoy listener (xDS name) the EnvoyPatchPolicy patches
    /// (default NAMESPACE/GATEWAY/https; tcp-PORT with Envoy Gateway's v2 xDS names).
    #[arg(long, value_name = "NAME")]
    listener: Option<String>,
}

pub fn run_istio(command: IstioCommand) -> Result<(), Failure> {
    let IstioCommand::Render(args) = command;
    let (snap, image, settings) = prepare(&args.common)?;
    if args.service.mode == Mode::Service {
        let ns = args.namespace.clone().unwrap_or_else(|| "halos".into());
        let opts = service_options(&args.common, &args.service, ns, image, settings)?;
        let docs = istio::render_service(&snap, &opts, &args.gateways, &hosts(&args.common))
            .context("rendering the Istio manifests")?;
        return write(&args.common, &docs, "halo istio render", None);
    }
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| "istio-system".into());
    let mut selector = BTreeMap::new();
    for s in &args.selectors {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| anyhow!("--selector {s:?}: expected KEY=VALUE"))?;
        selector.insert(k.to_string(), v.to_string());
    }
    let opts = IstioOptions {
        image,
        namespace,
        selector,
        gateways: args.gateways.clone(),
        hosts: hosts(&args.common),
        image_pull_policy: args.common.image_pull_policy.clone(),
        image_pull_secret: args.common.image_pull_secret.clone(),
        jwks_uri: args.common.jwks_uri.clone(),
        settings,
        delivery: match args.delivery {
            DeliveryArg::EnvoyFilter => Delivery::EnvoyFilter,
            DeliveryArg::WasmPlugin => Delivery::WasmPlugin,
        },
        kill_switch: kill_switch(&args.common)?,
        upstream_ca_credential: args.upstream_ca_credential.clone(),
    };
    let docs = istio::render(&snap, &opts).context("rendering the Istio manifests")?;
    let warning = (opts.delivery == Delivery::WasmPlugin).then_some(istio::WASM_PLUGIN_WARNING);
    if let Some(w) = warning {
        eprintln!("halo: {w}");
    }
    write(&args.common, &docs, "halo istio render", warning)
}

pub fn run_envoy_gateway(command: EnvoyGatewayCommand) -> Result<(), Failure> {
    let EnvoyGatewayCommand::Render(args) = command;
    let (snap, image, settings) = prepare(&args.common)?;
    if args.service.mode == Mode::Service {
        let opts = service_options(
            &args.common,
            &args.service,
            args.namespace.clone(),
            image,
            settings,
        )?;
        let docs = envoy_gateway::render_service(&snap, &opts, &args.gateway, &args.common.hosts)
            .context("rendering the Envoy Gateway manifests")?;
        return write(&args.common, &docs, "halo envoy-gateway render", None);
    }
    let opts = GatewayOptions {
        image,
        namespace: args.namespace.clone(),
        gateway: args.gateway.clone(),
        hosts: args.common.hosts.clone(),
        image_pull_policy: args.common.image_pull_policy.clone(),
        image_pull_secret: args.common.image_pull_secret.clone(),
        jwks_uri: args.common.jwks_uri.clone(),
        settings,
        listener: args
            .listener
            .clone()
            .unwrap_or_else(|| format!("{}/{}/https", args.namespace, args.gateway)),
        kill_switch: kill_switch(&args.common)?,
    };
    let docs =
        envoy_gateway::render(&snap, &opts).context("rendering the Envoy Gateway manifests")?;
    write(&args.common, &docs, "halo envoy-gateway render", None)
}

/// The service mode's options; the in-proxy mode's flags are refused rather than ignored.
fn service_options(
    common: &CommonArgs,
    service: &ServiceArgs,
    namespace: String,
    filter_image: Image,
    settings: Value,
) -> Result<ServiceOptions, Failure> {
    if common.kill_switch_pubkey.is_some() {
        return Err(anyhow!(
            "--kill-switch-pubkey is for --mode in-proxy: in the service mode halo-server pushes the kill list to the gateway itself (its key is the Secret halo-killswitch-key)"
        )
        .into());
    }
    if common.image_pull_secret.is_some() {
        return Err(anyhow!(
            "--image-pull-secret is for --mode in-proxy: in the service mode the filter image is an image volume of the gateway pods; give their ServiceAccount the pull Secret"
        )
        .into());
    }
    let required = |flag: &str, v: &Option<String>| {
        v.clone()
            .ok_or_else(|| anyhow!("--mode service needs {flag} (pinned by digest)"))
    };
    let mut policy_files = Vec::new();
    collect_yaml(&common.policy_dir, &common.policy_dir, &mut policy_files)?;
    policy_files.sort();
    Ok(ServiceOptions {
        namespace,
        envoy_image: required("--envoy-image", &service.envoy_image)?,
        server_image: required("--server-image", &service.server_image)?,
        filter_image,
        credentials_image: service.credentials_image.clone(),
        policy_files,
        replicas: service.replicas,
        data_size: service.data_size.clone(),
        provider_keys_secret: service.provider_keys_secret.clone(),
        settings,
        jwks_uri: common.jwks_uri.clone(),
        monitoring_namespace: service.monitoring_namespace.clone(),
        image_pull_policy: common.image_pull_policy.clone(),
    })
}

fn kill_switch(common: &CommonArgs) -> Result<Option<KillSwitchRef>, Failure> {
    let Some(path) = &common.kill_switch_pubkey else {
        return Ok(None);
    };
    let pubkey_pem = std::fs::read_to_string(path)
        .with_context(|| format!("reading --kill-switch-pubkey {}", path.display()))?;
    Ok(Some(KillSwitchRef {
        service: common.kill_switch_service.clone(),
        port: common.kill_switch_port,
        pubkey_pem,
        interval_seconds: common.kill_switch_interval,
    }))
}

fn hosts(common: &CommonArgs) -> Vec<String> {
    if common.hosts.is_empty() {
        vec!["*".to_string()]
    } else {
        common.hosts.clone()
    }
}

fn prepare(common: &CommonArgs) -> Result<(halo_policy::Snapshot, Image, Value), Failure> {
    let org = load_valid(&common.policy_dir)?;
    let snap = compile(&org);
    let image = Image::parse(&common.image).context("--image")?;
    let mut settings = Map::new();
    if common.allow_unverified {
        settings.insert("identity".into(), json!({"allowAnonymous": true}));
        eprintln!(
            "halo: warning: --allow-unverified: callers whose token fails verification are routed anonymously"
        );
    }
    if let Some(max) = common.max_body_bytes {
        settings.insert("maxBodyBytes".into(), json!(max));
    }
    Ok((snap, image, Value::Object(settings)))
}

fn write(
    common: &CommonArgs,
    docs: &[Value],
    command: &str,
    warning: Option<&str>,
) -> Result<(), Failure> {
    let source = common.policy_dir.display().to_string();
    let mut header = format!(
        "Generated by `{command}` from {source}.\nDo not edit: change the policy or the flags and render again."
    );
    if let Some(w) = warning {
        header = format!("{w}\n{header}");
    }
    let yaml = to_yaml(docs, &header);
    if common.output == Path::new("-") {
        print!("{yaml}");
    } else {
        write_atomic(&common.output, yaml.as_bytes(), 0o644).context("writing the manifests")?;
        eprintln!("rendered {source} -> {}", common.output.display());
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum ControlPlaneCommand {
    /// halo-server's ServiceAccount, policy ConfigMap, Deployment, Service and
    /// NetworkPolicy; its secrets are referenced by name, never rendered.
    Render(ControlPlaneArgs),
}

#[derive(Debug, clap::Args)]
pub struct ControlPlaneArgs {
    #[arg(long, value_name = "DIR", env = "HALO_POLICY_DIR")]
    policy_dir: PathBuf,
    /// The halo-server container image (pin it by digest).
    #[arg(long, value_name = "IMAGE")]
    image: String,
    #[arg(long, default_value = "halos")]
    namespace: String,
    /// Secret holding killswitch.key.
    #[arg(long, default_value = "halo-killswitch-key")]
    killswitch_key_secret: String,
    /// Secret holding gateway.token.
    #[arg(long, default_value = "halo-gateway-token")]
    gateway_token_secret: String,
    /// Secret holding fleet.token.
    #[arg(long, default_value = "halo-fleet-token")]
    fleet_token_secret: String,
    /// PersistentVolumeClaim for the data dir.
    #[arg(long, default_value = "halo-server-data")]
    data_claim: String,
    /// Namespace allowed to reach the admin port (/metrics).
    #[arg(long, default_value = "monitoring")]
    monitoring_namespace: String,
    #[arg(short = 'o', long = "output", value_name = "FILE", default_value = "-")]
    output: PathBuf,
}

pub fn run_control_plane(command: ControlPlaneCommand) -> Result<(), Failure> {
    let ControlPlaneCommand::Render(args) = command;
    // Only a valid policy is shipped.
    load_valid(&args.policy_dir)?;
    let mut policy_files = Vec::new();
    collect_yaml(&args.policy_dir, &args.policy_dir, &mut policy_files)?;
    policy_files.sort();
    let opts = halo_mesh::control_plane::ControlPlaneOptions {
        namespace: args.namespace.clone(),
        image: args.image.clone(),
        policy_files,
        killswitch_key_secret: args.killswitch_key_secret.clone(),
        gateway_token_secret: args.gateway_token_secret.clone(),
        fleet_token_secret: args.fleet_token_secret.clone(),
        data_claim: args.data_claim.clone(),
        monitoring_namespace: args.monitoring_namespace.clone(),
        xds: None,
        data_claim_size: None,
    };
    let docs = halo_mesh::control_plane::render(&opts).context("rendering halo-server")?;
    let common_out = args.output.clone();
    let source = args.policy_dir.display().to_string();
    let yaml = to_yaml(
        &docs,
        &format!(
            "Generated by `halo control-plane render` from {source}.\nDo not edit: change the policy or the flags and render again."
        ),
    );
    if common_out == Path::new("-") {
        print!("{yaml}");
    } else {
        write_atomic(&common_out, yaml.as_bytes(), 0o644).context("writing the manifests")?;
        eprintln!("rendered {source} -> {}", common_out.display());
    }
    Ok(())
}

fn collect_yaml(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            collect_yaml(root, &path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            let rel = path
                .strip_prefix(root)
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            out.push((rel, text));
        }
    }
    Ok(())
}
