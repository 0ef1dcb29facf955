//! File routes (paths relative to the kernel's `/home/work`):
//! `PUT /v1/sessions/{id}/files/{path}` (raw body, `Content-Length` required),
//! `GET /v1/sessions/{id}/files/{path}` (raw bytes), and `GET /v1/sessions/{id}/files?dir=PATH`.
//!
//! Bodies move in chunks of [`CHUNK`] bytes through the agent's `upload_file` /
//! `download_single` (chunked forms), a chunk's bytes moved into and out of the calls rather
//! than copied through serde. An upload has up to [`IN_FLIGHT`] chunks in transit to the agent
//! and the next being read; a download one chunk in transit to the client and the next being
//! fetched. The manager reads the request body only as fast as the agent takes it, and the
//! agent only as fast as the client reads.

use std::collections::VecDeque;
use std::time::Duration;

use actix_web::http::header;
use actix_web::{get, put, web, HttpRequest, HttpResponse};
use bytes::Bytes;
use futures::StreamExt;
use rmpv::Value;
use serde::Deserialize;

use super::auth::Caller;
use super::responses;
use super::{reply, running_kernel, ApiState, KernelQuery, Res, KERNEL_PARAM};
use crate::manager::calls::{agent_error, call_agent, call_method};
use crate::manager::error::ManagerError;
use crate::manager::store::KernelRow;
use crate::model::error::ErrorBody;
use crate::model::file::{Binary, FileEntry, FileList, Uploaded};
use crate::rpc::agent_api::files::{
    DownloadChunk, DownloadChunkReply, DownloadOpts, ListFilesArgs, ListFilesRich, UploadChunk,
    UploadOpts, UploadProgress,
};
use crate::rpc::agent_api::{from_value, to_value, Method};

/// Bytes per agent call (1 MiB: a larger chunk moves no faster, each stage holding it whole
/// before the next starts, and costs memory).
pub const CHUNK: usize = 1 << 20;

/// Chunks of one upload in flight to the agent at once (after its first): a chunk's round trip
/// through both processes' ZeroMQ and CURVE stages is otherwise the upload's pace.
const IN_FLIGHT: usize = 3;

/// Deadline of one chunk's call (it may wait for a slow engine).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Calls `M` with its arguments already as msgpack values (a chunk's bytes are moved into the
/// call, not copied through serde); its raw answer.
async fn call_raw<M: Method>(
    s: &ApiState,
    k: &KernelRow,
    args: Vec<Value>,
) -> Result<Value, ManagerError> {
    call_agent(
        &s.pool,
        &s.metrics,
        &k.agent_id,
        M::NAME,
        args,
        CALL_TIMEOUT,
    )
    .await
    .map_err(|e| agent_error(&e))
}

/// A chunked `download_single`'s answer and its data, moved out of the answer.
fn download_reply(v: Value) -> Result<(DownloadChunkReply, Bytes), ManagerError> {
    let mut v = v;
    let mut data = Vec::new();
    if let Value::Map(fields) = &mut v {
        if let Some((_, Value::Binary(b))) =
            fields.iter_mut().find(|(k, _)| k.as_str() == Some("data"))
        {
            data = std::mem::take(b);
        }
    }
    let reply = from_value::<DownloadChunkReply>(v)
        .map_err(|e| ManagerError::Internal(format!("the agent's download_single answer: {e}")))?;
    Ok((reply, Bytes::from(data)))
}

async fn call<M: Method>(
    s: &ApiState,
    k: &KernelRow,
    args: &M::Args,
) -> Result<M::Reply, ManagerError> {
    call_method::<M>(&s.pool, &s.metrics, &k.agent_id, args, CALL_TIMEOUT)
        .await
        .map_err(|e| agent_error(&e))
}

/// Writes the raw body to a file in the kernel (replacing it; missing directories are
/// created), in chunks; `Content-Length` is required.
#[utoipa::path(
    operation_id = "upload_file",
    tag = "files",
    params(
        ("id" = String, Path, description = "Session or kernel id"),
        ("path" = String, Path, description = "Path relative to /home/work (may contain `/`)"),
        ("kernel" = Option<String>, Query, description = KERNEL_PARAM),
    ),
    request_body(content = Binary, content_type = "application/octet-stream", description = "The file's bytes"),
    responses(
        (status = 201, description = "Written", body = Uploaded),
        (status = 400, description = "`invalid-path` (absolute, `..`, a symlink out of /home/work, a directory), `invalid-request` (the body could not be read, or its size is not `Content-Length`)", body = ErrorBody),
        (status = 404, description = "`session-not-found` (also a `kernel` that names no kernel of the session)", body = ErrorBody),
        (status = 411, description = "`length-required`: no `Content-Length`", body = ErrorBody),
        (status = 413, description = "`upload-too-large`: above `[api] max-upload-size`", body = ErrorBody),
        responses::NotRunning, responses::AgentFailed, responses::StartingUp,
    ),
)]
#[put("/v1/sessions/{id}/files/{path:.*}")]
pub(super) async fn upload(
    s: web::Data<ApiState>,
    caller: Caller,
    p: web::Path<(String, String)>,
    q: web::Query<KernelQuery>,
    req: HttpRequest,
    mut body: web::Payload,
) -> Res {
    let (id, path) = p.into_inner();
    let size: u64 = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            ManagerError::LengthRequired(
                "an upload needs a Content-Length header (the file's size in bytes)".into(),
            )
        })?;
    if size > s.max_upload_size {
        return Err(ManagerError::UploadTooLarge(format!(
            "{size} bytes is more than [api] max-upload-size ({} bytes)",
            s.max_upload_size
        )));
    }
    let k = running_kernel(&s, &caller, &id, q.kernel.as_deref()).await?;
    let upload_id = uuid::Uuid::new_v4().simple().to_string();
    let send = |data: Vec<u8>, first: bool, eof: bool, offset: u64| {
        let opts = UploadOpts {
            upload_id: upload_id.clone(),
            size: first.then_some(size),
            eof,
            offset: Some(offset),
        };
        // upload_file(kernel_id, filename, filedata, opts), the chunk moved in.
        let args = vec![
            Value::from(k.id.as_str()),
            Value::from(path.as_str()),
            Value::Binary(data),
            to_value(&opts),
        ];
        let (s, k) = (s.clone(), k.clone());
        async move {
            let v = call_raw::<UploadChunk>(&s, &k, args).await?;
            from_value::<UploadProgress>(v)
                .map_err(|e| ManagerError::Internal(format!("the agent's upload_file answer: {e}")))
        }
    };
    // The first chunk opens the upload and is answered before any other goes; then up to
    // IN_FLIGHT chunks are in flight at once while the next is read from the client (each
    // names its offset: the agent takes them in order, whatever order they come in).
    let mut in_flight: VecDeque<tokio::task::JoinHandle<Result<UploadProgress, ManagerError>>> =
        VecDeque::new();
    let mut buf = Vec::with_capacity(CHUNK.min(size as usize));
    let (mut first, mut offset) = (true, 0u64);
    while let Some(chunk) = body.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                for h in in_flight.drain(..) {
                    let _ = h.await;
                }
                if !first {
                    // Ends the agent's upload now (it is short: refused) rather than at its
                    // idle timeout.
                    let _ = send(Vec::new(), false, true, offset).await;
                }
                return Err(ManagerError::InvalidRequest(format!(
                    "reading the request body: {e}"
                )));
            }
        };
        // Each byte is copied once, into the chunk that goes to the agent as it is.
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            let n = rest.len().min(CHUNK - buf.len());
            buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if buf.len() == CHUNK {
                let part = std::mem::replace(&mut buf, Vec::with_capacity(CHUNK));
                let at = offset;
                offset += part.len() as u64;
                if first {
                    send(part, true, false, at).await?;
                    first = false;
                    continue;
                }
                if in_flight.len() == IN_FLIGHT {
                    if let Some(h) = in_flight.pop_front() {
                        joined(h.await)?;
                    }
                }
                in_flight.push_back(actix_rt::spawn(send(part, false, false, at)));
            }
        }
    }
    for h in in_flight.drain(..) {
        joined(h.await)?;
    }
    send(buf, first, true, offset).await?;
    reply(HttpResponse::Created(), &Uploaded { path, size })
}

/// A file's bytes, with `Content-Length`, streamed in chunks.
#[utoipa::path(
    operation_id = "download_file",
    tag = "files",
    params(
        ("id" = String, Path, description = "Session or kernel id"),
        ("path" = String, Path, description = "Path relative to /home/work (may contain `/`)"),
        ("kernel" = Option<String>, Query, description = KERNEL_PARAM),
    ),
    responses(
        (status = 200, description = "The file", body = Binary, content_type = "application/octet-stream"),
        (status = 400, description = "`invalid-path` (absolute, `..`, a symlink out of /home/work, a directory)", body = ErrorBody),
        (status = 404, description = "`session-not-found` (also a `kernel` that names no kernel of the session), `file-not-found`", body = ErrorBody),
        responses::NotRunning, responses::AgentFailed, responses::StartingUp,
    ),
)]
#[get("/v1/sessions/{id}/files/{path:.*}")]
pub(super) async fn download(
    s: web::Data<ApiState>,
    caller: Caller,
    p: web::Path<(String, String)>,
    q: web::Query<KernelQuery>,
) -> Res {
    let (id, path) = p.into_inner();
    let k = running_kernel(&s, &caller, &id, q.kernel.as_deref()).await?;
    // download_single(kernel_id, filepath, opts); the answer's data is moved out, not copied.
    let args = |download_id: Option<String>| {
        vec![
            Value::from(k.id.as_str()),
            Value::from(path.as_str()),
            to_value(&DownloadOpts {
                download_id,
                chunk_size: CHUNK as u64,
            }),
        ]
    };
    let (first, data) = download_reply(call_raw::<DownloadChunk>(&s, &k, args(None)).await?)?;
    let size = first.size.unwrap_or(0);
    let next_id = first.download_id;
    // Each chunk is fetched while the one before goes to the client (at most two held).
    let fetch = {
        let (s, k, path) = (s.clone(), k.clone(), path.clone());
        move |id: String| {
            let (s, k, path) = (s.clone(), k.clone(), path.clone());
            actix_rt::spawn(async move {
                let args = vec![
                    Value::from(k.id.as_str()),
                    Value::from(path.as_str()),
                    to_value(&DownloadOpts {
                        download_id: Some(id),
                        chunk_size: CHUNK as u64,
                    }),
                ];
                let (v, data) = download_reply(call_raw::<DownloadChunk>(&s, &k, args).await?)?;
                Ok::<_, ManagerError>((data, v.download_id))
            })
        }
    };
    let rest = futures::stream::unfold(next_id.map(&fetch), move |pending| {
        let fetch = fetch.clone();
        async move {
            match joined(pending?.await) {
                Ok((data, next)) => Some((Ok::<_, actix_web::Error>(data), next.map(fetch))),
                // The response has begun: all that is left is to cut it (the client sees a
                // short body against Content-Length).
                Err(e) => Some((Err(actix_web::error::ErrorBadGateway(e.to_string())), None)),
            }
        }
    })
    .filter(|r| futures::future::ready(!matches!(r, Ok(b) if b.is_empty())));
    let stream = futures::stream::once(async move { Ok::<_, actix_web::Error>(data) })
        .filter(|r| futures::future::ready(!matches!(r, Ok(b) if b.is_empty())))
        .chain(rest);
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        .no_chunking(size)
        .streaming(stream))
}

/// A spawned chunk call's result (a task that panicked or was cancelled is `internal`).
fn joined<T>(
    r: Result<Result<T, ManagerError>, tokio::task::JoinError>,
) -> Result<T, ManagerError> {
    r.map_err(|e| ManagerError::Internal(format!("chunk transfer task: {e}")))?
}

/// `?dir=PATH` of a listing.
#[derive(Debug, Deserialize)]
pub(super) struct ListQuery {
    #[serde(default)]
    dir: String,
    /// [`KernelQuery::kernel`].
    #[serde(default)]
    kernel: Option<String>,
}

/// A directory's entries (at most 10 000, sorted by name), read from the engine's archive API
/// (no tool of the image is needed).
#[utoipa::path(
    operation_id = "list_files",
    tag = "files",
    params(
        ("id" = String, Path, description = "Session or kernel id"),
        ("dir" = Option<String>, Query, description = "Directory relative to /home/work (default: /home/work)"),
        ("kernel" = Option<String>, Query, description = KERNEL_PARAM),
    ),
    responses(
        (status = 200, description = "The entries", body = FileList),
        (status = 400, description = "`invalid-path`, `invalid-request`", body = ErrorBody),
        (status = 404, description = "`session-not-found` (also a `kernel` that names no kernel of the session), `file-not-found`", body = ErrorBody),
        responses::NotRunning, responses::AgentFailed, responses::StartingUp,
    ),
)]
#[get("/v1/sessions/{id}/files")]
pub(super) async fn list(
    s: web::Data<ApiState>,
    caller: Caller,
    id: web::Path<String>,
    q: web::Query<ListQuery>,
) -> Res {
    let k = running_kernel(&s, &caller, &id, q.kernel.as_deref()).await?;
    // `opts` (any map) asks for kernelvisor's rich listing; without it the agent answers
    // upstream's `{"files": JSON text, "errors", "abspath"}`.
    let args = ListFilesArgs {
        kernel_id: k.id.clone(),
        path: Some(q.dir.clone()),
        opts: Some(Value::Map(vec![])),
    };
    let out = call::<ListFilesRich>(&s, &k, &args).await?;
    let files = out
        .files
        .iter()
        .map(|f| FileEntry {
            name: f.name.clone(),
            file_type: Some(f.kind.clone()),
            size: Some(f.size),
            mode: Some(format!("{:04o}", f.mode)),
            mtime: Some(f.mtime),
        })
        .collect();
    reply(
        HttpResponse::Ok(),
        &FileList {
            files,
            truncated: out.truncated,
        },
    )
}
