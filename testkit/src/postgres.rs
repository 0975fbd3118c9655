//! A real PostgreSQL (Debian's `postgresql` package) on loopback, one per test process,
//! with a fresh database per test ([`database`]).
//!
//! PostgreSQL refuses to run as root, and tests here often do: the cluster is then
//! created and run as `nobody` (setpriv), in a temp dir owned by it. It listens on
//! 127.0.0.1 only, with trust authentication (nothing else can reach a loopback port
//! of a test), `fsync=off` (a test cluster does not survive a crash anyway). The server
//! lives until the test process exits: an exit handler stops it and removes its
//! directory, and its parent-death signal (set by setpriv, from a thread that lives as
//! long as the process: the signal follows the spawning thread) covers a killed test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::{free_port, wait_until};

/// The superuser the test cluster is created with.
pub const USER: &str = "halo";

struct Server {
    port: u16,
    bin: PathBuf,
    dir: PathBuf,
    pid: u32,
}

static SERVER: OnceLock<Server> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(0);

/// A connection string (key=value form) for a new, empty database of the process's
/// PostgreSQL, started on first use.
pub fn database() -> String {
    let server = SERVER.get_or_init(start);
    let name = format!(
        "t{}_{}",
        std::process::id(),
        NEXT_DB.fetch_add(1, Ordering::Relaxed)
    );
    let out = Command::new(server.bin.join("psql"))
        .args(["-h", "127.0.0.1", "-U", USER, "-d", "postgres", "-v"])
        .arg("ON_ERROR_STOP=1")
        .arg("-p")
        .arg(server.port.to_string())
        .arg("-c")
        .arg(format!("CREATE DATABASE {name}"))
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "CREATE DATABASE failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!(
        "host=127.0.0.1 port={} user={USER} dbname={name}",
        server.port
    )
}

/// The directory of Debian's PostgreSQL binaries (the newest installed major version).
pub fn bin_dir() -> PathBuf {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<u32> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/install.sh)", root.display()))
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable();
    let v = versions
        .last()
        .unwrap_or_else(|| panic!("no PostgreSQL under {}", root.display()));
    root.join(v.to_string()).join("bin")
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `program` as the unprivileged user when the tests run as root, killed when the thread
/// that started it ends.
fn unprivileged(program: &Path) -> Command {
    let mut c = Command::new("setpriv");
    if is_root() {
        c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"]);
    }
    c.arg("--pdeathsig=KILL").arg(program);
    c
}

/// Stop the shared server when the test process exits: it outlives every test (a
/// static), and no destructor of a static runs.
#[cfg(target_os = "linux")]
#[allow(
    unsafe_code,
    reason = "libc's atexit, which std does not wrap, is the only hook at process exit"
)]
fn register_stop_at_exit() {
    // SAFETY: registering a plain extern "C" function that takes nothing; it runs once at
    // exit.
    unsafe {
        libc::atexit(stop_at_exit);
    }
}

#[cfg(not(target_os = "linux"))]
fn register_stop_at_exit() {}

extern "C" fn stop_at_exit() {
    if let Some(server) = SERVER.get() {
        let _ = Command::new("kill")
            .args(["-QUIT", &server.pid.to_string()])
            .status();
        let _ = std::fs::remove_dir_all(&server.dir);
    }
}

fn start() -> Server {
    let bin = bin_dir();
    let dir = tempfile::Builder::new()
        .prefix("halo-pg-")
        .tempdir()
        .expect("temp dir");
    let data = dir.path().join("data");
    if is_root() {
        let chown = Command::new("chown")
            .arg("nobody:nogroup")
            .arg(dir.path())
            .status()
            .expect("chown");
        assert!(chown.success(), "chown the PostgreSQL dir to nobody");
    }
    let out = unprivileged(&bin.join("initdb"))
        .arg("-D")
        .arg(&data)
        .args(["-U", USER, "--auth=trust", "--no-sync", "-E", "UTF8"])
        .output()
        .expect("run initdb");
    assert!(
        out.status.success(),
        "initdb failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("postgres.log")).expect("log file");
    let mut command = unprivileged(&bin.join("postgres"));
    command
        .arg("-D")
        .arg(&data)
        .arg("-p")
        .arg(port.to_string())
        .args(["-c", "listen_addresses=127.0.0.1"])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", dir.path().display()))
        .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
        .args(["-c", "synchronous_commit=off", "-c", "max_connections=200"])
        .stdout(Stdio::null())
        .stderr(log);
    // The spawning thread lives as long as the process (see the module doc).
    // It waits on the server, which keeps it alive and reaps the server when it exits.
    let (tx, rx) = std::sync::mpsc::channel::<std::io::Result<u32>>();
    std::thread::spawn(move || match command.spawn() {
        Ok(mut child) => {
            let _ = tx.send(Ok(child.id()));
            let _ = child.wait();
        }
        Err(e) => {
            let _ = tx.send(Err(e));
        }
    });
    let pid = rx.recv().expect("spawner thread").expect("start postgres");
    let log_path = dir.path().join("postgres.log");
    wait_until(
        "PostgreSQL to accept connections",
        Duration::from_secs(60),
        || {
            let ready = Command::new(bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-q"])
                .arg("-p")
                .arg(port.to_string())
                .status()
                .ok()?;
            if !ready.success() {
                // pg_isready's own probe logs "starting up" as FATAL; anything else is real.
                if let Ok(text) = std::fs::read_to_string(&log_path)
                    && text
                        .lines()
                        .any(|l| l.contains("FATAL") && !l.contains("is starting up"))
                {
                    panic!("PostgreSQL failed to start:\n{text}");
                }
                return None;
            }
            Some(())
        },
    );
    register_stop_at_exit();
    Server {
        port,
        bin,
        dir: dir.keep(),
        pid,
    }
}
