//! The PostgreSQL store, for evidence at scale or shared by several halo-server replicas.
//! rust-postgres's synchronous client (its own small runtime; callers run it on a
//! blocking thread). Every value is a bound parameter: a batch is one
//! `INSERT ... SELECT FROM UNNEST($1, ..., $21)` of typed arrays, one round trip and one
//! transaction. Migrations are versioned in `halo_schema_version`, applied under an
//! advisory lock so replicas starting together migrate once.

use std::sync::{Mutex, MutexGuard};

use postgres::{Client, NoTls};

use crate::{
    BudgetStore, CountKey, Counted, Sample, SampleQuery, Source, Spend, Stamped, Store, StoreError,
    aggregate, sort_samples,
};

/// Versioned migrations: `MIGRATIONS[i]` takes the schema from version i to i + 1.
const MIGRATIONS: &[&str] = &[
    "
CREATE TABLE evidence (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    time_ms BIGINT NOT NULL,
    source TEXT NOT NULL,
    ring TEXT NOT NULL,
    release TEXT NOT NULL,
    experiment TEXT NOT NULL,
    variant TEXT NOT NULL,
    alias TEXT NOT NULL,
    upstream TEXT NOT NULL,
    model TEXT NOT NULL,
    target TEXT NOT NULL,
    attempts BIGINT NOT NULL,
    status INTEGER NOT NULL,
    ttfb_ms DOUBLE PRECISION,
    duration_ms DOUBLE PRECISION,
    input_tokens BIGINT,
    output_tokens BIGINT,
    cache_write_tokens BIGINT,
    cache_read_tokens BIGINT,
    cost_usd DOUBLE PRECISION,
    complete BOOLEAN NOT NULL,
    unit TEXT NOT NULL
);
CREATE INDEX evidence_experiment_time ON evidence (experiment, time_ms);
CREATE INDEX evidence_time ON evidence (time_ms);
",
    crate::BUDGET_COUNTS_SCHEMA,
];

/// An arbitrary constant naming the migration lock.
const MIGRATION_LOCK: i64 = 0x4841_4c4f_4556; // "HALOEV"

const INSERT: &str = "INSERT INTO evidence (time_ms, source, ring, release, experiment, \
    variant, alias, upstream, model, target, attempts, status, ttfb_ms, duration_ms, \
    input_tokens, output_tokens, cache_write_tokens, cache_read_tokens, cost_usd, complete, unit) \
    SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], \
    $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::bigint[], $12::int[], \
    $13::float8[], $14::float8[], $15::bigint[], $16::bigint[], $17::bigint[], $18::bigint[], \
    $19::float8[], $20::bool[], $21::text[])";

/// The PostgreSQL evidence store.
pub struct PgStore {
    // `None` only once dropped (see the Drop impl).
    writer: Mutex<Option<Client>>,
    reader: Mutex<Option<Client>>,
}

impl PgStore {
    /// Connect (`params`: a libpq key=value string or URL) and migrate.
    pub fn connect(params: &str) -> Result<PgStore, StoreError> {
        let mut writer = Client::connect(params, NoTls)?;
        migrate(&mut writer)?;
        let reader = Client::connect(params, NoTls)?;
        Ok(PgStore {
            writer: Mutex::new(Some(writer)),
            reader: Mutex::new(Some(reader)),
        })
    }

    /// The writer connection, for bulk loading (COPY) in benchmarks.
    pub fn with_writer<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, StoreError> {
        Ok(f(open(&mut lock(&self.writer)?)?)?)
    }
}

impl Drop for PgStore {
    /// rust-postgres closes a connection by blocking on its own runtime, which panics on
    /// a thread that drives an async runtime (halo-server drops its store on one): the
    /// clients are closed on a plain thread of their own.
    fn drop(&mut self) {
        let clients = [
            std::mem::replace(&mut self.writer, Mutex::new(None)),
            std::mem::replace(&mut self.reader, Mutex::new(None)),
        ];
        let _ = std::thread::Builder::new()
            .name("pg-close".into())
            .spawn(move || drop(clients));
    }
}

fn lock(m: &Mutex<Option<Client>>) -> Result<MutexGuard<'_, Option<Client>>, StoreError> {
    m.lock()
        .map_err(|_| StoreError::Poisoned("a postgres connection's lock"))
}

fn open<'a>(guard: &'a mut MutexGuard<'_, Option<Client>>) -> Result<&'a mut Client, StoreError> {
    guard
        .as_mut()
        .ok_or(StoreError::Poisoned("a closed postgres connection"))
}

fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS halo_schema_version (version BIGINT NOT NULL)")?;
    let version: i64 = tx
        .query_opt("SELECT version FROM halo_schema_version", &[])?
        .map(|row| row.get(0))
        .unwrap_or(0);
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(StoreError::SchemaTooNew {
            found: version,
            known,
        });
    }
    for sql in &MIGRATIONS[version as usize..] {
        tx.batch_execute(sql)?;
    }
    tx.execute("DELETE FROM halo_schema_version", &[])?;
    tx.execute(
        "INSERT INTO halo_schema_version (version) VALUES ($1)",
        &[&known],
    )?;
    tx.commit()?;
    Ok(())
}

fn int(v: Option<u64>) -> Option<i64> {
    v.map(|n| i64::try_from(n).unwrap_or(i64::MAX))
}

impl Store for PgStore {
    fn append(&self, batch: &[Stamped]) -> Result<usize, StoreError> {
        if batch.is_empty() {
            return Ok(0);
        }
        macro_rules! col {
            ($f:expr) => {
                batch.iter().map($f).collect::<Vec<_>>()
            };
        }
        let time = col!(|s| s.record.time_unix_ms);
        let source = col!(|s| s.source.as_str());
        let ring = col!(|s| s.record.ring.as_str());
        let release = col!(|s| s.record.release.as_str());
        let experiment = col!(|s| s.record.experiment.as_str());
        let variant = col!(|s| s.record.variant.as_str());
        let alias = col!(|s| s.record.alias.as_str());
        let upstream = col!(|s| s.record.upstream.as_str());
        let model = col!(|s| s.record.model.as_str());
        let target = col!(|s| s.record.target.as_str());
        let attempts = col!(|s| i64::from(s.record.attempts));
        let status = col!(|s| i32::from(s.record.status));
        let ttfb = col!(|s| s.record.ttfb_ms);
        let duration = col!(|s| s.record.duration_ms);
        let input = col!(|s| int(s.record.input_tokens));
        let output = col!(|s| int(s.record.output_tokens));
        let cache_write = col!(|s| int(s.record.cache_write_tokens));
        let cache_read = col!(|s| int(s.record.cache_read_tokens));
        let cost = col!(|s| s.record.cost_usd);
        let complete = col!(|s| s.record.complete);
        let unit = col!(|s| s.record.unit.as_str());
        let mut guard = lock(&self.writer)?;
        let client = open(&mut guard)?;
        let mut tx = client.transaction()?;
        let n = tx.execute(
            INSERT,
            &[
                &time,
                &source,
                &ring,
                &release,
                &experiment,
                &variant,
                &alias,
                &upstream,
                &model,
                &target,
                &attempts,
                &status,
                &ttfb,
                &duration,
                &input,
                &output,
                &cache_write,
                &cache_read,
                &cost,
                &complete,
                &unit,
            ],
        )?;
        tx.commit()?;
        Ok(n as usize)
    }

    fn samples(&self, q: &SampleQuery) -> Result<Vec<Sample>, StoreError> {
        let mut guard = lock(&self.reader)?;
        let client = open(&mut guard)?;
        let window = "experiment = $1 AND time_ms >= $2 AND time_ms < $3";
        let rows = if let Some((column, fraction)) = q.metric.percentile() {
            let sql = format!(
                "SELECT variant, unit, source, \
                 percentile_cont($4::float8) WITHIN GROUP (ORDER BY {column}) \
                 FROM evidence WHERE {window} AND {column} IS NOT NULL \
                 GROUP BY variant, unit, source"
            );
            client.query(
                &sql,
                &[&q.experiment, &q.since_unix_ms, &q.until_unix_ms, &fraction],
            )?
        } else if let Some((value, having)) = aggregate(q.metric) {
            let sql = format!(
                "SELECT variant, unit, source, {value} FROM evidence WHERE {window} \
                 GROUP BY variant, unit, source {having}"
            );
            client.query(&sql, &[&q.experiment, &q.since_unix_ms, &q.until_unix_ms])?
        } else {
            Vec::new()
        };
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let source: &str = row.try_get(2)?;
            let value: Option<f64> = row.try_get(3)?;
            if let (Ok(source), Some(value)) = (source.parse::<Source>(), value) {
                out.push(Sample {
                    variant: row.try_get(0)?,
                    unit: row.try_get(1)?,
                    value,
                    source,
                });
            }
        }
        sort_samples(&mut out);
        Ok(out)
    }

    fn prune(&self, before_unix_ms: i64) -> Result<u64, StoreError> {
        let mut guard = lock(&self.writer)?;
        let client = open(&mut guard)?;
        Ok(client.execute(
            "DELETE FROM evidence WHERE time_ms < $1",
            &[&before_unix_ms],
        )?)
    }

    fn count(&self) -> Result<u64, StoreError> {
        let mut guard = lock(&self.reader)?;
        let client = open(&mut guard)?;
        let n: i64 = client
            .query_one("SELECT COUNT(*) FROM evidence", &[])?
            .get(0);
        Ok(n as u64)
    }
}

impl BudgetStore for PgStore {
    fn add_spend(&self, spends: &[Spend], now_unix_ms: i64) -> Result<(), StoreError> {
        let mut guard = lock(&self.writer)?;
        let client = open(&mut guard)?;
        let mut tx = client.transaction()?;
        let stmt = tx.prepare(crate::UPSERT_COUNT)?;
        for s in spends {
            tx.execute(
                &stmt,
                &[
                    &s.budget,
                    &s.subject,
                    &s.period_start_ms,
                    &int(Some(s.tokens)),
                    &int(Some(s.micro_usd)),
                    &now_unix_ms,
                ],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    fn counted(&self, keys: &[CountKey]) -> Result<Vec<Counted>, StoreError> {
        let mut guard = lock(&self.reader)?;
        let client = open(&mut guard)?;
        let stmt = client.prepare(
            "SELECT tokens, micro_usd FROM budget_counts \
             WHERE budget = $1 AND subject = $2 AND period_start_ms = $3",
        )?;
        keys.iter()
            .map(|k| {
                let row = client.query_opt(&stmt, &[&k.budget, &k.subject, &k.period_start_ms])?;
                Ok(row.map_or(Counted::default(), |r| Counted {
                    tokens: r.get::<_, i64>(0).max(0) as u64,
                    micro_usd: r.get::<_, i64>(1).max(0) as u64,
                }))
            })
            .collect()
    }

    fn prune_counts(&self, before_unix_ms: i64) -> Result<u64, StoreError> {
        let mut guard = lock(&self.writer)?;
        let client = open(&mut guard)?;
        Ok(client.execute(
            "DELETE FROM budget_counts WHERE period_start_ms < $1",
            &[&before_unix_ms],
        )?)
    }
}
