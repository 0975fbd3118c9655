//! `halo envoy bootstrap` end to end: files in, a bootstrap out, bad flags refused.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn halo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_halo"))
        .args(args)
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."))
        .env_remove("HALO_POLICY_DIR")
        .output()
        .expect("run halo")
}

fn pubkey_pem() -> String {
    let key = ed25519_dalek::SigningKey::from_bytes(&[5; 32]);
    halo_policy::keys::KeyPair::from_signing_key(&key)
        .expect("pair")
        .public_pem
}

#[test]
fn renders_the_bootstrap_with_the_kill_list_owner_only() {
    let dir = tempfile::tempdir().expect("tmp");
    let token = dir.path().join("token");
    let pubkey = dir.path().join("kill.pub");
    std::fs::write(&token, "gw-secret-token\n").expect("token");
    std::fs::write(&pubkey, pubkey_pem()).expect("pem");
    let out = dir.path().join("envoy.yaml");
    let o = halo(&[
        "envoy",
        "bootstrap",
        "--policy-dir",
        "examples/acme-corp",
        "--killswitch-url",
        "https://halo-server.acme.internal/api/v1/gateway/killswitch",
        "--killswitch-token-file",
        token.to_str().expect("utf8"),
        "--killswitch-pubkey",
        pubkey.to_str().expect("utf8"),
        "--listen",
        "127.0.0.1:18080",
        "-o",
        out.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let yaml = std::fs::read_to_string(&out).expect("written");
    assert!(yaml.starts_with("# Envoy standalone bootstrap for Halos"));
    assert!(yaml.contains("port_value: 18080"));
    assert!(yaml.contains("halo-killswitch"));
    assert!(
        yaml.contains("gw-secret-token"),
        "the token rides in the plugin configuration"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&out).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a file holding the token is owner-only");

    // Shadow jobs: the mirror service's cluster with its circuit breakers, the token in
    // the filter's settings.
    let shadow_token = dir.path().join("shadow.token");
    std::fs::write(&shadow_token, "shadow-secret-token\n").expect("token");
    let o = halo(&[
        "envoy",
        "bootstrap",
        "--policy-dir",
        "examples/acme-corp",
        "--shadow-url",
        "https://halo-server.acme.internal:9445/mirror",
        "--shadow-token-file",
        shadow_token.to_str().expect("utf8"),
        "--shadow-max-bytes",
        "65536",
        "-o",
        out.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let yaml = std::fs::read_to_string(&out).expect("written");
    assert!(yaml.contains("halo-shadow") && yaml.contains("max_pending_requests: 64"));
    assert!(yaml.contains("shadow-secret-token") && yaml.contains("65536"));
    let mode = std::fs::metadata(&out).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a file holding the shadow token is owner-only");

    // Never to stdout with a secret inside.
    let o = halo(&[
        "envoy",
        "bootstrap",
        "--policy-dir",
        "examples/acme-corp",
        "--killswitch-url",
        "https://h/k",
        "--killswitch-token-file",
        token.to_str().expect("utf8"),
        "--killswitch-pubkey",
        pubkey.to_str().expect("utf8"),
        "-o",
        "-",
    ]);
    assert_eq!(o.status.code(), Some(1));
}

/// `--budget-url` and `--budget-token-file` (halo-server's `--budget-listen` and its
/// token): a policy with budgets gets Envoy's ratelimit filter after the halo filter and
/// the `halo-budget` cluster, the token in the bootstrap (written 0600); without the flags
/// the plan warns that the budgets are not enforced.
#[test]
fn renders_the_budget_check_with_the_budget_service_and_its_token() {
    let dir = tempfile::tempdir().expect("tmp");
    let policy = dir.path().join("policy");
    let copied = Command::new("cp")
        .args(["-r", "examples/acme-corp"])
        .arg(&policy)
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."))
        .status()
        .expect("cp");
    assert!(copied.success());
    let gateway = policy.join("gateway.yaml");
    let text = std::fs::read_to_string(&gateway).expect("gateway.yaml");
    std::fs::write(
        &gateway,
        text + "budgets:\n  eng-daily:\n    appliesTo: {groups: [engineering]}\n    period: day\n    limit: {usd: 50}\n",
    )
    .expect("gateway.yaml");
    let token = dir.path().join("budget.token");
    std::fs::write(&token, "budget-secret-token\n").expect("token");
    let out = dir.path().join("envoy.yaml");
    let bootstrap = |extra: &[&str]| {
        let mut a = vec![
            "envoy",
            "bootstrap",
            "--policy-dir",
            policy.to_str().expect("utf8"),
            "-o",
            out.to_str().expect("utf8"),
        ];
        a.extend_from_slice(extra);
        halo(&a)
    };
    let o = bootstrap(&[
        "--budget-url",
        "https://halo-server.acme.internal:4321",
        "--budget-token-file",
        token.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let yaml = std::fs::read_to_string(&out).expect("written");
    assert!(yaml.contains("envoy.filters.http.ratelimit") && yaml.contains("halo-budget"));
    assert!(
        yaml.contains("Bearer budget-secret-token"),
        "the token as gRPC metadata"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&out).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a file holding the budget token is owner-only");

    // Without the service: rendered, with the warning that the budgets are not enforced.
    let o = bootstrap(&[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("budgets but the settings name no budget service"),
        "{stderr}"
    );
    let yaml = std::fs::read_to_string(&out).expect("written");
    assert!(!yaml.contains("envoy.filters.http.ratelimit"));
    // One flag without the other is refused.
    let o = bootstrap(&["--budget-url", "https://h:4321"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--budget-token-file"));
}

#[test]
fn plain_http_kill_list_needs_the_in_cluster_opt_in_and_opt_outs_warn() {
    let dir = tempfile::tempdir().expect("tmp");
    let token = dir.path().join("token");
    let pubkey = dir.path().join("kill.pub");
    std::fs::write(&token, "t").expect("token");
    std::fs::write(&pubkey, pubkey_pem()).expect("pem");
    let out = dir.path().join("envoy.yaml");
    let base = |extra: &[&str]| {
        let mut a = vec![
            "envoy",
            "bootstrap",
            "--policy-dir",
            "examples/acme-corp",
            "--killswitch-url",
            "http://halo-server.halos:8080/api/v1/gateway/killswitch",
            "--killswitch-token-file",
            token.to_str().expect("utf8"),
            "--killswitch-pubkey",
            pubkey.to_str().expect("utf8"),
            "-o",
            out.to_str().expect("utf8"),
        ];
        a.extend_from_slice(extra);
        halo(&a)
    };
    let o = base(&[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--killswitch-allow-insecure-in-cluster"));
    let o = base(&[
        "--killswitch-allow-insecure-in-cluster",
        "--allow-unverified",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("warning"));
    let yaml = std::fs::read_to_string(&out).expect("written");
    assert!(yaml.contains("# WARNING: --allow-unverified"));
}

#[test]
fn gateway_settings_from_a_file_reach_the_renderer_and_a_misspelt_key_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("envoy.yaml");
    let settings = dir.path().join("gateway.yaml");
    std::fs::write(
        &settings,
        "upstreamHeaders:\n  llm-orchestrator:\n    x-api-key: \"${ORCH_KEY}\"\nupstreamHosts: [llm.acme.internal]\n",
    )
    .expect("settings");
    let args = |settings: &str| {
        vec![
            "envoy".to_string(),
            "bootstrap".into(),
            "--policy-dir".into(),
            "examples/acme-corp".into(),
            "--gateway-settings".into(),
            settings.to_string(),
            "-o".into(),
            out.to_str().expect("utf8").into(),
        ]
    };
    let run = |a: Vec<String>| halo(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let o = run(args(settings.to_str().expect("utf8")));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let yaml = std::fs::read_to_string(&out).expect("written");
    // The header's value is a reference to Envoy's environment, never a value.
    assert!(yaml.contains("%ENVIRONMENT(ORCH_KEY)%"), "{yaml}");
    // The renderer's settings do not reach the filter's configuration.
    assert!(!yaml.contains("upstreamHeaders"));

    std::fs::write(&settings, "upstreamHost: [x]\n").expect("settings");
    let o = run(args(settings.to_str().expect("utf8")));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("gateway.yaml") && err.contains("upstreamHost"),
        "{err}"
    );
}

/// Keys are read at use time by each target's credential step (#27 item 3): the bootstrap
/// holds no secret resource Envoy would read at load (one missing variable made Envoy
/// refuse the whole configuration), only the variable's name.
#[test]
fn keys_are_read_at_use_time_and_no_secret_resource_is_rendered() {
    let o = halo(&[
        "envoy",
        "bootstrap",
        "--policy-dir",
        "examples/acme-corp",
        "-o",
        "-",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let yaml = String::from_utf8_lossy(&o.stdout);
    assert!(!yaml.contains("secrets:"), "{yaml}");
    assert!(!yaml.contains("environment_variable"), "{yaml}");
    assert!(yaml.contains("os.getenv("), "{yaml}");
}

#[test]
fn a_shared_object_filter_path_renders_the_native_build() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("envoy.yaml");
    let o = halo(&[
        "envoy",
        "bootstrap",
        "--policy-dir",
        "examples/acme-corp",
        "--filter",
        "/etc/halos/libhalo_filter_native.so",
        "-o",
        out.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let yaml = std::fs::read_to_string(&out).expect("written");
    assert!(yaml.contains("envoy.filters.http.dynamic_modules"));
    assert!(yaml.contains("filename: \"/etc/halos/libhalo_filter_native.so\""));
    assert!(
        !yaml.contains("envoy.filters.http.wasm"),
        "no wasm plugin left"
    );
    // The native build reads the verified payload from the header jwt_authn forwards.
    assert!(yaml.contains("forward_payload_header: \"x-halo-jwt-payload\""));
}

/// A copy of examples/acme-corp in `dir/name` whose identity issuer is `issuer`.
fn acme_with_issuer(dir: &std::path::Path, name: &str, issuer: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp");
    let to = dir.join(name);
    let o = Command::new("cp")
        .args([
            "-r",
            root.to_str().expect("utf8"),
            to.to_str().expect("utf8"),
        ])
        .output()
        .expect("cp");
    assert!(o.status.success());
    let halos = to.join("halos.yaml");
    let text = std::fs::read_to_string(&halos).expect("halos.yaml");
    std::fs::write(
        &halos,
        text.replace("https://acme.okta.com/oauth2/aus9halos2acme7corp", issuer),
    )
    .expect("write");
    to
}

/// The JWKS URL is read from the issuer's OIDC discovery document (as Okta's, not at
/// `<issuer>/.well-known/jwks.json`), over https with the CA Envoy is told to trust; an
/// override is kept; keys or a discovery document that cannot be read are warnings.
#[test]
fn the_jwks_uri_is_the_discovery_documents_and_unreadable_keys_warn() {
    let issuer = halo_testkit::oidc::FakeIssuer::start();
    let dir = tempfile::tempdir().expect("tmp");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &issuer.ca_pem).expect("CA");
    let ca = ca.to_str().expect("utf8").to_string();
    let render = |policy: &std::path::Path, extra: &[&str]| {
        let mut args = vec![
            "envoy",
            "bootstrap",
            "--policy-dir",
            policy.to_str().expect("utf8"),
            "--upstream-ca-file",
            &ca,
            "--output",
            "-",
        ];
        args.extend_from_slice(extra);
        let o = halo(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let live = acme_with_issuer(dir.path(), "live", &issuer.issuer);
    // Discovery names the keys' URL: it is rendered, and nothing is said about it.
    let (yaml, err) = render(&live, &[]);
    assert!(
        yaml.contains(&format!("uri: \"{}/keys\"", issuer.issuer)),
        "{yaml}"
    );
    assert!(!yaml.contains(".well-known/jwks.json"), "{yaml}");
    assert!(!err.contains("keys") && !err.contains("discovery"), "{err}");
    // An override is kept; keys that cannot be read are a warning, in the file too.
    let nowhere = format!("{}/nowhere", issuer.issuer);
    let (yaml, err) = render(&live, &["--jwks-uri", &nowhere]);
    assert!(yaml.contains(&format!("uri: \"{nowhere}\"")), "{yaml}");
    assert!(
        yaml.contains("# WARNING: cannot read the issuer's keys at"),
        "{yaml}"
    );
    assert!(
        err.contains("until Envoy can, it refuses every token"),
        "{err}"
    );
    // No discovery document (nothing listens): the default, with a warning.
    let gone = format!("https://127.0.0.1:{}", halo_testkit::free_port());
    let dead = acme_with_issuer(dir.path(), "dead", &gone);
    let (yaml, err) = render(&dead, &[]);
    assert!(err.contains("OIDC discovery document"), "{err}");
    assert!(
        yaml.contains(&format!("uri: \"{gone}/.well-known/jwks.json\"")),
        "{yaml}"
    );
}

/// Edge mode (#27 item 12): `--next-hop` points every target's cluster at the next hop;
/// the policy's credentials are unused, which is said; a next hop with a path is refused.
#[test]
fn next_hop_sends_every_target_to_the_next_hop() {
    let render = |hop: &str| {
        halo(&[
            "envoy",
            "bootstrap",
            "--policy-dir",
            "examples/acme-corp",
            "--next-hop",
            hop,
            "-o",
            "-",
        ])
    };
    let o = render("http://kong.internal:8000");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let yaml = String::from_utf8_lossy(&o.stdout);
    assert!(yaml.contains("address: \"kong.internal\""), "{yaml}");
    assert!(!yaml.contains("address: \"api.openai.com\""), "{yaml}");
    assert!(
        !yaml.contains("os.getenv("),
        "no key of the gateway's: {yaml}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not used in edge mode"), "{err}");
    let o = render("http://kong.internal:8000/llm");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("nextHop"));
}
