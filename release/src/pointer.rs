//! Ring pointers: which release a ring (or one experiment variant's channel) runs.
//!
//! A pointer is its own OCI artifact under `ring-<r>.pointer` (see [`crate::names`]):
//! one layer holding the JSON [`Pointer`], signed over
//! [`crate::sign::pointer_statement`]. `seq` only grows: a new pointer takes
//! max(current + 1, unix now, recorded + 1), where *current* is the pointer in the
//! registry and *recorded* the last seq this publisher wrote (so a registry rolled back
//! or wiped cannot make a publisher reuse a seq). It expires 7 days after issue.
//!
//! [`check_pointer`] is halod's apply-loop step 3 minus the registry I/O: org, ring and
//! channel as expected, seq not below the last applied, the same digest when the seq is
//! unchanged, and not expired.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::names::Channel;

/// Pointer time to live.
pub const POINTER_TTL: time::Duration = time::Duration::days(7);
/// The largest pointer payload a reader accepts.
pub const MAX_POINTER_BYTES: u64 = 4096;

/// The signed pointer payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Pointer {
    pub org: String,
    pub ring: String,
    /// Set on a channel pointer: the experiment variant it serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<Channel>,
    /// The release digest, `sha256:` of the release tar.
    pub digest: String,
    /// The digest of the release's OCI manifest; halod fetches it by this digest.
    pub manifest: String,
    pub seq: u64,
    /// RFC 3339, UTC.
    pub issued_at: String,
    pub expires_at: String,
}

impl Pointer {
    /// The exact payload bytes (compact JSON, field order as declared).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn expires(&self) -> Option<OffsetDateTime> {
        OffsetDateTime::parse(&self.expires_at, &Rfc3339).ok()
    }
}

/// The seq of a new pointer.
pub fn next_seq(current: Option<u64>, now_unix: u64, recorded: Option<u64>) -> u64 {
    let mut seq = now_unix;
    if let Some(c) = current {
        seq = seq.max(c.saturating_add(1));
    }
    if let Some(r) = recorded {
        seq = seq.max(r.saturating_add(1));
    }
    seq
}

/// A new pointer issued at `now`.
#[allow(clippy::too_many_arguments)]
pub fn new_pointer(
    org: &str,
    ring: &str,
    channel: Option<Channel>,
    digest: &str,
    manifest: &str,
    seq: u64,
    now: OffsetDateTime,
) -> Pointer {
    let fmt = |t: OffsetDateTime| {
        t.replace_nanosecond(0)
            .unwrap_or(t)
            .format(&Rfc3339)
            .unwrap_or_default()
    };
    Pointer {
        org: org.to_string(),
        ring: ring.to_string(),
        channel,
        digest: digest.to_string(),
        manifest: manifest.to_string(),
        seq,
        issued_at: fmt(now),
        expires_at: fmt(now + POINTER_TTL),
    }
}

/// What a device last applied from this pointer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Applied {
    pub seq: u64,
    pub digest: String,
}

/// Why a pointer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PointerError {
    #[error("pointer {tag}: {reason}")]
    Refused { tag: String, reason: String },
}

/// halod's checks on a pointer whose signature already verified.
pub fn check_pointer(
    tag: &str,
    p: &Pointer,
    org: &str,
    ring: &str,
    channel: Option<&Channel>,
    last: Option<&Applied>,
    now: OffsetDateTime,
) -> Result<(), PointerError> {
    let refuse = |reason: String| PointerError::Refused {
        tag: tag.to_string(),
        reason,
    };
    if p.org != org {
        return Err(refuse(format!("org is {:?}, expected {org:?}", p.org)));
    }
    if p.ring != ring || p.channel.as_ref() != channel {
        return Err(refuse(format!(
            "names ring {:?} channel {:?}, expected ring {ring:?} channel {:?}",
            p.ring,
            p.channel.as_ref().map(ToString::to_string),
            channel.map(ToString::to_string)
        )));
    }
    if !halo_policy::validate::is_release_digest(&p.digest)
        || !halo_policy::validate::is_release_digest(&p.manifest)
    {
        return Err(refuse("digest or manifest is not sha256:<64 hex>".into()));
    }
    if let Some(last) = last {
        if p.seq < last.seq {
            return Err(refuse(format!(
                "seq {} is older than the last applied seq {} (rollback refused)",
                p.seq, last.seq
            )));
        }
        if p.seq == last.seq && p.digest != last.digest {
            return Err(refuse(format!(
                "seq {} is unchanged but names another release",
                p.seq
            )));
        }
    }
    match p.expires() {
        Some(exp) if exp > now => Ok(()),
        Some(_) => Err(refuse(format!("expired at {}", p.expires_at))),
        None => Err(refuse(format!(
            "expiresAt {:?} is not RFC 3339",
            p.expires_at
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_is_the_max_of_the_three() {
        assert_eq!(next_seq(None, 1000, None), 1000);
        assert_eq!(next_seq(Some(5000), 1000, None), 5001);
        assert_eq!(next_seq(Some(5000), 1000, Some(7000)), 7001);
        assert_eq!(next_seq(Some(999), 1000, Some(3)), 1000);
        assert_eq!(next_seq(Some(u64::MAX), 1, None), u64::MAX);
    }

    #[test]
    fn checks() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let d = format!("sha256:{}", "a".repeat(64));
        let p = new_pointer("acme", "canary", None, &d, &d, 10, now);
        assert_eq!(p.expires().unwrap() - now, POINTER_TTL);
        assert!(check_pointer("t", &p, "acme", "canary", None, None, now).is_ok());
        assert!(check_pointer("t", &p, "other", "canary", None, None, now).is_err());
        assert!(check_pointer("t", &p, "acme", "early", None, None, now).is_err());
        let last = Applied {
            seq: 11,
            digest: d.clone(),
        };
        let err = check_pointer("t", &p, "acme", "canary", None, Some(&last), now).unwrap_err();
        assert!(err.to_string().contains("rollback refused"));
        let last = Applied {
            seq: 10,
            digest: format!("sha256:{}", "b".repeat(64)),
        };
        assert!(check_pointer("t", &p, "acme", "canary", None, Some(&last), now).is_err());
        let later = now + POINTER_TTL + time::Duration::seconds(1);
        assert!(check_pointer("t", &p, "acme", "canary", None, None, later).is_err());
        // Strict decoding: an unknown field is refused.
        let mut v: serde_json::Value = serde_json::from_slice(&p.to_bytes()).unwrap();
        v["extra"] = serde_json::json!(1);
        assert!(serde_json::from_value::<Pointer>(v).is_err());
    }
}
