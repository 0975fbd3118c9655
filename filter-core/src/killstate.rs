//! The kill-list state machine, pure: what a poll result or a list adopted from another
//! worker does to the list in force.
//!
//! The rules (ADR-0009): a list is accepted only if halo-policy's `killswitch::verify`
//! accepts it (signature with the kill public key, at most 10 minutes old, at most 60 s
//! ahead, strictly newer than the held one); any failure keeps the held list; a gateway
//! that never accepted one kills nothing. Workers share the accepted envelope through
//! Envoy's shared data; [`KillState::adopt`] re-checks its signature (not its age: it
//! was fresh when the first worker accepted it) and takes it only if newer.

use std::sync::Arc;

use halo_policy::Snapshot;
use halo_policy::killswitch::{self, KillList, KillListError};

use crate::config::Config;
use crate::host::{Level, Telemetry};
use crate::metrics::Counter;

/// The outcome of one poll, named as in the `halo.killswitch.fetch` metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchOutcome {
    Accepted,
    /// The server sent the list already held (byte for byte).
    Unchanged,
    /// Non-200 answer, or no answer.
    HttpError,
    Stale,
    Future,
    Replayed,
    BadSignature,
    Malformed,
}

impl FetchOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            FetchOutcome::Accepted => "accepted",
            FetchOutcome::Unchanged => "unchanged",
            FetchOutcome::HttpError => "http_error",
            FetchOutcome::Stale => "stale",
            FetchOutcome::Future => "future",
            FetchOutcome::Replayed => "replayed",
            FetchOutcome::BadSignature => "bad_signature",
            FetchOutcome::Malformed => "malformed",
        }
    }

    fn of(err: &KillListError) -> FetchOutcome {
        match err {
            KillListError::Stale { .. } => FetchOutcome::Stale,
            KillListError::Future { .. } => FetchOutcome::Future,
            KillListError::NotNewer { .. } => FetchOutcome::Replayed,
            KillListError::BadSignature => FetchOutcome::BadSignature,
            _ => FetchOutcome::Malformed,
        }
    }
}

/// The list in force and the snapshot it produces.
#[derive(Debug, Clone)]
pub struct KillState {
    held: Option<KillList>,
}

impl KillState {
    pub fn new() -> KillState {
        KillState { held: None }
    }

    /// The state a filter starts with: the kill list pushed with its configuration,
    /// verified and applied exactly as a polled one (signature, freshness), when there is
    /// one and the key is usable; the poll keeps running as the fallback. The outcome is
    /// `None` when nothing was pushed.
    pub fn at_start(cfg: &Config, now_unix: i64) -> (KillState, Option<FetchOutcome>) {
        let mut kill = KillState::new();
        let pushed = cfg
            .kill_list
            .as_ref()
            .zip(cfg.kill_switch.as_ref().and_then(|k| k.key.as_ref().ok()));
        let outcome =
            pushed.map(|(envelope, key)| kill.on_fetch(Some(200), envelope, key, now_unix));
        (kill, outcome)
    }

    pub fn held(&self) -> Option<&KillList> {
        self.held.as_ref()
    }

    /// A poll's answer: HTTP status (`None` when the call failed) and body.
    pub fn on_fetch(
        &mut self,
        status: Option<u16>,
        body: &[u8],
        key: &ed25519_compact::PublicKey,
        now_unix: i64,
    ) -> FetchOutcome {
        if status != Some(200) {
            return FetchOutcome::HttpError;
        }
        if self.held.as_ref().is_some_and(|h| h.envelope() == body) {
            return FetchOutcome::Unchanged;
        }
        match killswitch::verify(body, key, now_unix, self.held.as_ref()) {
            Ok(list) => {
                self.held = Some(list);
                FetchOutcome::Accepted
            }
            Err(e) => FetchOutcome::of(&e),
        }
    }

    /// An envelope another worker accepted (from shared data). Returns whether it changed
    /// the list in force.
    pub fn adopt(&mut self, envelope: &[u8], key: &ed25519_compact::PublicKey) -> bool {
        if self.held.as_ref().is_some_and(|h| h.envelope() == envelope) {
            return false;
        }
        let Ok(list) = killswitch::restore(envelope, key) else {
            return false;
        };
        if self
            .held
            .as_ref()
            .is_some_and(|h| list.issued_at() <= h.issued_at())
        {
            return false;
        }
        self.held = Some(list);
        true
    }

    /// The policy with the held list applied (the policy itself when none is held).
    pub fn effective(&self, base: &Snapshot) -> Snapshot {
        match &self.held {
            Some(list) => list.apply(base),
            None => base.clone(),
        }
    }
}

/// The kill list in force for one filter configuration and the snapshot it leaves, with
/// what each outcome logs and counts: the configure and poll-answer steps of both builds.
#[derive(Debug, Clone)]
pub struct Enforced {
    kill: KillState,
    effective: Arc<Snapshot>,
}

impl Enforced {
    /// A filter configuration starts: its start warnings logged, the pushed list (if any)
    /// applied, and its outcome counted (and logged when refused).
    pub fn start(cfg: &Config, now_unix: i64, t: &impl Telemetry) -> Enforced {
        for warning in cfg.start_warnings() {
            t.log(Level::Error, &warning);
        }
        let (kill, pushed) = KillState::at_start(cfg, now_unix);
        if let Some(outcome) = pushed {
            if outcome != FetchOutcome::Accepted {
                t.log(
                    Level::Error,
                    &format!("halo: pushed kill list refused: {}", outcome.as_str()),
                );
            }
            t.count(Counter::KillswitchFetch {
                outcome: outcome.as_str(),
            });
        }
        Enforced {
            effective: Arc::new(kill.effective(&cfg.snapshot)),
            kill,
        }
    }

    /// The snapshot in force.
    pub fn effective(&self) -> &Arc<Snapshot> {
        &self.effective
    }

    /// The list in force.
    pub fn held(&self) -> Option<&KillList> {
        self.kill.held()
    }

    /// A poll's answer (`status` is `None` when the call failed): verified, applied when
    /// accepted, counted, and logged when refused (the outcome only: never the body or the
    /// token). Returns whether the snapshot in force changed.
    pub fn on_poll_answer(
        &mut self,
        cfg: &Config,
        status: Option<u16>,
        body: &[u8],
        now_unix: i64,
        t: &impl Telemetry,
    ) -> bool {
        let Some(Ok(key)) = cfg.kill_switch.as_ref().map(|k| &k.key) else {
            return false;
        };
        let outcome = self.kill.on_fetch(status, body, key, now_unix);
        if outcome != FetchOutcome::Accepted && outcome != FetchOutcome::Unchanged {
            t.log(
                Level::Warn,
                &format!(
                    "halo: kill list poll refused: {}; keeping the list in force",
                    outcome.as_str()
                ),
            );
        }
        t.count(Counter::KillswitchFetch {
            outcome: outcome.as_str(),
        });
        if outcome != FetchOutcome::Accepted {
            return false;
        }
        self.effective = Arc::new(self.kill.effective(&cfg.snapshot));
        true
    }

    /// An envelope another worker accepted ([`KillState::adopt`]). Returns whether the
    /// snapshot in force changed.
    pub fn adopt(&mut self, cfg: &Config, envelope: &[u8]) -> bool {
        let Some(Ok(key)) = cfg.kill_switch.as_ref().map(|k| &k.key) else {
            return false;
        };
        if !self.kill.adopt(envelope, key) {
            return false;
        }
        self.effective = Arc::new(self.kill.effective(&cfg.snapshot));
        true
    }
}

impl Default for KillState {
    fn default() -> Self {
        KillState::new()
    }
}
