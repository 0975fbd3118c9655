//! halo-wasm-profile on today's module (built by scripts/test.sh): a model call through
//! both plugins of a rendered bootstrap, counted the same on every run, which is what
//! makes two modules comparable without noise; a bootstrap without the plugins is refused.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_halo-wasm-profile");

/// examples/acme-corp's standalone bootstrap, written to `dir`.
fn bootstrap(dir: &Path, module: &Path) -> PathBuf {
    let root = halo_testkit::workspace_root();
    let snap =
        halo_xds::source::load_policy(&root.join("examples/acme-corp")).expect("acme-corp loads");
    let boot = halo_envoy_config::bootstrap::Standalone {
        gateway: halo_envoy_config::plan::GatewaySettings {
            listen_address: "127.0.0.1".into(),
            wasm_path: module.display().to_string(),
            ..halo_envoy_config::plan::GatewaySettings::default()
        },
        admin_address: "127.0.0.1".into(),
        admin_port: 9901,
    };
    let doc = halo_envoy_config::bootstrap::standalone(&snap, &boot).expect("bootstrap");
    let file = dir.join("gw.json");
    std::fs::write(&file, doc.to_string()).expect("write the bootstrap");
    file
}

fn profile(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("halo-wasm-profile runs")
}

#[test]
fn a_model_call_runs_through_both_plugins_and_counts_the_same_every_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let module = halo_testkit::filter_wasm();
    let file = bootstrap(dir.path(), &module);
    let module = module.display().to_string();
    // A canary developer of acme-corp: haiku goes to Bedrock for the canary ring (the
    // haiku-bedrock toggle), so the attempt stage translates.
    let out = profile(&[
        "--bootstrap",
        &file.display().to_string(),
        "--requests",
        "3",
        "--claims",
        r#"{"email":"dev@acme.com","email_verified":true,"groups":["halos-canary"]}"#,
        &module,
        &module,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "total  <fuel> / <calls>  <fuel> / <calls>": one module, two runs, the same counts.
    let total: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with("total"))
        .expect("a total line")
        .split_whitespace()
        .collect();
    assert_eq!(total.len(), 7, "{total:?}");
    assert_eq!(total[1..4], total[4..7], "{text}");
    let fuel: u64 = total[1].parse().expect("fuel");
    let calls: f64 = total[3].parse().expect("host calls");
    assert!(fuel > 10_000, "{text}");
    assert!(calls >= 10.0, "{text}");
    // The request filter left its note and the stage read it with the endpoint's facts.
    assert!(
        text.contains("request: request body / set_property"),
        "{text}"
    );
    assert!(
        text.contains("attempt: request headers / get_property"),
        "{text}"
    );
}

#[test]
fn a_bootstrap_without_the_plugins_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("empty.json");
    std::fs::write(&file, "{}").expect("write");
    let module = halo_testkit::filter_wasm().display().to_string();
    let out = profile(&["--bootstrap", &file.display().to_string(), &module]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the bootstrap has no wasm plugin with root_id halo"),
        "{err}"
    );
}
