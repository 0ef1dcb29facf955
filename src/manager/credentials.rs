//! Access-key credentials: ids, secret keys and how secrets are kept.
//!
//! An access key (`AK` + 18 characters of base32, Backend.AI's shape) is a public id; its secret
//! key (`kvs_` + 43 characters of base64url = 256 random bits from the OS) is the bearer token.
//! The store keeps only SHA-256 of the secret: with 256 bits of entropy a fast hash is enough
//! (no password-style stretching needed, as for GitHub's or Stripe's API tokens), and the
//! lookup by hash never touches the secret itself. The hash found is compared again in constant
//! time before a request is admitted.

use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What every secret key starts with, so scanners and people can tell it is one.
pub const SECRET_PREFIX: &str = "kvs_";

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).expect("the OS random source");
    b
}

/// A new access key id: `AK` + 18 base32 characters (90 random bits).
pub fn new_access_key() -> String {
    let bytes = random::<18>();
    let mut id = String::from("AK");
    id.extend(bytes.iter().map(|b| BASE32[(b & 31) as usize] as char));
    id
}

/// A new secret key: `kvs_` + base64url (no padding) of 32 random bytes.
pub fn new_secret_key() -> String {
    format!(
        "{SECRET_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random::<32>())
    )
}

/// SHA-256 of a secret key, lowercase hex (64 characters): what the store keeps.
pub fn secret_hash(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `secret` hashes to `stored`, compared in constant time.
pub fn verify(secret: &str, stored: &str) -> bool {
    secret_hash(secret)
        .as_bytes()
        .ct_eq(stored.as_bytes())
        .into()
}

/// Whether `s` has a secret key's shape (checked before any store lookup).
pub fn looks_like_secret(s: &str) -> bool {
    s.len() == SECRET_PREFIX.len() + 43
        && s.starts_with(SECRET_PREFIX)
        && s[SECRET_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_secrets_have_their_shapes_and_differ() {
        let (a, b) = (new_access_key(), new_access_key());
        assert!(a.starts_with("AK") && a.len() == 20 && a != b);
        assert!(a[2..].bytes().all(|c| BASE32.contains(&c)));
        let (s, t) = (new_secret_key(), new_secret_key());
        assert!(looks_like_secret(&s) && looks_like_secret(&t) && s != t);
        assert!(!looks_like_secret("kvs_short") && !looks_like_secret(&s.replace("kvs_", "xxx_")));
    }

    #[test]
    fn only_the_right_secret_verifies() {
        let s = new_secret_key();
        let h = secret_hash(&s);
        assert_eq!(h.len(), 64);
        assert!(!h.contains(&s[4..]));
        assert!(verify(&s, &h));
        assert!(!verify(&new_secret_key(), &h));
        assert!(!verify(&s, &h[..63]));
    }
}
