//! Where the login lives, all in the developer's own halo directory (never a harness's
//! config directory: harnesses sync and share theirs):
//! - `session.json`: who is logged in where (issuer, client, endpoints, the audience and
//!   claim names the policy expects, which store holds the refresh token). Not secret.
//! - `tokens.json` (0600): short-lived tokens by audience, so `halo auth token` answers
//!   from a file read while a token has more than a minute left.
//! - the refresh token: in the OS credential store (Secret Service over D-Bus, macOS
//!   Keychain, Windows Credential Manager) when there is one, else `refresh-token` (0600).
//! - `lock`: held while refreshing, so two harnesses calling at once do not both spend
//!   the same rotating refresh token (the second use would end the session).
//!
//! Every write is atomic (halo-fsutil: temp file, fsync, rename).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::oauth::Endpoints;
use crate::{Error, Result};

/// The credential store's service name for halo's entries.
const KEYRING_SERVICE: &str = "halos";
const SESSION_FILE: &str = "session.json";
const TOKENS_FILE: &str = "tokens.json";
const REFRESH_FILE: &str = "refresh-token";
const LOCK_FILE: &str = "lock";
/// Path components of harness configuration directories: the login is never kept there.
const HARNESS_DIRS: &[&str] = &[".claude", ".codex", ".gemini", "ClaudeCode", "claude-code"];

/// Where the refresh token is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretStore {
    /// The OS credential store.
    Keyring,
    /// `refresh-token` (0600) in the auth directory.
    File,
}

impl SecretStore {
    pub fn describe(self, dir: &Path) -> String {
        match self {
            SecretStore::Keyring => os_store_name().to_string(),
            SecretStore::File => format!("file {}", dir.join(REFRESH_FILE).display()),
        }
    }
}

/// What `halo auth login` may use: the OS store if it works, only it, or only the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreChoice {
    Auto,
    Keyring,
    File,
}

/// The session: everything `token` needs besides secrets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Session {
    pub issuer: String,
    pub client_id: String,
    pub endpoints: Endpoints,
    /// The audience `halo auth token` serves without `--audience`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// The claim that names the user (the policy's identity.claims.user).
    pub user_claim: String,
    /// The claim that lists the groups (the policy's identity.claims.groups).
    pub groups_claim: String,
    /// An extra CA for the issuer's TLS (a private CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    pub store: SecretStore,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    pub logged_in_at: i64,
}

/// One cached token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CachedToken {
    pub token: String,
    /// Unix seconds, on this machine's clock (receipt time plus the token's lifetime).
    pub expires_at: i64,
}

/// Cached tokens by audience (`*` for "no audience asked").
pub type TokenCache = BTreeMap<String, CachedToken>;

/// The auth directory and what is in it.
#[derive(Debug, Clone)]
pub struct AuthDir {
    pub path: PathBuf,
}

/// The default auth directory: `HALO_AUTH_DIR`, else the OS's per-user config place
/// (`$XDG_CONFIG_HOME/halo` or `~/.config/halo`; `~/Library/Application Support/halo`
/// on macOS; `%APPDATA%\halo` on Windows).
pub fn default_dir() -> Result<PathBuf> {
    let var = |n: &str| {
        std::env::var_os(n)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var("HALO_AUTH_DIR") {
        return Ok(dir);
    }
    let base = if cfg!(windows) {
        var("APPDATA")
    } else if cfg!(target_os = "macos") {
        var("HOME").map(|h| h.join("Library/Application Support"))
    } else {
        var("XDG_CONFIG_HOME").or_else(|| var("HOME").map(|h| h.join(".config")))
    };
    base.map(|b| b.join("halo")).ok_or_else(|| {
        Error::Config("no home directory to keep the login in; set HALO_AUTH_DIR".into())
    })
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

impl AuthDir {
    /// `path`, refused when it lies inside a harness's configuration directory.
    pub fn new(path: PathBuf) -> Result<AuthDir> {
        if let Some(c) = path
            .components()
            .filter_map(|c| c.as_os_str().to_str())
            .find(|c| HARNESS_DIRS.contains(c))
        {
            return Err(Error::Config(format!(
                "{}: the login is never kept in a harness's configuration ({c}); choose another HALO_AUTH_DIR",
                path.display()
            )));
        }
        Ok(AuthDir { path })
    }

    fn create(&self) -> Result<()> {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
            .create(&self.path)
            .map_err(|e| file_err(&self.path, e))
    }

    fn read_json<T: serde::de::DeserializeOwned>(&self, name: &str) -> Result<Option<T>> {
        let path = self.path.join(name);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(file_err(&path, e)),
        };
        let de = &mut serde_json::Deserializer::from_slice(&bytes);
        serde_path_to_error::deserialize(de)
            .map(Some)
            .map_err(|e| file_err(&path, format!("{}: {}", e.path(), e.inner())))
    }

    fn write(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.create()?;
        let path = self.path.join(name);
        halo_fsutil::write_atomic(&path, bytes, 0o600).map_err(|e| file_err(&path, e))
    }

    fn remove(&self, name: &str) -> Result<()> {
        let path = self.path.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(file_err(&path, e)),
        }
    }

    pub fn session(&self) -> Result<Option<Session>> {
        self.read_json(SESSION_FILE)
    }

    pub fn write_session(&self, s: &Session) -> Result<()> {
        let json = serde_json::to_vec_pretty(s).map_err(|e| Error::Config(e.to_string()))?;
        self.write(SESSION_FILE, &json)
    }

    pub fn tokens(&self) -> Result<TokenCache> {
        Ok(self.read_json(TOKENS_FILE)?.unwrap_or_default())
    }

    pub fn write_tokens(&self, t: &TokenCache) -> Result<()> {
        let json = serde_json::to_vec(t).map_err(|e| Error::Config(e.to_string()))?;
        self.write(TOKENS_FILE, &json)
    }

    /// Remove the session and the token cache (the refresh token: [`Secrets::delete`]).
    pub fn clear(&self) -> Result<()> {
        self.remove(TOKENS_FILE)?;
        self.remove(SESSION_FILE)
    }

    /// Hold the refresh lock until the returned file is dropped.
    pub fn lock(&self) -> Result<std::fs::File> {
        self.create()?;
        let path = self.path.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| file_err(&path, e))?;
        file.lock().map_err(|e| file_err(&path, e))?;
        Ok(file)
    }

    /// The refresh token's home for `issuer` and `client_id`.
    pub fn secrets(&self, store: SecretStore, issuer: &str, client_id: &str) -> Secrets {
        Secrets {
            dir: self.clone(),
            store,
            account: format!("{client_id} at {issuer}"),
        }
    }
}

/// The refresh token in its store.
pub struct Secrets {
    dir: AuthDir,
    pub store: SecretStore,
    account: String,
}

impl Secrets {
    pub fn get(&self) -> Result<Option<String>> {
        match self.store {
            SecretStore::File => {
                let path = self.dir.path.join(REFRESH_FILE);
                match std::fs::read_to_string(&path) {
                    Ok(t) if !t.trim().is_empty() => Ok(Some(t.trim().to_string())),
                    Ok(_) => Ok(None),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(file_err(&path, e)),
                }
            }
            SecretStore::Keyring => match self.entry()?.get_password() {
                Ok(t) => Ok(Some(t)),
                Err(keyring_core::Error::NoEntry) => Ok(None),
                Err(e) => Err(keyring_err(&e)),
            },
        }
    }

    pub fn set(&self, token: &str) -> Result<()> {
        match self.store {
            SecretStore::File => self.dir.write(REFRESH_FILE, token.as_bytes()),
            SecretStore::Keyring => self
                .entry()?
                .set_password(token)
                .map_err(|e| keyring_err(&e)),
        }
    }

    pub fn delete(&self) -> Result<()> {
        match self.store {
            SecretStore::File => self.dir.remove(REFRESH_FILE),
            SecretStore::Keyring => match self.entry()?.delete_credential() {
                Ok(()) | Err(keyring_core::Error::NoEntry) => Ok(()),
                Err(e) => Err(keyring_err(&e)),
            },
        }
    }

    fn entry(&self) -> Result<keyring_core::Entry> {
        let store = os_store()?;
        keyring_core::Entry::new_in_store(&store, KEYRING_SERVICE, &self.account)
            .map_err(|e| keyring_err(&e))
    }
}

/// A keyring error as text, never with the secret bytes some variants carry.
fn keyring_err(e: &keyring_core::Error) -> Error {
    use keyring_core::Error as K;
    Error::Keyring(match e {
        K::PlatformFailure(p) => format!("{} failed: {p}", os_store_name()),
        K::NoStorageAccess(p) => format!("{} is not accessible: {p}", os_store_name()),
        K::BadEncoding(_) | K::BadDataFormat(..) => {
            "the stored refresh token is unreadable; run `halo auth login`".to_string()
        }
        K::NoEntry => "no refresh token stored".to_string(),
        other => other.to_string(),
    })
}

/// The OS credential store's name, for messages.
pub fn os_store_name() -> &'static str {
    if cfg!(target_os = "macos") {
        "the macOS Keychain"
    } else if cfg!(windows) {
        "Windows Credential Manager"
    } else if cfg!(target_os = "linux") {
        "the Secret Service"
    } else {
        "no OS credential store"
    }
}

/// Connect to the OS credential store (on Linux: the D-Bus session bus; without one this
/// fails at once).
pub fn os_store() -> Result<Arc<keyring_core::CredentialStore>> {
    #[cfg(target_os = "linux")]
    {
        let store = zbus_secret_service_keyring_store::Store::new().map_err(|e| keyring_err(&e))?;
        Ok(store)
    }
    #[cfg(target_os = "macos")]
    {
        let store =
            apple_native_keyring_store::keychain::Store::new().map_err(|e| keyring_err(&e))?;
        Ok(store)
    }
    #[cfg(windows)]
    {
        let store = windows_native_keyring_store::Store::new().map_err(|e| keyring_err(&e))?;
        Ok(store)
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos", windows)))]
    {
        Err(Error::Keyring(
            "this OS has no supported credential store".into(),
        ))
    }
}
