//! `halo auth login | token | status | logout` as processes, against the fake issuer
//! (real HTTPS and signed tokens): the device and browser logins, the policy's identity
//! as the defaults, exit status 3 with a one-line "run `halo auth login`", and the
//! credential store fallback when there is no D-Bus session.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Output, Stdio};

use halo_testkit::oidc::{DEFAULT_AUDIENCE, FakeIssuer};
use serde_json::{Value, json};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_halo");
const EMAIL: &str = "alice@acme.test";

struct Env {
    issuer: FakeIssuer,
    tmp: tempfile::TempDir,
}

fn env() -> Env {
    let issuer = FakeIssuer::start();
    issuer
        .set_user(json!({"sub": "u-1", "email": EMAIL, "email_verified": true, "groups": ["eng"]}));
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(tmp.path().join("ca.pem"), &issuer.ca_pem).expect("CA");
    Env { issuer, tmp }
}

impl Env {
    fn auth_dir(&self) -> std::path::PathBuf {
        self.tmp.path().join("auth")
    }

    /// `halo` with this test's auth directory, no D-Bus session and no inherited
    /// settings.
    fn halo(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("HALO_AUTH_DIR", self.auth_dir())
            .env("HALO_AUTH_CA_FILE", self.tmp.path().join("ca.pem"))
            .env("XDG_RUNTIME_DIR", self.tmp.path())
            .env_remove("DBUS_SESSION_BUS_ADDRESS")
            .env_remove("HALO_POLICY_DIR")
            .env_remove("HALO_AUTH_ISSUER")
            .env_remove("HALO_AUTH_CLIENT_ID")
            .env_remove("HALO_AUTH_AUDIENCE")
            .env_remove("HALO_AUTH_STORE");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.halo(args).output().expect("run halo")
    }

    /// `halo auth login --device ...`, approved at the issuer as soon as the code is
    /// pending.
    fn device_login(&self, extra: &[&str]) -> Output {
        let mut args = vec!["auth", "login", "--device"];
        args.extend_from_slice(extra);
        common::approved_device_login(self.halo(&args), &self.issuer)
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn claims(token: &str) -> Value {
    halo_auth::jwt::claims(token.trim()).expect("a JWT on stdout")
}

#[test]
fn device_login_then_token_status_logout() {
    let e = env();
    let issuer = e.issuer.issuer.clone();
    let out = e.device_login(&[
        "--issuer",
        &issuer,
        "--client-id",
        e.issuer.client_id(),
        "--audience",
        DEFAULT_AUDIENCE,
    ]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("enter the code"), "{err}");
    // No D-Bus session here: the refresh token falls back to a 0600 file, said once.
    assert!(err.contains("no OS credential store"), "{err}");
    assert!(e.auth_dir().join("refresh-token").is_file());
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!("Logged in to {issuer} as {EMAIL}")),
        "{stdout}"
    );

    let out = e.run(&["auth", "token"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let c = claims(&text(&out.stdout));
    assert_eq!(c["iss"], json!(issuer));
    assert_eq!(c["aud"], json!(DEFAULT_AUDIENCE));
    assert_eq!(c["email"], json!(EMAIL));
    assert_eq!(c["groups"], json!(["eng"]));
    assert!(
        out.stderr.is_empty(),
        "a harness shows stderr: keep it empty"
    );

    let out = e.run(&["auth", "status"]);
    let s = text(&out.stdout);
    assert!(out.status.success());
    assert!(
        s.contains(EMAIL) && s.contains(&issuer) && s.contains("expires"),
        "{s}"
    );

    let out = e.run(&["auth", "logout"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("revoked"));
    assert_eq!(e.issuer.live_refresh_tokens(), 0);

    for args in [&["auth", "token"][..], &["auth", "status"][..]] {
        let out = e.run(args);
        assert_eq!(out.status.code(), Some(3), "{args:?}");
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains("run `halo auth login`"), "{err}");
    }
}

#[test]
fn defaults_come_from_the_policy_identity() {
    let e = env();
    let policy = e.tmp.path().join("policy");
    common::copy_dir(
        &halo_testkit::workspace_root().join("examples/acme-corp"),
        &policy,
    );
    let root = policy.join("halos.yaml");
    let yaml = std::fs::read_to_string(&root)
        .expect("halos.yaml")
        .replace(
            "https://acme.okta.com/oauth2/aus9halos2acme7corp",
            &e.issuer.issuer,
        )
        .replace("0oa9halos4acmecorp7x", e.issuer.client_id());
    std::fs::write(&root, yaml).expect("write halos.yaml");
    let out = e.device_login(&["--policy-dir", &policy.display().to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // acme-corp's identity.audience is api://halos: `token` serves it without a flag.
    let out = e.run(&["auth", "token"]);
    assert_eq!(claims(&text(&out.stdout))["aud"], json!("api://halos"));
}

#[test]
fn browser_login_follows_the_loopback_redirect() {
    let e = env();
    let mut child: Child = e
        .halo(&[
            "auth",
            "login",
            "--browser",
            "--issuer",
            &e.issuer.issuer,
            "--client-id",
            e.issuer.client_id(),
            "--store",
            "file",
        ])
        // No browser to start here: the test plays the browser with the printed URL.
        .env("BROWSER", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn login");
    let stderr = child.stderr.take().expect("stderr");
    let url = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with(&e.issuer.issuer))
        .expect("the authorization URL on stderr");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let browser = reqwest::blocking::Client::builder()
        .tls_certs_merge([reqwest::Certificate::from_pem(e.issuer.ca_pem.as_bytes()).expect("CA")])
        .build()
        .expect("client");
    let page = browser
        .get(&url)
        .send()
        .expect("authorize")
        .text()
        .expect("page");
    assert!(page.contains("Signed in"), "{page}");
    let out = child.wait_with_output().expect("login exits");
    assert!(out.status.success());
    assert_eq!(e.issuer.grants(), ["authorization_code"]);
    let out = e.run(&["auth", "token"]);
    assert_eq!(claims(&text(&out.stdout))["email"], json!(EMAIL));
}

#[test]
fn a_revoked_session_exits_3_with_one_line() {
    let e = env();
    // Tokens shorter than the refresh margin: every `token` refreshes.
    e.issuer.set_token_lifetime(30);
    let out = e.device_login(&[
        "--issuer",
        &e.issuer.issuer,
        "--client-id",
        e.issuer.client_id(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let a = e.run(&["auth", "token"]);
    let b = e.run(&["auth", "token"]);
    assert!(a.status.success() && b.status.success());
    let refreshes = e
        .issuer
        .grants()
        .iter()
        .filter(|g| *g == "refresh_token")
        .count();
    assert_eq!(refreshes, 2, "refreshed each time");
    e.issuer.revoke_all_refresh_tokens();
    let out = e.run(&["auth", "token"]);
    assert_eq!(out.status.code(), Some(3));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("refused the refresh token") && err.contains("halo auth login"),
        "{err}"
    );
}

#[test]
fn the_keyring_store_without_a_dbus_session_is_refused_before_the_sign_in() {
    let e = env();
    let out = e.run(&[
        "auth",
        "login",
        "--device",
        "--issuer",
        &e.issuer.issuer,
        "--client-id",
        e.issuer.client_id(),
        "--store",
        "keyring",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("Secret Service"), "{err}");
    assert!(
        e.issuer.pending_user_code().is_none(),
        "no sign-in was started"
    );
    assert!(e.issuer.grants().is_empty());
}

/// A real Secret Service: gnome-keyring-daemon on a private D-Bus session
/// (dbus-run-session, from scripts/install.sh). The refresh token goes there, not to a
/// file; `token` refreshes through it; `logout` deletes it.
#[test]
fn the_refresh_token_lives_in_the_secret_service_when_there_is_one() {
    let e = env();
    e.issuer.set_token_lifetime(30); // every `token` refreshes: the store is read and rotated
    let home = e.tmp.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let script = format!(
        "set -e\n\
         printf 'halo-test' | gnome-keyring-daemon --unlock --components=secrets >/dev/null\n\
         '{BIN}' auth login --device --store keyring --issuer '{iss}' --client-id '{cid}' >&2\n\
         test ! -e '{dir}/refresh-token'\n\
         '{BIN}' auth token\n\
         '{BIN}' auth token\n\
         '{BIN}' auth status >&2\n\
         '{BIN}' auth logout >&2\n",
        iss = e.issuer.issuer,
        cid = e.issuer.client_id(),
        dir = e.auth_dir().display(),
    );
    let cmd = e.halo(&[]);
    let mut session = Command::new("dbus-run-session");
    session
        .args(["--", "sh", "-c", &script])
        .envs(
            cmd.get_envs()
                .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))),
        )
        .env("HOME", &home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env_remove("DBUS_SESSION_BUS_ADDRESS");
    // dbus-run-session and gnome-keyring-daemon come from scripts/install.sh.
    let out = common::approved_device_login(session, &e.issuer);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("refresh token: the Secret Service"), "{err}");
    let tokens: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(tokens.len(), 2);
    let refreshes = e
        .issuer
        .grants()
        .iter()
        .filter(|g| *g == "refresh_token")
        .count();
    assert_eq!(
        refreshes, 2,
        "each refreshed through the stored, rotated token"
    );
    assert_eq!(claims(&tokens[1])["email"], json!(EMAIL));
    assert_eq!(
        e.issuer.live_refresh_tokens(),
        0,
        "logout revoked the stored token"
    );
}
