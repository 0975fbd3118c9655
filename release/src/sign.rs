//! Signatures. Every signature is ed25519 over a domain-separated ASCII statement, so
//! a signature made for one purpose can never be replayed as another:
//! - a release: `"halos.release.v1 " + <release digest>`, where the digest is
//!   `sha256:<64 lowercase hex>` of the release tar (the OCI layer digest);
//! - a ring pointer: `"halos.pointer.v1 " + hex(sha256(payload))`, the payload being
//!   the exact JSON bytes of the pointer layer, the hash written as 64 lowercase hex
//!   characters (not raw bytes: the statement stays printable and reproducible with
//!   `printf 'halos.pointer.v1 %s' "$(sha256sum < payload | cut -d' ' -f1)"`).
//!
//! A key id is the first 16 hex characters of sha256(raw 32-byte public key); it only
//! names the key in annotations and messages, and is never trusted for verification.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::{Signer as _, SigningKey};

use crate::pack::sha256_hex;

pub const RELEASE_DOMAIN: &str = "halos.release.v1 ";
pub const POINTER_DOMAIN: &str = "halos.pointer.v1 ";

/// The statement a release signature covers.
pub fn release_statement(release_digest: &str) -> Vec<u8> {
    format!("{RELEASE_DOMAIN}{release_digest}").into_bytes()
}

/// The statement a pointer signature covers.
pub fn pointer_statement(payload: &[u8]) -> Vec<u8> {
    format!("{POINTER_DOMAIN}{}", sha256_hex(payload)).into_bytes()
}

/// The key id of a raw public key: the same id `halo keys generate` prints and halod's
/// `revokedKeys` lists.
pub fn key_id(public: &[u8; 32]) -> String {
    halo_policy::keys::key_id(&ed25519_compact::PublicKey::new(*public))
}

/// A release signer: the release key.
pub struct Signer {
    key: SigningKey,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("key_id", &self.key_id())
            .finish()
    }
}

impl Signer {
    pub fn new(key: SigningKey) -> Signer {
        Signer { key }
    }

    /// Base64 signature over `statement`.
    pub fn sign(&self, statement: &[u8]) -> String {
        STANDARD.encode(self.key.sign(statement).to_bytes())
    }

    pub fn public_key(&self) -> ed25519_compact::PublicKey {
        ed25519_compact::PublicKey::new(self.key.verifying_key().to_bytes())
    }

    pub fn key_id(&self) -> String {
        key_id(&self.key.verifying_key().to_bytes())
    }
}

/// Whether base64 `signature` is a valid signature over `statement` by any of `keys`.
pub fn verify_any(keys: &[ed25519_compact::PublicKey], statement: &[u8], signature: &str) -> bool {
    let Ok(bytes) = STANDARD.decode(signature.trim()) else {
        return false;
    };
    let Ok(sig) = ed25519_compact::Signature::from_slice(&bytes) else {
        return false;
    };
    keys.iter().any(|k| k.verify(statement, &sig).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_domain_separated() {
        let signer = Signer::new(SigningKey::from_bytes(&[7u8; 32]));
        let keys = [signer.public_key()];
        let digest = format!("sha256:{}", "ab".repeat(32));
        let sig = signer.sign(&release_statement(&digest));
        assert!(verify_any(&keys, &release_statement(&digest), &sig));
        // Not valid as a pointer signature, nor for another digest.
        assert!(!verify_any(
            &keys,
            &pointer_statement(digest.as_bytes()),
            &sig
        ));
        assert!(!verify_any(
            &keys,
            &release_statement(&format!("sha256:{}", "cd".repeat(32))),
            &sig
        ));
        let other = Signer::new(SigningKey::from_bytes(&[8u8; 32]));
        assert!(!verify_any(
            &[other.public_key()],
            &release_statement(&digest),
            &sig
        ));
        assert!(!verify_any(
            &keys,
            &release_statement(&digest),
            "not base64!"
        ));
        assert_eq!(
            pointer_statement(b"{}"),
            format!("halos.pointer.v1 {}", sha256_hex(b"{}")).into_bytes()
        );
    }
}
