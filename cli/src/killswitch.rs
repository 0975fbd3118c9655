//! `halo kill`, `halo unkill` and `halo killswitch status`: the kill switch through
//! halo-server's admin API (ADR-0009).
//!
//! The admin's OIDC token comes from `HALO_TOKEN` or `--token-file`, never from a flag
//! value (which other users could read in the process list). Server refusals are printed
//! with their JSON error code and message.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};

use crate::Failure;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    Experiment,
    Toggle,
}

impl Kind {
    fn path_segment(self) -> &'static str {
        match self {
            Kind::Experiment => "experiments",
            Kind::Toggle => "toggles",
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Kind::Experiment => "experiment",
            Kind::Toggle => "toggle",
        }
    }
}

/// Where halo-server is and how to authenticate.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// halo-server's base URL.
    #[arg(long, value_name = "URL", env = "HALO_SERVER_URL")]
    pub server: String,
    /// File holding an admin's OIDC token (else the HALO_TOKEN environment variable).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ChangeArgs {
    /// What to kill: an experiment or a (traffic or client) toggle.
    pub kind: Kind,
    /// Its name in the served policy.
    pub name: String,
    /// Why (required; it goes into the kill log and the audit log).
    #[arg(long)]
    pub reason: String,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Subcommand)]
pub enum KillswitchCommand {
    /// What is killed now, by whom, when and why.
    Status {
        #[command(flatten)]
        server: ServerArgs,
        /// Print the server's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) fn token(args: &ServerArgs) -> anyhow::Result<String> {
    let token = match &args.token_file {
        Some(path) => read_token(path)?,
        None => std::env::var("HALO_TOKEN")
            .context("set HALO_TOKEN to an admin's OIDC token, or pass --token-file")?,
    };
    let token = token.trim().to_string();
    if token.is_empty() {
        bail!("the admin token is empty");
    }
    Ok(token)
}

fn read_token(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

pub(crate) fn client() -> anyhow::Result<reqwest::blocking::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .context("building the HTTP client")
}

pub(crate) fn url(server: &str, path: &str) -> String {
    format!("{}{path}", server.trim_end_matches('/'))
}

/// Send and decode; a non-2xx answer becomes an error with the server's code and message.
pub(crate) fn call(req: reqwest::blocking::RequestBuilder, what: &str) -> anyhow::Result<Value> {
    let resp = req
        .send()
        .with_context(|| format!("{what}: cannot reach halo-server"))?;
    let status = resp.status();
    let bytes = resp
        .bytes()
        .with_context(|| format!("{what}: reading the answer"))?;
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if !status.is_success() {
        let code = body["error"].as_str().unwrap_or("error");
        let message = body["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
        bail!(
            "{what}: halo-server answered {} {code}: {message}",
            status.as_u16()
        );
    }
    Ok(body)
}

/// Print a status answer: the server's JSON as it came with `--json`, else `table`'s
/// rendering of it.
pub(crate) fn show(
    body: &Value,
    json: bool,
    table: impl FnOnce(&Value) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(body).unwrap_or_default());
        return Ok(());
    }
    table(body)
}

/// `halo kill` (kill = true) and `halo unkill`.
pub fn change(args: ChangeArgs, kill: bool) -> Result<(), Failure> {
    let verb = if kill { "kill" } else { "unkill" };
    if args.reason.trim().is_empty() {
        return Err(Failure::Error(anyhow::anyhow!(
            "--reason must say why (it goes into the kill log and the audit log)"
        )));
    }
    let token = token(&args.server)?;
    let path = format!(
        "/api/v1/{}/{}/{verb}",
        args.kind.path_segment(),
        encode_segment(&args.name)
    );
    let body = call(
        client()?
            .post(url(&args.server.server, &path))
            .bearer_auth(token)
            .json(&json!({"reason": args.reason})),
        &format!("{verb} {} {}", args.kind.as_str(), args.name),
    )?;
    let state = if body["killed"] == Value::Bool(true) {
        "killed"
    } else {
        "not killed"
    };
    println!(
        "{} {} is {state} (kill list version {})",
        args.kind.as_str(),
        args.name,
        body["version"]
    );
    Ok(())
}

/// Percent-encode a path segment so a name cannot change the path.
fn encode_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub fn run(command: KillswitchCommand) -> Result<(), Failure> {
    match command {
        KillswitchCommand::Status { server, json } => {
            let token = token(&server)?;
            let body = call(
                client()?
                    .get(url(&server.server, "/api/v1/killswitch"))
                    .bearer_auth(token),
                "killswitch status",
            )?;
            show(&body, json, print_status)?;
            Ok(())
        }
    }
}

fn print_status(body: &Value) -> anyhow::Result<()> {
    let mut tw = tabwriter::TabWriter::new(std::io::stdout());
    writeln!(tw, "kill list version {}", body["version"])?;
    let mut rows = 0;
    for (kind, key) in [("experiment", "experiments"), ("toggle", "toggles")] {
        for e in body[key].as_array().into_iter().flatten() {
            if rows == 0 {
                writeln!(tw, "KIND\tNAME\tKILLED AT\tBY\tREASON")?;
            }
            rows += 1;
            writeln!(
                tw,
                "{kind}\t{}\t{}\t{}\t{}",
                e["name"].as_str().unwrap_or(""),
                e["killedAt"].as_str().unwrap_or(""),
                e["by"].as_str().unwrap_or(""),
                e["reason"]
                    .as_str()
                    .unwrap_or("")
                    .replace(['\t', '\n'], " ")
            )?;
        }
    }
    if rows == 0 {
        writeln!(tw, "nothing is killed")?;
    }
    tw.flush()?;
    Ok(())
}
