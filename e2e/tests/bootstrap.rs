//! The committed envoy/standalone.yaml is a configuration the real Envoy accepts
//! (`envoy --mode validate`, which also loads the wasm module), and a configuration the
//! filter refuses stops Envoy with the reason.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

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
    let mut command = Command::new(halo_testkit::envoy::envoy_binary());
    // The key variables the policy's credentials name: a static secret's variable must be
    // set when Envoy loads the bootstrap (placeholder values; nothing is sent).
    for line in yaml_vars(&std::fs::read_to_string(&path).expect("read back")) {
        command.env(line, "placeholder");
    }
    let out = command
        .args(["--mode", "validate", "-c"])
        .arg(&path)
        .output()
        .expect("run envoy");
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `environment_variable:` names in a rendered bootstrap.
fn yaml_vars(yaml: &str) -> Vec<String> {
    yaml.lines()
        .filter_map(|l| l.trim().strip_prefix("environment_variable: "))
        .map(|v| v.trim_matches('"').to_string())
        .collect()
}

fn tempfile_dir() -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("halo-e2e-bootstrap-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A configuration the filter refuses stops Envoy at startup (the plugin fails closed),
/// with one log line naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_filter_configuration_refuses_to_start_naming_the_field() {
    let issuer = halo_e2e::Issuer::start().await;
    let providers = halo_e2e::Providers::start().await;
    let snap = halo_e2e::test_snapshot(&issuer.url, &providers);
    let admin = halo_testkit::free_port();
    let opts = halo_envoy_config::bootstrap::Standalone {
        gateway: halo_envoy_config::plan::GatewaySettings {
            listen_address: "127.0.0.1".into(),
            listen_port: halo_testkit::free_port(),
            wasm_path: halo_testkit::filter_module().display().to_string(),
            filter_settings: serde_json::json!({"identity": {"trustedProxyCIDRs": ["10.0.0.0/33"]}}),
            ..halo_envoy_config::plan::GatewaySettings::default()
        },
        admin_address: "127.0.0.1".into(),
        admin_port: admin,
    };
    let doc = halo_envoy_config::bootstrap::standalone(&snap, &opts).expect("render");
    let dir = tempfile_dir();
    let path = dir.join("bad.yaml");
    std::fs::write(&path, halo_envoy_config::yaml::to_yaml(&doc)).expect("write");
    let log = dir.join("envoy.log");
    let mut child = Command::new(halo_testkit::envoy::envoy_binary())
        .arg("-c")
        .arg(&path)
        .args(["--concurrency", "1", "--disable-hot-restart"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start envoy");
    let status = halo_testkit::wait_until(
        "Envoy to refuse the plugin and exit",
        std::time::Duration::from_secs(60),
        || child.try_wait().ok().flatten(),
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!status.success(), "{text}");
    assert!(
        text.contains("halo filter configuration refused: settings.identity.trustedProxyCIDRs[0]"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
