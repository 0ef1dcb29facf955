//! The terminal methods ([`crate::rpc::agent_api::terminal`]): `pty_start`, `pty_read`,
//! `pty_write`, `pty_resize`, `pty_close`, on the agent's runs ([`crate::agent::exec::terminal`]).

use std::sync::Arc;
use std::time::Duration;

use rmpv::Value;

use super::args::{running, type_error};
use super::{Ctx, Table};
use crate::agent::backend::{BackendError, TtySize};
use crate::agent::context::AgentContext;
use crate::agent::exec::{Run, RunError, RunIds, RunRequest};
use crate::agent::kernel::KernelError;
use crate::rpc::agent_api::terminal as api;
use crate::rpc::{Dispatcher, ErrorMeta, Failure};

/// The container's shell when no command is given: `bash` when the image has one (as users
/// expect of an interactive shell), else POSIX `sh`, which every image the agent runs has.
const DEFAULT_SHELL: &str = "if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi";

/// `TERM` of the terminal: what the CLI's own terminals emulate in practice.
const TERM: &str = "TERM=xterm-256color";

/// Longest `pty_read` wait, seconds: the manager asks again.
const MAX_READ_WAIT: f64 = 60.0;

/// How long typing may wait for the terminal to take it.
const WRITE_LIMIT: Duration = Duration::from_secs(10);

fn run_error(ctx: &AgentContext, e: RunError) -> ErrorMeta {
    match e {
        RunError::Engine(e) => engine_error(ctx, e),
        other => ErrorMeta::new(other.name(), other.to_string()),
    }
}

/// An engine error as a FAILURE; an unreachable engine is marked down on the way.
fn engine_error(ctx: &AgentContext, e: BackendError) -> ErrorMeta {
    let meta = KernelError::from(e).to_meta();
    if meta.known() == Some(Failure::ContainerEngineUnavailable) {
        ctx.engine.mark_down(&meta.repr);
    }
    meta
}

/// `rows`×`cols`, both at least 1. Errors: `TypeError`.
fn size(rows: u16, cols: u16) -> Result<TtySize, ErrorMeta> {
    if rows == 0 || cols == 0 {
        return Err(type_error(format!(
            "a terminal of {rows}x{cols}: rows and cols must be at least 1"
        )));
    }
    Ok(TtySize { rows, cols })
}

/// The terminal `run_id` of `kernel_id`. Errors: `RunNotFound` (also another kernel's run, or
/// one without a terminal: not this method family's business).
fn terminal(ctx: &AgentContext, kernel_id: &str, run_id: &str) -> Result<Arc<Run>, ErrorMeta> {
    let not_found = || run_error(ctx, RunError::NotFound(run_id.to_owned()));
    let run = ctx.runs.get(run_id).map_err(|_| not_found())?;
    if run.ids().kernel_id != kernel_id || !run.is_tty() {
        return Err(not_found());
    }
    // Using a terminal is activity (idle reclaim, `agent/activity.rs`).
    ctx.activity.touch(kernel_id);
    Ok(run)
}

/// Registers the terminal methods on `dispatcher`.
pub(crate) fn register(dispatcher: &mut Dispatcher, cx: &Ctx) {
    Table::new(dispatcher, cx.clone())
        .method::<api::PtyStart, _, _>(pty_start)
        .method::<api::PtyRead, _, _>(pty_read)
        .method::<api::PtyWrite, _, _>(pty_write)
        .method::<api::PtyResize, _, _>(pty_resize)
        .method::<api::PtyClose, _, _>(pty_close);
}

/// `pty_start(kernel_id, rows, cols, command=None, run_id=None)` → `{"run_id"}`: `command`
/// (else [`DEFAULT_SHELL`]) on a terminal of the kernel's container.
async fn pty_start(cx: Ctx, args: api::PtyStartArgs) -> Result<api::PtyStarted, ErrorMeta> {
    let size = size(args.rows, args.cols)?;
    let info = running(&cx.registry, &args.kernel_id).await?;
    cx.engine.check()?;
    // A terminal is activity (idle reclaim, `agent/activity.rs`).
    cx.activity.touch(&args.kernel_id);
    let command = args.command.unwrap_or_else(|| DEFAULT_SHELL.to_owned());
    let req = RunRequest {
        ids: RunIds {
            run_id: args
                .run_id
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| format!("pty-{}", uuid::Uuid::new_v4().simple())),
            kernel_id: args.kernel_id,
            session_id: info.session_id.clone(),
        },
        container_id: info.container_id.clone().unwrap_or_default(),
        cmd: vec!["sh".into(), "-c".into(), command],
        timeout: None,
        stdin: true,
        tty: Some(size),
        env: vec![TERM.to_owned()],
        user: info.exec_user(&cx.config.container),
    };
    let run = cx
        .runs
        .start(&cx.backend, &cx.events, req)
        .await
        .map_err(|e| run_error(&cx, e))?;
    Ok(api::PtyStarted {
        run_id: run.ids().run_id.clone(),
    })
}

/// `pty_read(kernel_id, run_id, max_bytes, wait)`: what the terminal wrote, waiting up to
/// `wait` seconds (at most [`MAX_READ_WAIT`]) for some.
async fn pty_read(cx: Ctx, args: api::PtyReadArgs) -> Result<api::PtyOutput, ErrorMeta> {
    let run = terminal(&cx, &args.kernel_id, &args.run_id)?;
    let wait = if args.wait.is_finite() && args.wait > 0.0 {
        Duration::from_secs_f64(args.wait.min(MAX_READ_WAIT))
    } else {
        Duration::ZERO
    };
    let max = usize::try_from(args.max_bytes).unwrap_or(usize::MAX);
    let read = run.read_bytes(max, wait).await;
    cx.runs.forget_if_done(&run);
    Ok(api::PtyOutput {
        data: serde_bytes::ByteBuf::from(read.data),
        finished: read.finished,
        exit_code: read.exit_code,
    })
}

/// `pty_write(kernel_id, run_id, data)`: typing, waiting up to [`WRITE_LIMIT`].
async fn pty_write(cx: Ctx, args: api::PtyWriteArgs) -> Result<Value, ErrorMeta> {
    let run = terminal(&cx, &args.kernel_id, &args.run_id)?;
    run.input(&args.data, false, WRITE_LIMIT)
        .await
        .map_err(|e| run_error(&cx, e))?;
    Ok(Value::Nil)
}

/// `pty_resize(kernel_id, run_id, rows, cols)`.
async fn pty_resize(cx: Ctx, args: api::PtyResizeArgs) -> Result<Value, ErrorMeta> {
    let size = size(args.rows, args.cols)?;
    let run = terminal(&cx, &args.kernel_id, &args.run_id)?;
    cx.engine.check()?;
    run.resize(&cx.backend, size)
        .await
        .map_err(|e| run_error(&cx, e))?;
    Ok(Value::Nil)
}

/// `pty_close(kernel_id, run_id)`: the terminal's process ended.
async fn pty_close(cx: Ctx, args: api::PtyCloseArgs) -> Result<Value, ErrorMeta> {
    terminal(&cx, &args.kernel_id, &args.run_id)?;
    cx.runs
        .close(&cx.backend, &args.run_id)
        .await
        .map_err(|e| run_error(&cx, e))?;
    Ok(Value::Nil)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_at_least_one_cell() {
        assert_eq!(size(24, 80).unwrap(), TtySize { rows: 24, cols: 80 });
        for (rows, cols) in [(0, 80), (24, 0), (0, 0)] {
            let e = size(rows, cols).unwrap_err();
            assert_eq!(e.name, "TypeError", "{rows}x{cols}");
        }
    }
}
