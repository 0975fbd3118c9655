// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(feature = "load")]
//! Budgets as a policy repo writes them (issue #25): they load strictly into the compiled
//! snapshot, every mistake is an issue naming the file and field, and the one function
//! that says which budgets apply answers from the snapshot.

use halo_policy::budgets::{POOL, applying, subject_key};
use halo_policy::decide::{Subject, resolve_ring};
use halo_policy::load::{LoadError, load_files, rule};
use halo_policy::types::{AtLimit, BudgetCount, BudgetPeriod, OnServiceDown};
use halo_policy::{Issue, compile};

const ROOT: &str = "apiVersion: halos.dev/v1\norg: acme\n";

const RINGS: &str = "\
apiVersion: halos.dev/v1
kind: Ring
name: general
order: 100
profile: base
membership:
  default: true
---
apiVersion: halos.dev/v1
kind: Profile
name: base
";

/// A Gateway with two aliases and `budgets` (indented as written under the document).
fn gateway(budgets: &str) -> String {
    format!(
        "\
apiVersion: halos.dev/v1
kind: Gateway
models:
  opus:
    upstream: anthropic
    model: claude-opus-4-1
  sonnet:
    upstream: anthropic
    model: claude-sonnet-4-5
upstreams:
  anthropic:
    url: https://api.anthropic.com
    kind: anthropic
prices:
  anthropic:
    claude-opus-4-1: {{input: 15, output: 75}}
    claude-sonnet-4-5: {{input: 3, output: 15}}
{budgets}"
    )
}

const BUDGETS: &str = "\
budgets:
  eng-daily:
    appliesTo: {groups: [eng]}
    period: day
    timeZone: Europe/Berlin
    limit: {usd: 50}
  general-monthly:
    appliesTo: {rings: [general]}
    count: pooled
    period: month
    limit: {usd: 20000, tokens: 2000000000}
  alice-opus:
    appliesTo: {users: [alice@acme.dev]}
    period: week
    limit: {tokens: 100000}
    atLimit:
      routeTo: {opus: sonnet}
budgetService:
  onServiceDown: closed
  timeoutMs: 150
";

fn load(gateway: &str) -> Result<halo_policy::Org, Vec<Issue>> {
    let files = vec![
        ("halos.yaml".to_string(), ROOT.to_string()),
        ("rings.yaml".to_string(), RINGS.to_string()),
        ("gateway.yaml".to_string(), gateway.to_string()),
    ];
    match load_files(files) {
        Ok(org) => Ok(org),
        Err(LoadError::Invalid(issues)) => Err(issues),
        Err(e) => panic!("unexpected load error: {e}"),
    }
}

/// The errors loading (decoding) or else validating finds.
fn errors(gateway: &str) -> Vec<Issue> {
    let issues = match load(gateway) {
        Err(issues) => issues,
        Ok(org) => halo_policy::validate::validate(&org),
    };
    issues.into_iter().filter(Issue::is_error).collect()
}

#[test]
fn budgets_load_into_the_snapshot_and_apply_by_user_group_and_ring() {
    let org = load(&gateway(BUDGETS)).expect("the policy loads");
    let snap = compile(&org);
    assert_eq!(snap.budgets.len(), 3);
    let eng = &snap.budgets["eng-daily"];
    assert_eq!(eng.period, BudgetPeriod::Day);
    assert_eq!(eng.count, BudgetCount::PerUser);
    assert_eq!(eng.at_limit, AtLimit::Refuse);
    assert_eq!(
        snap.budgets["alice-opus"].at_limit,
        AtLimit::RouteTo([("opus".to_string(), "sonnet".to_string())].into())
    );
    let service = snap.budget_service.expect("budgetService");
    assert_eq!(service.on_service_down, OnServiceDown::Closed);
    assert_eq!(service.timeout_ms, Some(150));
    // The snapshot's bytes carry them (the filter and halo-server read them there).
    let again = halo_policy::Snapshot::from_bytes(&snap.to_bytes()).expect("decodes");
    assert_eq!(again, snap);

    let alice = Subject::new("alice@acme.dev", &["eng"]);
    let ring = resolve_ring(&snap, &alice).expect("a ring").name.clone();
    let names: Vec<(&str, String)> = applying(&snap, &alice, &ring)
        .into_iter()
        .map(|a| (a.name, a.key.subject))
        .collect();
    assert_eq!(
        names,
        [
            ("alice-opus", subject_key("alice-opus", "alice@acme.dev")),
            ("eng-daily", subject_key("eng-daily", "alice@acme.dev")),
            ("general-monthly", POOL.to_string()),
        ]
    );
    let carol = Subject::new("carol@acme.dev", &["sales"]);
    let names: Vec<&str> = applying(&snap, &carol, &ring)
        .into_iter()
        .map(|a| a.name)
        .collect();
    assert_eq!(names, ["general-monthly"]);
}

#[test]
fn route_to_is_accepted_without_a_warning() {
    let org = load(&gateway(BUDGETS)).expect("the policy loads");
    let issues = halo_policy::validate::validate(&org);
    assert!(
        issues
            .iter()
            .all(|i| !i.field.starts_with("budgets.alice-opus")),
        "{issues:#?}"
    );
}

#[test]
fn an_unknown_budget_field_is_an_error_naming_file_and_field() {
    let issues = errors(&gateway(
        &BUDGETS.replace("period: day", "period: day\n    perod: week"),
    ));
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert_eq!(issues[0].rule, rule::DECODE);
    assert_eq!(issues[0].field, "budgets.eng-daily.perod");
    assert_eq!(
        issues[0].source.as_ref().map(|s| s.file.as_str()),
        Some("gateway.yaml")
    );
    let issues = errors(&gateway(
        &BUDGETS.replace("period: day", "period: fortnight"),
    ));
    assert_eq!(issues[0].field, "budgets.eng-daily.period", "{issues:#?}");
}

#[test]
fn each_invalid_budget_is_named_with_its_rule() {
    let bad = "\
budgets:
  Eng:
    appliesTo: {}
    period: day
    timeZone: Mars/Olympus
    limit: {}
  over:
    appliesTo: {rings: [nowhere]}
    period: day
    limit: {usd: -1, tokens: 0}
    atLimit:
      routeTo: {opus: haiku, sonnet: sonnet}
budgetService: {timeoutMs: 0}
";
    let mut got: Vec<(String, String)> = errors(&gateway(bad))
        .into_iter()
        .map(|i| (i.field, i.rule))
        .collect();
    got.sort();
    let want = [
        ("budgetService.timeoutMs", "range"),
        ("budgets.Eng", "name"),
        ("budgets.Eng.appliesTo", "form"),
        ("budgets.Eng.limit", "form"),
        ("budgets.Eng.timeZone", "form"),
        ("budgets.over.appliesTo.rings[0]", "reference"),
        ("budgets.over.atLimit.routeTo.opus", "reference"),
        ("budgets.over.atLimit.routeTo.sonnet", "form"),
        ("budgets.over.limit.tokens", "range"),
        ("budgets.over.limit.usd", "range"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(f, r)| (f.to_string(), r.to_string()))
        .collect();
    assert_eq!(got, want);
    let zone = errors(&gateway(bad))
        .into_iter()
        .find(|i| i.field == "budgets.Eng.timeZone")
        .expect("the zone issue");
    assert!(zone.message.contains("Mars/Olympus"), "{}", zone.message);
}
