//! File methods (Backend.AI's names), paths relative to `/home/work`:
//!
//! - `upload_file(kernel_id, filename, filedata, opts=None)`: without `opts`, `filedata` is the
//!   whole file. With `opts` = `{"upload_id", "size", "eof"}` the file comes in chunks: the
//!   first call of an `upload_id` declares the total `size`, each call queues its `filedata`,
//!   the call with `eof` true waits for the engine. → `{"received": bytes}`.
//! - `download_single(kernel_id, filepath, opts=None)`: without `opts`, the file's bytes (at
//!   most [`WHOLE_FILE_MAX`], else `FileTooLarge`). With `opts` = `{"download_id", "chunk_size"}`
//!   (no id: a new download) → `{"download_id" (nil once done), "size", "mode", "mtime",
//!   "data", "eof"}`, `data` at most `chunk_size` (≤ [`MAX_CHUNK`]) bytes.
//! - `list_files(kernel_id, path)` → `{"files": [{"name", "type", "size", "mode", "mtime"}],
//!   "truncated"}`.
//!
//! FAILURE names: `InvalidPath`, `FileNotFound`, `TransferNotFound`, `FileTooLarge`,
//! `UploadSizeMismatch`, `KernelNotFound`, `KernelNotRunning`, `ContainerEngineError`.

use std::sync::Arc;

use actix::Addr;
use bytes::Bytes;
use rmpv::Value;

use super::args::{running, str_arg, type_error};
use crate::agent::context::AgentContext;
use crate::agent::files::transfer::UploadRequest;
use crate::agent::files::{listing, FileError};
use crate::agent::registry::KernelRegistry;
use crate::rpc::{Call, Dispatcher, ErrorMeta};

/// Largest chunk one call moves (bytes).
pub const MAX_CHUNK: usize = 8 << 20;

/// Largest file `download_single` answers whole, without `opts` (bytes).
pub const WHOLE_FILE_MAX: usize = 1 << 20;

fn to_meta(e: FileError) -> ErrorMeta {
    ErrorMeta::new(e.name(), e.to_string())
}

fn opt<'a>(opts: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    opts?
        .as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
        .filter(|v| !v.is_nil())
}

/// Moves the binary (or string) argument out of the call: a chunk is not copied.
fn data_arg(call: &mut Call, i: usize, name: &str) -> Result<Bytes, ErrorMeta> {
    match call.take_arg(i, name) {
        Some(Value::Binary(b)) => Ok(Bytes::from(b)),
        Some(Value::String(s)) => Ok(Bytes::from(s.into_bytes())),
        Some(Value::Nil) | None => Ok(Bytes::new()),
        Some(_) => Err(type_error(format!("argument '{name}' must be bytes"))),
    }
}

async fn container_of(registry: &Addr<KernelRegistry>, call: &Call) -> Result<String, ErrorMeta> {
    let kernel_id = str_arg(call, 0, "kernel_id")?;
    Ok(running(registry, &kernel_id)
        .await?
        .container_id
        .unwrap_or_default())
}

async fn upload(
    ctx: &AgentContext,
    registry: &Addr<KernelRegistry>,
    mut call: Call,
) -> Result<Value, ErrorMeta> {
    let container_id = container_of(registry, &call).await?;
    let path = str_arg(&call, 1, "filename")?;
    let opts = call.arg(3, "opts").cloned();
    let data = data_arg(&mut call, 2, "filedata")?;
    let opts = opts.as_ref().filter(|o| !o.is_nil());
    let c = &ctx.config.container;
    let request = |size| UploadRequest {
        container_id: container_id.clone(),
        path: path.clone(),
        size,
        uid: u64::from(c.kernel_uid),
        gid: u64::from(c.kernel_gid),
    };
    let received = match opts {
        None => {
            let id = uuid::Uuid::new_v4().simple().to_string();
            ctx.transfers
                .begin_upload(&ctx.backend, &id, request(data.len() as u64))
                .await
                .map_err(to_meta)?;
            ctx.transfers
                .upload_chunk(&id, data, true)
                .await
                .map_err(to_meta)?
        }
        Some(o) => {
            if data.len() > MAX_CHUNK {
                return Err(type_error(format!(
                    "a chunk of {} bytes is more than {MAX_CHUNK}",
                    data.len()
                )));
            }
            let id = opt(Some(o), "upload_id")
                .and_then(Value::as_str)
                .ok_or_else(|| type_error("opts.upload_id (string) is required".into()))?
                .to_owned();
            let eof = opt(Some(o), "eof")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if let Some(size) = opt(Some(o), "size") {
                let size = size
                    .as_u64()
                    .ok_or_else(|| type_error("opts.size must be a byte count".into()))?;
                ctx.transfers
                    .begin_upload(&ctx.backend, &id, request(size))
                    .await
                    .map_err(to_meta)?;
            }
            ctx.transfers
                .upload_chunk(&id, data, eof)
                .await
                .map_err(to_meta)?
        }
    };
    Ok(Value::Map(vec![("received".into(), received.into())]))
}

async fn download(
    ctx: &AgentContext,
    registry: &Addr<KernelRegistry>,
    call: Call,
) -> Result<Value, ErrorMeta> {
    let container_id = container_of(registry, &call).await?;
    let path = str_arg(&call, 1, "filepath")?;
    let opts = call.arg(2, "opts").filter(|o| !o.is_nil());
    let Some(o) = opts else {
        let start = ctx
            .transfers
            .begin_download(&ctx.backend, &container_id, &path, WHOLE_FILE_MAX)
            .await
            .map_err(to_meta)?;
        if start.download_id.is_some() {
            return Err(to_meta(FileError::TooLarge(format!(
                "`{path}` is {} bytes, more than {WHOLE_FILE_MAX} for a whole-file answer; pass opts to download it in chunks",
                start.size
            ))));
        }
        return Ok(Value::Binary(start.data.to_vec()));
    };
    let chunk = opt(Some(o), "chunk_size")
        .and_then(Value::as_u64)
        .map_or(1 << 20, |c| c as usize)
        .clamp(1, MAX_CHUNK);
    match opt(Some(o), "download_id").and_then(Value::as_str) {
        None => {
            let s = ctx
                .transfers
                .begin_download(&ctx.backend, &container_id, &path, chunk)
                .await
                .map_err(to_meta)?;
            let eof = s.download_id.is_none();
            Ok(Value::Map(vec![
                (
                    "download_id".into(),
                    s.download_id.map_or(Value::Nil, Value::from),
                ),
                ("size".into(), s.size.into()),
                ("mode".into(), s.mode.into()),
                ("mtime".into(), s.mtime.into()),
                ("data".into(), Value::Binary(s.data.to_vec())),
                ("eof".into(), eof.into()),
            ]))
        }
        Some(id) => {
            let (data, eof) = ctx
                .transfers
                .download_chunk(id, chunk)
                .await
                .map_err(to_meta)?;
            Ok(Value::Map(vec![
                (
                    "download_id".into(),
                    if eof { Value::Nil } else { id.into() },
                ),
                ("data".into(), Value::Binary(data.to_vec())),
                ("eof".into(), eof.into()),
            ]))
        }
    }
}

async fn list(
    ctx: &AgentContext,
    registry: &Addr<KernelRegistry>,
    call: Call,
) -> Result<Value, ErrorMeta> {
    let container_id = container_of(registry, &call).await?;
    let path = match call.arg(1, "path") {
        None | Some(Value::Nil) => String::new(),
        Some(_) => str_arg(&call, 1, "path")?,
    };
    let l = listing::list(&ctx.backend, &container_id, &path)
        .await
        .map_err(to_meta)?;
    let files = l
        .files
        .iter()
        .map(|f| {
            Value::Map(vec![
                ("name".into(), f.name.clone().into()),
                ("type".into(), f.kind.into()),
                ("size".into(), f.size.into()),
                ("mode".into(), f.mode.into()),
                ("mtime".into(), f.mtime.into()),
            ])
        })
        .collect();
    Ok(Value::Map(vec![
        ("files".into(), Value::Array(files)),
        ("truncated".into(), l.truncated.into()),
    ]))
}

/// Registers the file methods on `dispatcher`.
pub fn register(
    dispatcher: &mut Dispatcher,
    ctx: Arc<AgentContext>,
    registry: Addr<KernelRegistry>,
) {
    let (r, c) = (registry.clone(), ctx.clone());
    dispatcher.register("upload_file", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            c.engine.check()?;
            upload(&c, &r, call).await
        }
    });
    let (r, c) = (registry.clone(), ctx.clone());
    dispatcher.register("download_single", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            c.engine.check()?;
            download(&c, &r, call).await
        }
    });
    let (r, c) = (registry, ctx);
    dispatcher.register("list_files", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            c.engine.check()?;
            list(&c, &r, call).await
        }
    });
}
