//! BuildRing: the releases one ring publishes, rendered, checked and packed.
//!
//! A ring publishes one release per variant of every running client-axis experiment
//! that enrolls it (its *channels*, each rendering the variant's profile), then the
//! ring release itself (rendering the ring's profile), whose manifest lists those
//! experiments with salt, weights and channels so halod can pick a device's variant
//! with the gateway's hash. Client toggles travel in every manifest; halod evaluates
//! them on the device. Nothing here reads a clock or the network: the same policy gives
//! byte-identical releases, hence the same digests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use halo_policy::profile::{ResolveError, resolve};
use halo_policy::{Axis, ExperimentStatus, Harness, Org, Toggle};

use crate::adapters::{self, Context, Os, RenderedFile};
use crate::check::{CheckError, check_rendered};
use crate::names::Channel;
use crate::pack::{self, PackError};

/// The manifest's schema marker.
pub const MANIFEST_SCHEMA: &str = "halos.release.v1";

/// `manifest.json`, the first entry of a release tar.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReleaseManifest {
    pub schema: String,
    pub org: String,
    pub ring: String,
    /// Set on a channel (variant) release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<Channel>,
    /// The effective profile rendered.
    pub profile: String,
    /// Harness version pins and default models.
    pub harnesses: BTreeMap<Harness, HarnessPin>,
    /// Every rendered file, by (os, path).
    pub files: Vec<FileEntry>,
    /// Ring release only: the client-axis experiments enrolling this ring.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub experiments: Vec<ExperimentEntry>,
    /// Client-axis toggles, evaluated by halod against ring, subject and groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub toggles: Vec<Toggle>,
    /// What adapters could not express.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HarnessPin {
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// One file a release installs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileEntry {
    pub harness: Harness,
    pub os: Os,
    pub path: String,
    pub mode: u32,
    /// Hex sha256 of the content; the blob is `blobs/<sha256>` in the tar.
    pub sha256: String,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExperimentEntry {
    pub name: String,
    pub salt: String,
    pub variants: Vec<VariantEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VariantEntry {
    pub name: String,
    pub weight: u32,
    /// The channel whose pointer and release a device in this variant follows.
    pub channel: Channel,
}

/// A built release: its manifest, its blobs, the packed tar and its digest.
#[derive(Debug, Clone, PartialEq)]
pub struct Release {
    pub manifest: ReleaseManifest,
    /// Hex sha256 -> content.
    pub blobs: BTreeMap<String, Vec<u8>>,
    /// The deterministic tar.
    pub tar: Vec<u8>,
    /// `sha256:<hex>` of `tar`.
    pub digest: String,
}

impl Release {
    /// Content of the file at `path` for `os`.
    pub fn file(&self, os: Os, path: &str) -> Option<&[u8]> {
        let entry = self
            .manifest
            .files
            .iter()
            .find(|f| f.os == os && f.path == path)?;
        self.blobs.get(&entry.sha256).map(Vec::as_slice)
    }
}

/// What a ring publishes: channels first, then the ring release.
#[derive(Debug, Clone, PartialEq)]
pub struct RingBuild {
    pub channels: Vec<Release>,
    pub ring: Release,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("ring {0:?} does not exist in the policy")]
    UnknownRing(String),
    #[error("ring {ring:?}: {source}")]
    Profile { ring: String, source: ResolveError },
    #[error("CheckRendered refused ring {ring:?}{channel}: {source}")]
    Check {
        ring: String,
        channel: String,
        source: Box<CheckError>,
    },
    #[error(transparent)]
    Pack(#[from] PackError),
}

/// Build every release of `ring`.
pub fn build_ring(org: &Org, ring_name: &str) -> Result<RingBuild, BuildError> {
    let ring = org
        .rings
        .get(ring_name)
        .ok_or_else(|| BuildError::UnknownRing(ring_name.to_string()))?;
    let toggles: Vec<Toggle> = org
        .toggles
        .values()
        .filter(|t| t.axis == Axis::Client)
        .cloned()
        .collect();
    let mut channels = Vec::new();
    let mut experiments = Vec::new();
    for exp in org.experiments.values() {
        // Enrollment as served (a rollout driving the experiment sets it), the same as the
        // gateway's snapshot.
        let (rings, weights) = halo_policy::compile::enrollment(org, exp);
        if exp.axis != Axis::Client
            || exp.status != ExperimentStatus::Running
            || !rings.iter().any(|r| r == ring_name)
        {
            continue;
        }
        let mut variants = Vec::new();
        for (v, weight) in exp.variants.iter().zip(weights) {
            let channel = Channel {
                experiment: exp.name.clone(),
                variant: v.name.clone(),
            };
            let (profile, extra) = match &v.profile {
                Some(p) => (p.as_str(), None),
                None => (
                    ring.profile.as_str(),
                    Some(format!(
                        "experiment {:?} variant {:?} names no profile: the ring's profile {:?} is rendered",
                        exp.name, v.name, ring.profile
                    )),
                ),
            };
            let mut release = build_one(
                org,
                ring_name,
                profile,
                Some(channel.clone()),
                Vec::new(),
                toggles.clone(),
            )?;
            if let Some(w) = extra {
                release.manifest.warnings.push(w);
                release = repack(release)?;
            }
            channels.push(release);
            variants.push(VariantEntry {
                name: v.name.clone(),
                weight,
                channel,
            });
        }
        experiments.push(ExperimentEntry {
            name: exp.name.clone(),
            salt: exp.salt.clone(),
            variants,
        });
    }
    let ring_release = build_one(org, ring_name, &ring.profile, None, experiments, toggles)?;
    Ok(RingBuild {
        channels,
        ring: ring_release,
    })
}

fn build_one(
    org: &Org,
    ring: &str,
    profile_name: &str,
    channel: Option<Channel>,
    experiments: Vec<ExperimentEntry>,
    toggles: Vec<Toggle>,
) -> Result<Release, BuildError> {
    let profile = resolve(org, profile_name).map_err(|source| BuildError::Profile {
        ring: ring.to_string(),
        source,
    })?;
    let ctx = Context {
        gateway: &org.gateway,
        profile: &profile,
    };
    let mut files: Vec<RenderedFile> = Vec::new();
    let mut warnings = Vec::new();
    for harness in profile.harnesses.keys() {
        for os in Os::ALL {
            let rendered = adapters::render(*harness, &ctx, os);
            for file in &rendered.files {
                check_rendered(file).map_err(|source| BuildError::Check {
                    source: Box::new(source),
                    ring: ring.to_string(),
                    channel: channel
                        .as_ref()
                        .map_or(String::new(), |c| format!(" channel {c}")),
                })?;
            }
            files.extend(rendered.files);
            warnings.extend(rendered.warnings);
        }
    }
    files.sort_by(|a, b| (a.os, &a.path).cmp(&(b.os, &b.path)));
    let mut blobs = BTreeMap::new();
    let entries = files
        .into_iter()
        .map(|f| {
            let sha = pack::sha256_hex(&f.content);
            let entry = FileEntry {
                harness: f.harness,
                os: f.os,
                path: f.path,
                mode: f.mode,
                sha256: sha.clone(),
                size: f.content.len() as u64,
            };
            blobs.insert(sha, f.content);
            entry
        })
        .collect();
    let manifest = ReleaseManifest {
        schema: MANIFEST_SCHEMA.to_string(),
        org: org.root.org.clone(),
        ring: ring.to_string(),
        channel,
        profile: profile_name.to_string(),
        harnesses: profile
            .harnesses
            .iter()
            .map(|(h, s)| {
                (
                    *h,
                    HarnessPin {
                        version: s.version.clone(),
                        model: s.model.clone(),
                    },
                )
            })
            .collect(),
        files: entries,
        experiments,
        toggles,
        warnings,
    };
    repack(Release {
        manifest,
        blobs,
        tar: Vec::new(),
        digest: String::new(),
    })
}

/// Pack (again) after the manifest changed.
fn repack(mut release: Release) -> Result<Release, BuildError> {
    release.tar = pack::pack(&release.manifest, &release.blobs)?;
    release.digest = pack::digest(&release.tar);
    Ok(release)
}
