//! Guardrails: safety rules a policy must keep even when it is well formed.
//!
//! [`builtin`] returns the 16 built-in guardrails that [`crate::validate::validate`] runs
//! after the semantic checks. An organisation may add its own [`Guardrail`]s through
//! [`crate::validate::validate_with`]; those can only add issues (ADR-0007).
//!
//! [`find_bypass_token`] is the single permission-bypass detector: `guardNoBypass` uses it
//! on every policy string, and the release backstop (CheckRendered) uses it on rendered
//! files, so it works on arbitrary text (a JSON value, a TOML file, a shell line).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

use crate::issue::Issue;
use crate::types::{
    Axis, CONTROL_VARIANT, ExperimentStatus, ExperimentType, Kind, Org, UpstreamKind,
};
use crate::validate::{field_index, field_key, parse_http_url};

/// A rule every policy must keep. Implementations return the issues they find; they
/// cannot see or change the issues of other checks.
pub trait Guardrail: Send + Sync {
    /// camelCase name, used as the issue's `rule` (for example `guardNoBypass`).
    fn name(&self) -> &'static str;
    /// One sentence saying why the rule exists.
    fn reason(&self) -> &'static str;
    /// Every violation in `org`.
    fn check(&self, org: &Org) -> Vec<Issue>;
}

/// The 16 built-in guardrails, in a fixed order.
pub fn builtin() -> Vec<Box<dyn Guardrail>> {
    BUILTINS
        .iter()
        .map(|b| Box::new(*b) as Box<dyn Guardrail>)
        .collect()
}

// ---------------------------------------------------------------------------
// Permission-bypass tokens
// ---------------------------------------------------------------------------

/// Permission-bypass tokens, as the harnesses spell them. [`find_bypass_token`] returns
/// one of these. The last one stands for Gemini CLI's approval mode `yolo` in any
/// spelling (`--approval-mode yolo`, `--approval-mode=yolo`, `"approvalMode": "yolo"`,
/// `defaultApprovalMode: yolo`, or a value that is just `yolo`).
pub const BYPASS_TOKENS: &[&str] = &[
    // Claude Code permission mode (settings defaultMode, --permission-mode).
    "bypassPermissions",
    // Codex sandbox mode (sandbox_mode, --sandbox).
    "danger-full-access",
    // Claude Code CLI flag (also matches --allow-dangerously-skip-permissions).
    "--dangerously-skip-permissions",
    // Codex CLI flag.
    "--dangerously-bypass-approvals-and-sandbox",
    // Gemini CLI (and Codex) flag.
    "--yolo",
    // Gemini CLI approval mode.
    "approval-mode yolo",
];

/// The first permission-bypass token in `s`, compared case-insensitively.
///
/// Tokens are matched as whole words: the characters around a match must not be ASCII
/// letters, digits or `_`. That keeps hardening settings such as Claude Code's
/// `disableBypassPermissionsMode` and Gemini CLI's `disableYoloMode` from matching.
/// The short word `yolo` is the object-detection model too (`yolo-detector`,
/// `yolov8`), so on its own it only counts as an approval mode: after an
/// `approval-mode`/`approval_mode`/`approvalMode` key or flag, or as the whole value.
/// `--yolo` counts wherever it stands as its own flag. Gemini CLI's `-y` is not
/// matched: two characters cannot be told apart from ordinary text.
pub fn find_bypass_token(s: &str) -> Option<&'static str> {
    let lower = s.to_ascii_lowercase();
    let hay = lower.as_bytes();
    if contains_word(hay, b"bypasspermissions", false) {
        return Some(BYPASS_TOKENS[0]);
    }
    if contains_word(hay, b"danger-full-access", false) {
        return Some(BYPASS_TOKENS[1]);
    }
    if contains_word(hay, b"dangerously-skip-permissions", false) {
        return Some(BYPASS_TOKENS[2]);
    }
    if contains_word(hay, b"dangerously-bypass-approvals-and-sandbox", false) {
        return Some(BYPASS_TOKENS[3]);
    }
    if contains_word(hay, b"--yolo", true) {
        return Some(BYPASS_TOKENS[4]);
    }
    if has_yolo_approval_mode(hay) {
        return Some(BYPASS_TOKENS[5]);
    }
    None
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Positions where `needle` occurs in `hay` as a whole word. With `strict_dash`, a `-`
/// next to the match also breaks it (so `--yolo-mode` or `x--yolo` is not `--yolo`).
fn word_matches<'a>(
    hay: &'a [u8],
    needle: &'a [u8],
    strict_dash: bool,
) -> impl Iterator<Item = usize> + 'a {
    let joins = move |b: u8| is_word_byte(b) || (strict_dash && b == b'-');
    (0..hay.len().saturating_sub(needle.len() - 1))
        .filter(move |&i| hay[i..].starts_with(needle))
        .filter(move |&i| i == 0 || !joins(hay[i - 1]))
        .filter(move |&i| hay.get(i + needle.len()).is_none_or(|&b| !joins(b)))
}

fn contains_word(hay: &[u8], needle: &[u8], strict_dash: bool) -> bool {
    word_matches(hay, needle, strict_dash).next().is_some()
}

/// `yolo` as an approval mode: the whole value, or right after an approval-mode key.
fn has_yolo_approval_mode(hay: &[u8]) -> bool {
    let trimmed: &[u8] = {
        let is_pad = |b: &u8| b.is_ascii_whitespace() || *b == b'"' || *b == b'\'';
        let start = hay.iter().position(|b| !is_pad(b)).unwrap_or(hay.len());
        let end = hay
            .iter()
            .rposition(|b| !is_pad(b))
            .map_or(start, |e| e + 1);
        &hay[start..end.max(start)]
    };
    if trimmed == b"yolo" {
        return true;
    }
    word_matches(hay, b"yolo", true).any(|i| {
        let mut before = &hay[..i];
        while let Some((&last, rest)) = before.split_last() {
            if last.is_ascii_whitespace() || matches!(last, b'"' | b'\'' | b'=' | b':') {
                before = rest;
            } else {
                break;
            }
        }
        [&b"approval-mode"[..], b"approval_mode", b"approvalmode"]
            .iter()
            .any(|key| before.ends_with(key))
    })
}

// ---------------------------------------------------------------------------
// Literal secrets
// ---------------------------------------------------------------------------

/// Whether `s` contains something shaped like a well-known credential: provider API keys
/// (`sk-…`, `AIza…`), AWS access key ids, GitHub/GitLab/Slack tokens, JWTs or a PEM
/// private key. Only formats with a distinctive prefix and length are matched, so
/// ordinary names and paths do not trip it.
pub fn looks_like_secret(s: &str) -> bool {
    let b = s.as_bytes();
    let tail_len = |from: usize| {
        b[from..]
            .iter()
            .take_while(|&&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
            .count()
    };
    let at_boundary = |i: usize| i == 0 || !b[i - 1].is_ascii_alphanumeric();
    let prefixed = |prefix: &str, min_tail: usize| {
        s.match_indices(prefix)
            .any(|(i, _)| at_boundary(i) && tail_len(i + prefix.len()) >= min_tail)
    };
    // OpenAI / Anthropic keys: sk-, sk-proj-, sk-ant-; require a digit so that
    // hyphenated names (sk-some-long-package-name) do not match.
    let sk = s.match_indices("sk-").any(|(i, _)| {
        let tail = &b[i + 3..i + 3 + tail_len(i + 3)];
        at_boundary(i) && tail.len() >= 20 && tail.iter().any(u8::is_ascii_digit)
    });
    let aws = ["AKIA", "ASIA"].iter().any(|p| {
        s.match_indices(p).any(|(i, _)| {
            at_boundary(i)
                && b[i + 4..]
                    .iter()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
                    .count()
                    == 16
        })
    });
    let jwt = s.match_indices("eyJ").any(|(i, _)| {
        let n = tail_len(i);
        n >= 10 && b[i + n..].starts_with(b".eyJ") && tail_len(i + n + 1) >= 10
    });
    sk || aws
        || jwt
        || prefixed("AIza", 30)
        || prefixed("ghp_", 30)
        || prefixed("gho_", 30)
        || prefixed("ghu_", 30)
        || prefixed("ghs_", 30)
        || prefixed("ghr_", 30)
        || prefixed("github_pat_", 20)
        || prefixed("glpat-", 20)
        || prefixed("xoxb-", 10)
        || prefixed("xoxp-", 10)
        || s.contains("PRIVATE KEY-----")
}

/// `${NAME}`: a reference the harness expands from the developer's environment.
fn is_env_reference(s: &str) -> bool {
    s.strip_prefix("${")
        .and_then(|rest| rest.strip_suffix('}'))
        .is_some_and(is_env_name)
}

/// An environment variable name: `[A-Za-z_][A-Za-z0-9_]*`.
fn is_env_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

// ---------------------------------------------------------------------------
// The built-in guardrails
// ---------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct Builtin {
    name: &'static str,
    reason: &'static str,
    check: fn(&mut Out<'_>),
}

impl Guardrail for Builtin {
    fn name(&self) -> &'static str {
        self.name
    }
    fn reason(&self) -> &'static str {
        self.reason
    }
    fn check(&self, org: &Org) -> Vec<Issue> {
        let mut out = Out {
            org,
            rule: self.name,
            issues: Vec::new(),
        };
        (self.check)(&mut out);
        out.issues
    }
}

/// Collects one guardrail's issues, naming the document each comes from.
struct Out<'a> {
    org: &'a Org,
    rule: &'static str,
    issues: Vec<Issue>,
}

impl Out<'_> {
    fn error(&mut self, kind: Kind, name: &str, field: impl Into<String>, msg: impl Into<String>) {
        let source = self.org.source(kind, name).cloned();
        self.issues
            .push(Issue::error(source, field, self.rule, msg));
    }
}

const BUILTINS: [Builtin; 16] = [
    Builtin {
        name: "guardNoBypass",
        reason: "No policy value may carry a permission-bypass mode or flag (bypassPermissions, danger-full-access, --dangerously-skip-permissions, --yolo, ...), because Halos never ships a harness that skips its own approvals.",
        check: guard_no_bypass,
    },
    Builtin {
        name: "guardOneDefaultRing",
        reason: "Exactly one ring is the default, so every developer resolves to exactly one ring.",
        check: guard_one_default_ring,
    },
    Builtin {
        name: "guardUniqueRingOrder",
        reason: "Ring orders are unique, so which ring a developer lands in never depends on ring names.",
        check: guard_unique_ring_order,
    },
    Builtin {
        name: "guardControlVariant",
        reason: "Every running ab or canary experiment has a `control` variant with no route overrides, so a kill or pause always returns to the unchanged baseline.",
        check: guard_control_variant,
    },
    Builtin {
        name: "guardUniqueSalt",
        reason: "Experiment salts are non-empty and unique, so the variant assignments of different experiments are independent.",
        check: guard_unique_salt,
    },
    Builtin {
        name: "guardCanaryShare",
        reason: "A canary gives its treatment at most half of the enrolled users, so a bad change reaches a minority first.",
        check: guard_canary_share,
    },
    Builtin {
        name: "guardNoOverlappingTraffic",
        reason: "Two running traffic experiments never override the same alias in the same ring, so every request's route has exactly one owner.",
        check: guard_no_overlapping_traffic,
    },
    Builtin {
        name: "guardShadowTraffic",
        reason: "Shadow experiments are traffic-axis (only the gateway can mirror a request) and shadow settings appear only on shadow experiments.",
        check: guard_shadow_traffic,
    },
    Builtin {
        name: "guardPinnedVersions",
        reason: "Harness versions are exact pins (x.y.z), so a release installs exactly the version that was reviewed.",
        check: guard_pinned_versions,
    },
    Builtin {
        name: "guardCredentialedHttps",
        reason: "Upstreams the gateway sends its own credential to use https, so provider secrets never cross the network in clear text.",
        check: guard_credentialed_https,
    },
    Builtin {
        name: "guardUpstreamRegion",
        reason: "region is set only on bedrock (a well-formed AWS region) and vertex (us-east5 or global, with a project), so requests are signed for and sent to the intended region.",
        check: guard_upstream_region,
    },
    Builtin {
        name: "guardIdentity",
        reason: "The identity provider has an https issuer, an audience and admin groups, so only the organisation's own tokens are accepted and someone can administer Halos.",
        check: guard_identity,
    },
    Builtin {
        name: "guardToggleOwner",
        reason: "Every toggle names an owner who answers for it and removes it when it expires.",
        check: guard_toggle_owner,
    },
    Builtin {
        name: "guardNoPromptLogging",
        reason: "Prompt logging (telemetry.logPrompts and the harnesses' own prompt-export settings) is refused: prompts never leave the developer's machine.",
        check: guard_no_prompt_logging,
    },
    Builtin {
        name: "guardNoLiteralSecrets",
        reason: "Policy holds references to secrets (${VAR}, an environment variable name, a file path), never secrets, because it is committed to git and shipped to every machine.",
        check: guard_no_literal_secrets,
    },
    Builtin {
        name: "guardOptInSelfService",
        reason: "Opt-in rings need selfService.enabled, since otherwise nobody can join them.",
        check: guard_opt_in_self_service,
    },
];

/// Every document of the policy as JSON, with the (kind, name) naming its source.
/// A document that cannot be turned into JSON yields `Err`, so walkers fail closed.
fn documents(org: &Org) -> Vec<(Kind, &str, Result<Value, String>)> {
    fn json<T: Serialize>(doc: &T) -> Result<Value, String> {
        serde_json::to_value(doc).map_err(|e| e.to_string())
    }
    let mut docs = vec![
        (Kind::Root, "", json(&org.root)),
        (Kind::Gateway, "", json(&org.gateway)),
    ];
    docs.extend(
        org.profiles
            .iter()
            .map(|(n, d)| (Kind::Profile, n.as_str(), json(d))),
    );
    docs.extend(
        org.rings
            .iter()
            .map(|(n, d)| (Kind::Ring, n.as_str(), json(d))),
    );
    docs.extend(
        org.experiments
            .iter()
            .map(|(n, d)| (Kind::Experiment, n.as_str(), json(d))),
    );
    docs.extend(
        org.toggles
            .iter()
            .map(|(n, d)| (Kind::Toggle, n.as_str(), json(d))),
    );
    docs.extend(
        org.rollouts
            .iter()
            .map(|(n, d)| (Kind::Rollout, n.as_str(), json(d))),
    );
    docs
}

/// Calls `f(path, key, value)` for every object entry and `f(path, None, value)` for
/// every other value, depth first, with field paths like `mcp.fs.args[0]`.
fn walk(value: &Value, path: &str, f: &mut dyn FnMut(&str, Option<&str>, &Value)) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let p = field_key(path, k);
                f(&p, Some(k), v);
                walk(v, &p, f);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let p = field_index(path, i);
                f(&p, None, v);
                walk(v, &p, f);
            }
        }
        _ => {}
    }
}

fn guard_no_bypass(out: &mut Out<'_>) {
    for (kind, name, doc) in documents(out.org) {
        let doc = match doc {
            Ok(doc) => doc,
            Err(e) => {
                out.error(
                    kind,
                    name,
                    "",
                    format!("could not inspect the document: {e}"),
                );
                continue;
            }
        };
        let mut found = Vec::new();
        walk(&doc, "", &mut |path, key, value| {
            if let Some(token) = key.and_then(find_bypass_token) {
                found.push((
                    path.to_string(),
                    format!("key contains the permission-bypass token `{token}`"),
                ));
            }
            if let Some(token) = value.as_str().and_then(find_bypass_token) {
                found.push((
                    path.to_string(),
                    format!("value contains the permission-bypass token `{token}`"),
                ));
            }
        });
        for (path, msg) in found {
            out.error(kind, name, path, msg);
        }
    }
}

fn guard_one_default_ring(out: &mut Out<'_>) {
    let defaults: Vec<&str> = out
        .org
        .rings
        .iter()
        .filter(|(_, r)| r.membership.default)
        .map(|(n, _)| n.as_str())
        .collect();
    match defaults.len() {
        0 => {
            let msg = "no ring has membership.default: true; exactly one ring must take everyone no other ring matches";
            out.issues
                .push(Issue::error(None, "", out.rule, msg.to_string()));
        }
        1 => {}
        _ => {
            for name in &defaults {
                let others: Vec<&str> = defaults.iter().copied().filter(|o| o != name).collect();
                out.error(
                    Kind::Ring,
                    name,
                    "membership.default",
                    format!(
                        "more than one default ring (also {}); exactly one ring may be the default",
                        others.join(", ")
                    ),
                );
            }
        }
    }
}

fn guard_unique_ring_order(out: &mut Out<'_>) {
    let mut by_order: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
    for (name, ring) in &out.org.rings {
        by_order.entry(ring.order).or_default().push(name);
    }
    for (order, names) in by_order {
        if names.len() < 2 {
            continue;
        }
        for name in &names {
            let others: Vec<&str> = names.iter().copied().filter(|o| o != name).collect();
            out.error(
                Kind::Ring,
                name,
                "order",
                format!(
                    "order {order} is also used by ring {}; ring orders must be unique",
                    others.join(", ")
                ),
            );
        }
    }
}

fn guard_control_variant(out: &mut Out<'_>) {
    for (name, exp) in &out.org.experiments {
        let checked = matches!(
            exp.experiment_type,
            ExperimentType::Ab | ExperimentType::Canary
        ) && exp.status == ExperimentStatus::Running;
        if !checked {
            continue;
        }
        match exp.variants.iter().position(|v| v.name == CONTROL_VARIANT) {
            None => out.error(
                Kind::Experiment,
                name,
                "variants",
                format!("a running ab or canary experiment needs a `{CONTROL_VARIANT}` variant"),
            ),
            Some(i) if !exp.variants[i].routes.is_empty() => out.error(
                Kind::Experiment,
                name,
                format!("variants[{i}].routes"),
                "the control variant must not override routes: it is the baseline a kill returns to",
            ),
            Some(_) => {}
        }
    }
}

fn guard_unique_salt(out: &mut Out<'_>) {
    let mut by_salt: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, exp) in &out.org.experiments {
        if exp.salt.trim().is_empty() {
            out.error(
                Kind::Experiment,
                name,
                "salt",
                "salt must not be empty: it keys the variant assignment",
            );
        } else {
            by_salt.entry(exp.salt.as_str()).or_default().push(name);
        }
    }
    for names in by_salt.values().filter(|n| n.len() > 1) {
        for name in names {
            let others: Vec<&str> = names.iter().copied().filter(|o| o != name).collect();
            out.error(
                Kind::Experiment,
                name,
                "salt",
                format!(
                    "salt is also used by experiment {}; shared salts put the same users in the same arms",
                    others.join(", ")
                ),
            );
        }
    }
}

fn guard_canary_share(out: &mut Out<'_>) {
    for (name, exp) in &out.org.experiments {
        if exp.experiment_type != ExperimentType::Canary {
            continue;
        }
        let total: u64 = exp.variants.iter().map(|v| u64::from(v.weight)).sum();
        let treatment: u64 = exp
            .variants
            .iter()
            .filter(|v| v.name != CONTROL_VARIANT)
            .map(|v| u64::from(v.weight))
            .sum();
        if total > 0 && treatment * 2 > total {
            out.error(
                Kind::Experiment,
                name,
                "variants",
                format!(
                    "canary treatment weight is {treatment} of {total} (more than 50%); use an ab experiment for an even or larger split"
                ),
            );
        }
    }
}

fn guard_no_overlapping_traffic(out: &mut Out<'_>) {
    // Shadow experiments only mirror; they never decide the served route.
    let deciding: Vec<(&String, &crate::types::Experiment)> = out
        .org
        .experiments
        .iter()
        .filter(|(_, e)| {
            e.axis == Axis::Traffic
                && e.status == ExperimentStatus::Running
                && e.experiment_type != ExperimentType::Shadow
        })
        .collect();
    // alias -> index of the first variant overriding it.
    let aliases = |e: &crate::types::Experiment| {
        let mut first: BTreeMap<String, usize> = BTreeMap::new();
        for (i, v) in e.variants.iter().enumerate() {
            for alias in v.routes.keys() {
                first.entry(alias.clone()).or_insert(i);
            }
        }
        first
    };
    for (name, exp) in &deciding {
        let mine = aliases(exp);
        let my_rings: BTreeSet<&String> = exp.rings.iter().collect();
        for (other_name, other) in &deciding {
            if other_name == name {
                continue;
            }
            let rings: Vec<&str> = other
                .rings
                .iter()
                .filter(|r| my_rings.contains(r))
                .map(String::as_str)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if rings.is_empty() {
                continue;
            }
            let theirs = aliases(other);
            for (alias, &i) in &mine {
                if theirs.contains_key(alias) {
                    out.error(
                        Kind::Experiment,
                        name,
                        field_key(&format!("variants[{i}].routes"), alias),
                        format!(
                            "running traffic experiment {other_name} also overrides alias {alias} in ring {}",
                            rings.join(", ")
                        ),
                    );
                }
            }
        }
    }
}

fn guard_shadow_traffic(out: &mut Out<'_>) {
    for (name, exp) in &out.org.experiments {
        let shadow = exp.experiment_type == ExperimentType::Shadow;
        if shadow && exp.axis != Axis::Traffic {
            out.error(
                Kind::Experiment,
                name,
                "axis",
                "a shadow experiment must be traffic-axis: only the gateway can mirror requests",
            );
        }
        if !shadow && exp.shadow.is_some() {
            out.error(
                Kind::Experiment,
                name,
                "shadow",
                "shadow settings are only for type: shadow experiments",
            );
        }
    }
}

/// An exact semver version: `x.y.z` with optional `-pre` and `+build`, no leading zeros.
fn is_exact_version(v: &str) -> bool {
    let ident_ok = |s: &str| {
        !s.is_empty()
            && s.split('.').all(|part| {
                !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
    };
    let (rest, build) = match v.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (v, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let numbers: Vec<&str> = core.split('.').collect();
    numbers.len() == 3
        && numbers.iter().all(|n| {
            !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_digit())
                && (n.len() == 1 || !n.starts_with('0'))
        })
        && pre.is_none_or(ident_ok)
        && build.is_none_or(ident_ok)
}

fn guard_pinned_versions(out: &mut Out<'_>) {
    for (name, profile) in &out.org.profiles {
        for (harness, settings) in &profile.harnesses {
            if !is_exact_version(&settings.version) {
                out.error(
                    Kind::Profile,
                    name,
                    format!("harnesses.{}.version", harness.as_str()),
                    format!(
                        "version {:?} is not an exact pin; write a full version such as 2.0.14 (no ranges, no latest)",
                        settings.version
                    ),
                );
            }
        }
    }
}

fn guard_credentialed_https(out: &mut Out<'_>) {
    for (name, up) in &out.org.gateway.upstreams {
        if !up.kind.is_credentialed() {
            continue;
        }
        // A URL that does not parse is reported by the semantic checks.
        if let Ok(url) = parse_http_url(&up.url)
            && !url.https
        {
            out.error(
                Kind::Gateway,
                "",
                field_key(&field_key("upstreams", name), "url"),
                format!(
                    "a {} upstream receives the gateway's credential and must use https",
                    up.kind.as_str()
                ),
            );
        }
    }
}

/// An AWS region such as us-east-1, eu-central-2, us-gov-west-1 or ap-southeast-3.
fn is_aws_region(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() >= 3
        && parts[0].len() == 2
        && parts[0].bytes().all(|b| b.is_ascii_lowercase())
        && parts[1..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts
            .last()
            .is_some_and(|n| !n.is_empty() && n.len() <= 2 && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The Vertex regions that serve Claude models.
const VERTEX_REGIONS: [&str; 2] = ["us-east5", "global"];

fn guard_upstream_region(out: &mut Out<'_>) {
    for (name, up) in &out.org.gateway.upstreams {
        let base = field_key("upstreams", name);
        match (up.kind, up.region.as_deref()) {
            (UpstreamKind::Bedrock, Some(region)) if !is_aws_region(region) => out.error(
                Kind::Gateway,
                "",
                field_key(&base, "region"),
                format!("region {region:?} is not an AWS region such as us-east-1"),
            ),
            (UpstreamKind::Bedrock, _) => {}
            (UpstreamKind::Vertex, region) => {
                if !region.is_some_and(|r| VERTEX_REGIONS.contains(&r)) {
                    out.error(
                        Kind::Gateway,
                        "",
                        field_key(&base, "region"),
                        "a vertex upstream needs region us-east5 or global",
                    );
                }
            }
            (kind, Some(_)) => out.error(
                Kind::Gateway,
                "",
                field_key(&base, "region"),
                format!(
                    "region is only allowed on bedrock and vertex upstreams, not {}",
                    kind.as_str()
                ),
            ),
            (_, None) => {}
        }
        let project = up.project.as_deref().map(str::trim).unwrap_or("");
        if up.kind == UpstreamKind::Vertex && project.is_empty() {
            out.error(
                Kind::Gateway,
                "",
                field_key(&base, "project"),
                "a vertex upstream needs its GCP project",
            );
        }
        if up.kind != UpstreamKind::Vertex && up.project.is_some() {
            out.error(
                Kind::Gateway,
                "",
                field_key(&base, "project"),
                format!(
                    "project is only allowed on vertex upstreams, not {}",
                    up.kind.as_str()
                ),
            );
        }
    }
}

fn guard_identity(out: &mut Out<'_>) {
    let Some(identity) = &out.org.root.identity else {
        return;
    };
    match parse_http_url(&identity.issuer) {
        Ok(url) if url.https => {}
        _ => out.error(
            Kind::Root,
            "",
            "identity.issuer",
            "the identity issuer must be an https URL: its keys verify every developer token",
        ),
    }
    if identity
        .effective_audience()
        .is_none_or(|a| a.trim().is_empty())
    {
        out.error(
            Kind::Root,
            "",
            "identity.clientID",
            "identity needs clientID or audience, or tokens the issuer minted for any other app would be accepted",
        );
    }
    if identity.admin_groups.iter().all(|g| g.trim().is_empty()) {
        out.error(
            Kind::Root,
            "",
            "identity.adminGroups",
            "identity needs at least one admin group, or nobody can use the admin API",
        );
    }
}

fn guard_toggle_owner(out: &mut Out<'_>) {
    for (name, toggle) in &out.org.toggles {
        if toggle.owner.trim().is_empty() {
            out.error(
                Kind::Toggle,
                name,
                "owner",
                "a toggle needs an owner (an email or a team)",
            );
        }
    }
}

/// Keys that turn on prompt export: Halos's own `logPrompts` (also Gemini CLI's
/// telemetry.logPrompts), Claude Code's OTEL_LOG_USER_PROMPTS, Codex's
/// otel.log_user_prompt. Compared case-insensitively.
const PROMPT_LOGGING_KEYS: [&str; 3] = ["logprompts", "otel_log_user_prompts", "log_user_prompt"];

fn is_truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => matches!(
            s.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        ),
        _ => false,
    }
}

fn guard_no_prompt_logging(out: &mut Out<'_>) {
    for (kind, name, doc) in documents(out.org) {
        if !matches!(kind, Kind::Profile | Kind::Toggle) {
            continue;
        }
        let Ok(doc) = doc else {
            // guardNoBypass already reports a document it cannot inspect.
            continue;
        };
        let mut found = Vec::new();
        walk(&doc, "", &mut |path, key, value| {
            let hit =
                key.is_some_and(|k| PROMPT_LOGGING_KEYS.contains(&k.to_ascii_lowercase().as_str()));
            if hit && is_truthy(value) {
                found.push(path.to_string());
            }
        });
        for path in found {
            out.error(
                kind,
                name,
                path,
                "prompt logging is refused: prompts never leave the developer's machine",
            );
        }
    }
}

fn guard_no_literal_secrets(out: &mut Out<'_>) {
    let mut reported: BTreeSet<(Kind, String, String)> = BTreeSet::new();
    let mut flag = |out: &mut Out<'_>, kind: Kind, name: &str, field: String, msg: String| {
        if reported.insert((kind, name.to_string(), field.clone())) {
            out.error(kind, name, field, msg);
        }
    };
    // Messages never repeat the value: it may be the secret.
    for (name, profile) in &out.org.profiles {
        for (server, mcp) in &profile.mcp {
            let base = field_key("mcp", server);
            for (var, value) in &mcp.env {
                if !is_env_reference(value) {
                    flag(
                        out,
                        Kind::Profile,
                        name,
                        field_key(&field_key(&base, "env"), var),
                        "MCP env values must be ${VAR} references, never literal values".into(),
                    );
                }
            }
            if let Some(url) = &mcp.url
                && parse_http_url(url).is_ok_and(|u| u.userinfo)
            {
                flag(
                    out,
                    Kind::Profile,
                    name,
                    field_key(&base, "url"),
                    "the MCP URL must not carry a user or password".into(),
                );
            }
        }
    }
    for (name, up) in &out.org.gateway.upstreams {
        let base = field_key("upstreams", name);
        if parse_http_url(&up.url).is_ok_and(|u| u.userinfo) {
            flag(
                out,
                Kind::Gateway,
                "",
                field_key(&base, "url"),
                "the upstream URL must not carry a user or password; use credential".into(),
            );
        }
        let Some(cred) = &up.credential else {
            continue;
        };
        if let Some(env) = &cred.env
            && !is_env_name(env)
        {
            flag(
                out,
                Kind::Gateway,
                "",
                field_key(&field_key(&base, "credential"), "env"),
                "credential.env must name an environment variable (like OPENAI_API_KEY), not hold the secret".into(),
            );
        }
        if let Some(file) = &cred.file
            && (!file.starts_with('/')
                || file.chars().any(char::is_whitespace)
                || looks_like_secret(file))
        {
            flag(
                out,
                Kind::Gateway,
                "",
                field_key(&field_key(&base, "credential"), "file"),
                "credential.file must be an absolute path to a file holding the secret".into(),
            );
        }
    }
    // Anything shaped like a known credential, anywhere (overrides, hooks, args, fragments).
    for (kind, name, doc) in documents(out.org) {
        let Ok(doc) = doc else {
            continue;
        };
        let mut found = Vec::new();
        walk(&doc, "", &mut |path, key, value| {
            let secret =
                key.is_some_and(looks_like_secret) || value.as_str().is_some_and(looks_like_secret);
            if secret {
                found.push(path.to_string());
            }
        });
        for path in found {
            flag(
                out,
                kind,
                name,
                path,
                "this looks like a literal credential; reference it instead (${VAR} or a secret file)".into(),
            );
        }
    }
}

fn guard_opt_in_self_service(out: &mut Out<'_>) {
    let enabled = out
        .org
        .root
        .self_service
        .as_ref()
        .is_some_and(|s| s.enabled);
    if enabled {
        return;
    }
    for (name, ring) in &out.org.rings {
        if ring.membership.opt_in {
            out.error(
                Kind::Ring,
                name,
                "membership.optIn",
                "an opt-in ring needs selfService.enabled: true in halos.yaml, or nobody can join it",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_sixteen_builtins_with_unique_camel_case_names() {
        let all = builtin();
        assert_eq!(all.len(), 16);
        let names: BTreeSet<&str> = all.iter().map(|g| g.name()).collect();
        assert_eq!(names.len(), 16, "names must be unique");
        for g in &all {
            assert!(g.name().starts_with("guard"), "{}", g.name());
            assert!(g.name().bytes().all(|b| b.is_ascii_alphanumeric()));
            assert!(g.reason().ends_with('.'), "{}", g.name());
        }
    }

    #[test]
    fn bypass_tokens_are_found_case_insensitively() {
        let cases = [
            ("bypassPermissions", "bypassPermissions"),
            ("BYPASSPERMISSIONS", "bypassPermissions"),
            (
                "claude --permission-mode=bypassPermissions",
                "bypassPermissions",
            ),
            (
                r#"{"defaultMode":"bypassPermissions"}"#,
                "bypassPermissions",
            ),
            (
                "sandbox_mode = \"danger-full-access\"",
                "danger-full-access",
            ),
            ("codex -s Danger-Full-Access", "danger-full-access"),
            (
                "claude --dangerously-skip-permissions -p hi",
                "--dangerously-skip-permissions",
            ),
            (
                "claude --allow-dangerously-skip-permissions",
                "--dangerously-skip-permissions",
            ),
            (
                "codex --dangerously-bypass-approvals-and-sandbox",
                "--dangerously-bypass-approvals-and-sandbox",
            ),
            ("gemini --yolo", "--yolo"),
            ("gemini --YOLO=true", "--yolo"),
            ("gemini --approval-mode yolo", "approval-mode yolo"),
            ("gemini --approval-mode=YOLO", "approval-mode yolo"),
            (r#""defaultApprovalMode": "yolo""#, "approval-mode yolo"),
            ("approval_mode = 'yolo'", "approval-mode yolo"),
            (" yolo ", "approval-mode yolo"),
        ];
        for (input, token) in cases {
            assert_eq!(find_bypass_token(input), Some(token), "{input}");
            assert!(BYPASS_TOKENS.contains(&token));
        }
    }

    #[test]
    fn bypass_detector_ignores_hardening_settings_and_ordinary_words() {
        for input in [
            "disableBypassPermissionsMode",
            r#""disableBypassPermissionsMode": "disable""#,
            "disableYoloMode",
            "security.disableYoloMode: true",
            "yolo-detector",
            "pip install ultralytics yolov8",
            "python detect.py --model yolo11n.pt",
            "echo yolo",
            "acceptEdits",
            "workspace-write",
            "--approval-mode auto_edit",
            "",
        ] {
            assert_eq!(find_bypass_token(input), None, "{input}");
        }
    }

    #[test]
    fn secret_shapes_are_recognised_and_names_are_not() {
        for s in [
            "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789",
            "--api-key=sk-proj-1234567890abcdefghijklmnop",
            "AKIAIOSFODNN7EXAMPLE",
            "AIzaSyA1234567890abcdefghijklmnopqrstu",
            "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            "Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2ln",
            "-----BEGIN OPENSSH PRIVATE KEY-----",
        ] {
            assert!(looks_like_secret(s), "{s}");
        }
        for s in [
            "OPENAI_API_KEY",
            "/var/run/secrets/openai",
            "sk-some-long-package-name-here",
            "${GITHUB_TOKEN}",
            "npx -y @modelcontextprotocol/server-filesystem",
            "AKIA",
        ] {
            assert!(!looks_like_secret(s), "{s}");
        }
    }

    #[test]
    fn exact_versions_only() {
        for v in ["2.0.14", "0.1.0", "1.2.3-beta.1", "1.2.3+build.5"] {
            assert!(is_exact_version(v), "{v}");
        }
        for v in [
            "", "latest", "stable", "^2.0.14", "~2.0", ">=2.0.0", "2.0", "2.0.x", "2.*.1",
            "v2.0.14", "02.0.1", "2.0.14 ", "2.0.14-",
        ] {
            assert!(!is_exact_version(v), "{v}");
        }
    }

    #[test]
    fn aws_regions() {
        for r in [
            "us-east-1",
            "eu-central-2",
            "us-gov-west-1",
            "ap-southeast-3",
        ] {
            assert!(is_aws_region(r), "{r}");
        }
        for r in [
            "us-east",
            "useast1",
            "US-EAST-1",
            "us-east-1a",
            "global",
            "us--1",
        ] {
            assert!(!is_aws_region(r), "{r}");
        }
    }
}
