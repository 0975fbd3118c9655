//! The registry side (feature `oci`): publish, promote, and pull + verify, against a
//! real OCI registry through oci-client.
//!
//! Artifacts, all OCI image manifests in one repository (tags in [`crate::names`]):
//! - a release: config `application/vnd.halos.release.config.v1+json` (org, ring,
//!   channel, version, release digest), one layer `application/vnd.halos.release.v1.tar`
//!   (the release tar; its digest is the release digest), and the ed25519 signature
//!   over [`crate::sign::release_statement`] in the annotation
//!   `dev.halos.signature.ed25519` (key id in `dev.halos.keyid`);
//! - a pointer: the empty config, one layer `application/vnd.halos.pointer.v1+json`
//!   (the [`Pointer`] JSON) and its signature in the same annotations.
//!
//! Publishing signs everything before anything is pushed, checks every tag (a tag that
//! names another manifest is never moved) and runs every pointer preflight (the current
//! pointer must verify with the publishing key and belong to the same org and ring)
//! before any pointer moves; then it pushes releases channels first, then moves
//! pointers channels first, the ring last, each with its informational tag.
//!
//! Pulling is halod's steps 3-4: the pointer by tag (type, size, signature, org, ring,
//! seq, expiry), then the release manifest by the digest the pointer names (never a
//! tag), its signature over the layer digest checked before the layer is downloaded,
//! the layer size capped and its digest checked while reading, and the release's org
//! and ring matched against the pointer.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::build::{Release, ReleaseManifest, RingBuild};
use crate::names::{Channel, TagError, info_tag, pointer_tag, release_tag};
use crate::pack::{self, PackError, digest};
use crate::pointer::{
    Applied, MAX_POINTER_BYTES, Pointer, PointerError, check_pointer, new_pointer, next_seq,
};
use crate::sign::{Signer, pointer_statement, release_statement, verify_any};

pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const RELEASE_ARTIFACT_TYPE: &str = "application/vnd.halos.release.v1";
pub const RELEASE_CONFIG_TYPE: &str = "application/vnd.halos.release.config.v1+json";
pub const RELEASE_LAYER_TYPE: &str = "application/vnd.halos.release.v1.tar";
pub const POINTER_TYPE: &str = "application/vnd.halos.pointer.v1+json";
pub const EMPTY_TYPE: &str = "application/vnd.oci.empty.v1+json";
pub const EMPTY_BLOB: &[u8] = b"{}";
pub const ANN_SIGNATURE: &str = "dev.halos.signature.ed25519";
pub const ANN_KEYID: &str = "dev.halos.keyid";
pub const ANN_VERSION: &str = "org.opencontainers.image.version";
/// Default cap on a release layer (halod's default).
pub const DEFAULT_MAX_RELEASE_BYTES: u64 = 256 << 20;
/// The largest manifest read.
const MAX_MANIFEST_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error(
        "registry address {0:?} is not HOST[:PORT]/REPOSITORY (for example 127.0.0.1:5000/acme/halos)"
    )]
    Address(String),
    #[error("cannot reach registry {registry}: {message}")]
    Unreachable { registry: String, message: String },
    #[error("registry {registry}: {message}")]
    Registry { registry: String, message: String },
    #[error(
        "tag {tag} already names manifest {existing} (this release would be {new}); moving a tag is an error: publish a new --release-version"
    )]
    TagExists {
        tag: String,
        existing: String,
        new: String,
    },
    #[error("{0} is not in the registry")]
    NotFound(String),
    #[error("verification failed: {0}")]
    Verify(String),
    /// The current pointer at `tag` does not verify with the publishing key. `key_id` is
    /// the key id its manifest claims (unverified; `unsigned` without a signature).
    #[error(
        "verification failed: the current {tag} is signed by key {key_id}, not by the publishing key {own_key_id} (wrong --key? or a pointer written by someone else: {detail}); no pointer was moved. If you publish with {own_key_id} and {key_id} is not one of your keys, follow the runbook (docs/runbooks.md, \"A foreign pointer\"): `halo release promote --ring {ring} --release-version <last good version> --key <your key> --replace-foreign-pointer {key_id}`"
    )]
    ForeignPointer {
        tag: String,
        ring: String,
        key_id: String,
        own_key_id: String,
        detail: String,
    },
    #[error(transparent)]
    Tag(#[from] TagError),
    #[error(transparent)]
    Pointer(#[from] PointerError),
    #[error(transparent)]
    Pack(#[from] PackError),
}

fn verify_err(m: impl Into<String>) -> OciError {
    OciError::Verify(m.into())
}

/// An OCI descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
}

impl Descriptor {
    pub fn of(media_type: &str, bytes: &[u8]) -> Descriptor {
        Descriptor {
            media_type: media_type.to_string(),
            digest: digest(bytes),
            size: bytes.len() as u64,
        }
    }
}

/// An OCI image manifest as Halos writes it. Fields in a fixed order, so the bytes (and
/// the manifest digest) are deterministic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: u32,
    pub media_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl ImageManifest {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    fn signature(&self) -> Option<&str> {
        self.annotations.get(ANN_SIGNATURE).map(String::as_str)
    }

    /// The key id the manifest claims to be signed by (not verified).
    fn claimed_key_id(&self) -> Option<&str> {
        self.annotations.get(ANN_KEYID).map(String::as_str)
    }
}

/// The config blob of a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReleaseConfig {
    pub org: String,
    pub ring: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<Channel>,
    pub version: String,
    pub release_digest: String,
}

/// A release made ready to push: signed, its config and manifest bytes known.
#[derive(Debug, Clone)]
pub struct PreparedRelease {
    pub tag: String,
    pub ring: String,
    pub channel: Option<Channel>,
    pub org: String,
    pub release_digest: String,
    pub tar: Vec<u8>,
    pub config: Vec<u8>,
    pub manifest: Vec<u8>,
    pub manifest_digest: String,
}

/// Sign `release` and build its OCI manifest. No I/O.
pub fn prepare_release(
    release: &Release,
    version: &str,
    signer: &Signer,
) -> Result<PreparedRelease, OciError> {
    let m = &release.manifest;
    let tag = release_tag(version, &m.ring, m.channel.as_ref())?;
    let config = serde_json::to_vec(&ReleaseConfig {
        org: m.org.clone(),
        ring: m.ring.clone(),
        channel: m.channel.clone(),
        version: version.to_string(),
        release_digest: release.digest.clone(),
    })
    .unwrap_or_default();
    let mut annotations = BTreeMap::new();
    annotations.insert(
        ANN_SIGNATURE.to_string(),
        signer.sign(&release_statement(&release.digest)),
    );
    annotations.insert(ANN_KEYID.to_string(), signer.key_id());
    annotations.insert(ANN_VERSION.to_string(), version.to_string());
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: MANIFEST_MEDIA_TYPE.to_string(),
        artifact_type: Some(RELEASE_ARTIFACT_TYPE.to_string()),
        config: Descriptor::of(RELEASE_CONFIG_TYPE, &config),
        layers: vec![Descriptor::of(RELEASE_LAYER_TYPE, &release.tar)],
        annotations,
    }
    .to_bytes();
    Ok(PreparedRelease {
        tag,
        ring: m.ring.clone(),
        channel: m.channel.clone(),
        org: m.org.clone(),
        release_digest: release.digest.clone(),
        tar: release.tar.clone(),
        config,
        manifest_digest: digest(&manifest),
        manifest,
    })
}

/// A signed pointer artifact made ready to push.
#[derive(Debug, Clone)]
pub struct PreparedPointer {
    pub tag: String,
    pub pointer: Pointer,
    pub payload: Vec<u8>,
    pub manifest: Vec<u8>,
}

/// Sign `pointer` and build its OCI manifest. No I/O.
pub fn prepare_pointer(pointer: Pointer, signer: &Signer) -> Result<PreparedPointer, OciError> {
    let tag = pointer_tag(&pointer.ring, pointer.channel.as_ref())?;
    let payload = pointer.to_bytes();
    let mut annotations = BTreeMap::new();
    annotations.insert(
        ANN_SIGNATURE.to_string(),
        signer.sign(&pointer_statement(&payload)),
    );
    annotations.insert(ANN_KEYID.to_string(), signer.key_id());
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: MANIFEST_MEDIA_TYPE.to_string(),
        artifact_type: Some(POINTER_TYPE.to_string()),
        config: Descriptor::of(EMPTY_TYPE, EMPTY_BLOB),
        layers: vec![Descriptor::of(POINTER_TYPE, &payload)],
        annotations,
    }
    .to_bytes();
    Ok(PreparedPointer {
        tag,
        pointer,
        payload,
        manifest,
    })
}

/// How to reach a registry.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Allow plain http to a host that is not loopback.
    pub insecure: bool,
    pub auth: RegistryAuth,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            insecure: false,
            auth: RegistryAuth::Anonymous,
        }
    }
}

/// Whether `registry` (`host[:port]`) is a loopback host.
pub fn is_loopback(registry: &str) -> bool {
    let host = if let Some(rest) = registry.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        registry.rsplit_once(':').map_or(registry, |(h, _)| h)
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Registry credentials: `HALO_REGISTRY_USERNAME` and `HALO_REGISTRY_PASSWORD`, else
/// the `auths` entry for `registry` in the docker config (`$DOCKER_CONFIG/config.json`,
/// else `~/.docker/config.json`), else anonymous. Credential helpers (`credsStore`,
/// `credHelpers`) are not run.
pub fn auth_from_env_or_docker(registry: &str) -> RegistryAuth {
    if let (Ok(user), Ok(pass)) = (
        std::env::var("HALO_REGISTRY_USERNAME"),
        std::env::var("HALO_REGISTRY_PASSWORD"),
    ) {
        return RegistryAuth::Basic(user, pass);
    }
    let path = match std::env::var_os("DOCKER_CONFIG") {
        Some(dir) => std::path::PathBuf::from(dir).join("config.json"),
        None => match std::env::var_os("HOME") {
            Some(home) => std::path::PathBuf::from(home).join(".docker/config.json"),
            None => return RegistryAuth::Anonymous,
        },
    };
    let Ok(text) = std::fs::read_to_string(path) else {
        return RegistryAuth::Anonymous;
    };
    docker_config_auth(&text, registry).unwrap_or(RegistryAuth::Anonymous)
}

/// The credentials for `registry` in a docker config file's text.
pub fn docker_config_auth(text: &str, registry: &str) -> Option<RegistryAuth> {
    use base64::Engine as _;
    let config: serde_json::Value = serde_json::from_str(text).ok()?;
    let auths = config.get("auths")?.as_object()?;
    let entry = auths.iter().find_map(|(key, value)| {
        let host = key
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or("");
        (host == registry).then_some(value)
    })?;
    if let Some(auth) = entry.get("auth").and_then(|a| a.as_str()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .ok()?;
        let decoded = String::from_utf8(decoded).ok()?;
        let (user, pass) = decoded.split_once(':')?;
        return Some(RegistryAuth::Basic(user.to_string(), pass.to_string()));
    }
    if let Some(token) = entry.get("identitytoken").and_then(|t| t.as_str()) {
        return Some(RegistryAuth::Bearer(token.to_string()));
    }
    match (
        entry.get("username").and_then(|u| u.as_str()),
        entry.get("password").and_then(|p| p.as_str()),
    ) {
        (Some(u), Some(p)) => Some(RegistryAuth::Basic(u.to_string(), p.to_string())),
        _ => None,
    }
}

/// One repository in one registry.
pub struct Registry {
    client: Client,
    registry: String,
    repository: String,
    auth: RegistryAuth,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registry({}/{})", self.registry, self.repository)
    }
}

impl Registry {
    /// A client for `address` (`host[:port]/repository`). No network I/O yet. Plain http
    /// is used for loopback hosts, or any host with `options.insecure`; https otherwise.
    pub fn connect(address: &str, options: RegistryOptions) -> Result<Registry, OciError> {
        let address = address
            .trim()
            .trim_start_matches("oci://")
            .trim_end_matches('/');
        let (registry, repository) = address
            .split_once('/')
            .filter(|(r, repo)| !r.is_empty() && !repo.is_empty())
            .ok_or_else(|| OciError::Address(address.to_string()))?;
        let repo_ok = repository.bytes().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'/' | b'.' | b'_' | b'-')
        });
        if !repo_ok {
            return Err(OciError::Address(address.to_string()));
        }
        // reqwest is built without a default TLS provider; install ring's once.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let protocol = if options.insecure {
            ClientProtocol::Http
        } else if is_loopback(registry) {
            ClientProtocol::HttpsExcept(vec![registry.to_string()])
        } else {
            ClientProtocol::Https
        };
        let client = Client::new(ClientConfig {
            protocol,
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(60)),
            use_monolithic_push: true,
            ..ClientConfig::default()
        });
        Ok(Registry {
            client,
            registry: registry.to_string(),
            repository: repository.to_string(),
            auth: options.auth,
        })
    }

    /// `host[:port]/repository`.
    pub fn address(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    fn reference(&self, tag_or_digest: &str) -> Reference {
        if tag_or_digest.starts_with("sha256:") {
            Reference::with_digest(
                self.registry.clone(),
                self.repository.clone(),
                tag_or_digest.to_string(),
            )
        } else {
            Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                tag_or_digest.to_string(),
            )
        }
    }

    fn map(&self, e: OciDistributionError) -> OciError {
        match e {
            OciDistributionError::RequestError(err) => {
                let mut message = err.to_string();
                let mut source = std::error::Error::source(&err);
                while let Some(s) = source {
                    message.push_str(": ");
                    message.push_str(&s.to_string());
                    source = s.source();
                }
                OciError::Unreachable {
                    registry: self.registry.clone(),
                    message,
                }
            }
            other => OciError::Registry {
                registry: self.registry.clone(),
                message: other.to_string(),
            },
        }
    }

    /// The manifest at a tag or digest, with its digest; `None` if there is none.
    pub async fn get_manifest(
        &self,
        tag_or_digest: &str,
    ) -> Result<Option<(Vec<u8>, String)>, OciError> {
        let reference = self.reference(tag_or_digest);
        match self
            .client
            .pull_manifest_raw(&reference, &self.auth, &[MANIFEST_MEDIA_TYPE])
            .await
        {
            Ok((bytes, _)) => {
                if bytes.len() > MAX_MANIFEST_BYTES {
                    return Err(verify_err(format!(
                        "manifest {tag_or_digest} is larger than {MAX_MANIFEST_BYTES} bytes"
                    )));
                }
                // The digest is computed here, not taken from the registry's header.
                let d = digest(&bytes);
                if tag_or_digest.starts_with("sha256:") && d != tag_or_digest {
                    return Err(verify_err(format!(
                        "manifest fetched by digest {tag_or_digest} hashes to {d}"
                    )));
                }
                Ok(Some((bytes.to_vec(), d)))
            }
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.map(e)),
        }
    }

    /// Push `data` as a blob unless the registry has it. Returns whether it was pushed.
    pub async fn push_blob_if_missing(
        &self,
        data: &[u8],
        blob_digest: &str,
    ) -> Result<bool, OciError> {
        let reference = self.reference("latest");
        let exists = self
            .client
            .blob_exists(&reference, blob_digest)
            .await
            .or_else(|e| {
                if is_not_found(&e) {
                    Ok(false)
                } else {
                    Err(self.map(e))
                }
            })?;
        if exists {
            return Ok(false);
        }
        self.client
            .push_blob(&reference, data.to_vec(), blob_digest)
            .await
            .map_err(|e| self.map(e))?;
        Ok(true)
    }

    /// Push manifest bytes under a tag (or by digest).
    pub async fn push_manifest(
        &self,
        tag_or_digest: &str,
        manifest: &[u8],
    ) -> Result<(), OciError> {
        let reference = self.reference(tag_or_digest);
        self.client
            .push_manifest_raw(
                &reference,
                manifest.to_vec(),
                MANIFEST_MEDIA_TYPE
                    .parse()
                    .map_err(|_| verify_err("media type"))?,
            )
            .await
            .map_err(|e| self.map(e))?;
        Ok(())
    }

    /// Download a blob, at most `cap` bytes; the digest is checked while reading.
    pub async fn pull_blob(&self, desc: &Descriptor, cap: u64) -> Result<Vec<u8>, OciError> {
        if desc.size > cap {
            return Err(verify_err(format!(
                "blob {} declares {} bytes, over the {cap}-byte cap",
                desc.digest, desc.size
            )));
        }
        let reference = self.reference("latest");
        let mut out = CappedVec {
            buf: Vec::new(),
            cap,
        };
        let oci_desc = oci_client::manifest::OciDescriptor {
            media_type: desc.media_type.clone(),
            digest: desc.digest.clone(),
            size: i64::try_from(desc.size).unwrap_or(i64::MAX),
            ..Default::default()
        };
        self.client
            .pull_blob(&reference, &oci_desc, &mut out)
            .await
            .map_err(|e| self.map(e))?;
        if digest(&out.buf) != desc.digest {
            return Err(verify_err(format!(
                "blob {} does not match its digest",
                desc.digest
            )));
        }
        Ok(out.buf)
    }
}

fn is_not_found(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::ImageManifestNotFoundError(_) => true,
        OciDistributionError::ServerError { code, .. } => *code == 404,
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::ManifestUnknown
                    | OciErrorCode::NotFound
                    | OciErrorCode::BlobUnknown
                    | OciErrorCode::NameUnknown
            )
        }),
        _ => false,
    }
}

/// An in-memory writer that fails past `cap` bytes.
struct CappedVec {
    buf: Vec<u8>,
    cap: u64,
}

impl tokio::io::AsyncWrite for CappedVec {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut TaskContext<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if (self.buf.len() + data.len()) as u64 > self.cap {
            return Poll::Ready(Err(std::io::Error::other(
                "blob is larger than the size cap",
            )));
        }
        self.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Progress lines while pushing (the CLI prints them to stderr).
pub type Progress<'a> = &'a (dyn Fn(&str) + Sync);

fn human(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1 << 20) as f64)
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}

fn short(d: &str) -> &str {
    &d[..d.len().min(19)]
}

/// What a publish or promote did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PublishReport {
    /// (tag, release digest, manifest digest, whether it was pushed now).
    pub releases: Vec<(String, String, String, bool)>,
    /// Pointers moved, in order: (pointer tag, seq).
    pub pointers: Vec<(String, u64)>,
}

/// One pointer to move.
#[derive(Debug, Clone)]
struct PointerTarget {
    org: String,
    ring: String,
    channel: Option<Channel>,
    release_digest: String,
    manifest_digest: String,
    manifest: Vec<u8>,
}

/// Publish a ring: every channel release, then the ring release; then the pointers.
/// `recorded` holds the last seq this publisher wrote per pointer tag;
/// `replace_foreign` is as in [`promote_ring`].
#[allow(clippy::too_many_arguments)]
pub async fn publish_ring(
    reg: &Registry,
    build: &RingBuild,
    version: &str,
    signer: &Signer,
    recorded: &BTreeMap<String, u64>,
    now: OffsetDateTime,
    replace_foreign: Option<&str>,
    progress: Progress<'_>,
) -> Result<PublishReport, OciError> {
    refuse_own_key_id(signer, replace_foreign)?;
    // Sign everything before anything is pushed.
    let mut prepared = Vec::new();
    for release in build.channels.iter().chain(std::iter::once(&build.ring)) {
        prepared.push(prepare_release(release, version, signer)?);
    }
    // Tags: none may name another manifest.
    let mut exists = Vec::new();
    for p in &prepared {
        match reg.get_manifest(&p.tag).await? {
            Some((_, existing)) if existing != p.manifest_digest => {
                return Err(OciError::TagExists {
                    tag: p.tag.clone(),
                    existing,
                    new: p.manifest_digest.clone(),
                });
            }
            found => exists.push(found.is_some()),
        }
    }
    let targets: Vec<PointerTarget> = prepared
        .iter()
        .map(|p| PointerTarget {
            org: p.org.clone(),
            ring: p.ring.clone(),
            channel: p.channel.clone(),
            release_digest: p.release_digest.clone(),
            manifest_digest: p.manifest_digest.clone(),
            manifest: p.manifest.clone(),
        })
        .collect();
    let pointers = preflight_pointers(
        reg,
        &targets,
        signer,
        recorded,
        now,
        replace_foreign,
        progress,
    )
    .await?;
    let mut report = PublishReport::default();
    let total = prepared.len();
    for (i, (p, already)) in prepared.iter().zip(exists).enumerate() {
        let n = i + 1;
        if already {
            progress(&format!(
                "[{n}/{total}] {} already published as {}",
                p.tag,
                short(&p.manifest_digest)
            ));
        } else {
            for (what, bytes) in [("config", &p.config), ("layer", &p.tar)] {
                let d = digest(bytes);
                let pushed = reg.push_blob_if_missing(bytes, &d).await?;
                progress(&format!(
                    "[{n}/{total}] {} {what} {} {} ({})",
                    p.tag,
                    short(&d),
                    if pushed { "pushed" } else { "exists" },
                    human(bytes.len())
                ));
            }
            reg.push_manifest(&p.tag, &p.manifest).await?;
            progress(&format!(
                "[{n}/{total}] {} manifest {} tagged",
                p.tag,
                short(&p.manifest_digest)
            ));
        }
        report.releases.push((
            p.tag.clone(),
            p.release_digest.clone(),
            p.manifest_digest.clone(),
            !already,
        ));
    }
    report.pointers = move_pointers(reg, &targets, pointers, progress).await?;
    Ok(report)
}

/// Point a ring (and the channels its release lists) at an already published version:
/// promotion, or rollback to an older version with a higher seq.
///
/// `replace_foreign`: the key id of a foreign pointer the operator has decided to
/// overwrite (the id [`OciError::ForeignPointer`] showed). Only pointers whose manifest
/// names exactly that key, and that do not verify with `signer`, are replaced (their
/// content is not trusted: no org or ring check, the seq from `recorded` and the clock);
/// naming a key that no pointer of the ring carries, or the signer's own, is an error
/// and nothing moves.
#[allow(clippy::too_many_arguments)]
pub async fn promote_ring(
    reg: &Registry,
    ring: &str,
    version: &str,
    signer: &Signer,
    recorded: &BTreeMap<String, u64>,
    now: OffsetDateTime,
    replace_foreign: Option<&str>,
    progress: Progress<'_>,
) -> Result<PublishReport, OciError> {
    refuse_own_key_id(signer, replace_foreign)?;
    let keys = [signer.public_key()];
    let ring_tag = release_tag(version, ring, None)?;
    let (bytes, ring_manifest_digest) = reg.get_manifest(&ring_tag).await?.ok_or_else(|| {
        OciError::NotFound(format!(
            "release {ring_tag} (ring {ring}, version {version})"
        ))
    })?;
    let (manifest, _) =
        fetch_release_manifest(reg, &bytes, &keys, DEFAULT_MAX_RELEASE_BYTES).await?;
    if manifest.ring != ring || manifest.channel.is_some() {
        return Err(verify_err(format!(
            "{ring_tag} is not ring {ring}'s release"
        )));
    }
    let mut targets = Vec::new();
    for exp in &manifest.experiments {
        for v in &exp.variants {
            let tag = release_tag(version, ring, Some(&v.channel))?;
            let (cbytes, cdigest) = reg
                .get_manifest(&tag)
                .await?
                .ok_or_else(|| OciError::NotFound(format!("channel release {tag}")))?;
            let (cm, rdigest) =
                fetch_release_manifest(reg, &cbytes, &keys, DEFAULT_MAX_RELEASE_BYTES).await?;
            if cm.org != manifest.org || cm.ring != ring || cm.channel.as_ref() != Some(&v.channel)
            {
                return Err(verify_err(format!(
                    "{tag} is not channel {} of ring {ring}",
                    v.channel
                )));
            }
            targets.push(PointerTarget {
                org: cm.org,
                ring: ring.to_string(),
                channel: Some(v.channel.clone()),
                release_digest: rdigest,
                manifest_digest: cdigest,
                manifest: cbytes,
            });
        }
    }
    let release_digest = parse_manifest(&bytes)?.layers[0].digest.clone();
    targets.push(PointerTarget {
        org: manifest.org.clone(),
        ring: ring.to_string(),
        channel: None,
        release_digest: release_digest.clone(),
        manifest_digest: ring_manifest_digest.clone(),
        manifest: bytes,
    });
    let pointers = preflight_pointers(
        reg,
        &targets,
        signer,
        recorded,
        now,
        replace_foreign,
        progress,
    )
    .await?;
    let releases = targets
        .iter()
        .map(|t| {
            (
                release_tag(version, ring, t.channel.as_ref()).unwrap_or_default(),
                t.release_digest.clone(),
                t.manifest_digest.clone(),
                false,
            )
        })
        .collect();
    let moved = move_pointers(reg, &targets, pointers, progress).await?;
    Ok(PublishReport {
        releases,
        pointers: moved,
    })
}

/// `--replace-foreign-pointer` naming the publishing key itself is a mistake, never a
/// recovery.
fn refuse_own_key_id(signer: &Signer, replace_foreign: Option<&str>) -> Result<(), OciError> {
    if replace_foreign == Some(signer.key_id().as_str()) {
        return Err(verify_err(format!(
            "--replace-foreign-pointer {}: that is the publishing key's own id; nothing to replace, no pointer was moved",
            signer.key_id()
        )));
    }
    Ok(())
}

/// Every pointer's preflight: the current pointer (if any) must verify with the
/// publishing key and name the same org, ring and channel; the new seq follows the rule.
/// A current pointer that does not verify is [`OciError::ForeignPointer`], unless its
/// claimed key id is `replace_foreign` (see [`promote_ring`]).
async fn preflight_pointers(
    reg: &Registry,
    targets: &[PointerTarget],
    signer: &Signer,
    recorded: &BTreeMap<String, u64>,
    now: OffsetDateTime,
    replace_foreign: Option<&str>,
    progress: Progress<'_>,
) -> Result<Vec<PreparedPointer>, OciError> {
    let keys = [signer.public_key()];
    let now_unix = u64::try_from(now.unix_timestamp()).unwrap_or(0);
    let mut out = Vec::new();
    let mut replaced = Vec::new();
    for t in targets {
        let tag = pointer_tag(&t.ring, t.channel.as_ref())?;
        let current = match read_pointer(reg, &tag, &keys).await {
            Ok(current) => current,
            Err(OciError::Verify(detail)) => {
                let key_id = claimed_key_id(reg, &tag, &signer.key_id()).await?;
                if replace_foreign != Some(key_id.as_str()) {
                    return Err(OciError::ForeignPointer {
                        tag,
                        ring: t.ring.clone(),
                        key_id,
                        own_key_id: signer.key_id(),
                        detail,
                    });
                }
                progress(&format!(
                    "{tag} is signed by foreign key {key_id}: replacing it (--replace-foreign-pointer)"
                ));
                replaced.push(tag.clone());
                None
            }
            Err(other) => return Err(other),
        };
        if let Some(c) = &current
            && (c.org != t.org || c.ring != t.ring || c.channel != t.channel)
        {
            return Err(verify_err(format!(
                "the current {tag} belongs to org {:?} ring {:?}, not org {:?} ring {:?}; no pointer was moved",
                c.org, c.ring, t.org, t.ring
            )));
        }
        let seq = next_seq(
            current.as_ref().map(|c| c.seq),
            now_unix,
            recorded.get(&tag).copied(),
        );
        let pointer = new_pointer(
            &t.org,
            &t.ring,
            t.channel.clone(),
            &t.release_digest,
            &t.manifest_digest,
            seq,
            now,
        );
        out.push(prepare_pointer(pointer, signer)?);
    }
    if let Some(id) = replace_foreign
        && replaced.is_empty()
    {
        return Err(verify_err(format!(
            "--replace-foreign-pointer {id}: no pointer of this ring is signed by {id}; nothing to replace, no pointer was moved"
        )));
    }
    Ok(out)
}

/// The key id a pointer's manifest claims, for messages and for matching
/// `--replace-foreign-pointer`, never for trust: `unsigned` without a signature,
/// `unverified` when it claims `own` (yet did not verify with it), `unknown` when it
/// names no usable id or does not decode.
async fn claimed_key_id(reg: &Registry, tag: &str, own: &str) -> Result<String, OciError> {
    let Some((bytes, _)) = reg.get_manifest(tag).await? else {
        return Ok("unknown".to_string());
    };
    let Ok(m) = serde_json::from_slice::<ImageManifest>(&bytes) else {
        return Ok("unknown".to_string());
    };
    let plausible = |id: &str| {
        !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric())
    };
    Ok(match (m.signature(), m.claimed_key_id()) {
        (None, _) => "unsigned".to_string(),
        (Some(_), Some(id)) if id == own => "unverified".to_string(),
        (Some(_), Some(id)) if plausible(id) => id.to_string(),
        (Some(_), _) => "unknown".to_string(),
    })
}

/// Move the prepared pointers in order, each followed by its informational tag.
async fn move_pointers(
    reg: &Registry,
    targets: &[PointerTarget],
    pointers: Vec<PreparedPointer>,
    progress: Progress<'_>,
) -> Result<Vec<(String, u64)>, OciError> {
    let mut moved = Vec::new();
    reg.push_blob_if_missing(EMPTY_BLOB, &digest(EMPTY_BLOB))
        .await?;
    for (t, p) in targets.iter().zip(pointers) {
        reg.push_blob_if_missing(&p.payload, &digest(&p.payload))
            .await?;
        reg.push_manifest(&p.tag, &p.manifest).await?;
        let info = info_tag(&t.ring, t.channel.as_ref())?;
        reg.push_manifest(&info, &t.manifest).await?;
        progress(&format!(
            "pointer {} -> {} seq {} (tag {info} moved)",
            p.tag,
            short(&t.release_digest),
            p.pointer.seq
        ));
        moved.push((p.tag, p.pointer.seq));
    }
    Ok(moved)
}

fn parse_manifest(bytes: &[u8]) -> Result<ImageManifest, OciError> {
    let m: ImageManifest = serde_json::from_slice(bytes)
        .map_err(|e| verify_err(format!("manifest does not decode: {e}")))?;
    if m.schema_version != 2 || m.media_type != MANIFEST_MEDIA_TYPE {
        return Err(verify_err("manifest is not an OCI image manifest"));
    }
    if m.layers.len() != 1 {
        return Err(verify_err(format!(
            "manifest has {} layers, expected 1",
            m.layers.len()
        )));
    }
    Ok(m)
}

/// Read and verify the pointer at `tag`: type, size, signature by one of `keys`, strict
/// decoding. `None` if the tag does not exist.
pub async fn read_pointer(
    reg: &Registry,
    tag: &str,
    keys: &[ed25519_compact::PublicKey],
) -> Result<Option<Pointer>, OciError> {
    let Some((bytes, _)) = reg.get_manifest(tag).await? else {
        return Ok(None);
    };
    let m = parse_manifest(&bytes)?;
    let layer = &m.layers[0];
    if m.artifact_type.as_deref() != Some(POINTER_TYPE) || layer.media_type != POINTER_TYPE {
        return Err(verify_err(format!("{tag} is not a Halos pointer")));
    }
    if layer.size > MAX_POINTER_BYTES {
        return Err(verify_err(format!(
            "{tag} payload is over {MAX_POINTER_BYTES} bytes"
        )));
    }
    let signature = m
        .signature()
        .ok_or_else(|| verify_err(format!("{tag} carries no signature")))?;
    let payload = reg.pull_blob(layer, MAX_POINTER_BYTES).await?;
    if !verify_any(keys, &pointer_statement(&payload), signature) {
        return Err(verify_err(format!(
            "{tag}: the signature does not verify with any trusted key"
        )));
    }
    let pointer: Pointer =
        serde_json::from_slice(&payload).map_err(|e| verify_err(format!("{tag} payload: {e}")))?;
    Ok(Some(pointer))
}

/// A release manifest's layer: signature over its digest checked before download, then
/// downloaded (capped, digest checked) and unpacked strictly. Returns the release
/// manifest and the release digest.
async fn fetch_release_manifest(
    reg: &Registry,
    manifest_bytes: &[u8],
    keys: &[ed25519_compact::PublicKey],
    cap: u64,
) -> Result<(ReleaseManifest, String), OciError> {
    let (m, _, _) = fetch_release(reg, manifest_bytes, keys, cap).await?;
    let d = parse_manifest(manifest_bytes)?.layers[0].digest.clone();
    Ok((m, d))
}

async fn fetch_release(
    reg: &Registry,
    manifest_bytes: &[u8],
    keys: &[ed25519_compact::PublicKey],
    cap: u64,
) -> Result<(ReleaseManifest, BTreeMap<String, Vec<u8>>, Vec<u8>), OciError> {
    let m = parse_manifest(manifest_bytes)?;
    let layer = &m.layers[0];
    if layer.media_type != RELEASE_LAYER_TYPE {
        return Err(verify_err("the manifest is not a Halos release"));
    }
    let signature = m
        .signature()
        .ok_or_else(|| verify_err("the release manifest carries no signature"))?;
    if !verify_any(keys, &release_statement(&layer.digest), signature) {
        return Err(verify_err(format!(
            "release {}: the signature does not verify with any trusted key",
            layer.digest
        )));
    }
    let tar = reg.pull_blob(layer, cap).await?;
    let (manifest, blobs) = pack::unpack(&tar)?;
    Ok((manifest, blobs, tar))
}

/// A pointer and its release, both verified.
#[derive(Debug, Clone)]
pub struct VerifiedRelease {
    pub pointer: Pointer,
    pub manifest_digest: String,
    pub manifest: ReleaseManifest,
    pub blobs: BTreeMap<String, Vec<u8>>,
}

/// halod's steps 3-4 for one ring or channel: pull the pointer, check it, fetch the
/// release by the manifest digest it names, and verify the release against it.
#[allow(clippy::too_many_arguments)]
pub async fn pull_verified(
    reg: &Registry,
    org: &str,
    ring: &str,
    channel: Option<&Channel>,
    keys: &[ed25519_compact::PublicKey],
    last: Option<&Applied>,
    now: OffsetDateTime,
    max_release_bytes: u64,
) -> Result<VerifiedRelease, OciError> {
    let tag = pointer_tag(ring, channel)?;
    let pointer = read_pointer(reg, &tag, keys)
        .await?
        .ok_or_else(|| OciError::NotFound(format!("pointer {tag}")))?;
    check_pointer(&tag, &pointer, org, ring, channel, last, now)?;
    let (bytes, manifest_digest) = reg
        .get_manifest(&pointer.manifest)
        .await?
        .ok_or_else(|| OciError::NotFound(format!("release manifest {}", pointer.manifest)))?;
    let layer_digest = parse_manifest(&bytes)?.layers[0].digest.clone();
    if layer_digest != pointer.digest {
        return Err(verify_err(format!(
            "{tag} names release {} but manifest {} holds {layer_digest}",
            pointer.digest, pointer.manifest
        )));
    }
    let (manifest, blobs, tar) = fetch_release(reg, &bytes, keys, max_release_bytes).await?;
    if digest(&tar) != pointer.digest {
        return Err(verify_err("release digest differs from the pointer's"));
    }
    if manifest.org != pointer.org
        || manifest.ring != pointer.ring
        || manifest.channel.as_ref() != channel
    {
        return Err(verify_err(format!(
            "release {} belongs to org {:?} ring {:?}, the pointer to org {:?} ring {:?}",
            pointer.digest, manifest.org, manifest.ring, pointer.org, pointer.ring
        )));
    }
    Ok(VerifiedRelease {
        pointer,
        manifest_digest,
        manifest,
        blobs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_addresses() {
        assert!(is_loopback("127.0.0.1:5000"));
        assert!(is_loopback("localhost:5000"));
        assert!(is_loopback("[::1]:5000"));
        assert!(!is_loopback("registry.example.com"));
        assert!(!is_loopback("10.0.0.1:5000"));
        assert!(Registry::connect("127.0.0.1:5000", RegistryOptions::default()).is_err());
        assert!(Registry::connect("127.0.0.1:5000/Acme", RegistryOptions::default()).is_err());
        let r = Registry::connect("127.0.0.1:5000/acme/halos", RegistryOptions::default()).unwrap();
        assert_eq!(r.address(), "127.0.0.1:5000/acme/halos");
    }

    #[test]
    fn docker_config() {
        let text = r#"{"auths": {"https://reg.example.com/v1/": {"auth": "dXNlcjpwYXNz"}, "other.io": {"username": "u", "password": "p"}}}"#;
        assert!(matches!(
            docker_config_auth(text, "reg.example.com"),
            Some(RegistryAuth::Basic(u, p)) if u == "user" && p == "pass"
        ));
        assert!(matches!(
            docker_config_auth(text, "other.io"),
            Some(RegistryAuth::Basic(..))
        ));
        assert!(docker_config_auth(text, "none.io").is_none());
    }
}
