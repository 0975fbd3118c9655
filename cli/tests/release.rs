//! `halo release` end to end against a real registry (docker-registry on loopback).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use halo_testkit::registry::Registry;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp")
}

fn halo(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_halo"))
        .args(args)
        .env("HALO_RELEASE_STATE", state)
        .env("DOCKER_CONFIG", state.parent().unwrap())
        .env_remove("HALO_REGISTRY_USERNAME")
        .output()
        .expect("run halo")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn build_publish_verify_promote_and_clear_failures() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let policy = example();
    let policy = policy.to_str().unwrap();
    let out = halo(
        &state,
        &[
            "keys",
            "generate",
            "--name",
            "release",
            "--out-dir",
            tmp.path().to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let key = tmp.path().join("release.key");
    let pubkey = tmp.path().join("release.pub");

    // build: local only.
    let dist = tmp.path().join("dist");
    let out = halo(
        &state,
        &[
            "release",
            "build",
            "--policy-dir",
            policy,
            "--ring",
            "canary",
            "--out",
            dist.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(dist.join("canary.tar").is_file());
    assert!(
        dist.join("canary_claude-opus-default_opus-default.tar")
            .is_file()
    );

    let registry = Registry::start();
    let addr = format!("{}/acme/halos", registry.host());

    // A missing key file fails clearly before the registry is touched.
    let out = halo(
        &state,
        &[
            "release",
            "publish",
            "--policy-dir",
            policy,
            "--ring",
            "canary",
            "--release-version",
            "1.0.0",
            "--key",
            tmp.path().join("nope.key").to_str().unwrap(),
            "--registry",
            &addr,
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("cannot read the release key"),
        "{}",
        text(&out.stderr)
    );
    // A public key where the private key belongs.
    let out = halo(
        &state,
        &[
            "release",
            "publish",
            "--policy-dir",
            policy,
            "--ring",
            "canary",
            "--release-version",
            "1.0.0",
            "--key",
            pubkey.to_str().unwrap(),
            "--registry",
            &addr,
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("public key, where a private"),
        "{}",
        text(&out.stderr)
    );

    let publish = |version: &str| {
        halo(
            &state,
            &[
                "release",
                "publish",
                "--policy-dir",
                policy,
                "--ring",
                "canary",
                "--release-version",
                version,
                "--key",
                key.to_str().unwrap(),
                "--registry",
                &addr,
            ],
        )
    };
    let out = publish("1.0.0");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("[3/3] v1.0.0_canary layer"),
        "progress on stderr: {stderr}"
    );
    assert!(text(&out.stdout).contains("pointer ring-canary.pointer seq"));
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    let seq1 = recorded[&addr]["ring-canary.pointer"].as_u64().unwrap();

    let verify = || {
        halo(
            &state,
            &[
                "release",
                "verify",
                "--ring",
                "canary",
                "--org",
                "acme-corp",
                "--pubkey",
                pubkey.to_str().unwrap(),
                "--registry",
                &addr,
            ],
        )
    };
    let out = verify();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["seq"].as_u64(), Some(seq1));
    assert_eq!(summary["channels"].as_array().unwrap().len(), 2);

    let out = publish("1.1.0");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = halo(
        &state,
        &[
            "release",
            "promote",
            "--ring",
            "canary",
            "--release-version",
            "1.0.0",
            "--key",
            key.to_str().unwrap(),
            "--registry",
            &addr,
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = verify();
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        summary["seq"].as_u64().unwrap() > seq1 + 1,
        "seq only grows"
    );

    // Promoting a version that was never published.
    let out = halo(
        &state,
        &[
            "release",
            "promote",
            "--ring",
            "canary",
            "--release-version",
            "9.9.9",
            "--key",
            key.to_str().unwrap(),
            "--registry",
            &addr,
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("v9.9.9_canary"),
        "{}",
        text(&out.stderr)
    );

    // Unreachable registry: a clear message, nothing recorded.
    let before = std::fs::read(&state).unwrap();
    let dead = format!("127.0.0.1:{}/acme/halos", halo_testkit::free_port());
    let out = halo(
        &state,
        &[
            "release",
            "publish",
            "--policy-dir",
            policy,
            "--ring",
            "canary",
            "--release-version",
            "2.0.0",
            "--key",
            key.to_str().unwrap(),
            "--registry",
            &dead,
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("cannot reach registry"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read(&state).unwrap(), before);
}
