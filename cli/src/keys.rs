//! `halo keys`: ed25519 key pairs for release signing and the kill list.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Subcommand;
use halo_policy::keys;

use crate::Failure;
use halo_fsutil::create_new;

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Generate an ed25519 key pair: NAME.key (PKCS#8 PEM, mode 0600) and NAME.pub
    /// (SPKI PEM). Refuses to overwrite either file.
    Generate {
        /// Key name, for example release or killswitch. Use a separate key per purpose.
        #[arg(long)]
        name: String,
        /// Directory to write into (created if missing).
        #[arg(long, value_name = "DIR", default_value = ".")]
        out_dir: PathBuf,
    },
}

pub fn run(command: KeysCommand) -> Result<(), Failure> {
    match command {
        KeysCommand::Generate { name, out_dir } => Ok(generate(&name, &out_dir)?),
    }
}

fn generate(name: &str, out_dir: &Path) -> anyhow::Result<()> {
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        bail!("key name {name:?} must be letters, digits, '-' or '_'");
    }
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let private_path = out_dir.join(format!("{name}.key"));
    let public_path = out_dir.join(format!("{name}.pub"));
    for path in [&private_path, &public_path] {
        if path.exists() {
            bail!("{} exists; refusing to overwrite a key", path.display());
        }
    }
    let pair = keys::generate().context("generating an ed25519 key pair")?;
    // The private key is created 0600 from the start, never chmod-ed after the write.
    write_new(&private_path, pair.private_pem.as_bytes(), 0o600)?;
    if let Err(err) = write_new(&public_path, pair.public_pem.as_bytes(), 0o644) {
        let _ = std::fs::remove_file(&private_path);
        return Err(err);
    }
    println!("wrote {} (private, 0600)", private_path.display());
    let id = keys::public_key_from_pem(&pair.public_pem)
        .map(|k| keys::key_id(&k))
        .context("reading back the public key")?;
    println!("wrote {} (public, key id {id})", public_path.display());
    Ok(())
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let mut file = create_new(path, mode)?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}
