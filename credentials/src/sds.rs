//! The Envoy SDS file a token is published in: one
//! `envoy.extensions.transport_sockets.tls.v3.Secret` whose `generic_secret` is the
//! header value (`Bearer <token>` by default), read by `envoy.filters.http.credential_injector`
//! (`injected_credentials.generic`, `sds_config.path_config_source`).
//!
//! The file is replaced atomically (temp file, fsync, rename) with mode 0600: Envoy's file
//! watcher sees the rename and reloads the secret without a restart, and never reads half
//! a file.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::google::AccessToken;

/// The Secret resource's type URL.
pub const SECRET_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// What the secret holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// `Bearer <token>`: the injector sets `Authorization` to it as is.
    Bearer,
    /// The token alone, for an injector configured with `header_value_prefix: "Bearer "`.
    Bare,
}

/// Where and under which name the token is published.
#[derive(Debug, Clone)]
pub struct SdsFile {
    pub path: PathBuf,
    /// The Secret's `name`, which the injector's `credential.name` must match.
    pub secret_name: String,
    pub value: Value,
}

/// Why an SDS file target is unusable.
#[derive(Debug, thiserror::Error)]
pub enum SdsError {
    #[error("{}: Envoy reads SDS files ending .yaml, .yml or .json", .0.display())]
    Extension(PathBuf),
    #[error("secret name {0:?}: want a non-empty name of visible ASCII characters")]
    Name(String),
    #[error(transparent)]
    Write(#[from] halo_fsutil::WriteError),
}

impl SdsFile {
    pub fn new(path: &Path, secret_name: &str, value: Value) -> Result<SdsFile, SdsError> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if !matches!(ext, "yaml" | "yml" | "json") {
            return Err(SdsError::Extension(path.to_path_buf()));
        }
        if secret_name.is_empty() || !secret_name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(SdsError::Name(secret_name.to_string()));
        }
        Ok(SdsFile {
            path: path.to_path_buf(),
            secret_name: secret_name.to_string(),
            value,
        })
    }

    /// The file's bytes: JSON, which is also YAML, so either extension reads it.
    pub fn render(&self, token: &AccessToken) -> Vec<u8> {
        let value = match self.value {
            Value::Bearer => format!("Bearer {}", token.secret()),
            Value::Bare => token.secret().to_string(),
        };
        let doc = json!({"resources": [{
            "@type": SECRET_TYPE,
            "name": self.secret_name,
            "generic_secret": {"secret": {"inline_string": value}},
        }]});
        let mut bytes = serde_json::to_vec_pretty(&doc).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Replace the file atomically, readable by its owner only.
    pub fn write(&self, token: &AccessToken) -> Result<(), SdsError> {
        halo_fsutil::write_atomic(&self.path, &self.render(token), 0o600)?;
        Ok(())
    }
}

/// Why a secret could not be read from an SDS file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not an SDS file (YAML or JSON): {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("{}: no secret named {name:?} with a generic_secret.secret.inline_string", path.display())]
    NoSecret { path: PathBuf, name: String },
}

/// The value of secret `name` in the SDS file at `path`, as Envoy's credential injector
/// reads it: the `generic_secret`'s `inline_string` of the resource of that name (so
/// `Bearer <token>` for a file [`SdsFile::write`] wrote with [`Value::Bearer`]). YAML or
/// JSON, as Envoy takes either; read whole at each call, as the file is replaced
/// atomically.
pub fn read_secret(path: &Path, name: &str) -> Result<String, ReadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let doc: serde_json::Value = serde_saphyr::from_str(&text).map_err(|e| ReadError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    doc["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["name"] == name)
        .and_then(|r| r["generic_secret"]["secret"]["inline_string"].as_str())
        .map(str::to_string)
        .ok_or_else(|| ReadError::NoSecret {
            path: path.to_path_buf(),
            name: name.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> AccessToken {
        crate::google::tests_support::token("ya29.test")
    }

    #[test]
    fn the_file_is_an_sds_secret_with_a_bearer_value() {
        let sds = SdsFile::new(Path::new("/x/vertex.yaml"), "vertex-token", Value::Bearer).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&sds.render(&token())).unwrap();
        assert_eq!(
            doc,
            json!({"resources": [{
                "@type": SECRET_TYPE,
                "name": "vertex-token",
                "generic_secret": {"secret": {"inline_string": "Bearer ya29.test"}}}]})
        );
        let bare = SdsFile::new(Path::new("/x/v.json"), "n", Value::Bare).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&bare.render(&token())).unwrap();
        assert_eq!(
            doc["resources"][0]["generic_secret"]["secret"]["inline_string"],
            "ya29.test"
        );
    }

    #[test]
    fn a_written_secret_reads_back_as_the_injector_sends_it() {
        let dir = tempfile::tempdir().unwrap();
        let sds = SdsFile::new(&dir.path().join("v.yaml"), "vertex-token", Value::Bearer).unwrap();
        sds.write(&token()).unwrap();
        assert_eq!(
            read_secret(&sds.path, "vertex-token").unwrap(),
            "Bearer ya29.test"
        );
        assert!(matches!(
            read_secret(&sds.path, "other"),
            Err(ReadError::NoSecret { .. })
        ));
        // An operator's own YAML file, as Envoy also reads it.
        let yaml = dir.path().join("own.yaml");
        std::fs::write(
            &yaml,
            "resources:\n- \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  name: t\n  generic_secret:\n    secret:\n      inline_string: Bearer abc\n",
        )
        .unwrap();
        assert_eq!(read_secret(&yaml, "t").unwrap(), "Bearer abc");
        assert!(matches!(
            read_secret(&dir.path().join("none.yaml"), "t"),
            Err(ReadError::Io { .. })
        ));
        std::fs::write(&yaml, "resources: [").unwrap();
        assert!(matches!(
            read_secret(&yaml, "t"),
            Err(ReadError::Parse { .. })
        ));
    }

    #[test]
    fn extensions_envoy_cannot_read_and_bad_names_are_refused() {
        assert!(matches!(
            SdsFile::new(Path::new("/x/vertex.txt"), "n", Value::Bearer),
            Err(SdsError::Extension(_))
        ));
        assert!(matches!(
            SdsFile::new(Path::new("/x/vertex.yaml"), "a b", Value::Bearer),
            Err(SdsError::Name(_))
        ));
    }

    #[cfg(unix)]
    #[test]
    fn the_file_is_written_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let sds = SdsFile::new(&dir.path().join("v.yaml"), "n", Value::Bearer).unwrap();
        sds.write(&token()).unwrap();
        let mode = std::fs::metadata(&sds.path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
