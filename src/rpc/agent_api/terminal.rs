//! kernelvisor's terminal methods (no Backend.AI counterpart): a process with a pseudo-terminal
//! in a kernel's container, driven by the manager's `GET /v1/sessions/{id}/pty` WebSocket.
//!
//! `pty_start` starts it; `pty_read` long-polls its output as raw bytes; `pty_write` types into
//! it (Ctrl+C is the byte `0x03`, which the terminal turns into `SIGINT`); `pty_resize` sets its
//! size; `pty_close` kills it. A terminal nobody reads for the agent's `exec-idle-timeout` is
//! killed and forgotten. FAILURE names: `KernelNotFound`, `KernelNotRunning`, `RunNotFound`,
//! `RunExists`, `RunStdinClosed`, `RunHasNoTty`, `TypeError` (a zero size),
//! `ContainerEngineError`, `ContainerEngineUnavailable`.

use serde::{Deserialize, Serialize};

use super::Method;

/// `pty_start(kernel_id, run_id, command, rows, cols)` → [`PtyStarted`]: starts `command`
/// (`sh -c command`; nil: the container's shell, `bash` when it has one, else `sh`) in
/// `/home/work` with a `rows`×`cols` terminal and `TERM=xterm-256color`.
pub struct PtyStart;

/// Arguments of [`PtyStart`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyStartArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// The terminal's id, unique on the agent (its runs share the ids of `execute`'s); a new
    /// one when nil.
    #[serde(default)]
    pub run_id: Option<String>,
    /// A shell command line; nil: an interactive shell.
    #[serde(default)]
    pub command: Option<String>,
    /// Lines (1–65535).
    pub rows: u16,
    /// Columns (1–65535).
    pub cols: u16,
}

/// The reply of [`PtyStart`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyStarted {
    /// The terminal's id, for the other `pty_*` calls.
    pub run_id: String,
}

impl Method for PtyStart {
    const NAME: &'static str = "pty_start";
    const PARAMS: &'static [&'static str] = &["kernel_id", "run_id", "command", "rows", "cols"];
    type Args = PtyStartArgs;
    type Reply = PtyStarted;
}

/// `pty_read(kernel_id, run_id, max_bytes, wait)` → [`PtyOutput`]: the output since the last
/// read, answered as soon as there is any, or after `wait` seconds with none.
pub struct PtyRead;

/// Arguments of [`PtyRead`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PtyReadArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// The terminal.
    pub run_id: String,
    /// At most this many bytes (also at most the agent's `exec-buffer-size`).
    pub max_bytes: u64,
    /// Seconds to wait for output (at most 60 are used).
    pub wait: f64,
}

/// The reply of [`PtyRead`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyOutput {
    /// The terminal's bytes, in order (msgpack bin).
    pub data: serde_bytes::ByteBuf,
    /// The process ended and `data` is the last of its output; the terminal is forgotten.
    pub finished: bool,
    /// Its exit code, once `finished` (nil when killed or unknown).
    #[serde(default)]
    pub exit_code: Option<i64>,
}

impl Method for PtyRead {
    const NAME: &'static str = "pty_read";
    const PARAMS: &'static [&'static str] = &["kernel_id", "run_id", "max_bytes", "wait"];
    type Args = PtyReadArgs;
    type Reply = PtyOutput;
}

/// `pty_write(kernel_id, run_id, data)` → nil: types `data` into the terminal (waits while the
/// terminal's input buffer is full, up to 10 s: `RunStdinClosed`).
pub struct PtyWrite;

/// Arguments of [`PtyWrite`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyWriteArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// The terminal.
    pub run_id: String,
    /// Bytes to type (msgpack bin).
    pub data: serde_bytes::ByteBuf,
}

impl Method for PtyWrite {
    const NAME: &'static str = "pty_write";
    const PARAMS: &'static [&'static str] = &["kernel_id", "run_id", "data"];
    type Args = PtyWriteArgs;
    type Reply = rmpv::Value;
}

/// `pty_resize(kernel_id, run_id, rows, cols)` → nil: the terminal's new size (its processes
/// get `SIGWINCH`).
pub struct PtyResize;

/// Arguments of [`PtyResize`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyResizeArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// The terminal.
    pub run_id: String,
    /// Lines (1–65535).
    pub rows: u16,
    /// Columns (1–65535).
    pub cols: u16,
}

impl Method for PtyResize {
    const NAME: &'static str = "pty_resize";
    const PARAMS: &'static [&'static str] = &["kernel_id", "run_id", "rows", "cols"];
    type Args = PtyResizeArgs;
    type Reply = rmpv::Value;
}

/// `pty_close(kernel_id, run_id)` → nil: kills the terminal's processes (when they still run)
/// and forgets it.
pub struct PtyClose;

/// Arguments of [`PtyClose`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyCloseArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// The terminal.
    pub run_id: String,
}

impl Method for PtyClose {
    const NAME: &'static str = "pty_close";
    const PARAMS: &'static [&'static str] = &["kernel_id", "run_id"];
    type Args = PtyCloseArgs;
    type Reply = rmpv::Value;
}
