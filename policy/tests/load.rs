// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "load")]
//! The strict loader: what loads, and that every problem names its file, document and field.

use std::path::Path;

use halo_policy::load::{LoadError, load_dir, load_files, rule};
use halo_policy::{DocumentSource, Effect, Harness, Issue, Kind, Org};

const ROOT: &str = "apiVersion: halos.dev/v1\norg: acme\n";

const GATEWAY: &str = "\
apiVersion: halos.dev/v1
kind: Gateway
baseURL: https://gateway.acme.dev
models:
  opus:
    targets:
      - upstream: anthropic
        model: claude-opus-4-1
upstreams:
  anthropic:
    url: https://api.anthropic.com
    kind: anthropic
";

fn ring(name: &str, order: u32) -> String {
    format!("apiVersion: halos.dev/v1\nkind: Ring\nname: {name}\norder: {order}\nprofile: base\n")
}

fn owned(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(name, text)| (name.to_string(), text.to_string()))
        .collect()
}

fn load_ok(files: &[(&str, &str)]) -> Org {
    match load_files(owned(files)) {
        Ok(org) => org,
        Err(err) => panic!("expected the policy to load, got: {err}"),
    }
}

fn load_issues(files: &[(&str, &str)]) -> Vec<Issue> {
    match load_files(owned(files)) {
        Err(LoadError::Invalid(issues)) => issues,
        Err(err) => panic!("expected issues, got {err}"),
        Ok(_) => panic!("expected issues, the policy loaded"),
    }
}

/// A valid root and Gateway plus `extra` files.
fn with_base<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut files = vec![("halos.yaml", ROOT), ("gateway.yaml", GATEWAY)];
    files.extend_from_slice(extra);
    files
}

fn src(file: &str, document: usize) -> Option<DocumentSource> {
    Some(DocumentSource {
        file: file.to_string(),
        document,
    })
}

fn write_tree(dir: &Path, files: &[(&str, &[u8])]) {
    for (name, bytes) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
}

fn dir_issues(dir: &Path) -> Vec<Issue> {
    match load_dir(dir) {
        Err(LoadError::Invalid(issues)) => issues,
        Err(err) => panic!("expected issues, got {err}"),
        Ok(_) => panic!("expected issues, the policy loaded"),
    }
}

#[test]
fn a_valid_multi_file_multi_document_policy_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let rings = format!(
        "# the rings\n---\n{}---\n---\n{}",
        ring("canary", 1),
        ring("everyone", 9)
    );
    let profile = "\
apiVersion: halos.dev/v1
kind: Profile
name: base
harnesses:
  claude-code:
    version: 2.0
    model: opus
";
    let toggle = "\
kind: Toggle
apiVersion: halos.dev/v1
name: fast-mode
owner: platform@acme.dev
expires: 2026-12-31
axis: client
rules:
  - rings: [canary]
    effect: on
  - effect: off
";
    let experiment = "\
apiVersion: halos.dev/v1
kind: Experiment
name: opus-vs-sonnet
type: ab
axis: traffic
status: running
rings: [canary]
salt: s1
variants:
  - name: control
    weight: 1
";
    let rollout = "\
apiVersion: halos.dev/v1
kind: Rollout
name: opus-route
axis: traffic
experiment: opus-vs-sonnet
change:
  alias:
    name: opus
    route: {upstream: anthropic, model: claude-opus-4-1}
steps:
  - ring: canary
    bake: 30m
";
    write_tree(
        tmp.path(),
        &[
            ("halos.yaml", ROOT.as_bytes()),
            ("gateway.yaml", GATEWAY.as_bytes()),
            ("rings.yaml", rings.as_bytes()),
            ("profiles/base.yaml", profile.as_bytes()),
            ("toggles/fast-mode.yml", toggle.as_bytes()),
            (
                "experiments/all.yaml",
                format!("{experiment}---\n{rollout}").as_bytes(),
            ),
        ],
    );

    let org = load_dir(tmp.path()).unwrap();

    assert_eq!(org.root.org, "acme");
    assert_eq!(org.gateway.base_url, "https://gateway.acme.dev");
    assert_eq!(org.rings.keys().collect::<Vec<_>>(), ["canary", "everyone"]);
    assert_eq!(org.rings["everyone"].order, 9);
    // An unquoted 2.0 is the version text, not a float.
    assert_eq!(
        org.profiles["base"].harnesses[&Harness::ClaudeCode].version,
        "2.0"
    );
    let toggle = &org.toggles["fast-mode"];
    assert_eq!(toggle.expires, "2026-12-31");
    let effects: Vec<Effect> = toggle.rules.iter().map(|r| r.effect).collect();
    assert_eq!(effects, [Effect::On, Effect::Off]);
    assert_eq!(
        org.experiments["opus-vs-sonnet"].variants[0].name,
        "control"
    );
    assert_eq!(org.rollouts["opus-route"].steps[0].bake, "30m");

    // Documents are numbered by their position in the file, empty ones included.
    assert_eq!(org.source(Kind::Root, ""), src("halos.yaml", 1).as_ref());
    assert_eq!(
        org.source(Kind::Gateway, ""),
        src("gateway.yaml", 1).as_ref()
    );
    assert_eq!(
        org.source(Kind::Ring, "canary"),
        src("rings.yaml", 1).as_ref()
    );
    assert_eq!(
        org.source(Kind::Ring, "everyone"),
        src("rings.yaml", 3).as_ref()
    );
    assert_eq!(
        org.source(Kind::Profile, "base"),
        src("profiles/base.yaml", 1).as_ref()
    );
    assert_eq!(
        org.source(Kind::Toggle, "fast-mode"),
        src("toggles/fast-mode.yml", 1).as_ref()
    );
    assert_eq!(
        org.source(Kind::Rollout, "opus-route"),
        src("experiments/all.yaml", 2).as_ref()
    );
    assert_eq!(org.sources.len(), 8);
}

#[test]
fn quoted_on_and_off_are_effects_and_other_spellings_are_not() {
    let toggle = "\
apiVersion: halos.dev/v1
kind: Toggle
name: t
owner: me
expires: \"2027-01-01\"
axis: traffic
rules:
  - effect: \"off\"
  - effect: 'on'
";
    let org = load_ok(&with_base(&[("t.yaml", toggle)]));
    let effects: Vec<Effect> = org.toggles["t"].rules.iter().map(|r| r.effect).collect();
    assert_eq!(effects, [Effect::Off, Effect::On]);
    assert_eq!(org.toggles["t"].expires, "2027-01-01");

    // YAML 1.1 spells booleans many ways; an effect is exactly `on` or `off`.
    for spelling in ["On", "yes", "true"] {
        let bad = format!("{toggle}  - effect: {spelling}\n");
        let issues = load_issues(&with_base(&[("t.yaml", &bad)]));
        assert_eq!(issues.len(), 1, "{issues:#?}");
        assert_eq!(issues[0].field, "rules[2].effect");
        assert!(
            issues[0].message.contains("`on`, `off`"),
            "{}",
            issues[0].message
        );
    }
}

#[test]
fn an_unknown_field_names_file_document_and_path() {
    let gateway = format!(
        "{}---\napiVersion: halos.dev/v1\nkind: Profile\nname: p\n---\n{GATEWAY}",
        ring("r", 1)
    )
    .replace(
        "model: claude-opus-4-1",
        "model: claude-opus-4-1\n        wieght: 3",
    );
    let issues = load_issues(&[("halos.yaml", ROOT), ("gateway.yaml", &gateway)]);
    assert_eq!(issues.len(), 1, "{issues:#?}");
    let issue = &issues[0];
    assert_eq!(issue.source, src("gateway.yaml", 3));
    assert_eq!(issue.field, "models.opus.targets[0].wieght");
    assert_eq!(issue.rule, rule::DECODE);
    assert!(issue.is_error());
    assert!(
        issue.message.contains("unknown field `wieght`"),
        "{}",
        issue.message
    );
    assert!(issue.message.contains("`weight`"), "{}", issue.message);
    // Line 19 of the file: the line of `wieght`, counted from the top of the file.
    assert!(
        issue.message.contains("(line 19, column 9)"),
        "{}",
        issue.message
    );
    assert!(issue.to_string().starts_with(
        "error: gateway.yaml (document 3): models.opus.targets[0].wieght: unknown field"
    ));
}

#[test]
fn an_unknown_top_level_field_is_named() {
    let issues = load_issues(&with_base(&[(
        "r.yaml",
        &format!("{}colour: red\n", ring("r", 1)),
    )]));
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].source, src("r.yaml", 1));
    assert_eq!(issues[0].field, "colour");
    assert!(
        issues[0].message.contains("line 6"),
        "{}",
        issues[0].message
    );
}

#[test]
fn a_wrong_type_names_the_field() {
    let bad_order = ring("r", 1).replace("order: 1", "order: many");
    let bad_percent = format!("{}membership:\n  percent: -3\n", ring("s", 2));
    let bad_profile = ring("t", 3).replace("profile: base", "profile: [a, b]");
    let issues = load_issues(&with_base(&[
        ("a.yaml", &bad_order),
        ("b.yaml", &bad_percent),
        ("c.yaml", &bad_profile),
    ]));
    let fields: Vec<(&str, &str)> = issues
        .iter()
        .map(|i| (i.source.as_ref().unwrap().file.as_str(), i.field.as_str()))
        .collect();
    assert_eq!(
        fields,
        [
            ("a.yaml", "order"),
            ("b.yaml", "membership.percent"),
            ("c.yaml", "profile")
        ]
    );
    assert!(issues.iter().all(|i| i.rule == rule::DECODE));
    assert!(
        issues[0].message.contains("`many`"),
        "{}",
        issues[0].message
    );
}

#[test]
fn a_missing_field_names_it() {
    let no_profile = "apiVersion: halos.dev/v1\nkind: Ring\nname: r\norder: 1\n";
    let issues = load_issues(&with_base(&[("r.yaml", no_profile)]));
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].field, "profile");
    assert!(issues[0].message.contains("missing field `profile`"));
}

#[test]
fn an_unknown_kind_is_refused() {
    let issues = load_issues(&with_base(&[(
        "x.yaml",
        "apiVersion: halos.dev/v1\nkind: Cohort\nname: x\n",
    )]));
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].source, src("x.yaml", 1));
    assert_eq!(issues[0].field, "kind");
    assert_eq!(issues[0].rule, rule::KIND);
    assert!(issues[0].message.contains("`Cohort`"));
    assert!(issues[0].message.contains("Ring"), "names the known kinds");
}

#[test]
fn a_missing_kind_is_refused() {
    let issues = load_issues(&with_base(&[(
        "x.yaml",
        "apiVersion: halos.dev/v1\nname: x\n",
    )]));
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(
        (issues[0].field.as_str(), issues[0].rule.as_str()),
        ("kind", rule::KIND)
    );
    assert!(issues[0].message.contains("missing kind"));
}

#[test]
fn a_wrong_or_missing_api_version_is_refused() {
    let wrong = ring("a", 1).replace("halos.dev/v1", "halos.dev/v2");
    let missing = ring("b", 2).replace("apiVersion: halos.dev/v1\n", "");
    let issues = load_issues(&with_base(&[("a.yaml", &wrong), ("b.yaml", &missing)]));
    assert_eq!(issues.len(), 2, "{issues:#?}");
    assert_eq!(issues[0].source, src("a.yaml", 1));
    assert_eq!(issues[1].source, src("b.yaml", 1));
    for issue in &issues {
        assert_eq!(issue.field, "apiVersion");
        assert_eq!(issue.rule, rule::API_VERSION);
    }
    assert!(issues[0].message.contains("`halos.dev/v2`"));
    assert!(issues[1].message.contains("missing apiVersion"));

    let issues = load_issues(&[("halos.yaml", "org: acme\n"), ("gateway.yaml", GATEWAY)]);
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].source, src("halos.yaml", 1));
    assert_eq!(issues[0].rule, rule::API_VERSION);
}

#[test]
fn a_missing_halos_yaml_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    write_tree(tmp.path(), &[("gateway.yaml", GATEWAY.as_bytes())]);
    let issues = dir_issues(tmp.path());
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].source, None);
    assert_eq!(issues[0].rule, rule::MISSING);
    assert!(issues[0].message.contains("halos.yaml"));
}

#[test]
fn an_empty_halos_yaml_is_refused() {
    let issues = load_issues(&[("halos.yaml", "# nothing yet\n"), ("gateway.yaml", GATEWAY)]);
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].rule, rule::MISSING);
    assert!(issues[0].message.contains("halos.yaml is empty"));
}

#[test]
fn halos_yaml_has_no_kind() {
    let root = "apiVersion: halos.dev/v1\nkind: Root\norg: acme\n";
    let issues = load_issues(&[("halos.yaml", root), ("gateway.yaml", GATEWAY)]);
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].source, src("halos.yaml", 1));
    assert_eq!(
        (issues[0].field.as_str(), issues[0].rule.as_str()),
        ("kind", rule::KIND)
    );
}

#[test]
fn halos_yaml_holds_one_document() {
    let root = format!("{ROOT}---\n{ROOT}");
    let issues = load_issues(&[("halos.yaml", &root), ("gateway.yaml", GATEWAY)]);
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].source, src("halos.yaml", 2));
    assert_eq!(issues[0].rule, rule::DUPLICATE);
}

#[test]
fn a_duplicate_mapping_key_is_an_error() {
    // An alias given twice under `models`.
    let nested = GATEWAY.replace(
        "models:\n",
        "models:\n  sonnet:\n    upstream: anthropic\n    model: s\n  sonnet:\n    upstream: anthropic\n    model: t\n",
    );
    let issues = load_issues(&[("halos.yaml", ROOT), ("gateway.yaml", &nested)]);
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].source, src("gateway.yaml", 1));
    assert_eq!(issues[0].field, "models.sonnet");
    assert_eq!(issues[0].rule, rule::DUPLICATE);
    assert!(issues[0].message.contains("duplicate key `sonnet`"));
    assert!(
        issues[0].message.contains("line 8"),
        "{}",
        issues[0].message
    );

    // A top-level key given twice, in a later document of the file.
    let twice = format!("{}---\n{GATEWAY}models: {{}}\n", ring("r", 1));
    let issues = load_issues(&[("halos.yaml", ROOT), ("gateway.yaml", &twice)]);
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].source, src("gateway.yaml", 2));
    assert_eq!(issues[0].field, "models");
    assert_eq!(issues[0].rule, rule::DUPLICATE);
    assert!(
        issues[0].message.contains("line 19"),
        "{}",
        issues[0].message
    );
}

#[test]
fn duplicate_names_across_files_name_both_sources() {
    let issues = load_issues(&with_base(&[
        (
            "rings/a.yaml",
            &format!("{}---\n{}", ring("beta", 1), ring("canary", 2)),
        ),
        ("rings/b.yaml", &ring("canary", 3)),
        (
            "profiles.yaml",
            "apiVersion: halos.dev/v1\nkind: Profile\nname: canary\n",
        ),
    ]));
    // A Profile may share a Ring's name: only same-kind names clash.
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].source, src("rings/b.yaml", 1));
    assert_eq!(issues[0].field, "name");
    assert_eq!(issues[0].rule, rule::DUPLICATE);
    assert!(
        issues[0].message.contains("Ring `canary`"),
        "{}",
        issues[0].message
    );
    assert!(
        issues[0].message.contains("rings/a.yaml (document 2)"),
        "{}",
        issues[0].message
    );
}

#[test]
fn two_gateways_are_refused() {
    let issues = load_issues(&with_base(&[("more/gateway.yml", GATEWAY)]));
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].source, src("more/gateway.yml", 1));
    assert_eq!(issues[0].rule, rule::DUPLICATE);
    assert!(
        issues[0].message.contains("gateway.yaml (document 1)"),
        "{}",
        issues[0].message
    );
}

#[test]
fn a_policy_without_a_gateway_is_refused() {
    let issues = load_issues(&[("halos.yaml", ROOT), ("rings.yaml", &ring("r", 1))]);
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].source, None);
    assert_eq!(issues[0].rule, rule::MISSING);
    assert!(issues[0].message.contains("no Gateway document"));
}

#[test]
fn a_broken_gateway_file_is_not_also_a_missing_gateway() {
    let broken = GATEWAY.replace("baseURL: https://gateway.acme.dev", "baseURL: [https://");
    let issues = load_issues(&[("halos.yaml", ROOT), ("gateway.yaml", &broken)]);
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].source, src("gateway.yaml", 1));
    assert_eq!(issues[0].rule, rule::YAML);
}

#[test]
fn a_document_must_be_a_mapping() {
    let issues = load_issues(&with_base(&[("list.yaml", "- apiVersion: halos.dev/v1\n")]));
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].rule, rule::DECODE);
    assert!(issues[0].message.contains("found a sequence"));
}

#[test]
fn every_problem_in_every_file_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let rings = format!(
        "{}---\n{}---\n{}",
        ring("a", 1).replace("order: 1", "order: first"),
        ring("b", 2),
        ring("c", 3).replace("kind: Ring", "kind: Rng")
    );
    write_tree(
        tmp.path(),
        &[
            (
                "halos.yaml",
                b"apiVersion: halos.dev/v1\norg: acme\nsso: true\n",
            ),
            (
                "gateway.yaml",
                GATEWAY.replace("baseURL", "baseUrl").as_bytes(),
            ),
            ("rings.yaml", rings.as_bytes()),
            (
                "broken.yaml",
                b"apiVersion: halos.dev/v1\nkind: Ring\nname: [unclosed\n",
            ),
            ("latin1.yaml", b"name: caf\xe9\n"),
        ],
    );
    let issues = dir_issues(tmp.path());
    let found: Vec<(Option<DocumentSource>, &str, &str)> = issues
        .iter()
        .map(|i| (i.source.clone(), i.field.as_str(), i.rule.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            // Unreadable files come first, then files in sorted order.
            (None, "", rule::IO),
            (src("broken.yaml", 1), "", rule::YAML),
            (src("gateway.yaml", 1), "baseUrl", rule::DECODE),
            (src("halos.yaml", 1), "sso", rule::DECODE),
            (src("rings.yaml", 1), "order", rule::DECODE),
            (src("rings.yaml", 3), "kind", rule::KIND),
        ],
        "{issues:#?}"
    );
    assert!(
        issues[0].message.contains("latin1.yaml"),
        "{}",
        issues[0].message
    );
    assert!(issues[0].message.contains("UTF-8"), "{}", issues[0].message);
    assert!(
        issues[1].message.contains("line 3"),
        "{}",
        issues[1].message
    );
}

#[test]
fn a_syntax_error_keeps_the_documents_before_it() {
    let file = format!(
        "{}---\n{}---\nname: [oops\n",
        ring("a", 1),
        ring("b", 2).replace("order: 2", "order: two")
    );
    let issues = load_issues(&with_base(&[("rings.yaml", &file)]));
    let found: Vec<(Option<DocumentSource>, &str)> = issues
        .iter()
        .map(|i| (i.source.clone(), i.rule.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (src("rings.yaml", 2), rule::DECODE),
            (src("rings.yaml", 3), rule::YAML)
        ],
        "{issues:#?}"
    );
}

#[test]
fn files_are_read_in_sorted_order() {
    let tmp = tempfile::tempdir().unwrap();
    // Written out of order; sorted by relative path: a.yaml < a/z.yaml < b.yaml.
    let canary = ring("canary", 1);
    write_tree(
        tmp.path(),
        &[
            ("b.yaml", canary.as_bytes()),
            ("halos.yaml", ROOT.as_bytes()),
            ("a/z.yaml", canary.as_bytes()),
            ("gateway.yaml", GATEWAY.as_bytes()),
            ("a.yaml", canary.as_bytes()),
        ],
    );
    let issues = dir_issues(tmp.path());
    let files: Vec<&str> = issues
        .iter()
        .map(|i| i.source.as_ref().unwrap().file.as_str())
        .collect();
    assert_eq!(files, ["a/z.yaml", "b.yaml"], "{issues:#?}");
    assert!(
        issues
            .iter()
            .all(|i| i.message.contains("a.yaml (document 1)"))
    );

    // load_files sorts too: the input order does not matter.
    let forward = [
        ("halos.yaml", ROOT),
        ("gateway.yaml", GATEWAY),
        ("a.yaml", canary.as_str()),
        ("b.yaml", canary.as_str()),
    ];
    let mut backward = forward;
    backward.reverse();
    assert_eq!(load_issues(&forward), load_issues(&backward));
    assert_eq!(load_issues(&backward)[0].source, src("b.yaml", 1));
}

#[test]
fn hidden_entries_and_other_files_are_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    write_tree(
        tmp.path(),
        &[
            ("halos.yaml", ROOT.as_bytes()),
            ("gateway.yaml", GATEWAY.as_bytes()),
            ("rings/canary.yml", ring("canary", 1).as_bytes()),
            (".git/config.yaml", b"not: [a policy\n"),
            (".github/workflows/ci.yaml", b"on: push\n"),
            ("rings/.draft.yaml", b"kind: Nonsense\n"),
            ("README.md", b"# policy\n"),
            ("schemas/ring.json", b"{}"),
        ],
    );
    let org = load_dir(tmp.path()).unwrap();
    assert_eq!(org.rings.keys().collect::<Vec<_>>(), ["canary"]);
    assert_eq!(
        org.source(Kind::Ring, "canary"),
        src("rings/canary.yml", 1).as_ref()
    );
}

#[test]
fn a_missing_directory_is_an_io_error() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    match load_dir(&missing) {
        Err(LoadError::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

/// The project's own example is what a new user copies: it loads and validates with no
/// error and no warning (`halo validate`, the renderers and halo-demo print every warning).
#[test]
fn the_acme_corp_example_validates_with_no_warning() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp");
    let org = load_dir(&dir).expect("examples/acme-corp loads");
    let issues = halo_policy::validate::validate(&org);
    let shown: Vec<String> = issues.iter().map(ToString::to_string).collect();
    assert!(shown.is_empty(), "{}", shown.join("\n"));
}
