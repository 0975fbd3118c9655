//! Pack: the deterministic USTAR tar of a release, and the strict reader halod uses.
//!
//! Entries: `manifest.json` first, then `blobs/<sha256>` in ascending order. Every
//! header is fixed: USTAR, regular file, mode 0644, uid/gid 0, no user or group names,
//! mtime 0 (the epoch). The same manifest and blobs therefore give the same bytes, and
//! the release digest is `sha256:` + hex(sha256(tar)).

use std::collections::BTreeMap;
use std::io::Read;

use sha2::{Digest, Sha256};

use crate::build::{MANIFEST_SCHEMA, ReleaseManifest};

/// The largest manifest.json a reader accepts.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("cannot write the release tar: {0}")]
    Write(std::io::Error),
    #[error("release tar is malformed: {0}")]
    Malformed(String),
}

/// Hex sha256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `sha256:<hex>`.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}

fn header(path: &str, size: usize) -> Result<tar::Header, PackError> {
    let mut h = tar::Header::new_ustar();
    h.set_path(path).map_err(PackError::Write)?;
    h.set_size(size as u64);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_username("").map_err(PackError::Write)?;
    h.set_groupname("").map_err(PackError::Write)?;
    h.set_cksum();
    Ok(h)
}

/// The tar of `manifest` and `blobs` (hex sha256 -> content).
pub fn pack(
    manifest: &ReleaseManifest,
    blobs: &BTreeMap<String, Vec<u8>>,
) -> Result<Vec<u8>, PackError> {
    let mut json =
        serde_json::to_vec_pretty(manifest).map_err(|e| PackError::Malformed(e.to_string()))?;
    json.push(b'\n');
    let mut builder = tar::Builder::new(Vec::new());
    builder.mode(tar::HeaderMode::Deterministic);
    builder
        .append(&header("manifest.json", json.len())?, json.as_slice())
        .map_err(PackError::Write)?;
    for (sha, content) in blobs {
        builder
            .append(
                &header(&format!("blobs/{sha}"), content.len())?,
                content.as_slice(),
            )
            .map_err(PackError::Write)?;
    }
    builder.into_inner().map_err(PackError::Write)
}

/// Read a release tar strictly: `manifest.json` first, decoded strictly; then only
/// regular `blobs/<sha256>` entries whose content hashes to their name; every file the
/// manifest lists present, no blob it does not list.
pub fn unpack(tar_bytes: &[u8]) -> Result<(ReleaseManifest, BTreeMap<String, Vec<u8>>), PackError> {
    let bad = |m: String| PackError::Malformed(m);
    let mut archive = tar::Archive::new(tar_bytes);
    let mut entries = archive.entries().map_err(|e| bad(e.to_string()))?;
    let mut first = entries
        .next()
        .ok_or_else(|| bad("empty archive".into()))?
        .map_err(|e| bad(e.to_string()))?;
    if first.path_bytes().as_ref() != b"manifest.json" {
        return Err(bad("the first entry is not manifest.json".into()));
    }
    if first.header().size().unwrap_or(u64::MAX) > MAX_MANIFEST_BYTES {
        return Err(bad("manifest.json is too large".into()));
    }
    let mut json = Vec::new();
    first
        .read_to_end(&mut json)
        .map_err(|e| bad(e.to_string()))?;
    let manifest: ReleaseManifest =
        serde_json::from_slice(&json).map_err(|e| bad(format!("manifest.json: {e}")))?;
    if manifest.schema != MANIFEST_SCHEMA {
        return Err(bad(format!(
            "manifest.json schema {:?} is not {MANIFEST_SCHEMA}",
            manifest.schema
        )));
    }
    let mut blobs = BTreeMap::new();
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(e.to_string()))?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(bad("an entry is not a regular file".into()));
        }
        let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let Some(sha) = path.strip_prefix("blobs/") else {
            return Err(bad(format!("unexpected entry {path:?}")));
        };
        let mut content = Vec::new();
        entry
            .read_to_end(&mut content)
            .map_err(|e| bad(e.to_string()))?;
        if sha256_hex(&content) != sha {
            return Err(bad(format!("blob {path:?} does not match its digest")));
        }
        blobs.insert(sha.to_string(), content);
    }
    for f in &manifest.files {
        if !blobs.contains_key(&f.sha256) {
            return Err(bad(format!("file {} has no blob", f.path)));
        }
    }
    if blobs
        .keys()
        .any(|k| !manifest.files.iter().any(|f| &f.sha256 == k))
    {
        return Err(bad("a blob is not listed in the manifest".into()));
    }
    Ok((manifest, blobs))
}
