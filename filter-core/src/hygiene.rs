//! Header hygiene: which client headers never reach an upstream, and the gateway's stamps.
//!
//! Hygiene runs after the decision; that is safe because the decision never read a client
//! x-halo-* header (it reads only what Envoy verified, or the trusted proxy's header).

use crate::config::Config;

/// Client credentials, removed unless forwardAuth: the developer's IdP token (sent as a
/// bearer or as Gemini CLI's API key) must never reach a provider.
pub const CREDENTIAL_HEADERS: [&str; 5] = [
    "authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "proxy-authorization",
];

/// Every header of the gateway's own namespace.
pub const HALO_PREFIX: &str = "x-halo-";

pub const RING: &str = "x-halo-ring";
pub const RELEASE: &str = "x-halo-release";
pub const EXPERIMENT: &str = "x-halo-experiment";
pub const VARIANT: &str = "x-halo-variant";
pub const KILLSWITCH: &str = "x-halo-killswitch";

/// The value of [`KILLSWITCH`] when the kill-switch key is unusable.
pub const KILLSWITCH_MISCONFIGURED: &str = "misconfigured";

/// The names (lowercase, deduplicated, in first-seen order) of the client headers to
/// remove before the request goes upstream.
pub fn removals(cfg: &Config, headers: &[(String, String)]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |name: &str| {
        if !out.iter().any(|n| n == name) {
            out.push(name.to_string());
        }
    };
    for (name, _) in headers {
        // Envoy hands header names lowercase already: no copy unless one is not.
        let name: std::borrow::Cow<'_, str> = if name.bytes().any(|b| b.is_ascii_uppercase()) {
            name.to_ascii_lowercase().into()
        } else {
            name.as_str().into()
        };
        let identity = cfg.identity.identity_header.as_deref() == Some(&*name)
            || cfg.identity.groups_header.as_deref() == Some(&*name);
        let credential = !cfg.forward_auth && CREDENTIAL_HEADERS.contains(&&*name);
        if name.starts_with(HALO_PREFIX) || identity || credential {
            push(&name);
        }
    }
    // The route header is always cleared, present or not, before the filter sets its own.
    push(&cfg.route_header);
    out
}

/// Of [`removals`], the headers the filter must actually remove once it knows its
/// `stamps`: a stamp replaces a single client value anyway, so that one costs no call.
/// `sent` is the request's headers as read.
pub fn to_remove<'a>(
    removals: &'a [String],
    sent: &'a [(String, String)],
    stamps: &'a [(String, String)],
) -> impl Iterator<Item = &'a str> + 'a {
    removals
        .iter()
        .filter(move |name| {
            let stamped = stamps.iter().any(|(stamp, _)| stamp == *name);
            let copies = sent.iter().filter(|(n, _)| n == *name).count();
            !(stamped && copies <= 1)
        })
        .map(String::as_str)
}

/// Remove the `key` query parameter (Gemini's API key, here the developer's token) from a
/// path; other parameters keep their order and spelling.
pub fn strip_key_param(path: &str) -> String {
    let Some((base, query)) = path.split_once('?') else {
        return path.to_string();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| p.split_once('=').map_or(*p, |(k, _)| k) != "key")
        .collect();
    if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_param_is_removed_and_the_rest_kept() {
        assert_eq!(strip_key_param("/a?key=t0k&alt=sse"), "/a?alt=sse");
        assert_eq!(strip_key_param("/a?alt=sse&key=t"), "/a?alt=sse");
        assert_eq!(strip_key_param("/a?key=t"), "/a");
        assert_eq!(strip_key_param("/a?keys=1"), "/a?keys=1");
        assert_eq!(strip_key_param("/a"), "/a");
    }
}
