//! `GET /v1/sessions/{id}/pty`: a terminal in the session's kernel over a WebSocket. The
//! manager starts it on the kernel's agent (`pty_start`), then relays: binary frames from the
//! client are typed into it (`pty_write`), its output goes back as binary frames (`pty_read`,
//! long-polled), a text frame `{"resize": {"rows", "cols"}}` resizes it (`pty_resize`), and when
//! its process ends the last frame is `{"exit_code": N}` before the manager closes the socket.
//! A client that goes away kills it (`pty_close`).
//!
//! A browser authenticates it with the `kernelvisor.bearer.…` subprotocol (`super::auth`); it
//! must offer [`PTY_PROTOCOL`] with it, which the answer names (a browser fails a handshake
//! whose answer names no subprotocol when it offered some).
//!
//! Memory is bounded per socket: one agent read (at most [`READ_MAX`] bytes) at a time, and
//! the socket's outgoing queue (actix-ws: 32 frames) is waited on when full, so a slow client
//! slows the reads, and the agent's bounded console then stops the process.

use std::time::Duration;

use actix_web::{get, web, HttpRequest};
use actix_ws::{CloseCode, CloseReason, Message, MessageStream, Session};
use futures::StreamExt;

use super::auth::{offered_protocols, Caller, PTY_PROTOCOL};
use super::{running_kernel, ApiState, Res, KERNEL_PARAM};
use crate::manager::calls::{agent_error, call_method};
use crate::manager::error::ManagerError;
use crate::model::error::ErrorBody;
use crate::model::terminal::{ClientControl, PtyQuery, ServerControl};
use crate::rpc::agent_api::terminal::{
    PtyClose, PtyCloseArgs, PtyRead, PtyReadArgs, PtyResize, PtyResizeArgs, PtyStart, PtyStartArgs,
    PtyWrite, PtyWriteArgs,
};

/// Bytes one agent read takes at most (one binary frame).
const READ_MAX: u64 = 64 * 1024;
/// Seconds one agent read waits for output before the manager asks again (each read also
/// tells the agent that someone still reads: it reaps terminals idle for `exec-idle-timeout`).
const READ_WAIT: f64 = 5.0;
/// Limit of the calls that do not wait for output (start, write, resize, close). A write may
/// wait up to 10 s at the agent for the terminal to take the bytes.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Default terminal size when the query has none.
const DEFAULT_ROWS: u16 = 24;
const DEFAULT_COLS: u16 = 80;

/// Opens a terminal in the session's kernel: `command` (`sh -c`) or an interactive shell, with
/// a `rows`×`cols` terminal and `TERM=xterm-256color`, relayed over a WebSocket (see the module
/// doc for the frames).
#[utoipa::path(
    operation_id = "session_pty",
    tag = "sessions",
    params(
        ("id" = String, Path, description = "Session or kernel id"),
        ("rows" = Option<u16>, Query, description = "Lines of the terminal (1-65535, default 24)", minimum = 1, maximum = 65535),
        ("cols" = Option<u16>, Query, description = "Columns of the terminal (1-65535, default 80)", minimum = 1, maximum = 65535),
        ("command" = Option<String>, Query, description = "Shell command line to run (default: an interactive shell, bash when the image has it, else sh)"),
        ("kernel" = Option<String>, Query, description = KERNEL_PARAM),
    ),
    responses(
        (status = 101, description = "Switching to the WebSocket protocol. Binary frames: the terminal's bytes, both ways. Text frames from the client: `{\"resize\": {\"rows\": R, \"cols\": C}}`; from the manager: `{\"error\": {\"code\", \"message\"}}` (a control frame it could not take; the terminal goes on) and, last, `{\"exit_code\": N}` (null when killed) before it closes the socket"),
        (status = 400, description = "`invalid-request`: not a WebSocket upgrade, a zero or ill-typed `rows` / `cols`, an unknown query parameter", body = ErrorBody),
        (status = 404, description = "`session-not-found` (also another key's session, or a `kernel` that names no kernel of the session)", body = ErrorBody),
        (status = 409, description = "`session-not-running` (the selected kernel)", body = ErrorBody),
        super::responses::AgentFailed, super::responses::StartingUp,
    ),
)]
#[get("/v1/sessions/{id}/pty")]
pub(super) async fn open(
    s: web::Data<ApiState>,
    caller: Caller,
    id: web::Path<String>,
    q: web::Query<PtyQuery>,
    req: HttpRequest,
    body: web::Payload,
) -> Res {
    let q = q.into_inner();
    let (rows, cols) = (
        q.rows.unwrap_or(DEFAULT_ROWS),
        q.cols.unwrap_or(DEFAULT_COLS),
    );
    if rows == 0 || cols == 0 {
        return Err(ManagerError::InvalidRequest(format!(
            "a terminal of {rows}x{cols}: `rows` and `cols` must be at least 1"
        )));
    }
    let k = running_kernel(&s, &caller, &id, q.kernel.as_deref()).await?;
    // The handshake is checked before anything starts on the agent.
    let (mut response, session, frames) = actix_ws::handle(&req, body).map_err(|e| {
        ManagerError::InvalidRequest(format!("not a WebSocket upgrade request: {e}"))
    })?;
    // The one subprotocol this socket speaks, named when offered; never the token one.
    if offered_protocols(req.headers()).any(|p| p == PTY_PROTOCOL) {
        response.headers_mut().insert(
            actix_web::http::header::SEC_WEBSOCKET_PROTOCOL,
            actix_web::http::header::HeaderValue::from_static(PTY_PROTOCOL),
        );
    }
    let args = PtyStartArgs {
        kernel_id: k.id.clone(),
        run_id: None,
        command: q.command,
        rows,
        cols,
    };
    let started = call_method::<PtyStart>(&s.pool, &s.metrics, &k.agent_id, &args, CALL_TIMEOUT)
        .await
        .map_err(|e| agent_error(&e))?;
    let terminal = Terminal {
        state: s.into_inner(),
        agent_id: k.agent_id,
        kernel_id: k.id,
        run_id: started.run_id,
    };
    tracing::info!(kernel_id = %terminal.kernel_id, run_id = %terminal.run_id, access_key = %caller.access_key, "terminal opened");
    actix_web::rt::spawn(relay(terminal, session, frames));
    Ok(response)
}

/// A terminal on an agent.
struct Terminal {
    state: std::sync::Arc<ApiState>,
    agent_id: String,
    kernel_id: String,
    run_id: String,
}

/// How the relay ended.
enum End {
    /// The process ended (its exit code, if known).
    Exited(Option<i64>),
    /// The agent could not be read.
    Lost(ManagerError),
    /// The client closed the socket or went away.
    ClientGone,
}

/// Relays between the socket and the terminal until one of them ends.
async fn relay(t: Terminal, session: Session, frames: MessageStream) {
    let end = tokio::select! {
        end = output(&t, session.clone()) => end,
        end = input(&t, session.clone(), frames) => end,
    };
    let mut session = session;
    match end {
        End::Exited(code) => {
            let _ = session.text(control(&ServerControl::exited(code))).await;
            let _ = session.close(Some(CloseCode::Normal.into())).await;
        }
        End::Lost(e) => {
            tracing::info!(kernel_id = %t.kernel_id, run_id = %t.run_id, error = %e, "terminal lost");
            let _ = session
                .text(control(&ServerControl::error(e.code(), &e.to_string())))
                .await;
            let reason = CloseReason {
                code: CloseCode::Error,
                description: Some(e.code().to_owned()),
            };
            let _ = session.close(Some(reason)).await;
            close(&t).await;
        }
        End::ClientGone => close(&t).await,
    }
    tracing::info!(kernel_id = %t.kernel_id, run_id = %t.run_id, "terminal closed");
}

fn control(c: &ServerControl) -> String {
    serde_json::to_string(c).expect("a control frame serializes")
}

/// Kills the terminal's process (the client is gone, or the relay failed).
async fn close(t: &Terminal) {
    let args = PtyCloseArgs {
        kernel_id: t.kernel_id.clone(),
        run_id: t.run_id.clone(),
    };
    let s = &t.state;
    if let Err(e) =
        call_method::<PtyClose>(&s.pool, &s.metrics, &t.agent_id, &args, CALL_TIMEOUT).await
    {
        // Already gone (it ended meanwhile) is the usual case.
        tracing::debug!(run_id = %t.run_id, error = %e, "pty_close");
    }
}

/// Agent → client: each read's bytes as one binary frame, until the process ends.
async fn output(t: &Terminal, mut session: Session) -> End {
    let s = &t.state;
    let args = PtyReadArgs {
        kernel_id: t.kernel_id.clone(),
        run_id: t.run_id.clone(),
        max_bytes: READ_MAX,
        wait: READ_WAIT,
    };
    let timeout = Duration::from_secs_f64(READ_WAIT) + CALL_TIMEOUT;
    loop {
        let out =
            match call_method::<PtyRead>(&s.pool, &s.metrics, &t.agent_id, &args, timeout).await {
                Ok(out) => out,
                Err(e) => return End::Lost(agent_error(&e)),
            };
        if !out.data.is_empty() && session.binary(out.data.into_vec()).await.is_err() {
            return End::ClientGone;
        }
        if out.finished {
            return End::Exited(out.exit_code);
        }
    }
}

/// Client → agent: binary frames typed in, resize control frames applied, until the client
/// closes. A bad control frame is answered with an error frame; the terminal goes on.
async fn input(t: &Terminal, mut session: Session, mut frames: MessageStream) -> End {
    let s = &t.state;
    while let Some(frame) = frames.next().await {
        let result = match frame {
            Ok(Message::Binary(data)) => {
                let args = PtyWriteArgs {
                    kernel_id: t.kernel_id.clone(),
                    run_id: t.run_id.clone(),
                    data: serde_bytes::ByteBuf::from(data.to_vec()),
                };
                call_method::<PtyWrite>(&s.pool, &s.metrics, &t.agent_id, &args, CALL_TIMEOUT)
                    .await
                    .map(drop)
                    .map_err(|e| agent_error(&e))
            }
            Ok(Message::Text(text)) => resize(t, &text).await,
            Ok(Message::Ping(p)) => {
                let _ = session.pong(&p).await;
                Ok(())
            }
            Ok(Message::Close(_)) | Err(_) => return End::ClientGone,
            Ok(_) => Ok(()),
        };
        if let Err(e) = result {
            let frame = control(&ServerControl::error(e.code(), &e.to_string()));
            if session.text(frame).await.is_err() {
                return End::ClientGone;
            }
        }
    }
    End::ClientGone
}

/// Applies a text control frame. Errors: `invalid-request` for anything but
/// `{"resize": {"rows": R, "cols": C}}` with R, C ≥ 1; the agent's errors.
async fn resize(t: &Terminal, text: &str) -> Result<(), ManagerError> {
    let c: ClientControl = serde_json::from_str(text).map_err(|e| {
        ManagerError::InvalidRequest(format!(
            "a control frame must be {{\"resize\": {{\"rows\": R, \"cols\": C}}}}: {e}"
        ))
    })?;
    let args = PtyResizeArgs {
        kernel_id: t.kernel_id.clone(),
        run_id: t.run_id.clone(),
        rows: c.resize.rows,
        cols: c.resize.cols,
    };
    let s = &t.state;
    call_method::<PtyResize>(&s.pool, &s.metrics, &t.agent_id, &args, CALL_TIMEOUT)
        .await
        .map(drop)
        .map_err(|e| agent_error(&e))
}
