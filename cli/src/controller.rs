//! The controller from the command line.
//!
//! - `halo controller run`: the controller loop outside halo-server, on a policy dir and a
//!   data dir (halo-server's own `--controller` loop, assembled by the same code,
//!   `halo_controller::assemble::assemble`). A kill is appended to the data dir's kill log;
//!   it is enforced only when a halo-server with a kill key serves that dir, which the
//!   operator states with `--killswitch-served` (ADR-0009 "No key, no pretence").
//! - The views through halo-server's admin API (the same admin auth as `halo kill`):
//!   `halo controller status` (`GET /api/v1/controller/status`: per experiment its run,
//!   state, verdict and last action; per running rollout its step and state) and `halo
//!   rollout status NAME` (`GET /api/v1/rollouts/{name}`: steps, the current step, gate
//!   values against their bounds, bake left, the last action, the chain verified).

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::Failure;
use crate::killswitch::{ServerArgs, call, client, token, url};

#[derive(Debug, Subcommand)]
pub enum ControllerCommand {
    /// Run the controller loop on a policy dir and a data dir (halo-server --controller's
    /// loop, outside halo-server).
    Run(RunArgs),
    /// The in-process controller's state as of its last tick.
    Status(StatusArgs),
}

/// `halo controller run`: each tick reads the policy dir as it is now, the evidence
/// store, and acts at most once per experiment run (recorded in the data dir's
/// controller-state.jsonl).
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The policy directory, read again at every tick.
    #[arg(long, value_name = "DIR")]
    pub policy_dir: PathBuf,
    /// The data dir: controller-state.jsonl, the kill log (killswitch.jsonl) and, unless
    /// --evidence-postgres-file, the embedded evidence store (evidence.db). Use the data
    /// dir of the halo-server whose receivers store the evidence.
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// File holding a PostgreSQL connection string for the evidence store [default: the
    /// embedded store in --data-dir].
    #[arg(long, value_name = "FILE")]
    pub evidence_postgres_file: Option<PathBuf>,
    /// Time between ticks, at least 1m; after a failed tick the next comes sooner, from
    /// 15s up to the interval.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Run one tick, print the status and exit (1 if the tick failed): for cron jobs.
    #[arg(long)]
    pub once: bool,
    /// A halo-server with a kill key serves --data-dir, so a kill written there reaches
    /// the gateways (within a second). Without it a rollback is reported `kill_written`:
    /// not known to be enforced, and the pause PR is marked urgent.
    #[arg(long)]
    pub killswitch_served: bool,
    /// A local clone of the policy repo PRs are pushed from [default: --policy-dir].
    #[arg(long, value_name = "DIR")]
    pub policy_repo: Option<PathBuf>,
    /// The branch PRs target.
    #[arg(long, value_name = "BRANCH", default_value = halo_controller::assemble::DEFAULT_BASE_BRANCH)]
    pub base_branch: String,
    /// Webhook to notify (signed: X-Halo-Timestamp and an HMAC-SHA256); requires
    /// --webhook-secret-file.
    #[arg(long, value_name = "URL", requires = "webhook_secret_file")]
    pub webhook_url: Option<String>,
    /// File holding the webhook's HMAC secret.
    #[arg(long, value_name = "FILE", requires = "webhook_url")]
    pub webhook_secret_file: Option<PathBuf>,
    /// Send a Slack-compatible payload ({"text": ...}) instead of the generic one.
    #[arg(long)]
    pub webhook_slack: bool,
    /// The gh program PRs are opened with [default: gh on PATH].
    #[arg(long, value_name = "PATH")]
    pub gh: Option<PathBuf>,
}

impl RunArgs {
    /// The settings halo-server's `--controller*` flags resolve to, checked the same way.
    pub fn settings(&self) -> anyhow::Result<halo_controller::assemble::ControllerSettings> {
        let settings = halo_controller::assemble::ControllerSettings {
            enabled: true,
            interval: self.interval,
            policy_repo: self.policy_repo.clone(),
            base_branch: self.base_branch.clone(),
            webhook_url: self.webhook_url.clone(),
            webhook_secret_file: self.webhook_secret_file.clone(),
            webhook_slack: self.webhook_slack,
            gh: self.gh.clone(),
        };
        settings
            .check(true)
            .map_err(|e| anyhow::anyhow!(e.replace("--controller-", "--")))?;
        Ok(settings)
    }
}

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// One rollout: steps, current step, gates against bounds, bake left, last action,
    /// whether its state file's hash chain verifies.
    Status(RolloutArgs),
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the server's JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Args)]
pub struct RolloutArgs {
    /// The rollout's name.
    pub name: String,
    /// Print the server's JSON instead of a summary.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

fn get(server: &ServerArgs, path: &str, what: &str) -> anyhow::Result<Value> {
    let token = token(server)?;
    call(
        client()?.get(url(&server.server, path)).bearer_auth(token),
        what,
    )
}

fn print_json(body: &Value) {
    println!("{}", serde_json::to_string_pretty(body).unwrap_or_default());
}

pub fn run_controller(command: ControllerCommand) -> Result<(), Failure> {
    let args = match command {
        ControllerCommand::Run(args) => return run_loop(&args),
        ControllerCommand::Status(args) => args,
    };
    let body = get(
        &args.server,
        "/api/v1/controller/status",
        "controller status",
    )?;
    if args.json {
        print_json(&body);
        return Ok(());
    }
    print_controller(&body)?;
    Ok(())
}

pub fn run_rollout(command: RolloutCommand) -> Result<(), Failure> {
    let RolloutCommand::Status(args) = command;
    let body = get(
        &args.server,
        &format!("/api/v1/rollouts/{}", args.name),
        &format!("rollout status {}", args.name),
    )?;
    if args.json {
        print_json(&body);
        return Ok(());
    }
    print_rollout(&body)?;
    Ok(())
}

fn run_loop(args: &RunArgs) -> Result<(), Failure> {
    use halo_controller::assemble::{DataDirKill, DirPolicy, assemble};
    let settings = args.settings()?;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HALO_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let store = halo_store::FileStore::open(&args.data_dir)
        .with_context(|| format!("opening data dir {}", args.data_dir.display()))?;
    let evidence = halo_evidence::open::open_store(
        args.evidence_postgres_file.as_deref(),
        Some(&args.data_dir),
    )
    .map_err(anyhow::Error::from)?;
    if !args.killswitch_served {
        eprintln!(
            "warning: no --killswitch-served: a rollback's kill is written to {} but enforced only if a halo-server with a kill key serves that dir",
            args.data_dir.display()
        );
    }
    let controller = assemble(
        &settings,
        &args.data_dir,
        &args.policy_dir,
        Arc::new(DirPolicy(args.policy_dir.clone())),
        evidence,
        Some(Arc::new(DataDirKill {
            store: Arc::new(store),
            served: args.killswitch_served,
        })),
    )
    .map_err(anyhow::Error::from)?;
    if args.once {
        let tick = runtime.block_on(controller.tick_within_budget(time::OffsetDateTime::now_utc()));
        let status = serde_json::to_value(controller.status()).context("encoding the status")?;
        print_controller(&status)?;
        return tick
            .map_err(|e| Failure::Error(anyhow::anyhow!("the controller tick failed: {e}")));
    }
    runtime.block_on(controller.run(args.interval, async {
        let _ = tokio::signal::ctrl_c().await;
    }));
    Ok(())
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

fn print_controller(body: &Value) -> anyhow::Result<()> {
    let mut out = tabwriter::TabWriter::new(std::io::stdout());
    writeln!(out, "last tick: {}", s(&body["lastTick"]))?;
    if let Some(e) = body["lastError"].as_str() {
        writeln!(out, "last error: {e}")?;
    }
    writeln!(
        out,
        "\nEXPERIMENT\tRUN\tSTATE\tVERDICT\tREASON\tKILL\tPULL REQUEST"
    )?;
    for (name, e) in body["experiments"].as_object().into_iter().flatten() {
        let verdict = &e["verdict"];
        let action = &e["action"];
        writeln!(
            out,
            "{name}\t{}\t{}\t{}\t{}\t{}\t{}",
            e["run"],
            s(&e["state"]),
            s(verdict.get("decision").unwrap_or(&action["decision"])),
            s(verdict.get("reason").unwrap_or(&Value::Null)),
            s(&action["killOutcome"]),
            s(&action["pullRequest"]),
        )?;
    }
    if let Some(rollouts) = body["rollouts"].as_object() {
        writeln!(out, "\nROLLOUT\tSTEP\tSTATE\tMOVE\tREASON")?;
        for (name, r) in rollouts {
            let eval = if r["evaluation"].is_object() {
                &r["evaluation"]
            } else {
                &r["action"]["evaluation"]
            };
            writeln!(
                out,
                "{name}\t{}\t{}\t{}\t{}",
                r["step"],
                s(&r["state"]),
                s(&eval["action"]["move"]),
                s(eval
                    .get("reason")
                    .or(r.get("error"))
                    .unwrap_or(&Value::Null)),
            )?;
        }
    }
    out.flush().context("writing the table")
}

fn print_rollout(body: &Value) -> anyhow::Result<()> {
    let rollout = &body["rollout"];
    let report = &body["controller"];
    let chain = &body["chain"];
    let mut out = tabwriter::TabWriter::new(std::io::stdout());
    writeln!(
        out,
        "rollout {} ({} axis, experiment {}): status {}, step {}",
        s(&rollout["name"]),
        s(&rollout["axis"]),
        s(&rollout["experiment"]),
        s(&rollout["status"]),
        rollout["step"]
    )?;
    match chain {
        Value::Null => writeln!(
            out,
            "state file: not read (this halo-server runs no controller)"
        )?,
        c if c["verified"] == true => writeln!(
            out,
            "state file: chain verified, {} record(s), head {}",
            c["records"],
            s(&c["head"])
        )?,
        c => writeln!(
            out,
            "state file: REFUSED, the rollout is held: {}",
            s(&c["error"])
        )?,
    }
    writeln!(out, "\nSTEP\tRING\tPERCENT\tBAKE\tGATES\tON FAILURE")?;
    let current = rollout["step"].as_u64().unwrap_or(0);
    for (i, step) in rollout["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let gates: Vec<String> = step["gates"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| {
                let mut b = s(&g["metric"]).to_string();
                if let Some(max) = g["max"].as_f64() {
                    b.push_str(&format!(" <= {max}"));
                }
                if let Some(min) = g["min"].as_f64() {
                    b.push_str(&format!(" >= {min}"));
                }
                b
            })
            .collect();
        writeln!(
            out,
            "{}{i}\t{}\t{}\t{}\t{}\t{}",
            if i as u64 == current { "* " } else { "  " },
            s(&step["ring"]),
            step["percent"]
                .as_u64()
                .map_or("-".to_string(), |p| format!("{p}%")),
            s(&step["bake"]),
            gates.join(", "),
            step["onFailure"].as_str().unwrap_or("rollback"),
        )?;
    }
    if report.is_null() {
        writeln!(
            out,
            "\nno evaluation yet (the controller has not ticked on it)"
        )?;
        return out.flush().context("writing the table");
    }
    let eval = if report["evaluation"].is_object() {
        &report["evaluation"]
    } else {
        &report["action"]["evaluation"]
    };
    writeln!(
        out,
        "\nlast tick: {} since {}; {}",
        s(&report["state"]),
        s(&report["stepStarted"]),
        s(&eval["reason"])
    )?;
    if let Some(left) = eval["bakeLeftSeconds"].as_u64() {
        writeln!(out, "bake left: {left} s")?;
    }
    writeln!(out, "\nGATE\tMIN\tMAX\tVALUE\tUNITS\tSTATE\tEVIDENCE")?;
    for g in eval["gates"].as_array().into_iter().flatten() {
        let num = |k: &str| g[k].as_f64().map_or("-".to_string(), |v| format!("{v}"));
        let sources: Vec<&str> = g["sources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            s(&g["metric"]),
            num("min"),
            num("max"),
            g["value"]
                .as_f64()
                .map_or("-".to_string(), |v| format!("{v:.4}")),
            g["n"],
            s(&g["state"]),
            sources.join(","),
        )?;
    }
    let action = &report["action"];
    if action.is_object() {
        writeln!(
            out,
            "\nlast action: {} at step {}; kill {}; pull request {}; notified {}",
            s(&action["evaluation"]["action"]["move"]),
            action["step"],
            s(&action["killOutcome"]),
            s(&action["pullRequest"]),
            action["notified"]
        )?;
    }
    out.flush().context("writing the table")
}
