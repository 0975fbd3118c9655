//! `halo wasm publish` / `halo wasm verify` against a real registry (docker-registry on
//! loopback): both image variants pushed, digests printed, pulled back and checked.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

use halo_testkit::registry::Registry;

fn halo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_halo"))
        .args(args)
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."))
        .env_remove("HALO_REGISTRY_USERNAME")
        .env_remove("HALO_REGISTRY_PASSWORD")
        .env("DOCKER_CONFIG", "/nonexistent")
        .output()
        .expect("run halo")
}

/// The smallest valid wasm module (magic + version), plus a custom section so two
/// modules differ.
fn module(tag: u8) -> Vec<u8> {
    vec![0, b'a', b's', b'm', 1, 0, 0, 0, 0, 2, 1, b'a' + tag, 0]
}

#[test]
fn publish_prints_pinned_refs_that_verify_and_render() {
    let reg = Registry::start();
    let dir = tempfile::tempdir().expect("tmp");
    let wasm = dir.path().join("halo_filter.wasm");
    std::fs::write(&wasm, module(0)).expect("module");
    let other = dir.path().join("other.wasm");
    std::fs::write(&other, module(1)).expect("module");
    let repo = format!("{}/halos/halo-filter", reg.host());

    let o = halo(&[
        "wasm",
        "publish",
        "--registry",
        &repo,
        "--module",
        wasm.to_str().expect("utf8"),
        "--tag",
        "v1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    let refs: Vec<(&str, &str)> = stdout.lines().filter_map(|l| l.split_once('\t')).collect();
    assert_eq!(
        refs.iter().map(|r| r.0).collect::<Vec<_>>(),
        ["v1", "v1-compat"],
        "{stdout}"
    );

    // Publishing the same module again gives the same digests (deterministic images).
    let again = halo(&[
        "wasm",
        "publish",
        "--registry",
        &repo,
        "--module",
        wasm.to_str().expect("utf8"),
        "--tag",
        "v1",
    ]);
    assert!(again.status.success());
    assert_eq!(String::from_utf8_lossy(&again.stdout), stdout);

    for (_, pinned) in &refs {
        assert!(
            pinned.starts_with(&format!("oci://{repo}@sha256:")),
            "{pinned}"
        );
        let o = halo(&[
            "wasm",
            "verify",
            "--image",
            pinned,
            "--module",
            wasm.to_str().expect("utf8"),
        ]);
        assert!(
            o.status.success(),
            "{pinned}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        // Another module is not what the image holds.
        let o = halo(&[
            "wasm",
            "verify",
            "--image",
            pinned,
            "--module",
            other.to_str().expect("utf8"),
        ]);
        assert_eq!(o.status.code(), Some(1), "{pinned}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("holds module"));
        // The printed reference is what the renderers pin.
        let o = halo(&[
            "istio",
            "render",
            "--mode",
            "in-proxy",
            "--policy-dir",
            "mesh/tests/fixtures/mesh-corp",
            "--image",
            pinned,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }

    // A digest the registry does not have fails.
    let missing = format!("oci://{repo}@sha256:{}", "0".repeat(64));
    let o = halo(&["wasm", "verify", "--image", &missing]);
    assert_eq!(o.status.code(), Some(1));

    // Not a wasm module: refused before anything is pushed.
    let text = dir.path().join("not.wasm");
    std::fs::write(&text, "hello").expect("write");
    let o = halo(&[
        "wasm",
        "publish",
        "--registry",
        &repo,
        "--module",
        text.to_str().expect("utf8"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a wasm module"));
}
