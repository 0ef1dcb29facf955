//! TLS for the manager's HTTP API (`[api] tls-cert` / `tls-key`): the rustls server config,
//! built on the `ring` crypto provider (chosen here, not left to rustls' process default).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

/// The rustls server config for the API: the certificate chain of `cert` (PEM, the server's
/// certificate first, then any intermediates) and the private key of `key` (PEM: PKCS#8,
/// PKCS#1 or SEC1), TLS 1.2 and 1.3 with rustls' safe defaults, no client certificates (ALPN is
/// left to actix-web, which offers the protocols it serves).
///
/// Errors, each naming the file: it cannot be read; it holds no PEM certificate / private key;
/// its PEM is malformed; the key does not match the certificate or is of an unsupported kind.
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<ServerConfig> {
    let chain = read_certificates(cert)?;
    let key_der = read_private_key(key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions of the ring provider")?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .with_context(|| {
            format!(
                "api.tls-key {}: cannot be used with the certificate of api.tls-cert {}",
                key.display(),
                cert.display()
            )
        })
}

/// Every certificate of a PEM file, in order.
fn read_certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let what = || format!("api.tls-cert {}", path.display());
    let pem = std::fs::read(path).with_context(what)?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("invalid PEM: {e}"))
        .with_context(what)?;
    if chain.is_empty() {
        return Err(anyhow::anyhow!(
            "no PEM certificate (BEGIN CERTIFICATE) in it"
        ))
        .with_context(what);
    }
    Ok(chain)
}

/// The first private key of a PEM file.
fn read_private_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let what = || format!("api.tls-key {}", path.display());
    let pem = std::fs::read(path).with_context(what)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| match e {
            rustls::pki_types::pem::Error::NoItemsFound => anyhow::anyhow!(
                "no PEM private key (BEGIN PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY) in it"
            ),
            e => anyhow::anyhow!("invalid PEM: {e}"),
        })
        .with_context(what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_or_invalid_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let err = format!("{:#}", server_config(&missing, &junk).unwrap_err());
        assert!(
            err.starts_with(&format!("api.tls-cert {}: ", missing.display())),
            "{err}"
        );
        let err = format!("{:#}", server_config(&junk, &junk).unwrap_err());
        assert!(
            err.starts_with(&format!(
                "api.tls-cert {}: no PEM certificate",
                junk.display()
            )),
            "{err}"
        );
    }
}
