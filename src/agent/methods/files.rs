//! File methods (the typed contract of [`crate::rpc::agent_api::files`]), paths relative to
//! `/home/work`, resolved through the engine's archive API; a file's bytes move straight to and
//! from the kernel's filesystem where the agent can reach it ([`crate::agent::files::direct`]),
//! else through the archive API too:
//!
//! - `upload_file(kernel_id, filename, filedata, opts=None)`: without `opts` (upstream),
//!   `filedata` is the whole file → nil. With `opts` = `{"upload_id", "size", "eof", "offset"}`
//!   the file comes in chunks: the first call of an `upload_id` declares the total `size`, each
//!   call queues its `filedata` (one with an `offset` after the bytes before it came: a caller
//!   may have several in flight), the call with `eof` true waits for the file to be written →
//!   `{"received": bytes}`.
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
//! Files are owned by the kernel's user (its `uid` / `main_gid`, else `[container]
//! kernel-uid` / `kernel-gid`), as its scratch directory is.
//!
//! A chunk's bytes are taken out of the decoded call and put into the reply as they are, not
//! copied through the typed contract's serde round trip (`upload_file`, `download_single`).
//!
//! FAILURE names: `InvalidPath`, `FileNotFound`, `TransferNotFound`, `FileTooLarge`,
//! `UploadSizeMismatch`, `KernelNotFound`, `KernelNotRunning`, `ContainerEngineError` (also a
//! failed read or write of the kernel's filesystem, e.g. a full disk),
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
use crate::rpc::agent_api::{decode_args, to_value, Method};
use crate::rpc::{Call, Dispatcher, ErrorMeta};

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

/// The running kernel's container and the owner of the files written for it: the kernel's
/// own `uid` / `main_gid`, else `[container] kernel-uid` / `kernel-gid` (as its scratch).
async fn container_of(
    ctx: &AgentContext,
    registry: &Addr<KernelRegistry>,
    kernel_id: &str,
) -> Res<(String, u64, u64)> {
    let info = running(registry, kernel_id).await?;
    // A file transfer is activity (idle reclaim, `agent/activity.rs`).
    ctx.activity.touch(kernel_id);
    let c = &ctx.config.container;
    Ok((
        info.container_id.unwrap_or_default(),
        u64::from(info.config.uid.unwrap_or(c.kernel_uid)),
        u64::from(info.config.main_gid.unwrap_or(c.kernel_gid)),
    ))
}

/// `upload_file`'s arguments, its `filedata` moved out of the call rather than copied through
/// the typed contract's serde round trip (a chunk is up to [`MAX_CHUNK`] bytes).
///
/// Errors: FAILURE `TypeError` naming a missing or mistyped argument.
fn upload_args(mut call: Call) -> Res<api::UploadFileArgs> {
    let data = match call.take_arg(2, "filedata") {
        Some(Value::Binary(b)) => Some(b),
        Some(other) => {
            // Not bytes (a `str`, nil): put back for the typed decoding to read or refuse.
            match call.args.get_mut(2) {
                Some(slot) => *slot = other,
                None => call.kwargs.push(("filedata".into(), other)),
            }
            None
        }
        None => None,
    };
    let mut args = decode_args::<api::UploadFile>(&call)
        .map_err(|e| type_error(format!("{}(): {e}", api::UploadFile::NAME)))?;
    if let Some(data) = data {
        args.filedata = api::Blob(data);
    }
    Ok(args)
}

async fn upload(
    ctx: &AgentContext,
    registry: &Addr<KernelRegistry>,
    args: api::UploadFileArgs,
) -> Res<Value> {
    let (container_id, uid, gid) = container_of(ctx, registry, &args.kernel_id).await?;
    let data = Bytes::from(args.filedata.0);
    let request = |size| UploadRequest {
        container_id: container_id.clone(),
        path: args.filename.clone(),
        size,
        uid,
        gid,
    };
    let Some(o) = given(args.opts) else {
        let id = uuid::Uuid::new_v4().simple().to_string();
        ctx.transfers
            .begin_upload(&ctx.backend, &id, request(data.len() as u64))
            .await
            .map_err(to_meta)?;
        ctx.transfers
            .upload_chunk(&id, data, true, None)
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
    let offset = match opt(&o, "offset") {
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| type_error("opts.offset must be a byte count".into()))?,
        ),
        None => None,
    };
    let received = ctx
        .transfers
        .upload_chunk(&id, data, eof, offset)
        .await
        .map_err(to_meta)?;
    Ok(to_value(&api::UploadProgress { received }))
}

async fn download_single(
    ctx: &AgentContext,
    registry: &Addr<KernelRegistry>,
    args: api::DownloadSingleArgs,
) -> Res<Value> {
    let (container_id, ..) = container_of(ctx, registry, &args.kernel_id).await?;
    let path = args.filepath;
    let Some(o) = given(args.opts) else {
        let data = whole::file(&ctx.backend, &container_id, &path, WHOLE_FILE_MAX)
            .await
            .map_err(to_meta)?;
        return Ok(Value::Binary(Vec::from(data)));
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
            let reply = api::DownloadChunkReply {
                download_id: s.download_id,
                size: Some(s.size),
                mode: Some(s.mode),
                mtime: Some(s.mtime as f64),
                data: api::Blob::default(),
                eof,
            };
            Ok(with_data(&reply, s.data))
        }
        Some(id) => {
            let (data, eof) = ctx
                .transfers
                .download_chunk(id, chunk)
                .await
                .map_err(to_meta)?;
            let reply = api::DownloadChunkReply {
                download_id: (!eof).then(|| id.to_owned()),
                eof,
                ..Default::default()
            };
            Ok(with_data(&reply, data))
        }
    }
}

/// `reply` as its msgpack map with `data` as its `data` (moved in, not copied through serde).
fn with_data(reply: &api::DownloadChunkReply, data: Bytes) -> Value {
    let mut v = to_value(reply);
    if let Value::Map(fields) = &mut v {
        if let Some((_, slot)) = fields.iter_mut().find(|(k, _)| k.as_str() == Some("data")) {
            *slot = Value::Binary(Vec::from(data));
        }
    }
    v
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
    let (container_id, ..) = container_of(ctx, registry, &args.kernel_id).await?;
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
        .raw(api::UploadFile::NAME, |cx, call| async move {
            cx.engine.check()?;
            upload(&cx, &cx.registry, upload_args(call)?).await
        })
        .method::<api::DownloadFile, _, _>(download_file)
        // Raw: the typed registration would copy the reply's data through serde again.
        .raw(api::DownloadSingle::NAME, |cx, call| async move {
            cx.engine.check()?;
            let args = decode_args::<api::DownloadSingle>(&call)
                .map_err(|e| type_error(format!("{}(): {e}", api::DownloadSingle::NAME)))?;
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
    let (container_id, ..) = container_of(&cx, &cx.registry, &args.kernel_id).await?;
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
