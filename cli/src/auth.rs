//! `halo auth login | token | status | logout`: the developer's own Halos token for every
//! harness (Claude Code's apiKeyHelper and Gemini CLI's GEMINI_API_KEY run
//! `halo auth token`). Glue over halo-auth; this module only resolves settings, picks
//! the login flow and prints.
//!
//! Settings: `--issuer`/`--client-id`/`--audience` (or HALO_AUTH_ISSUER,
//! HALO_AUTH_CLIENT_ID, HALO_AUTH_AUDIENCE) win; what is not given comes from the
//! policy's `identity` (`--policy-dir` or HALO_POLICY_DIR): issuer, clientID, audience
//! (else clientID) and the user and groups claim names, which is what the gateway checks.
//! halod's configuration names no issuer, so the policy is the one place it is written.
//!
//! Flow: `--device` or `--browser`; by default the device grant over SSH
//! (SSH_CONNECTION, SSH_TTY) and on Linux without DISPLAY or WAYLAND_DISPLAY (unless
//! BROWSER is set), the browser otherwise.
//!
//! Exit status: 0 success; 1 a failure; 2 a usage error; 3 not logged in or the session
//! ended: the one-line message says to run `halo auth login`.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use clap::{Args, Subcommand, ValueEnum};
use halo_auth::oauth::DeviceStart;
use halo_auth::session::{self, Flow, LoginSettings, Prompt, Revocation, Status};
use halo_auth::store::{AuthDir, StoreChoice};
use halo_auth::unix_now;
use halo_policy::{DEFAULT_GROUPS_CLAIM, DEFAULT_USER_CLAIM};

use crate::Failure;

#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Sign in at the organisation's identity provider (once per machine).
    Login(LoginArgs),
    /// Print a valid token for the gateway (refreshed when it expires within a minute).
    Token {
        /// The audience the token must carry (default: the one chosen at login).
        #[arg(long, value_name = "A")]
        audience: Option<String>,
    },
    /// Who is logged in, at which issuer, and when the cached tokens expire.
    Status,
    /// Revoke the refresh token at the issuer and forget the login.
    Logout,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreArg {
    /// The OS credential store when it works, else a 0600 file.
    Auto,
    /// Only the OS credential store (Secret Service, Keychain, Credential Manager).
    Keyring,
    /// Only a 0600 file in the halo auth directory.
    File,
}

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The OIDC issuer URL (default: the policy's identity.issuer).
    #[arg(long, value_name = "URL", env = "HALO_AUTH_ISSUER")]
    issuer: Option<String>,
    /// The OAuth client id of the Halos app (default: the policy's identity.clientID).
    #[arg(long, value_name = "ID", env = "HALO_AUTH_CLIENT_ID")]
    client_id: Option<String>,
    /// The audience `halo auth token` serves by default (default: the policy's
    /// identity.audience, else clientID).
    #[arg(long, value_name = "A", env = "HALO_AUTH_AUDIENCE")]
    audience: Option<String>,
    /// A policy repo whose identity supplies what the flags do not.
    #[arg(long, value_name = "DIR", env = "HALO_POLICY_DIR")]
    policy_dir: Option<PathBuf>,
    /// OAuth scopes to ask for.
    #[arg(long, default_value = halo_auth::oauth::DEFAULT_SCOPE)]
    scope: String,
    /// A PEM bundle of extra CAs for the issuer's TLS (a private CA).
    #[arg(long, value_name = "PEM", env = "HALO_AUTH_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Use the device grant: a code to enter at a URL on any device.
    #[arg(long, conflicts_with = "browser")]
    device: bool,
    /// Use this machine's browser (authorization code + PKCE, loopback redirect).
    #[arg(long)]
    browser: bool,
    /// Where to keep the refresh token.
    #[arg(long, value_enum, default_value = "auto", env = "HALO_AUTH_STORE")]
    store: StoreArg,
    /// How long to wait for the browser's redirect.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

pub fn run(command: AuthCommand) -> Result<(), Failure> {
    let dir = AuthDir::new(halo_auth::store::default_dir().map_err(failure)?).map_err(failure)?;
    match command {
        AuthCommand::Login(args) => login(&dir, args),
        AuthCommand::Token { audience } => token(&dir, audience.as_deref()),
        AuthCommand::Status => status(&dir),
        AuthCommand::Logout => logout(&dir),
    }
}

/// A halo-auth error as the CLI's failure: "log in again" errors get exit status 3.
fn failure(e: halo_auth::Error) -> Failure {
    if e.needs_login() {
        Failure::LoginNeeded(format!("{e}; run `halo auth login`"))
    } else {
        Failure::Error(anyhow!(e))
    }
}

fn settings(args: &LoginArgs) -> Result<LoginSettings, Failure> {
    let identity = match &args.policy_dir {
        Some(dir) => crate::policy_dir::load_valid(dir)?.root.identity,
        None => None,
    };
    let issuer = args
        .issuer
        .clone()
        .or_else(|| identity.as_ref().map(|i| i.issuer.clone()))
        .filter(|i| !i.is_empty())
        .ok_or_else(|| anyhow!("no issuer: pass --issuer, or --policy-dir with an identity"))?;
    let client_id = args
        .client_id
        .clone()
        .or_else(|| identity.as_ref().and_then(|i| i.client_id.clone()))
        .ok_or_else(|| {
            anyhow!("no client id: pass --client-id, or set identity.clientID in the policy")
        })?;
    let audience = args.audience.clone().or_else(|| {
        identity
            .as_ref()
            .and_then(|i| i.effective_audience().map(str::to_string))
    });
    let claims = identity
        .as_ref()
        .and_then(|i| i.claims.clone())
        .unwrap_or_default();
    Ok(LoginSettings {
        issuer,
        client_id,
        audience,
        user_claim: claims.user.unwrap_or_else(|| DEFAULT_USER_CLAIM.into()),
        groups_claim: claims.groups.unwrap_or_else(|| DEFAULT_GROUPS_CLAIM.into()),
        scope: args.scope.clone(),
        ca_file: args.ca_file.clone(),
        store: match args.store {
            StoreArg::Auto => StoreChoice::Auto,
            StoreArg::Keyring => StoreChoice::Keyring,
            StoreArg::File => StoreChoice::File,
        },
    })
}

/// The flow the flags ask for, else the one the environment suits.
fn choose_flow(args: &LoginArgs) -> Flow {
    let browser = Flow::Browser {
        timeout: args.timeout,
    };
    if args.device {
        return Flow::Device;
    }
    if args.browser {
        return browser;
    }
    let set = |n: &str| std::env::var_os(n).is_some_and(|v| !v.is_empty());
    let ssh = set("SSH_CONNECTION") || set("SSH_TTY");
    let headless = cfg!(all(unix, not(target_os = "macos")))
        && !set("DISPLAY")
        && !set("WAYLAND_DISPLAY")
        && !set("BROWSER");
    if ssh || headless {
        Flow::Device
    } else {
        browser
    }
}

/// Shows the device code and opens the browser; everything on stderr (stdout is for
/// results).
struct Terminal;

impl Prompt for Terminal {
    fn device_code(&mut self, start: &DeviceStart) {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(
            err,
            "To sign in, open {} and enter the code {}",
            start.verification_uri, start.user_code
        );
        if let Some(full) = &start.verification_uri_complete {
            let _ = writeln!(err, "(or open {full})");
        }
        let _ = writeln!(err, "Waiting for the sign-in...");
    }

    fn open_browser(&mut self, url: &str) {
        let _ = writeln!(
            std::io::stderr(),
            "Opening the browser to sign in. If it does not open, visit:\n{url}"
        );
        let _ = open_browser(url);
    }
}

/// `$BROWSER` (its first `:`-separated entry) or the OS's opener, not waited for.
fn open_browser(url: &str) -> std::io::Result<()> {
    let browser = std::env::var("BROWSER")
        .ok()
        .filter(|b| !b.trim().is_empty());
    let mut cmd = match browser.as_deref().and_then(|b| b.split(':').next()) {
        Some(b) => std::process::Command::new(b),
        None if cfg!(target_os = "macos") => std::process::Command::new("open"),
        None if cfg!(windows) => {
            let mut c = std::process::Command::new("rundll32");
            c.arg("url.dll,FileProtocolHandler");
            c
        }
        None => std::process::Command::new("xdg-open"),
    };
    cmd.arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(|_| ())
}

fn login(dir: &AuthDir, args: LoginArgs) -> Result<(), Failure> {
    let settings = settings(&args)?;
    let flow = choose_flow(&args);
    let status = session::login(dir, &settings, flow, &mut Terminal, &unix_now).map_err(failure)?;
    if let Some(why) = &status.store_fallback {
        eprintln!(
            "halo: no OS credential store ({why}); the refresh token is in a 0600 file instead"
        );
    }
    print_status(&status, "Logged in");
    Ok(())
}

fn token(dir: &AuthDir, audience: Option<&str>) -> Result<(), Failure> {
    let t = session::token(dir, audience, &unix_now).map_err(failure)?;
    if let Some(w) = &t.warning {
        eprintln!("halo: {w}");
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", t.token)
        .and_then(|()| out.flush())
        .context("writing the token")?;
    Ok(())
}

fn status(dir: &AuthDir) -> Result<(), Failure> {
    let status = session::status(dir).map_err(failure)?;
    print_status(&status, "Logged in");
    Ok(())
}

fn print_status(status: &Status, verb: &str) {
    let s = &status.session;
    let who = s.user.as_deref().unwrap_or("(no user claim)");
    println!("{verb} to {} as {who}", s.issuer);
    if !s.groups.is_empty() {
        println!("  groups:        {}", s.groups.join(", "));
    }
    println!("  client id:     {}", s.client_id);
    if let Some(a) = &s.audience {
        println!("  audience:      {a}");
    }
    println!("  refresh token: {}", status.store);
    let now = unix_now();
    for (aud, at) in &status.tokens {
        let when = time::OffsetDateTime::from_unix_timestamp(*at)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_else(|| at.to_string());
        let left = at - now;
        let state = if left > 0 {
            format!(
                "in {}",
                humantime::format_duration(Duration::from_secs(left.unsigned_abs()))
            )
        } else {
            "expired; refreshed on next use".to_string()
        };
        println!("  token for {aud}: expires {when} ({state})");
    }
}

fn logout(dir: &AuthDir) -> Result<(), Failure> {
    match session::logout(dir).map_err(failure)? {
        None => println!("Not logged in."),
        Some((s, revocation)) => {
            println!("Logged out of {}.", s.issuer);
            match revocation {
                Revocation::Revoked => println!("The refresh token was revoked at the issuer."),
                Revocation::NothingToRevoke => {}
                Revocation::NotSupported => eprintln!(
                    "halo: the issuer offers no revocation endpoint; the refresh token expires there on its own"
                ),
                Revocation::Failed(why) => {
                    eprintln!("halo: revoking at the issuer failed ({why}); the local copy is gone")
                }
            }
        }
    }
    Ok(())
}
