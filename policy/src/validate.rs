//! Semantic validation of a loaded policy: references, forms, ranges and names, then the
//! built-in guardrails, then any extra guardrails the organisation adds.
//!
//! Loading has already checked the shape of every document (types, unknown fields).
//! This module checks what a type cannot express: that names point at something, that
//! a route has exactly one form, that numbers are in range, that names can travel in
//! URLs and headers. Every problem is reported, not just the first, and each issue names
//! its document (through `Org::sources`) and a field path such as
//! `models.opus.targets[1].weight`.
//!
//! Rules: `reference` (a name points at nothing, or at the wrong kind of thing),
//! `form` (a field is missing, doubled or badly spelled: route forms, digests, dates,
//! durations, URLs), `range` (a number out of bounds), `name` (a name that cannot travel
//! in a URL or header), the warning `unusable` (a target no harness can reach), the
//! warning `unmapped-model` (a model family Claude Code resolves itself to an id the
//! gateway refuses, see [`crate::harness_models`]) and the warning `unpriced` (a routed
//! model the price table does not price: its cost is unknown).

use std::collections::{BTreeMap, BTreeSet};

use crate::guardrails::{self, Guardrail};
use crate::harness_models::{self, FamilyModel};
use crate::issue::Issue;
use crate::types::{
    AtLimit, Axis, CONTROL_VARIANT, DocumentSource, Experiment, Harness, Kind, MAX_PRICE_USD,
    ModelRoute, Org, Rollout, RolloutStatus, Target, UpstreamKind,
};

/// Rule for names that point at nothing (or at the wrong kind of thing).
pub const RULE_REFERENCE: &str = "reference";
/// Rule for numbers out of bounds.
pub const RULE_RANGE: &str = "range";
/// Rule for missing, doubled or malformed fields.
pub const RULE_FORM: &str = "form";
/// Rule for names that are not lowercase DNS labels.
pub const RULE_NAME: &str = "name";
/// Warning rule for targets that no harness can use.
pub const RULE_UNUSABLE: &str = "unusable";
/// Warning rule for a model a harness may ask for that is not a Gateway alias.
pub const RULE_UNMAPPED_MODEL: &str = "unmapped-model";
/// Warning rule for a routed model without a price (its calls' cost is unknown).
pub const RULE_UNPRICED: &str = "unpriced";

/// The largest budget in USD: a larger one is a typo (and would overflow micro-USD counts).
pub const MAX_BUDGET_USD: f64 = 1e9;
/// The longest Envoy may wait for the budget check (ms): it delays every budgeted call.
pub const MAX_BUDGET_TIMEOUT_MS: u32 = 5000;

/// Largest timeout a route target or hook may set, in seconds.
pub const MAX_TIMEOUT_SECONDS: u32 = 3600;
/// Longest name: names travel in URLs and headers (DNS-label length).
pub const MAX_NAME_LEN: usize = 63;

/// Semantic checks, then the 16 built-in guardrails. Sorted by source, then field.
pub fn validate(org: &Org) -> Vec<Issue> {
    validate_with(org, &[])
}

/// [`validate`], then each of `extra`. Extra guardrails only see the policy and return
/// issues that are appended: they cannot remove or change an issue found before them.
/// An extra issue with an empty `rule` gets the guardrail's name.
pub fn validate_with(org: &Org, extra: &[&dyn Guardrail]) -> Vec<Issue> {
    let mut issues = check_semantics(org);
    for guard in guardrails::builtin() {
        issues.extend(guard.check(org));
    }
    for guard in extra {
        issues.extend(guard.check(org).into_iter().map(|mut issue| {
            if issue.rule.is_empty() {
                issue.rule = guard.name().to_string();
            }
            issue
        }));
    }
    sort_issues(&mut issues);
    issues
}

/// Sorts issues by source (file, document), field, rule, message and severity, and drops
/// exact duplicates, so output is the same however the checks are ordered.
pub fn sort_issues(issues: &mut Vec<Issue>) {
    issues.sort_by(|a, b| {
        (&a.source, &a.field, &a.rule, &a.message, a.severity)
            .cmp(&(&b.source, &b.field, &b.rule, &b.message, b.severity))
    });
    issues.dedup();
}

/// The semantic checks alone (rules `reference`, `form`, `range`, `name`, `unusable`),
/// unsorted.
pub fn check_semantics(org: &Org) -> Vec<Issue> {
    let mut c = Checker {
        org,
        issues: Vec::new(),
    };
    c.root();
    c.gateway();
    c.profiles();
    c.rings();
    c.experiments();
    c.toggles();
    c.rollouts();
    c.issues
}

// ---------------------------------------------------------------------------
// Shared helpers (also used by the guardrails)
// ---------------------------------------------------------------------------

/// `base.key`, or `base["key"]` when the key holds characters that would make the path
/// ambiguous (dots, brackets, quotes, spaces) or is empty.
pub fn field_key(base: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'$' | b'@' | b'/'));
    let segment = if plain {
        key.to_string()
    } else {
        format!("[{}]", serde_json::Value::String(key.to_string()))
    };
    match (base.is_empty(), plain) {
        (true, true) => segment,
        (false, true) => format!("{base}.{segment}"),
        (_, false) => format!("{base}{segment}"),
    }
}

/// `base[i]`.
pub fn field_index(base: &str, i: usize) -> String {
    format!("{base}[{i}]")
}

/// Whether `s` is a lowercase DNS-label-like name: `[a-z0-9]([-a-z0-9.]*[a-z0-9])?`,
/// at most 63 characters.
pub fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= MAX_NAME_LEN
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| edge(c) || *c == b'-' || *c == b'.')
}

/// Whether `s` is a release digest: `sha256:` and 64 lowercase hex digits.
pub fn is_release_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The parts of an http(s) URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpUrl<'a> {
    pub https: bool,
    /// The host, IPv6 brackets removed.
    pub host: &'a str,
    /// The port as written; `None` for the scheme's default.
    pub port: Option<u16>,
    /// `host[:port]` as written (brackets kept): the Host header's value.
    pub authority: &'a str,
    /// Path and query as written, from the first `/` or `?` (empty when there is none).
    pub path: &'a str,
    /// The URL carries `user[:password]@`.
    pub userinfo: bool,
}

impl HttpUrl<'_> {
    /// The port, or the scheme's default (443, 80).
    pub fn port_or_default(&self) -> u16 {
        self.port.unwrap_or(if self.https { 443 } else { 80 })
    }
}

/// Parses an absolute http or https URL with a host (and optional port, path, query); the
/// scheme is case-insensitive (RFC 3986). The workspace's one URL parser: policy
/// validation, both Envoy configuration emitters and the filter's kill-list URL call it,
/// so a URL one accepts the others accept too. The error says what is wrong, without
/// repeating the URL.
pub fn parse_http_url(s: &str) -> Result<HttpUrl<'_>, &'static str> {
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain spaces or control characters");
    }
    let (scheme, rest) = s
        .split_once("://")
        .ok_or("must start with http:// or https://")?;
    let https = if scheme.eq_ignore_ascii_case("https") {
        true
    } else if scheme.eq_ignore_ascii_case("http") {
        false
    } else {
        return Err("must start with http:// or https://");
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let path = rest[authority.len()..]
        .split('#')
        .next()
        .unwrap_or_default();
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((_, hp)) => (true, hp),
        None => (false, authority),
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (addr, after) = v6.split_once(']').ok_or("has an unclosed [ in its host")?;
        if addr.is_empty()
            || !addr
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return Err("has a malformed IPv6 host");
        }
        match after {
            "" => (addr, None),
            p => (
                addr,
                Some(p.strip_prefix(':').ok_or("has junk after its IPv6 host")?),
            ),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err("has no host");
    }
    let host_ok = hostport.starts_with('[')
        || (host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            && !host.starts_with(['.', '-']));
    if !host_ok {
        return Err("has a malformed host");
    }
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or("has a malformed port")?,
        ),
    };
    Ok(HttpUrl {
        https,
        host,
        port,
        authority: hostport,
        path,
        userinfo,
    })
}

// ---------------------------------------------------------------------------
// The semantic checks
// ---------------------------------------------------------------------------

struct Checker<'a> {
    org: &'a Org,
    issues: Vec<Issue>,
}

/// Which document an issue belongs to.
#[derive(Clone, Copy)]
struct Doc<'a>(Kind, &'a str);

impl Checker<'_> {
    fn source(&self, doc: Doc<'_>) -> Option<DocumentSource> {
        self.org.source(doc.0, doc.1).cloned()
    }

    fn error(
        &mut self,
        doc: Doc<'_>,
        field: impl Into<String>,
        rule: &str,
        msg: impl Into<String>,
    ) {
        let issue = Issue::error(self.source(doc), field, rule, msg);
        self.issues.push(issue);
    }

    fn warning(
        &mut self,
        doc: Doc<'_>,
        field: impl Into<String>,
        rule: &str,
        msg: impl Into<String>,
    ) {
        let issue = Issue::warning(self.source(doc), field, rule, msg);
        self.issues.push(issue);
    }

    fn name(&mut self, doc: Doc<'_>, field: impl Into<String>, what: &str, name: &str) {
        if !is_name(name) {
            self.error(
                doc,
                field,
                RULE_NAME,
                format!(
                    "{what} {name:?} must be lowercase letters, digits, '-' and '.', start and end with a letter or digit, and be at most {MAX_NAME_LEN} characters"
                ),
            );
        }
    }

    /// A document's own `name` field. The key in `Org` is what sources are looked up by;
    /// the loader keys documents by their name, so a mismatch is reported too.
    fn doc_name(&mut self, doc: Doc<'_>, kind_word: &str, name: &str) {
        self.name(doc, "name", kind_word, name);
        if name != doc.1 {
            self.error(
                doc,
                "name",
                RULE_FORM,
                format!("{kind_word} is filed as {:?} but named {name:?}", doc.1),
            );
        }
    }

    fn percent(&mut self, doc: Doc<'_>, field: impl Into<String>, percent: Option<u32>) {
        if let Some(p) = percent
            && p > 100
        {
            self.error(
                doc,
                field,
                RULE_RANGE,
                format!("percent is {p}; it must be 0 to 100"),
            );
        }
    }

    fn timeout(&mut self, doc: Doc<'_>, field: impl Into<String>, timeout: Option<u32>) {
        if let Some(t) = timeout
            && !(1..=MAX_TIMEOUT_SECONDS).contains(&t)
        {
            self.error(
                doc,
                field,
                RULE_RANGE,
                format!("timeoutSeconds is {t}; it must be 1 to {MAX_TIMEOUT_SECONDS}"),
            );
        }
    }

    fn digest(&mut self, doc: Doc<'_>, field: impl Into<String>, digest: Option<&str>) {
        if let Some(d) = digest
            && !is_release_digest(d)
        {
            self.error(
                doc,
                field,
                RULE_FORM,
                format!("release {d:?} must be sha256: followed by 64 lowercase hex digits"),
            );
        }
    }

    fn url(&mut self, doc: Doc<'_>, field: impl Into<String>, url: &str) {
        if let Err(why) = parse_http_url(url) {
            self.error(doc, field, RULE_FORM, format!("URL {why}"));
        }
    }

    fn alias_exists(&mut self, doc: Doc<'_>, field: impl Into<String>, alias: &str) {
        if !self.org.gateway.models.contains_key(alias) {
            self.error(
                doc,
                field,
                RULE_REFERENCE,
                format!("model alias {alias:?} is not in the Gateway's models"),
            );
        }
    }

    /// Warn for each model family Claude Code resolves itself that the profile (as
    /// resolved through `extends`) leaves unmapped or maps to a name that is no alias.
    /// Only where the profile itself names claude-code, so a parent's gap is said once.
    fn claude_code_families(&mut self, doc: Doc<'_>, key: &str) {
        let org = self.org;
        let declared = org
            .profiles
            .get(key)
            .is_some_and(|p| p.harnesses.contains_key(&Harness::ClaudeCode));
        let Ok(effective) = crate::profile::resolve(org, key) else {
            return;
        };
        let (true, Some(harness)) = (declared, effective.harnesses.get(&Harness::ClaudeCode))
        else {
            return;
        };
        let field = "harnesses.claude-code";
        for (family, model) in harness_models::claude_code_families(&org.gateway, harness) {
            match model {
                FamilyModel::Alias(_) => {}
                FamilyModel::Overridden(v) if org.gateway.models.contains_key(&v) => {}
                FamilyModel::Overridden(v) => self.warning(
                    doc,
                    format!("{field}.overrides.env.{}", family.env),
                    RULE_UNMAPPED_MODEL,
                    format!(
                        "{} is {v:?}, which is not in the Gateway's models: Claude Code's {:?} requests will be refused",
                        family.env, family.name
                    ),
                ),
                FamilyModel::Unmapped => self.warning(
                    doc,
                    field,
                    RULE_UNMAPPED_MODEL,
                    format!(
                        "Claude Code sends its own model id for {name:?} (its /model menu, subagents, background calls), which the gateway refuses: add a Gateway alias {name:?} or set overrides.env.{env} to an alias",
                        name = family.name,
                        env = family.env
                    ),
                ),
            }
        }
    }

    fn ring_exists(&mut self, doc: Doc<'_>, field: impl Into<String>, ring: &str) {
        if !self.org.rings.contains_key(ring) {
            self.error(
                doc,
                field,
                RULE_REFERENCE,
                format!("ring {ring:?} does not exist"),
            );
        }
    }

    fn profile_exists(&mut self, doc: Doc<'_>, field: impl Into<String>, profile: &str) {
        if !self.org.profiles.contains_key(profile) {
            self.error(
                doc,
                field,
                RULE_REFERENCE,
                format!("profile {profile:?} does not exist"),
            );
        }
    }

    /// Route overrides (experiment variants, toggles): each key must be an existing alias.
    fn override_routes(&mut self, doc: Doc<'_>, base: &str, routes: &BTreeMap<String, ModelRoute>) {
        for (alias, route) in routes {
            let path = field_key(base, alias);
            self.alias_exists(doc, path.clone(), alias);
            self.route(doc, &path, route);
        }
    }

    /// One route: exactly one form, existing upstreams, weights and timeouts in range.
    fn route(&mut self, doc: Doc<'_>, path: &str, route: &ModelRoute) {
        let single = route.upstream.is_some() || route.model.is_some();
        let listed = !route.targets.is_empty();
        match (single, listed) {
            (true, true) => self.error(
                doc,
                path,
                RULE_FORM,
                "a route is either {upstream, model} or {targets: [...]}, not both",
            ),
            (false, false) => self.error(
                doc,
                path,
                RULE_FORM,
                "a route needs either {upstream, model} or a non-empty targets list",
            ),
            _ => {}
        }
        if single {
            if !listed {
                if route.upstream.is_none() {
                    self.error(
                        doc,
                        field_key(path, "upstream"),
                        RULE_FORM,
                        "upstream is missing",
                    );
                }
                if route.model.is_none() {
                    self.error(doc, field_key(path, "model"), RULE_FORM, "model is missing");
                }
            }
            if let Some(model) = &route.model
                && model.trim().is_empty()
            {
                self.error(
                    doc,
                    field_key(path, "model"),
                    RULE_FORM,
                    "model must not be empty",
                );
            }
            if let Some(upstream) = &route.upstream {
                self.target_upstream(doc, path, &field_key(path, "upstream"), upstream);
            }
            self.timeout(
                doc,
                field_key(path, "timeoutSeconds"),
                route.timeout_seconds,
            );
        } else if listed && route.timeout_seconds.is_some() {
            self.error(
                doc,
                field_key(path, "timeoutSeconds"),
                RULE_FORM,
                "with targets, set timeoutSeconds on each target",
            );
        }
        for (i, target) in route.targets.iter().enumerate() {
            let tpath = field_index(&field_key(path, "targets"), i);
            self.target(doc, &tpath, target);
        }
    }

    fn target(&mut self, doc: Doc<'_>, path: &str, target: &Target) {
        self.target_upstream(doc, path, &field_key(path, "upstream"), &target.upstream);
        if target.model.trim().is_empty() {
            self.error(
                doc,
                field_key(path, "model"),
                RULE_FORM,
                "model must not be empty",
            );
        }
        if target.weight == Some(0) {
            self.error(
                doc,
                field_key(path, "weight"),
                RULE_RANGE,
                "weight 0 is refused: a target with weight 0 is never picked; remove the target or give it weight 1 or more",
            );
        }
        self.timeout(
            doc,
            field_key(path, "timeoutSeconds"),
            target.timeout_seconds,
        );
    }

    /// The upstream exists; warn when its kind serves none of the harnesses' wires.
    fn target_upstream(&mut self, doc: Doc<'_>, target_path: &str, field: &str, upstream: &str) {
        let Some(up) = self.org.gateway.upstreams.get(upstream) else {
            self.error(
                doc,
                field,
                RULE_REFERENCE,
                format!("upstream {upstream:?} is not in the Gateway's upstreams"),
            );
            return;
        };
        let gateway = &self.org.gateway;
        let usable = Harness::ALL
            .iter()
            .any(|&h| up.kind.serves(gateway.protocol(h)));
        if !usable {
            let wires: Vec<String> = Harness::ALL
                .iter()
                .map(|&h| format!("{} speaks {}", h.as_str(), gateway.protocol(h).as_str()))
                .collect();
            self.warning(
                doc,
                target_path,
                RULE_UNUSABLE,
                format!(
                    "upstream {upstream:?} is kind {}, which serves none of the harnesses ({}); this target is never used",
                    up.kind.as_str(),
                    wires.join(", ")
                ),
            );
        }
    }

    fn root(&mut self) {
        let doc = Doc(Kind::Root, "");
        if self.org.root.org.trim().is_empty() {
            self.error(doc, "org", RULE_FORM, "org must name the organisation");
        }
    }

    fn gateway(&mut self) {
        let doc = Doc(Kind::Gateway, "");
        let gateway = &self.org.gateway;
        if !gateway.base_url.is_empty() {
            self.url(doc, "baseURL", &gateway.base_url);
        }
        for (name, up) in &gateway.upstreams {
            let base = field_key("upstreams", name);
            self.name(doc, base.clone(), "upstream name", name);
            self.url(doc, field_key(&base, "url"), &up.url);
            if up.kind == UpstreamKind::AzureOpenai && up.credential.is_none() {
                // The spec: "credential is required". Without one every call would reach
                // Azure keyless and fail there, or not at all.
                self.error(
                    doc,
                    field_key(&base, "credential"),
                    RULE_FORM,
                    "an azure-openai upstream needs a credential (env or file holding its api-key): the gateway sends Azure no other authentication",
                );
            }
            if let Some(cred) = &up.credential {
                let path = field_key(&base, "credential");
                match (&cred.env, &cred.file) {
                    (Some(_), Some(_)) => self.error(
                        doc,
                        path,
                        RULE_FORM,
                        "a credential names exactly one of env or file, not both",
                    ),
                    (None, None) => self.error(
                        doc,
                        path,
                        RULE_FORM,
                        "a credential names exactly one of env or file",
                    ),
                    _ => {}
                }
            }
        }
        for (alias, route) in &gateway.models {
            let path = field_key("models", alias);
            self.name(doc, path.clone(), "model alias", alias);
            self.route(doc, &path, route);
        }
        self.prices();
        self.budgets();
    }

    /// Budgets: names, who they apply to (rings that exist), a limit that is positive and
    /// finite, a time zone the database knows, `routeTo` between aliases; the budget
    /// service's timeout.
    fn budgets(&mut self) {
        let doc = Doc(Kind::Gateway, "");
        let gateway = &self.org.gateway;
        for (name, b) in &gateway.budgets {
            let base = field_key("budgets", name);
            self.name(doc, base.clone(), "budget name", name);
            let scope = &b.applies_to;
            if scope.users.is_empty() && scope.groups.is_empty() && scope.rings.is_empty() {
                self.error(
                    doc,
                    field_key(&base, "appliesTo"),
                    RULE_FORM,
                    "a budget applies to at least one user, group or ring",
                );
            }
            for (i, ring) in scope.rings.iter().enumerate() {
                if !self.org.rings.contains_key(ring) {
                    self.error(
                        doc,
                        field_index(&field_key(&field_key(&base, "appliesTo"), "rings"), i),
                        RULE_REFERENCE,
                        format!("ring {ring:?} does not exist"),
                    );
                }
            }
            let limit = field_key(&base, "limit");
            match (b.limit.usd, b.limit.tokens) {
                (None, None) => self.error(
                    doc,
                    limit,
                    RULE_FORM,
                    "a budget's limit names usd, tokens or both",
                ),
                (usd, tokens) => {
                    if usd.is_some_and(|u| !(u.is_finite() && u > 0.0 && u <= MAX_BUDGET_USD)) {
                        self.error(
                            doc,
                            field_key(&limit, "usd"),
                            RULE_RANGE,
                            format!("usd must be above 0 and at most {MAX_BUDGET_USD}"),
                        );
                    }
                    if tokens == Some(0) {
                        self.error(
                            doc,
                            field_key(&limit, "tokens"),
                            RULE_RANGE,
                            "tokens must be at least 1",
                        );
                    }
                }
            }
            if let Err(e) = crate::budgets::time_zone(b.time_zone.as_deref()) {
                self.error(doc, field_key(&base, "timeZone"), RULE_FORM, e.to_string());
            }
            if let AtLimit::RouteTo(routes) = &b.at_limit {
                let path = field_key(&field_key(&base, "atLimit"), "routeTo");
                if routes.is_empty() {
                    self.error(
                        doc,
                        path.clone(),
                        RULE_FORM,
                        "routeTo names at least one alias",
                    );
                }
                for (from, to) in routes {
                    for alias in [from, to] {
                        if !gateway.models.contains_key(alias) {
                            self.error(
                                doc,
                                field_key(&path, from),
                                RULE_REFERENCE,
                                format!("model alias {alias:?} does not exist"),
                            );
                        }
                    }
                    if from == to {
                        self.error(
                            doc,
                            field_key(&path, from),
                            RULE_FORM,
                            "an alias cannot be routed to itself",
                        );
                    }
                }
            }
        }
        if let Some(ms) = gateway.budget_service.and_then(|s| s.timeout_ms)
            && !(1..=MAX_BUDGET_TIMEOUT_MS).contains(&ms)
        {
            self.error(
                doc,
                "budgetService.timeoutMs",
                RULE_RANGE,
                format!("timeoutMs must be 1 to {MAX_BUDGET_TIMEOUT_MS}"),
            );
        }
    }

    /// Prices name known upstreams and are finite, non-negative and below
    /// [`MAX_PRICE_USD`]; every routed (upstream, model) has one, else a warning.
    fn prices(&mut self) {
        let doc = Doc(Kind::Gateway, "");
        let gateway = &self.org.gateway;
        for (upstream, models) in &gateway.prices {
            let base = field_key("prices", upstream);
            if !gateway.upstreams.contains_key(upstream) {
                self.error(
                    doc,
                    base.clone(),
                    RULE_REFERENCE,
                    format!("upstream {upstream:?} is not in the Gateway's upstreams"),
                );
            }
            for (model, price) in models {
                let mpath = field_key(&base, model);
                let fields = [
                    ("input", Some(price.input)),
                    ("output", Some(price.output)),
                    ("cacheWrite", price.cache_write),
                    ("cacheRead", price.cache_read),
                ];
                for (name, value) in fields {
                    if let Some(v) = value
                        && !(v.is_finite() && (0.0..=MAX_PRICE_USD).contains(&v))
                    {
                        self.error(
                            doc,
                            field_key(&mpath, name),
                            RULE_RANGE,
                            format!(
                                "price is {v}; it must be 0 to {MAX_PRICE_USD} USD per million tokens"
                            ),
                        );
                    }
                }
            }
        }
        for (alias, route) in &gateway.models {
            let path = field_key("models", alias);
            let targets: Vec<(String, &str, &str)> = match (&route.upstream, &route.model) {
                (Some(up), Some(model)) => vec![(path.clone(), up.as_str(), model.as_str())],
                _ => route
                    .targets
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        (
                            field_index(&field_key(&path, "targets"), i),
                            t.upstream.as_str(),
                            t.model.as_str(),
                        )
                    })
                    .collect(),
            };
            for (tpath, upstream, model) in targets {
                if gateway.upstreams.contains_key(upstream)
                    && gateway.price(upstream, model).is_none()
                {
                    self.warning(
                        doc,
                        tpath,
                        RULE_UNPRICED,
                        format!(
                            "model {model:?} on upstream {upstream:?} has no price in prices: the cost of its calls is unknown"
                        ),
                    );
                }
            }
        }
    }

    fn profiles(&mut self) {
        let org = self.org;
        for (key, profile) in &org.profiles {
            let doc = Doc(Kind::Profile, key);
            self.doc_name(doc, "profile", &profile.name);
            if let Some(parent) = &profile.extends {
                self.profile_exists(doc, "extends", parent);
            }
            if let Some(cycle) = extends_cycle(org, key) {
                self.error(
                    doc,
                    "extends",
                    RULE_REFERENCE,
                    format!("extends forms a cycle: {}", cycle.join(" -> ")),
                );
            }
            for (harness, settings) in &profile.harnesses {
                if let Some(model) = &settings.model {
                    let path = format!("harnesses.{}.model", harness.as_str());
                    if *harness == Harness::GeminiCli
                        && harness_models::GEMINI_CLI_SELF_RESOLVED.contains(&model.as_str())
                    {
                        self.warning(
                            doc,
                            path.clone(),
                            RULE_UNMAPPED_MODEL,
                            format!(
                                "Gemini CLI replaces {model:?} with its own model id, which the gateway refuses: name the alias otherwise (for example gemini-{model})"
                            ),
                        );
                    }
                    self.alias_exists(doc, path, model);
                }
            }
            self.claude_code_families(doc, key);
            for (i, alias) in profile.models.iter().enumerate() {
                self.alias_exists(doc, field_index("models", i), alias);
            }
            for (server, mcp) in &profile.mcp {
                let base = field_key("mcp", server);
                match (&mcp.command, &mcp.url) {
                    (Some(_), Some(_)) => self.error(
                        doc,
                        base.clone(),
                        RULE_FORM,
                        "an MCP server is either a command or a url, not both",
                    ),
                    (None, None) => self.error(
                        doc,
                        base.clone(),
                        RULE_FORM,
                        "an MCP server needs a command or a url",
                    ),
                    _ => {}
                }
                if let Some(url) = &mcp.url {
                    self.url(doc, field_key(&base, "url"), url);
                }
            }
            for (event, hooks) in &profile.hooks {
                for (i, hook) in hooks.iter().enumerate() {
                    let path = field_index(&field_key("hooks", event), i);
                    if hook.command.trim().is_empty() {
                        self.error(
                            doc,
                            field_key(&path, "command"),
                            RULE_FORM,
                            "a hook needs a command",
                        );
                    }
                    self.timeout(
                        doc,
                        field_key(&path, "timeoutSeconds"),
                        hook.timeout_seconds,
                    );
                }
            }
        }
    }

    fn rings(&mut self) {
        for (key, ring) in &self.org.rings {
            let doc = Doc(Kind::Ring, key);
            self.doc_name(doc, "ring", &ring.name);
            self.profile_exists(doc, "profile", &ring.profile);
            self.digest(doc, "release", ring.release.as_deref());
            self.percent(doc, "membership.percent", ring.membership.percent);
        }
    }

    fn experiments(&mut self) {
        for (key, exp) in &self.org.experiments {
            let doc = Doc(Kind::Experiment, key);
            self.doc_name(doc, "experiment", &exp.name);
            for (i, ring) in exp.rings.iter().enumerate() {
                self.ring_exists(doc, field_index("rings", i), ring);
            }
            if exp.variants.is_empty() {
                self.error(doc, "variants", RULE_FORM, "an experiment needs variants");
            }
            let mut seen = BTreeSet::new();
            for (i, variant) in exp.variants.iter().enumerate() {
                let base = field_index("variants", i);
                self.name(doc, field_key(&base, "name"), "variant name", &variant.name);
                if !seen.insert(variant.name.as_str()) {
                    self.error(
                        doc,
                        field_key(&base, "name"),
                        RULE_FORM,
                        format!("variant {:?} appears more than once", variant.name),
                    );
                }
                if variant.weight == 0 {
                    self.error(
                        doc,
                        field_key(&base, "weight"),
                        RULE_RANGE,
                        "variant weight must be at least 1",
                    );
                }
                let control = variant.name == CONTROL_VARIANT;
                match exp.axis {
                    Axis::Traffic => {
                        if variant.profile.is_some() {
                            self.error(
                                doc,
                                field_key(&base, "profile"),
                                RULE_FORM,
                                "a traffic-axis variant overrides routes, not a profile",
                            );
                        }
                        if !control && variant.routes.is_empty() {
                            self.error(
                                doc,
                                field_key(&base, "routes"),
                                RULE_FORM,
                                "a traffic-axis treatment variant needs routes",
                            );
                        }
                    }
                    Axis::Client => {
                        if !variant.routes.is_empty() {
                            self.error(
                                doc,
                                field_key(&base, "routes"),
                                RULE_FORM,
                                "a client-axis variant names a profile, not routes",
                            );
                        }
                        match &variant.profile {
                            Some(p) => self.profile_exists(doc, field_key(&base, "profile"), p),
                            None if !control => self.error(
                                doc,
                                field_key(&base, "profile"),
                                RULE_FORM,
                                "a client-axis treatment variant needs a profile",
                            ),
                            None => {}
                        }
                    }
                }
                self.override_routes(doc, &field_key(&base, "routes"), &variant.routes);
            }
        }
    }

    fn toggles(&mut self) {
        for (key, toggle) in &self.org.toggles {
            let doc = Doc(Kind::Toggle, key);
            self.doc_name(doc, "toggle", &toggle.name);
            if !is_date(&toggle.expires) {
                self.error(
                    doc,
                    "expires",
                    RULE_FORM,
                    format!(
                        "expires {:?} must be a date written YYYY-MM-DD",
                        toggle.expires
                    ),
                );
            }
            for (i, rule) in toggle.rules.iter().enumerate() {
                let base = field_index("rules", i);
                for (j, ring) in rule.rings.iter().enumerate() {
                    self.ring_exists(doc, field_index(&field_key(&base, "rings"), j), ring);
                }
                self.percent(doc, field_key(&base, "percent"), rule.percent);
            }
            let routes = toggle.traffic.as_ref().map(|t| &t.routes);
            match toggle.axis {
                Axis::Traffic => {
                    if routes.is_none_or(BTreeMap::is_empty) {
                        self.error(
                            doc,
                            "traffic.routes",
                            RULE_FORM,
                            "a traffic toggle needs traffic.routes",
                        );
                    }
                    if !toggle.client.is_empty() {
                        self.error(
                            doc,
                            "client",
                            RULE_FORM,
                            "a traffic toggle overrides routes, not client settings",
                        );
                    }
                }
                Axis::Client => {
                    if toggle.client.is_empty() {
                        self.error(
                            doc,
                            "client",
                            RULE_FORM,
                            "a client toggle needs client settings fragments",
                        );
                    }
                    if toggle.traffic.is_some() {
                        self.error(
                            doc,
                            "traffic",
                            RULE_FORM,
                            "a client toggle carries client fragments, not traffic routes",
                        );
                    }
                }
            }
            if let Some(routes) = routes {
                self.override_routes(doc, "traffic.routes", routes);
            }
        }
    }

    /// A rollout's steps must be carried by its experiment's one split (see
    /// `compile::rollout_cohort`): a control and one treatment variant, the experiment's
    /// rings bounding every step's, and no step narrowing a ring an earlier step took whole.
    fn rollout_cohort(&mut self, doc: Doc<'_>, rollout: &Rollout, exp: &Experiment) {
        let treatments = exp
            .variants
            .iter()
            .filter(|v| v.name != CONTROL_VARIANT)
            .count();
        if treatments != 1 || exp.variants.len() != 2 {
            self.error(
                doc,
                "experiment",
                RULE_REFERENCE,
                format!(
                    "experiment {:?} backs a rollout, so it needs a `{CONTROL_VARIANT}` variant and exactly one other (it has {} variants)",
                    rollout.experiment,
                    exp.variants.len()
                ),
            );
        }
        let mut whole: Option<(usize, &str)> = None;
        for (i, step) in rollout.steps.iter().enumerate() {
            let base = field_index("steps", i);
            if !exp.rings.contains(&step.ring) {
                self.error(
                    doc,
                    field_key(&base, "ring"),
                    RULE_REFERENCE,
                    format!(
                        "ring {:?} is not among experiment {:?}'s rings {:?}: the experiment's rings bound the rollout's",
                        step.ring, rollout.experiment, exp.rings
                    ),
                );
            }
            let percent = step.percent.unwrap_or(100);
            match whole {
                Some((j, ring)) if percent < 100 => self.error(
                    doc,
                    field_key(&base, "percent"),
                    RULE_RANGE,
                    format!(
                        "percent {percent} after step {j} took ring {ring:?} whole: the experiment has one split for all its rings, so a later step cannot narrow it (split the rollout)"
                    ),
                ),
                None if percent >= 100 => whole = Some((i, &step.ring)),
                _ => {}
            }
        }
    }

    fn rollouts(&mut self) {
        let org = self.org;
        let mut backing: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let active = |r: &&Rollout| {
            matches!(
                r.status,
                RolloutStatus::Pending | RolloutStatus::Running | RolloutStatus::Paused
            )
        };
        for rollout in org.rollouts.values().filter(active) {
            backing
                .entry(rollout.experiment.as_str())
                .or_default()
                .push(rollout.name.as_str());
        }
        for (key, rollout) in &org.rollouts {
            let names = backing
                .get(rollout.experiment.as_str())
                .map_or(&[][..], Vec::as_slice);
            if active(&rollout) && names.len() > 1 {
                self.error(
                    Doc(Kind::Rollout, key),
                    "experiment",
                    RULE_REFERENCE,
                    format!(
                        "experiment {:?} backs rollouts {names:?}: one experiment carries one rollout",
                        rollout.experiment
                    ),
                );
            }
        }
        for (key, rollout) in &org.rollouts {
            let doc = Doc(Kind::Rollout, key);
            self.doc_name(doc, "rollout", &rollout.name);
            match org.experiments.get(&rollout.experiment) {
                None => self.error(
                    doc,
                    "experiment",
                    RULE_REFERENCE,
                    format!("experiment {:?} does not exist", rollout.experiment),
                ),
                Some(exp) if exp.axis != rollout.axis => self.error(
                    doc,
                    "experiment",
                    RULE_REFERENCE,
                    format!(
                        "rollout is {}-axis but experiment {:?} is {}-axis",
                        axis_str(rollout.axis),
                        rollout.experiment,
                        axis_str(exp.axis)
                    ),
                ),
                Some(exp) => self.rollout_cohort(doc, rollout, exp),
            }
            let change = &rollout.change;
            match (&change.release, &change.alias, rollout.axis) {
                (Some(_), Some(_), _) => self.error(
                    doc,
                    "change",
                    RULE_FORM,
                    "a change is exactly one of release or alias, not both",
                ),
                (None, None, _) => self.error(
                    doc,
                    "change",
                    RULE_FORM,
                    "a change needs a release (client axis) or an alias (traffic axis)",
                ),
                (Some(_), None, Axis::Traffic) => self.error(
                    doc,
                    "change.release",
                    RULE_FORM,
                    "a traffic-axis rollout changes an alias, not a release",
                ),
                (None, Some(_), Axis::Client) => self.error(
                    doc,
                    "change.alias",
                    RULE_FORM,
                    "a client-axis rollout changes a release, not an alias",
                ),
                _ => {}
            }
            self.digest(doc, "change.release", change.release.as_deref());
            if let Some(alias) = &change.alias {
                self.alias_exists(doc, "change.alias.name", &alias.name);
                self.route(doc, "change.alias.route", &alias.route);
            }
            if let Some(baseline) = &rollout.baseline {
                self.digest(doc, "baseline.release", baseline.release.as_deref());
            }
            if !rollout.steps.is_empty() && rollout.step as usize >= rollout.steps.len() {
                self.error(
                    doc,
                    "step",
                    RULE_RANGE,
                    format!(
                        "step is {} but there are only {} steps (the first is 0)",
                        rollout.step,
                        rollout.steps.len()
                    ),
                );
            }
            for (i, step) in rollout.steps.iter().enumerate() {
                let base = field_index("steps", i);
                self.ring_exists(doc, field_key(&base, "ring"), &step.ring);
                self.percent(doc, field_key(&base, "percent"), step.percent);
                if humantime::parse_duration(step.bake.trim()).is_err()
                    || step.bake.trim().is_empty()
                {
                    self.error(
                        doc,
                        field_key(&base, "bake"),
                        RULE_FORM,
                        format!("bake {:?} is not a duration such as 30m or 24h", step.bake),
                    );
                }
            }
        }
    }
}

fn axis_str(axis: Axis) -> &'static str {
    match axis {
        Axis::Client => "client",
        Axis::Traffic => "traffic",
    }
}

/// A calendar date written `YYYY-MM-DD`.
fn is_date(s: &str) -> bool {
    let format = time::macros::format_description!("[year]-[month]-[day]");
    s.len() == 10 && time::Date::parse(s, format).is_ok()
}

/// If following `extends` from `start` comes back to `start`, the cycle's names.
fn extends_cycle(org: &Org, start: &str) -> Option<Vec<String>> {
    let mut chain = vec![start.to_string()];
    let mut seen = BTreeSet::from([start]);
    let mut current = org.profiles.get(start)?;
    while let Some(parent) = current.extends.as_deref() {
        if parent == start {
            chain.push(parent.to_string());
            return Some(chain);
        }
        if !seen.insert(parent) {
            // A cycle further up the chain; its members report it.
            return None;
        }
        chain.push(parent.to_string());
        current = org.profiles.get(parent)?;
    }
    None
}
