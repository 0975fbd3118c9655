//! `halo`: the Halos command line, as a library so that the end-to-end tests (halo-e2e)
//! run this very command against a real halo-server; the `halo` binary is [`main`].
//!
//! Policy commands work on a policy repo directory: `validate`, `gateway compile` and
//! `gateway routes`; `keys generate` makes the ed25519 key pairs that sign releases and
//! kill lists; `kill`, `unkill` and `killswitch status` call halo-server's admin API;
//! `auth login | token | status | logout` is the developer's own token (halo-auth);
//! `evidence query` summarizes an experiment's evidence from halo-server;
//! `controller run` runs the controller loop on a policy dir and a data dir;
//! `controller status` and `rollout status NAME` show the controller's view.
//! Exit codes: 0 success, 1 an invalid policy or a failed operation, 2 a usage error,
//! 3 not logged in or the session ended (`halo auth ...`).

mod auth;
mod budget;
mod controller;
mod envoy;
mod evidence;
mod gateway;
mod keys;
mod killswitch;
mod mesh;
mod policy_dir;
mod release;
mod wasm;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Halos: govern AI coding tools as code.
#[derive(Debug, Parser)]
#[command(name = "halo", version, about, long_about = None, after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

const EXAMPLES: &str = "\
Examples:
  halo validate --policy-dir examples/acme-corp
  halo gateway compile --policy-dir examples/acme-corp -o policy.json
  halo gateway routes --user alice@acme.com --session s-42 --policy-dir examples/acme-corp
  halo envoy bootstrap --policy-dir examples/acme-corp -o envoy.yaml
  halo istio render --policy-dir DIR --image oci://REG/REPO@sha256:DIGEST -o halo-istio.yaml
  halo envoy-gateway render --policy-dir DIR --image oci://REG/REPO@sha256:DIGEST
  halo keys generate --name killswitch --out-dir keys/
  halo release publish --policy-dir examples/acme-corp --ring canary --release-version 1.0.0 \
      --key keys/release.key --registry 127.0.0.1:5000/acme/halos
  HALO_TOKEN=$(cat admin.jwt) halo kill experiment sonnet-bedrock-canary \
      --reason 'error rate 12%' --server https://halo.acme.internal
  halo unkill toggle deep-reasoning --reason fixed --server URL --token-file admin.jwt
  halo killswitch status --server URL --token-file admin.jwt
  halo auth login --policy-dir examples/acme-corp      # once per machine
  halo controller run --policy-dir DIR --data-dir /var/lib/halo-server --killswitch-served
  halo controller status --server URL --token-file admin.jwt
  halo budget status --user U --server URL --token-file admin.jwt
  halo rollout status sonnet-bedrock --server URL --token-file admin.jwt
  halo auth token --audience api://halos               # what apiKeyHelper runs
  halo auth status

Exit status: 0 success, 1 invalid policy or failed operation, 2 usage error,\n3 not logged in (run `halo auth login`).";

#[derive(Debug, Subcommand)]
enum Command {
    /// Load and validate a policy repo; print every problem with file, document and field.
    Validate {
        /// The policy repo: halos.yaml plus every *.yaml below it.
        #[arg(long, value_name = "DIR", env = "HALO_POLICY_DIR")]
        policy_dir: PathBuf,
    },
    /// Gateway (traffic plane) commands.
    Gateway {
        #[command(subcommand)]
        command: gateway::GatewayCommand,
    },
    /// Envoy configuration rendered from the policy.
    Envoy {
        #[command(subcommand)]
        command: envoy::EnvoyCommand,
    },
    /// Istio manifests rendered from the policy.
    Istio {
        #[command(subcommand)]
        command: mesh::IstioCommand,
    },
    /// Envoy Gateway manifests rendered from the policy.
    EnvoyGateway {
        #[command(subcommand)]
        command: mesh::EnvoyGatewayCommand,
    },
    /// The filter module as an OCI wasm image: publish, verify.
    Wasm {
        #[command(subcommand)]
        command: wasm::WasmCommand,
    },
    /// halo-server's Kubernetes manifests.
    ControlPlane {
        #[command(subcommand)]
        command: mesh::ControlPlaneCommand,
    },
    /// Key management.
    Keys {
        #[command(subcommand)]
        command: keys::KeysCommand,
    },
    /// Signed releases of harness settings: build, publish, promote, verify.
    Release {
        #[command(subcommand)]
        command: release::ReleaseCommand,
    },
    /// Kill an experiment or toggle now, through halo-server (back to control).
    Kill(killswitch::ChangeArgs),
    /// Lift a kill through halo-server.
    Unkill(killswitch::ChangeArgs),
    /// The kill switch on halo-server.
    Killswitch {
        #[command(subcommand)]
        command: killswitch::KillswitchCommand,
    },
    /// The developer's own token for the gateway: login, token, status, logout.
    Auth {
        #[command(subcommand)]
        command: auth::AuthCommand,
    },
    /// Evidence halo-server received: per-variant summaries of an experiment's samples.
    Evidence {
        #[command(subcommand)]
        command: evidence::EvidenceCommand,
    },
    /// The controller: run its loop here, or show halo-server's verdicts and actions.
    Controller {
        #[command(subcommand)]
        command: controller::ControllerCommand,
    },
    /// Rollouts the controller drives: steps, gates, bake and the state file's chain.
    Rollout {
        #[command(subcommand)]
        command: controller::RolloutCommand,
    },
    /// Spend and token budgets: what a user spent against each this period.
    Budget {
        #[command(subcommand)]
        command: budget::BudgetCommand,
    },
}

/// How a command failed.
#[derive(Debug)]
enum Failure {
    /// The policy was refused; its issues are already printed.
    InvalidPolicy,
    /// Anything else (I/O, refusing to overwrite, ...).
    Error(anyhow::Error),
    /// Not logged in, or the session ended: exit status 3, one line naming the fix.
    LoginNeeded(String),
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Self {
        Failure::Error(err)
    }
}

/// The `halo` command: parse the process arguments, run, and say how it went.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Validate { policy_dir } => policy_dir::validate_command(&policy_dir),
        Command::Gateway { command } => gateway::run(command),
        Command::Envoy { command } => envoy::run(command),
        Command::Istio { command } => mesh::run_istio(command),
        Command::EnvoyGateway { command } => mesh::run_envoy_gateway(command),
        Command::Wasm { command } => wasm::run(command),
        Command::ControlPlane { command } => mesh::run_control_plane(command),
        Command::Keys { command } => keys::run(command),
        Command::Release { command } => release::run(command),
        Command::Kill(args) => killswitch::change(args, true),
        Command::Unkill(args) => killswitch::change(args, false),
        Command::Killswitch { command } => killswitch::run(command),
        Command::Auth { command } => auth::run(command),
        Command::Evidence { command } => evidence::run(command),
        Command::Controller { command } => controller::run_controller(command),
        Command::Rollout { command } => controller::run_rollout(command),
        Command::Budget { command } => budget::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::InvalidPolicy) => ExitCode::from(1),
        Err(Failure::Error(err)) => {
            eprintln!("halo: {err:#}");
            ExitCode::from(1)
        }
        Err(Failure::LoginNeeded(message)) => {
            eprintln!("halo: {message}");
            ExitCode::from(3)
        }
    }
}
