//! BuildRing over the acme-corp example: golden adapter output, determinism, the
//! channels of a client experiment, and CheckRendered refusing a bypass token.
//!
//! Golden files live in tests/golden/<ring>/<os>/<file name>; regenerate with
//! `UPDATE_GOLDEN=1 cargo test -p halo-release --test build` and review the diff.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use halo_release::adapters::Os;
use halo_release::build::{BuildError, build_ring};
use halo_release::check::CheckError;
use halo_release::pack;

fn acme() -> halo_policy::Org {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp");
    halo_policy::load::load_dir(&dir).expect("acme-corp loads")
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

#[test]
fn adapter_output_matches_golden_files() {
    let org = acme();
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut mismatches = Vec::new();
    for ring in ["canary"] {
        let build = build_ring(&org, ring).unwrap();
        let release = &build.ring;
        let mut names = Vec::new();
        for f in &release.manifest.files {
            let content = &release.blobs[&f.sha256];
            let golden = golden_dir()
                .join(ring)
                .join(f.os.as_str())
                .join(file_name(&f.path));
            names.push(golden.clone());
            if update {
                std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
                std::fs::write(&golden, content).unwrap();
            } else {
                match std::fs::read(&golden) {
                    Ok(want) if &want == content => {}
                    _ => mismatches.push(golden.display().to_string()),
                }
            }
        }
        let warnings = golden_dir().join(ring).join("warnings.txt");
        let text = release.manifest.warnings.join("\n") + "\n";
        if update {
            std::fs::write(&warnings, &text).unwrap();
        } else if std::fs::read_to_string(&warnings).ok().as_deref() != Some(text.as_str()) {
            mismatches.push(warnings.display().to_string());
        }
    }
    assert!(
        mismatches.is_empty(),
        "rendered output differs from (or lacks) golden files {mismatches:#?}; rerun with UPDATE_GOLDEN=1 and review"
    );
}

#[test]
fn same_policy_gives_byte_identical_releases() {
    let a = build_ring(&acme(), "canary").unwrap();
    let b = build_ring(&acme(), "canary").unwrap();
    assert_eq!(a, b);
    assert_eq!(a.ring.digest, pack::digest(&a.ring.tar));
    // The tar reads back strictly to the same manifest and blobs.
    let (manifest, blobs) = pack::unpack(&a.ring.tar).unwrap();
    assert_eq!(manifest, a.ring.manifest);
    assert_eq!(blobs, a.ring.blobs);
    // Every header is fixed: epoch mtime, root, 0644.
    let mut archive = tar::Archive::new(a.ring.tar.as_slice());
    for entry in archive.entries().unwrap() {
        let entry = entry.unwrap();
        let h = entry.header();
        assert_eq!(h.mtime().unwrap(), 0);
        assert_eq!(h.mode().unwrap(), 0o644);
        assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0));
    }
}

#[test]
fn ring_release_lists_channels_and_channels_render_their_variant() {
    let build = build_ring(&acme(), "canary").unwrap();
    let exp = &build.ring.manifest.experiments;
    assert_eq!(exp.len(), 1);
    assert_eq!(exp[0].name, "claude-opus-default");
    assert_eq!(exp[0].salt, "claude-opus-default-v1");
    let weights: Vec<u32> = exp[0].variants.iter().map(|v| v.weight).collect();
    assert_eq!(weights, [50, 50]);
    let treatment = build
        .channels
        .iter()
        .find(|c| {
            c.manifest
                .channel
                .as_ref()
                .is_some_and(|c| c.variant == "opus-default")
        })
        .unwrap();
    let settings: serde_json::Value = serde_json::from_slice(
        treatment
            .file(Os::Linux, "/etc/claude-code/managed-settings.json")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(settings["model"], "opus", "engineering-opus renders opus");
    // Inherited through extends: engineering's override and hooks.
    assert_eq!(settings["includeCoAuthoredBy"], false);
    assert!(settings["hooks"]["PostToolUse"].is_array());
    // Client toggles travel in the manifest for halod.
    assert_eq!(build.ring.manifest.toggles[0].name, "deep-reasoning");
}

/// A running client rollout decides its experiment's channels as it does the gateway's
/// snapshot: the harness-upgrade rollout started (experiment running, rollout at step 0:
/// canary at 5%) lists engineering-next-canary in the canary ring at 95/5 and not in early
/// (which the experiment names); at step 2 early has it whole.
#[test]
fn a_running_client_rollouts_step_decides_the_channels() {
    let mut org = acme();
    org.experiments
        .get_mut("engineering-next-canary")
        .unwrap()
        .status = halo_policy::ExperimentStatus::Running;
    org.rollouts.get_mut("harness-upgrade").unwrap().status = halo_policy::RolloutStatus::Running;
    let listed = |org: &halo_policy::Org, ring: &str| {
        build_ring(org, ring)
            .unwrap()
            .ring
            .manifest
            .experiments
            .iter()
            .find(|e| e.name == "engineering-next-canary")
            .map(|e| e.variants.iter().map(|v| v.weight).collect::<Vec<u32>>())
    };
    assert_eq!(listed(&org, "canary"), Some(vec![95, 5]));
    assert_eq!(listed(&org, "early"), None);
    org.rollouts.get_mut("harness-upgrade").unwrap().step = 2;
    assert_eq!(listed(&org, "early"), Some(vec![0, 100]));
    assert_eq!(listed(&org, "canary"), Some(vec![0, 100]));
}

#[test]
fn bedrock_mode_renders_the_bedrock_env() {
    let mut org = acme();
    org.gateway.protocols.insert(
        halo_policy::Harness::ClaudeCode,
        halo_policy::WireProtocol::BedrockInvoke,
    );
    let build = build_ring(&org, "early").unwrap();
    let settings: serde_json::Value = serde_json::from_slice(
        build
            .ring
            .file(
                Os::Darwin,
                "/Library/Application Support/ClaudeCode/managed-settings.json",
            )
            .unwrap(),
    )
    .unwrap();
    let env = &settings["env"];
    assert_eq!(env["CLAUDE_CODE_USE_BEDROCK"], "1");
    assert_eq!(
        env["ANTHROPIC_BEDROCK_BASE_URL"],
        "https://halo-gateway.acme.com"
    );
    assert_eq!(env["CLAUDE_CODE_SKIP_BEDROCK_AUTH"], "1");
    assert_eq!(env["ANTHROPIC_MODEL"], "sonnet");
    assert!(env.get("ANTHROPIC_BASE_URL").is_none());
    assert_eq!(
        settings["apiKeyHelper"],
        "halo auth token --audience api://halos"
    );
}

#[test]
fn bypass_token_is_refused_at_check_rendered_naming_file_and_field() {
    let mut org = acme();
    // Validation would refuse this too; CheckRendered is the backstop after rendering.
    org.profiles
        .get_mut("engineering")
        .unwrap()
        .harnesses
        .get_mut(&halo_policy::Harness::ClaudeCode)
        .unwrap()
        .overrides
        .insert(
            "permissions".into(),
            serde_json::json!({"defaultMode": "bypassPermissions"}),
        );
    let err = build_ring(&org, "early").unwrap_err();
    let BuildError::Check { source, .. } = &err else {
        panic!("expected a CheckRendered refusal, got {err}");
    };
    let CheckError::BypassField {
        file, field, token, ..
    } = source.as_ref()
    else {
        panic!("expected a field refusal, got {source}");
    };
    assert!(file.ends_with("managed-settings.json"), "{file}");
    assert_eq!(field, "permissions.defaultMode");
    assert_eq!(*token, "bypassPermissions");
    assert!(err.to_string().contains("permissions.defaultMode"));
    // And a Codex override in TOML.
    let mut org = acme();
    org.profiles
        .get_mut("engineering")
        .unwrap()
        .harnesses
        .get_mut(&halo_policy::Harness::Codex)
        .unwrap()
        .overrides
        .insert(
            "sandbox_mode".into(),
            serde_json::json!("danger-full-access"),
        );
    let err = build_ring(&org, "early").unwrap_err();
    assert!(
        err.to_string()
            .contains("/etc/codex/managed_config.toml: field sandbox_mode"),
        "{err}"
    );
}
