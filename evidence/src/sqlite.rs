//! The embedded store: SQLite, compiled into the binary (rusqlite's `bundled`), one file in
//! halo-server's data dir. Chosen over a pure-Rust engine because SQLite's WAL journal is
//! the most exercised crash-safe format there is: a `kill -9` mid-write leaves the last
//! committed transaction and a readable file (tested with the real binary), and its SQL
//! keeps the samples query the same shape as PostgreSQL's.
//!
//! Journal WAL with `synchronous=FULL`: a batch acknowledged to a sender is on disk.
//! One writer connection and one reader connection (WAL lets the query run while a batch
//! commits), each behind a mutex.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, params};

use crate::{
    BudgetStore, CountKey, Counted, Sample, SampleQuery, Source, Spend, Stamped, Store, StoreError,
    aggregate, percentile_cont, sort_samples,
};

/// Versioned migrations: `MIGRATIONS[i]` takes the schema from version i to i + 1.
const MIGRATIONS: &[&str] = &[
    "
CREATE TABLE evidence (
    id INTEGER PRIMARY KEY,
    time_ms INTEGER NOT NULL,
    source TEXT NOT NULL,
    ring TEXT NOT NULL,
    release TEXT NOT NULL,
    experiment TEXT NOT NULL,
    variant TEXT NOT NULL,
    alias TEXT NOT NULL,
    upstream TEXT NOT NULL,
    model TEXT NOT NULL,
    target TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    status INTEGER NOT NULL,
    ttfb_ms REAL,
    duration_ms REAL,
    input_tokens INTEGER,
    output_tokens INTEGER,
    cache_write_tokens INTEGER,
    cache_read_tokens INTEGER,
    cost_usd REAL,
    complete INTEGER NOT NULL,
    unit TEXT NOT NULL
);
CREATE INDEX evidence_experiment_time ON evidence (experiment, time_ms);
CREATE INDEX evidence_time ON evidence (time_ms);
",
    crate::BUDGET_COUNTS_SCHEMA,
];

const INSERT: &str = "INSERT INTO evidence (time_ms, source, ring, release, experiment, variant, \
    alias, upstream, model, target, attempts, status, ttfb_ms, duration_ms, input_tokens, \
    output_tokens, cache_write_tokens, cache_read_tokens, cost_usd, complete, unit) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, \
    ?19, ?20, ?21)";

/// The embedded evidence store.
pub struct SqliteStore {
    writer: Mutex<Connection>,
    reader: Mutex<Connection>,
}

impl SqliteStore {
    /// Open (creating and migrating) the store at `path`.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let mut writer = Connection::open(path)?;
        writer.pragma_update(None, "journal_mode", "WAL")?;
        writer.pragma_update(None, "synchronous", "FULL")?;
        writer.busy_timeout(std::time::Duration::from_secs(10))?;
        migrate(&mut writer)?;
        let reader = Connection::open(path)?;
        reader.busy_timeout(std::time::Duration::from_secs(10))?;
        Ok(SqliteStore {
            writer: Mutex::new(writer),
            reader: Mutex::new(reader),
        })
    }

    /// The writer connection, for bulk loading in benchmarks.
    pub fn with_writer<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        Ok(f(&mut *lock(&self.writer)?)?)
    }
}

fn lock(m: &Mutex<Connection>) -> Result<MutexGuard<'_, Connection>, StoreError> {
    m.lock()
        .map_err(|_| StoreError::Poisoned("a sqlite connection's lock"))
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")?;
    let version: i64 = tx
        .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
        .optional()?
        .unwrap_or(0);
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(StoreError::SchemaTooNew {
            found: version,
            known,
        });
    }
    for sql in &MIGRATIONS[version as usize..] {
        tx.execute_batch(sql)?;
    }
    tx.execute("DELETE FROM schema_version", [])?;
    tx.execute("INSERT INTO schema_version (version) VALUES (?1)", [known])?;
    tx.commit()?;
    Ok(())
}

/// Token counts are u64 on the wire; SQLite integers are i64 (no real count comes close).
fn int(v: Option<u64>) -> Option<i64> {
    v.map(|n| i64::try_from(n).unwrap_or(i64::MAX))
}

impl Store for SqliteStore {
    fn append(&self, batch: &[Stamped]) -> Result<usize, StoreError> {
        let mut conn = lock(&self.writer)?;
        let tx = conn.transaction()?;
        {
            let mut insert = tx.prepare_cached(INSERT)?;
            for Stamped { source, record: r } in batch {
                insert.execute(params![
                    r.time_unix_ms,
                    source.as_str(),
                    r.ring,
                    r.release,
                    r.experiment,
                    r.variant,
                    r.alias,
                    r.upstream,
                    r.model,
                    r.target,
                    r.attempts,
                    r.status,
                    r.ttfb_ms,
                    r.duration_ms,
                    int(r.input_tokens),
                    int(r.output_tokens),
                    int(r.cache_write_tokens),
                    int(r.cache_read_tokens),
                    r.cost_usd,
                    r.complete,
                    r.unit,
                ])?;
            }
        }
        tx.commit()?;
        Ok(batch.len())
    }

    fn samples(&self, q: &SampleQuery) -> Result<Vec<Sample>, StoreError> {
        let conn = lock(&self.reader)?;
        let window = "experiment = ?1 AND time_ms >= ?2 AND time_ms < ?3";
        let args = params![q.experiment, q.since_unix_ms, q.until_unix_ms];
        let mut out = Vec::new();
        if let Some((column, fraction)) = q.metric.percentile() {
            // SQLite has no percentile aggregate: the values come sorted per group and
            // the same interpolation as PostgreSQL's percentile_cont is applied here.
            let sql = format!(
                "SELECT variant, unit, source, {column} FROM evidence \
                 WHERE {window} AND {column} IS NOT NULL \
                 ORDER BY variant, unit, source, {column}"
            );
            let mut stmt = conn.prepare(&sql)?;
            let mut rows = stmt.query(args)?;
            let mut group: Option<(String, String, String)> = None;
            let mut values: Vec<f64> = Vec::new();
            let mut flush = |group: &Option<(String, String, String)>, values: &mut Vec<f64>| {
                if let Some((variant, unit, source)) = group
                    && let (Some(value), Ok(source)) =
                        (percentile_cont(values, fraction), source.parse::<Source>())
                {
                    out.push(Sample {
                        variant: variant.clone(),
                        unit: unit.clone(),
                        value,
                        source,
                    });
                }
                values.clear();
            };
            while let Some(row) = rows.next()? {
                let key: (String, String, String) = (row.get(0)?, row.get(1)?, row.get(2)?);
                if group.as_ref() != Some(&key) {
                    flush(&group, &mut values);
                    group = Some(key);
                }
                values.push(row.get(3)?);
            }
            flush(&group, &mut values);
        } else if let Some((value, having)) = aggregate(q.metric) {
            let sql = format!(
                "SELECT variant, unit, source, {value} FROM evidence WHERE {window} \
                 GROUP BY variant, unit, source {having}"
            );
            let mut stmt = conn.prepare(&sql)?;
            let rows = stmt.query_map(args, |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, f64>(3)?,
                ))
            })?;
            for row in rows {
                let (variant, unit, source, value) = row?;
                if let Ok(source) = source.parse() {
                    out.push(Sample {
                        variant,
                        unit,
                        value,
                        source,
                    });
                }
            }
        }
        sort_samples(&mut out);
        Ok(out)
    }

    fn prune(&self, before_unix_ms: i64) -> Result<u64, StoreError> {
        let conn = lock(&self.writer)?;
        let n = conn.execute("DELETE FROM evidence WHERE time_ms < ?1", [before_unix_ms])?;
        Ok(n as u64)
    }

    fn count(&self) -> Result<u64, StoreError> {
        let conn = lock(&self.reader)?;
        let n: i64 = conn.query_row("SELECT COUNT(*) FROM evidence", [], |r| r.get(0))?;
        Ok(n as u64)
    }
}

impl BudgetStore for SqliteStore {
    fn add_spend(&self, spends: &[Spend], now_unix_ms: i64) -> Result<(), StoreError> {
        let mut conn = lock(&self.writer)?;
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(crate::UPSERT_COUNT)?;
            for s in spends {
                stmt.execute(params![
                    s.budget,
                    s.subject,
                    s.period_start_ms,
                    int(Some(s.tokens)),
                    int(Some(s.micro_usd)),
                    now_unix_ms
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn counted(&self, keys: &[CountKey]) -> Result<Vec<Counted>, StoreError> {
        let conn = lock(&self.reader)?;
        let mut stmt = conn.prepare_cached(
            "SELECT tokens, micro_usd FROM budget_counts \
             WHERE budget = ?1 AND subject = ?2 AND period_start_ms = ?3",
        )?;
        keys.iter()
            .map(|k| {
                let row = stmt
                    .query_row(params![k.budget, k.subject, k.period_start_ms], |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
                    })
                    .optional()?;
                Ok(row.map_or(Counted::default(), |(t, m)| Counted {
                    tokens: t.max(0) as u64,
                    micro_usd: m.max(0) as u64,
                }))
            })
            .collect()
    }

    fn prune_counts(&self, before_unix_ms: i64) -> Result<u64, StoreError> {
        let conn = lock(&self.writer)?;
        Ok(conn.execute(
            "DELETE FROM budget_counts WHERE period_start_ms < ?1",
            [before_unix_ms],
        )? as u64)
    }
}
