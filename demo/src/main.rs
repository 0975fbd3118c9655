//! `halo-demo`: parse flags, run the local gateway (see the library), exit 0 on a clean
//! stop or passed `--once` checks, 1 on a failure, 2 on a usage error.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

const EXAMPLES: &str = "\
Examples:
  # The example policy, default ports; prints a curl line with a demo token:
  cargo run -q -p halo-demo

  # Another policy dir, another gateway port, a user in a canary group:
  cargo run -q -p halo-demo -- --policy-dir ./policy --listen 127.0.0.1:8000 \\
    --user alice@acme.com --group halos-canary

  # Start, send the first request (200, SSE stream, 401 without a token), exit:
  cargo run -q -p halo-demo -- --once

Demo mode points every upstream of the policy at the built-in demo provider (Anthropic
Messages, no keys) and trusts the demo issuer instead of the policy's; both are printed.";

/// halo-demo: the local gateway on a policy dir in one command (halo-server with xDS,
/// Envoy, a demo provider and a demo identity).
#[derive(Debug, Parser)]
#[command(name = "halo-demo", version, about, after_help = EXAMPLES)]
struct Flags {
    /// The policy repo served [default: the workspace's examples/acme-corp].
    #[arg(long, value_name = "DIR", env = "HALO_POLICY_DIR")]
    policy_dir: Option<PathBuf>,
    /// Envoy's gateway listener.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:10000")]
    listen: SocketAddr,
    /// Envoy's admin listener.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9901")]
    envoy_admin: SocketAddr,
    /// halo-server's xDS (ADS) listener, which Envoy connects to.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:18000")]
    xds_listen: SocketAddr,
    /// halo-server's API listener (the demo does not need it: any free port by default).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    server_listen: SocketAddr,
    /// halo-server's admin listener (/metrics, /xds/status).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9090")]
    server_admin_listen: SocketAddr,
    /// halo_filter.wasm [default: HALO_FILTER_WASM, else the workspace's
    /// target/wasm32-unknown-unknown/release/halo_filter.wasm].
    #[arg(long, value_name = "FILE")]
    wasm: Option<PathBuf>,
    /// The demo token's user.
    #[arg(long, value_name = "USER", default_value = "dev@acme.com")]
    user: String,
    /// A group in the demo token (repeatable).
    #[arg(long = "group", value_name = "GROUP")]
    groups: Vec<String>,
    /// How long the demo token is valid.
    #[arg(long, value_name = "DURATION", default_value = "12h", value_parser = humantime::parse_duration)]
    token_ttl: Duration,
    /// The model alias of the first request [default: the first alias, by name, that
    /// serves the Anthropic Messages wire].
    #[arg(long, value_name = "ALIAS")]
    model: Option<String>,
    /// Send the first request (and a streamed one, and one without a token), check the
    /// answers, stop everything and exit 0 if they were 200, 200 (SSE) and 401.
    #[arg(long)]
    once: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HALO_DEMO_LOG").unwrap_or_else(|_| {
                // Policy pushes and refusals show; halo-server's "no --data-dir" warning
                // (expected here) does not.
                tracing_subscriber::EnvFilter::new("warn,halo_xds=info,halo_server::server=error")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let flags = Flags::parse();
    let opts = halo_demo::Options {
        policy_dir: flags
            .policy_dir
            .unwrap_or_else(|| halo_testkit::workspace_root().join("examples/acme-corp")),
        listen: flags.listen,
        envoy_admin: flags.envoy_admin,
        xds_listen: flags.xds_listen,
        server_listen: flags.server_listen,
        server_admin_listen: flags.server_admin_listen,
        wasm: flags.wasm,
        user: flags.user,
        groups: flags.groups,
        token_ttl: flags.token_ttl,
        model: flags.model,
        once: flags.once,
    };
    match halo_demo::run(opts).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("halo-demo: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
