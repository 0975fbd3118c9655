//! `halo istio render` and `halo envoy-gateway render`: the mesh manifests rendered from a
//! policy repo (halo-mesh renders; this module reads the policy and flags and writes).
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
use halo_mesh::{Image, KillSwitchRef, to_yaml};
use halo_policy::compile;
use serde_json::{Map, Value, json};

use crate::Failure;
use crate::policy_dir::load_valid;

#[derive(Debug, Subcommand)]
pub enum IstioCommand {
    /// WasmPlugin, RequestAuthentication, ServiceEntry + DestinationRule per upstream and
    /// the VirtualService, as one YAML stream.
    Render(IstioArgs),
}

#[derive(Debug, Subcommand)]
pub enum EnvoyGatewayCommand {
    /// EnvoyExtensionPolicy, SecurityPolicy, Backend + BackendTLSPolicy per upstream,
    /// HTTPRoute and BackendTrafficPolicy, as one YAML stream.
    Render(GatewayArgs),
}

/// Flags both renderers share.
#[derive(Debug, clap::Args)]
pub struct CommonArgs {
    #[arg(long, value_name = "DIR", env = "HALO_POLICY_DIR")]
    policy_dir: PathBuf,
    /// The filter image, pinned: oci://REGISTRY/REPOSITORY@sha256:<digest>
    /// (`halo wasm publish` prints it).
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
    /// Namespace of the gateway workload (and of every rendered object).
    #[arg(long, default_value = "istio-system")]
    namespace: String,
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
    let mut selector = BTreeMap::new();
    for s in &args.selectors {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| anyhow!("--selector {s:?}: expected KEY=VALUE"))?;
        selector.insert(k.to_string(), v.to_string());
    }
    let opts = IstioOptions {
        image,
        namespace: args.namespace.clone(),
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
