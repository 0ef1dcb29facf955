//! The first admin key. A manager whose store has no admin key creates one at start and writes
//! its secret to `[api] admin-token-file` (mode 0600, created, never rewritten), logging the
//! path, never the secret. When the file exists already (a fresh store behind an old file),
//! the file's secret becomes the new admin key's: the token an operator holds keeps working.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context as _;

use super::credentials;
use super::store::{Store, ROLE_ADMIN};

/// Makes sure the store has an admin key; returns its access key when one was created.
///
/// Errors: the store fails; the token file cannot be created, read, or holds something that
/// is not a secret key (the message names the file).
pub async fn ensure_admin_key(store: &Store, token_file: &Path) -> anyhow::Result<Option<String>> {
    if store.has_admin_key().await? {
        return Ok(None);
    }
    let secret = match std::fs::read_to_string(token_file) {
        Ok(text) => {
            let secret = text.trim().to_owned();
            anyhow::ensure!(
                credentials::looks_like_secret(&secret),
                "{}: not a kernelvisor secret key; remove it to have a new admin key made",
                token_file.display()
            );
            secret
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let secret = credentials::new_secret_key();
            write_new(token_file, &secret)
                .with_context(|| format!("api.admin-token-file {}", token_file.display()))?;
            secret
        }
        Err(e) => {
            return Err(e).with_context(|| format!("api.admin-token-file {}", token_file.display()))
        }
    };
    let access_key = credentials::new_access_key();
    store
        .create_access_key(
            &access_key,
            &credentials::secret_hash(&secret),
            ROLE_ADMIN,
            "bootstrap admin",
            0,
        )
        .await?;
    tracing::warn!(%access_key, token_file = %token_file.display(), "no admin key in the store: created one; its secret key is in the token file (keep it safe: it can do everything)");
    Ok(Some(access_key))
}

/// Creates `path` (and its directory) with mode 0600 and writes `secret` and a newline; an
/// existing file is an error, never overwritten.
fn write_new(path: &Path, secret: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(f, "{secret}")?;
    f.sync_all()
}
