//! How fast `halo auth token` answers from its cache, which is what every harness call
//! costs (Claude Code runs apiKeyHelper at start and on every 401 or TTL; Gemini CLI's
//! profile at each shell start). Not a test: `cargo bench -p halo-auth --bench token`.
//!
//! Logs in against the fake issuer (file store), then times
//! - the library call `session::token` from the cache (N = 5000), and
//! - with `HALO_BIN=/path/to/halo`, the whole process `halo auth token` (N = 300), as a
//!   harness runs it (spawn, read the session and cache, print).
//!
//! Prints p50, p90, p99 and max. Results go to BENCHMARKS.md by hand.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use halo_auth::oauth::DeviceStart;
use halo_auth::session::{self, Flow, LoginSettings, Prompt};
use halo_auth::store::{AuthDir, StoreChoice};
use halo_auth::unix_now;
use halo_testkit::oidc::{DEFAULT_AUDIENCE, FakeIssuer};
use serde_json::json;

struct Approver<'a>(&'a FakeIssuer);

impl Prompt for Approver<'_> {
    fn device_code(&mut self, start: &DeviceStart) {
        assert!(self.0.approve_device(&start.user_code));
    }
    fn open_browser(&mut self, _url: &str) {}
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{what}: n={} p50={:?} p90={:?} p99={:?} max={:?}",
        samples.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        samples[samples.len() - 1]
    );
}

fn main() {
    let issuer = FakeIssuer::start();
    issuer.set_user(json!({"sub": "u", "email": "bench@acme.test", "email_verified": true}));
    let tmp = tempfile::tempdir().expect("tempdir");
    let ca = tmp.path().join("ca.pem");
    std::fs::write(&ca, &issuer.ca_pem).expect("CA");
    let auth_dir = tmp.path().join("auth");
    let dir = AuthDir::new(auth_dir.clone()).expect("dir");
    let settings = LoginSettings {
        issuer: issuer.issuer.clone(),
        client_id: issuer.client_id().into(),
        audience: Some(DEFAULT_AUDIENCE.into()),
        user_claim: "email".into(),
        groups_claim: "groups".into(),
        scope: halo_auth::oauth::DEFAULT_SCOPE.into(),
        ca_file: Some(ca.clone()),
        store: StoreChoice::File,
    };
    session::login(
        &dir,
        &settings,
        Flow::Device,
        &mut Approver(&issuer),
        &unix_now,
    )
    .expect("login");

    let mut lib = Vec::with_capacity(5000);
    for _ in 0..5000 {
        let t0 = Instant::now();
        let t = session::token(&dir, None, &unix_now).expect("token");
        lib.push(t0.elapsed());
        assert!(!t.refreshed);
    }
    report("session::token from cache (library)", lib);

    if let Some(bin) = std::env::var_os("HALO_BIN") {
        let mut proc = Vec::with_capacity(300);
        for _ in 0..300 {
            let t0 = Instant::now();
            let out = Command::new(&bin)
                .args(["auth", "token"])
                .env("HALO_AUTH_DIR", &auth_dir)
                .output()
                .expect("run halo");
            proc.push(t0.elapsed());
            assert!(out.status.success());
        }
        report("`halo auth token` process from cache", proc);
    } else {
        println!("(set HALO_BIN=path/to/halo to time the process too)");
    }
    let refreshes = issuer
        .grants()
        .iter()
        .filter(|g| *g == "refresh_token")
        .count();
    assert_eq!(refreshes, 0, "every call was served from the cache");
}
