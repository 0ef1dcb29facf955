//! Code execution methods: `execute`, `trigger_batch_execution`, `interrupt_kernel`,
//! `get_completions`, `get_logs` (`ai.backend.agent.server.AgentRPCServer`).

use std::collections::BTreeMap;

use rmpv::Value;
use serde::{Deserialize, Serialize};

use super::kernel::KernelIdArgs;
use super::Method;

/// `execute(session_id, kernel_id, api_version, run_id, mode, code, opts, flush_timeout)` →
/// `{"runId", "status", "console": [[type, text]], "exitCode", "options", "files"}`
/// (upstream's result map; `status` `continued` / `waiting-input` / `finished` /
/// `exec-timeout`; `mode` `query` / `batch` / `continue` / `input`).
pub struct Execute;

/// Arguments of [`Execute`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecuteArgs {
    /// Session id.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Kernel id.
    pub kernel_id: String,
    /// Client API version (major).
    #[serde(default)]
    pub api_version: Option<Value>,
    /// Run id; a new one is made when nil.
    #[serde(default)]
    pub run_id: Option<String>,
    /// `query`, `batch`, `continue`, `input`.
    pub mode: String,
    /// The code (or the input text).
    #[serde(default)]
    pub code: String,
    /// `{"timeout": seconds, "stdin": bool, "eof": bool, …}`.
    #[serde(default)]
    pub opts: Option<BTreeMap<String, Value>>,
    /// Seconds to wait for output before answering `continued`.
    #[serde(default)]
    pub flush_timeout: Option<f64>,
}

/// The reply of [`Execute`]: Backend.AI's result map.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecuteResult {
    /// The run's id.
    #[serde(rename = "runId")]
    pub run_id: String,
    /// `continued`, `waiting-input`, `clean-finished`, `build-finished`, `finished`,
    /// `exec-timeout`.
    pub status: String,
    /// Output as `[type, data]` pairs, in order: `stdout`/`stderr`/`html`/`log` with text,
    /// `media` with `[mime, data]` (Backend.AI's console items).
    pub console: Vec<(String, Value)>,
    /// The exit code once finished.
    #[serde(rename = "exitCode", default)]
    pub exit_code: Option<i64>,
    /// Options for the client: `waiting-input`'s `{"is_password": bool}` from the kernel
    /// runner; nil for its other answers (as upstream); `{}` on the process path.
    #[serde(default)]
    pub options: Option<BTreeMap<String, Value>>,
}

impl Method for Execute {
    const NAME: &'static str = "execute";
    const PARAMS: &'static [&'static str] = &[
        "session_id",
        "kernel_id",
        "api_version",
        "run_id",
        "mode",
        "code",
        "opts",
        "flush_timeout",
    ];
    type Args = ExecuteArgs;
    type Reply = ExecuteResult;
}

/// `trigger_batch_execution(session_id, kernel_id, code, timeout_seconds)` → nil: runs `code`
/// as the kernel's batch job in the background; its end is a `session_success` /
/// `session_failure` event.
pub struct TriggerBatchExecution;

/// Arguments of [`TriggerBatchExecution`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TriggerBatchExecutionArgs {
    /// Session id.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Kernel id.
    pub kernel_id: String,
    /// Shell command.
    pub code: String,
    /// Seconds before it is killed; nil for no limit.
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
}

impl Method for TriggerBatchExecution {
    const NAME: &'static str = "trigger_batch_execution";
    const PARAMS: &'static [&'static str] = &["session_id", "kernel_id", "code", "timeout_seconds"];
    type Args = TriggerBatchExecutionArgs;
    type Reply = Value;
}

/// `interrupt_kernel(kernel_id)` → `{}`: SIGINT to the container's main process.
pub struct InterruptKernel;

impl Method for InterruptKernel {
    const NAME: &'static str = "interrupt_kernel";
    const PARAMS: &'static [&'static str] = &["kernel_id"];
    type Args = KernelIdArgs;
    type Reply = BTreeMap<String, Value>;
}

/// `get_completions(kernel_id, text, opts)` → `{"result": {"status", "error", "suggestions"}}`
/// (upstream's `CodeCompletionResp.as_dict()`, `src/ai/backend/common/dto/agent/response.py`,
/// which its manager reads back with `from_dict`): the kernel runner's `complete` on a runner
/// kernel (26.9.6's runner answers no suggestions), no suggestions on the process path.
pub struct GetCompletions;

/// Arguments of [`GetCompletions`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GetCompletionsArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// Text to complete.
    #[serde(default)]
    pub text: String,
    /// Options.
    #[serde(default)]
    pub opts: Option<Value>,
}

/// Reply of [`GetCompletions`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeCompletionResult {
    /// `finished` or `failed`.
    pub status: String,
    /// Why it failed.
    pub error: Option<String>,
    /// Completions.
    pub suggestions: Vec<String>,
}

/// Reply of [`GetCompletions`]: upstream's `CodeCompletionResp`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeCompletionResp {
    /// The completion.
    pub result: CodeCompletionResult,
}

impl Method for GetCompletions {
    const NAME: &'static str = "get_completions";
    const PARAMS: &'static [&'static str] = &["kernel_id", "text", "opts"];
    type Args = GetCompletionsArgs;
    type Reply = CodeCompletionResp;
}

/// `get_logs(kernel_id, opts=None)` → `{"logs": text}` as upstream, plus kernelvisor's paging
/// keys (`start`, `next`, `active`, `data`) when `opts` asks for a range.
pub struct GetLogs;

/// Arguments of [`GetLogs`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GetLogsArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// kernelvisor: `{"start", "limit", "follow_ms"}` paging.
    #[serde(default)]
    pub opts: Option<Value>,
}

/// The reply of [`GetLogs`]: `logs` (text, the tail) without `opts.offset`, `data` (bytes)
/// with it; `start` and `next` are absolute byte offsets; `active` while the kernel runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LogsReply {
    /// The tail as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<String>,
    /// Bytes from the requested offset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_bytes::ByteBuf>,
    /// Offset of the first byte answered.
    #[serde(default)]
    pub start: u64,
    /// Offset to read on from.
    #[serde(default)]
    pub next: u64,
    /// The kernel still runs.
    #[serde(default)]
    pub active: bool,
}

impl Method for GetLogs {
    const NAME: &'static str = "get_logs";
    const PARAMS: &'static [&'static str] = &["kernel_id", "opts"];
    type Args = GetLogsArgs;
    type Reply = LogsReply;
}
