//! One suite, both backends: every test body takes a `&dyn Store` and runs against the
//! embedded SQLite store and a real PostgreSQL (testkit, a database per test).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use halo_evidence::postgres::PgStore;
use halo_evidence::sqlite::SqliteStore;
use halo_evidence::{
    Backend, CountKey, Counted, Metric, Record, Sample, SampleQuery, Source, Spend, Stamped, Store,
};

fn both(body: impl Fn(&dyn Backend)) {
    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = SqliteStore::open(&dir.path().join("evidence.db")).expect("open sqlite");
    body(&sqlite);
    let pg = PgStore::connect(&halo_testkit::postgres::database()).expect("connect postgres");
    body(&pg);
}

fn unit(n: u32) -> String {
    format!("{n:016x}")
}

fn rec(variant: &str, unit_n: u32, time: i64) -> Record {
    Record {
        time_unix_ms: time,
        ring: "early".into(),
        experiment: "exp".into(),
        variant: variant.into(),
        alias: "sonnet".into(),
        upstream: "anthropic".into(),
        model: "claude-sonnet-4-5".into(),
        target: "t".into(),
        attempts: 1,
        status: 200,
        ttfb_ms: Some(100.0),
        duration_ms: Some(1000.0),
        input_tokens: Some(10),
        output_tokens: Some(5),
        cache_write_tokens: None,
        cache_read_tokens: Some(100),
        cost_usd: Some(0.01),
        complete: true,
        unit: unit(unit_n),
        ..Record::default()
    }
}

fn gw(record: Record) -> Stamped {
    Stamped {
        source: Source::Gateway,
        record,
    }
}

fn query(metric: Metric) -> SampleQuery {
    SampleQuery {
        experiment: "exp".into(),
        metric,
        since_unix_ms: 1_000,
        until_unix_ms: 2_000,
    }
}

fn values(samples: &[Sample]) -> Vec<(String, String, f64, Source)> {
    samples
        .iter()
        .map(|s| (s.variant.clone(), s.unit.clone(), s.value, s.source))
        .collect()
}

#[test]
fn samples_per_variant_and_unit_for_every_metric() {
    both(|store| {
        let mut batch = Vec::new();
        // control/unit 1: three calls, one a 503 and one a 429.
        for (i, status, ttfb, dur) in [
            (0, 200, 100.0, 1000.0),
            (1, 503, 200.0, 2000.0),
            (2, 429, 400.0, 4000.0),
        ] {
            let mut r = rec("control", 1, 1_000 + i);
            r.status = status;
            r.ttfb_ms = Some(ttfb);
            r.duration_ms = Some(dur);
            batch.push(gw(r));
        }
        // treatment/unit 2: one call without ttfb (reset before headers: status 0).
        let mut r = rec("treatment", 2, 1_500);
        r.status = 0;
        r.ttfb_ms = None;
        batch.push(gw(r));
        // treatment/unit 3, cli-sourced: a separate sample.
        batch.push(Stamped {
            source: Source::Cli,
            record: rec("treatment", 3, 1_600),
        });
        // Outside the window, and another experiment: not counted.
        batch.push(gw(rec("control", 1, 999)));
        batch.push(gw(rec("control", 1, 2_000)));
        let mut other = rec("control", 1, 1_500);
        other.experiment = "other".into();
        batch.push(gw(other));
        assert_eq!(store.append(&batch).expect("append"), 8);
        assert_eq!(store.count().expect("count"), 8);

        let g = Source::Gateway;
        let c = Source::Cli;
        let u = unit;
        let err = store
            .samples(&query(Metric::ErrorRate))
            .expect("error rate");
        assert_eq!(
            values(&err),
            vec![
                ("control".into(), u(1), 2.0 / 3.0, g),
                ("treatment".into(), u(2), 1.0, g),
                ("treatment".into(), u(3), 0.0, c),
            ]
        );
        let p50 = store.samples(&query(Metric::TtfbP50)).expect("p50");
        assert_eq!(
            values(&p50),
            vec![
                ("control".into(), u(1), 200.0, g),
                ("treatment".into(), u(3), 100.0, c),
            ],
            "a unit with no ttfb has no ttfb sample"
        );
        let p95 = store.samples(&query(Metric::DurationP95)).expect("p95");
        assert!(
            (p95[0].value - 3800.0).abs() < 1e-9,
            "percentile_cont of 1000, 2000, 4000: {}",
            p95[0].value
        );
        let tokens = store.samples(&query(Metric::Tokens)).expect("tokens");
        assert_eq!(tokens[0].value, 3.0 * 115.0);
        let cost = store.samples(&query(Metric::Cost)).expect("cost");
        assert!((cost[0].value - 0.03).abs() < 1e-12);
    });
}

#[test]
fn unknown_cost_is_not_zero() {
    both(|store| {
        let mut unknown = rec("control", 1, 1_100);
        unknown.cost_usd = None;
        store
            .append(&[
                gw(rec("control", 1, 1_000)),
                gw(unknown),
                gw(rec("control", 2, 1_000)),
            ])
            .expect("append");
        let cost = store.samples(&query(Metric::Cost)).expect("cost");
        assert_eq!(
            values(&cost),
            vec![("control".into(), unit(2), 0.01, Source::Gateway)],
            "unit 1 has a call of unknown cost: no cost sample"
        );
    });
}

#[test]
fn retention_prunes_old_records_only() {
    both(|store| {
        store
            .append(&[
                gw(rec("a", 1, 10)),
                gw(rec("a", 1, 20)),
                gw(rec("a", 1, 30)),
            ])
            .expect("append");
        assert_eq!(store.prune(20).expect("prune"), 1);
        assert_eq!(store.count().expect("count"), 2);
    });
}

#[test]
fn an_empty_batch_and_an_empty_window() {
    both(|store| {
        assert_eq!(store.append(&[]).expect("append"), 0);
        for metric in Metric::ALL {
            assert!(store.samples(&query(metric)).expect("samples").is_empty());
        }
    });
}

#[test]
fn values_survive_exactly() {
    both(|store| {
        let mut r = rec("v", 7, 1_234);
        r.release = "sha256:0123".into();
        r.input_tokens = Some(i64::MAX as u64);
        r.output_tokens = None;
        r.cost_usd = Some(0.000_001_5);
        store.append(&[gw(r)]).expect("append");
        let tokens = store.samples(&query(Metric::Tokens)).expect("tokens");
        assert_eq!(tokens.len(), 1);
        assert!(tokens[0].value >= 9.2e18);
        let cost = store.samples(&query(Metric::Cost)).expect("cost");
        assert_eq!(cost[0].value, 0.000_001_5);
    });
}

#[test]
fn reopening_migrates_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("evidence.db");
    {
        let s = SqliteStore::open(&path).expect("open");
        s.append(&[gw(rec("a", 1, 1_000))]).expect("append");
    }
    let s = SqliteStore::open(&path).expect("reopen");
    assert_eq!(s.count().expect("count"), 1);
    let db = halo_testkit::postgres::database();
    PgStore::connect(&db)
        .expect("connect")
        .append(&[gw(rec("a", 1, 1_000))])
        .expect("append");
    assert_eq!(
        PgStore::connect(&db)
            .expect("again")
            .count()
            .expect("count"),
        1
    );
}

fn key(budget: &str, subject: &str, period: i64) -> CountKey {
    CountKey {
        budget: budget.into(),
        subject: subject.into(),
        period_start_ms: period,
    }
}

fn spend(budget: &str, subject: &str, period: i64, tokens: u64, micro_usd: u64) -> Spend {
    Spend {
        budget: budget.into(),
        subject: subject.into(),
        period_start_ms: period,
        tokens,
        micro_usd,
    }
}

#[test]
fn budget_counts_add_up_per_budget_subject_and_period() {
    both(|store| {
        let unknown = store
            .counted(&[key("eng", "a", 1_000)])
            .expect("an absent count");
        assert_eq!(unknown, [Counted::default()]);
        store
            .add_spend(
                &[
                    spend("eng", "a", 1_000, 100, 2_000),
                    spend("eng", "b", 1_000, 7, 1),
                    spend("org", "pool", 1_000, 100, 2_000),
                ],
                1_500,
            )
            .expect("add");
        store
            .add_spend(&[spend("eng", "a", 1_000, 50, 500)], 1_600)
            .expect("add again");
        // A new period starts from zero.
        store
            .add_spend(&[spend("eng", "a", 2_000, 1, 1)], 2_100)
            .expect("next period");
        let got = store
            .counted(&[
                key("eng", "a", 1_000),
                key("eng", "b", 1_000),
                key("org", "pool", 1_000),
                key("eng", "a", 2_000),
            ])
            .expect("counted");
        let c = |tokens, micro_usd| Counted { tokens, micro_usd };
        assert_eq!(got, [c(150, 2_500), c(7, 1), c(100, 2_000), c(1, 1)]);
        assert_eq!(store.prune_counts(2_000).expect("prune"), 3);
        let got = store
            .counted(&[key("eng", "a", 1_000), key("eng", "a", 2_000)])
            .expect("counted");
        assert_eq!(got, [c(0, 0), c(1, 1)]);
    });
}

#[test]
fn concurrent_spends_all_land() {
    both(|store| {
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..25 {
                        store
                            .add_spend(&[spend("eng", "a", 0, 1, 10)], 1)
                            .expect("add");
                    }
                });
            }
        });
        let got = store.counted(&[key("eng", "a", 0)]).expect("counted");
        assert_eq!(
            got,
            [Counted {
                tokens: 200,
                micro_usd: 2_000
            }]
        );
    });
}
