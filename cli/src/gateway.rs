//! `halo gateway`: compile the policy for the traffic plane, and show the routes a user
//! would hit, using the same decision and route-order functions as the Envoy filter.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Subcommand;
use halo_policy::assign::sticky_key;
use halo_policy::budgets;
use halo_policy::decide::{Caller, Decision, Subject, decide};
use halo_policy::route::{route_order, skipped_by};
use halo_policy::types::{AtLimit, BudgetCount};
use halo_policy::{Harness, Snapshot, compile};
use tabwriter::TabWriter;

use crate::Failure;
use crate::policy_dir::load_valid;
use halo_fsutil::write_atomic;

#[derive(Debug, Subcommand)]
pub enum GatewayCommand {
    /// Compile the policy into the snapshot the filter and the xDS server consume.
    /// Deterministic: the same policy gives the same bytes; their sha256 is the version.
    Compile {
        #[arg(long, value_name = "DIR", env = "HALO_POLICY_DIR")]
        policy_dir: PathBuf,
        /// Output file (written atomically; nothing is written if the policy is invalid),
        /// or - for standard output.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
    },
    /// Print, per alias, the targets in the order a user's request tries them.
    Routes {
        #[arg(long, value_name = "DIR", env = "HALO_POLICY_DIR")]
        policy_dir: PathBuf,
        /// The verified user (the identity claim, usually an email). Without it, weighted
        /// tiers are shown in policy order and no ring, toggle or experiment applies.
        #[arg(long)]
        user: Option<String>,
        /// The harness session id that, with the user, makes the weighted pick sticky.
        #[arg(long, requires = "user", default_value = "")]
        session: String,
        /// A group of the user (repeat for several), for group-based rings and toggles.
        #[arg(long = "group", value_name = "GROUP", requires = "user")]
        groups: Vec<String>,
    },
}

pub fn run(command: GatewayCommand) -> Result<(), Failure> {
    match command {
        GatewayCommand::Compile { policy_dir, output } => compile_command(&policy_dir, &output),
        GatewayCommand::Routes {
            policy_dir,
            user,
            session,
            groups,
        } => {
            let org = load_valid(&policy_dir)?;
            let snapshot = compile(&org);
            let caller = user.map(|user| Subject { user, groups });
            let mut out = std::io::stdout().lock();
            write_routes(&mut out, &snapshot, caller.as_ref(), &session)
                .context("writing the routes table")?;
            Ok(())
        }
    }
}

fn compile_command(policy_dir: &Path, output: &Path) -> Result<(), Failure> {
    let org = load_valid(policy_dir)?;
    let bytes = compile(&org).to_bytes();
    let version = Snapshot::version_of(&bytes);
    if output == Path::new("-") {
        std::io::stdout()
            .lock()
            .write_all(&bytes)
            .context("writing the snapshot to stdout")?;
    } else {
        write_atomic(output, &bytes, 0o644).context("writing the snapshot")?;
        eprintln!(
            "compiled {} -> {} (version {version})",
            policy_dir.display(),
            output.display()
        );
    }
    Ok(())
}

/// The routes table of the traffic-plane doc: one row per target of every alias, in the
/// order a request tries them.
pub fn write_routes(
    out: &mut dyn Write,
    snapshot: &Snapshot,
    subject: Option<&Subject>,
    session: &str,
) -> std::io::Result<()> {
    match subject {
        Some(s) => writeln!(out, "Routes for user {:?} session {:?}", s.user, session)?,
        None => writeln!(out, "Routes (no user: weighted tiers in policy order)")?,
    }
    let caller = match subject {
        Some(s) => Caller::Verified(s.clone()),
        None => Caller::Anonymous,
    };
    let key = subject.map(|s| sticky_key(&s.user, session));
    let mut table = TabWriter::new(Vec::new()).padding(2);
    writeln!(
        table,
        "ALIAS\tORDER\tUPSTREAM\tKIND\tMODEL\tWEIGHT\tPRIORITY\tTIMEOUT\tNOTES"
    )?;
    let mut ring = None;
    for alias in snapshot.models.keys() {
        let decision = decide(snapshot, &caller, alias);
        ring.get_or_insert_with(|| decision.ring.clone());
        let via = decision_note(&decision);
        for (order, entry) in route_order(&decision.targets, key.as_deref(), alias)
            .iter()
            .enumerate()
        {
            let target = entry.target;
            let kind = snapshot
                .upstreams
                .get(&target.upstream)
                .map(|u| u.kind.as_str())
                .unwrap_or("?");
            let mut notes = Vec::new();
            if entry.first_pick {
                notes.push("<- hit when healthy".to_string());
            }
            let skipped: Vec<&str> = skipped_by(snapshot, target)
                .into_iter()
                .map(Harness::as_str)
                .collect();
            if !skipped.is_empty() {
                notes.push(format!("skipped by {}", skipped.join(",")));
            }
            if entry.first_pick {
                notes.extend(via.clone());
            }
            writeln!(
                table,
                "{alias}\t{}\t{}\t{kind}\t{}\t{}\t{}\t{}\t{}",
                order + 1,
                target.upstream,
                target.model,
                target.weight.map_or("-".to_string(), |w| w.to_string()),
                target.priority,
                target
                    .timeout_seconds
                    .map_or("-".to_string(), |t| format!("{t}s")),
                notes.join("; ")
            )?;
        }
    }
    write_table(out, table)?;
    if let (Some(subject), Some(ring)) = (subject, ring) {
        writeln!(out, "Ring: {ring}")?;
        write_budgets(out, snapshot, subject, &ring)?;
    }
    Ok(())
}

/// The budgets that apply to `subject` in `ring` ([`halo_policy::budgets::applying`], the
/// filter's own answer): one line each, with whose count it is and what happens at its
/// limit; nothing when the policy has no budgets.
fn write_budgets(
    out: &mut dyn Write,
    snapshot: &Snapshot,
    subject: &Subject,
    ring: &str,
) -> std::io::Result<()> {
    if snapshot.budgets.is_empty() {
        return Ok(());
    }
    let applying = budgets::applying(snapshot, subject, ring);
    if applying.is_empty() {
        return writeln!(out, "Budgets: none apply");
    }
    writeln!(out, "Budgets (each is checked; any one spent refuses):")?;
    let mut table = TabWriter::new(Vec::new()).padding(2);
    writeln!(table, "BUDGET\tLIMIT\tCOUNT\tAT LIMIT")?;
    for a in applying {
        let count = match a.budget.count {
            BudgetCount::PerUser => "per user",
            BudgetCount::Pooled => "pooled",
        };
        let at_limit = match &a.budget.at_limit {
            AtLimit::Refuse => "refuse (429)".to_string(),
            AtLimit::RouteTo(routes) => {
                let routes: Vec<String> = routes.iter().map(|(f, t)| format!("{f}->{t}")).collect();
                format!("routeTo {} (not enforced yet: refuses)", routes.join(","))
            }
        };
        writeln!(
            table,
            "{}\t{}\t{count}\t{at_limit}",
            a.name,
            budgets::describe(a.budget)
        )?;
    }
    write_table(out, table)
}

/// A finished table, each line without trailing blanks (the last column is not padded).
fn write_table(out: &mut dyn Write, table: TabWriter<Vec<u8>>) -> std::io::Result<()> {
    let table = table
        .into_inner()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    for line in String::from_utf8_lossy(&table).lines() {
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// Notes saying why an alias does not take the Gateway's route for this user.
fn decision_note(decision: &Decision) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(toggle) = &decision.toggle {
        notes.push(format!("toggle {toggle}"));
    }
    if let Some(attribution) = decision.experiment.as_ref().filter(|a| a.routed) {
        notes.push(format!(
            "experiment {} variant {}",
            attribution.experiment, attribution.variant
        ));
    }
    notes
}
