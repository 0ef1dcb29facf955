//! Whole answers of bounded size: upstream's `download_file` (the engine's tar archive of a
//! path) and `download_single` (one file's bytes), each refused above a cap before more than
//! the cap is held.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;

use super::{absolute, open_file, resolve, FileError};
use crate::agent::backend::ContainerBackend;

/// The tar archive of `path` (a file, a symlink resolved inside `/home/work`, or a directory
/// with everything under it) as the engine writes it, at most `max` bytes.
///
/// Errors: [`FileError::TooLarge`] when the archive is longer than `max` (read no further);
/// [`FileError::InvalidPath`], [`FileError::NotFound`], [`FileError::Engine`].
pub async fn archive(
    backend: &Arc<dyn ContainerBackend>,
    container_id: &str,
    path: &str,
    max: usize,
) -> Result<Bytes, FileError> {
    let r = resolve(backend, container_id, path).await?;
    if !r.exists() {
        return Err(FileError::NotFound(path.to_owned()));
    }
    let mut stream = backend.archive_get(container_id, &absolute(&r.existing));
    let mut out = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if out.len() + chunk.len() > max {
            return Err(FileError::TooLarge(format!(
                "Too large archive file exceeding {}: the archive of `{path}` is more than {max} bytes",
                human(max)
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

/// The bytes of the regular file at `path`, at most `max` of them.
///
/// Errors: [`FileError::TooLarge`] for a larger file (its data is not read);
/// [`FileError::InvalidPath`] for a directory or another non-file; [`FileError::NotFound`],
/// [`FileError::Engine`].
pub async fn file(
    backend: &Arc<dyn ContainerBackend>,
    container_id: &str,
    path: &str,
    max: usize,
) -> Result<Bytes, FileError> {
    let (mut reader, entry) = open_file(backend, container_id, path).await?;
    if entry.size > max as u64 {
        return Err(FileError::TooLarge(format!(
            "`{path}` is {} bytes, more than {} for a whole-file answer; pass opts to download it in chunks",
            entry.size,
            human(max)
        )));
    }
    let mut out = BytesMut::with_capacity(entry.size as usize);
    while let Some(b) = reader.read_data(max).await? {
        out.extend_from_slice(&b);
    }
    Ok(out.freeze())
}

/// `1 MiB` for 1048576, else the byte count.
fn human(n: usize) -> String {
    if n % (1 << 20) == 0 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{n} bytes")
    }
}
