//! The halod binary: `run`, `once` and `status` over the halod library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use halod::agent::{Agent, Status};
use halod::config::Config;
use halod::state::State;

const AFTER_HELP: &str = "\
Exit status of `halod once`:
  0  applied, or already up to date
  3  some files were refused (checkTarget) or could not be written; the rest applied
  4  the cycle failed: nothing applied (no ring, verification failed, registry down)
  1  halod could not start (configuration, keys, state.json)
  2  usage error";

#[derive(Parser)]
#[command(
    name = "halod",
    version,
    about = "Halos device agent: applies the ring's signed release of AI coding tool settings",
    after_help = AFTER_HELP
)]
struct Cli {
    /// halod.yaml.
    #[arg(long, global = true, default_value = "/etc/halod/halod.yaml")]
    config: PathBuf,
    /// Root prefix standing in for `/` (tests, rootless devcontainers); overrides `root`.
    #[arg(long, global = true)]
    root: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Loop: a full cycle every interval, the kill poll every killSwitch.interval.
    Run,
    /// One full cycle; the exit status tells the outcome.
    Once,
    /// Print state.json as one JSON line.
    Status,
}

fn print(status: &Status) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", status.line());
    let _ = out.flush();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("halod: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn real_main(cli: Cli) -> anyhow::Result<u8> {
    let mut config = Config::load(&cli.config)?;
    if let Some(root) = &cli.root {
        config.root = Some(root.clone());
    }
    if let Command::Status = cli.command {
        let dir = config.state_dir();
        let state = State::load(&dir)?;
        println!("{}", serde_json::to_string(&state)?);
        return Ok(0);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        let mut agent = Agent::new(config, None)?;
        match cli.command {
            Command::Once => {
                let status = agent.cycle().await;
                print(&status);
                Ok(status.outcome.exit_code())
            }
            Command::Run => {
                agent.run(shutdown(), &print).await;
                Ok(0)
            }
            Command::Status => Ok(0),
        }
    })
}

/// SIGINT or SIGTERM.
async fn shutdown() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
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
