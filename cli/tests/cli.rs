//! The `halo` binary end to end: real processes, real files, the example policy repo.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn halo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_halo"))
        .args(args)
        .env_remove("HALO_POLICY_DIR")
        .output()
        .expect("run halo")
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A copy of the example repo that a test may break.
fn example_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_dir(&example(), dir.path());
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("mkdir");
    for entry in fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = fs::read_to_string(path).expect("read");
    assert!(text.contains(from), "{} has no {from:?}", path.display());
    fs::write(path, text.replacen(from, to, 1)).expect("write");
}

#[test]
fn validate_accepts_the_example() {
    let out = halo(&["validate", "--policy-dir", example().to_str().unwrap()]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(
        stdout(&out).contains("is valid: org acme-corp"),
        "{}",
        stdout(&out)
    );
    // Every routed model is priced: no unpriced warning.
    assert!(!stderr(&out).contains("[unpriced]"), "{}", stderr(&out));
}

#[test]
fn validate_warns_for_a_routed_model_without_a_price() {
    let repo = example_copy();
    edit(
        &repo.path().join("gateway.yaml"),
        "  openai:\n    gpt-5-codex:",
        "  openai:\n    gpt-4o:",
    );
    let out = halo(&["validate", "--policy-dir", repo.path().to_str().unwrap()]);
    assert!(out.status.success(), "a warning only: {}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("warning: gateway.yaml")
            && err.contains("models.gpt.targets[0]")
            && err.contains("[unpriced]"),
        "{err}"
    );
}

#[test]
fn validate_names_file_and_field_of_an_unknown_field() {
    let repo = example_copy();
    edit(
        &repo.path().join("gateway.yaml"),
        "timeoutSeconds: 30",
        "timeoutSecs: 30",
    );
    let out = halo(&["validate", "--policy-dir", repo.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("gateway.yaml (document 1)"), "{err}");
    assert!(err.contains("timeoutSecs"), "{err}");
}

#[test]
fn validate_refuses_a_bypass_token_naming_file_and_field() {
    let repo = example_copy();
    let profile = repo.path().join("profiles/base.yaml");
    let text = fs::read_to_string(&profile).expect("read");
    let patched = text.replacen("defaultMode: ", "defaultMode: bypassPermissions #", 1);
    assert_ne!(
        text, patched,
        "profiles/base.yaml sets permissions.defaultMode"
    );
    fs::write(&profile, patched).expect("write");
    let out = halo(&["validate", "--policy-dir", repo.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("profiles/base.yaml"), "{err}");
    assert!(err.contains("permissions.defaultMode"), "{err}");
    assert!(err.contains("guardNoBypass"), "{err}");
}

/// The spec says an azure-openai upstream's credential is required (issue 27, item 11).
#[test]
fn validate_refuses_an_azure_openai_upstream_without_a_credential() {
    let repo = example_copy();
    edit(
        &repo.path().join("gateway.yaml"),
        "    apiVersion: 2025-04-01-preview\n    credential:\n      env: AZURE_OPENAI_API_KEY\n",
        "    apiVersion: 2025-04-01-preview\n",
    );
    let out = halo(&["validate", "--policy-dir", repo.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("gateway.yaml"), "{err}");
    assert!(
        err.contains("upstreams.azure-openai-eus2.credential"),
        "{err}"
    );
}

#[test]
fn validate_lists_every_problem_not_just_the_first() {
    let repo = example_copy();
    let gateway = repo.path().join("gateway.yaml");
    edit(&gateway, "weight: 90", "weight: 0");
    edit(
        &gateway,
        "upstream: anthropic-direct",
        "upstream: no-such-upstream",
    );
    let out = halo(&["validate", "--policy-dir", repo.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("weight"), "{err}");
    assert!(err.contains("no-such-upstream"), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    let out = halo(&["validate"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = halo(&["no-such-command"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn compile_is_deterministic_and_writes_nothing_on_failure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.json");
    let b = dir.path().join("b.json");
    for out in [&a, &b] {
        let run = halo(&[
            "gateway",
            "compile",
            "--policy-dir",
            example().to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(run.status.success(), "{}", stderr(&run));
    }
    let first = fs::read(&a).expect("a");
    assert_eq!(first, fs::read(&b).expect("b"), "same policy, same bytes");
    let snapshot = halo_policy::Snapshot::from_bytes(&first).expect("snapshot decodes");
    assert_eq!(snapshot.org, "acme-corp");
    assert!(snapshot.models.contains_key("opus"));

    let repo = example_copy();
    edit(&repo.path().join("gateway.yaml"), "weight: 90", "weight: 0");
    let c = dir.path().join("c.json");
    let run = halo(&[
        "gateway",
        "compile",
        "--policy-dir",
        repo.path().to_str().unwrap(),
        "-o",
        c.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(1));
    assert!(!c.exists(), "an invalid policy writes nothing");
    let leftovers: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 2, "no temp files left behind");
}

#[test]
fn routes_prints_the_table_for_a_user() {
    let out = halo(&[
        "gateway",
        "routes",
        "--user",
        "alice@acme.com",
        "--session",
        "s-42",
        "--policy-dir",
        example().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(r#"Routes for user "alice@acme.com" session "s-42""#)
    );
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "ALIAS", "ORDER", "UPSTREAM", "KIND", "MODEL", "WEIGHT", "PRIORITY", "TIMEOUT", "NOTES"
        ]
    );
    // The opus rows of the traffic-plane doc: Bedrock first, Anthropic as failover.
    let opus: Vec<&str> = text.lines().filter(|l| l.starts_with("opus ")).collect();
    assert_eq!(opus.len(), 2, "{text}");
    assert!(opus[0].contains("bedrock-use1"), "{}", opus[0]);
    assert!(opus[0].contains("30s"), "{}", opus[0]);
    assert!(opus[0].contains("<- hit when healthy"), "{}", opus[0]);
    assert!(
        opus[0].contains("skipped by codex,gemini-cli"),
        "{}",
        opus[0]
    );
    assert!(opus[1].contains("anthropic-direct"), "{}", opus[1]);
    assert!(opus[1].ends_with("skipped by gemini-cli"), "{}", opus[1]);
    // default: both weighted targets, exactly one of them hit when healthy.
    let default: Vec<&str> = text.lines().filter(|l| l.starts_with("default ")).collect();
    assert_eq!(default.len(), 2, "{text}");
    assert_eq!(
        default
            .iter()
            .filter(|l| l.contains("<- hit when healthy"))
            .count(),
        1
    );
}

#[test]
fn routes_shows_the_budgets_that_apply_to_the_user() {
    let dir = example_copy();
    let gateway = dir.path().join("gateway.yaml");
    let text = fs::read_to_string(&gateway).unwrap();
    fs::write(
        &gateway,
        format!(
            "{text}budgets:\n  eng-daily:\n    appliesTo: {{groups: [eng]}}\n    period: day\n    timeZone: Europe/Berlin\n    limit: {{usd: 50}}\n  org-monthly:\n    appliesTo: {{users: [bob@acme.com]}}\n    count: pooled\n    period: month\n    limit: {{tokens: 1000000}}\n"
        ),
    )
    .unwrap();
    let routes = |user: &str, group: &str| {
        let out = halo(&[
            "gateway",
            "routes",
            "--user",
            user,
            "--group",
            group,
            "--policy-dir",
            dir.path().to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let text = routes("alice@acme.com", "eng");
    let budgets: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Budgets"))
        .collect();
    assert_eq!(
        budgets,
        [
            "Budgets (each is checked; any one spent refuses):",
            "BUDGET     LIMIT                          COUNT     AT LIMIT",
            "eng-daily  USD 50 per day, Europe/Berlin  per user  refuse (429)",
        ],
        "{text}"
    );
    let text = routes("carol@acme.com", "sales");
    assert!(text.ends_with("Budgets: none apply\n"), "{text}");
}

#[test]
fn routes_pick_is_sticky_per_user_and_session() {
    let run = |user: &str, session: &str| {
        let out = halo(&[
            "gateway",
            "routes",
            "--user",
            user,
            "--session",
            session,
            "--policy-dir",
            example().to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    assert_eq!(run("alice@acme.com", "s-42"), run("alice@acme.com", "s-42"));
    // Over many sessions, the 90/10 split of `default` must send some to each target.
    let firsts: Vec<bool> = (0..40)
        .map(|i| {
            let text = run("bob@acme.com", &format!("s-{i}"));
            let line = text
                .lines()
                .find(|l| l.starts_with("default ") && l.contains("<- hit when healthy"))
                .expect("a first default row")
                .to_string();
            line.contains("claude-sonnet")
        })
        .collect();
    assert!(
        firsts.iter().any(|&s| s),
        "sonnet (90%) is picked sometimes"
    );
}

#[test]
fn keys_generate_writes_a_private_key_0600_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out_dir = dir.path().to_str().unwrap();
    let out = halo(&[
        "keys",
        "generate",
        "--name",
        "killswitch",
        "--out-dir",
        out_dir,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let private = dir.path().join("killswitch.key");
    let public = dir.path().join("killswitch.pub");
    let private_pem = fs::read_to_string(&private).expect("private key");
    let public_pem = fs::read_to_string(&public).expect("public key");
    assert!(private_pem.contains("BEGIN PRIVATE KEY"));
    halo_policy::keys::public_key_from_pem(&public_pem).expect("public key parses");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&private).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    let again = halo(&[
        "keys",
        "generate",
        "--name",
        "killswitch",
        "--out-dir",
        out_dir,
    ]);
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("refusing to overwrite"));
    assert_eq!(
        fs::read_to_string(&private).unwrap(),
        private_pem,
        "untouched"
    );
}
