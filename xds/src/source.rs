//! The policy source: a policy directory watched by polling its content hash, and the
//! kill list, turned into cache snapshots.
//!
//! [`PolicySource::spawn`] loads, validates and compiles the directory, then checks its
//! content hash every `interval` (bounded, 250 ms by default in halo-server). A change that
//! loads, validates (no errors) and translates replaces the served policy and is pushed;
//! anything else is logged (the issues only: policy text may carry names, never secrets,
//! but the log stays short), counted in `rejected`, recorded in [`SourceStatus`], and the
//! last good policy keeps serving. A new kill-list envelope or exhausted-budget list on the
//! watch channel ([`Pushed`]) is pushed at once with the current policy (the filter
//! verifies the envelope with the kill public key).
//! So is a change of the discovered JWKS URLs ([`JwksUris`]: the host reads each issuer's
//! OIDC discovery document; the plan uses the served issuer's when the settings name no
//! `jwksUri`).
//!
//! [`PolicySource::spawn_transformed`] applies a [`Transform`] to every compiled policy
//! before it is translated (halo-demo points every upstream at its demo provider this way;
//! validation still runs on the policy as written). [`SourceStatus::render_prometheus`]
//! is the source's part of the host's /metrics.
//!
//! Every accepted policy is also published as a [`Served`] on [`PolicySource::served`], so
//! a host's own readers (halo-server's API: kill names, fleet rings, capabilities, admin
//! identity) read the policy the gateways are given, never the one it started with.
//! [`PolicySource::watch`] is the same watcher without xDS, for a host that serves no
//! Envoy but must still follow the policy dir.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::{GatewaySettings, NodeKey, Pushed, SnapshotCache, snapshot_with_pushed};

/// What the source serves and what it refused, for the status API.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    /// Version (sha256) of the compiled policy being served.
    pub served_version: Option<String>,
    /// Content hash of the directory that produced it.
    pub served_dir_hash: Option<String>,
    /// Policies accepted and pushed since start (the first included).
    pub accepted: u64,
    /// Directory states refused (invalid, unreadable, untranslatable).
    pub rejected: u64,
    /// Why the last refused state was refused (one line per problem).
    pub last_rejection: Option<Vec<String>>,
    /// The directory hash of the last refused state (not retried until it changes).
    pub rejected_dir_hash: Option<String>,
    /// Kill-list envelopes pushed.
    pub kill_pushes: u64,
    /// The JWKS URL pushed from the issuer's discovery document; `None` while Envoy is
    /// given the settings' `jwksUri` or the `<issuer>/.well-known/jwks.json` default
    /// (discovery runs after the first push, so a watcher waits for this to settle).
    pub discovered_jwks_uri: Option<String>,
}

/// The JWKS URL of each issuer, as its OIDC discovery document names it (`jwks_uri`): the
/// host discovers them (halo-server, `crate` does no I/O but the policy dir); a plan whose
/// settings name no `jwksUri` takes its issuer's from here, else the default.
pub type JwksUris = std::collections::BTreeMap<String, String>;

/// A rewrite applied to every compiled policy before translation (after validation).
pub type Transform =
    std::sync::Arc<dyn Fn(halo_policy::Snapshot) -> halo_policy::Snapshot + Send + Sync>;

/// A policy the source accepted: the documents as written (names of every experiment and
/// toggle, the identity) and the compiled policy as served (after the transform).
#[derive(Debug)]
pub struct Served {
    pub org: halo_policy::Org,
    pub compiled: halo_policy::Snapshot,
    /// `compiled.version()`, computed once.
    pub version: String,
}

/// Why the first load failed (later failures keep the old policy instead).
#[derive(Debug, thiserror::Error)]
#[error("policy {dir}: {problems:?}")]
pub struct SourceError {
    pub dir: String,
    pub problems: Vec<String>,
}

/// A running policy source. Dropping it stops the watcher.
pub struct PolicySource {
    status: Arc<Mutex<SourceStatus>>,
    served: watch::Receiver<Arc<Served>>,
    task: tokio::task::JoinHandle<()>,
}

/// Where a source's accepted policies go besides [`PolicySource::served`]: translated into
/// `cache` with the gateway settings and what halo-server pushes besides (the kill-list
/// envelope, the exhausted budgets).
struct Push {
    settings: GatewaySettings,
    cache: SnapshotCache,
    pushed: watch::Receiver<Pushed>,
    jwks_uris: watch::Receiver<JwksUris>,
}

impl Push {
    /// Translate and push `compiled`; returns the discovered JWKS URL it was given, if any.
    fn set(
        &self,
        compiled: &halo_policy::Snapshot,
        pushed: &Pushed,
    ) -> Result<Option<String>, String> {
        let discovered = compiled
            .identity
            .as_ref()
            .filter(|_| self.settings.jwks_uri.is_none())
            .and_then(|id| self.jwks_uris.borrow().get(&id.issuer).cloned());
        let snap = match &discovered {
            Some(uri) => {
                let settings = GatewaySettings {
                    jwks_uri: Some(uri.clone()),
                    ..self.settings.clone()
                };
                snapshot_with_pushed(compiled, &settings, pushed)
            }
            None => snapshot_with_pushed(compiled, &self.settings, pushed),
        }
        .map_err(|e| e.to_string())?;
        self.cache.set(NodeKey::Default, snap);
        Ok(discovered)
    }
}

impl std::fmt::Debug for PolicySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicySource")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl Drop for PolicySource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The content hash of a policy directory: relative path and bytes of every YAML file.
pub fn dir_hash(dir: &Path) -> std::io::Result<String> {
    let mut files = Vec::new();
    collect(dir, dir, &mut files)?;
    files.sort();
    let mut h = Sha256::new();
    for (rel, path) in files {
        h.update(rel.as_bytes());
        h.update([0]);
        let bytes = std::fs::read(&path)?;
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(hex::encode(h.finalize()))
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        if entry.file_type()?.is_dir() {
            collect(root, &path, out)?;
        } else if name.ends_with(".yaml") || name.ends_with(".yml") {
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            out.push((rel, path));
        }
    }
    Ok(())
}

/// Load, validate and compile `dir`: the compiled snapshot, or every problem as a line.
pub fn load_policy(dir: &Path) -> Result<halo_policy::Snapshot, Vec<String>> {
    halo_policy::load::load_checked(dir).map(|(_, compiled)| compiled)
}

impl PolicySource {
    /// Serve `dir` into `cache` (default node), re-reading it when its content hash
    /// changes (checked every `interval`), and push every new kill-list envelope and exhausted-budget list from `pushed`.
    /// The first load must succeed.
    pub fn spawn(
        dir: PathBuf,
        interval: Duration,
        settings: GatewaySettings,
        cache: SnapshotCache,
        pushed: watch::Receiver<Pushed>,
    ) -> Result<PolicySource, SourceError> {
        let (_, jwks_uris) = watch::channel(JwksUris::new());
        Self::spawn_transformed(dir, interval, settings, cache, pushed, jwks_uris, None)
    }

    /// [`PolicySource::spawn`], with the discovered JWKS URLs (a change is pushed at
    /// once), and `transform` applied to every compiled policy that validated, before it
    /// is translated and served (its version is the served one's).
    pub fn spawn_transformed(
        dir: PathBuf,
        interval: Duration,
        settings: GatewaySettings,
        cache: SnapshotCache,
        pushed: watch::Receiver<Pushed>,
        jwks_uris: watch::Receiver<JwksUris>,
        transform: Option<Transform>,
    ) -> Result<PolicySource, SourceError> {
        let push = Push {
            settings,
            cache,
            pushed,
            jwks_uris,
        };
        Self::start(dir, interval, Some(push), transform)
    }

    /// Follow `dir` like [`PolicySource::spawn`] does, without serving xDS: accepted
    /// policies are only published on [`PolicySource::served`].
    pub fn watch(dir: PathBuf, interval: Duration) -> Result<PolicySource, SourceError> {
        Self::start(dir, interval, None, None)
    }

    fn start(
        dir: PathBuf,
        interval: Duration,
        mut push: Option<Push>,
        transform: Option<Transform>,
    ) -> Result<PolicySource, SourceError> {
        let load = move |dir: &Path| {
            halo_policy::load::load_checked(dir).map(|(org, compiled)| {
                let compiled = match &transform {
                    Some(t) => t(compiled),
                    None => compiled,
                };
                let version = compiled.version();
                Served {
                    org,
                    compiled,
                    version,
                }
            })
        };
        let status = Arc::new(Mutex::new(SourceStatus::default()));
        let fail = |problems| SourceError {
            dir: dir.display().to_string(),
            problems,
        };
        let hash = dir_hash(&dir).map_err(|e| fail(vec![e.to_string()]))?;
        let first = load(&dir).map_err(fail)?;
        let mut discovered_jwks_uri = None;
        if let Some(p) = &mut push {
            let pushed = p.pushed.borrow_and_update().clone();
            discovered_jwks_uri = p.set(&first.compiled, &pushed).map_err(|e| fail(vec![e]))?;
        }
        {
            let mut s = status.lock().unwrap_or_else(|p| p.into_inner());
            s.discovered_jwks_uri = discovered_jwks_uri;
            s.served_version = Some(first.version.clone());
            s.served_dir_hash = Some(hash.clone());
            s.accepted = 1;
        }
        tracing::info!(dir = %dir.display(), version = %first.version, "policy served");
        let (served_tx, served) = watch::channel(Arc::new(first));

        let st = status.clone();
        let task = tokio::spawn(async move {
            let mut seen = hash;
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut kills_open = push.is_some();
            let mut jwks_open = push.is_some();
            loop {
                let (kills, jwks) = match &mut push {
                    Some(p) => (Some(&mut p.pushed), Some(&mut p.jwks_uris)),
                    None => (None, None),
                };
                let kill_change = async {
                    match kills {
                        Some(k) => k.changed().await,
                        None => std::future::pending().await,
                    }
                };
                let jwks_change = async {
                    match jwks {
                        Some(j) => j.changed().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = tick.tick() => {}
                    changed = jwks_change, if jwks_open => {
                        if changed.is_err() {
                            jwks_open = false;
                            continue;
                        }
                        if let Some(p) = &mut push {
                            p.jwks_uris.borrow_and_update();
                            let pushed = p.pushed.borrow().clone();
                            let current = Arc::clone(&served_tx.borrow());
                            match p.set(&current.compiled, &pushed) {
                                Ok(uri) => {
                                    let mut s = st.lock().unwrap_or_else(|p| p.into_inner());
                                    s.discovered_jwks_uri = uri;
                                }
                                Err(e) => tracing::error!(error = %e, "push with the discovered JWKS URL failed"),
                            }
                        }
                        continue;
                    }
                    changed = kill_change, if kills_open => {
                        if changed.is_err() {
                            kills_open = false;
                            continue;
                        }
                        if let Some(p) = &mut push {
                            let pushed = p.pushed.borrow_and_update().clone();
                            let current = Arc::clone(&served_tx.borrow());
                            match p.set(&current.compiled, &pushed) {
                                Ok(uri) => {
                                    let mut s = st.lock().unwrap_or_else(|p| p.into_inner());
                                    s.kill_pushes += 1;
                                    s.discovered_jwks_uri = uri;
                                }
                                Err(e) => tracing::error!(error = %e, "kill list or exhausted budgets push failed"),
                            }
                        }
                        continue;
                    }
                }
                let hash = match dir_hash(&dir) {
                    Ok(h) => h,
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e, "policy directory unreadable; keeping the served policy");
                        continue;
                    }
                };
                if hash == seen {
                    // Back to the served state (a refused edit reverted): nothing is
                    // refused any more.
                    let mut s = st.lock().unwrap_or_else(|p| p.into_inner());
                    if s.rejected_dir_hash.take().is_some() {
                        tracing::info!(dir = %dir.display(), "policy directory is back to the served policy");
                    }
                    continue;
                }
                let refused_already = st
                    .lock()
                    .map(|s| s.rejected_dir_hash.as_deref() == Some(hash.as_str()))
                    .unwrap_or(false);
                if refused_already {
                    continue;
                }
                let result = load(&dir).and_then(|accepted| match &push {
                    Some(p) => {
                        let pushed = p.pushed.borrow().clone();
                        p.set(&accepted.compiled, &pushed)
                            .map(|uri| (accepted, uri))
                            .map_err(|e| vec![e])
                    }
                    None => Ok((accepted, None)),
                });
                let mut s = st.lock().unwrap_or_else(|p| p.into_inner());
                match result {
                    Ok((accepted, jwks_uri)) => {
                        tracing::info!(dir = %dir.display(), version = %accepted.version, "policy change accepted");
                        s.discovered_jwks_uri = jwks_uri;
                        s.served_version = Some(accepted.version.clone());
                        s.served_dir_hash = Some(hash.clone());
                        s.accepted += 1;
                        s.rejected_dir_hash = None;
                        served_tx.send_replace(Arc::new(accepted));
                        seen = hash;
                    }
                    Err(problems) => {
                        tracing::error!(dir = %dir.display(), problems = ?problems, "policy change refused; the last good policy keeps serving");
                        s.rejected += 1;
                        s.last_rejection = Some(problems);
                        s.rejected_dir_hash = Some(hash);
                    }
                }
            }
        });
        Ok(PolicySource {
            status,
            served,
            task,
        })
    }

    /// The policy served now, and every later one as it is accepted.
    pub fn served(&self) -> watch::Receiver<Arc<Served>> {
        self.served.clone()
    }

    /// What is served and what was refused.
    pub fn status(&self) -> SourceStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl SourceStatus {
    /// The Prometheus text of the source: reloads by outcome, the served version (an
    /// info gauge), whether the directory as it is now is refused, kill pushes.
    pub fn render_prometheus(&self) -> String {
        let mut text = halo_metrics::Text::new();
        self.write_prometheus(&mut text);
        text.finish()
    }

    /// [`SourceStatus::render_prometheus`] into a host's exposition.
    pub fn write_prometheus(&self, out: &mut halo_metrics::Text) {
        use halo_metrics::Kind;
        out.family(
            "halo_policy_reloads_total",
            Kind::Counter,
            "Policy directory states loaded by the xDS policy source: accepted (served and pushed, the first load included) or refused (invalid; the last good policy keeps serving).",
        )
        .sample("halo_policy_reloads_total", &[("outcome", "accepted")], self.accepted)
        .sample("halo_policy_reloads_total", &[("outcome", "refused")], self.rejected);
        out.family(
            "halo_policy_served_info",
            Kind::Gauge,
            "The compiled policy version (sha256) being served; the value is always 1.",
        );
        if let Some(v) = &self.served_version {
            out.sample("halo_policy_served_info", &[("version", v)], 1);
        }
        out.single(
            "halo_policy_refused_pending",
            Kind::Gauge,
            "1 while the policy directory as it is now is refused (the served policy is an older one).",
            u8::from(self.rejected_dir_hash.is_some()),
        );
        out.single(
            "halo_policy_kill_pushes_total",
            Kind::Counter,
            "Kill-list envelopes and exhausted-budget lists pushed with the served policy.",
            self.kill_pushes,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_reloads_by_outcome_and_the_served_version() {
        let st = SourceStatus {
            served_version: Some("ab12".into()),
            accepted: 2,
            rejected: 1,
            rejected_dir_hash: Some("ff".into()),
            ..SourceStatus::default()
        };
        let text = st.render_prometheus();
        assert!(text.contains("halo_policy_reloads_total{outcome=\"accepted\"} 2\n"));
        assert!(text.contains("halo_policy_reloads_total{outcome=\"refused\"} 1\n"));
        assert!(text.contains("halo_policy_served_info{version=\"ab12\"} 1\n"));
        assert!(text.contains("halo_policy_refused_pending 1\n"));
        assert_eq!(text.lines().filter(|l| l.starts_with("# TYPE")).count(), 4);
    }
}
