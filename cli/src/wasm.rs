//! `halo wasm publish` and `halo wasm verify`: the filter module as an OCI image in the
//! layouts Istio and Envoy Gateway pull, through halo-release's registry client.
//!
//! Two manifests per publish (Istio's wasm image specification):
//! - the OCI wasm variant (tag TAG): config `application/vnd.module.wasm.config.v1+json`,
//!   one layer `application/vnd.module.wasm.content.layer.v1+wasm` holding the module;
//! - the compat variant (tag TAG-compat): a plain image config and one
//!   `application/vnd.oci.image.layer.v1.tar+gzip` layer whose tar holds `plugin.wasm`,
//!   for pullers that only understand container images.
//!
//! Both are deterministic (fixed config, tar header and gzip header), so publishing the
//! same module twice yields the same digests. The digests are what `halo istio render
//! --image` pins.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use clap::Subcommand;
use halo_release::oci::{
    Descriptor, ImageManifest, MANIFEST_MEDIA_TYPE, Registry, RegistryOptions,
    auth_from_env_or_docker,
};
use halo_release::pack::digest;

use crate::Failure;

pub const WASM_CONFIG_TYPE: &str = "application/vnd.module.wasm.config.v1+json";
pub const WASM_LAYER_TYPE: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
pub const IMAGE_CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub const TAR_GZIP_LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The file name inside the compat layer.
pub const PLUGIN_FILE: &str = "plugin.wasm";
/// The largest module pulled back.
const MAX_MODULE_BYTES: u64 = 64 << 20;

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

fn is_wasm(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\0asm")
}

/// The compat layer: a gzipped tar holding `plugin.wasm` (fixed header fields).
fn compat_layer(module: &[u8]) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_path(PLUGIN_FILE)?;
    h.set_size(module.len() as u64);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    tar.append(&h, module)?;
    let tar = tar.into_inner()?;
    // GzEncoder writes mtime 0 and no file name: the bytes depend on the module only.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar)?;
    Ok((tar.clone(), gz.finish()?))
}

fn manifest(config: Descriptor, layer: Descriptor) -> ImageManifest {
    ImageManifest {
        schema_version: 2,
        media_type: MANIFEST_MEDIA_TYPE.to_string(),
        artifact_type: None,
        config,
        layers: vec![layer],
        annotations: Default::default(),
    }
}

fn publish(address: &str, module_path: &Path, tag: &str, insecure: bool) -> anyhow::Result<()> {
    let module = std::fs::read(module_path)
        .with_context(|| format!("reading the module {}", module_path.display()))?;
    if !is_wasm(&module) {
        bail!(
            "{} is not a wasm module (no \\0asm magic)",
            module_path.display()
        );
    }
    let registry = connect(address, insecure)?;
    let wasm_config = b"{}".to_vec();
    let (tar, gz) = compat_layer(&module)?;
    let image_config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [digest(&tar)]},
    }))
    .context("image config")?;
    let wasm = manifest(
        Descriptor::of(WASM_CONFIG_TYPE, &wasm_config),
        Descriptor::of(WASM_LAYER_TYPE, &module),
    );
    let compat = manifest(
        Descriptor::of(IMAGE_CONFIG_TYPE, &image_config),
        Descriptor::of(TAR_GZIP_LAYER_TYPE, &gz),
    );
    let compat_tag = format!("{tag}-compat");
    let rt = runtime()?;
    let mut out = Vec::new();
    for (tag, m, blobs) in [
        (tag, &wasm, vec![&wasm_config, &module]),
        (compat_tag.as_str(), &compat, vec![&image_config, &gz]),
    ] {
        for b in blobs {
            rt.block_on(registry.push_blob_if_missing(b, &digest(b)))?;
        }
        let bytes = m.to_bytes();
        rt.block_on(registry.push_manifest(tag, &bytes))?;
        out.push((tag.to_string(), digest(&bytes)));
    }
    println!("module sha256:{}", &digest(&module)["sha256:".len()..]);
    for (tag, d) in out {
        println!("{tag}\toci://{}@{d}", registry.address());
    }
    Ok(())
}

fn verify(image: &str, module_path: Option<&Path>, insecure: bool) -> anyhow::Result<()> {
    let pinned = halo_mesh::Image::parse(image).context("--image")?;
    let registry = connect(&pinned.repository, insecure)?;
    let manifest_digest = format!("sha256:{}", pinned.sha256);
    let rt = runtime()?;
    // get_manifest checks the bytes hash to the digest asked for.
    let (bytes, _) = rt
        .block_on(registry.get_manifest(&manifest_digest))?
        .ok_or_else(|| anyhow!("{image} is not in the registry"))?;
    let m: ImageManifest = serde_json::from_slice(&bytes).context("decoding the manifest")?;
    let [layer] = m.layers.as_slice() else {
        bail!("{image}: expected one layer, found {}", m.layers.len());
    };
    // pull_blob checks the layer's digest while reading.
    let blob = rt.block_on(registry.pull_blob(layer, MAX_MODULE_BYTES))?;
    let module = match layer.media_type.as_str() {
        WASM_LAYER_TYPE => blob,
        TAR_GZIP_LAYER_TYPE => {
            let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(blob.as_slice()));
            let mut found = None;
            for entry in archive.entries().context("reading the layer")? {
                let mut entry = entry.context("reading the layer")?;
                if entry
                    .path()
                    .ok()
                    .is_some_and(|p| p == Path::new(PLUGIN_FILE))
                {
                    let mut buf = Vec::new();
                    entry
                        .by_ref()
                        .take(MAX_MODULE_BYTES)
                        .read_to_end(&mut buf)
                        .context("reading plugin.wasm")?;
                    found = Some(buf);
                }
            }
            found.ok_or_else(|| anyhow!("{image}: the layer holds no {PLUGIN_FILE}"))?
        }
        other => bail!("{image}: layer media type {other} is not a wasm image layer"),
    };
    if !is_wasm(&module) {
        bail!("{image}: the layer is not a wasm module");
    }
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
