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
    /// Close stdin after writing (`input`).
    #[serde(default)]
    pub eof: bool,
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
