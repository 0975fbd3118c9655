//! halod.yaml: the agent's configuration, decoded strictly (an unknown key is an error
//! naming it), with the spec's defaults (interval 15m, kill poll 60s, layer cap 256 MiB).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Default full-cycle interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15 * 60);
/// Default kill-list poll interval.
pub const DEFAULT_KILL_INTERVAL: Duration = Duration::from_secs(60);
/// Default cap on a release layer.
pub const DEFAULT_MAX_LAYER_BYTES: u64 = 256 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The org releases and pointers must name.
    pub org: String,
    /// The OCI repository releases live in: `host[:port]/path`.
    pub registry: String,
    /// Allow plain http to a non-loopback registry (loopback is always allowed).
    #[serde(default)]
    pub insecure: bool,
    /// A fixed ring; wins over `ringEndpoint`.
    #[serde(default)]
    pub ring: Option<String>,
    /// halo-server's fleet ring endpoint (`GET ...?user=&host=` with the device token).
    #[serde(default, rename = "ringEndpoint")]
    pub ring_endpoint: Option<String>,
    /// The developer this device belongs to (the user claim the gateway sees).
    #[serde(default)]
    pub user: Option<String>,
    /// The developer's groups, for client toggles when the ring is fixed (with
    /// `ringEndpoint`, halo-server's answer gives them).
    #[serde(default)]
    pub groups: Vec<String>,
    /// This machine's name, sent to the ring endpoint and in reports.
    #[serde(default)]
    pub host: Option<String>,
    /// File holding the device token (from `POST /api/v1/enroll`).
    #[serde(default)]
    pub device_token_file: Option<PathBuf>,
    /// File holding halo-server's CLI receiver token (its `--otlp-cli-token-file`),
    /// provisioned with the device at enrolment: halod writes it into the OTLP headers of
    /// the harnesses whose telemetry is on. Never part of a release.
    #[serde(default)]
    pub telemetry_token_file: Option<PathBuf>,
    /// Release public keys (PEM files); any one that is not revoked may sign.
    pub pubkeys: Vec<PathBuf>,
    /// Revoked release keys, as key ids (sha256 hex of the raw public key, printed by
    /// `halo keys generate`).
    #[serde(default)]
    pub revoked_keys: Vec<String>,
    /// Full-cycle interval, for example 15m.
    #[serde(default, with = "opt_duration")]
    pub interval: Option<Duration>,
    #[serde(default)]
    pub max_layer_bytes: Option<u64>,
    /// Root prefix: `/` in production; a temp dir in tests and rootless devcontainers.
    #[serde(default)]
    pub root: Option<PathBuf>,
    /// Where state.json and the cached release live.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// Where the status line is POSTed (with the device token).
    #[serde(default, rename = "reportURL")]
    pub report_url: Option<String>,
    /// Opt-in: poll halo-server's signed kill list.
    #[serde(default)]
    pub kill_switch: Option<KillSwitchConfig>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KillSwitchConfig {
    /// `GET /api/v1/fleet/killswitch` (device token) on halo-server.
    pub url: String,
    /// The kill-list public key (PEM): a separate key from the release key.
    pub pubkey_file: PathBuf,
    #[serde(default, with = "opt_duration")]
    pub interval: Option<Duration>,
    /// Allow a plain http:// URL to a non-loopback host (an in-cluster Service).
    #[serde(default)]
    pub allow_insecure_in_cluster: bool,
}

/// A configuration that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
}

impl Config {
    /// Read and check `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Config::parse(&text).map_err(|message| ConfigError::Invalid {
            path: path.into(),
            message,
        })
    }

    /// Decode and check YAML text; the error names the field.
    pub fn parse(text: &str) -> Result<Config, String> {
        let config: Config = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        if self.org.trim().is_empty() {
            return Err("org: must not be empty".into());
        }
        if self.pubkeys.is_empty() {
            return Err("pubkeys: at least one release public key is required".into());
        }
        if self.ring.is_none() && self.ring_endpoint.is_none() {
            return Err("ring: set a fixed ring or ringEndpoint".into());
        }
        if self.ring_endpoint.is_some() && self.device_token_file.is_none() {
            return Err("deviceTokenFile: required with ringEndpoint".into());
        }
        if let Some(kill) = &self.kill_switch {
            check_url_transport("killSwitch.url", &kill.url, kill.allow_insecure_in_cluster)?;
        }
        Ok(())
    }

    pub fn interval(&self) -> Duration {
        self.interval.unwrap_or(DEFAULT_INTERVAL)
    }

    pub fn max_layer_bytes(&self) -> u64 {
        self.max_layer_bytes.unwrap_or(DEFAULT_MAX_LAYER_BYTES)
    }

    pub fn root(&self) -> PathBuf {
        self.root.clone().unwrap_or_else(|| PathBuf::from("/"))
    }

    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| self.root().join("var/lib/halod"))
    }
}

impl KillSwitchConfig {
    pub fn interval(&self) -> Duration {
        self.interval.unwrap_or(DEFAULT_KILL_INTERVAL)
    }
}

/// A token must not cross the network in clear text: http only to loopback, or with the
/// explicit in-cluster opt-in.
fn check_url_transport(field: &str, url: &str, allow_insecure: bool) -> Result<(), String> {
    if url.starts_with("https://") {
        return Ok(());
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(format!("{field}: {url:?} is not an http(s) URL"));
    };
    let host = rest.split(['/', '?']).next().unwrap_or("");
    let host = host
        .rsplit_once(':')
        .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
        .map_or(host, |(h, _)| h);
    let loopback = host == "localhost" || host.starts_with("127.") || host == "[::1]";
    if loopback || allow_insecure {
        Ok(())
    } else {
        Err(format!(
            "{field}: plain http to {host} would send the device token in clear text; use https or set allowInsecureInCluster"
        ))
    }
}

mod opt_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| humantime::parse_duration(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "org: acme-corp\nregistry: 127.0.0.1:5000/halos/acme\nring: canary\npubkeys: [/etc/halod/release.pub]\n";

    #[test]
    fn defaults_follow_the_spec() {
        let c = Config::parse(MINIMAL).unwrap();
        assert_eq!(c.interval(), Duration::from_secs(900));
        assert_eq!(c.max_layer_bytes(), 256 * 1024 * 1024);
        assert_eq!(c.root(), PathBuf::from("/"));
        assert_eq!(c.state_dir(), PathBuf::from("/var/lib/halod"));
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_it() {
        let err = Config::parse(&format!("{MINIMAL}intervall: 5m\n")).unwrap_err();
        assert!(err.contains("intervall"), "{err}");
    }

    #[test]
    fn durations_parse_and_bad_ones_are_refused() {
        let c = Config::parse(&format!("{MINIMAL}interval: 5m\n")).unwrap();
        assert_eq!(c.interval(), Duration::from_secs(300));
        assert!(Config::parse(&format!("{MINIMAL}interval: soon\n")).is_err());
    }

    #[test]
    fn a_ring_source_is_required() {
        let text = MINIMAL.replace("ring: canary\n", "");
        assert!(Config::parse(&text).unwrap_err().contains("ring"));
        let text = MINIMAL.replace(
            "ring: canary\n",
            "ringEndpoint: https://halo.example/api/v1/fleet/ring\n",
        );
        assert!(
            Config::parse(&text)
                .unwrap_err()
                .contains("deviceTokenFile")
        );
    }

    #[test]
    fn a_plain_http_kill_url_needs_loopback_or_the_opt_in() {
        let with = |url: &str, opt_in: bool| {
            format!(
                "{MINIMAL}killSwitch:\n  url: {url}\n  pubkeyFile: /k.pub\n  allowInsecureInCluster: {opt_in}\n"
            )
        };
        assert!(Config::parse(&with("http://127.0.0.1:8080/x", false)).is_ok());
        assert!(Config::parse(&with("https://halo.example/x", false)).is_ok());
        let err = Config::parse(&with("http://halo-server.halos:8080/x", false)).unwrap_err();
        assert!(err.contains("allowInsecureInCluster"), "{err}");
        assert!(Config::parse(&with("http://halo-server.halos:8080/x", true)).is_ok());
    }
}
