//! `halo-credentials`: keeps minted provider tokens fresh in Envoy SDS secret files.
//! Exit codes: 0 success (or stopped by SIGTERM/SIGINT), 1 a failed mint or write with
//! `--once`, 2 a usage error (bad flags, an unreadable or invalid key file).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use halo_credentials::google::{MetadataServer, TokenSource};
use halo_credentials::refresh::Policy;
use halo_credentials::run::{Refresher, SystemClock};
use halo_credentials::sds::{self, SdsFile};

/// Keep provider tokens that must be minted fresh in Envoy SDS secret files.
#[derive(Debug, Parser)]
#[command(name = "halo-credentials", version, about, long_about = ABOUT, after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

const ABOUT: &str = "\
Keep provider tokens that must be minted fresh in Envoy SDS secret files.

The gateway never puts a secret in Envoy's configuration: Envoy's credential_injector \
reads it from an SDS file (sds_config.path_config_source). halo-credentials mints the \
token, writes that file atomically (mode 0600) and replaces it before the token expires; \
Envoy reloads it without a restart. Run it as the user Envoy runs as, and give the file \
a directory of its own (Envoy watches the directory).";

const EXAMPLES: &str = "\
Examples:
  # Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, else the metadata server
  halo-credentials vertex --sds-file /run/halo/sds/vertex.yaml

  # A service-account key file
  halo-credentials vertex --sds-file /run/halo/sds/vertex.yaml --key-file /etc/halo/sa.json

  # The metadata server at another address (also GCE_METADATA_HOST=host:port)
  halo-credentials vertex --sds-file /run/halo/sds/vertex.yaml \\
      --metadata-server http://169.254.169.254

  # Mint once and exit (cron, an init container)
  halo-credentials vertex --sds-file /run/halo/sds/vertex.yaml --once

The matching Envoy upstream filter (injected as Authorization: Bearer <token>):
  name: envoy.filters.http.credential_injector
  typed_config:
    '@type': type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector
    overwrite: true
    credential:
      name: envoy.http.injected_credentials.generic
      typed_config:
        '@type': type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic
        header: Authorization
        credential:
          name: halo-vertex-token
          sds_config: {path_config_source: {path: /run/halo/sds/vertex.yaml}}

Logs go to stderr (RUST_LOG=debug for more); they never hold a key, an assertion or a token.
Exit status: 0 success or stopped by a signal, 1 failed mint or write with --once, 2 usage error.";

#[derive(Debug, Subcommand)]
enum Command {
    /// Google's access token for Vertex AI (scope cloud-platform), from a service-account
    /// key file or the metadata server.
    #[command(after_help = EXAMPLES)]
    Vertex(VertexArgs),
}

#[derive(Debug, Args)]
struct VertexArgs {
    /// The SDS file to keep the token in (.yaml, .yml or .json; replaced atomically, 0600).
    #[arg(long, value_name = "PATH")]
    sds_file: PathBuf,
    /// The Secret's name, which the injector's `credential.name` must match.
    #[arg(long, value_name = "NAME", default_value = "halo-vertex-token")]
    secret_name: String,
    /// A service-account key file (JSON, type service_account). Re-read at every refresh,
    /// so a rotated key is picked up. Default: GOOGLE_APPLICATION_CREDENTIALS, else the
    /// metadata server.
    #[arg(long, value_name = "FILE", conflicts_with = "metadata_server")]
    key_file: Option<PathBuf>,
    /// The metadata server's base URL (default: http://$GCE_METADATA_HOST, else
    /// http://metadata.google.internal).
    #[arg(long, value_name = "URL")]
    metadata_server: Option<String>,
    /// Mint and write one token, then exit.
    #[arg(long)]
    once: bool,
    /// Refresh once fewer than this many minutes of the token's life remain (or at half
    /// its life, whichever is first).
    #[arg(long, value_name = "MINUTES", default_value_t = 5)]
    refresh_before: u64,
    /// Write the token alone instead of `Bearer <token>` (for an injector with
    /// header_value_prefix: "Bearer ").
    #[arg(long)]
    bare_token: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let Command::Vertex(args) = cli.command;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("halo-credentials: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(vertex(args))
}

async fn vertex(args: VertexArgs) -> ExitCode {
    let usage = |message: String| {
        eprintln!("halo-credentials: {message}");
        ExitCode::from(2)
    };
    let value = if args.bare_token {
        sds::Value::Bare
    } else {
        sds::Value::Bearer
    };
    let sds = match SdsFile::new(&args.sds_file, &args.secret_name, value) {
        Ok(s) => s,
        Err(e) => return usage(e.to_string()),
    };
    // The file's directory must exist: a typo would otherwise only show as retried
    // write errors.
    let dir = match args.sds_file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return usage(format!(
            "{}: the SDS file's directory {} does not exist",
            args.sds_file.display(),
            dir.display()
        ));
    }
    let env = |k: &str| std::env::var(k).ok();
    let source = match (args.key_file, args.metadata_server) {
        (Some(path), _) => Ok(TokenSource::KeyFile(path)),
        (None, Some(url)) => MetadataServer::new(&url).map(TokenSource::MetadataServer),
        (None, None) => TokenSource::adc(env),
    };
    let source = match source.and_then(|s| s.check().map(|()| s)) {
        Ok(s) => s,
        Err(e) => return usage(e.to_string()),
    };
    let policy = Policy {
        min_remaining: Duration::from_secs(args.refresh_before.saturating_mul(60)),
        ..Policy::default()
    };
    let mut refresher = match Refresher::new(source, sds, policy, SystemClock) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("halo-credentials: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.once {
        return match refresher.attempt().await {
            Ok(lease) => {
                let secs = lease
                    .expires_at
                    .duration_since(lease.obtained_at)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                tracing::info!(expires_in_secs = secs, "token published");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("halo-credentials: {e}");
                ExitCode::FAILURE
            }
        };
    }
    tokio::select! {
        () = refresher.run() => ExitCode::SUCCESS,
        () = stop_signal() => {
            tracing::info!("stopping");
            ExitCode::SUCCESS
        }
    }
}

async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
