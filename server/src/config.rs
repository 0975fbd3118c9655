//! halo-server's settings: flags, then `HALO_SERVER_<FLAG>` environment variables, then
//! the YAML file named by `--config`, then defaults, in that order of precedence.
//!
//! The YAML keys are the flag names (`data-dir: /var/lib/halo`): the file is decoded into
//! [`Flags`] itself, so every flag is a key and nothing else is (an unknown key is an
//! error naming it). Relative paths in the file are relative to the file's directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
pub const DEFAULT_DEVICE_TTL: Duration = Duration::from_secs(90 * 24 * 3600);
pub const DEFAULT_ENROLLMENT_TTL: Duration = Duration::from_secs(24 * 3600);
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024;

const EXAMPLES: &str = "\
Examples:
  # Keys and tokens, once:
  halo keys generate --name killswitch --out-dir /etc/halo
  openssl rand -hex 32 > /etc/halo/gateway.token
  openssl rand -hex 32 > /etc/halo/fleet.token

  # Serve the admin API, enrollment, the fleet endpoints and the signed kill list:
  halo-server --policy-dir ./policy --data-dir /var/lib/halo \\
    --killswitch-key-file /etc/halo/killswitch.key \\
    --gateway-token-file /etc/halo/gateway.token \\
    --token-file /etc/halo/fleet.token --listen 0.0.0.0:8080

  # The same from a YAML file (keys are the flag names), one value overridden by env:
  HALO_SERVER_LISTEN=0.0.0.0:8443 halo-server --config /etc/halo/server.yaml

Precedence: flags > HALO_SERVER_<FLAG> environment > --config YAML > defaults.
/healthz and /metrics are served on --admin-listen (default 127.0.0.1:9090).";

/// halo-server: the Halos web API for admins and fleets, and the signed kill switch.
///
/// One table for flags, environment and the `--config` file: clap reads the first two,
/// serde the file (keys kebab-case, as the flags).
#[derive(Debug, Clone, Default, Parser, Deserialize)]
#[command(name = "halo-server", version, about, after_help = EXAMPLES)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Flags {
    /// YAML file with any of the settings below (keys are the flag names).
    #[arg(long, value_name = "FILE", env = "HALO_SERVER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address of the API [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR", env = "HALO_SERVER_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Address of /healthz and /metrics [default: 127.0.0.1:9090].
    #[arg(long, value_name = "ADDR", env = "HALO_SERVER_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// The policy repo served (halos.yaml and every *.yaml below it); required.
    #[arg(long, value_name = "DIR", env = "HALO_SERVER_POLICY_DIR")]
    pub policy_dir: Option<PathBuf>,
    /// Where the kill log, audit log, enrollments and devices live (append-only JSONL,
    /// fsynced). Without it nothing survives a restart and the kill switch is off.
    #[arg(long, value_name = "DIR", env = "HALO_SERVER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// ed25519 private key (PKCS#8 PEM) that signs the kill list; enables the kill
    /// switch. Requires --data-dir and --gateway-token-file.
    #[arg(long, value_name = "FILE", env = "HALO_SERVER_KILLSWITCH_KEY_FILE")]
    pub killswitch_key_file: Option<PathBuf>,
    /// File holding the bearer token gateways present to fetch the kill list (random:
    /// `openssl rand -hex 32`).
    #[arg(long, value_name = "FILE", env = "HALO_SERVER_GATEWAY_TOKEN_FILE")]
    pub gateway_token_file: Option<PathBuf>,
    /// File holding the fleet token MDM and devcontainer fleets present on
    /// POST /api/v1/fleet/report (random: `openssl rand -hex 32`).
    #[arg(long, value_name = "FILE", env = "HALO_SERVER_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// How long a device token is valid after enrollment [default: 90d].
    #[arg(long, value_name = "DURATION", env = "HALO_SERVER_DEVICE_TTL", value_parser = humantime::parse_duration)]
    #[serde(default, with = "opt_duration")]
    pub device_ttl: Option<Duration>,
    /// How long a one-time enrollment token is valid after it is minted [default: 24h].
    #[arg(long, value_name = "DURATION", env = "HALO_SERVER_ENROLLMENT_TTL", value_parser = humantime::parse_duration)]
    #[serde(default, with = "opt_duration")]
    pub enrollment_ttl: Option<Duration>,
    /// Extra CA certificate(s), PEM, trusted when fetching the identity provider's
    /// discovery document and JWKS (an IdP behind a private CA).
    #[arg(long, value_name = "FILE", env = "HALO_SERVER_OIDC_CA_FILE")]
    pub oidc_ca_file: Option<PathBuf>,
    /// Largest request body accepted, in bytes [default: 65536].
    #[arg(long, value_name = "BYTES", env = "HALO_SERVER_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Serve xDS (ADS, gRPC) here: the policy dir is watched (content hash every 250 ms)
    /// and pushed to every connected Envoy, and so is every kill [default: off].
    #[arg(long, value_name = "ADDR", env = "HALO_SERVER_XDS_LISTEN")]
    pub xds_listen: Option<SocketAddr>,
    /// YAML (or JSON) file of the xDS gateway settings (listenAddress, listenPort,
    /// wasmPath, upstreamCaFile, jwksUri, filterSettings...; the README lists them with
    /// their defaults) for --xds-listen [default: the built-in defaults].
    #[arg(long, value_name = "FILE", env = "HALO_SERVER_XDS_GATEWAY_FILE")]
    pub xds_gateway_file: Option<PathBuf>,
    /// CLI evidence receiver, OTLP gRPC and HTTP (spec :4317): harness telemetry,
    /// stamped source=cli [default: off].
    #[arg(long, value_name = "ADDR", env = "HALO_SERVER_OTLP_CLI_LISTEN")]
    pub otlp_cli_listen: Option<SocketAddr>,
    /// A second CLI receiver address (spec :4318, for OTLP/HTTP exporters) [default: off].
    #[arg(long, value_name = "ADDR", env = "HALO_SERVER_OTLP_CLI_HTTP_LISTEN")]
    pub otlp_cli_http_listen: Option<SocketAddr>,
    /// File holding the bearer token the CLI receivers require [default: none required].
    #[arg(long, value_name = "FILE", env = "HALO_SERVER_OTLP_CLI_TOKEN_FILE")]
    pub otlp_cli_token_file: Option<PathBuf>,
    /// Gateway evidence receiver (spec :4319): Envoy's records, stamped source=gateway,
    /// the only source that may trip a kill; requires --otlp-gateway-token-file
    /// [default: off].
    #[arg(long, value_name = "ADDR", env = "HALO_SERVER_OTLP_GATEWAY_LISTEN")]
    pub otlp_gateway_listen: Option<SocketAddr>,
    /// File holding the bearer token gateways present to the gateway receiver
    /// (`openssl rand -hex 32`).
    #[arg(long, value_name = "FILE", env = "HALO_SERVER_OTLP_GATEWAY_TOKEN_FILE")]
    pub otlp_gateway_token_file: Option<PathBuf>,
    /// Eval evidence receiver (spec :4320), stamped source=eval; requires
    /// --otlp-eval-token-file [default: off].
    #[arg(long, value_name = "ADDR", env = "HALO_SERVER_OTLP_EVAL_LISTEN")]
    pub otlp_eval_listen: Option<SocketAddr>,
    /// File holding the eval receiver's bearer token; it must differ from the gateway's.
    #[arg(long, value_name = "FILE", env = "HALO_SERVER_OTLP_EVAL_TOKEN_FILE")]
    pub otlp_eval_token_file: Option<PathBuf>,
    /// Largest OTLP batch (encoded request) a receiver accepts, in bytes [default: 4194304].
    #[arg(long, value_name = "BYTES", env = "HALO_SERVER_OTLP_MAX_BATCH_BYTES")]
    pub otlp_max_batch_bytes: Option<usize>,
    /// File holding a PostgreSQL connection string for the evidence store [default: the
    /// embedded store, evidence.db in --data-dir].
    #[arg(long, value_name = "FILE", env = "HALO_SERVER_EVIDENCE_POSTGRES_FILE")]
    pub evidence_postgres_file: Option<PathBuf>,
    /// Serve the budget service here: Envoy's rate-limit service (gRPC) that every
    /// gateway's budget check asks; counts in the evidence store's database (--data-dir,
    /// or --evidence-postgres-file, which replicas share). Requires --budget-token-file
    /// [default: off].
    #[arg(long, value_name = "ADDR", env = "HALO_SERVER_BUDGET_LISTEN")]
    pub budget_listen: Option<SocketAddr>,
    /// File holding the bearer token gateways present to the budget service
    /// (`openssl rand -hex 32`).
    #[arg(long, value_name = "FILE", env = "HALO_SERVER_BUDGET_TOKEN_FILE")]
    pub budget_token_file: Option<PathBuf>,
    /// How long evidence records are kept [default: 90d].
    #[arg(long, value_name = "DURATION", env = "HALO_SERVER_EVIDENCE_RETENTION", value_parser = humantime::parse_duration)]
    #[serde(default, with = "opt_duration")]
    pub evidence_retention: Option<Duration>,
    /// The mirror service (`POST /mirror`): shadow jobs from the gateways' filter, sent to
    /// the shadow variant's target and recorded as evidence, source shadow. Requires
    /// --shadow-token-file and an evidence store (--data-dir or --evidence-postgres-file)
    /// [default: off].
    #[arg(long, value_name = "ADDR", env = "HALO_SERVER_SHADOW_LISTEN")]
    pub shadow_listen: Option<SocketAddr>,
    /// File holding the shadow token the filter presents (`openssl rand -hex 32`; the
    /// gateway token's strength rules).
    #[arg(long, value_name = "FILE", env = "HALO_SERVER_SHADOW_TOKEN_FILE")]
    pub shadow_token_file: Option<PathBuf>,
    /// Shadow jobs sent to their targets at once [default: 4].
    #[arg(long, value_name = "N", env = "HALO_SERVER_SHADOW_CONCURRENCY")]
    pub shadow_concurrency: Option<usize>,
    /// Shadow jobs waiting at most; one more is answered 429 queue_full [default: 256].
    #[arg(long, value_name = "N", env = "HALO_SERVER_SHADOW_QUEUE")]
    pub shadow_queue: Option<usize>,
    /// A shadow job older than this when its turn comes is dropped [default: 60s].
    #[arg(long, value_name = "DURATION", env = "HALO_SERVER_SHADOW_MAX_AGE", value_parser = humantime::parse_duration)]
    #[serde(default, with = "opt_duration")]
    pub shadow_max_age: Option<Duration>,
    /// Spend on shadow targets per experiment per UTC day, in USD (from the policy's
    /// prices); over it, jobs are dropped [default: 50].
    #[arg(long, value_name = "USD", env = "HALO_SERVER_SHADOW_MAX_SPEND_USD")]
    pub shadow_max_spend_usd: Option<f64>,
    /// The address admins open the console at (`https://halos.example.com`): the login's
    /// redirect URI is `<url>/console/callback` and its cookies are Secure [default: the
    /// request's own host, accepted only on loopback].
    #[arg(long, value_name = "URL", env = "HALO_SERVER_CONSOLE_URL")]
    pub console_url: Option<String>,
    /// Run the controller in this process: every --controller-interval it reads the
    /// evidence of the running experiments of the policy served now, decides, and acts
    /// (kill on gateway evidence with the kill key, PR, webhook). Requires --data-dir
    /// and an evidence receiver [default: off].
    #[arg(long, env = "HALO_SERVER_CONTROLLER")]
    #[serde(default)]
    pub controller: bool,
    /// Time between controller ticks, at least 1m [default: 5m].
    #[arg(long, value_name = "DURATION", env = "HALO_SERVER_CONTROLLER_INTERVAL", value_parser = humantime::parse_duration)]
    #[serde(default, with = "opt_duration")]
    pub controller_interval: Option<Duration>,
    /// A local clone of the policy repo the controller's PRs are pushed from (git and gh
    /// run there) [default: --policy-dir].
    #[arg(long, value_name = "DIR", env = "HALO_SERVER_CONTROLLER_POLICY_REPO")]
    pub controller_policy_repo: Option<PathBuf>,
    /// The branch controller PRs target [default: main].
    #[arg(
        long,
        value_name = "BRANCH",
        env = "HALO_SERVER_CONTROLLER_BASE_BRANCH"
    )]
    pub controller_base_branch: Option<String>,
    /// Webhook the controller notifies (signed: X-Halo-Timestamp and an HMAC-SHA256);
    /// requires --controller-webhook-secret-file [default: none].
    #[arg(long, value_name = "URL", env = "HALO_SERVER_CONTROLLER_WEBHOOK_URL")]
    pub controller_webhook_url: Option<String>,
    /// File holding the webhook's HMAC secret.
    #[arg(
        long,
        value_name = "FILE",
        env = "HALO_SERVER_CONTROLLER_WEBHOOK_SECRET_FILE"
    )]
    pub controller_webhook_secret_file: Option<PathBuf>,
    /// The gh program the controller opens PRs with [default: gh on PATH].
    #[arg(long, value_name = "PROGRAM", env = "HALO_SERVER_CONTROLLER_GH")]
    pub controller_gh: Option<PathBuf>,
    /// Send Slack-compatible `{"text": ...}` payloads instead of the JSON message.
    #[arg(long, env = "HALO_SERVER_CONTROLLER_WEBHOOK_SLACK")]
    #[serde(default)]
    pub controller_webhook_slack: bool,
}

impl Flags {
    /// These flags over `file`'s: a flag (or its environment variable) wins. The struct
    /// literal names every field, so a new flag cannot be left out of the merge.
    fn or(self, file: Flags) -> Flags {
        Flags {
            config: self.config,
            listen: self.listen.or(file.listen),
            admin_listen: self.admin_listen.or(file.admin_listen),
            policy_dir: self.policy_dir.or(file.policy_dir),
            data_dir: self.data_dir.or(file.data_dir),
            killswitch_key_file: self.killswitch_key_file.or(file.killswitch_key_file),
            gateway_token_file: self.gateway_token_file.or(file.gateway_token_file),
            token_file: self.token_file.or(file.token_file),
            device_ttl: self.device_ttl.or(file.device_ttl),
            enrollment_ttl: self.enrollment_ttl.or(file.enrollment_ttl),
            oidc_ca_file: self.oidc_ca_file.or(file.oidc_ca_file),
            max_body_bytes: self.max_body_bytes.or(file.max_body_bytes),
            xds_listen: self.xds_listen.or(file.xds_listen),
            xds_gateway_file: self.xds_gateway_file.or(file.xds_gateway_file),
            otlp_cli_listen: self.otlp_cli_listen.or(file.otlp_cli_listen),
            otlp_cli_http_listen: self.otlp_cli_http_listen.or(file.otlp_cli_http_listen),
            otlp_cli_token_file: self.otlp_cli_token_file.or(file.otlp_cli_token_file),
            otlp_gateway_listen: self.otlp_gateway_listen.or(file.otlp_gateway_listen),
            otlp_gateway_token_file: self
                .otlp_gateway_token_file
                .or(file.otlp_gateway_token_file),
            otlp_eval_listen: self.otlp_eval_listen.or(file.otlp_eval_listen),
            otlp_eval_token_file: self.otlp_eval_token_file.or(file.otlp_eval_token_file),
            otlp_max_batch_bytes: self.otlp_max_batch_bytes.or(file.otlp_max_batch_bytes),
            evidence_postgres_file: self.evidence_postgres_file.or(file.evidence_postgres_file),
            evidence_retention: self.evidence_retention.or(file.evidence_retention),
            shadow_listen: self.shadow_listen.or(file.shadow_listen),
            shadow_token_file: self.shadow_token_file.or(file.shadow_token_file),
            shadow_concurrency: self.shadow_concurrency.or(file.shadow_concurrency),
            shadow_queue: self.shadow_queue.or(file.shadow_queue),
            shadow_max_age: self.shadow_max_age.or(file.shadow_max_age),
            shadow_max_spend_usd: self.shadow_max_spend_usd.or(file.shadow_max_spend_usd),
            budget_listen: self.budget_listen.or(file.budget_listen),
            budget_token_file: self.budget_token_file.or(file.budget_token_file),
            console_url: self.console_url.or(file.console_url),
            controller: self.controller || file.controller,
            controller_interval: self.controller_interval.or(file.controller_interval),
            controller_policy_repo: self.controller_policy_repo.or(file.controller_policy_repo),
            controller_base_branch: self.controller_base_branch.or(file.controller_base_branch),
            controller_webhook_url: self.controller_webhook_url.or(file.controller_webhook_url),
            controller_webhook_secret_file: self
                .controller_webhook_secret_file
                .or(file.controller_webhook_secret_file),
            controller_webhook_slack: self.controller_webhook_slack
                || file.controller_webhook_slack,
            controller_gh: self.controller_gh.or(file.controller_gh),
        }
    }

    /// The path-valued settings, to resolve a file's relative paths against its directory.
    fn paths_mut(&mut self) -> [&mut Option<PathBuf>; 16] {
        [
            &mut self.config,
            &mut self.policy_dir,
            &mut self.data_dir,
            &mut self.killswitch_key_file,
            &mut self.gateway_token_file,
            &mut self.token_file,
            &mut self.oidc_ca_file,
            &mut self.xds_gateway_file,
            &mut self.otlp_cli_token_file,
            &mut self.otlp_gateway_token_file,
            &mut self.otlp_eval_token_file,
            &mut self.evidence_postgres_file,
            &mut self.shadow_token_file,
            &mut self.budget_token_file,
            &mut self.controller_policy_repo,
            &mut self.controller_webhook_secret_file,
        ]
    }
}

mod opt_duration {
    use serde::{Deserialize, Deserializer, de::Error as _};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        humantime::parse_duration(&text)
            .map(Some)
            .map_err(|e| D::Error::custom(format!("{text:?} is not a duration like 90d: {e}")))
    }
}

/// The resolved settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub policy_dir: PathBuf,
    pub data_dir: Option<PathBuf>,
    pub killswitch_key_file: Option<PathBuf>,
    pub gateway_token_file: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    pub device_ttl: Duration,
    pub enrollment_ttl: Duration,
    pub oidc_ca_file: Option<PathBuf>,
    pub max_body_bytes: usize,
    pub xds_listen: Option<SocketAddr>,
    pub xds_gateway_file: Option<PathBuf>,
    /// The evidence receivers and store.
    pub evidence: crate::evidence::EvidenceSettings,
    /// The mirror service.
    pub shadow: crate::shadow::ShadowSettings,
    /// The budget service.
    pub budget: crate::budget::BudgetSettings,
    pub console_url: Option<String>,
    /// The in-process controller.
    pub controller: halo_controller::assemble::ControllerSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Yaml { path: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl Settings {
    /// Resolve flags (which already include the environment) over the YAML file over
    /// defaults, and check the combinations ADR-0009 requires.
    pub fn resolve(flags: Flags) -> Result<Settings, ConfigError> {
        let file = match &flags.config {
            Some(path) => read_file_config(path)?,
            None => Flags::default(),
        };
        let flags = flags.or(file);
        let policy_dir = flags.policy_dir.ok_or_else(|| {
            ConfigError::Invalid(
                "--policy-dir is required (or HALO_SERVER_POLICY_DIR, or policy-dir in --config)"
                    .to_string(),
            )
        })?;
        let settings = Settings {
            listen: flags.listen.unwrap_or_else(|| parse_addr(DEFAULT_LISTEN)),
            admin_listen: flags
                .admin_listen
                .unwrap_or_else(|| parse_addr(DEFAULT_ADMIN_LISTEN)),
            policy_dir,
            data_dir: flags.data_dir,
            killswitch_key_file: flags.killswitch_key_file,
            gateway_token_file: flags.gateway_token_file,
            token_file: flags.token_file,
            device_ttl: flags.device_ttl.unwrap_or(DEFAULT_DEVICE_TTL),
            enrollment_ttl: flags.enrollment_ttl.unwrap_or(DEFAULT_ENROLLMENT_TTL),
            oidc_ca_file: flags.oidc_ca_file,
            max_body_bytes: flags.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES),
            xds_listen: flags.xds_listen,
            xds_gateway_file: flags.xds_gateway_file,
            evidence: crate::evidence::EvidenceSettings {
                cli_listen: flags.otlp_cli_listen,
                cli_http_listen: flags.otlp_cli_http_listen,
                cli_token_file: flags.otlp_cli_token_file,
                gateway_listen: flags.otlp_gateway_listen,
                gateway_token_file: flags.otlp_gateway_token_file,
                eval_listen: flags.otlp_eval_listen,
                eval_token_file: flags.otlp_eval_token_file,
                max_batch_bytes: flags
                    .otlp_max_batch_bytes
                    .unwrap_or(crate::evidence::DEFAULT_MAX_BATCH_BYTES),
                postgres_file: flags.evidence_postgres_file,
                retention: flags
                    .evidence_retention
                    .unwrap_or(crate::evidence::DEFAULT_RETENTION),
            },
            shadow: crate::shadow::ShadowSettings {
                listen: flags.shadow_listen,
                token_file: flags.shadow_token_file,
                concurrency: flags
                    .shadow_concurrency
                    .unwrap_or(crate::shadow::DEFAULT_CONCURRENCY),
                queue: flags.shadow_queue.unwrap_or(crate::shadow::DEFAULT_QUEUE),
                max_age: flags
                    .shadow_max_age
                    .unwrap_or(crate::shadow::DEFAULT_MAX_AGE),
                max_spend_usd: flags
                    .shadow_max_spend_usd
                    .unwrap_or(crate::shadow::DEFAULT_MAX_SPEND_USD),
                ..crate::shadow::ShadowSettings::default()
            },
            budget: crate::budget::BudgetSettings {
                listen: flags.budget_listen,
                token_file: flags.budget_token_file,
            },
            console_url: flags.console_url,
            controller: halo_controller::assemble::ControllerSettings {
                enabled: flags.controller,
                interval: flags
                    .controller_interval
                    .unwrap_or(halo_controller::controller::DEFAULT_INTERVAL),
                policy_repo: flags.controller_policy_repo,
                base_branch: flags
                    .controller_base_branch
                    .unwrap_or_else(|| halo_controller::assemble::DEFAULT_BASE_BRANCH.to_string()),
                webhook_url: flags.controller_webhook_url,
                webhook_secret_file: flags.controller_webhook_secret_file,
                webhook_slack: flags.controller_webhook_slack,
                gh: flags.controller_gh,
            },
        };
        settings.check()?;
        Ok(settings)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let invalid = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        match (&self.killswitch_key_file, &self.gateway_token_file) {
            (Some(_), None) => {
                return invalid(
                    "--killswitch-key-file requires --gateway-token-file (gateways present that token to read the kill list)",
                );
            }
            (None, Some(_)) => {
                return invalid(
                    "--gateway-token-file is set without --killswitch-key-file: the token only guards the kill list, which needs the key",
                );
            }
            (Some(_), Some(_)) if self.data_dir.is_none() => {
                return invalid(
                    "--killswitch-key-file requires --data-dir: kills must survive a restart",
                );
            }
            _ => {}
        }
        if self.device_ttl.is_zero() || self.enrollment_ttl.is_zero() {
            return invalid("--device-ttl and --enrollment-ttl must be positive");
        }
        if self.max_body_bytes < 1024 {
            return invalid("--max-body-bytes must be at least 1024");
        }
        self.evidence.check().map_err(ConfigError::Invalid)?;
        self.shadow.check().map_err(ConfigError::Invalid)?;
        if self.shadow.listen.is_some()
            && self.data_dir.is_none()
            && self.evidence.postgres_file.is_none()
        {
            return Err(ConfigError::Invalid(
                "--shadow-listen records evidence: it needs --data-dir (the embedded store) or --evidence-postgres-file".into(),
            ));
        }
        if let Some(url) = &self.console_url {
            // Plain HTTP would send the session cookie in clear; loopback is the one place
            // that is no risk (a laptop, the demo).
            let ok = url.starts_with("https://")
                || ["http://127.0.0.1", "http://localhost", "http://[::1]"]
                    .iter()
                    .any(|p| {
                        url.strip_prefix(p).is_some_and(|rest| {
                            rest.is_empty() || rest.starts_with(':') || rest.starts_with('/')
                        })
                    });
            if !ok {
                return invalid(
                    "--console-url must be https:// (plain http only on loopback: http://127.0.0.1:PORT)",
                );
            }
        }
        self.controller
            .check(self.data_dir.is_some())
            .map_err(ConfigError::Invalid)?;
        Ok(())
    }

    /// Whether the kill switch is served (key and gateway token both set).
    pub fn kill_switch_enabled(&self) -> bool {
        self.killswitch_key_file.is_some() && self.gateway_token_file.is_some()
    }
}

fn parse_addr(s: &str) -> SocketAddr {
    // The defaults are literals that parse.
    s.parse().unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)))
}

fn read_file_config(path: &Path) -> Result<Flags, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let mut file: Flags = if text.trim().is_empty() {
        Flags::default()
    } else {
        serde_saphyr::from_str(&text).map_err(|e| ConfigError::Yaml {
            path: path.display().to_string(),
            message: e.to_string(),
        })?
    };
    if file.config.is_some() {
        return Err(ConfigError::Yaml {
            path: path.display().to_string(),
            message: "`config` cannot name another config file".to_string(),
        });
    }
    let base = path.parent().unwrap_or(Path::new("."));
    for p in file.paths_mut().into_iter().flatten() {
        if p.is_relative() {
            *p = base.join(&*p);
        }
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Flags {
        let mut argv = vec!["halo-server"];
        argv.extend_from_slice(args);
        Flags::try_parse_from(argv).unwrap()
    }

    #[test]
    fn flags_beat_yaml_and_yaml_beats_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("server.yaml");
        std::fs::write(
            &cfg,
            "policy-dir: policy\nlisten: 127.0.0.1:7000\ndevice-ttl: 7d\n",
        )
        .unwrap();
        let s = Settings::resolve(parse(&[
            "--config",
            cfg.to_str().unwrap(),
            "--listen",
            "127.0.0.1:7001",
        ]))
        .unwrap();
        assert_eq!(s.listen, "127.0.0.1:7001".parse().unwrap());
        assert_eq!(s.policy_dir, dir.path().join("policy"));
        assert_eq!(s.device_ttl, Duration::from_secs(7 * 86400));
        assert_eq!(s.admin_listen, DEFAULT_ADMIN_LISTEN.parse().unwrap());
        assert_eq!(s.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
    }

    /// Every flag is a `--config` key (issue 27: `xds-listen` and `xds-gateway-file` were
    /// refused), its value reaches the settings, and a relative path in the file is
    /// relative to the file's directory. Walks clap's own table of flags.
    #[test]
    fn every_flag_is_a_config_key() {
        use clap::CommandFactory;
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("server.yaml");
        let mut yaml = String::new();
        let mut expected = Vec::new();
        for (i, arg) in Flags::command().get_arguments().enumerate() {
            let Some(key) = arg.get_long() else { continue };
            if matches!(key, "config" | "help" | "version") {
                continue;
            }
            let value_name = if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
                None
            } else {
                arg.get_value_names()
                    .and_then(|v| v.first())
                    .map(|s| s.as_str())
            };
            let (value, shown) = match value_name {
                Some("ADDR") => {
                    let addr = format!("127.0.0.1:{}", 7000 + i);
                    (addr.clone(), addr)
                }
                Some("DIR" | "FILE") => (
                    format!("rel/{key}"),
                    format!("{:?}", dir.path().join("rel").join(key)),
                ),
                Some("DURATION") => (
                    format!("{}d", i + 1),
                    format!("{:?}", Duration::from_secs((i as u64 + 1) * 86400)),
                ),
                Some("BYTES") => ((100_000 + i).to_string(), (100_000 + i).to_string()),
                Some("N") => ((i + 1).to_string(), (i + 1).to_string()),
                Some("USD") => (format!("{}.5", i + 1), format!("{}.5", i + 1)),
                Some("URL") => {
                    let url = format!("https://halos-{i}.example.com");
                    (url.clone(), format!("{url:?}"))
                }
                Some("PROGRAM") => (format!("/usr/bin/gh{i}"), format!("\"/usr/bin/gh{i}\"")),
                Some("BRANCH") => (format!("branch-{i}"), format!("\"branch-{i}\"")),
                // A switch: `key: true` (the settings show it as a field set to true).
                None => ("true".to_string(), "true".to_string()),
                other => panic!("--{key} takes {other:?}: teach this test that kind of value"),
            };
            yaml.push_str(&format!("{key}: {value}\n"));
            expected.push((key.to_string(), shown));
        }
        assert!(expected.iter().any(|(k, _)| k == "xds-listen"));
        assert!(expected.iter().any(|(k, _)| k == "xds-gateway-file"));
        std::fs::write(&cfg, &yaml).unwrap();
        let s = Settings::resolve(parse(&["--config", cfg.to_str().unwrap()]))
            .unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        let debug = format!("{s:?}");
        for (key, shown) in expected {
            assert!(debug.contains(&shown), "{key}: {shown} is not in {debug}");
        }
    }

    /// The console's session cookie must not travel in clear: plain HTTP only on loopback.
    #[test]
    fn console_url_is_https_or_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let policy = dir.path().join("policy");
        let p = policy.to_str().unwrap();
        for ok in [
            "https://halos.acme.com",
            "http://127.0.0.1:8080",
            "http://localhost",
            "http://[::1]:9",
        ] {
            Settings::resolve(parse(&["--policy-dir", p, "--console-url", ok]))
                .unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "http://halos.acme.com",
            "http://127.0.0.1.evil.com",
            "ftp://x",
        ] {
            let err = Settings::resolve(parse(&["--policy-dir", p, "--console-url", bad]))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("--console-url must be https://"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn config_cannot_name_another_config() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("server.yaml");
        std::fs::write(&cfg, "policy-dir: p\nconfig: other.yaml\n").unwrap();
        let err = Settings::resolve(parse(&["--config", cfg.to_str().unwrap()]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("config"), "{err}");
    }

    #[test]
    fn unknown_yaml_key_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("server.yaml");
        std::fs::write(&cfg, "policy-dir: p\ndata-dri: d\n").unwrap();
        let err = Settings::resolve(parse(&["--config", cfg.to_str().unwrap()]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("data-dri"), "{err}");
        assert!(err.contains("server.yaml"), "{err}");
    }

    #[test]
    fn key_requires_token_and_data_dir() {
        let err = Settings::resolve(parse(&["--policy-dir", "p", "--killswitch-key-file", "k"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--gateway-token-file"), "{err}");
        let err = Settings::resolve(parse(&[
            "--policy-dir",
            "p",
            "--killswitch-key-file",
            "k",
            "--gateway-token-file",
            "t",
        ]))
        .unwrap_err()
        .to_string();
        assert!(err.contains("--data-dir"), "{err}");
        assert!(Settings::resolve(parse(&[])).is_err());
    }
}
