//! Session routes: create, list, get, destroy, execute, interrupt, logs. Every one acts only on the
//! caller's own sessions (an admin's: anyone's); another key's session answers exactly as a
//! missing one, 404 `session-not-found`.

use std::time::Duration;

use actix::Addr;
use actix_web::{delete, get, post, web, HttpResponse};
use serde::Deserialize;

use super::auth::Caller;
use super::responses;
use super::{
    count_error, must_run, not_in_grace, owned_kernel, reply, resolved_id, running_kernel,
    selected_kernel, session_of, session_view, ApiState, KernelQuery, Res, KERNEL_PARAM,
};
use crate::manager::calls::{agent_error, call_method, to_json};
use crate::manager::error::ManagerError;
use crate::manager::scheduler::{
    CreateSession, DestroySession, ExecuteInSession, LogsChunk, ReadLogs, Scheduler,
};
use crate::manager::store::KernelRow;
use crate::model::error::ErrorBody;
use crate::model::exec::{ExecuteAnswer, ExecuteBody};
use crate::model::object::Object;
use crate::model::session::{
    KernelStatus, Session, SessionCreated, SessionList, SessionRequest, Stage,
};
use crate::rpc::agent_api::exec::InterruptKernel;
use crate::rpc::agent_api::kernel::{GetKernel, KernelIdArgs};

/// Creates a session: places its kernel on the least-loaded `ALIVE` agent with enough free
/// slots and answers when the agent has answered; when nothing fits now (but an agent could
/// fit it in total) the session is queued `PENDING` with its `pending_reason` and
/// `queue_position`, unless the request says `"enqueue": false`. On any error nothing stays
/// reserved.
#[utoipa::path(
    operation_id = "create_session",
    tag = "sessions",
    request_body = SessionRequest,
    responses(
        (status = 201, description = "Created (`RUNNING`, `PULLING`), or queued (`PENDING`, with `pending_reason` and `queue_position`)", body = SessionCreated),
        (status = 400, description = "`invalid-request` (malformed JSON, a missing or ill-typed field, a bad slot amount, type, command or mount), `image-not-found`, `slots-exceed-capacity`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a user key naming another `access_key`", body = ErrorBody),
        (status = 404, description = "`access-key-not-found` (an admin naming an unknown key), `vfolder-not-found`", body = ErrorBody),
        (status = 409, description = "`no-capacity`: with `\"enqueue\": false`, every agent that could fit it is full now (or cordoned)", body = ErrorBody),
        (status = 429, description = "`concurrency-limit-exceeded`", body = ErrorBody),
        (status = 503, description = "`starting-up` (with `Retry-After`), `no-agents`, `store-unavailable`", body = ErrorBody),
        responses::AgentFailed,
    ),
)]
#[post("/v1/sessions")]
pub(super) async fn create(
    s: web::Data<ApiState>,
    caller: Caller,
    body: web::Json<Object<SessionRequest>>,
) -> Res {
    let r = async {
        not_in_grace(&s).await?;
        let request = body.into_inner().into_inner();
        check_service_ports(&request)?;
        check_environ(&request)?;
        let owner = match request.access_key.as_deref() {
            None => caller.access_key.clone(),
            Some(k) if k == caller.access_key => k.to_owned(),
            Some(k) => {
                // Creating on behalf of another key is an admin's act.
                caller.require_admin()?;
                k.to_owned()
            }
        };
        s.scheduler.send(CreateSession { owner, request }).await?
    }
    .await;
    let k = count_error(&s, r)?;
    let queue_position = match k.is_pending() {
        true => Some(s.store.new_queue_position(k.priority).await?),
        false => None,
    };
    let (k, view) = session_view(&s, &k).await?;
    let created = SessionCreated {
        pending_reason: k.pending_reason.clone().filter(|_| k.is_pending()),
        queue_position,
        session_id: k.session_id,
        kernel_id: k.id,
        agent_id: k.agent_id,
        status: view.status,
        cluster_size: view.cluster_size,
        cluster_mode: view.cluster_mode,
        kernels: view.kernels,
    };
    reply(HttpResponse::Created(), &created)
}

/// Requested service ports as the API documents them: names as an image's label may have them
/// (they name the service-def file), protocols `http`, `tcp` or `preopen`. The agent takes any
/// name and protocol (Backend.AI's manager may send others); this API does not.
///
/// Errors: 400 `invalid-request` naming the service port.
fn check_service_ports(request: &SessionRequest) -> Result<(), ManagerError> {
    for sp in &request.service_ports {
        crate::agent::services::defs::check_name(&sp.name).map_err(ManagerError::InvalidRequest)?;
        if let Some(p) = sp.protocol.as_deref() {
            if !matches!(p, "http" | "tcp" | "preopen") {
                return Err(ManagerError::InvalidRequest(format!(
                    "service port `{}`: protocol `{p}` must be `http`, `tcp` or `preopen`",
                    sp.name
                )));
            }
        }
    }
    Ok(())
}

/// The `environ` entries a container can start with: names as POSIX's portable ones
/// (`[A-Za-z_][A-Za-z0-9_]*`; `=` or a space in a name would change what the process sees), no
/// NUL byte in a value, and a `PATH` that is not empty (nothing in the image could be found: the
/// engine would fail the start with runc's `executable file not found`).
///
/// Errors: 400 `invalid-request` naming the entry.
fn check_environ(request: &SessionRequest) -> Result<(), ManagerError> {
    for (name, value) in &request.environ {
        let mut chars = name.chars();
        let portable = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        let problem = if !portable {
            "names are letters, digits and `_`, not starting with a digit"
        } else if value.contains('\0') {
            "a value cannot hold a NUL byte"
        } else if name == "PATH" && value.trim().is_empty() {
            "an empty PATH leaves the container nothing to run (leave PATH out to keep the image's)"
        } else {
            continue;
        };
        return Err(ManagerError::InvalidRequest(format!(
            "environ entry `{}`: {problem}",
            name.escape_debug()
        )));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    access_key: Option<String>,
    #[serde(default)]
    all: bool,
}

/// The caller's sessions; an admin sees everyone's, or one key's with `?access_key=`. A user
/// naming another key gets 403.
#[utoipa::path(
    operation_id = "list_sessions",
    tag = "sessions",
    params(
        ("access_key" = Option<String>, Query, description = "Only this key's sessions (another key's: admin only)"),
        ("all" = Option<bool>, Query, description = "Include `TERMINATED` sessions (default: live only)"),
    ),
    responses(
        (status = 200, description = "The sessions", body = SessionList),
        (status = 400, description = "`invalid-request`: an unknown or ill-typed query parameter", body = ErrorBody),
        (status = 403, description = "`forbidden`: a user key naming another `access_key`", body = ErrorBody),
        responses::StartingUp,
    ),
)]
#[get("/v1/sessions")]
pub(super) async fn list(s: web::Data<ApiState>, caller: Caller, q: web::Query<ListQuery>) -> Res {
    not_in_grace(&s).await?;
    let of = match q.access_key.as_deref() {
        Some(k) if !caller.may_act_for(k) => {
            caller.require_admin()?;
            Some(k)
        }
        Some(k) => Some(k),
        None if caller.admin => None,
        None => Some(caller.access_key.as_str()),
    };
    let rows = s.store.kernels(of, q.all).await?;
    let positions = match rows.iter().any(KernelRow::is_pending) {
        true => s.store.queue_positions().await?,
        false => Default::default(),
    };
    // A cluster session's other kernels: one query for every cluster session listed.
    let clusters: Vec<&str> = rows
        .iter()
        .filter(|k| k.cluster_size > 1 && !k.is_pending())
        .map(|k| k.session_id.as_str())
        .collect();
    let kernels = match clusters.is_empty() {
        true => Default::default(),
        false => s.store.cluster_kernels(&clusters).await?,
    };
    let sessions = rows
        .iter()
        .map(|k| {
            let all = kernels
                .get(&k.session_id)
                .map_or(std::slice::from_ref(k), Vec::as_slice);
            Session {
                queue_position: positions.get(&k.id).copied(),
                ..session_of(k, all)
            }
        })
        .collect();
    reply(HttpResponse::Ok(), &SessionList { sessions })
}

/// A session, by session or kernel id.
#[utoipa::path(
    operation_id = "get_session",
    tag = "sessions",
    params(("id" = String, Path, description = "Session or kernel id")),
    responses(
        (status = 200, description = "The session", body = Session),
        (status = 404, description = "`session-not-found` (also another key's session)", body = ErrorBody),
        responses::StartingUp,
    ),
)]
#[get("/v1/sessions/{id}")]
pub(super) async fn get(s: web::Data<ApiState>, caller: Caller, id: web::Path<String>) -> Res {
    not_in_grace(&s).await?;
    let k = owned_kernel(&s, &caller, &id).await?;
    let queue_position = match k.is_pending() {
        true => Some(s.store.queue_position(&k).await?),
        false => None,
    };
    // Named by any of its kernels: the session, its main kernel's stages.
    let (k, view) = session_view(&s, &k).await?;
    let live = live_view(&s, &k).await;
    let body = Session {
        stages: Some(live.stages),
        exec_path: Some(live.exec_path),
        queue_position,
        ..view
    };
    reply(HttpResponse::Ok(), &body)
}

/// Longest wait for the agent's view of a kernel's stages.
const STAGES_TIMEOUT: Duration = Duration::from_secs(2);

/// What the kernel's agent says of it (`get_kernel`), each `None` (null) when it does not say.
#[derive(Default)]
struct LiveView {
    /// Its stage actors in order.
    stages: Option<Vec<Stage>>,
    /// `kernel-runner` or `process`.
    exec_path: Option<String>,
}

/// The kernel as its agent reports it (`get_kernel`): its stage actors (`[{"name", "status",
/// "restarts", "setup_seconds"}]` in order) and its `exec_path`; nothing when the kernel has
/// ended, its agent does not answer in time, or its answer lacks them (the session itself still
/// answers).
async fn live_view(s: &ApiState, k: &KernelRow) -> LiveView {
    match k.status {
        // Not on an agent (yet, or any more).
        KernelStatus::Pending
        | KernelStatus::Scheduled
        | KernelStatus::Terminated
        | KernelStatus::Cancelled => return LiveView::default(),
        KernelStatus::Preparing
        | KernelStatus::Pulling
        | KernelStatus::Creating
        | KernelStatus::Running
        | KernelStatus::Restarting
        | KernelStatus::Terminating
        | KernelStatus::Preempted => {}
    }
    let args = KernelIdArgs {
        kernel_id: k.id.clone(),
    };
    match call_method::<GetKernel>(&s.pool, &s.metrics, &k.agent_id, &args, STAGES_TIMEOUT).await {
        Ok(mut info) => LiveView {
            stages: info
                .rest
                .remove("stages")
                .and_then(|v| serde_json::from_value(to_json(&v)).ok()),
            exec_path: info
                .rest
                .remove("exec_path")
                .and_then(|v| v.as_str().map(str::to_owned)),
        },
        Err(e) => {
            tracing::debug!(kernel_id = %k.id, error = %e, "no stages from the agent");
            LiveView::default()
        }
    }
}

/// Destroys a session: its workload gets its stop signal and its grace period (`?grace=SECS`
/// instead of the session's own; `?grace=0` kills it at once), then is killed; then
/// `TERMINATED`, reason `user-requested`. The answer waits for the end up to 10 s: 200 with
/// the session ended, or 202 with the session still `TERMINATING` and its
/// `terminate_deadline` (the end goes on; follow it with `GET /v1/sessions/{id}` or
/// `GET /v1/events`). An already terminated one is answered unchanged.
#[utoipa::path(
    operation_id = "delete_session",
    tag = "sessions",
    params(
        ("id" = String, Path, description = "Session or kernel id"),
        DestroyQuery,
    ),
    responses(
        (status = 200, description = "The session, terminated", body = Session),
        (status = 202, description = "The session, `TERMINATING` until its `terminate_deadline` at the latest", body = Session),
        (status = 400, description = "`invalid-request` (a `grace` that is not a number of seconds ≥ 0), `grace-period-too-long` (above `[scheduler] max-grace-period`)", body = ErrorBody),
        (status = 404, description = "`session-not-found` (also another key's session)", body = ErrorBody),
        responses::AgentFailed, responses::StartingUp,
    ),
)]
#[delete("/v1/sessions/{id}")]
pub(super) async fn delete(
    s: web::Data<ApiState>,
    caller: Caller,
    id: web::Path<String>,
    query: web::Query<DestroyQuery>,
) -> Res {
    let r = async {
        not_in_grace(&s).await?;
        let k = owned_kernel(&s, &caller, &id).await?;
        s.scheduler
            .send(DestroySession {
                id: resolved_id(&id, &k),
                grace: query.grace,
            })
            .await?
    }
    .await;
    let (_, view) = session_view(&s, &count_error(&s, r)?).await?;
    if view.status == KernelStatus::Terminating.as_str() {
        return reply(HttpResponse::Accepted(), &view);
    }
    reply(HttpResponse::Ok(), &view)
}

/// `DELETE /v1/sessions/{id}`'s query.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct DestroyQuery {
    /// Seconds the workload has to exit after its stop signal, instead of the session's own
    /// `grace_period` (0: killed at once); at most `[scheduler] max-grace-period`.
    #[param(minimum = 0)]
    pub grace: Option<f64>,
}

/// Runs code in the session's kernel, or continues or feeds a run: Backend.AI's continuation
/// protocol in bounded answers. The body's `kernel` picks a cluster session's kernel (`sub1`);
/// without it, the main kernel (or the kernel the path names by its id).
#[utoipa::path(
    operation_id = "execute",
    tag = "sessions",
    params(("id" = String, Path, description = "Session or kernel id")),
    request_body = ExecuteBody,
    responses(
        (status = 200, description = "An answer: `continued` (more to come), `finished` or `exec-timeout`", body = ExecuteAnswer),
        (status = 400, description = "`invalid-request`: malformed JSON, an unknown field or mode, a missing `code` / `run_id`, a non-positive timeout, a run id in use, stdin closed", body = ErrorBody),
        (status = 404, description = "`session-not-found` (also a `kernel` that names no kernel of the session), `run-not-found` (unknown or finished run)", body = ErrorBody),
        (status = 409, description = "`session-not-running` (`query`: the selected kernel is not `RUNNING`), `run-has-no-stdin` (`input`)", body = ErrorBody),
        responses::AgentFailed, responses::StartingUp,
    ),
)]
#[post("/v1/sessions/{id}/execute")]
pub(super) async fn execute(
    s: web::Data<ApiState>,
    caller: Caller,
    id: web::Path<String>,
    body: web::Json<Object<ExecuteBody>>,
) -> Res {
    let r = async {
        not_in_grace(&s).await?;
        let b = body.into_inner().into_inner();
        let selector = b.kernel.as_deref();
        let k = selected_kernel(&s, &caller, &id, selector).await?;
        let target = match selector {
            // The selected kernel by its id (the scheduler reads its row again); a `query`
            // to a kernel that is not RUNNING is refused here, naming the selector.
            Some(_) => {
                if b.mode.as_deref().unwrap_or("query") == "query" && b.code.is_some() {
                    must_run(&k, &id, selector)?;
                }
                k.id.clone()
            }
            None => resolved_id(&id, &k),
        };
        let msg = ExecuteInSession {
            id: target,
            mode: b.mode,
            code: b.code,
            run_id: b.run_id,
            timeout: b.timeout,
            flush_timeout: b.flush_timeout,
            stdin: b.stdin,
            shell: b.shell,
            eof: b.eof,
        };
        s.scheduler.send(msg).await?
    }
    .await;
    // The scheduler answers the agent's result map; it is read back as the model's answer.
    let answer: ExecuteAnswer = serde_json::from_value(count_error(&s, r)?)
        .map_err(|e| ManagerError::Internal(format!("execute answer: {e}")))?;
    reply(HttpResponse::Ok(), &answer)
}

/// How long the manager waits for the agent's `interrupt_kernel`.
const INTERRUPT_TIMEOUT: Duration = Duration::from_secs(30);

/// Interrupts what the session's kernel runs: where Backend.AI's kernel runner serves it, the
/// runner's `interrupt` (the current run ends with `KeyboardInterrupt` and its answer goes on
/// through `execute`'s `continue`; the REPL keeps its state); otherwise SIGINT to the kernel's
/// main process (a batch session's command).
#[utoipa::path(
    operation_id = "interrupt_session",
    tag = "sessions",
    params(
        ("id" = String, Path, description = "Session or kernel id"),
        ("kernel" = Option<String>, Query, description = KERNEL_PARAM),
    ),
    responses(
        (status = 204, description = "Interrupted"),
        (status = 404, description = "`session-not-found` (also another key's session, or a `kernel` that names no kernel of the session)", body = ErrorBody),
        responses::NotRunning, responses::AgentFailed, responses::StartingUp,
    ),
)]
#[post("/v1/sessions/{id}/interrupt")]
pub(super) async fn interrupt(
    s: web::Data<ApiState>,
    caller: Caller,
    id: web::Path<String>,
    q: web::Query<KernelQuery>,
) -> Res {
    let r = async {
        let k = running_kernel(&s, &caller, &id, q.kernel.as_deref()).await?;
        let args = KernelIdArgs {
            kernel_id: k.id.clone(),
        };
        call_method::<InterruptKernel>(&s.pool, &s.metrics, &k.agent_id, &args, INTERRUPT_TIMEOUT)
            .await
            .map_err(|e| agent_error(&e))
    }
    .await;
    count_error(&s, r)?;
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LogsQuery {
    #[serde(default)]
    follow: bool,
    /// [`KernelQuery::kernel`].
    #[serde(default)]
    kernel: Option<String>,
}

/// The next chunk of a followed log from `offset`; `None` ends the follow (the agent cannot be
/// read: logged).
async fn read_more(
    scheduler: &Addr<Scheduler>,
    kernel: &KernelRow,
    offset: u64,
) -> Option<LogsChunk> {
    match scheduler
        .send(ReadLogs {
            kernel: kernel.clone(),
            offset: Some(offset),
            wait: Some(FOLLOW_WAIT),
        })
        .await
    {
        Ok(Ok(c)) => Some(c),
        Ok(Err(e)) => {
            tracing::info!(kernel_id = %kernel.id, error = %e, "log follow ends: the agent cannot be read");
            None
        }
        Err(_) => None,
    }
}

/// Seconds one follow read waits at the agent for new output before asking again (the agent
/// answers as soon as output comes; this only bounds an idle read).
const FOLLOW_WAIT: f64 = 10.0;

/// Where a followed log stands between two chunks sent.
enum Follow {
    /// A chunk read, not sent yet.
    Have(LogsChunk, KernelRow),
    /// Read on from this offset (after a chunk was sent).
    From(u64, KernelRow),
    /// The kernel has ended and everything was sent.
    Done,
}

/// The kernel's stdout and stderr (merged): the last `[container] log-tail` bytes;
/// `?follow=true` streams new output until the kernel ends.
#[utoipa::path(
    operation_id = "session_logs",
    tag = "sessions",
    params(
        ("id" = String, Path, description = "Session or kernel id"),
        ("follow" = Option<bool>, Query, description = "Stream new output until the kernel ends (chunked)"),
        ("kernel" = Option<String>, Query, description = KERNEL_PARAM),
    ),
    responses(
        (status = 200, description = "The logs", body = String, content_type = "text/plain"),
        (status = 400, description = "`invalid-request`: an unknown or ill-typed query parameter", body = ErrorBody),
        (status = 404, description = "`session-not-found` (also a `kernel` that names no kernel of the session), `logs-not-found` (never started, or past retention)", body = ErrorBody),
        responses::AgentFailed, responses::StartingUp,
    ),
)]
#[get("/v1/sessions/{id}/logs")]
pub(super) async fn logs(
    s: web::Data<ApiState>,
    caller: Caller,
    id: web::Path<String>,
    q: web::Query<LogsQuery>,
) -> Res {
    not_in_grace(&s).await?;
    let kernel = selected_kernel(&s, &caller, &id, q.kernel.as_deref()).await?;
    let first = s
        .scheduler
        .send(ReadLogs {
            kernel: kernel.clone(),
            offset: None,
            wait: None,
        })
        .await??;
    let mut resp = HttpResponse::Ok();
    resp.content_type("text/plain; charset=utf-8")
        .insert_header(("X-Content-Type-Options", "nosniff"));
    if !q.follow {
        return Ok(resp.body(first.data));
    }
    // Follow: the tail, then each newer chunk as soon as the agent has it, until the kernel has
    // ended and everything is sent. A chunk is sent before the next read starts (that read waits
    // at the agent for new output): reading ahead would hold each chunk back until the next one
    // came. One chunk (≤ 1 MiB) is held at a time; a slow reader slows the reads.
    let scheduler = s.scheduler.clone();
    let stream = futures::stream::unfold(Follow::Have(first, kernel), move |state| {
        let scheduler = scheduler.clone();
        async move {
            let (mut chunk, kernel) = match state {
                Follow::Have(chunk, kernel) => (chunk, kernel),
                Follow::From(next, kernel) => (read_more(&scheduler, &kernel, next).await?, kernel),
                Follow::Done => return None,
            };
            // Never a zero-length chunk (it would read as the end of a chunked body): ask again
            // until there are bytes to send or the kernel has ended.
            while chunk.data.is_empty() {
                if !chunk.active {
                    return None;
                }
                chunk = read_more(&scheduler, &kernel, chunk.next).await?;
            }
            let data = actix_web::web::Bytes::from(std::mem::take(&mut chunk.data));
            let following = if chunk.active {
                Follow::From(chunk.next, kernel)
            } else {
                Follow::Done
            };
            Some((Ok::<_, actix_web::Error>(data), following))
        }
    });
    Ok(resp.streaming(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(service_ports: serde_json::Value) -> SessionRequest {
        serde_json::from_value(serde_json::json!({
            "image": "img", "resource_slots": {"cpu": 1, "mem": "64m"}, "service_ports": service_ports,
        }))
        .unwrap()
    }

    #[test]
    fn service_ports_are_checked() {
        let ok = serde_json::json!([{"name": "tb", "protocol": "http", "container_ports": [6006]},
                                     {"name": "ssh_2", "container_ports": [22]}]);
        assert!(check_service_ports(&request(ok)).is_ok());
        for bad in [
            serde_json::json!([{"name": "../x", "container_ports": [1]}]),
            serde_json::json!([{"name": "", "container_ports": [1]}]),
            serde_json::json!([{"name": "tb", "protocol": "vnc", "container_ports": [1]}]),
        ] {
            let e = check_service_ports(&request(bad.clone())).unwrap_err();
            assert_eq!(e.code(), "invalid-request", "{bad}");
        }
    }

    #[test]
    fn logs_take_a_kernel_and_refuse_unknown_parameters() {
        let q = web::Query::<LogsQuery>::from_query("follow=true&kernel=sub1").unwrap();
        assert!(q.follow);
        assert_eq!(q.kernel.as_deref(), Some("sub1"));
        assert!(web::Query::<LogsQuery>::from_query("kernels=sub1").is_err());
    }

    fn with_environ(environ: serde_json::Value) -> SessionRequest {
        serde_json::from_value(serde_json::json!({
            "image": "img", "resource_slots": {"cpu": 1, "mem": "64m"}, "environ": environ,
        }))
        .unwrap()
    }

    #[test]
    fn environ_is_checked() {
        let ok = serde_json::json!({"A": "1", "_b2": "x=y", "PATH": "/bin", "EMPTY": ""});
        assert!(check_environ(&with_environ(ok)).is_ok());
        for (bad, says) in [
            (serde_json::json!({"PATH": ""}), "empty PATH"),
            (serde_json::json!({"2X": "1"}), "not starting with a digit"),
            (serde_json::json!({"A B": "1"}), "letters, digits"),
            (serde_json::json!({"": "1"}), "letters, digits"),
            (serde_json::json!({"A": "x\u{0}y"}), "NUL"),
        ] {
            let e = check_environ(&with_environ(bad.clone())).unwrap_err();
            assert_eq!(e.code(), "invalid-request", "{bad}");
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
    }
}
