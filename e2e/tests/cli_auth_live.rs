//! A developer's first day, end to end: `halo auth login` once, then Claude Code's
//! managed settings as `halo release build` renders them from examples/acme-corp: their
//! `apiKeyHelper` (`halo auth token --audience api://halos`, from the Gateway's
//! `auth.helperCommand`) is run the way Claude Code runs it (through the shell, stdout is
//! the key, sent as `x-api-key` and `Authorization: Bearer`), and the call goes through a
//! real Envoy (jwt_authn verifying the fake issuer's EdDSA tokens, the halo filter) to a
//! fake Anthropic: a governed 200. When the access token expires, the helper refreshes it
//! and the next call succeeds without the developer doing anything. The other tests do
//! the same with the real Claude Code (`claude -p`, halo_testkit::harness) running the real
//! `halo auth token` as its apiKeyHelper, the real Gemini CLI with the release's profile
//! line putting `halo auth token`'s output in GEMINI_API_KEY, and the real Codex with the
//! token as its provider's auth command; each refreshes an expired login token.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use halo_e2e::{Gateway, GatewayOptions, Providers, test_snapshot};
use halo_testkit::oidc::FakeIssuer;
use halo_testkit::{wait_until, workspace_root};
use serde_json::{Value, json};

#[path = "../../cli/tests/common/mod.rs"]
mod common;

const BIN: &str = env!("CARGO_BIN_EXE_halo-e2e-cli");
const EMAIL: &str = "alice@acme.test";

/// The apiKeyHelper of the canary ring's Claude Code managed settings.
fn rendered_api_key_helper(policy: &Path, out: &Path) -> String {
    let run = Command::new(BIN)
        .args(["release", "build", "--ring", "canary", "--policy-dir"])
        .arg(policy)
        .arg("--out")
        .arg(out)
        .output()
        .expect("halo release build");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let tar = std::fs::read(out.join("canary.tar")).expect("canary.tar");
    let (manifest, blobs) = halo_release::pack::unpack(&tar).expect("unpack");
    let file = manifest
        .files
        .iter()
        .find(|f| f.path == "/etc/claude-code/managed-settings.json")
        .unwrap_or_else(|| panic!("no Linux managed settings in {:?}", manifest.files));
    let settings = &blobs[&file.sha256];
    let settings: Value = serde_json::from_slice(settings).expect("settings JSON");
    settings["apiKeyHelper"]
        .as_str()
        .expect("apiKeyHelper is rendered")
        .to_string()
}

/// Run the helper as Claude Code does: `sh -c`, stdout trimmed is the key.
fn api_key(helper: &str, path: &str, auth_dir: &Path, ca: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(helper)
        .env("PATH", path)
        .env("HALO_AUTH_DIR", auth_dir)
        .env("HALO_AUTH_CA_FILE", ca)
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .stdin(Stdio::null())
        .output()
        .expect("run apiKeyHelper");
    assert!(
        out.status.success(),
        "apiKeyHelper failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_api_key_helper_gets_a_governed_200_and_survives_expiry() {
    let issuer = FakeIssuer::start();
    issuer.set_user(
        json!({"sub": "u-alice", "email": EMAIL, "email_verified": true, "groups": ["eng"]}),
    );
    let providers = Providers::start().await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let ca = tmp.path().join("ca.pem");
    std::fs::write(&ca, &issuer.ca_pem).expect("CA");
    // Envoy verifies the issuer's JWKS certificate: it trusts the fake issuer's CA.
    let gw = Gateway::start(
        test_snapshot(&issuer.issuer, &providers),
        GatewayOptions {
            upstream_ca_file: Some(ca.clone()),
            ..GatewayOptions::default()
        },
    );
    let auth_dir = tmp.path().join("auth");
    let policy = tmp.path().join("policy");
    common::copy_dir(&workspace_root().join("examples/acme-corp"), &policy);
    let root = policy.join("halos.yaml");
    let yaml = std::fs::read_to_string(&root)
        .expect("halos.yaml")
        .replace(
            "https://acme.okta.com/oauth2/aus9halos2acme7corp",
            &issuer.issuer,
        )
        .replace("0oa9halos4acmecorp7x", issuer.client_id());
    std::fs::write(&root, yaml).expect("write halos.yaml");
    let helper = rendered_api_key_helper(&policy, &tmp.path().join("dist"));
    assert_eq!(helper, "halo auth token --audience api://halos");

    // Short-lived tokens, so the login's token expires during the test.
    issuer.set_token_lifetime(3);
    let mut login = Command::new(BIN);
    login
        .args(["auth", "login", "--device", "--policy-dir"])
        .arg(&policy)
        .env("HALO_AUTH_DIR", &auth_dir)
        .env("HALO_AUTH_CA_FILE", &ca)
        .env_remove("DBUS_SESSION_BUS_ADDRESS");
    let login = tokio::task::block_in_place(|| common::approved_device_login(login, &issuer));
    assert!(
        login.status.success(),
        "{}",
        String::from_utf8_lossy(&login.stderr)
    );

    let bin_dir = Path::new(BIN)
        .parent()
        .expect("bin dir")
        .display()
        .to_string();
    let path = format!("{bin_dir}:{}", std::env::var("PATH").unwrap_or_default());
    let call = |key: String| {
        let gw = &gw;
        async move {
            let bearer = format!("Bearer {key}");
            gw.post(
                "/v1/messages",
                &[("x-api-key", &key), ("authorization", &bearer)],
                &json!({"model": "haiku", "max_tokens": 5,
                        "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await
        }
    };

    let first = api_key(&helper, &path, &auth_dir, &ca);
    let answer = call(first.clone()).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let seen = providers.a.seen().pop().expect("the provider got the call");
    // Governed: alice is in the canary ring by the verified email claim.
    assert_eq!(seen.header("x-halo-ring"), Some("canary"));
    assert_eq!(seen.json()["model"], "claude-haiku-4-5");
    // The developer's token never reaches the provider.
    assert!(seen.header("x-api-key").is_none_or(|k| k != first));

    // Let the first token expire (its exp is 3 s after issue; a bounded wait on the clock).
    let exp = halo_auth::jwt::claims(&first).expect("JWT")["exp"]
        .as_i64()
        .expect("exp");
    tokio::task::block_in_place(|| {
        wait_until("the first token to expire", Duration::from_secs(10), || {
            (halo_auth::unix_now() > exp).then_some(())
        })
    });
    let refreshes_before = issuer
        .grants()
        .iter()
        .filter(|g| *g == "refresh_token")
        .count();
    let second = api_key(&helper, &path, &auth_dir, &ca);
    assert_ne!(second, first, "a new token");
    assert!(
        halo_auth::jwt::claims(&second).expect("JWT")["exp"].as_i64() > Some(halo_auth::unix_now())
    );
    assert_eq!(
        issuer
            .grants()
            .iter()
            .filter(|g| *g == "refresh_token")
            .count(),
        refreshes_before + 1
    );
    let answer = call(second).await;
    assert_eq!(answer.status, 200, "{}", answer.text());

    // And without a login, the helper fails the way Claude Code can show.
    let out = Command::new("sh")
        .arg("-c")
        .arg(&helper)
        .env("PATH", &path)
        .env("HALO_AUTH_DIR", tmp.path().join("nobody"))
        .output()
        .expect("helper");
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("run `halo auth login`"));
}

/// A gateway (real Envoy) in front of the wire provider, a release for it built from a
/// policy whose identity is the fake issuer, and a `halo auth login` whose token has
/// already expired when this returns: the harness's first helper run must refresh.
struct RealHarness {
    issuer: FakeIssuer,
    provider: halo_testkit::provider::WireProvider,
    _gw: Gateway,
    release: Vec<(String, Vec<u8>)>,
    auth_dir: std::path::PathBuf,
    ca: std::path::PathBuf,
    _tmp: tempfile::TempDir,
}

const ANSWER: &str = "Hello from the Halos demo provider.";

impl RealHarness {
    async fn start() -> RealHarness {
        use halo_release::adapters::Os;
        use halo_testkit::harness;
        use halo_testkit::provider::WireProvider;

        const MODEL: &str = "claude-sonnet-4-5-20250929";
        let cc = harness::pinned_for("claude-code");
        let issuer = FakeIssuer::start();
        issuer.set_user(
            json!({"sub": "u-alice", "email": EMAIL, "email_verified": true, "groups": ["eng"]}),
        );
        let provider = WireProvider::start(true).await.expect("the provider");
        let tmp = tempfile::tempdir().expect("tempdir");
        let policy = tmp.path().join("policy");
        std::fs::create_dir_all(&policy).expect("policy dir");
        let files = [
            (
                "halos.yaml",
                format!(
                    "apiVersion: halos.dev/v1\norg: auth-org\nidentity:\n  issuer: {}\n  clientID: {}\n  audience: api://halos\n  claims:\n    user: email\n    groups: groups\n",
                    issuer.issuer,
                    issuer.client_id()
                ),
            ),
            (
                "gateway.yaml",
                format!(
                    "apiVersion: halos.dev/v1\nkind: Gateway\nbaseURL: https://gateway.invalid\nauth:\n  helperCommand: halo auth token --audience api://halos\nupstreams:\n  anthropic:\n    url: {}\n    kind: anthropic\n    credential:\n      env: HALO_TEST_ANTHROPIC_KEY\n  gemini:\n    url: {0}\n    kind: gemini\n    credential:\n      env: HALO_TEST_GEMINI_KEY\n  openai:\n    url: {0}\n    kind: openai\n    credential:\n      env: HALO_TEST_OPENAI_KEY\nmodels:\n  gemini-pro: {{upstream: gemini, model: gemini-2.5-pro}}\n  gpt: {{upstream: openai, model: gpt-5-codex}}\n  sonnet: {{upstream: anthropic, model: {MODEL}}}\n  opus: {{upstream: anthropic, model: {MODEL}}}\n  haiku: {{upstream: anthropic, model: {MODEL}}}\n  fable: {{upstream: anthropic, model: {MODEL}}}\n",
                    provider.url()
                ),
            ),
            (
                "profile.yaml",
                format!(
                    "apiVersion: halos.dev/v1\nkind: Profile\nname: dev\nharnesses:\n  claude-code:\n    version: {}\n    model: sonnet\n  gemini-cli:\n    version: {}\n    model: gemini-pro\n  codex:\n    version: {}\n    model: gpt\nmodels: [sonnet, opus, haiku, fable, gemini-pro, gpt]\n",
                    cc.version,
                    harness::pinned_for("gemini-cli").version,
                    harness::pinned_for("codex").version
                ),
            ),
            (
                "rings.yaml",
                "apiVersion: halos.dev/v1\nkind: Ring\nname: general\norder: 0\nprofile: dev\nmembership:\n  default: true\n".to_string(),
            ),
        ];
        for (name, text) in files {
            std::fs::write(policy.join(name), text).expect("write a policy file");
        }
        let mut org = halo_policy::load::load_dir(&policy).expect("the policy loads");
        // Envoy verifies the issuer's JWKS certificate: it trusts the fake issuer's CA.
        let ca = tmp.path().join("ca.pem");
        std::fs::write(&ca, &issuer.ca_pem).expect("CA");
        let gw = Gateway::start(
            halo_policy::compile(&org),
            GatewayOptions {
                upstream_ca_file: Some(ca.clone()),
                settings: json!({"upstreamHosts": ["127.0.0.1"]}),
                env: vec![
                    (
                        "HALO_TEST_ANTHROPIC_KEY".into(),
                        Some("sk-ant-gateway-own".into()),
                    ),
                    (
                        "HALO_TEST_GEMINI_KEY".into(),
                        Some("gemini-gateway-own".into()),
                    ),
                    (
                        "HALO_TEST_OPENAI_KEY".into(),
                        Some("sk-openai-gateway-own".into()),
                    ),
                ],
                ..GatewayOptions::default()
            },
        );
        org.gateway.base_url = gw.base.clone();
        let build = halo_release::build::build_ring(&org, "general").expect("the release builds");
        let release: Vec<(String, Vec<u8>)> = build
            .ring
            .manifest
            .files
            .iter()
            .filter(|f| f.os == Os::Linux)
            .map(|f| (f.path.clone(), build.ring.blobs[&f.sha256].clone()))
            .collect();

        // Log in with tokens that live 3 s, and let the login's token expire.
        let auth_dir = tmp.path().join("auth");
        issuer.set_token_lifetime(3);
        let mut login = Command::new(BIN);
        login
            // The flags, not --policy-dir: this policy's loopback http upstream fails the
            // https guardrail that `halo auth login --policy-dir` enforces.
            .args(["auth", "login", "--device", "--audience", "api://halos"])
            .args([
                "--issuer",
                &issuer.issuer,
                "--client-id",
                issuer.client_id(),
            ])
            .env("HALO_AUTH_DIR", &auth_dir)
            .env("HALO_AUTH_CA_FILE", &ca)
            .env_remove("DBUS_SESSION_BUS_ADDRESS");
        let login = tokio::task::block_in_place(|| common::approved_device_login(login, &issuer));
        assert!(
            login.status.success(),
            "{}",
            String::from_utf8_lossy(&login.stderr)
        );
        let expired_at = halo_auth::unix_now() + 3;
        tokio::task::block_in_place(|| {
            wait_until(
                "the login's token to expire",
                Duration::from_secs(10),
                || (halo_auth::unix_now() > expired_at).then_some(()),
            )
        });

        RealHarness {
            issuer,
            provider,
            _gw: gw,
            release,
            auth_dir,
            ca,
            _tmp: tmp,
        }
    }

    /// Run `program args` as `pinned` with the release at /etc and the real `halo` first on
    /// PATH; the tool must answer, and its helper must have refreshed the expired token.
    async fn run_answered(
        &self,
        pinned: &halo_testkit::harness::Pinned,
        program: std::path::PathBuf,
        args: &[&str],
    ) {
        let mut env = pinned.quiet_env();
        env.push(("HALO_AUTH_DIR".into(), self.auth_dir.display().to_string()));
        env.push(("HALO_AUTH_CA_FILE".into(), self.ca.display().to_string()));
        let mut path_first = vec![Path::new(BIN).parent().expect("bin dir").to_path_buf()];
        path_first.extend(pinned.binary().parent().map(Path::to_path_buf));
        let run = halo_testkit::harness::Run {
            program,
            args: args.iter().map(|a| a.to_string()).collect(),
            env,
            path_first,
            etc_files: self.release.clone(),
            home_files: pinned.home_files(),
            timeout: Duration::from_secs(90),
        };
        let out = tokio::task::spawn_blocking(move || halo_testkit::harness::run(&run))
            .await
            .expect("the harness run");
        assert_eq!(out.code, Some(0), "{}", out.describe());
        assert!(out.stdout.contains(ANSWER), "{}", out.describe());
        assert!(self.provider.calls() > 0, "the provider saw the call");
        assert!(
            self.issuer.grants().iter().any(|g| g == "refresh_token"),
            "the helper refreshed the expired token"
        );
    }
}

/// The real Claude Code (`claude -p`, the version scripts/harnesses.txt pins) with the
/// release's managed settings at /etc/claude-code (halo_testkit::harness lays them over
/// /etc in a private mount namespace) and the real `halo` on PATH: its apiKeyHelper runs
/// `halo auth token`, whose login token has already expired, so the helper refreshes and
/// the call through Envoy is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_claude_code_runs_halo_auth_token_as_its_api_key_helper() {
    let h = RealHarness::start().await;
    let cc = halo_testkit::harness::pinned_for("claude-code");
    h.run_answered(&cc, cc.binary(), &["-p", "Say hello"]).await;
}

/// The real Gemini CLI from a login shell that sources the release's profile script:
/// `GEMINI_API_KEY="$(sh -c 'halo auth token ...')"`, sent as x-goog-api-key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_gemini_cli_gets_its_key_from_halo_auth_token() {
    let h = RealHarness::start().await;
    let gemini = halo_testkit::harness::pinned_for("gemini-cli");
    let profile =
        halo_release::adapters::gemini_cli::profile_path(halo_release::adapters::Os::Linux)
            .expect("a profile script on linux");
    let line = format!(". {profile} && exec {} -p 'Say hello'", gemini.command);
    h.run_answered(&gemini, "sh".into(), &["-c", &line]).await;
}

/// The real Codex with the release's managed_config.toml: the halos provider's auth command
/// is `halo auth token ...`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_codex_gets_its_token_from_halo_auth_token() {
    let h = RealHarness::start().await;
    let codex = halo_testkit::harness::pinned_for("codex");
    h.run_answered(
        &codex,
        codex.binary(),
        &["exec", "--skip-git-repo-check", "Say hello"],
    )
    .await;
}
