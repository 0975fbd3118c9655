//! The signed kill list (ADR-0009): the one control channel that changes routing without
//! a policy merge, so it can only move traffic back to control.
//!
//! Wire format, as served by halo-server and read by the filter and halod:
//!
//! ```text
//! {"payload": {"version": 7, "experiments": ["a"], "toggles": ["t"], "issuedAt": "2026-09-30T12:00:00Z"},
//!  "signature": "<standard base64 of the 64-byte ed25519 signature>"}
//! ```
//!
//! The signature covers `"halo-killswitch-v1\n"` followed by the payload's raw bytes exactly
//! as they appear in the envelope. Verification reads those bytes through
//! [`serde_json::value::RawValue`], so it never depends on how anyone re-serializes JSON,
//! and the prefix keeps a kill-key signature from meaning anything else (a release or
//! ring pointer) and another key's statements from meaning a kill list.
//!
//! [`verify`] is pure (the caller passes `now`) and builds for wasm32. Accepted lists are
//! [`KillList`] values; there is no other way to construct one, so holding a `KillList`
//! means its signature was checked. [`sign`] (feature `sign`) is the server side.

use std::collections::BTreeSet;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use time::OffsetDateTime;

use crate::snapshot::Snapshot;
use crate::types::ExperimentStatus;

/// Domain-separation prefix of every kill-list signature.
pub const SIGNING_PREFIX: &[u8] = b"halo-killswitch-v1\n";

/// A list is accepted while `now - issuedAt` is at most this (ADR-0009: "no more than
/// 10 minutes old"), so a replayed old response cannot un-kill.
pub const MAX_AGE_SECS: i64 = 600;

/// A list is accepted while `issuedAt - now` is at most this (clock skew allowance).
pub const MAX_FUTURE_SECS: i64 = 60;

const NANOS_PER_SEC: i128 = 1_000_000_000;

/// The signed statement: which experiments and traffic toggles are killed, as of when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KillPayload {
    /// The server's counter; informational (ordering is by `issued_at`).
    pub version: u64,
    /// Killed experiments, by name.
    pub experiments: BTreeSet<String>,
    /// Killed traffic toggles, by name. Optional on the wire because ADR-0009's first
    /// payload had none; an absent list kills no toggle.
    #[serde(default)]
    pub toggles: BTreeSet<String>,
    /// When the server issued the list; RFC 3339 in UTC on the wire.
    #[serde(with = "rfc3339_utc")]
    pub issued_at: OffsetDateTime,
}

/// Why an envelope was refused. Every refusal keeps the previously held list in force.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KillListError {
    #[error(
        "kill list envelope is malformed: {0} (expected {{\"payload\": {{...}}, \"signature\": \"<base64>\"}})"
    )]
    MalformedEnvelope(String),
    #[error("kill list signature is not standard base64 of a 64-byte ed25519 signature")]
    MalformedSignature,
    #[error(
        "kill list signature does not verify with the kill-switch public key (signed by another key, tampered with, or not a kill list)"
    )]
    BadSignature,
    #[error("kill list payload is malformed: {0}")]
    MalformedPayload(String),
    #[error(
        "kill list is stale: issued at {issued_at}, {age_secs} s ago (at most {MAX_AGE_SECS} s is accepted)"
    )]
    Stale { issued_at: String, age_secs: i64 },
    #[error(
        "kill list is issued in the future: {issued_at}, {ahead_secs} s ahead (at most {MAX_FUTURE_SECS} s is accepted; check the clocks)"
    )]
    Future { issued_at: String, ahead_secs: i64 },
    #[error(
        "kill list issued at {issued_at} is not newer than the held list issued at {held_issued_at} (replayed or out of order)"
    )]
    NotNewer {
        issued_at: String,
        held_issued_at: String,
    },
    #[error("cannot encode the kill list payload: {0}")]
    Encode(String),
}

/// A kill list whose signature has been verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillList {
    payload: KillPayload,
    /// The envelope it was accepted from, so a holder can persist and later [`restore`] it.
    envelope: Vec<u8>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<'a> {
    #[serde(borrow)]
    payload: &'a RawValue,
    signature: String,
}

/// Verify an envelope fetched now and decide whether it replaces `held`.
///
/// Accepted only if it decodes strictly, its signature verifies with `key` over
/// `"halo-killswitch-v1\n"` + the raw payload bytes, its `issuedAt` is at most
/// [`MAX_AGE_SECS`] old and at most [`MAX_FUTURE_SECS`] ahead of `now_unix`, and it is
/// strictly newer than `held`'s `issuedAt`. On any error the caller keeps `held`.
pub fn verify(
    envelope: &[u8],
    key: &ed25519_compact::PublicKey,
    now_unix: i64,
    held: Option<&KillList>,
) -> Result<KillList, KillListError> {
    let list = restore(envelope, key)?;
    let issued = list.payload.issued_at.unix_timestamp_nanos();
    let now = i128::from(now_unix) * NANOS_PER_SEC;
    if now - issued > i128::from(MAX_AGE_SECS) * NANOS_PER_SEC {
        return Err(KillListError::Stale {
            issued_at: list.issued_at_string(),
            age_secs: secs_floor(now - issued),
        });
    }
    if issued - now > i128::from(MAX_FUTURE_SECS) * NANOS_PER_SEC {
        return Err(KillListError::Future {
            issued_at: list.issued_at_string(),
            ahead_secs: secs_floor(issued - now),
        });
    }
    if let Some(held) = held
        && list.payload.issued_at <= held.payload.issued_at
    {
        return Err(KillListError::NotNewer {
            issued_at: list.issued_at_string(),
            held_issued_at: held.issued_at_string(),
        });
    }
    Ok(list)
}

/// Re-read a list that was accepted earlier (for example persisted by halod across a
/// restart): strict decoding and the signature are checked, freshness is not, because the
/// list was fresh when accepted and kills never expire. Pass the result as `held` to
/// [`verify`] so an older envelope cannot replace it.
pub fn restore(
    envelope: &[u8],
    key: &ed25519_compact::PublicKey,
) -> Result<KillList, KillListError> {
    let env: Envelope<'_> = decode_strict(envelope).map_err(KillListError::MalformedEnvelope)?;
    let raw = env.payload.get();
    // serde would also read a struct from a JSON array; the wire format is an object.
    if !raw.starts_with('{') {
        return Err(KillListError::MalformedEnvelope(
            "payload is not a JSON object".to_string(),
        ));
    }
    let sig_bytes = base64::engine::general_purpose::STANDARD
        .decode(env.signature.as_bytes())
        .map_err(|_| KillListError::MalformedSignature)?;
    let signature = ed25519_compact::Signature::from_slice(&sig_bytes)
        .map_err(|_| KillListError::MalformedSignature)?;
    // Check the signature before interpreting the payload: nothing unsigned is trusted.
    key.verify(signed_message(raw.as_bytes()), &signature)
        .map_err(|_| KillListError::BadSignature)?;
    let payload: KillPayload =
        decode_strict(raw.as_bytes()).map_err(KillListError::MalformedPayload)?;
    Ok(KillList {
        payload,
        envelope: envelope.to_vec(),
    })
}

/// Sign `payload` with the kill-switch key and return the envelope bytes.
///
/// The payload is serialized once and those exact bytes are both signed and embedded, so
/// the verifier sees what was signed. Fails only if `issued_at` cannot be written as
/// RFC 3339 (a year outside 0..=9999).
#[cfg(feature = "sign")]
pub fn sign(
    payload: &KillPayload,
    key: &ed25519_dalek::SigningKey,
) -> Result<Vec<u8>, KillListError> {
    use ed25519_dalek::Signer as _;

    let raw = serde_json::to_string(payload).map_err(|e| KillListError::Encode(e.to_string()))?;
    let signature = key.sign(&signed_message(raw.as_bytes()));
    let signature = base64::engine::general_purpose::STANDARD.encode(signature.to_bytes());
    // Built by hand so the payload bytes are embedded verbatim; base64 needs no escaping.
    Ok(format!(r#"{{"payload":{raw},"signature":"{signature}"}}"#).into_bytes())
}

fn signed_message(raw_payload: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(SIGNING_PREFIX.len() + raw_payload.len());
    message.extend_from_slice(SIGNING_PREFIX);
    message.extend_from_slice(raw_payload);
    message
}

fn decode_strict<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        format!("{path}: {}", e.into_inner())
    })?;
    // Trailing bytes after the document are refused, not ignored.
    de.end().map_err(|e| e.to_string())?;
    Ok(value)
}

fn secs_floor(nanos: i128) -> i64 {
    i64::try_from(nanos.div_euclid(NANOS_PER_SEC)).unwrap_or(i64::MAX)
}

impl KillList {
    /// The verified payload.
    pub fn payload(&self) -> &KillPayload {
        &self.payload
    }

    /// The envelope bytes this list was accepted from (for persisting and [`restore`]).
    pub fn envelope(&self) -> &[u8] {
        &self.envelope
    }

    pub fn version(&self) -> u64 {
        self.payload.version
    }

    pub fn issued_at(&self) -> OffsetDateTime {
        self.payload.issued_at
    }

    /// `issuedAt` in whole unix seconds (rounded down).
    pub fn issued_at_unix(&self) -> i64 {
        self.payload.issued_at.unix_timestamp()
    }

    /// Killed experiment names, sorted.
    pub fn experiments(&self) -> &BTreeSet<String> {
        &self.payload.experiments
    }

    /// Killed traffic toggle names, sorted.
    pub fn toggles(&self) -> &BTreeSet<String> {
        &self.payload.toggles
    }

    pub fn is_experiment_killed(&self, name: &str) -> bool {
        self.payload.experiments.contains(name)
    }

    pub fn is_toggle_killed(&self, name: &str) -> bool {
        self.payload.toggles.contains(name)
    }

    /// The snapshot with this list applied: every killed experiment `paused` (control
    /// routing, no mirroring, no experiment headers) and every killed traffic toggle
    /// removed. Nothing else changes, so a kill can only move traffic back to control.
    /// Names the snapshot does not have are ignored (the kill may target another gateway's
    /// policy or a client-axis experiment).
    pub fn apply(&self, snap: &Snapshot) -> Snapshot {
        let mut out = snap.clone();
        for experiment in &mut out.experiments {
            if self.is_experiment_killed(&experiment.name) {
                experiment.status = ExperimentStatus::Paused;
            }
        }
        out.toggles
            .retain(|toggle| !self.is_toggle_killed(&toggle.name));
        out
    }

    fn issued_at_string(&self) -> String {
        rfc3339_utc::format(self.payload.issued_at)
            .unwrap_or_else(|_| self.payload.issued_at.to_string())
    }
}

/// `issuedAt` as RFC 3339 in UTC: an offset other than zero is refused, so every party
/// reads the same instant from the same text.
mod rfc3339_utc {
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _, ser::Error as _};
    use time::{OffsetDateTime, UtcOffset, format_description::well_known::Rfc3339};

    pub fn format(t: OffsetDateTime) -> Result<String, time::error::Format> {
        t.to_offset(UtcOffset::UTC).format(&Rfc3339)
    }

    pub fn serialize<S: Serializer>(t: &OffsetDateTime, s: S) -> Result<S::Ok, S::Error> {
        let text = format(*t).map_err(|e| S::Error::custom(format!("issuedAt: {e}")))?;
        s.serialize_str(&text)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<OffsetDateTime, D::Error> {
        let text = String::deserialize(d)?;
        let t = OffsetDateTime::parse(&text, &Rfc3339).map_err(|e| {
            D::Error::custom(format!("issuedAt {text:?} is not an RFC 3339 time: {e}"))
        })?;
        if t.offset() != UtcOffset::UTC {
            return Err(D::Error::custom(format!(
                "issuedAt {text:?} must be in UTC (ending in Z)"
            )));
        }
        Ok(t)
    }
}
