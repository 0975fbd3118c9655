//! budgets: which spend and token budgets apply to a caller, the key each one is counted
//! under, its calendar period, and the 429 a caller gets once one is spent (issue #25;
//! docs/design/budgets.md).
//!
//! One function decides which budgets apply, [`applying`]: the filter calls it to name a
//! call's budgets (the `wasm.halo_budgets` fact Envoy's rate-limit descriptors carry),
//! halo-server's rate-limit service and `halo budget status` call it for the same keys, and
//! `halo gateway routes --user U` prints what it returns. Every budget that applies is
//! checked; any one spent refuses the call, so the tightest wins.
//!
//! A key never carries the user: a per-user count is keyed by the salted hash
//! [`subject_key`] (the `assign::unit` construction with the budget's own salt), a pooled
//! one by [`POOL`].
//!
//! The periods are calendar days, ISO weeks (from Monday) and months in the budget's IANA
//! time zone, from the bundled time-zone database: the same start on every host.

use jiff::ToSpan as _;
use jiff::tz::TimeZone;

use crate::assign;
use crate::decide::Subject;
use crate::snapshot::Snapshot;
use crate::types::{AtLimit, Budget, BudgetCount, BudgetLimit, BudgetPeriod, WireProtocol};

/// The subject of a pooled count.
pub const POOL: &str = "pool";
/// The time zone of a budget that names none.
pub const DEFAULT_TIME_ZONE: &str = "UTC";
/// Envoy's wait for the budget check (and for each stream-done spend) when the policy
/// names none (ms). Measured on the loaded 2-core development machine, 50 concurrent
/// calls: the service answered in 26-455 ms (p50 78-202, p99 250-445); at 200 ms about
/// half of such a burst failed open and its spends were lost. 1000 ms covers the burst
/// with room; the cost is that a hung (not refused) service delays each budgeted call by
/// up to a second before it passes uncounted (BENCHMARKS.md "Budgets").
pub const DEFAULT_TIMEOUT_MS: u32 = 1000;

/// One budget's count: the budget and whose count (a [`subject_key`] or [`POOL`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BudgetKey {
    pub budget: String,
    pub subject: String,
}

/// A budget that applies to a caller, and the key its count is under.
#[derive(Debug, Clone, PartialEq)]
pub struct Applying<'a> {
    pub name: &'a str,
    pub budget: &'a Budget,
    pub key: BudgetKey,
}

/// The per-user key of `user` under budget `budget`: 32 hex digits, salted with the
/// budget's name so one budget's key says nothing about another's or about evidence units.
pub fn subject_key(budget: &str, user: &str) -> String {
    assign::unit(&format!("budget:{budget}"), user)
}

/// The budgets that apply to `subject` in `ring` (the ring the decision resolved), by
/// name: those whose `appliesTo` names the user, one of their groups, or the ring.
/// Anonymous callers have no subject and no budget.
pub fn applying<'a>(snap: &'a Snapshot, subject: &Subject, ring: &str) -> Vec<Applying<'a>> {
    snap.budgets
        .iter()
        .filter(|(_, b)| {
            let s = &b.applies_to;
            s.users.contains(&subject.user)
                || subject.groups.iter().any(|g| s.groups.contains(g))
                || s.rings.iter().any(|r| r == ring)
        })
        .map(|(name, budget)| Applying {
            name,
            budget,
            key: BudgetKey {
                budget: name.clone(),
                subject: match budget.count {
                    BudgetCount::PerUser => subject_key(name, &subject.user),
                    BudgetCount::Pooled => POOL.to_string(),
                },
            },
        })
        .collect()
}

/// Keys as one filter-state string: `budget:subject` joined by `,` (names cannot hold
/// either character, keys are hex or [`POOL`]).
pub fn encode_keys<'k>(keys: impl IntoIterator<Item = &'k BudgetKey>) -> String {
    keys.into_iter()
        .map(|k| format!("{}:{}", k.budget, k.subject))
        .collect::<Vec<_>>()
        .join(",")
}

/// A keys string that [`encode_keys`] did not write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed budget keys: {0:?} is not budget:subject")]
pub struct KeysError(pub String);

/// The keys of [`encode_keys`]' string.
pub fn decode_keys(s: &str) -> Result<Vec<BudgetKey>, KeysError> {
    s.split(',')
        .filter(|part| !part.is_empty())
        .map(|part| match part.split_once(':') {
            Some((b, sub)) if !b.is_empty() && !sub.is_empty() && !sub.contains(':') => {
                Ok(BudgetKey {
                    budget: b.to_string(),
                    subject: sub.to_string(),
                })
            }
            _ => Err(KeysError(part.to_string())),
        })
        .collect()
}

/// The IANA time zone `name` (default [`DEFAULT_TIME_ZONE`]), from the bundled database.
pub fn time_zone(name: Option<&str>) -> Result<TimeZone, PeriodError> {
    let name = name.unwrap_or(DEFAULT_TIME_ZONE);
    TimeZone::get(name).map_err(|_| PeriodError::UnknownZone(name.to_string()))
}

/// A calendar period: `[start, end)` in Unix milliseconds, and its end as RFC 3339 with
/// the zone's offset (what a refusal says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Period {
    pub start_ms: i64,
    pub end_ms: i64,
    pub resets_at: String,
}

/// Why a period cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeriodError {
    #[error("time zone {0:?} is not in the IANA time-zone database")]
    UnknownZone(String),
    #[error("time {0} ms is out of the calendar's range")]
    OutOfRange(i64),
}

/// The period of `budget` that contains `now_ms` (Unix milliseconds).
pub fn period(budget: &Budget, now_ms: i64) -> Result<Period, PeriodError> {
    let tz = time_zone(budget.time_zone.as_deref())?;
    let range = || PeriodError::OutOfRange(now_ms);
    let now = jiff::Timestamp::from_millisecond(now_ms)
        .map_err(|_| range())?
        .to_zoned_datetime(tz.clone());
    let today = now.date();
    let (first, next) = match budget.period {
        BudgetPeriod::Day => (today, today.checked_add(1.day()).map_err(|_| range())?),
        BudgetPeriod::Week => {
            let back = i64::from(today.weekday().to_monday_zero_offset());
            let monday = today.checked_sub(back.days()).map_err(|_| range())?;
            (monday, monday.checked_add(1.week()).map_err(|_| range())?)
        }
        BudgetPeriod::Month => {
            let first = today.first_of_month();
            (first, first.checked_add(1.month()).map_err(|_| range())?)
        }
    };
    // Midnight, or the first instant of the day when a DST change skips midnight.
    let start = first.to_zoned_datetime(tz.clone()).map_err(|_| range())?;
    let end = next.to_zoned_datetime(tz).map_err(|_| range())?;
    Ok(Period {
        start_ms: start.timestamp().as_millisecond(),
        end_ms: end.timestamp().as_millisecond(),
        resets_at: end
            .timestamp()
            .display_with_offset(end.offset())
            .to_string(),
    })
}

/// What a count holds: tokens and micro-USD (USD × 10⁶, integers as Envoy's hits are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Spent {
    pub tokens: u64,
    pub micro_usd: u64,
}

/// A USD amount in micro-USD, rounded (what the filter reports and the count keeps).
pub fn micro_usd(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        (usd * 1e6).round() as u64
    } else {
        0
    }
}

/// Whether `spent` has reached `limit` (either of its amounts).
pub fn is_spent(limit: &BudgetLimit, spent: Spent) -> bool {
    limit.tokens.is_some_and(|t| spent.tokens >= t)
        || limit.usd.is_some_and(|u| spent.micro_usd >= micro_usd(u))
}

/// The limit in words: `USD 50`, `5000000 tokens`, `USD 50 or 5000000 tokens`.
pub fn describe_limit(limit: &BudgetLimit) -> String {
    let usd = limit.usd.map(|u| format!("USD {u}"));
    let tokens = limit.tokens.map(|t| format!("{t} tokens"));
    match (usd, tokens) {
        (Some(u), Some(t)) => format!("{u} or {t}"),
        (Some(x), None) | (None, Some(x)) => x,
        (None, None) => "no limit".to_string(),
    }
}

/// The budget in words: `USD 50 per day, Europe/Berlin`.
pub fn describe(budget: &Budget) -> String {
    format!(
        "{} per {}, {}",
        describe_limit(&budget.limit),
        budget.period.as_str(),
        budget.time_zone.as_deref().unwrap_or(DEFAULT_TIME_ZONE)
    )
}

/// The message a refused caller reads: the budget, its limit and period, and its reset.
pub fn spent_message(name: &str, budget: &Budget, period: &Period) -> String {
    format!(
        "halo budget {name} ({}) is spent; it resets at {}",
        describe(budget),
        period.resets_at
    )
}

/// The 429 a caller on `wire` gets once a budget is spent, `retry_after_s` before it can
/// pass again: the body in that wire's own error shape and the headers besides
/// `content-type` and `retry-after`. Each shape is the one its harness stops on (checked
/// live with the real harnesses, e2e/tests/harnesses.rs): Anthropic's
/// `rate_limit_error` (Claude Code prints the message and exits); OpenAI's
/// `insufficient_quota`, which Codex treats as final (`rate_limit_exceeded` makes it
/// sleep the Retry-After, hours, before each of its retries); Google's
/// `RESOURCE_EXHAUSTED` with a `RetryInfo` detail, which Gemini CLI treats as final when
/// the delay is over 5 minutes and prints with the message (without it, it retries with
/// backoff for minutes); Bedrock's `ThrottlingException` (the AWS SDK reads the type from
/// `x-amzn-errortype`).
pub fn spent_reply(
    wire: WireProtocol,
    message: &str,
    retry_after_s: i64,
) -> (Vec<u8>, Vec<(&'static str, &'static str)>) {
    let (body, extra) = match wire {
        WireProtocol::AnthropicMessages => (
            serde_json::json!({"type": "error", "error": {"type": "rate_limit_error", "message": message}}),
            vec![],
        ),
        WireProtocol::OpenaiResponses => (
            serde_json::json!({"error": {"message": message, "type": "insufficient_quota",
                "param": null, "code": "insufficient_quota"}}),
            vec![],
        ),
        WireProtocol::Gemini => (
            serde_json::json!({"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED",
                "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                             "retryDelay": format!("{}s", retry_after_s.max(0))}]}}),
            vec![],
        ),
        WireProtocol::BedrockInvoke => (
            serde_json::json!({"message": message}),
            vec![("x-amzn-errortype", "ThrottlingException")],
        ),
    };
    (body.to_string().into_bytes(), extra)
}

/// A count spent under a budget whose `atLimit` routes rather than refuses: an entry of the
/// exhausted list halo-server pushes in every filter's configuration (`budgetsExhausted`),
/// which the filter reads before routing ([`rerouted`]). The budget check runs after the
/// route is chosen, so it cannot move a call; this list can.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Exhausted {
    pub budget: String,
    /// The count's subject: a [`subject_key`] or [`POOL`] (never the user).
    pub subject: String,
    /// The end of the period it is spent in (Unix ms): from then on the entry is void, so
    /// a list that stopped arriving cannot keep a caller on the cheaper route.
    pub until_ms: i64,
}

/// The alias a call for `alias` goes to instead, and the budget that sends it there: the
/// first of the caller's `applying` budgets (by name) that routes `alias` at its limit and
/// is in `exhausted` until after `now_ms`. `None`: the call keeps its alias.
pub fn rerouted<'a>(
    applying: &[Applying<'a>],
    exhausted: &[Exhausted],
    alias: &str,
    now_ms: i64,
) -> Option<(&'a str, &'a str)> {
    applying.iter().find_map(|a| {
        let AtLimit::RouteTo(routes) = &a.budget.at_limit else {
            return None;
        };
        let to = routes.get(alias)?;
        exhausted
            .iter()
            .any(|e| e.budget == a.key.budget && e.subject == a.key.subject && e.until_ms > now_ms)
            .then_some((a.name, to.as_str()))
    })
}

/// Whether a spent `budget` still lets a call for `alias` through: a `routeTo` budget
/// lets through the calls already on a route it sends callers to (the cheaper aliases);
/// every other call under a spent budget is refused, so a gateway that has not (yet) got
/// the exhausted list refuses rather than serving the expensive alias uncounted.
pub fn serves_at_limit(budget: &Budget, alias: &str) -> bool {
    match &budget.at_limit {
        AtLimit::Refuse => false,
        AtLimit::RouteTo(routes) => routes.values().any(|to| to == alias),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testkit::SnapBuilder;
    use crate::types::BudgetScope;

    fn budget(period: BudgetPeriod, zone: Option<&str>) -> Budget {
        Budget {
            applies_to: BudgetScope {
                groups: vec!["eng".into()],
                ..BudgetScope::default()
            },
            count: BudgetCount::PerUser,
            period,
            time_zone: zone.map(str::to_string),
            limit: BudgetLimit {
                usd: Some(50.0),
                tokens: None,
            },
            at_limit: AtLimit::Refuse,
        }
    }

    fn ms(rfc3339: &str) -> i64 {
        rfc3339
            .parse::<jiff::Timestamp>()
            .expect("a timestamp")
            .as_millisecond()
    }

    #[test]
    fn a_day_starts_at_local_midnight_and_resets_at_the_next() {
        let b = budget(BudgetPeriod::Day, Some("Europe/Berlin"));
        let p = period(&b, ms("2026-12-02T23:30:00Z")).expect("period");
        // 00:30 on the 3rd in Berlin: the 3rd's period.
        assert_eq!(p.start_ms, ms("2026-12-02T23:00:00Z"));
        assert_eq!(p.end_ms, ms("2026-12-03T23:00:00Z"));
        assert_eq!(p.resets_at, "2026-12-04T00:00:00+01:00");
        let utc =
            period(&budget(BudgetPeriod::Day, None), ms("2026-12-02T23:30:00Z")).expect("period");
        assert_eq!(utc.start_ms, ms("2026-12-02T00:00:00Z"));
        assert_eq!(utc.resets_at, "2026-12-03T00:00:00+00:00");
    }

    #[test]
    fn weeks_start_on_monday_and_months_on_the_first_across_dst() {
        // Wednesday 2026-12-02: the week of Monday 2026-11-30.
        let w = period(
            &budget(BudgetPeriod::Week, None),
            ms("2026-12-02T12:00:00Z"),
        )
        .expect("period");
        assert_eq!(w.start_ms, ms("2026-11-30T00:00:00Z"));
        assert_eq!(w.end_ms, ms("2026-12-07T00:00:00Z"));
        // March 2026 in Berlin: starts at +01:00, ends at +02:00 (DST from the 29th).
        let m = period(
            &budget(BudgetPeriod::Month, Some("Europe/Berlin")),
            ms("2026-03-15T12:00:00Z"),
        )
        .expect("period");
        assert_eq!(m.start_ms, ms("2026-02-28T23:00:00Z"));
        assert_eq!(m.end_ms, ms("2026-03-31T22:00:00Z"));
        assert_eq!(m.resets_at, "2026-04-01T00:00:00+02:00");
    }

    #[test]
    fn an_exhausted_route_to_budget_moves_the_alias_it_names_until_its_period_ends() {
        let mut snap = SnapBuilder::new().build();
        let mut b = budget(BudgetPeriod::Day, None);
        b.at_limit = AtLimit::RouteTo([("opus".to_string(), "sonnet".to_string())].into());
        snap.budgets.insert("eng-daily".into(), b);
        snap.budgets
            .insert("eng-refuse".into(), budget(BudgetPeriod::Day, None));
        let alice = Subject::new("alice@x", &["eng"]);
        let got = applying(&snap, &alice, "general");
        let key = subject_key("eng-daily", "alice@x");
        let list = vec![Exhausted {
            budget: "eng-daily".into(),
            subject: key.clone(),
            until_ms: 1_000,
        }];
        assert_eq!(
            rerouted(&got, &list, "opus", 999),
            Some(("eng-daily", "sonnet"))
        );
        // Another alias, the period over, another user's entry: the alias stays.
        assert_eq!(rerouted(&got, &list, "haiku", 999), None);
        assert_eq!(rerouted(&got, &list, "opus", 1_000), None);
        let bob = Subject::new("bob@x", &["eng"]);
        assert_eq!(
            rerouted(&applying(&snap, &bob, "general"), &list, "opus", 999),
            None
        );
        // An exhausted list naming a refusing budget moves nothing.
        let refuse = vec![Exhausted {
            budget: "eng-refuse".into(),
            subject: subject_key("eng-refuse", "alice@x"),
            until_ms: 1_000,
        }];
        assert_eq!(rerouted(&got, &refuse, "opus", 999), None);
        // Spent, the budget still serves the cheaper alias and refuses the rest.
        let route = &snap.budgets["eng-daily"];
        assert!(serves_at_limit(route, "sonnet"));
        assert!(!serves_at_limit(route, "opus"));
        assert!(!serves_at_limit(route, "haiku"));
        assert!(!serves_at_limit(&snap.budgets["eng-refuse"], "sonnet"));
        let text = serde_json::to_string(&list).expect("json");
        assert_eq!(
            text,
            format!(r#"[{{"budget":"eng-daily","subject":"{key}","untilMs":1000}}]"#)
        );
        assert!(
            serde_json::from_str::<Vec<Exhausted>>(
                r#"[{"budget":"b","subject":"s","untilMs":1,"user":"x"}]"#
            )
            .is_err()
        );
    }

    #[test]
    fn an_unknown_zone_is_an_error_naming_it() {
        let b = budget(BudgetPeriod::Day, Some("Mars/Olympus"));
        assert_eq!(
            period(&b, 0),
            Err(PeriodError::UnknownZone("Mars/Olympus".into()))
        );
    }

    #[test]
    fn the_budgets_that_apply_are_those_naming_the_user_a_group_or_the_ring() {
        let mut snap = SnapBuilder::new().build();
        let mut by_group = budget(BudgetPeriod::Day, None);
        by_group.applies_to = BudgetScope {
            groups: vec!["eng".into()],
            ..BudgetScope::default()
        };
        let mut by_ring = budget(BudgetPeriod::Month, None);
        by_ring.applies_to = BudgetScope {
            rings: vec!["general".into()],
            ..BudgetScope::default()
        };
        by_ring.count = BudgetCount::Pooled;
        let mut by_user = budget(BudgetPeriod::Week, None);
        by_user.applies_to = BudgetScope {
            users: vec!["bob@x".into()],
            ..BudgetScope::default()
        };
        snap.budgets.insert("eng-daily".into(), by_group);
        snap.budgets.insert("general-monthly".into(), by_ring);
        snap.budgets.insert("bob-weekly".into(), by_user);

        let alice = Subject::new("alice@x", &["eng"]);
        let got = applying(&snap, &alice, "general");
        let names: Vec<&str> = got.iter().map(|a| a.name).collect();
        assert_eq!(names, ["eng-daily", "general-monthly"]);
        assert_eq!(got[0].key.subject, subject_key("eng-daily", "alice@x"));
        assert_eq!(got[1].key.subject, POOL);
        assert!(!got[0].key.subject.contains("alice"));
        // Per budget salt: the same user has another key under another budget.
        assert_ne!(
            subject_key("eng-daily", "alice@x"),
            subject_key("bob-weekly", "alice@x")
        );

        let bob = Subject::new("bob@x", &[]);
        let names: Vec<&str> = applying(&snap, &bob, "canary")
            .iter()
            .map(|a| a.name)
            .collect();
        assert_eq!(names, ["bob-weekly"]);

        let keys: Vec<BudgetKey> = got.into_iter().map(|a| a.key).collect();
        let text = encode_keys(&keys);
        assert_eq!(decode_keys(&text), Ok(keys));
        assert!(decode_keys("eng-daily").is_err());
        assert_eq!(decode_keys(""), Ok(vec![]));
    }

    #[test]
    fn either_amount_spends_the_budget() {
        let limit = BudgetLimit {
            usd: Some(1.5),
            tokens: Some(1000),
        };
        let spent = |tokens, micro_usd| is_spent(&limit, Spent { tokens, micro_usd });
        assert!(!spent(999, 1_499_999));
        assert!(spent(1000, 0));
        assert!(spent(0, 1_500_000));
        assert_eq!(micro_usd(0.0123), 12_300);
        assert_eq!(micro_usd(f64::NAN), 0);
        assert_eq!(describe_limit(&limit), "USD 1.5 or 1000 tokens");
    }

    #[test]
    fn the_refusal_has_each_wires_own_shape_and_names_the_budget() {
        let b = budget(BudgetPeriod::Day, Some("Europe/Berlin"));
        let p = period(&b, ms("2026-12-02T12:00:00Z")).expect("period");
        let msg = spent_message("eng-daily", &b, &p);
        assert_eq!(
            msg,
            "halo budget eng-daily (USD 50 per day, Europe/Berlin) is spent; it resets at 2026-12-03T00:00:00+01:00"
        );
        let json = |w| {
            let (body, _) = spent_reply(w, &msg, 3600);
            serde_json::from_slice::<serde_json::Value>(&body).expect("json")
        };
        let a = json(WireProtocol::AnthropicMessages);
        assert_eq!(a["type"], "error");
        assert_eq!(a["error"]["type"], "rate_limit_error");
        assert_eq!(a["error"]["message"], msg.as_str());
        let o = json(WireProtocol::OpenaiResponses);
        assert_eq!(o["error"]["code"], "insufficient_quota");
        assert_eq!(o["error"]["message"], msg.as_str());
        let g = json(WireProtocol::Gemini);
        assert_eq!(g["error"]["status"], "RESOURCE_EXHAUSTED");
        assert_eq!(g["error"]["code"], 429);
        assert_eq!(
            g["error"]["details"][0]["@type"],
            "type.googleapis.com/google.rpc.RetryInfo"
        );
        assert_eq!(g["error"]["details"][0]["retryDelay"], "3600s");
        let (_, extra) = spent_reply(WireProtocol::BedrockInvoke, &msg, 3600);
        assert_eq!(extra, [("x-amzn-errortype", "ThrottlingException")]);
    }
}
