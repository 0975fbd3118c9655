//! `halo wasm publish` and `halo wasm verify`: the filter module as an OCI image in the
//! layouts Istio and Envoy Gateway pull (halo-release's `wasm` module: the wasm variant at
//! TAG, the tar.gz compat variant at TAG-compat), through halo-release's registry client.
//! The printed digests are what `halo istio render --image` pins.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Subcommand;
use halo_release::oci::{Registry, RegistryOptions, auth_from_env_or_docker};
use halo_release::pack::digest;
use halo_release::wasm;

use crate::Failure;

#[derive(Debug, Subcommand)]
pub enum WasmCommand {
    /// Push the filter module as an OCI image (wasm variant and compat variant); print
    /// the digest-pinned references.
    Publish {
        /// HOST[:PORT]/REPOSITORY
        #[arg(long, value_name = "REG/REPO")]
        registry: String,
        /// The built module (halo_filter.wasm).
        #[arg(long, value_name = "PATH")]
        module: PathBuf,
        /// Tag of the wasm variant; the compat variant gets TAG-compat.
        #[arg(long, default_value = "latest")]
        tag: String,
        /// Allow plain http to a registry that is not on loopback.
        #[arg(long)]
        insecure: bool,
    },
    /// Pull an image back by digest, check every digest and that it holds a wasm module
    /// (the same bytes as --module when given).
    Verify {
        /// oci://HOST[:PORT]/REPOSITORY@sha256:DIGEST
        #[arg(long, value_name = "OCI_REF")]
        image: String,
        #[arg(long, value_name = "PATH")]
        module: Option<PathBuf>,
        #[arg(long)]
        insecure: bool,
    },
}

pub fn run(command: WasmCommand) -> Result<(), Failure> {
    match command {
        WasmCommand::Publish {
            registry,
            module,
            tag,
            insecure,
        } => Ok(publish(&registry, &module, &tag, insecure)?),
        WasmCommand::Verify {
            image,
            module,
            insecure,
        } => Ok(verify(&image, module.as_deref(), insecure)?),
    }
}

fn connect(address: &str, insecure: bool) -> anyhow::Result<Registry> {
    let host = address
        .trim_start_matches("oci://")
        .split('/')
        .next()
        .unwrap_or_default();
    Ok(Registry::connect(
        address,
        RegistryOptions {
            insecure,
            auth: auth_from_env_or_docker(host),
        },
    )?)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn publish(address: &str, module_path: &Path, tag: &str, insecure: bool) -> anyhow::Result<()> {
    let module = std::fs::read(module_path)
        .with_context(|| format!("reading the module {}", module_path.display()))?;
    if !wasm::is_wasm(&module) {
        bail!(
            "{} is not a wasm module (no \\0asm magic)",
            module_path.display()
        );
    }
    let registry = connect(address, insecure)?;
    let pushed = runtime()?.block_on(wasm::publish(&registry, &module, tag))?;
    println!("module {}", digest(&module));
    for p in pushed {
        println!("{}\toci://{}@{}", p.tag, registry.address(), p.digest);
    }
    Ok(())
}

fn verify(image: &str, module_path: Option<&Path>, insecure: bool) -> anyhow::Result<()> {
    let pinned = halo_mesh::Image::parse(image).context("--image")?;
    let registry = connect(&pinned.repository, insecure)?;
    let module = runtime()?
        .block_on(wasm::pull(&registry, &format!("sha256:{}", pinned.sha256)))
        .with_context(|| format!("pulling {image}"))?;
    let module_digest = digest(&module);
    if let Some(path) = module_path {
        let local = std::fs::read(path)
            .with_context(|| format!("reading the module {}", path.display()))?;
        if digest(&local) != module_digest {
            bail!(
                "{image} holds module {module_digest}, but {} is {}",
                path.display(),
                digest(&local)
            );
        }
    }
    println!("verified {image}: module {module_digest}");
    Ok(())
}
