//! The real halo-server binary killed with SIGKILL while batches stream into its gateway
//! receiver: every acknowledged batch is in the store, no batch is half there, and the
//! store opens afterwards (and passes SQLite's integrity check). One body, both backends.

// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use halo_evidence::postgres::PgStore;
use halo_evidence::sqlite::SqliteStore;
use halo_evidence::{Record, Store, otlp};
use prost::Message as _;

const BIN: &str = env!("CARGO_BIN_EXE_halo-server");
const TOKEN: &str = "9b8e7d1c2a3f40516e7d8c9b0a1f2e3d4c5b6a79808f7e6d5c4b3a2910f8e7d6";
const BATCH: usize = 50;

fn batch(n: usize) -> Vec<u8> {
    let records: Vec<Record> = (0..BATCH)
        .map(|i| Record {
            time_unix_ms: 1_760_000_000_000,
            experiment: "crash".into(),
            variant: if i % 2 == 0 { "control" } else { "treatment" }.into(),
            status: 200,
            attempts: 1,
            unit: format!("{:016x}", n * BATCH + i),
            ..Record::default()
        })
        .collect();
    otlp::request(&records).encode_to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_sqlite() {
    kill_9_mid_stream_loses_only_unacknowledged_batches(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_postgres() {
    let params = halo_testkit::postgres::database();
    kill_9_mid_stream_loses_only_unacknowledged_batches(Some(params)).await;
}

/// `postgres`: the connection string of the store, or `None` for the embedded one.
async fn kill_9_mid_stream_loses_only_unacknowledged_batches(postgres: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("otlp-gateway.token");
    std::fs::write(&token, TOKEN).unwrap();
    let data = dir.path().join("data");
    let mut store_args = Vec::new();
    if let Some(params) = &postgres {
        let file = dir.path().join("evidence-postgres");
        std::fs::write(&file, params).unwrap();
        store_args.push("--evidence-postgres-file".into());
        store_args.push(file.into_os_string());
    }
    let mut child = Command::new(BIN)
        .args(&store_args)
        .arg("--policy-dir")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/acme-corp"))
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--otlp-gateway-listen", "127.0.0.1:0"])
        .arg("--otlp-gateway-token-file")
        .arg(&token)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) =
                line.strip_prefix("halo-server evidence receiver source=gateway addr=")
            {
                let _ = tx.send(addr.to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the gateway receiver's address line");
    let url = format!("http://{addr}/v1/logs");
    let client = halo_server::auth::http_client(None).expect("HTTP client");
    let mut acked = 0usize;
    let mut killed = false;
    for n in 0..10_000 {
        if n == 20 {
            // From now on a batch is in flight when the kill lands (bounded: the loop
            // stops at the first failed send).
            let pid = child.id();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            });
            killed = true;
        }
        let sent = client
            .post(&url)
            .bearer_auth(TOKEN)
            .header("content-type", "application/x-protobuf")
            .body(batch(n))
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => acked += 1,
            Ok(r) => panic!("batch {n} refused: {}", r.status()),
            Err(_) if killed => break,
            Err(e) => panic!("batch {n}: {e}"),
        }
    }
    let status = child.wait().unwrap();
    assert!(!status.success(), "the server was killed");
    assert!(acked >= 20, "acknowledged {acked}");

    let stored = tokio::task::block_in_place(|| match &postgres {
        None => {
            let store = SqliteStore::open(&data.join("evidence.db"))
                .expect("the store opens after kill -9");
            let check: String = store
                .with_writer(|c| c.query_row("PRAGMA integrity_check", [], |r| r.get(0)))
                .expect("integrity check");
            assert_eq!(check, "ok");
            store.count().expect("count")
        }
        Some(params) => PgStore::connect(params)
            .expect("the store opens after kill -9")
            .count()
            .expect("count"),
    }) as usize;
    assert_eq!(stored % BATCH, 0, "no batch is half stored: {stored}");
    assert!(
        stored == acked * BATCH || stored == (acked + 1) * BATCH,
        "stored {stored}, acknowledged {} records",
        acked * BATCH
    );
}
