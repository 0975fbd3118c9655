//! `halo kill`, `halo unkill` and `halo killswitch status` against a real halo-server on
//! loopback, authenticated by a JWT from the fake OIDC issuer.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../control-plane/tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};

use support::{Env, serve};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

async fn halo(args: Vec<String>, token: Option<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(HALO);
        cmd.args(&args)
            .env_remove("HALO_TOKEN")
            .env_remove("HALO_SERVER_URL");
        if let Some(t) = token {
            cmd.env("HALO_TOKEN", t);
        }
        cmd.output().unwrap()
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_unkill_and_status_through_the_api() {
    let env = Env::new().await;
    let server = serve(&env.settings()).await;
    let admin = env.admin_token();
    let base = server.base.clone();

    let out = halo(
        args(&[
            "kill",
            "experiment",
            "gpt-shadow",
            "--reason",
            "cost spike",
            "--server",
            &base,
        ]),
        Some(admin.clone()),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("experiment gpt-shadow is killed"),
        "{stdout}"
    );

    // The token may come from a file too.
    let token_file = env.path("admin.jwt");
    std::fs::write(&token_file, &admin).unwrap();
    let out = halo(
        args(&[
            "killswitch",
            "status",
            "--server",
            &base,
            "--token-file",
            token_file.to_str().unwrap(),
        ]),
        None,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("gpt-shadow"), "{stdout}");
    assert!(stdout.contains("alice@acme.com"), "{stdout}");
    assert!(stdout.contains("cost spike"), "{stdout}");

    // An unknown name: the server's 404 and its message reach the user, exit 1.
    let out = halo(
        args(&[
            "kill",
            "toggle",
            "no-such-toggle",
            "--reason",
            "x",
            "--server",
            &base,
        ]),
        Some(admin.clone()),
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("404 unknown_name"), "{stderr}");
    assert!(stderr.contains("no-such-toggle"), "{stderr}");

    // A non-admin is refused with 403.
    let out = halo(
        args(&[
            "unkill",
            "experiment",
            "gpt-shadow",
            "--reason",
            "x",
            "--server",
            &base,
        ]),
        Some(env.user_token()),
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("403"));

    let out = halo(
        args(&[
            "unkill",
            "experiment",
            "gpt-shadow",
            "--reason",
            "fixed",
            "--server",
            &base,
        ]),
        Some(admin.clone()),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("is not killed"));
    let out = halo(
        args(&["killswitch", "status", "--server", &base]),
        Some(admin.clone()),
    )
    .await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing is killed"));

    // --reason is required by the CLI itself (clap usage error, exit 2).
    let out = halo(
        args(&["kill", "experiment", "gpt-shadow", "--server", &base]),
        Some(admin),
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    server.stop().await;
}
