//! The committed envoy/standalone.yaml is a configuration the real Envoy accepts
//! (`envoy --mode validate`, which also loads the wasm module).

use std::process::Command;

#[test]
fn committed_standalone_bootstrap_validates_in_envoy() {
    let root = halo_testkit::workspace_root();
    let yaml = std::fs::read_to_string(root.join("envoy/standalone.yaml")).expect("committed");
    let wasm = halo_testkit::filter_wasm();
    let yaml = yaml.replace("/etc/halos/halo_filter.wasm", &wasm.display().to_string());
    let dir = tempfile_dir();
    let path = dir.join("standalone.yaml");
    std::fs::write(&path, yaml).expect("write");
    let out = Command::new(halo_testkit::envoy::envoy_binary())
        .args(["--mode", "validate", "-c"])
        .arg(&path)
        .output()
        .expect("run envoy");
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("halo-e2e-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
