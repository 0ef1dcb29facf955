//! The agent ↔ kernel-runner wire: two-frame `[op, payload]` ZeroMQ messages over the runner's
//! PULL (`:2000`, repl-in) and PUSH (`:2001`, repl-out) sockets, as Backend.AI 26.9.6's
//! `BaseRunner.main_loop` (`src/ai/backend/kernel/base.py`) and the agent's
//! `AbstractCodeRunner.read_output` (`src/ai/backend/agent/kernel.py`) speak it. No ids: replies
//! are told apart by their op, runs by order (`docs/kernel-runner.md`, section 3).

use serde_json::Value as Json;

use crate::agent::backend::OutputStream;

/// An op the agent sends to the runner, with its payload.
#[derive(Clone, Debug, PartialEq)]
pub enum ToRunner {
    /// Query mode: Python source run by the image's Jupyter kernel.
    Code(String),
    /// Batch step 1 (`""` skips): a shell command → `clean-finished`.
    Clean(String),
    /// Batch step 2 (`""` skips, `*` guesses) → `build-finished`.
    Build(String),
    /// Batch step 3 (`""` skips, `*` guesses) → `finished`.
    Exec(String),
    /// A line for a pending `waiting-input`.
    Input(String),
    /// SIGINT to the batch child, else the Jupyter kernel's interrupt; no reply.
    Interrupt,
    /// Completion request `{"code": text, ...opts}` → `completion`.
    Complete(Json),
    /// → `status` (msgpack `{"started_at": seconds}`).
    Status,
    /// Service apps (`""`: all) → `apps-result`.
    GetApps,
    /// `{"name", "port", "ports", "protocol", "options"}` → `service-result`.
    StartService(Json),
    /// The service's name (JSON string); no reply.
    ShutdownService(String),
    /// An agent event `{"type", "data"}` (e.g. `oom`); no reply.
    Event(Json),
}

impl ToRunner {
    /// The two frames.
    pub fn frames(&self) -> [Vec<u8>; 2] {
        let text = |op: &str, s: &str| [op.as_bytes().to_vec(), s.as_bytes().to_vec()];
        let json = |op: &str, v: &Json| [op.as_bytes().to_vec(), v.to_string().into_bytes()];
        match self {
            ToRunner::Code(s) => text("code", s),
            ToRunner::Clean(s) => text("clean", s),
            ToRunner::Build(s) => text("build", s),
            ToRunner::Exec(s) => text("exec", s),
            ToRunner::Input(s) => text("input", s),
            ToRunner::Interrupt => text("interrupt", ""),
            ToRunner::Complete(v) => json("complete", v),
            ToRunner::Status => text("status", ""),
            ToRunner::GetApps => text("get-apps", ""),
            ToRunner::StartService(v) => json("start-service", v),
            ToRunner::ShutdownService(name) => json("shutdown-service", &Json::from(name.clone())),
            ToRunner::Event(v) => json("event", v),
        }
    }
}

/// Which batch step (or the query) a terminal record ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `clean-finished`.
    Clean,
    /// `build-finished`.
    Build,
    /// `finished`: the run's last record.
    Run,
}

impl Step {
    /// The answer status Backend.AI gives for it.
    pub fn status(self) -> &'static str {
        match self {
            Step::Clean => "clean-finished",
            Step::Build => "build-finished",
            Step::Run => "finished",
        }
    }
}

/// What the runner may send to the agent.
#[derive(Clone, Debug, PartialEq)]
pub enum FromRunner {
    /// Raw output bytes (may split a UTF-8 sequence).
    Output(OutputStream, Vec<u8>),
    /// A console item other than stdout/stderr, as the answer carries it: `media` as
    /// `[mime, data]`, `html` and `log` as text.
    Item(&'static str, Json),
    /// The run waits for a line (`input`): its options (`{"is_password": bool}`, or `{}`).
    WaitingInput(Json),
    /// A step ended with this exit code (`None`: the payload had none).
    Finished(Step, Option<i64>),
    /// The reply to `status`: the runner's `started_at` (its monotonic clock, seconds).
    Status(Option<f64>),
    /// The reply to `complete` (JSON text).
    Completion(Json),
    /// The reply to `start-service` (JSON).
    ServiceResult(Json),
    /// The reply to `get-apps` (JSON).
    AppsResult(Json),
    /// `model-service-result` / `model-service-status`: not used by this agent; dropped.
    ModelService,
}

/// Why a message from the runner was dropped (the runner lives in a container its user
/// controls: anything may arrive on repl-out).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// Not exactly two frames.
    #[error("{0} frames, not 2")]
    FrameCount(usize),
    /// An op this agent does not know.
    #[error("unknown op {0:?}")]
    UnknownOp(String),
    /// A payload that does not decode as the op's format.
    #[error("`{op}` payload does not decode: {why}")]
    Payload {
        /// The op.
        op: &'static str,
        /// What failed.
        why: String,
    },
}

fn json_payload(op: &'static str, data: &[u8]) -> Result<Json, Malformed> {
    if data.is_empty() {
        return Ok(Json::Object(Default::default()));
    }
    serde_json::from_slice(data).map_err(|e| Malformed::Payload {
        op,
        why: e.to_string(),
    })
}

fn exit_code(op: &'static str, data: &[u8]) -> Result<Option<i64>, Malformed> {
    Ok(json_payload(op, data)?
        .get("exitCode")
        .and_then(Json::as_i64))
}

/// A `media` payload: JSON `{"type": mime, "data": ...}` for images; upstream's python runner
/// sends `text/html` as the raw HTML instead (a bug its own agent would crash on), which
/// becomes an `html` item here.
fn media(data: &[u8]) -> FromRunner {
    match serde_json::from_slice::<Json>(data) {
        Ok(Json::Object(o)) if o.get("type").is_some_and(Json::is_string) => {
            let mime = o.get("type").cloned().unwrap_or_default();
            let body = o.get("data").cloned().unwrap_or(Json::Null);
            FromRunner::Item("media", Json::Array(vec![mime, body]))
        }
        _ => FromRunner::Item(
            "html",
            Json::String(String::from_utf8_lossy(data).into_owned()),
        ),
    }
}

/// Decodes one message off repl-out.
///
/// Errors: [`Malformed`] for a message the agent drops (the caller logs it, rate-limited).
pub fn decode(frames: &[&[u8]]) -> Result<FromRunner, Malformed> {
    let [op, data] = frames else {
        return Err(Malformed::FrameCount(frames.len()));
    };
    let data: &[u8] = data;
    Ok(match *op {
        b"stdout" => FromRunner::Output(OutputStream::Stdout, data.to_vec()),
        b"stderr" => FromRunner::Output(OutputStream::Stderr, data.to_vec()),
        b"media" => media(data),
        b"html" => FromRunner::Item("html", String::from_utf8_lossy(data).into_owned().into()),
        b"log" => FromRunner::Item("log", String::from_utf8_lossy(data).into_owned().into()),
        b"waiting-input" => FromRunner::WaitingInput(json_payload("waiting-input", data)?),
        b"finished" => FromRunner::Finished(Step::Run, exit_code("finished", data)?),
        b"clean-finished" => FromRunner::Finished(Step::Clean, exit_code("clean-finished", data)?),
        b"build-finished" => FromRunner::Finished(Step::Build, exit_code("build-finished", data)?),
        b"status" => {
            let v: rmpv::Value = rmp_serde::from_slice(data).map_err(|e| Malformed::Payload {
                op: "status",
                why: e.to_string(),
            })?;
            let started = match &v {
                rmpv::Value::Map(m) => m
                    .iter()
                    .find(|(k, _)| k.as_str() == Some("started_at"))
                    .and_then(|(_, v)| v.as_f64().or_else(|| v.as_i64().map(|n| n as f64))),
                _ => None,
            };
            FromRunner::Status(started)
        }
        b"completion" => FromRunner::Completion(json_payload("completion", data)?),
        b"service-result" => FromRunner::ServiceResult(json_payload("service-result", data)?),
        b"apps-result" => FromRunner::AppsResult(json_payload("apps-result", data)?),
        b"model-service-result" | b"model-service-status" => FromRunner::ModelService,
        other => {
            return Err(Malformed::UnknownOp(
                String::from_utf8_lossy(&other[..other.len().min(64)]).into_owned(),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(op: &str, data: &[u8]) -> Result<FromRunner, Malformed> {
        decode(&[op.as_bytes(), data])
    }

    #[test]
    fn terminal_records_carry_their_exit_codes() {
        assert_eq!(
            d("finished", br#"{"exitCode": 4}"#),
            Ok(FromRunner::Finished(Step::Run, Some(4)))
        );
        assert_eq!(
            d("build-finished", br#"{"exitCode": 0}"#),
            Ok(FromRunner::Finished(Step::Build, Some(0)))
        );
        assert_eq!(
            d("waiting-input", br#"{"is_password": false}"#),
            Ok(FromRunner::WaitingInput(
                serde_json::json!({"is_password": false})
            ))
        );
        // A batch `input()` sends an empty payload.
        assert_eq!(
            d("waiting-input", b""),
            Ok(FromRunner::WaitingInput(serde_json::json!({})))
        );
    }

    #[test]
    fn media_json_and_raw_html() {
        assert_eq!(
            d("media", br#"{"type": "image/png", "data": "data:x"}"#),
            Ok(FromRunner::Item(
                "media",
                serde_json::json!(["image/png", "data:x"])
            ))
        );
        // Upstream's python runner sends text/html raw: an `html` item, not a crash.
        assert_eq!(
            d("media", b"<b>x</b>"),
            Ok(FromRunner::Item("html", serde_json::json!("<b>x</b>")))
        );
    }

    #[test]
    fn status_is_msgpack() {
        let mut buf = Vec::new();
        let v = rmpv::Value::Map(vec![("started_at".into(), rmpv::Value::F64(12.5))]);
        rmpv::encode::write_value(&mut buf, &v).unwrap();
        assert_eq!(d("status", &buf), Ok(FromRunner::Status(Some(12.5))));
    }

    #[test]
    fn garbage_is_named_not_fatal() {
        assert_eq!(decode(&[b"stdout"]), Err(Malformed::FrameCount(1)));
        assert_eq!(decode(&[b"a", b"b", b"c"]), Err(Malformed::FrameCount(3)));
        assert!(matches!(d("bogus", b""), Err(Malformed::UnknownOp(_))));
        assert!(matches!(
            d("finished", b"{not json"),
            Err(Malformed::Payload { op: "finished", .. })
        ));
        assert!(matches!(
            d("status", b"\xc1"),
            Err(Malformed::Payload { op: "status", .. })
        ));
    }

    #[test]
    fn ops_are_two_frames() {
        assert_eq!(
            ToRunner::Code("x = 41".into()).frames(),
            [b"code".to_vec(), b"x = 41".to_vec()]
        );
        assert_eq!(
            ToRunner::ShutdownService("ttyd".into()).frames(),
            [b"shutdown-service".to_vec(), b"\"ttyd\"".to_vec()]
        );
        assert_eq!(ToRunner::Interrupt.frames()[1], b"".to_vec());
    }
}
