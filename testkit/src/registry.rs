//! A real OCI registry for tests: Debian's `docker-registry` (the CNCF distribution
//! registry) on 127.0.0.1 with its storage in a temp dir, waited for on `GET /v2/`,
//! killed on drop. `scripts/install.sh` installs the package.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, wait_for_http_ok};

/// The registry binary: `HALO_REGISTRY_BIN`, else Debian's `/usr/bin/docker-registry`.
pub fn registry_binary() -> PathBuf {
    std::env::var_os("HALO_REGISTRY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/docker-registry"))
}

/// A running registry.
pub struct Registry {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Registry {
    pub fn start() -> Registry {
        let dir = tempfile::tempdir().expect("registry temp dir");
        let port = free_port();
        let root = dir.path().join("storage");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
                root.display()
            ),
        )
        .expect("write registry config");
        let log = File::create(dir.path().join("registry.log")).expect("registry log");
        let child = Command::new(registry_binary())
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "starting {} (apt-get install docker-registry): {e}",
                    registry_binary().display()
                )
            });
        let mut registry = Registry { child, port, dir };
        if !wait_for_http_ok(&mut registry.child, port, "/v2/", Duration::from_secs(30)) {
            panic!(
                "docker-registry did not start; its log:\n{}",
                registry.logs()
            );
        }
        registry
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`, the registry part of a reference.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
