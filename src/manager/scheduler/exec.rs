//! `ExecuteInSession` (Backend.AI's `execute` continuation protocol) and `ReadLogs`: calls to
//! the session's agent.

use std::collections::BTreeMap;
use std::time::Duration;

use actix::prelude::*;
use rmpv::Value;

use super::Scheduler;
use crate::manager::calls::{agent_error, call_method};
use crate::manager::error::ManagerError;
use crate::manager::store::KernelRow;
use crate::model::session::KernelStatus;
use crate::rpc::agent_api::exec::{Execute, ExecuteArgs, GetLogs, GetLogsArgs};

/// One `execute` call of Backend.AI's continuation protocol (`docs/manager-api.md`).
#[derive(Clone, Debug, Default)]
pub struct ExecuteInSession {
    /// Session or kernel id.
    pub id: String,
    /// `query` (default), `continue` or `input`.
    pub mode: Option<String>,
    /// Code for the image's interpreter (`query`), or text for stdin (`input`).
    pub code: Option<String>,
    /// The run to continue or feed (required for `continue` / `input`).
    pub run_id: Option<String>,
    /// Seconds; the agent kills the run when exceeded (`query`).
    pub timeout: Option<f64>,
    /// Seconds to wait for output before answering `continued` (default: the manager's).
    pub flush_timeout: Option<f64>,
    /// Keep the run's stdin open for `input` (`query`).
    pub stdin: bool,
    /// Run `code` with `sh -c` in a process of its own even on a kernel runner's kernel
    /// (`query`: the agent's `opts.shell`).
    pub shell: bool,
    /// Close stdin after writing (`input`).
    pub eof: bool,
}

impl Message for ExecuteInSession {
    type Result = Result<serde_json::Value, ManagerError>;
}

/// Longest `flush_timeout` the manager passes on (seconds): an answer always comes back within
/// an HTTP client's patience.
const MAX_FLUSH_TIMEOUT: f64 = 60.0;

impl Handler<ExecuteInSession> for Scheduler {
    type Result = ResponseFuture<Result<serde_json::Value, ManagerError>>;

    fn handle(&mut self, msg: ExecuteInSession, _: &mut Context<Self>) -> Self::Result {
        let (store, pool, metrics, default_flush, default_timeout) = (
            self.store.clone(),
            self.pool.clone(),
            self.metrics.clone(),
            self.spec.flush_timeout,
            self.spec.execute_timeout,
        );
        Box::pin(async move {
            let bad = |m: String| Err(ManagerError::InvalidRequest(m));
            for (name, v) in [
                ("timeout", msg.timeout),
                ("flush_timeout", msg.flush_timeout),
            ] {
                if let Some(t) = v.filter(|t| !(t.is_finite() && *t > 0.0)) {
                    return bad(format!("`{name}`: {t} is not a positive number of seconds"));
                }
            }
            let mode = msg.mode.clone().unwrap_or_else(|| "query".into());
            let k = store
                .kernel(&msg.id)
                .await?
                .ok_or_else(|| ManagerError::SessionNotFound(msg.id.clone()))?;
            let (run_id, code, opts) = match mode.as_str() {
                "query" => {
                    let Some(code) = msg.code.clone() else {
                        return bad("`code` is required for mode `query`".into());
                    };
                    if k.status != KernelStatus::Running {
                        return Err(ManagerError::SessionNotRunning(
                            msg.id,
                            k.status.as_str().to_owned(),
                        ));
                    }
                    let timeout = msg.timeout.unwrap_or(default_timeout.as_secs_f64());
                    let mut opts = BTreeMap::from([
                        ("stdin".to_owned(), Value::from(msg.stdin)),
                        ("timeout".to_owned(), Value::F64(timeout)),
                    ]);
                    if msg.shell {
                        opts.insert("shell".to_owned(), Value::from(true));
                    }
                    (
                        msg.run_id
                            .clone()
                            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string()),
                        code,
                        opts,
                    )
                }
                "continue" | "input" => {
                    let Some(run_id) = msg.run_id.clone() else {
                        return bad(format!("`run_id` is required for mode `{mode}`"));
                    };
                    (
                        run_id,
                        msg.code.clone().unwrap_or_default(),
                        BTreeMap::from([("eof".to_owned(), Value::from(msg.eof))]),
                    )
                }
                other => {
                    return bad(format!(
                        "`mode` `{other}` must be `query`, `continue` or `input`"
                    ))
                }
            };
            let flush = msg
                .flush_timeout
                .unwrap_or(default_flush.as_secs_f64())
                .min(MAX_FLUSH_TIMEOUT);
            // The agent answers within the flush timeout (or sooner); the margin covers a full
            // buffer's transfer and a busy agent.
            let rpc_timeout = Duration::from_secs_f64(flush) + Duration::from_secs(30);
            let args = ExecuteArgs {
                session_id: Some(k.session_id.clone()),
                kernel_id: k.id.clone(),
                api_version: Some(2.into()),
                run_id: Some(run_id),
                mode: mode.to_owned(),
                code,
                opts: Some(opts),
                flush_timeout: Some(flush),
            };
            let out = call_method::<Execute>(&pool, &metrics, &k.agent_id, &args, rpc_timeout)
                .await
                .map_err(|e| agent_error(&e))?;
            Ok(serde_json::json!({
                "runId": out.run_id,
                "status": out.status,
                "console": out.console,
                "exitCode": out.exit_code,
                "options": out.options,
            }))
        })
    }
}

/// A read of a session's logs from its agent: `offset` `None` for the tail, else on from there
/// waiting up to `wait` for more.
#[derive(Clone, Debug)]
pub struct ReadLogs {
    /// The kernel's row.
    pub kernel: KernelRow,
    /// Absolute offset, or `None` for the last `log-tail` bytes.
    pub offset: Option<u64>,
    /// Seconds to wait at the end of a running kernel's log.
    pub wait: Option<f64>,
}

/// What [`ReadLogs`] got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogsChunk {
    /// The bytes.
    pub data: Vec<u8>,
    /// Where the next read goes on from.
    pub next: u64,
    /// The kernel still runs: more may come.
    pub active: bool,
}

impl Message for ReadLogs {
    type Result = Result<LogsChunk, ManagerError>;
}

impl Handler<ReadLogs> for Scheduler {
    type Result = ResponseFuture<Result<LogsChunk, ManagerError>>;

    fn handle(&mut self, m: ReadLogs, _: &mut Context<Self>) -> Self::Result {
        let (pool, metrics) = (self.pool.clone(), self.metrics.clone());
        Box::pin(async move {
            let mut opts = Vec::new();
            if let Some(o) = m.offset {
                opts.push(("offset".into(), o.into()));
            }
            if let Some(w) = m.wait {
                opts.push(("wait".into(), Value::F64(w)));
            }
            let timeout = Duration::from_secs_f64(m.wait.unwrap_or(0.0)) + Duration::from_secs(30);
            let args = GetLogsArgs {
                kernel_id: m.kernel.id.clone(),
                opts: Some(Value::Map(opts)),
            };
            let v = call_method::<GetLogs>(&pool, &metrics, &m.kernel.agent_id, &args, timeout)
                .await
                .map_err(|e| agent_error(&e))?;
            Ok(LogsChunk {
                data: match (v.data, v.logs) {
                    (Some(b), _) => b.into_vec(),
                    (None, Some(text)) => text.into_bytes(),
                    (None, None) => Vec::new(),
                },
                next: v.next,
                active: v.active,
            })
        })
    }
}
