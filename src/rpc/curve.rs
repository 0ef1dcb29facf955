//! CurveZMQ keys and certificate files in the `zmq.auth` format.
//!
//! pyzmq's `zmq.auth.create_certificates(dir, name)` writes `name.key` (public) and
//! `name.key_secret` (public + secret, mode 0600): comment lines, a `metadata` section and a
//! `curve` section with `public-key = "<Z85>"` / `secret-key = "<Z85>"`. Backend.AI's agent reads
//! `rpc-auth-manager-public-key` and `rpc-auth-agent-keypair` from such files, so we do too, and
//! `zmq.auth.load_certificate` reads the files we write.

use std::fmt;
use std::path::{Path, PathBuf};

/// A CURVE25519 key: 32 raw bytes (40 characters in Z85).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CurveKey(pub [u8; 32]);

impl CurveKey {
    /// Parses a Z85-encoded key (40 characters).
    ///
    /// Errors: wrong length or a character outside Z85's alphabet.
    pub fn from_z85(s: &str) -> Result<Self, KeyError> {
        let raw = zmq::z85_decode(s).map_err(|e| KeyError::Invalid(format!("not Z85: {e:?}")))?;
        let bytes: [u8; 32] = raw
            .try_into()
            .map_err(|v: Vec<u8>| KeyError::Invalid(format!("{} bytes, expected 32", v.len())))?;
        Ok(CurveKey(bytes))
    }

    /// The Z85 form, 40 characters.
    pub fn to_z85(&self) -> String {
        zmq::z85_encode(&self.0).expect("32 bytes are a multiple of 4, always encodable")
    }
}

impl fmt::Debug for CurveKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CurveKey({})", self.to_z85())
    }
}

/// A public key with its secret key.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPair {
    /// The public half, shared with peers.
    pub public: CurveKey,
    /// The secret half; never logged.
    pub secret: CurveKey,
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPair")
            .field("public", &self.public)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl KeyPair {
    /// Generates a fresh key pair with libzmq (libsodium).
    ///
    /// Errors: libzmq built without CURVE (`ENOTSUP`).
    pub fn generate() -> Result<Self, KeyError> {
        let pair = zmq::CurveKeyPair::new()
            .map_err(|e| KeyError::Invalid(format!("libzmq cannot make CURVE keys: {e}")))?;
        Ok(KeyPair {
            public: CurveKey(pair.public_key),
            secret: CurveKey(pair.secret_key),
        })
    }
}

/// Why a key or certificate file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The certificate file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file has no `public-key` (or, where one is required, no `secret-key`).
    #[error("{path}: no `{field}` in the certificate")]
    Missing {
        /// The certificate file.
        path: PathBuf,
        /// `public-key` or `secret-key`.
        field: &'static str,
    },
    /// A key is not 32 bytes of valid Z85.
    #[error("invalid CURVE key: {0}")]
    Invalid(String),
}

/// The keys found in one certificate file.
#[derive(Clone, Debug)]
pub struct Certificate {
    /// `public-key`.
    pub public: CurveKey,
    /// `secret-key`, present only in `.key_secret` files.
    pub secret: Option<CurveKey>,
}

/// Reads a `zmq.auth` certificate file, as `zmq.auth.load_certificate` does: `public-key` and
/// `secret-key` lines anywhere, values quoted or bare.
pub fn load_certificate(path: &Path) -> Result<Certificate, KeyError> {
    let text = std::fs::read_to_string(path).map_err(|source| KeyError::Io {
        path: path.into(),
        source,
    })?;
    let mut public = None;
    let mut secret = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
        match key.trim() {
            "public-key" => public = Some(CurveKey::from_z85(value)?),
            "secret-key" => secret = Some(CurveKey::from_z85(value)?),
            _ => {}
        }
    }
    let public = public.ok_or(KeyError::Missing {
        path: path.into(),
        field: "public-key",
    })?;
    Ok(Certificate { public, secret })
}

/// Reads a `.key_secret` file as a key pair.
///
/// Errors: as [`load_certificate`], or no `secret-key` in the file.
pub fn load_keypair(path: &Path) -> Result<KeyPair, KeyError> {
    let cert = load_certificate(path)?;
    let secret = cert.secret.ok_or(KeyError::Missing {
        path: path.into(),
        field: "secret-key",
    })?;
    Ok(KeyPair {
        public: cert.public,
        secret,
    })
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> KeyError + '_ {
    move |source| KeyError::Io {
        path: path.into(),
        source,
    }
}

fn certificate_text(pair: &KeyPair, with_secret: bool) -> String {
    let banner = if with_secret {
        "#   ZeroMQ CURVE **Secret** Certificate\n#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.\n"
    } else {
        "#   ZeroMQ CURVE Public Certificate\n#   Exchange securely, or use a secure mechanism to verify the contents\n#   of this file after exchange.\n"
    };
    let mut text = format!(
        "#   ****  Generated by kernelvisor keygen  ****\n{banner}\nmetadata\ncurve\n    public-key = \"{}\"\n",
        pair.public.to_z85()
    );
    if with_secret {
        text.push_str(&format!("    secret-key = \"{}\"\n", pair.secret.to_z85()));
    }
    text
}

/// Writes `dir/name.key` (public) and `dir/name.key_secret` (mode 0600), creating `dir`.
/// Returns both paths.
pub fn write_certificates(
    dir: &Path,
    name: &str,
    pair: &KeyPair,
) -> Result<(PathBuf, PathBuf), KeyError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let public = dir.join(format!("{name}.key"));
    let secret = dir.join(format!("{name}.key_secret"));
    std::fs::write(&public, certificate_text(pair, false)).map_err(io_error(&public))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&secret)
        .map_err(io_error(&secret))?;
    f.write_all(certificate_text(pair, true).as_bytes())
        .map_err(io_error(&secret))?;
    Ok((public, secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let pair = KeyPair::generate().unwrap();
        let (public, secret) = write_certificates(dir.path(), "agent", &pair).unwrap();
        let cert = load_certificate(&public).unwrap();
        assert_eq!(cert.public, pair.public);
        assert!(cert.secret.is_none());
        assert_eq!(load_keypair(&secret).unwrap(), pair);
        assert!(matches!(
            load_keypair(&public),
            Err(KeyError::Missing {
                field: "secret-key",
                ..
            })
        ));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn reads_pyzmq_layout_and_rejects_bad_keys() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.key");
        // Exactly as pyzmq writes it (the key is libzmq's documented test vector).
        std::fs::write(&p, "#   ****  Generated on 2024-01-01 by pyzmq  ****\n\nmetadata\ncurve\n    public-key = \"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7\"\n").unwrap();
        assert_eq!(
            load_certificate(&p).unwrap().public.to_z85(),
            "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
        );
        std::fs::write(&p, "curve\n    public-key = \"short\"\n").unwrap();
        assert!(matches!(load_certificate(&p), Err(KeyError::Invalid(_))));
        std::fs::write(&p, "curve\n").unwrap();
        assert!(matches!(
            load_certificate(&p),
            Err(KeyError::Missing {
                field: "public-key",
                ..
            })
        ));
    }
}
