//! Demo mode's explicit changes to the served policy. The policy directory is loaded and
//! validated as written; then, before translation, every upstream (also ones added by a
//! later edit) points at the demo provider without a credential, and the identity issuer
//! is the demo issuer. The files on disk are never touched, and halo-demo prints every
//! override at start ([`describe`]).

use std::sync::Arc;

use halo_policy::Snapshot;
use halo_xds::Transform;

/// Where demo mode sends traffic and trusts tokens from.
#[derive(Debug, Clone)]
pub struct Overrides {
    /// The demo provider's URL (`http://127.0.0.1:PORT`).
    pub provider_url: String,
    /// The demo issuer's URL, the `iss` tokens must carry.
    pub issuer_url: String,
}

impl Overrides {
    /// Apply the overrides to a compiled policy.
    pub fn apply(&self, mut snap: Snapshot) -> Snapshot {
        for upstream in snap.upstreams.values_mut() {
            upstream.url = self.provider_url.clone();
            upstream.credential = None;
        }
        if let Some(identity) = snap.identity.as_mut() {
            identity.issuer = self.issuer_url.clone();
        }
        snap
    }

    /// The transform halo-server's policy source applies on every load.
    pub fn transform(&self) -> Transform {
        let me = self.clone();
        Arc::new(move |snap| me.apply(snap))
    }

    /// One line per override, as written in `snap` (the policy before overrides).
    pub fn describe(&self, snap: &Snapshot) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(identity) = &snap.identity {
            lines.push(format!(
                "identity.issuer {} -> {} (demo issuer, key generated now)",
                identity.issuer, self.issuer_url
            ));
        }
        let width = snap.upstreams.keys().map(String::len).max().unwrap_or(0);
        for (name, u) in &snap.upstreams {
            let credential = if u.credential.is_some() {
                ", credential dropped"
            } else {
                ""
            };
            lines.push(format!(
                "upstream {name:width$} {} -> {} (demo provider{credential})",
                u.url, self.provider_url
            ));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Snapshot {
        let dir = halo_testkit::workspace_root().join("examples/acme-corp");
        halo_xds::source::load_policy(&dir).expect("the example policy is valid")
    }

    #[test]
    fn every_upstream_and_the_issuer_are_overridden_and_described() {
        let o = Overrides {
            provider_url: "http://127.0.0.1:1".into(),
            issuer_url: "http://127.0.0.1:2".into(),
        };
        let snap = example();
        let lines = o.describe(&snap);
        let done = o.apply(snap.clone());
        assert!(done.upstreams.values().all(|u| u.url == o.provider_url));
        assert!(done.upstreams.values().all(|u| u.credential.is_none()));
        assert_eq!(
            done.identity.as_ref().map(|i| i.issuer.as_str()),
            Some("http://127.0.0.1:2")
        );
        // Routes, rings and experiments are the policy's own.
        assert_eq!(done.models, snap.models);
        assert_eq!(done.experiments, snap.experiments);
        assert_eq!(lines.len(), snap.upstreams.len() + 1);
        assert!(
            lines
                .iter()
                .any(|l| l.contains("https://api.anthropic.com"))
        );
        assert!(lines.iter().any(|l| l.contains("credential dropped")));
    }
}
