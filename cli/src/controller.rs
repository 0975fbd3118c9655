//! The controller's views through halo-server's admin API (the same admin auth as `halo
//! kill`): `halo controller status` (`GET /api/v1/controller/status`: per experiment its
//! run, state, verdict and last action; per running rollout its step and state) and
//! `halo rollout status NAME` (`GET /api/v1/rollouts/{name}`: steps, the current step,
//! gate values against their bounds, bake left, the last action, the chain verified).

use std::io::Write as _;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::Failure;
use crate::killswitch::{ServerArgs, call, client, token, url};

#[derive(Debug, Subcommand)]
pub enum ControllerCommand {
    /// The in-process controller's state as of its last tick.
    Status(StatusArgs),
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
    let ControllerCommand::Status(args) = command;
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
