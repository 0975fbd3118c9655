//! The halo-server binary: --help, settings precedence, refusing weak tokens.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_halo-server");

fn policy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp")
}

#[test]
fn help_has_examples() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "Examples:",
        "halo keys generate --name killswitch",
        "openssl rand -hex 32",
        "--killswitch-key-file",
        "HALO_SERVER_",
    ] {
        assert!(text.contains(needle), "--help lacks {needle:?}:\n{text}");
    }
}

/// Start the binary and wait (bounded) for its readiness line or its exit.
fn run(cmd: &mut Command) -> Result<String, String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
    if line.starts_with("halo-server listening") {
        let _ = child.kill();
        let _ = child.wait();
        return Ok(line);
    }
    let out = child.wait_with_output().unwrap();
    Err(String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn flags_beat_env_and_env_beats_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("server.yaml");
    std::fs::write(
        &cfg,
        "policy-dir: /nonexistent/from-yaml\nlisten: 127.0.0.1:0\nadmin-listen: 127.0.0.1:0\n",
    )
    .unwrap();
    // YAML alone: its (missing) policy dir is used.
    let err = run(Command::new(BIN).arg("--config").arg(&cfg)).unwrap_err();
    assert!(err.contains("from-yaml"), "{err}");
    // Env beats YAML.
    let line = run(Command::new(BIN)
        .arg("--config")
        .arg(&cfg)
        .env("HALO_SERVER_POLICY_DIR", policy_dir()))
    .unwrap();
    assert!(line.contains("api=127.0.0.1:"), "{line}");
    // Flags beat env.
    let err = run(Command::new(BIN)
        .arg("--config")
        .arg(&cfg)
        .arg("--policy-dir")
        .arg("/nonexistent/from-flag")
        .env("HALO_SERVER_POLICY_DIR", policy_dir()))
    .unwrap_err();
    assert!(err.contains("from-flag"), "{err}");
}

#[test]
fn unknown_yaml_key_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("server.yaml");
    std::fs::write(&cfg, "policy-dir: p\nkillswitch-key: k\n").unwrap();
    let err = run(Command::new(BIN).arg("--config").arg(&cfg)).unwrap_err();
    assert!(err.contains("killswitch-key"), "{err}");
}

#[test]
fn weak_gateway_token_refuses_to_start_and_names_openssl() {
    let dir = tempfile::tempdir().unwrap();
    let pair = halo_policy::keys::generate().unwrap();
    std::fs::write(dir.path().join("ks.key"), pair.private_pem.as_bytes()).unwrap();
    for weak in [
        "halos-gateway-token-production-2026",
        "abcdefghijklmnopqrstuvwxyz012345",
    ] {
        std::fs::write(dir.path().join("gw.token"), weak).unwrap();
        let err = run(Command::new(BIN)
            .arg("--policy-dir")
            .arg(policy_dir())
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--killswitch-key-file")
            .arg(dir.path().join("ks.key"))
            .arg("--gateway-token-file")
            .arg(dir.path().join("gw.token"))
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]))
        .unwrap_err();
        assert!(err.contains("openssl rand -hex 32"), "{err}");
        assert!(
            !err.contains(weak),
            "the token leaked into the error: {err}"
        );
        assert!(
            !dir.path().join("data").exists(),
            "nothing is written on refusal"
        );
    }
}
