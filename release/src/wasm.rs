//! The halo filter module as an OCI image (feature `oci`), in the layouts Istio and Envoy
//! Gateway pull (Istio's wasm image specification):
//! - the wasm variant: config `application/vnd.module.wasm.config.v1+json`, one layer
//!   `application/vnd.module.wasm.content.layer.v1+wasm` holding the module;
//! - the compat variant: a plain image config and one
//!   `application/vnd.oci.image.layer.v1.tar+gzip` layer whose tar holds `plugin.wasm`,
//!   for pullers and mirrors that only understand container images.
//!
//! Both are deterministic (fixed config, tar header and gzip header): the same module
//! always has the same digests. Pulling goes by digest only and checks every digest.

use std::io::{Read, Write};

use crate::oci::{Descriptor, ImageManifest, MANIFEST_MEDIA_TYPE, OciError, Registry};
use crate::pack::digest;

pub const WASM_CONFIG_TYPE: &str = "application/vnd.module.wasm.config.v1+json";
pub const WASM_LAYER_TYPE: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
pub const IMAGE_CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub const TAR_GZIP_LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The file name inside the compat layer.
pub const PLUGIN_FILE: &str = "plugin.wasm";
/// The largest module pulled back.
pub const MAX_MODULE_BYTES: u64 = 64 << 20;

fn err(m: impl Into<String>) -> OciError {
    OciError::Verify(m.into())
}

/// Whether `bytes` start with the wasm magic.
pub fn is_wasm(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\0asm")
}

/// One pushed image: its tag and manifest digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedImage {
    pub tag: String,
    pub digest: String,
}

/// The compat layer: (the tar, its gzip).
fn compat_layer(module: &[u8]) -> Result<(Vec<u8>, Vec<u8>), std::io::Error> {
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
    let gz = gz.finish()?;
    Ok((tar, gz))
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

/// Push `module` as the wasm variant (tag `tag`) and the compat variant (`tag-compat`).
pub async fn publish(
    registry: &Registry,
    module: &[u8],
    tag: &str,
) -> Result<Vec<PushedImage>, OciError> {
    if !is_wasm(module) {
        return Err(err("the module is not a wasm module (no \\0asm magic)"));
    }
    let wasm_config = b"{}".to_vec();
    let (tar, gz) = compat_layer(module).map_err(|e| err(format!("building the layer: {e}")))?;
    let image_config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [digest(&tar)]},
    }))
    .map_err(|e| err(e.to_string()))?;
    let wasm = manifest(
        Descriptor::of(WASM_CONFIG_TYPE, &wasm_config),
        Descriptor::of(WASM_LAYER_TYPE, module),
    );
    let compat = manifest(
        Descriptor::of(IMAGE_CONFIG_TYPE, &image_config),
        Descriptor::of(TAR_GZIP_LAYER_TYPE, &gz),
    );
    let compat_tag = format!("{tag}-compat");
    let mut out = Vec::new();
    for (tag, m, blobs) in [
        (tag, &wasm, [&wasm_config[..], module]),
        (compat_tag.as_str(), &compat, [&image_config[..], &gz[..]]),
    ] {
        for b in blobs {
            registry.push_blob_if_missing(b, &digest(b)).await?;
        }
        let bytes = m.to_bytes();
        registry.push_manifest(tag, &bytes).await?;
        out.push(PushedImage {
            tag: tag.to_string(),
            digest: digest(&bytes),
        });
    }
    Ok(out)
}

/// Pull the module of the image with manifest digest `manifest_digest` (`sha256:...`),
/// either variant; every digest is checked, and the result is a wasm module.
pub async fn pull(registry: &Registry, manifest_digest: &str) -> Result<Vec<u8>, OciError> {
    if !manifest_digest.starts_with("sha256:") {
        return Err(err(format!("{manifest_digest} is not a sha256 digest")));
    }
    // get_manifest checks the bytes hash to the digest asked for.
    let (bytes, _) = registry
        .get_manifest(manifest_digest)
        .await?
        .ok_or_else(|| OciError::NotFound(format!("{}@{manifest_digest}", registry.address())))?;
    let m: ImageManifest = serde_json::from_slice(&bytes)
        .map_err(|e| err(format!("manifest {manifest_digest}: {e}")))?;
    let [layer] = m.layers.as_slice() else {
        return Err(err(format!(
            "manifest {manifest_digest}: expected one layer, found {}",
            m.layers.len()
        )));
    };
    // pull_blob checks the layer's digest while reading.
    let blob = registry.pull_blob(layer, MAX_MODULE_BYTES).await?;
    let module = match layer.media_type.as_str() {
        WASM_LAYER_TYPE => blob,
        TAR_GZIP_LAYER_TYPE => plugin_from_layer(&blob)?,
        other => {
            return Err(err(format!(
                "layer media type {other} is not a wasm image layer"
            )));
        }
    };
    if !is_wasm(&module) {
        return Err(err(format!(
            "{manifest_digest}: the layer is not a wasm module"
        )));
    }
    Ok(module)
}

fn plugin_from_layer(blob: &[u8]) -> Result<Vec<u8>, OciError> {
    let read_err = |e: std::io::Error| err(format!("reading the layer: {e}"));
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(blob));
    for entry in archive.entries().map_err(read_err)? {
        let mut entry = entry.map_err(read_err)?;
        let is_plugin = entry
            .path()
            .ok()
            .is_some_and(|p| p == std::path::Path::new(PLUGIN_FILE));
        if is_plugin {
            let mut buf = Vec::new();
            entry
                .by_ref()
                .take(MAX_MODULE_BYTES)
                .read_to_end(&mut buf)
                .map_err(read_err)?;
            return Ok(buf);
        }
    }
    Err(err(format!("the layer holds no {PLUGIN_FILE}")))
}
