//! A cluster session's SSH keypair: RSA-2048, its public half an `authorized_keys` line
//! (comment `work@cluster.backend.ai.local`) and its private half PKCS#1 PEM, as Backend.AI's
//! manager makes it (`manager/sokovan/scheduler/launcher/launcher.py`,
//! `_create_cluster_ssh_keypair`). Every kernel of the session gets it in `ClusterInfo`'s
//! `ssh_keypair`; the agent writes it as `config/ssh/id_cluster{,.pub}` and the kernel runner
//! lets the kernels ssh to each other with it.

use rsa::pkcs1::{EncodeRsaPrivateKey, LineEnding};
use rsa::rand_core::OsRng;
use std::sync::{Arc, OnceLock};

use crate::made_ahead::Pool;

/// The key's size in bits (upstream's).
pub const BITS: usize = 2048;

/// The comment of the public key (upstream's).
pub const COMMENT: &str = "work@cluster.backend.ai.local";

/// A session's keypair as `ClusterInfo.ssh_keypair` carries it (`ClusterSSHKeyPair`,
/// `ai.backend.common.types`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ClusterKeypair {
    /// `ssh-rsa AAAA… work@cluster.backend.ai.local`.
    pub public_key: String,
    /// `-----BEGIN RSA PRIVATE KEY-----…`.
    pub private_key: String,
}

/// Keypairs kept ready once this process has made a cluster session (`just bench cluster`:
/// making one took most of a 16-kernel session's create, 97–139 ms p50).
pub const AHEAD: usize = 2;

/// A keypair for a new session, none other gets: one made ahead, else one made now (blocking:
/// call it off the actors' threads). The first call starts a [`Pool`] that keeps [`AHEAD`]
/// ready from then on, so a manager that never makes a cluster session makes no key.
///
/// Errors: as [`generate`]'s.
pub fn take() -> Result<ClusterKeypair, String> {
    static POOL: OnceLock<Arc<Pool<ClusterKeypair>>> = OnceLock::new();
    POOL.get_or_init(|| {
        Pool::new("cluster keypairs", AHEAD, || {
            generate().map_err(std::io::Error::other)
        })
    })
    .take()
    .map_err(|e| e.to_string())
}

/// Makes a fresh keypair (about 0.1–0.5 s of CPU: call it off the actors' threads).
///
/// Errors: the OS random source or the encoding failed (as text).
pub fn generate() -> Result<ClusterKeypair, String> {
    let key = rsa::RsaPrivateKey::new(&mut OsRng, BITS).map_err(|e| e.to_string())?;
    let private_key = key
        .to_pkcs1_pem(LineEnding::LF)
        .map_err(|e| e.to_string())?
        .to_string();
    let public =
        ssh_key::public::RsaPublicKey::try_from(key.to_public_key()).map_err(|e| e.to_string())?;
    let public_key = ssh_key::PublicKey::new(ssh_key::public::KeyData::Rsa(public), COMMENT)
        .to_openssh()
        .map_err(|e| e.to_string())?;
    Ok(ClusterKeypair {
        public_key,
        private_key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keypair_is_an_openssh_line_and_a_pkcs1_pem_of_one_key() {
        let k = generate().unwrap();
        assert!(k.public_key.starts_with("ssh-rsa AAAA"), "{}", k.public_key);
        assert!(k.public_key.ends_with(COMMENT));
        assert!(k
            .private_key
            .starts_with("-----BEGIN RSA PRIVATE KEY-----\n"));
        // The halves are one key: the private key's public half reads back as the line.
        use rsa::pkcs1::DecodeRsaPrivateKey;
        let back = rsa::RsaPrivateKey::from_pkcs1_pem(&k.private_key).unwrap();
        let line = ssh_key::PublicKey::new(
            ssh_key::public::KeyData::Rsa(
                ssh_key::public::RsaPublicKey::try_from(back.to_public_key()).unwrap(),
            ),
            COMMENT,
        )
        .to_openssh()
        .unwrap();
        assert_eq!(line, k.public_key);
        assert_eq!(rsa::traits::PublicKeyParts::size(&back), BITS / 8);
        assert_ne!(generate().unwrap(), k, "two sessions never share a key");
        // Taken from the pool: each one once.
        let (a, b) = (take().unwrap(), take().unwrap());
        assert_ne!(a, b);
        assert!(a.public_key.starts_with("ssh-rsa ") && b.private_key.contains("RSA PRIVATE KEY"));
    }
}
