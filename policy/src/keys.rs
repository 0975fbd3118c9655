//! ed25519 key files, in the PEM forms OpenSSL reads and writes: a private key is PKCS#8
//! v1 (`-----BEGIN PRIVATE KEY-----`, as `openssl genpkey -algorithm ed25519` writes it),
//! a public key is SubjectPublicKeyInfo (`-----BEGIN PUBLIC KEY-----`, as
//! `openssl pkey -pubout` writes it).
//!
//! Verifiers (the filter, halod) need only [`public_key_from_pem`], which is pure and
//! builds for wasm32. Making and loading signing keys is behind feature `sign`.
//! No error message ever contains key material: they name the expected form instead.

/// Why a key file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error(
        "not an ed25519 public key: expected a PEM block -----BEGIN PUBLIC KEY----- holding an ed25519 SubjectPublicKeyInfo (as `openssl pkey -in KEY -pubout` writes)"
    )]
    PublicKeyPem,
    #[error(
        "this is a private key, where a public key is expected: verifiers hold only the public half (`openssl pkey -in KEY -pubout`)"
    )]
    PrivateKeyGiven,
    #[error("the ed25519 public key is not usable: {0}")]
    InvalidPublicKey(&'static str),
    #[error(
        "not an ed25519 private key: expected an unencrypted PEM block -----BEGIN PRIVATE KEY----- holding PKCS#8 ed25519 (as `openssl genpkey -algorithm ed25519` writes)"
    )]
    PrivateKeyPem,
    #[error("this is a public key, where a private (signing) key is expected")]
    PublicKeyGiven,
    #[error("the system random source failed: {0}")]
    Random(String),
    #[error("cannot encode the key as PEM: {0}")]
    Encode(String),
}

/// Read an ed25519 public key from SPKI PEM and reject small-order and non-canonical
/// points, which no honest key has.
pub fn public_key_from_pem(pem: &str) -> Result<ed25519_compact::PublicKey, KeyError> {
    if pem.contains("PRIVATE KEY-----") {
        return Err(KeyError::PrivateKeyGiven);
    }
    let key = ed25519_compact::PublicKey::from_pem(pem).map_err(|_| KeyError::PublicKeyPem)?;
    key.validate().map_err(|e| {
        KeyError::InvalidPublicKey(match e {
            ed25519_compact::Error::WeakPublicKey => "it has a small order",
            _ => "it is not a canonical curve point",
        })
    })?;
    Ok(key)
}

/// A key's id: lowercase hex sha256 of the 32 raw public-key bytes. Revocation lists
/// (halod's `revokedKeys`) and logs name keys by id, never by content.
pub fn key_id(key: &ed25519_compact::PublicKey) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(key.as_ref()))
}

#[cfg(feature = "sign")]
pub use signing::{KeyPair, generate, signing_key_from_pem};

#[cfg(feature = "sign")]
mod signing {
    use ed25519_dalek::SigningKey;
    use ed25519_dalek::pkcs8::spki::der::{pem::LineEnding, zeroize::Zeroizing};
    use ed25519_dalek::pkcs8::{
        DecodePrivateKey as _, EncodePrivateKey as _, EncodePublicKey as _, KeypairBytes,
    };

    use super::KeyError;

    /// A key pair as the two PEM files `halo keys generate` writes.
    #[derive(Clone)]
    pub struct KeyPair {
        /// PKCS#8 v1 private key; wiped from memory when dropped.
        pub private_pem: Zeroizing<String>,
        /// SPKI public key.
        pub public_pem: String,
    }

    impl std::fmt::Debug for KeyPair {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("KeyPair")
                .field("private_pem", &"<redacted>")
                .field("public_pem", &self.public_pem)
                .finish()
        }
    }

    impl KeyPair {
        /// The PEM files of an existing signing key.
        pub fn from_signing_key(key: &SigningKey) -> Result<KeyPair, KeyError> {
            // PKCS#8 v1 (no embedded public key): the form OpenSSL writes, and the only
            // one ed25519-compact reads. KeypairBytes wipes its copy of the seed on drop.
            let bytes = KeypairBytes {
                secret_key: key.to_bytes(),
                public_key: None,
            };
            let private_pem = bytes
                .to_pkcs8_pem(LineEnding::LF)
                .map_err(|e| KeyError::Encode(e.to_string()))?;
            let public_pem = key
                .verifying_key()
                .to_public_key_pem(LineEnding::LF)
                .map_err(|e| KeyError::Encode(e.to_string()))?;
            Ok(KeyPair {
                private_pem,
                public_pem,
            })
        }
    }

    /// A new ed25519 key pair from 32 bytes of operating-system randomness.
    pub fn generate() -> Result<KeyPair, KeyError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        getrandom::fill(seed.as_mut_slice()).map_err(|e| KeyError::Random(e.to_string()))?;
        KeyPair::from_signing_key(&SigningKey::from_bytes(&seed))
    }

    /// Read an ed25519 signing key from PKCS#8 PEM (v1, or v2 with a matching public key).
    pub fn signing_key_from_pem(pem: &str) -> Result<SigningKey, KeyError> {
        if pem.contains("BEGIN PUBLIC KEY-----") && !pem.contains("PRIVATE KEY-----") {
            return Err(KeyError::PublicKeyGiven);
        }
        // The pkcs8 error is dropped: a fixed message cannot leak key bytes.
        SigningKey::from_pkcs8_pem(pem.trim()).map_err(|_| KeyError::PrivateKeyPem)
    }
}
