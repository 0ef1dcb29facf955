//! File methods (the typed contract of [`crate::rpc::agent_api::files`]), paths relative to
//! `/home/work`, all through the engine's archive API:
//!
//! - `upload_file(kernel_id, filename, filedata, opts=None)`: without `opts` (upstream),
//!   `filedata` is the whole file → nil. With `opts` = `{"upload_id", "size", "eof"}` the file
//!   comes in chunks: the first call of an `upload_id` declares the total `size`, each call
//!   queues its `filedata`, the call with `eof` true waits for the engine → `{"received":
//!   bytes}`.
//! - `download_file(kernel_id, filepath)` → the tar archive of the path (upstream), at most
//!   1 MiB of archive (else `FileTooLarge`).
//! - `download_single(kernel_id, filepath, opts=None)`: without `opts`, the file's bytes (at
//!   most [`WHOLE_FILE_MAX`], else `FileTooLarge`). With `opts` = `{"download_id",
//!   "chunk_size"}` (no id: a new download) → `{"download_id" (nil once done), "size", "mode",
//!   "mtime", "data", "eof"}`, `data` at most `chunk_size` (≤ [`MAX_CHUNK`]) bytes.
//! - `list_files(kernel_id, path, opts=None)`: without `opts`, upstream's `{"files": JSON text,
//!   "errors", "abspath"}` (a path that is missing or not a directory answers empty `files`
//!   and the reason in `errors`, as upstream's in-kernel script does); with `opts` (a map),
//!   `{"files": [{"name", "type", "size", "mode", "mtime"}], "truncated"}`.
//!
//! FAILURE names: `InvalidPath`, `FileNotFound`, `TransferNotFound`, `FileTooLarge`,
//! `UploadSizeMismatch`, `KernelNotFound`, `KernelNotRunning`, `ContainerEngineError`,
//! `ContainerEngineUnavailable`.

use actix::Addr;
use bytes::Bytes;
use rmpv::Value;

use super::args::{running, type_error};
use super::{Ctx, Table};
use crate::agent::context::AgentContext;
use crate::agent::files::transfer::UploadRequest;
use crate::agent::files::{absolute, listing, whole, FileError};
use crate::agent::registry::KernelRegistry;
use crate::rpc::agent_api::files as api;
use crate::rpc::agent_api::to_value;
use crate::rpc::{Dispatcher, ErrorMeta};

/// Largest chunk one call moves (bytes).
pub const MAX_CHUNK: usize = 8 << 20;

/// Largest file `download_single` answers whole, without `opts` (bytes): upstream's cap.
pub const WHOLE_FILE_MAX: usize = api::DOWNLOAD_FILE_MAX;

type Res<T> = Result<T, ErrorMeta>;

fn to_meta(e: FileError) -> ErrorMeta {
    ErrorMeta::new(e.name(), e.to_string())
}

fn opt<'a>(opts: &'a Value, key: &str) -> Option<&'a Value> {
    opts.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
        .filter(|v| !v.is_nil())
}

/// `opts` unless nil.
fn given(opts: Option<Value>) -> Option<Value> {
    opts.filter(|o| !o.is_nil())
}

async fn container_of(registry: &Addr<KernelRegistry>, kernel_id: &str) -> Res<String> {
    Ok(running(registry, kernel_id)
        .await?
        .container_id
        .unwrap_or_default())
}

async fn upload(
    ctx: &AgentContext,
    registry: &Addr<KernelRegistry>,
    args: api::UploadFileArgs,
) -> Res<Value> {
    let container_id = container_of(registry, &args.kernel_id).await?;
    let data = Bytes::from(args.filedata.0);
    let c = &ctx.config.container;
    let request = |size| UploadRequest {
        container_id: container_id.clone(),
        path: args.filename.clone(),
        size,
        uid: u64::from(c.kernel_uid),
        gid: u64::from(c.kernel_gid),
    };
    let Some(o) = given(args.opts) else {
        let id = uuid::Uuid::new_v4().simple().to_string();
        ctx.transfers
            .begin_upload(&ctx.backend, &id, request(data.len() as u64))
            .await
            .map_err(to_meta)?;
        ctx.transfers
            .upload_chunk(&id, data, true)
            .await
            .map_err(to_meta)?;
        return Ok(Value::Nil);
    };
    if data.len() > MAX_CHUNK {
        return Err(type_error(format!(
            "a chunk of {} bytes is more than {MAX_CHUNK}",
            data.len()
        )));
    }
    let id = opt(&o, "upload_id")
        .and_then(Value::as_str)
        .ok_or_else(|| type_error("opts.upload_id (string) is required".into()))?
        .to_owned();
    let eof = opt(&o, "eof").and_then(Value::as_bool).unwrap_or(false);
    if let Some(size) = opt(&o, "size") {
        let size = size
            .as_u64()
            .ok_or_else(|| type_error("opts.size must be a byte count".into()))?;
        ctx.transfers
            .begin_upload(&ctx.backend, &id, request(size))
            .await
            .map_err(to_meta)?;
    }
    let received = ctx
        .transfers
        .upload_chunk(&id, data, eof)
        .await
        .map_err(to_meta)?;
    Ok(to_value(&api::UploadProgress { received }))
}

async fn download_single(
    ctx: &AgentContext,
    registry: &Addr<KernelRegistry>,
    args: api::DownloadSingleArgs,
) -> Res<Value> {
    let container_id = container_of(registry, &args.kernel_id).await?;
    let path = args.filepath;
    let Some(o) = given(args.opts) else {
        let data = whole::file(&ctx.backend, &container_id, &path, WHOLE_FILE_MAX)
            .await
            .map_err(to_meta)?;
        return Ok(Value::Binary(data.to_vec()));
    };
    let chunk = opt(&o, "chunk_size")
        .and_then(Value::as_u64)
        .map_or(1 << 20, |c| c as usize)
        .clamp(1, MAX_CHUNK);
    match opt(&o, "download_id").and_then(Value::as_str) {
        None => {
            let s = ctx
                .transfers
                .begin_download(&ctx.backend, &container_id, &path, chunk)
                .await
                .map_err(to_meta)?;
            let eof = s.download_id.is_none();
            Ok(to_value(&api::DownloadChunkReply {
                download_id: s.download_id,
                size: Some(s.size),
                mode: Some(s.mode),
                mtime: Some(s.mtime as f64),
                data: api::Blob(s.data.to_vec()),
                eof,
            }))
        }
        Some(id) => {
            let (data, eof) = ctx
                .transfers
                .download_chunk(id, chunk)
                .await
                .map_err(to_meta)?;
            Ok(to_value(&api::DownloadChunkReply {
                download_id: (!eof).then(|| id.to_owned()),
                data: api::Blob(data.to_vec()),
                eof,
                ..Default::default()
            }))
        }
    }
}

/// Upstream's answer for a listing that could not be made: what its in-kernel script printed
/// on stderr (`FileNotFoundError`, `NotADirectoryError`).
fn upstream_error(e: &FileError, path: &str) -> Option<String> {
    let abs = match crate::agent::files::components(path) {
        Ok(parts) => absolute(&parts),
        Err(_) => return None,
    };
    match e {
        FileError::NotFound(_) => Some(format!(
            "FileNotFoundError: [Errno 2] No such file or directory: '{abs}'\n"
        )),
        FileError::InvalidPath(m) if m.ends_with("is not a directory") => Some(format!(
            "NotADirectoryError: [Errno 20] Not a directory: '{abs}'\n"
        )),
        _ => None,
    }
}

async fn list(
    ctx: &AgentContext,
    registry: &Addr<KernelRegistry>,
    args: api::ListFilesArgs,
) -> Res<Value> {
    let container_id = container_of(registry, &args.kernel_id).await?;
    let path = args.path.unwrap_or_default();
    let result = listing::list(&ctx.backend, &container_id, &path).await;
    if given(args.opts).is_some() {
        let l = result.map_err(to_meta)?;
        return Ok(to_value(&api::RichListing {
            files: l
                .files
                .iter()
                .map(|f| api::RichEntry {
                    name: f.name.clone(),
                    kind: f.kind.to_owned(),
                    size: f.size,
                    mode: f.mode,
                    mtime: f.mtime as f64,
                })
                .collect(),
            truncated: l.truncated,
        }));
    }
    let reply = match result {
        Ok(l) => api::ListFilesReply {
            files: listing::upstream_json(&l.files),
            errors: l.note.map(|n| n + "\n").unwrap_or_default(),
            abspath: path,
        },
        Err(e) => match upstream_error(&e, &path) {
            Some(errors) => api::ListFilesReply {
                files: String::new(),
                errors,
                abspath: path,
            },
            None => return Err(to_meta(e)),
        },
    };
    Ok(crate::rpc::agent_api::to_value(&reply))
}

/// Registers the file methods on `dispatcher`; each first refuses while the engine is down.
pub(crate) fn register(dispatcher: &mut Dispatcher, cx: &Ctx) {
    Table::new(dispatcher, cx.clone())
        .method::<api::UploadFile, _, _>(|cx, args| async move {
            cx.engine.check()?;
            upload(&cx, &cx.registry, args).await
        })
        .method::<api::DownloadFile, _, _>(download_file)
        .method::<api::DownloadSingle, _, _>(|cx, args| async move {
            cx.engine.check()?;
            download_single(&cx, &cx.registry, args).await
        })
        .method::<api::ListFiles, _, _>(|cx, args| async move {
            cx.engine.check()?;
            list(&cx, &cx.registry, args).await
        });
}

/// `download_file(kernel_id, filepath)`: the tar archive of the path, at most
/// [`api::DOWNLOAD_FILE_MAX`] bytes of it.
async fn download_file(cx: Ctx, args: api::DownloadFileArgs) -> Res<api::Blob> {
    cx.engine.check()?;
    let container_id = container_of(&cx.registry, &args.kernel_id).await?;
    let tar = whole::archive(
        &cx.backend,
        &container_id,
        &args.filepath,
        api::DOWNLOAD_FILE_MAX,
    )
    .await
    .map_err(to_meta)?;
    Ok(api::Blob(tar.to_vec()))
}
