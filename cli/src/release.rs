//! `halo release`: build, publish, promote and verify signed releases of harness
//! settings (the halo-release crate does the work; this is flags, files and output).
//!
//! - `build` renders every ring (or one) into a local directory: no key, no registry.
//! - `publish` loads and validates the policy, builds the ring, signs with the release
//!   key before anything is pushed, pushes the releases and moves the ring pointers.
//! - `promote` points a ring at an already published version (rollback included).
//! - `verify` pulls a ring pointer and its release (and every channel the release
//!   lists) and verifies them exactly as halod does.
//!
//! The last seq written per pointer is recorded in a state file (`--state-file`,
//! default `$HALO_RELEASE_STATE`, else `$XDG_STATE_HOME/halos/release-state.json`, else
//! `~/.local/state/halos/release-state.json`) so a registry rolled back cannot make a
//! publisher reuse a seq. Progress lines go to stderr; results to stdout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};
use halo_release::build::{Release, build_ring};
use halo_release::oci::{self, Registry, RegistryOptions, auth_from_env_or_docker};
use halo_release::sign::Signer;
use time::OffsetDateTime;

use crate::Failure;
use crate::policy_dir::load_valid;

#[derive(Debug, Subcommand)]
pub enum ReleaseCommand {
    /// Render, check and pack releases into a local directory (no key, no registry).
    Build {
        #[arg(long, value_name = "DIR", env = "HALO_POLICY_DIR")]
        policy_dir: PathBuf,
        /// One ring; every ring when omitted.
        #[arg(long)]
        ring: Option<String>,
        /// Output directory: <ring>[_<experiment>_<variant>].tar and .manifest.json.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Build, sign and push a ring's releases, then move its pointers.
    Publish {
        #[arg(long, value_name = "DIR", env = "HALO_POLICY_DIR")]
        policy_dir: PathBuf,
        #[arg(long)]
        ring: String,
        /// Tagged v<VERSION>; an existing tag is never moved.
        #[arg(long, value_name = "VERSION")]
        release_version: String,
        /// The release signing key (PKCS#8 PEM, from `halo keys generate`).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// As on `promote`: overwrite this ring's pointers signed by KEYID, a key that is
        /// not yours. See docs/runbooks.md, "A foreign pointer".
        #[arg(long, value_name = "KEYID")]
        replace_foreign_pointer: Option<String>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Point a ring at a published version: a new pointer with a higher seq.
    Promote {
        #[arg(long)]
        ring: String,
        #[arg(long, value_name = "VERSION")]
        release_version: String,
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// Overwrite this ring's pointers that are signed by KEYID, a key that is not
        /// yours (the id publish or promote showed when they refused). Only pointers
        /// claiming exactly KEYID are replaced; anything else still refuses. See
        /// docs/runbooks.md, "A foreign pointer", before using it.
        #[arg(long, value_name = "KEYID")]
        replace_foreign_pointer: Option<String>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Pull and verify a ring pointer and its releases as halod would.
    Verify {
        #[arg(long)]
        ring: String,
        /// The org the pointer and release must name.
        #[arg(long)]
        org: String,
        /// Trusted release public key(s) (SPKI PEM); repeat for several.
        #[arg(long = "pubkey", value_name = "FILE", required = true)]
        pubkeys: Vec<PathBuf>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
}

#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// HOST[:PORT]/REPOSITORY. Credentials: HALO_REGISTRY_USERNAME/HALO_REGISTRY_PASSWORD,
    /// else ~/.docker/config.json (or $DOCKER_CONFIG/config.json).
    #[arg(long, value_name = "HOST/REPO", env = "HALO_REGISTRY")]
    registry: String,
    /// Allow plain http to a registry that is not on loopback.
    #[arg(long)]
    insecure: bool,
    /// Where the last written seq per pointer is recorded.
    #[arg(long, value_name = "FILE", env = "HALO_RELEASE_STATE")]
    state_file: Option<PathBuf>,
}

impl RegistryArgs {
    fn connect(&self) -> anyhow::Result<Registry> {
        let host = self.registry.split('/').next().unwrap_or("");
        Ok(Registry::connect(
            &self.registry,
            RegistryOptions {
                insecure: self.insecure,
                auth: auth_from_env_or_docker(host),
            },
        )?)
    }

    fn state_path(&self) -> Option<PathBuf> {
        if let Some(p) = &self.state_file {
            return Some(p.clone());
        }
        let base = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
        Some(base.join("halos/release-state.json"))
    }
}

pub fn run(command: ReleaseCommand) -> Result<(), Failure> {
    match command {
        ReleaseCommand::Build {
            policy_dir,
            ring,
            out,
        } => build(&policy_dir, ring.as_deref(), &out),
        ReleaseCommand::Publish {
            policy_dir,
            ring,
            release_version,
            key,
            replace_foreign_pointer,
            registry,
        } => {
            let org = load_valid(&policy_dir)?;
            let built = build_ring(&org, &ring).map_err(anyhow::Error::new)?;
            let signer = load_signer(&key)?;
            let reg = registry.connect()?;
            let state = registry.state_path();
            let recorded = load_state(state.as_deref(), &reg)?;
            let report = runtime()?.block_on(oci::publish_ring(
                &reg,
                &built,
                &release_version,
                &signer,
                &recorded,
                OffsetDateTime::now_utc(),
                replace_foreign_pointer.as_deref(),
                &progress,
            ));
            finish(report, &reg, state.as_deref(), recorded)
        }
        ReleaseCommand::Promote {
            ring,
            release_version,
            key,
            replace_foreign_pointer,
            registry,
        } => {
            let signer = load_signer(&key)?;
            let reg = registry.connect()?;
            let state = registry.state_path();
            let recorded = load_state(state.as_deref(), &reg)?;
            let report = runtime()?.block_on(oci::promote_ring(
                &reg,
                &ring,
                &release_version,
                &signer,
                &recorded,
                OffsetDateTime::now_utc(),
                replace_foreign_pointer.as_deref(),
                &progress,
            ));
            finish(report, &reg, state.as_deref(), recorded)
        }
        ReleaseCommand::Verify {
            ring,
            org,
            pubkeys,
            registry,
        } => verify(&ring, &org, &pubkeys, &registry),
    }
}

fn progress(line: &str) {
    eprintln!("halo: {line}");
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn load_signer(path: &Path) -> anyhow::Result<Signer> {
    let pem = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the release key {}", path.display()))?;
    let key = halo_policy::keys::signing_key_from_pem(&pem)
        .with_context(|| format!("release key {}", path.display()))?;
    Ok(Signer::new(key))
}

fn load_state(path: Option<&Path>, reg: &Registry) -> anyhow::Result<BTreeMap<String, u64>> {
    let Some(path) = path else {
        return Ok(BTreeMap::new());
    };
    let all = read_state(path)?;
    Ok(all.get(&reg.address()).cloned().unwrap_or_default())
}

type State = BTreeMap<String, BTreeMap<String, u64>>;

fn read_state(path: &Path) -> anyhow::Result<State> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .with_context(|| format!("state file {} is not valid", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::new()),
        Err(e) => Err(anyhow!(e).context(format!("reading {}", path.display()))),
    }
}

fn finish(
    report: Result<oci::PublishReport, oci::OciError>,
    reg: &Registry,
    state: Option<&Path>,
    mut recorded: BTreeMap<String, u64>,
) -> Result<(), Failure> {
    let report = report.map_err(anyhow::Error::new)?;
    for (tag, seq) in &report.pointers {
        recorded.insert(tag.clone(), *seq);
    }
    if let Some(path) = state {
        let mut all = read_state(path)?;
        all.insert(reg.address(), recorded);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let mut bytes = serde_json::to_vec_pretty(&all).map_err(anyhow::Error::new)?;
        bytes.push(b'\n');
        halo_fsutil::write_atomic(path, &bytes, 0o600)
            .map_err(anyhow::Error::new)
            .with_context(|| format!("recording pointer seqs in {}", path.display()))?;
    }
    for (tag, release, manifest, _) in &report.releases {
        println!("release {tag} {release} manifest {manifest}");
    }
    for (tag, seq) in &report.pointers {
        println!("pointer {tag} seq {seq}");
    }
    Ok(())
}

fn build(policy_dir: &Path, ring: Option<&str>, out: &Path) -> Result<(), Failure> {
    let org = load_valid(policy_dir)?;
    let rings: Vec<String> = match ring {
        Some(r) => vec![r.to_string()],
        None => org.rings.keys().cloned().collect(),
    };
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for ring in rings {
        let built = build_ring(&org, &ring).map_err(anyhow::Error::new)?;
        for release in built.channels.iter().chain(std::iter::once(&built.ring)) {
            write_release(out, release)?;
        }
    }
    Ok(())
}

fn write_release(out: &Path, release: &Release) -> anyhow::Result<()> {
    let m = &release.manifest;
    let name = match &m.channel {
        Some(c) => format!("{}_{}_{}", m.ring, c.experiment, c.variant),
        None => m.ring.clone(),
    };
    halo_fsutil::write_atomic(&out.join(format!("{name}.tar")), &release.tar, 0o644)
        .map_err(anyhow::Error::new)?;
    let mut json = serde_json::to_vec_pretty(m)?;
    json.push(b'\n');
    halo_fsutil::write_atomic(&out.join(format!("{name}.manifest.json")), &json, 0o644)
        .map_err(anyhow::Error::new)?;
    println!(
        "{name}\t{}\t{} file(s)\t{} warning(s)",
        release.digest,
        m.files.len(),
        m.warnings.len()
    );
    Ok(())
}

fn verify(
    ring: &str,
    org: &str,
    pubkeys: &[PathBuf],
    registry: &RegistryArgs,
) -> Result<(), Failure> {
    let mut keys = Vec::new();
    for path in pubkeys {
        let pem = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read public key {}", path.display()))?;
        keys.push(
            halo_policy::keys::public_key_from_pem(&pem)
                .with_context(|| format!("public key {}", path.display()))?,
        );
    }
    let reg = registry.connect()?;
    let rt = runtime()?;
    let now = OffsetDateTime::now_utc();
    let ring_release = rt
        .block_on(oci::pull_verified(
            &reg,
            org,
            ring,
            None,
            &keys,
            None,
            now,
            oci::DEFAULT_MAX_RELEASE_BYTES,
        ))
        .map_err(anyhow::Error::new)?;
    let mut channels = Vec::new();
    for exp in &ring_release.manifest.experiments {
        for v in &exp.variants {
            let c = rt
                .block_on(oci::pull_verified(
                    &reg,
                    org,
                    ring,
                    Some(&v.channel),
                    &keys,
                    None,
                    now,
                    oci::DEFAULT_MAX_RELEASE_BYTES,
                ))
                .map_err(anyhow::Error::new)?;
            channels.push(serde_json::json!({
                "channel": v.channel.to_string(),
                "digest": c.pointer.digest,
                "seq": c.pointer.seq,
                "expiresAt": c.pointer.expires_at,
            }));
        }
    }
    let p = &ring_release.pointer;
    let summary = serde_json::json!({
        "org": p.org,
        "ring": p.ring,
        "digest": p.digest,
        "manifest": p.manifest,
        "seq": p.seq,
        "issuedAt": p.issued_at,
        "expiresAt": p.expires_at,
        "files": ring_release.manifest.files.len(),
        "warnings": ring_release.manifest.warnings.len(),
        "channels": channels,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&summary).map_err(anyhow::Error::new)?
    );
    Ok(())
}
