//! The apply loop (spec: halod apply loop, steps 1-10, and PollKill).
//!
//! [`Agent::cycle`] runs the ten steps once; [`Agent::poll_kill`] reacts to a kill-list
//! change between cycles; [`Agent::run`] interleaves both on one task, so state.json has
//! a single writer. Every cycle ends in one [`Status`]: printed as one JSON line, POSTed
//! to `reportURL`, and kept in state.json for `halod status`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use halo_policy::decide::{Subject, client_toggle_is_on};
use halo_policy::killswitch::{self, KillList};
use halo_policy::{Axis, Toggle};
use halo_release::adapters::telemetry::{self, Attribution, Resolved};
use halo_release::adapters::{self, Os, RenderedFile};
use halo_release::check::check_rendered;
use halo_release::names::{Channel, pointer_tag};
use halo_release::oci::{self, Registry, RegistryOptions, VerifiedRelease};
use halo_release::pointer::Applied;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::config::Config;
use crate::install::{self, ApplyReport, DesiredFile, Writer};
use crate::kill::{KillAction, react};
use crate::state::{Assignment, PointerMark, State, StateError};
use crate::target::Targets;

/// The largest kill-list or ring answer read from halo-server.
const MAX_REPLY_BYTES: usize = 1 << 20;
/// One HTTP call to halo-server, end to end.
const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// How a cycle ended. `halod once` maps it to its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Files were written, rewritten (drift) or removed.
    Applied,
    /// Everything was already as the release says.
    Unchanged,
    /// Some files were refused by checkTarget or could not be written; the rest applied.
    Refused,
    /// Nothing was applied: no ring, a pointer or release failed verification, the
    /// registry was unreachable, a variant channel failed. The files on disk stay.
    Failed,
}

impl Outcome {
    /// `halod once`'s exit code.
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Applied | Outcome::Unchanged => 0,
            Outcome::Refused => 3,
            Outcome::Failed => 4,
        }
    }
}

/// A file that was refused or failed, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileProblem {
    pub path: String,
    pub reason: String,
}

/// The kill list the device holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KillStatus {
    pub version: u64,
    pub issued_at: String,
    pub experiments: Vec<String>,
    pub toggles: Vec<String>,
}

/// One cycle's status line. It names files, rings and releases, never the user, a token
/// or file contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub outcome: Outcome,
    /// `cycle` or `kill-poll`.
    pub trigger: String,
    pub at: String,
    pub org: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<String>,
    /// `fixed`, `endpoint` or `last-known`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_source: Option<String>,
    /// The release whose files are on disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment: Option<Assignment>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub toggles: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub written: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unchanged: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<FileProblem>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<FileProblem>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill: Option<KillStatus>,
    /// Why the kill list could not be refreshed (the held one stays in force).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_error: Option<String>,
    /// Why the cycle failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Status {
    /// The one-line JSON form.
    pub fn line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("reading {what} {}: {message}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("registry: {0}")]
    Registry(#[from] oci::OciError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("HTTP client: {0}")]
    Http(String),
}

/// The ring and who the device belongs to, for one cycle.
#[derive(Debug, Clone)]
struct RingContext {
    ring: String,
    source: &'static str,
    subject: Subject,
}

/// The verified ring release of the last cycle, for PollKill.
#[derive(Debug, Clone)]
struct Cached {
    ring: VerifiedRelease,
    context: RingContext,
}

/// The device agent.
pub struct Agent {
    config: Config,
    root: PathBuf,
    state_dir: PathBuf,
    os: Os,
    keys: Vec<ed25519_compact::PublicKey>,
    kill_key: Option<ed25519_compact::PublicKey>,
    device_token: Option<String>,
    telemetry_token: Option<String>,
    registry: Registry,
    http: reqwest::Client,
    state: State,
    kill: Option<KillList>,
    cache: Option<Cached>,
    writer: Arc<Writer>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("root", &self.root)
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

fn read(what: &'static str, path: &Path) -> Result<String, AgentError> {
    std::fs::read_to_string(path).map_err(|e| AgentError::File {
        what,
        path: path.into(),
        message: e.to_string(),
    })
}

/// A token file's one line, when configured; an empty file is an error.
fn read_token(what: &'static str, path: Option<&Path>) -> Result<Option<String>, AgentError> {
    let Some(path) = path else {
        return Ok(None);
    };
    let token = read(what, path)?.trim().to_string();
    if token.is_empty() {
        return Err(bad(what, path, "the file is empty"));
    }
    Ok(Some(token))
}

fn bad(what: &'static str, path: &Path, message: impl std::fmt::Display) -> AgentError {
    AgentError::File {
        what,
        path: path.into(),
        message: message.to_string(),
    }
}

/// The OS whose files this build applies.
pub fn current_os() -> Os {
    if cfg!(target_os = "macos") {
        Os::Darwin
    } else if cfg!(windows) {
        Os::Windows
    } else {
        Os::Linux
    }
}

fn now_rfc3339() -> String {
    OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or_else(|_| OffsetDateTime::now_utc())
        .format(&Rfc3339)
        .unwrap_or_default()
}

/// A policy name: `[a-z0-9][a-z0-9.-]*`, at most 63 characters.
fn is_ring_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'.' || *c == b'-')
}

/// halo-server's answer at the ring endpoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RingReply {
    ring: String,
    subject: String,
    groups: Vec<String>,
}

impl Agent {
    /// Read keys, the device token and state.json; no network I/O yet. `root` overrides
    /// the config's root prefix (the state dir follows it unless set explicitly).
    pub fn new(mut config: Config, root: Option<PathBuf>) -> Result<Agent, AgentError> {
        if let Some(root) = root {
            config.root = Some(root);
        }
        let revoked: Vec<String> = config
            .revoked_keys
            .iter()
            .map(|k| k.trim().to_ascii_lowercase())
            .collect();
        let mut keys = Vec::new();
        for path in &config.pubkeys {
            let pem = read("release public key", path)?;
            let key = halo_policy::keys::public_key_from_pem(&pem)
                .map_err(|e| bad("release public key", path, e))?;
            // A revoked key is dropped before anything is verified with it.
            if !revoked.contains(&halo_policy::keys::key_id(&key)) {
                keys.push(key);
            }
        }
        let kill_key = match &config.kill_switch {
            Some(ks) => {
                let pem = read("kill-list public key", &ks.pubkey_file)?;
                Some(
                    halo_policy::keys::public_key_from_pem(&pem)
                        .map_err(|e| bad("kill-list public key", &ks.pubkey_file, e))?,
                )
            }
            None => None,
        };
        let device_token = read_token("device token", config.device_token_file.as_deref())?;
        let telemetry_token =
            read_token("telemetry token", config.telemetry_token_file.as_deref())?;
        let host = config.registry.split('/').next().unwrap_or_default();
        let registry = Registry::connect(
            &config.registry,
            RegistryOptions {
                insecure: config.insecure,
                auth: oci::auth_from_env_or_docker(host),
            },
        )?;
        // Registry::connect installed the ring TLS provider reqwest needs.
        let http = reqwest::Client::builder()
            .timeout(HTTP_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| AgentError::Http(e.to_string()))?;
        let root = config.root();
        let state_dir = config.state_dir();
        let state = State::load(&state_dir)?;
        let kill = match (&state.kill_envelope, &kill_key) {
            // Restore the held list so a restart cannot be fed an older envelope.
            (Some(envelope), Some(key)) => killswitch::restore(envelope.as_bytes(), key).ok(),
            _ => None,
        };
        Ok(Agent {
            config,
            root,
            state_dir,
            os: current_os(),
            keys,
            kill_key,
            device_token,
            telemetry_token,
            registry,
            http,
            state,
            kill,
            cache: None,
            writer: Arc::new(install::write_atomic),
        })
    }

    /// Replace how files reach the disk (tests cut the power between write and rename).
    pub fn set_writer(&mut self, writer: Arc<Writer>) {
        self.writer = writer;
    }

    /// The state as last saved.
    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    fn base_status(&self, trigger: &str) -> Status {
        Status {
            outcome: Outcome::Failed,
            trigger: trigger.to_string(),
            at: now_rfc3339(),
            org: self.config.org.clone(),
            host: self.config.host.clone(),
            ring: self.state.ring.clone(),
            ring_source: None,
            digest: self.state.digest.clone(),
            seq: None,
            assignment: self.state.assignment.clone(),
            toggles: Vec::new(),
            written: Vec::new(),
            unchanged: Vec::new(),
            drift: Vec::new(),
            removed: Vec::new(),
            refused: Vec::new(),
            failed: Vec::new(),
            warnings: Vec::new(),
            kill: None,
            kill_error: None,
            error: None,
        }
    }

    fn kill_status(&self) -> Option<KillStatus> {
        self.kill.as_ref().map(|k| KillStatus {
            version: k.version(),
            issued_at: k.issued_at().format(&Rfc3339).unwrap_or_default(),
            experiments: k.experiments().iter().cloned().collect(),
            toggles: k.toggles().iter().cloned().collect(),
        })
    }

    async fn get(&self, url: &str) -> Result<Vec<u8>, String> {
        let mut req = self.http.get(url);
        if let Some(t) = &self.device_token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(|e| describe_http(&e))?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| describe_http(&e))?;
        if body.len() > MAX_REPLY_BYTES {
            return Err(format!("the answer is larger than {MAX_REPLY_BYTES} bytes"));
        }
        if !status.is_success() {
            // halo-server's error bodies name the problem; nothing secret is in them.
            let message = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.pointer("/error/message").cloned())
                .and_then(|m| m.as_str().map(str::to_string))
                .unwrap_or_default();
            return Err(format!("HTTP {status} {message}").trim_end().to_string());
        }
        Ok(body.to_vec())
    }

    /// Step 1: fetch and verify the kill list; persist it once accepted. Returns whether
    /// a new list was accepted, with the list held before it.
    async fn refresh_kill(&mut self) -> Result<Option<Option<KillList>>, String> {
        let (Some(ks), Some(key)) = (&self.config.kill_switch, &self.kill_key) else {
            return Ok(None);
        };
        let url = ks.url.clone();
        let key = *key;
        let body = self
            .get(&url)
            .await
            .map_err(|e| format!("kill list {url}: {e}"))?;
        let now = OffsetDateTime::now_utc().unix_timestamp();
        let list = match killswitch::verify(&body, &key, now, self.kill.as_ref()) {
            Ok(list) => list,
            // The same list again is not news (halo-server re-signs on its own clock).
            Err(killswitch::KillListError::NotNewer { .. }) => return Ok(None),
            Err(e) => return Err(format!("kill list {url}: {e}")),
        };
        self.state.kill_envelope = Some(String::from_utf8_lossy(list.envelope()).into_owned());
        self.state
            .save(&self.state_dir)
            .map_err(|e| e.to_string())?;
        let held = self.kill.replace(list);
        Ok(Some(held))
    }

    fn is_experiment_killed(&self, name: &str) -> bool {
        self.kill
            .as_ref()
            .is_some_and(|k| k.is_experiment_killed(name))
    }

    /// Step 2: the ring.
    async fn resolve_ring(&self) -> Result<RingContext, String> {
        if let Some(ring) = &self.config.ring {
            return Ok(RingContext {
                ring: ring.clone(),
                source: "fixed",
                subject: Subject {
                    user: self.config.user.clone().unwrap_or_default(),
                    groups: self.config.groups.clone(),
                },
            });
        }
        let endpoint = self.config.ring_endpoint.clone().unwrap_or_default();
        match self.fetch_ring(&endpoint).await {
            Ok(context) => Ok(context),
            Err(e) => match &self.state.ring {
                Some(ring) if !self.state.first_run() => Ok(RingContext {
                    ring: ring.clone(),
                    source: "last-known",
                    subject: Subject {
                        user: self
                            .state
                            .subject
                            .clone()
                            .or_else(|| self.config.user.clone())
                            .unwrap_or_default(),
                        groups: self.state.groups.clone(),
                    },
                }),
                _ => Err(format!(
                    "ring endpoint {endpoint}: {e}; no last-known ring on the first run, nothing written"
                )),
            },
        }
    }

    async fn fetch_ring(&self, endpoint: &str) -> Result<RingContext, String> {
        let mut url = reqwest::Url::parse(endpoint).map_err(|e| e.to_string())?;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("user", self.config.user.as_deref().unwrap_or(""));
            q.append_pair("host", self.config.host.as_deref().unwrap_or(""));
        }
        let body = self.get(url.as_str()).await?;
        let reply: RingReply = serde_json::from_slice(&body)
            .map_err(|e| format!("the answer does not decode: {e}"))?;
        if !is_ring_name(&reply.ring) {
            return Err(format!("the answer names an invalid ring {:?}", reply.ring));
        }
        if reply.subject.trim().is_empty() {
            return Err("the answer names no subject".into());
        }
        if self
            .config
            .user
            .as_deref()
            .is_some_and(|u| u != reply.subject)
        {
            return Err("the answer is for another user".into());
        }
        if reply.groups.iter().any(|g| g.trim().is_empty()) {
            return Err("the answer names a blank group".into());
        }
        Ok(RingContext {
            ring: reply.ring,
            source: "endpoint",
            subject: Subject {
                user: reply.subject,
                groups: reply.groups,
            },
        })
    }

    fn mark(&self, tag: &str) -> Option<Applied> {
        self.state.marks.get(tag).map(|m| Applied {
            seq: m.seq,
            digest: m.digest.clone(),
        })
    }

    async fn pull(&self, ring: &str, channel: Option<&Channel>) -> Result<VerifiedRelease, String> {
        let tag = pointer_tag(ring, channel).map_err(|e| e.to_string())?;
        let last = self.mark(&tag);
        oci::pull_verified(
            &self.registry,
            &self.config.org,
            ring,
            channel,
            &self.keys,
            last.as_ref(),
            OffsetDateTime::now_utc(),
            self.config.max_layer_bytes(),
        )
        .await
        .map_err(|e| e.to_string())
    }

    /// One full cycle (steps 1-10). The status is printed by the caller.
    pub async fn cycle(&mut self) -> Status {
        let mut status = self.base_status("cycle");
        if let Err(e) = self.refresh_kill().await {
            status.kill_error = Some(e);
        }
        self.cycle_after_kill(status).await
    }

    async fn cycle_after_kill(&mut self, mut status: Status) -> Status {
        status.kill = self.kill_status();
        match self.try_cycle(&mut status).await {
            Ok(()) => {}
            Err(e) => {
                status.outcome = Outcome::Failed;
                status.error = Some(e);
            }
        }
        self.finish(status).await
    }

    async fn try_cycle(&mut self, status: &mut Status) -> Result<(), String> {
        // Step 2.
        let context = self.resolve_ring().await?;
        status.ring = Some(context.ring.clone());
        status.ring_source = Some(context.source.to_string());
        // Steps 3-4.
        let ring_release = self.pull(&context.ring, None).await?;
        // Step 5: the variant, skipping killed experiments; a failed channel fails all.
        let mut chosen: Option<(Assignment, String, VerifiedRelease)> = None;
        if !context.subject.user.is_empty() {
            for exp in &ring_release.manifest.experiments {
                if self.is_experiment_killed(&exp.name) {
                    continue;
                }
                let weights: Vec<u32> = exp.variants.iter().map(|v| v.weight).collect();
                let Some(variant) =
                    halo_policy::assign::variant(&exp.salt, &context.subject.user, &weights)
                        .and_then(|i| exp.variants.get(i))
                else {
                    continue;
                };
                let release = self
                    .pull(&context.ring, Some(&variant.channel))
                    .await
                    .map_err(|e| format!("variant channel {}: {e}", variant.channel))?;
                chosen = Some((
                    Assignment {
                        experiment: exp.name.clone(),
                        variant: variant.name.clone(),
                    },
                    exp.salt.clone(),
                    release,
                ));
                break;
            }
        }
        let (assignment, salt, applied) = match &chosen {
            Some((a, salt, r)) => (Some(a.clone()), Some(salt.as_str()), r),
            None => (None, None, &ring_release),
        };
        // Steps 6-9.
        self.apply_release(status, applied, &context, assignment.clone(), salt);
        // Step 10 (marks): the pointers this cycle verified.
        let mut marks = vec![(None, &ring_release)];
        if let Some((_, _, r)) = &chosen {
            marks.push((r.manifest.channel.clone(), r));
        }
        for (channel, release) in marks {
            if let Ok(tag) = pointer_tag(&context.ring, channel.as_ref()) {
                self.state.marks.insert(
                    tag,
                    PointerMark {
                        seq: release.pointer.seq,
                        digest: release.pointer.digest.clone(),
                    },
                );
            }
        }
        self.state.ring = Some(context.ring.clone());
        self.state.subject = Some(context.subject.user.clone())
            .filter(|u| !u.is_empty() && context.source != "fixed");
        self.state.groups = context.subject.groups.clone();
        self.cache = Some(Cached {
            ring: ring_release,
            context,
        });
        Ok(())
    }

    /// Steps 6-9 for a verified release: toggles, telemetry attribution, checkTarget,
    /// writes, stale removal. `salt` is the assigned experiment's.
    fn apply_release(
        &mut self,
        status: &mut Status,
        release: &VerifiedRelease,
        context: &RingContext,
        assignment: Option<Assignment>,
        salt: Option<&str>,
    ) {
        let toggles = self.active_toggles(&release.manifest.toggles, context);
        // The harnesses' own telemetry names this device's ring, release, variant and
        // unit; without a subject there is no unit, and their records stay unattributed.
        let attribution = (!context.subject.user.is_empty()).then(|| {
            let resolved = assignment.as_ref().zip(salt).map(|(a, salt)| Resolved {
                experiment: &a.experiment,
                salt,
                variant: &a.variant,
            });
            Attribution::new(
                &context.ring,
                &release.pointer.digest,
                resolved,
                &context.subject.user,
            )
        });
        let desired = self.desired_files(
            release,
            &toggles,
            attribution.as_ref(),
            &mut status.warnings,
        );
        let targets = Targets::new(&self.root, adapters::managed_locations(self.os));
        let changed = self.state.digest.as_deref() != Some(release.pointer.digest.as_str());
        let report = install::apply_with(
            &targets,
            &desired,
            &self.state.owned,
            changed,
            self.writer.as_ref(),
        );
        status.toggles = toggles.iter().map(|t| t.name.clone()).collect();
        status.digest = Some(release.pointer.digest.clone());
        status.seq = Some(release.pointer.seq);
        status.assignment = assignment.clone();
        status.outcome = outcome_of(&report);
        fill(status, &report);
        self.state.digest = Some(release.pointer.digest.clone());
        self.state.assignment = assignment;
        self.state.owned = report.owned;
    }

    /// Step 6: client toggles on for this subject and ring, minus the killed ones.
    fn active_toggles<'t>(&self, toggles: &'t [Toggle], context: &RingContext) -> Vec<&'t Toggle> {
        toggles
            .iter()
            .filter(|t| t.axis == Axis::Client)
            .filter(|t| {
                !self
                    .kill
                    .as_ref()
                    .is_some_and(|k| k.is_toggle_killed(&t.name))
            })
            .filter(|t| client_toggle_is_on(t, &context.subject, Some(&context.ring)))
            .collect()
    }

    /// This OS's files of `release`, with the active toggles' fragments merged into each
    /// harness's settings file, then the device's telemetry attribution and the CLI
    /// receiver token ([`telemetry::attribute`]). A merged file passes CheckRendered
    /// again; a fragment that does not merge or fails it is left out and reported.
    fn desired_files(
        &self,
        release: &VerifiedRelease,
        toggles: &[&Toggle],
        attribution: Option<&Attribution>,
        warnings: &mut Vec<String>,
    ) -> Vec<DesiredFile> {
        let mut files = Vec::new();
        for entry in release.manifest.files.iter().filter(|f| f.os == self.os) {
            let Some(blob) = release.blobs.get(&entry.sha256) else {
                warnings.push(format!("{}: the release carries no content", entry.path));
                continue;
            };
            let mut content = blob.clone();
            if adapters::settings_file(entry.harness, self.os).as_deref() == Some(&entry.path) {
                for toggle in toggles {
                    let Some(fragment) = toggle.client.get(&entry.harness) else {
                        continue;
                    };
                    let merged = adapters::merge_settings(entry.harness, &content, fragment)
                        .and_then(|bytes| {
                            let file = RenderedFile {
                                harness: entry.harness,
                                os: self.os,
                                path: entry.path.clone(),
                                mode: entry.mode,
                                content: bytes,
                            };
                            check_rendered(&file)
                                .map(|()| file.content)
                                .map_err(|e| e.to_string())
                        });
                    match merged {
                        Ok(bytes) => content = bytes,
                        Err(e) => warnings.push(format!(
                            "toggle {} not applied to {}: {e}",
                            toggle.name, entry.path
                        )),
                    }
                }
            }
            files.push(RenderedFile {
                harness: entry.harness,
                os: self.os,
                path: entry.path.clone(),
                mode: entry.mode,
                content,
            });
        }
        if let Some(attribution) = attribution {
            warnings.extend(telemetry::attribute(
                &mut files,
                attribution,
                self.telemetry_token.as_deref(),
            ));
        }
        files
            .into_iter()
            .map(|f| DesiredFile {
                path: f.path,
                mode: f.mode,
                content: f.content,
            })
            .collect()
    }

    /// Step 10: save state, keep the status, report it.
    async fn finish(&mut self, status: Status) -> Status {
        self.state.last_status = serde_json::to_value(&status).ok();
        let mut status = status;
        if let Err(e) = self.state.save(&self.state_dir) {
            status.outcome = Outcome::Failed;
            status.error = Some(match status.error.take() {
                Some(prev) => format!("{prev}; saving state: {e}"),
                None => format!("saving state: {e}"),
            });
        }
        if let Err(e) = self.report(&status).await {
            // The report is best effort: the next cycle reports again.
            eprintln!("halod: report not delivered: {e}");
        }
        status
    }

    async fn report(&self, status: &Status) -> Result<(), String> {
        let Some(url) = &self.config.report_url else {
            return Ok(());
        };
        let mut req = self.http.post(url).json(status);
        if let Some(t) = &self.device_token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(|e| describe_http(&e))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!("{url}: HTTP {}", resp.status()))
        }
    }

    /// PollKill: fetch the kill list and react to a change without a registry round
    /// trip where possible. Returns a status when something was applied or failed.
    pub async fn poll_kill(&mut self) -> Option<Status> {
        let held = match self.refresh_kill().await {
            Ok(Some(held)) => held,
            Ok(None) => return None,
            Err(e) => {
                // A failed poll keeps the last accepted list.
                eprintln!("halod: {e}");
                return None;
            }
        };
        let new = self.kill.clone()?;
        match react(held.as_ref(), &new, self.state.assignment.as_ref()) {
            KillAction::Nothing => None,
            KillAction::ApplyRingRelease => match self.cache.clone() {
                Some(cached) => {
                    let mut status = self.base_status("kill-poll");
                    status.kill = self.kill_status();
                    status.ring = Some(cached.context.ring.clone());
                    status.ring_source = Some(cached.context.source.to_string());
                    self.apply_release(&mut status, &cached.ring, &cached.context, None, None);
                    Some(self.finish(status).await)
                }
                // No verified ring release in memory (a restart): a full cycle skips the
                // killed experiment just the same.
                None => Some(self.full_cycle_after_kill("kill-poll").await),
            },
            KillAction::FullCycle => Some(self.full_cycle_after_kill("kill-poll").await),
        }
    }

    async fn full_cycle_after_kill(&mut self, trigger: &str) -> Status {
        let status = self.base_status(trigger);
        self.cycle_after_kill(status).await
    }

    /// Whether the kill switch is configured, and its poll interval.
    pub fn kill_interval(&self) -> Option<Duration> {
        self.config.kill_switch.as_ref().map(|k| k.interval())
    }

    /// `halod run`: a full cycle every interval and PollKill every kill interval, on this
    /// one task, until `shutdown` resolves. `emit` receives every status.
    pub async fn run(
        &mut self,
        shutdown: impl std::future::Future<Output = ()>,
        emit: &(dyn Fn(&Status) + Sync),
    ) {
        use tokio::time::{Instant, MissedTickBehavior, interval, interval_at};
        let mut cycles = interval(self.config.interval());
        cycles.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // Without a kill switch the kill timer never fires.
        let kill_every = self
            .kill_interval()
            .unwrap_or(Duration::from_secs(86_400 * 365));
        let mut kills = interval_at(Instant::now() + kill_every, kill_every);
        kills.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let has_kill = self.kill_interval().is_some();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = cycles.tick() => {
                    let status = self.cycle().await;
                    emit(&status);
                }
                _ = kills.tick(), if has_kill => {
                    if let Some(status) = self.poll_kill().await {
                        emit(&status);
                    }
                }
            }
        }
    }
}

fn outcome_of(report: &ApplyReport) -> Outcome {
    if !report.complete() {
        Outcome::Refused
    } else if report.written.is_empty() && report.drift.is_empty() && report.removed.is_empty() {
        Outcome::Unchanged
    } else {
        Outcome::Applied
    }
}

fn fill(status: &mut Status, report: &ApplyReport) {
    let problems = |v: &[(String, String)]| {
        v.iter()
            .map(|(path, reason)| FileProblem {
                path: path.clone(),
                reason: reason.clone(),
            })
            .collect()
    };
    status.written = report.written.clone();
    status.unchanged = report.unchanged.clone();
    status.drift = report.drift.clone();
    status.removed = report.removed.clone();
    status.refused = problems(&report.refused);
    status.failed = problems(&report.failed);
}

/// A reqwest error with its causes (connection refused, timeout), never a header.
fn describe_http(e: &reqwest::Error) -> String {
    let mut message = if e.is_connect() {
        "cannot connect".to_string()
    } else if e.is_timeout() {
        "timed out".to_string()
    } else {
        "request failed".to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct() {
        assert_eq!(Outcome::Applied.exit_code(), 0);
        assert_eq!(Outcome::Unchanged.exit_code(), 0);
        assert_eq!(Outcome::Refused.exit_code(), 3);
        assert_eq!(Outcome::Failed.exit_code(), 4);
    }

    #[test]
    fn ring_names() {
        assert!(is_ring_name("canary"));
        assert!(is_ring_name("ring-2.b"));
        assert!(!is_ring_name("Canary"));
        assert!(!is_ring_name("../etc"));
        assert!(!is_ring_name(""));
    }
}
