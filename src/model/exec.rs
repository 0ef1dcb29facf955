//! `POST /v1/sessions/{id}/execute`: one call of Backend.AI's continuation protocol, in
//! bounded answers (`docs/manager-api.md`).

use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, Type};
use utoipa::ToSchema;

/// `POST /v1/sessions/{id}/execute` body: one call of Backend.AI's continuation protocol.
#[derive(Clone, Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteBody {
    /// `query` (default): start `code`; `continue`: more output of `run_id`; `input`: write
    /// `code` to `run_id`'s stdin.
    #[serde(default)]
    #[schema(value_type = Option<ExecMode>)]
    pub mode: Option<String>,
    /// The code (`query`, required) or the text for stdin (`input`).
    #[serde(default)]
    pub code: Option<String>,
    /// The run (`continue` / `input`, required; `query`: optional, a new id by default).
    #[serde(default)]
    pub run_id: Option<String>,
    /// Seconds; the run is killed when exceeded (`query`; default `[scheduler]
    /// execute-timeout`).
    #[serde(default)]
    #[schema(minimum = 0, exclusive_minimum = 0)]
    pub timeout: Option<f64>,
    /// Seconds to wait for output before answering `continued` (at most 60 are used).
    #[serde(default)]
    #[schema(minimum = 0, exclusive_minimum = 0)]
    pub flush_timeout: Option<f64>,
    /// Keep the run's stdin open for `input` calls (`query`).
    #[serde(default)]
    pub stdin: bool,
    /// Run `code` as a shell command line (`sh -c`) in a process of its own, even where a
    /// kernel runner serves the kernel's runs (`query`).
    #[serde(default)]
    pub shell: bool,
    /// Close stdin after writing (`input`).
    #[serde(default)]
    pub eof: bool,
    /// The kernel to run in: a cluster session's kernel by host name (`main1`, `sub1`, …) or
    /// kernel id; absent: the kernel the path names (the main kernel for a session id). A
    /// `continue` or `input` names the kernel its `query` ran in. 404 `session-not-found` when
    /// it names no kernel of the session.
    #[serde(default)]
    pub kernel: Option<String>,
}

/// One execute call as a client sends it (`kernelvisor ctl session exec`): each mode with the
/// fields it takes, so a call cannot lack its `run_id` or carry another mode's fields. The
/// server reads it as [`ExecuteBody`] (a test holds every variant to that); it is a type of its
/// own because the body's reading is looser than what a client should write (`mode` a string,
/// `timeout` any number, `eof` defaulted).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "mode", rename_all = "lowercase")]
pub enum ExecuteCall {
    /// Start `code`.
    Query {
        /// The code to run.
        code: String,
        /// Seconds to wait for output before answering `continued`.
        flush_timeout: f64,
        /// Whole seconds after which the run is killed (omitted: the manager's default).
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout: Option<u64>,
        /// Keep the run's stdin open for `input` calls (omitted when false).
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        stdin: bool,
        /// Run `code` with `sh -c` in a process of its own, not in a kernel runner's REPL
        /// (omitted when false).
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        shell: bool,
    },
    /// Write `code` to `run_id`'s stdin, closing it after when `eof`.
    Input {
        /// The run.
        run_id: String,
        /// The text for its stdin.
        code: String,
        /// Close stdin after writing (always sent, false included).
        eof: bool,
        /// Seconds to wait for output after the write.
        flush_timeout: f64,
    },
    /// More output of `run_id`.
    Continue {
        /// The run.
        run_id: String,
        /// Seconds to wait for output before answering `continued`.
        flush_timeout: f64,
    },
}

impl ExecuteCall {
    /// The run a `continue` or `input` call names; `None` for a `query`.
    pub fn run_id(&self) -> Option<&str> {
        match self {
            ExecuteCall::Query { .. } => None,
            ExecuteCall::Input { run_id, .. } | ExecuteCall::Continue { run_id, .. } => {
                Some(run_id)
            }
        }
    }
}

/// An execute call's mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExecMode {
    /// Start `code`.
    Query,
    /// More output of `run_id`.
    Continue,
    /// Write `code` to `run_id`'s stdin.
    Input,
}

/// An execute answer's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ExecStatus {
    /// More output may come: `continue`.
    Continued,
    /// The run ended (`exitCode`).
    Finished,
    /// `timeout` killed the run.
    ExecTimeout,
    /// A kernel runner's run waits for a line (`input`); `options.is_password` says whether
    /// to echo it.
    WaitingInput,
    /// A kernel runner's batch run finished its `clean` step (`exitCode`); `continue` for more.
    CleanFinished,
    /// A kernel runner's batch run finished its `build` step (`exitCode`); `continue` for more.
    BuildFinished,
}

/// One answer of Backend.AI's continuation protocol.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ExecuteAnswer {
    /// The run.
    #[serde(rename = "runId")]
    #[schema(required = true)]
    pub run_id: String,
    /// Where the run is.
    // A string: the agent's word, passed on.
    #[schema(value_type = ExecStatus, required = true)]
    pub status: String,
    /// Output since the previous answer: `[stream, text]` pairs, stream `stdout` or `stderr`
    /// (a reader also takes Backend.AI's other kinds, `media`, `html`, …, with any value).
    #[schema(schema_with = console_schema, required = true)]
    pub console: Vec<(String, serde_json::Value)>,
    /// The exit code once `finished`; null otherwise.
    #[serde(rename = "exitCode")]
    #[schema(required = true)]
    pub exit_code: Option<i64>,
    /// `waiting-input`'s options from a kernel runner (`{"is_password": bool}`); null or `{}`
    /// otherwise.
    #[schema(value_type = Option<Object>)]
    pub options: Option<serde_json::Value>,
}

fn console_schema() -> Schema {
    ArrayBuilder::new()
        .items(
            ArrayBuilder::new()
                .items(ObjectBuilder::new().schema_type(Type::String))
                .min_items(Some(2))
                .max_items(Some(2)),
        )
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call a client writes reads back as the server's body, with the same meaning.
    #[test]
    fn calls_read_as_the_body() {
        let read = |call: &ExecuteCall| -> ExecuteBody {
            serde_json::from_value(serde_json::to_value(call).unwrap()).unwrap()
        };
        let b = read(&ExecuteCall::Query {
            code: "ls".into(),
            flush_timeout: 0.5,
            timeout: Some(600),
            stdin: true,
            shell: true,
        });
        assert_eq!(b.mode.as_deref(), Some("query"));
        assert_eq!((b.code.as_deref(), b.run_id), (Some("ls"), None));
        assert_eq!((b.timeout, b.flush_timeout), (Some(600.0), Some(0.5)));
        assert!(b.stdin && b.shell && !b.eof);
        let b = read(&ExecuteCall::Input {
            run_id: "r1".into(),
            code: "x".into(),
            eof: true,
            flush_timeout: 0.01,
        });
        assert_eq!(b.mode.as_deref(), Some("input"));
        assert_eq!(
            (b.run_id.as_deref(), b.code.as_deref()),
            (Some("r1"), Some("x"))
        );
        assert!(b.eof && !b.stdin && !b.shell);
        let b = read(&ExecuteCall::Continue {
            run_id: "r1".into(),
            flush_timeout: 2.0,
        });
        assert_eq!(b.mode.as_deref(), Some("continue"));
        assert_eq!(
            (b.run_id.as_deref(), b.flush_timeout),
            (Some("r1"), Some(2.0))
        );
        assert_eq!((b.code, b.timeout), (None, None));
    }
}
