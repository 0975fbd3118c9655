//! The evidence store's two figures in BENCHMARKS.md, for each backend:
//!
//! 1. **Ingest on one core**: what a receiver does per batch, on this one thread:
//!    decode the OTLP protobuf, convert it ([`otlp::records`]) and append it in one
//!    transaction ([`Store::append`]). 500-record batches; records per second.
//! 2. **The samples query over 10 million rows**: a table of `HALO_BENCH_ROWS` rows
//!    (default 10,000,000; 10 experiments over the last 24 h, 100,000 units each) loaded
//!    by the database itself (SQLite's recursive CTE, PostgreSQL's generate_series: the
//!    load is not what is measured) with the store's indexes dropped during the load and
//!    created again after it (the store's own definitions, read back from the catalog:
//!    ten million inserts into two B-trees each did not finish within 25 minutes on a
//!    loaded machine), then [`Store::samples`] for one experiment's day (1 million rows)
//!    per metric: median of 5 runs.
//!
//! PostgreSQL is halo-testkit's (Debian's server on loopback, `fsync=off`: its ingest
//! figure is an upper bound for a durable server); SQLite is a file in a temp dir with the
//! store's own settings (WAL, synchronous=FULL).

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use halo_evidence::postgres::PgStore;
use halo_evidence::sqlite::SqliteStore;
use halo_evidence::{Metric, Record, SampleQuery, Source, Store, otlp};
use prost::Message as _;

const BATCH: usize = 500;
const BATCHES: usize = 200;
const DAY_MS: i64 = 86_400_000;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Encoded export requests, as a gateway sends them.
fn batches() -> Vec<Vec<u8>> {
    let now = now_ms();
    (0..BATCHES)
        .map(|b| {
            let records: Vec<Record> = (0..BATCH)
                .map(|i| {
                    let n = b * BATCH + i;
                    Record {
                        time_unix_ms: now - (n as i64 % 60_000),
                        ring: "early".into(),
                        experiment: "bench".into(),
                        variant: if n.is_multiple_of(2) {
                            "control"
                        } else {
                            "treatment"
                        }
                        .into(),
                        alias: "sonnet".into(),
                        upstream: "anthropic-direct".into(),
                        model: "claude-sonnet-4-5-20250929".into(),
                        target: "t0".into(),
                        attempts: 1,
                        status: if n.is_multiple_of(50) { 503 } else { 200 },
                        ttfb_ms: Some(100.0 + (n % 300) as f64),
                        duration_ms: Some(800.0 + (n % 1000) as f64),
                        input_tokens: Some(1200),
                        output_tokens: Some(300),
                        cost_usd: Some(0.0081),
                        complete: true,
                        unit: format!("{:016x}", n % 10_000),
                        ..Record::default()
                    }
                })
                .collect();
            otlp::request(&records).encode_to_vec()
        })
        .collect()
}

fn ingest(name: &str, store: &dyn Store, batches: &[Vec<u8>]) {
    let start = Instant::now();
    for body in batches {
        let request =
            opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest::decode(
                body.as_slice(),
            )
            .expect("decode");
        let (records, _) = otlp::records(&request, Source::Gateway, now_ms()).expect("records");
        store.append(&records).expect("append");
    }
    let took = start.elapsed();
    let n = (BATCH * BATCHES) as f64;
    println!(
        "{name}: ingest {} records in {BATCH}-record batches on one thread: {:.0} records/s ({:.2} ms per batch)",
        BATCH * BATCHES,
        n / took.as_secs_f64(),
        took.as_secs_f64() * 1000.0 / BATCHES as f64
    );
}

fn query(name: &str, store: &dyn Store, rows: u64) {
    let now = now_ms();
    for metric in [Metric::ErrorRate, Metric::TtfbP95, Metric::Cost] {
        let q = SampleQuery {
            experiment: "exp3".into(),
            metric,
            since_unix_ms: now - DAY_MS - 60_000,
            until_unix_ms: now + 1,
        };
        let mut times: Vec<Duration> = Vec::new();
        let mut samples = 0;
        for _ in 0..5 {
            let start = Instant::now();
            samples = store.samples(&q).expect("samples").len();
            times.push(start.elapsed());
        }
        times.sort();
        println!(
            "{name}: samples({}, 24h) over {rows} rows ({} in the experiment's day): {samples} samples, median {:.0} ms (min {:.0}, max {:.0})",
            metric.as_str(),
            rows / 10,
            times[2].as_secs_f64() * 1000.0,
            times[0].as_secs_f64() * 1000.0,
            times[4].as_secs_f64() * 1000.0,
        );
    }
}

/// The generated columns, in the store's column order after `time_ms`; `{i}` is the row
/// number, `{hex}` the unit's 16 hex digits. Every tenth row is the same experiment.
const COLUMNS: &str = "INSERT INTO evidence (time_ms, source, ring, release, experiment, \
    variant, alias, upstream, model, target, attempts, status, ttfb_ms, duration_ms, \
    input_tokens, output_tokens, cache_write_tokens, cache_read_tokens, cost_usd, complete, unit)";

fn main() {
    let rows: u64 = std::env::var("HALO_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let batches = batches();
    let now = now_ms();
    // Row i: experiment exp{i % 10}; unit (i / 10) % 100000, whose parity is its variant;
    // time spread over the last day; 2% errors.
    let select = |hex: &str, bool_true: &str| {
        format!(
            "{now} - (i * 7919 % {DAY_MS}), 'gateway', 'early', '', 'exp' || (i % 10), \
             CASE WHEN (i / 10) % 2 = 0 THEN 'control' ELSE 'treatment' END, 'sonnet', \
             'anthropic-direct', 'claude-sonnet-4-5-20250929', 't0', 1, \
             CASE WHEN i % 50 = 0 THEN 503 ELSE 200 END, 100 + (i % 300), 800 + (i % 1000), \
             1200, 300, NULL, NULL, 0.0081, {bool_true}, {hex}"
        )
    };

    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = SqliteStore::open(&dir.path().join("evidence.db")).expect("sqlite");
    ingest("sqlite", &sqlite, &batches);
    let sqlite = SqliteStore::open(&dir.path().join("load.db")).expect("sqlite");
    let start = Instant::now();
    let sql = format!(
        "{COLUMNS} WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < {}) \
         SELECT {} FROM s",
        rows - 1,
        select("printf('%016x', (i / 10) % 100000)", "1")
    );
    let indexed = sqlite
        .with_writer(|c| {
            // The store's index definitions as it created them, to create again after.
            let indexes: Vec<(String, String)> = c
                .prepare(
                    "SELECT name, sql FROM sqlite_master \
                     WHERE type = 'index' AND tbl_name = 'evidence' AND sql IS NOT NULL",
                )?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            for (name, _) in &indexes {
                c.execute_batch(&format!("DROP INDEX {name}"))?;
            }
            c.execute_batch("PRAGMA cache_size = -262144")?;
            c.execute_batch(&sql)?;
            let loaded = start.elapsed();
            for (_, create) in &indexes {
                c.execute_batch(create)?;
            }
            c.execute_batch("ANALYZE")?;
            Ok((loaded, indexes.len()))
        })
        .expect("sqlite load");
    println!(
        "sqlite: loaded {rows} rows in {:.0} s, then {} indexes and ANALYZE in {:.0} s",
        indexed.0.as_secs_f64(),
        indexed.1,
        (start.elapsed() - indexed.0).as_secs_f64()
    );
    query("sqlite", &sqlite, rows);
    drop(sqlite);

    let pg = PgStore::connect(&halo_testkit::postgres::database()).expect("postgres");
    ingest("postgres", &pg, &batches);
    let pg = PgStore::connect(&halo_testkit::postgres::database()).expect("postgres");
    let start = Instant::now();
    let sql = format!(
        "{COLUMNS} SELECT {} FROM generate_series(0::bigint, {}::bigint) AS i",
        select("lpad(to_hex((i / 10) % 100000), 16, '0')", "true"),
        rows - 1
    );
    let indexed = pg
        .with_writer(|c| {
            let indexes: Vec<(String, String)> = c
                .query(
                    "SELECT indexname, indexdef FROM pg_indexes \
                     WHERE tablename = 'evidence' AND indexdef NOT LIKE 'CREATE UNIQUE%'",
                    &[],
                )?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            for (name, _) in &indexes {
                c.batch_execute(&format!("DROP INDEX {name}"))?;
            }
            c.batch_execute(&sql)?;
            let loaded = start.elapsed();
            c.batch_execute("SET maintenance_work_mem = '256MB'")?;
            for (_, create) in &indexes {
                c.batch_execute(create)?;
            }
            c.batch_execute("ANALYZE evidence")?;
            Ok((loaded, indexes.len()))
        })
        .expect("postgres load");
    println!(
        "postgres: loaded {rows} rows in {:.0} s, then {} indexes and ANALYZE in {:.0} s",
        indexed.0.as_secs_f64(),
        indexed.1,
        (start.elapsed() - indexed.0).as_secs_f64()
    );
    query("postgres", &pg, rows);
}
