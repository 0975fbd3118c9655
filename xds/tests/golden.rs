//! The example policy's xDS resources: deterministic (equal bytes, equal version) and
//! complete. The plan they are emitted from is golden-tested in halo-envoy-config
//! (`envoy-config/tests/golden.rs`).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use halo_xds::{GatewaySettings, plan, snapshot_of, type_url};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xds lives under the workspace root")
        .to_path_buf()
}

fn acme() -> halo_policy::Snapshot {
    let org =
        halo_policy::load::load_dir(&root().join("examples/acme-corp")).expect("example loads");
    halo_policy::compile(&org)
}

#[test]
fn acme_corp_translation_is_deterministic_and_complete() {
    let settings = GatewaySettings::default();
    let a = snapshot_of(&acme(), &settings).expect("translates");
    let b = snapshot_of(&acme(), &settings).expect("translates");
    assert_eq!(a.version, b.version);
    assert_eq!(a.resources, b.resources);
    let plan = plan(&acme(), &settings).expect("translates");
    let clusters = &a.resources[type_url::CLUSTER];
    // Targets, aggregates and the issuer's JWKS cluster (acme-corp names an issuer).
    assert!(plan.listener.jwks.is_some());
    assert_eq!(
        clusters.len(),
        plan.targets.len() + plan.aggregates.len() + 1
    );
    // The halo filter's configuration travels by ECDS.
    assert_eq!(a.resources[type_url::EXTENSION_CONFIG].len(), 1);
    // Every aggregate lists only sub-clusters that exist, and every alias has `<alias>-0`.
    let names: std::collections::BTreeSet<&str> =
        plan.targets.iter().map(|t| t.name.as_str()).collect();
    for agg in &plan.aggregates {
        assert!(!agg.clusters.is_empty());
        assert!(
            agg.clusters.iter().all(|c| names.contains(c.as_str())),
            "{}",
            agg.name
        );
    }
    for alias in acme().models.keys() {
        assert!(
            plan.aggregates
                .iter()
                .any(|a| a.name == format!("{alias}-0"))
        );
    }
    assert_eq!(a.resources[type_url::LISTENER].len(), 1);
    assert_eq!(a.resources[type_url::ROUTE].len(), 1);
    // A settings change is a new version even when the policy is the same.
    let other = GatewaySettings {
        max_attempts: 2,
        ..GatewaySettings::default()
    };
    assert_ne!(
        snapshot_of(&acme(), &other).expect("translates").version,
        a.version
    );
}
