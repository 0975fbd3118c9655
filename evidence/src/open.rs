//! Opening the evidence store as halo-server and `halo controller run` both do:
//! PostgreSQL when a file names its connection string, else the embedded SQLite store in
//! the data dir. Blocking (the PostgreSQL client runs its own runtime).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{Backend, Store, StoreError};

/// Why the store could not be opened; each names the file or setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("connecting to the evidence PostgreSQL: {0}")]
    Connect(StoreError),
    #[error(
        "the evidence receivers and the budget service need --data-dir (the embedded store) or --evidence-postgres-file"
    )]
    NoDataDir,
    #[error("opening the evidence store {}: {source}", path.display())]
    Open { path: PathBuf, source: StoreError },
}

/// The evidence store: PostgreSQL when `postgres_file` names its connection string, else
/// the embedded one in the data dir. halo-server's receivers write it; `halo controller
/// run` reads the same one.
pub fn open_store(
    postgres_file: Option<&Path>,
    data_dir: Option<&Path>,
) -> Result<Arc<dyn Store>, OpenError> {
    let backend = open_backend(postgres_file, data_dir)?;
    Ok(backend)
}

/// [`open_store`] with the budget counts too (the budget service's store): the same
/// database, chosen the same way.
pub fn open_backend(
    postgres_file: Option<&Path>,
    data_dir: Option<&Path>,
) -> Result<Arc<dyn Backend>, OpenError> {
    if let Some(file) = postgres_file {
        let params = std::fs::read_to_string(file).map_err(|source| OpenError::Read {
            path: file.to_path_buf(),
            source,
        })?;
        let store = crate::postgres::PgStore::connect(params.trim()).map_err(OpenError::Connect)?;
        return Ok(Arc::new(store));
    }
    let path = data_dir.ok_or(OpenError::NoDataDir)?.join("evidence.db");
    let store = crate::sqlite::SqliteStore::open(&path).map_err(|source| OpenError::Open {
        path: path.clone(),
        source,
    })?;
    Ok(Arc::new(store))
}
