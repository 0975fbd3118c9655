//! `halo envoy bootstrap`: render the standalone Envoy bootstrap (static resources, no
//! control plane) from a policy repo, so nobody hand-edits Envoy YAML. The rendering is
//! halo-envoy-config's; this module reads files and flags and writes the result.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Subcommand;
use halo_envoy_config::bootstrap::{Standalone, standalone_yaml};
use halo_envoy_config::plan::GatewaySettings;
use halo_fsutil::write_atomic;
use halo_policy::compile;
use serde_json::{Map, Value, json};

use crate::Failure;
use crate::policy_dir::load_valid;

#[derive(Debug, Subcommand)]
pub enum EnvoyCommand {
    /// Render envoy/standalone.yaml: listener -> jwt_authn -> the halo filter -> router,
    /// one cluster per upstream, the JWKS and kill-list clusters.
    Bootstrap(BootstrapArgs),
}

#[derive(Debug, clap::Args)]
pub struct BootstrapArgs {
    #[arg(long, value_name = "DIR", env = "HALO_POLICY_DIR")]
    policy_dir: PathBuf,
    /// Where Envoy finds the filter: halo_filter.wasm (proxy-wasm, V8), or the native
    /// build libhalo_filter_native.so (an Envoy 1.40 dynamic module; a `.so` path renders
    /// it, with jwt_authn also forwarding the verified payload to it).
    #[arg(
        long,
        alias = "filter",
        value_name = "PATH",
        default_value = "/etc/halos/halo_filter.wasm"
    )]
    wasm: String,
    /// Listener address.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:8080")]
    listen: String,
    /// Admin address (stats, /ready, Prometheus). Keep it private.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9901")]
    admin: String,
    /// The identity provider's JWKS URL (default: the `jwks_uri` of the issuer's OIDC
    /// discovery document, else <issuer>/.well-known/jwks.json).
    #[arg(long, value_name = "URL")]
    jwks_uri: Option<String>,
    /// Edge mode: forward every model call, after the decision and with the model
    /// rewritten to the target's model id, to this gateway (e.g. http://kong:8000) instead
    /// of the policy's upstreams; no path. Add --forward-client-credentials when it must
    /// verify the client's token.
    #[arg(long, value_name = "URL")]
    next_hop: Option<String>,
    /// Where requests go that the policy has no route for (e.g. GET /v1/models), the
    /// caller identified first; without it they are answered 404.
    #[arg(long, value_name = "URL")]
    default_upstream: Option<String>,
    /// halo-server's kill list, e.g. https://halo-server/api/v1/gateway/killswitch.
    /// Needs --killswitch-token-file and --killswitch-pubkey.
    #[arg(long, value_name = "URL", requires_all = ["killswitch_token_file", "killswitch_pubkey"])]
    killswitch_url: Option<String>,
    /// File holding the gateway token for the kill list (written into the bootstrap,
    /// which is then created mode 0600).
    #[arg(long, value_name = "FILE", requires = "killswitch_url")]
    killswitch_token_file: Option<PathBuf>,
    /// The kill-switch public key (PEM).
    #[arg(long, value_name = "FILE", requires = "killswitch_url")]
    killswitch_pubkey: Option<PathBuf>,
    /// Poll interval in seconds (default 10).
    #[arg(long, value_name = "SECS")]
    killswitch_interval: Option<u32>,
    /// Allow a plain-http kill-list URL to an in-cluster service.
    #[arg(long)]
    killswitch_allow_insecure_in_cluster: bool,
    /// halo-server's mirror service (its `--shadow-listen`, e.g.
    /// https://halo-server:9445/mirror): shadow experiments' jobs go there. Needs
    /// --shadow-token-file.
    #[arg(long, value_name = "URL", requires = "shadow_token_file")]
    shadow_url: Option<String>,
    /// File holding the shadow token (halo-server's --shadow-token-file); written into the
    /// bootstrap, which is then created mode 0600.
    #[arg(long, value_name = "FILE", requires = "shadow_url")]
    shadow_token_file: Option<PathBuf>,
    /// Largest request (and job) body mirrored, in bytes (default 1 MiB); larger is counted
    /// and not mirrored.
    #[arg(long, value_name = "BYTES", requires = "shadow_url")]
    shadow_max_bytes: Option<u64>,
    /// Allow a plain-http mirror service URL to an in-cluster service.
    #[arg(long, requires = "shadow_url")]
    shadow_allow_insecure_in_cluster: bool,
    /// halo-server's OTLP gateway receiver (spec :4319, e.g. https://halo-server:4319):
    /// Envoy's OpenTelemetry access logger sends it one evidence record per decided model
    /// call. Needs --evidence-token-file.
    #[arg(long, value_name = "URL", requires = "evidence_token_file")]
    evidence_url: Option<String>,
    /// File holding the OTLP gateway token (halo-server's --otlp-gateway-token-file),
    /// sent as gRPC metadata; written into the bootstrap, which is then created mode 0600.
    #[arg(long, value_name = "FILE", requires = "evidence_url")]
    evidence_token_file: Option<PathBuf>,
    /// halo-server's budget service (its `--budget-listen`, e.g.
    /// https://halo-server:4321): with budgets in the policy, Envoy's ratelimit filter
    /// asks it before each budgeted call and adds the call's tokens and cost when it ends.
    /// Needs --budget-token-file.
    #[arg(long, value_name = "URL", requires = "budget_token_file")]
    budget_url: Option<String>,
    /// File holding the budget token (halo-server's --budget-token-file), sent as gRPC
    /// metadata; written into the bootstrap, which is then created mode 0600.
    #[arg(long, value_name = "FILE", requires = "budget_url")]
    budget_token_file: Option<PathBuf>,
    /// Route callers whose token fails verification anonymously (ring unknown).
    #[arg(long)]
    allow_unverified: bool,
    /// Keep the caller's Authorization, x-api-key, ... on the upstream request.
    #[arg(long)]
    forward_client_credentials: bool,
    /// Largest model-call body in bytes (default 32 MiB); larger is 413.
    #[arg(long, value_name = "BYTES")]
    max_body_bytes: Option<u64>,
    /// YAML (or JSON) file with the gateway's credential settings: signHosts,
    /// upstreamHosts, vertexTokenSds, vertexTokenSecret, upstreamHeaders (docs/cli.md,
    /// "envoy bootstrap"). Unknown keys are errors.
    #[arg(long, value_name = "FILE")]
    gateway_settings: Option<PathBuf>,
    /// CA bundle (PEM, as Envoy sees it) that every https cluster (providers, JWKS, kill
    /// list) verifies its server's certificate against, the URL's host being the name it
    /// must carry. Default: the system bundle of this host (Debian, Ubuntu, Alpine and the
    /// Envoy image: /etc/ssl/certs/ca-certificates.crt; RHEL, Fedora:
    /// /etc/pki/tls/certs/ca-bundle.crt; else /etc/ssl/cert.pem). Give a private CA's
    /// bundle (plus the public roots, if public providers are also used) for in-house
    /// upstreams.
    #[arg(long, value_name = "FILE")]
    upstream_ca_file: Option<PathBuf>,
    /// Output file (written atomically), or - for standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
}

pub fn run(command: EnvoyCommand) -> Result<(), Failure> {
    match command {
        EnvoyCommand::Bootstrap(args) => bootstrap(&args),
    }
}

fn split_addr(what: &str, text: &str) -> anyhow::Result<(String, u16)> {
    let (host, port) = text
        .rsplit_once(':')
        .with_context(|| format!("{what} {text:?}: expected ADDRESS:PORT"))?;
    let port = port
        .parse()
        .with_context(|| format!("{what} {text:?}: the port is not a number"))?;
    Ok((
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port,
    ))
}

/// The credential settings the renderer reads (halo-envoy-config's `credentials`), as an
/// operator writes them in `--gateway-settings`. Decoded strictly: a misspelt key is an
/// error, not a setting silently ignored.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CredentialSettings {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    sign_hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    upstream_hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vertex_token_sds: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vertex_token_secret: Option<String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    upstream_headers:
        std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
}

impl CredentialSettings {
    fn from_yaml(text: &str) -> anyhow::Result<CredentialSettings> {
        // serde-saphyr's message names the unknown or mistyped key and its line.
        serde_saphyr::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))
    }
}

fn read(path: &Path, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading the {what} {}", path.display()))
}

fn bootstrap(args: &BootstrapArgs) -> Result<(), Failure> {
    let org = load_valid(&args.policy_dir)?;
    let snapshot = compile(&org);
    let (listen_address, listen_port) = split_addr("--listen", &args.listen)?;
    let (admin_address, admin_port) = split_addr("--admin", &args.admin)?;

    let mut settings = Map::new();
    let mut warnings = Vec::new();
    if args.allow_unverified {
        settings.insert("identity".into(), json!({"allowAnonymous": true}));
        warnings.push("--allow-unverified: callers whose token fails verification are routed anonymously (ring unknown, no experiments)".to_string());
    }
    if args.forward_client_credentials {
        settings.insert("forwardAuth".into(), json!(true));
        warnings.push("--forward-client-credentials: the caller's Authorization and API-key headers reach the upstream".to_string());
    }
    if let Some(max) = args.max_body_bytes {
        settings.insert("maxBodyBytes".into(), json!(max));
    }
    if let Some(path) = &args.gateway_settings {
        let text = read(path, "gateway settings file")?;
        let decoded =
            CredentialSettings::from_yaml(&text).with_context(|| format!("{}", path.display()))?;
        if let Value::Object(m) = serde_json::to_value(decoded).unwrap_or(Value::Null) {
            settings.extend(m);
        }
    }
    let mut secret = false;
    if let Some(url) = &args.killswitch_url {
        if url.starts_with("http://") && !args.killswitch_allow_insecure_in_cluster {
            let host = url
                .trim_start_matches("http://")
                .split(['/', ':'])
                .next()
                .unwrap_or("");
            if !matches!(host, "127.0.0.1" | "localhost" | "[::1]") {
                return Err(Failure::Error(anyhow::anyhow!(
                    "--killswitch-url {url:?} is plain http: use https, or add --killswitch-allow-insecure-in-cluster for an in-cluster service"
                )));
            }
        }
        let (Some(token_file), Some(pubkey_file)) =
            (&args.killswitch_token_file, &args.killswitch_pubkey)
        else {
            return Err(Failure::Error(anyhow::anyhow!(
                "--killswitch-url needs --killswitch-token-file and --killswitch-pubkey"
            )));
        };
        let token = read(token_file, "kill-switch token file")?
            .trim()
            .to_string();
        if token.is_empty() {
            return Err(Failure::Error(anyhow::anyhow!(
                "{} is empty",
                token_file.display()
            )));
        }
        let pem = read(pubkey_file, "kill-switch public key")?;
        halo_policy::keys::public_key_from_pem(&pem)
            .with_context(|| format!("{}", pubkey_file.display()))?;
        let mut ks = json!({"token": token, "pubkey": pem, "allowInsecureInCluster": args.killswitch_allow_insecure_in_cluster});
        if let Some(i) = args.killswitch_interval {
            ks["intervalSeconds"] = json!(i);
        }
        settings.insert("killSwitch".into(), ks);
        secret = true;
    }
    if let (Some(_), Some(token_file)) = (&args.shadow_url, &args.shadow_token_file) {
        let token = read(token_file, "shadow token file")?.trim().to_string();
        if token.is_empty() {
            return Err(Failure::Error(anyhow::anyhow!(
                "--shadow-token-file {} is empty",
                token_file.display()
            )));
        }
        // The filter checks the URL (https, loopback, or the in-cluster opt-in) when it
        // starts; the plan fills in the cluster and URL.
        let mut shadow = json!({"token": token, "allowInsecureInCluster": args.shadow_allow_insecure_in_cluster});
        if let Some(max) = args.shadow_max_bytes {
            shadow["maxBytes"] = json!(max);
        }
        settings.insert("shadow".into(), shadow);
        secret = true;
    }
    let settings = Value::Object(settings);
    let upstream_ca_file = match &args.upstream_ca_file {
        Some(f) => f.display().to_string(),
        None => match halo_envoy_config::tls::system_ca_bundle() {
            Some(f) => f.to_string(),
            None => {
                let f = halo_envoy_config::tls::DEFAULT_UPSTREAM_CA_FILE;
                warnings.push(format!(
                    "no system CA bundle found on this host ({}): Envoy will verify upstreams against {f}; pass --upstream-ca-file if Envoy's host keeps it elsewhere",
                    halo_envoy_config::tls::SYSTEM_CA_BUNDLES.join(", ")
                ));
                f.to_string()
            }
        },
    };
    let evidence = grpc_service(
        args.evidence_url.as_ref(),
        args.evidence_token_file.as_ref(),
        "OTLP gateway token file",
        "--evidence-token-file",
    )?;
    let budgets = grpc_service(
        args.budget_url.as_ref(),
        args.budget_token_file.as_ref(),
        "budget token file",
        "--budget-token-file",
    )?;
    secret |= evidence.is_some() || budgets.is_some();
    let gateway = GatewaySettings {
        upstream_ca_file,
        listen_address,
        listen_port,
        wasm_path: args.wasm.clone(),
        jwks_uri: jwks_uri(
            &snapshot,
            args.jwks_uri.as_deref(),
            args.upstream_ca_file.as_deref(),
            &mut warnings,
        ),
        killswitch_url: args.killswitch_url.clone(),
        evidence,
        budgets,
        next_hop: args.next_hop.clone(),
        default_upstream: args.default_upstream.clone(),
        shadow_url: args.shadow_url.clone(),
        ..GatewaySettings::default()
    }
    .with_filter_settings(settings)
    .context("the gateway settings")?;
    let opts = Standalone {
        gateway,
        admin_address,
        admin_port,
    };
    // Policy credentials the bootstrap cannot use (a key for a host that may not get one,
    // a bedrock host outside AWS and signHosts...): said now, and in the file's header.
    warnings.extend(
        opts.plan(&snapshot)
            .context("planning the gateway")?
            .warnings,
    );
    for w in &warnings {
        eprintln!("halo: warning: {w}");
    }
    let source = args.policy_dir.display().to_string();
    let yaml =
        standalone_yaml(&snapshot, &opts, &source, &warnings).context("rendering the bootstrap")?;
    if args.output == Path::new("-") {
        if secret {
            bail_secret()?;
        }
        print!("{yaml}");
    } else {
        // The gateway token is inside: owner-only.
        let mode = if secret { 0o600 } else { 0o644 };
        write_atomic(&args.output, yaml.as_bytes(), mode).context("writing the bootstrap")?;
        eprintln!("rendered {} -> {}", source, args.output.display());
    }
    Ok(())
}

/// A gRPC service Envoy itself calls with a token (`{url, tokenFile}`: the evidence
/// receiver, the budget service) from its URL and token-file flags: the token read and
/// trimmed, never empty. `None` without the URL (clap requires both or neither).
fn grpc_service(
    url: Option<&String>,
    token_file: Option<&PathBuf>,
    what: &str,
    flag: &str,
) -> Result<Option<halo_envoy_config::evidence::Export>, Failure> {
    let (Some(url), Some(token_file)) = (url, token_file) else {
        return Ok(None);
    };
    let token = read(token_file, what)?.trim().to_string();
    if token.is_empty() {
        return Err(Failure::Error(anyhow::anyhow!(
            "{flag} {} is empty",
            token_file.display()
        )));
    }
    Ok(Some(halo_envoy_config::evidence::Export {
        url: url.clone(),
        token_file: Some(token_file.display().to_string()),
        token,
    }))
}

/// The JWKS URL jwt_authn fetches the issuer's keys from: `--jwks-uri`, else the issuer's
/// OIDC discovery document's `jwks_uri` (Okta and Azure AD do not publish their keys at
/// `<issuer>/.well-known/jwks.json`), else that default. Checked from here: keys Envoy
/// cannot fetch make every valid token a 401, so what cannot be read is a warning (the
/// rendering host may not reach what Envoy's does). Read with the CA bundle Envoy is told
/// to trust (`ca_file`) besides the system's; https only, but for a loopback issuer.
fn jwks_uri(
    snapshot: &halo_policy::Snapshot,
    given: Option<&str>,
    ca_file: Option<&std::path::Path>,
    warnings: &mut Vec<String>,
) -> Option<String> {
    let issuer = snapshot
        .identity
        .as_ref()
        .filter(|i| !i.issuer.is_empty())?
        .issuer
        .trim_end_matches('/')
        .to_string();
    let default = halo_envoy_config::plan::default_jwks_uri(&issuer);
    let client = match halo_auth::oauth::Client::new(ca_file) {
        Ok(c) => c,
        Err(e) => {
            warnings.push(format!("cannot check the issuer's keys: {e}"));
            return Some(given.map_or(default, str::to_string));
        }
    };
    let uri = match given {
        Some(u) => u.to_string(),
        None => match client.discover(&issuer) {
            Ok(endpoints) => endpoints.jwks_uri.unwrap_or_else(|| {
                warnings.push(format!(
                    "{issuer}'s OIDC discovery document names no jwks_uri: using {default}; pass --jwks-uri if the issuer keeps its keys elsewhere (every valid token would be refused, 401)"
                ));
                default
            }),
            Err(e) => {
                warnings.push(format!(
                    "cannot read {issuer}'s OIDC discovery document ({e}): using {default}; pass --jwks-uri if the issuer keeps its keys elsewhere (every valid token would be refused, 401)"
                ));
                default
            }
        },
    };
    if let Err(e) = client.jwks_keys(&uri) {
        warnings.push(format!(
            "cannot read the issuer's keys at {uri} from here ({e}): until Envoy can, it refuses every token (401)"
        ));
    }
    Some(uri)
}

fn bail_secret() -> anyhow::Result<()> {
    bail!(
        "the bootstrap holds the kill-switch token: write it to a file with -o FILE (created mode 0600), not to standard output"
    )
}
