//! `halo evidence query`: an experiment's per-variant summary (n, mean, 95% interval of
//! the mean, one row per variant and source: a shadow variant's row says `shadow`) for one metric, from halo-server's evidence store through its admin API
//! (`GET /api/v1/evidence/samples`, the same admin auth as `halo kill`).

use std::io::Write as _;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::Failure;
use crate::killswitch::{ServerArgs, call, client, show, token, url};

#[derive(Debug, Subcommand)]
pub enum EvidenceCommand {
    /// Per-variant summary of an experiment's samples for one metric.
    Query(QueryArgs),
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    /// The experiment.
    #[arg(long)]
    pub experiment: String,
    /// error_rate, ttfb_p50, ttfb_p95, duration_p50, duration_p95, tokens or cost (each a
    /// value per unit; the summary is over units).
    #[arg(long)]
    pub metric: String,
    /// How far back, a duration like 24h or 7d [default: 24h].
    #[arg(long)]
    pub since: Option<String>,
    /// Print the server's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub fn run(command: EvidenceCommand) -> Result<(), Failure> {
    let EvidenceCommand::Query(args) = command;
    let token = token(&args.server)?;
    let mut query = vec![
        ("experiment", args.experiment.clone()),
        ("metric", args.metric.clone()),
    ];
    if let Some(since) = &args.since {
        query.push(("since", since.clone()));
    }
    let body = call(
        client()?
            .get(url(&args.server.server, "/api/v1/evidence/samples"))
            .query(&query)
            .bearer_auth(token),
        &format!("evidence query {}", args.experiment),
    )?;
    show(&body, args.json, print_summary)?;
    Ok(())
}

fn print_summary(body: &Value) -> anyhow::Result<()> {
    println!(
        "experiment {} metric {} over {}: {} sample(s), one per (variant, unit, source)",
        body["experiment"].as_str().unwrap_or("?"),
        body["metric"].as_str().unwrap_or("?"),
        body["since"].as_str().unwrap_or("?"),
        body["samples"]
    );
    let mut tw = tabwriter::TabWriter::new(std::io::stdout());
    writeln!(tw, "VARIANT\tSOURCE\tN\tMEAN\t95% INTERVAL")?;
    for v in body["variants"].as_array().into_iter().flatten() {
        let num = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        writeln!(
            tw,
            "{}\t{}\t{}\t{:.6}\t[{:.6}, {:.6}]",
            v["variant"].as_str().unwrap_or("?"),
            v["source"].as_str().unwrap_or("?"),
            v["n"],
            num("mean"),
            num("low"),
            num("high")
        )?;
    }
    tw.flush().context("writing the table")?;
    Ok(())
}
