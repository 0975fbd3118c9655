//! Registry tags. One repository holds an org's releases; names never contain `_`
//! (policy names are `[a-z0-9.-]`, versions `[0-9A-Za-z.-]`), so `_` separates the parts
//! of a tag without ambiguity:
//! - ring release `v<version>_<ring>`, channel release `v<version>_<ring>_<experiment>_<variant>`;
//! - ring pointer `ring-<ring>.pointer`, channel pointer `ring-<ring>_<experiment>_<variant>.pointer`;
//! - informational tags `ring-<ring>` and `ring-<ring>_<experiment>_<variant>`, moved
//!   with each pointer to the release it names (never trusted: halod follows pointers).

use serde::{Deserialize, Serialize};

/// OCI tags are at most 128 characters.
pub const MAX_TAG_LEN: usize = 128;

/// One variant of a client-axis experiment: the release a device in that variant runs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Channel {
    pub experiment: String,
    pub variant: String,
}

impl std::fmt::Display for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.experiment, self.variant)
    }
}

fn suffix(channel: Option<&Channel>) -> String {
    channel.map_or(String::new(), |c| {
        format!("_{}_{}", c.experiment, c.variant)
    })
}

/// Whether `v` may be a release version: `[0-9A-Za-z][0-9A-Za-z.-]*`, at most 32 chars.
pub fn is_version(v: &str) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'.' || *c == b'-')
}

/// Why a tag cannot be formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    #[error(
        "release version {0:?} is not valid: use [0-9A-Za-z.-], starting with a letter or digit, at most 32 characters"
    )]
    Version(String),
    #[error(
        "tag {0:?} is longer than {MAX_TAG_LEN} characters: shorten the ring, experiment or variant names"
    )]
    TooLong(String),
}

fn checked(tag: String) -> Result<String, TagError> {
    if tag.len() > MAX_TAG_LEN {
        Err(TagError::TooLong(tag))
    } else {
        Ok(tag)
    }
}

/// The tag of a ring or channel release.
pub fn release_tag(
    version: &str,
    ring: &str,
    channel: Option<&Channel>,
) -> Result<String, TagError> {
    if !is_version(version) {
        return Err(TagError::Version(version.to_string()));
    }
    checked(format!("v{version}_{ring}{}", suffix(channel)))
}

/// The tag of a ring or channel pointer.
pub fn pointer_tag(ring: &str, channel: Option<&Channel>) -> Result<String, TagError> {
    checked(format!("ring-{ring}{}.pointer", suffix(channel)))
}

/// The informational tag moved with a pointer.
pub fn info_tag(ring: &str, channel: Option<&Channel>) -> Result<String, TagError> {
    checked(format!("ring-{ring}{}", suffix(channel)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags() {
        let c = Channel {
            experiment: "exp".into(),
            variant: "b".into(),
        };
        assert_eq!(
            release_tag("1.2.0", "canary", None).unwrap(),
            "v1.2.0_canary"
        );
        assert_eq!(
            release_tag("1.2.0", "canary", Some(&c)).unwrap(),
            "v1.2.0_canary_exp_b"
        );
        assert_eq!(pointer_tag("canary", None).unwrap(), "ring-canary.pointer");
        assert_eq!(
            pointer_tag("canary", Some(&c)).unwrap(),
            "ring-canary_exp_b.pointer"
        );
        assert_eq!(info_tag("canary", None).unwrap(), "ring-canary");
        assert!(release_tag("1_0", "canary", None).is_err());
        assert!(release_tag("", "canary", None).is_err());
        let long = "x".repeat(63);
        let c = Channel {
            experiment: long.clone(),
            variant: long,
        };
        assert!(matches!(
            pointer_tag("r", Some(&c)),
            Err(TagError::TooLong(_))
        ));
    }
}
