//! `halo budget status --user U`: the budgets that apply to a user and what was spent
//! against each this period, from halo-server's budget service
//! (`GET /api/v1/budgets/status`, admin).

use std::io::Write as _;

use clap::{Args, Subcommand};
use serde_json::Value;
use tabwriter::TabWriter;

use crate::Failure;
use crate::killswitch::{ServerArgs, call, client, show, token, url};

#[derive(Debug, Subcommand)]
pub enum BudgetCommand {
    /// Spend and tokens against each budget that applies to a user, this period.
    Status(StatusArgs),
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The user (the identity claim, usually an email).
    #[arg(long)]
    pub user: String,
    /// A group of the user (repeat for several), for group budgets and rings.
    #[arg(long = "group", value_name = "GROUP")]
    pub groups: Vec<String>,
    /// Print the server's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub fn run(command: BudgetCommand) -> Result<(), Failure> {
    let BudgetCommand::Status(args) = command;
    let token = token(&args.server)?;
    let groups = args.groups.join(",");
    let request = client()?
        .get(url(&args.server.server, "/api/v1/budgets/status"))
        .query(&[("user", args.user.as_str()), ("groups", groups.as_str())])
        .bearer_auth(token);
    let body = call(request, "budget status")?;
    show(&body, args.json, print_status)?;
    Ok(())
}

fn print_status(body: &Value) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "Budgets of user {} (ring {})",
        body["user"], body["ring"]
    )?;
    let budgets = body["budgets"].as_array().cloned().unwrap_or_default();
    if budgets.is_empty() {
        writeln!(out, "none apply")?;
        return Ok(());
    }
    let mut table = TabWriter::new(Vec::new()).padding(2);
    writeln!(
        table,
        "BUDGET\tLIMIT\tSPENT TOKENS\tSPENT USD\tRESETS AT\tSTATE"
    )?;
    for b in budgets {
        writeln!(
            table,
            "{}\t{}\t{}\t{:.6}\t{}\t{}",
            b["name"].as_str().unwrap_or("?"),
            b["describe"].as_str().unwrap_or("?"),
            b["spentTokens"],
            b["spentUsd"].as_f64().unwrap_or(0.0),
            b["resetsAt"].as_str().unwrap_or("?"),
            if b["spent"] == true {
                "spent: refused"
            } else {
                "ok"
            },
        )?;
    }
    out.write_all(&table.into_inner()?)?;
    Ok(())
}
