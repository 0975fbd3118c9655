//! halo-killswitch: the kill switch, server side (ADR-0009): the append-only kill log, the current kill
//! state, and the signed list gateways and devices fetch.
//!
//! State is a fold over `killswitch.jsonl`: a kill record adds the name, an unkill record
//! removes it, the last record per experiment and per toggle wins. A change is appended
//! (fsynced) before it is applied in memory, so no reply reports a kill the log lacks.
//! Other processes may append too (`halo controller run` writes kills into the data dir
//! halo-server serves): every record is written by [`append_record`], under the store's
//! lock, and the server follows the log ([`KillSwitch::spawn_follower`]).
//!
//! Subscribers (the xDS server, which pushes kills to the Envoys it feeds) call
//! [`KillSwitch::subscribe`]: a `watch` channel holding the current signed envelope,
//! replaced at once on every change and re-signed every [`RESIGN_EVERY`] so the held
//! envelope is always fresh enough for a verifier's 10-minute window.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use halo_policy::killswitch::{KillPayload, sign};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::{Mutex, watch};

use halo_store::{Log, LogStore, StoreError};

/// The actor the kill log and the audit log name for the controller's kills.
pub const CONTROLLER_ACTOR: &str = "halo-controller";

/// How often the published envelope is re-signed without a change.
pub const RESIGN_EVERY: Duration = Duration::from_secs(120);

/// How often the kill log is read again for records another process appended.
pub const FOLLOW_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Kill,
    Unkill,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Experiment,
    Toggle,
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Experiment => "experiment",
            Target::Toggle => "toggle",
        }
    }
}

/// One line of killswitch.jsonl: who, when, why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KillRecord {
    /// 1, 2, 3, ... in log order; the last one is the list's version.
    pub seq: u64,
    /// RFC 3339, UTC.
    pub at: String,
    pub actor: String,
    pub action: Action,
    pub target: Target,
    pub name: String,
    pub reason: String,
}

/// Who killed a name, when and why (the record that is in force).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KillEntry {
    pub name: String,
    pub killed_at: String,
    pub by: String,
    pub reason: String,
}

/// The current kill state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KillState {
    pub version: u64,
    pub experiments: BTreeMap<String, KillEntry>,
    pub toggles: BTreeMap<String, KillEntry>,
}

impl KillState {
    fn apply(&mut self, rec: &KillRecord) {
        self.version = rec.seq;
        let map = match rec.target {
            Target::Experiment => &mut self.experiments,
            Target::Toggle => &mut self.toggles,
        };
        match rec.action {
            Action::Kill => {
                map.insert(
                    rec.name.clone(),
                    KillEntry {
                        name: rec.name.clone(),
                        killed_at: rec.at.clone(),
                        by: rec.actor.clone(),
                        reason: rec.reason.clone(),
                    },
                );
            }
            Action::Unkill => {
                map.remove(&rec.name);
            }
        }
    }

    pub fn is_killed(&self, target: Target, name: &str) -> bool {
        match target {
            Target::Experiment => self.experiments.contains_key(name),
            Target::Toggle => self.toggles.contains_key(name),
        }
    }

    fn payload(&self, issued_at: OffsetDateTime) -> KillPayload {
        KillPayload {
            version: self.version,
            experiments: self.experiments.keys().cloned().collect(),
            toggles: self.toggles.keys().cloned().collect(),
            issued_at,
        }
    }
}

/// A signed kill list as served: the envelope bytes `{payload, signature}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedList {
    pub version: u64,
    pub issued_at: OffsetDateTime,
    pub envelope: Arc<[u8]>,
}

#[derive(Debug, thiserror::Error)]
pub enum KillError {
    #[error("cannot append to the kill log: {0}")]
    Log(#[source] StoreError),
    #[error("cannot sign the kill list: {0}")]
    Sign(String),
}

/// Outcome of a kill or unkill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Appended, applied and audited.
    Done { version: u64 },
    /// Appended and applied, but the audit append failed: a kill stays applied (fail
    /// safe); an unkill was reverted by a new kill record (`reverted`), or the revert
    /// itself failed (`reverted == false`).
    AuditFailed {
        version: u64,
        reverted: bool,
        audit_error: String,
    },
}

/// The kill switch: log, state and the signed list.
pub struct KillSwitch {
    store: Arc<dyn LogStore>,
    key: SigningKey,
    state: Mutex<KillState>,
    // Each envelope's issuedAt is strictly after the previous one, even if the clock
    // steps back, so verifiers never refuse a new list as a replay.
    last_issued: std::sync::Mutex<OffsetDateTime>,
    tx: watch::Sender<SignedList>,
}

impl std::fmt::Debug for KillSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KillSwitch").finish_non_exhaustive()
    }
}

/// Read the kill log into a state (strictly: an undecodable record is an error).
pub fn load_state(store: &dyn LogStore) -> Result<KillState, StoreError> {
    fold(&store.read_all(Log::Killswitch)?)
}

fn fold(records: &[serde_json::Value]) -> Result<KillState, StoreError> {
    let mut state = KillState::default();
    for (i, value) in records.iter().enumerate() {
        let rec = KillRecord::deserialize(value).map_err(|e| StoreError::Corrupt {
            path: Log::Killswitch.file_name().to_string(),
            line: i + 1,
            message: e.to_string(),
        })?;
        state.apply(&rec);
    }
    Ok(state)
}

/// Append the record `make` builds for the next sequence number, reading the log and
/// appending under the store's lock, and return it with the state of the whole log
/// (records other processes appended included). The one way a kill record is written:
/// by halo-server's switch, and by `halo controller run` into the data dir a halo-server
/// serves.
pub fn append_record(
    store: &dyn LogStore,
    make: impl FnOnce(u64) -> KillRecord,
) -> Result<(KillRecord, KillState), StoreError> {
    let mut make = Some(make);
    let mut made = None;
    store.append_next(Log::Killswitch, &mut |records| {
        let state = fold(records)?;
        let make = make
            .take()
            .ok_or_else(|| StoreError::Unavailable("a kill record is made once".into()))?;
        let rec = make(state.version + 1);
        let value = serde_json::to_value(&rec).map_err(|e| StoreError::Encode(e.to_string()))?;
        made = Some((rec, state));
        Ok(value)
    })?;
    let (rec, mut state) =
        made.ok_or_else(|| StoreError::Unavailable("the kill log append made no record".into()))?;
    state.apply(&rec);
    Ok((rec, state))
}

pub fn now_rfc3339() -> String {
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

impl KillSwitch {
    /// Load the kill log and sign the first envelope.
    pub fn open(store: Arc<dyn LogStore>, key: SigningKey) -> Result<Arc<KillSwitch>, KillError> {
        let state = load_state(store.as_ref()).map_err(KillError::Log)?;
        let now = OffsetDateTime::now_utc();
        let first = sign_state(&state, &key, now)?;
        let (tx, _) = watch::channel(first);
        Ok(Arc::new(KillSwitch {
            store,
            key,
            state: Mutex::new(state),
            last_issued: std::sync::Mutex::new(now),
            tx,
        }))
    }

    /// The current signed envelope, updated on every change and re-signed periodically.
    pub fn subscribe(&self) -> watch::Receiver<SignedList> {
        self.tx.subscribe()
    }

    pub async fn state(&self) -> KillState {
        self.state.lock().await.clone()
    }

    /// A freshly signed envelope of the current state (what GET killswitch serves).
    pub async fn sign_now(&self) -> Result<SignedList, KillError> {
        let state = self.state.lock().await;
        sign_state(&state, &self.key, self.next_issued_at())
    }

    fn next_issued_at(&self) -> OffsetDateTime {
        let mut last = self.last_issued.lock().unwrap_or_else(|p| p.into_inner());
        let now = OffsetDateTime::now_utc();
        let next = if now > *last {
            now
        } else {
            *last + time::Duration::microseconds(1)
        };
        *last = next;
        next
    }

    fn publish(&self, state: &KillState) {
        match sign_state(state, &self.key, self.next_issued_at()) {
            Ok(signed) => {
                self.tx.send_replace(signed);
            }
            Err(e) => tracing::error!(error = %e, "cannot sign the kill list"),
        }
    }

    /// Re-sign the published envelope every [`RESIGN_EVERY`] until the switch is dropped.
    pub fn spawn_resigner(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RESIGN_EVERY);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(ks) = weak.upgrade() else { return };
                let state = ks.state.lock().await.clone();
                ks.publish(&state);
            }
        });
    }

    /// Kill or unkill `name`, append-then-apply, then audit with `audit`, following
    /// ADR-0009's fail-closed rule. Changes are serialized: two concurrent kills of the
    /// same name both land in the log, in the order they took the lock.
    pub async fn change<F>(
        &self,
        actor: &str,
        action: Action,
        target: Target,
        name: &str,
        reason: &str,
        audit: F,
    ) -> Result<Change, KillError>
    where
        F: Fn(&KillRecord) -> Result<(), StoreError>,
    {
        let mut state = self.state.lock().await;
        let (actor_owned, name_owned, reason_owned) =
            (actor.to_string(), name.to_string(), reason.to_string());
        let (rec, fresh) = self
            .append(move |seq| KillRecord {
                seq,
                at: now_rfc3339(),
                actor: actor_owned,
                action,
                target,
                name: name_owned,
                reason: reason_owned,
            })
            .await?;
        *state = fresh;
        self.publish(&state);
        let audit_error = match audit(&rec) {
            Ok(()) => return Ok(Change::Done { version: rec.seq }),
            Err(e) => e.to_string(),
        };
        if action == Action::Kill {
            // Fail safe: the kill stays; an unaudited kill only moves traffic to control.
            return Ok(Change::AuditFailed {
                version: rec.seq,
                reverted: false,
                audit_error,
            });
        }
        // An unaudited unkill must not stand: re-kill with the reason that was in force.
        let (name_owned, reason) = (
            name.to_string(),
            format!("unkill by {actor} reverted: the audit log could not be written"),
        );
        let revert = self
            .append(move |seq| KillRecord {
                seq,
                at: now_rfc3339(),
                actor: "halo-server".to_string(),
                action: Action::Kill,
                target,
                name: name_owned,
                reason,
            })
            .await;
        let reverted = match revert {
            Ok((_, fresh)) => {
                *state = fresh;
                self.publish(&state);
                true
            }
            Err(e) => {
                tracing::error!(error = %e, target = target.as_str(), "cannot revert an unaudited unkill");
                false
            }
        };
        Ok(Change::AuditFailed {
            version: state.version,
            reverted,
            audit_error,
        })
    }

    async fn append(
        &self,
        make: impl FnOnce(u64) -> KillRecord + Send + 'static,
    ) -> Result<(KillRecord, KillState), KillError> {
        let store = Arc::clone(&self.store);
        // The file lock and fsync block; keep them off the async workers.
        tokio::task::spawn_blocking(move || append_record(store.as_ref(), make))
            .await
            .map_err(|e| KillError::Log(StoreError::Unavailable(e.to_string())))?
            .map_err(KillError::Log)
    }

    /// Follow the kill log: every `every`, fold it again and publish if it changed. Kills
    /// that `halo controller run` appends to this server's data dir (or, with a shared
    /// store, another replica) reach the signed list and the Envoys within `every`.
    pub fn spawn_follower(self: &Arc<Self>, every: Duration) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                tick.tick().await;
                let Some(ks) = weak.upgrade() else { return };
                let store = Arc::clone(&ks.store);
                let read = tokio::task::spawn_blocking(move || load_state(store.as_ref())).await;
                let fresh = match read {
                    Ok(Ok(fresh)) => fresh,
                    Ok(Err(e)) => {
                        // Keep serving what was last read; say so once per outage.
                        if !failing {
                            tracing::error!(error = %e, "cannot read the kill log; serving the last state read");
                        }
                        failing = true;
                        continue;
                    }
                    Err(_) => continue,
                };
                failing = false;
                let mut state = ks.state.lock().await;
                if fresh != *state {
                    tracing::info!(
                        version = fresh.version,
                        "the kill log changed outside this server; publishing it"
                    );
                    *state = fresh;
                    ks.publish(&state);
                }
            }
        });
    }
}

fn sign_state(
    state: &KillState,
    key: &SigningKey,
    issued_at: OffsetDateTime,
) -> Result<SignedList, KillError> {
    let envelope =
        sign(&state.payload(issued_at), key).map_err(|e| KillError::Sign(e.to_string()))?;
    Ok(SignedList {
        version: state.version,
        issued_at,
        envelope: envelope.into(),
    })
}

/// The audit record of a kill or unkill (an admin's or the controller's), appended to the
/// audit log of the store the kill log is in.
pub fn audit_kill(store: &dyn LogStore, rec: &KillRecord) -> Result<(), StoreError> {
    store.append(
        Log::Audit,
        &serde_json::json!({
            "at": now_rfc3339(),
            "actor": rec.actor,
            "action": rec.action,
            "target": rec.target,
            "name": rec.name,
            "reason": rec.reason,
            "seq": rec.seq,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use halo_store::MemoryStore;

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[7u8; 32])
    }

    #[tokio::test]
    async fn last_record_wins_and_subscribers_see_each_change() {
        let store = Arc::new(MemoryStore::default());
        let ks = KillSwitch::open(store.clone(), key()).unwrap();
        let mut rx = ks.subscribe();
        let ok = |_: &KillRecord| Ok(());
        ks.change("a", Action::Kill, Target::Experiment, "e1", "why", ok)
            .await
            .unwrap();
        assert!(rx.has_changed().unwrap());
        let signed = rx.borrow_and_update().clone();
        let pk = ed25519_compact::PublicKey::from_slice(key().verifying_key().as_bytes()).unwrap();
        let list = halo_policy::killswitch::verify(
            &signed.envelope,
            &pk,
            OffsetDateTime::now_utc().unix_timestamp(),
            None,
        )
        .unwrap();
        assert!(list.is_experiment_killed("e1"));
        ks.change("a", Action::Unkill, Target::Experiment, "e1", "fixed", ok)
            .await
            .unwrap();
        let state = load_state(store.as_ref()).unwrap();
        assert_eq!(state.version, 2);
        assert!(state.experiments.is_empty());
    }
}
