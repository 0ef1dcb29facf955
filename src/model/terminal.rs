//! `GET /v1/sessions/{id}/pty`: a terminal in a session over a WebSocket
//! (`docs/manager-api.md`, "Terminal"). Binary frames carry the terminal's bytes both ways; text
//! frames carry JSON control messages: [`ClientControl`] from the client, [`ServerControl`] from
//! the manager.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The query of `GET /v1/sessions/{id}/pty`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtyQuery {
    /// Lines of the terminal (1–65535; default 24).
    pub rows: Option<u16>,
    /// Columns of the terminal (1–65535; default 80).
    pub cols: Option<u16>,
    /// A shell command line to run (`sh -c`); absent: an interactive shell (`bash` when the
    /// image has it, else `sh`).
    pub command: Option<String>,
    /// A cluster session's kernel to open it in (`main1`, `sub1`, … or a kernel id); absent:
    /// the kernel the path names (the main kernel for a session id).
    pub kernel: Option<String>,
}

/// A terminal size in character cells.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    /// Lines (≥ 1).
    pub rows: u16,
    /// Columns (≥ 1).
    pub cols: u16,
}

/// A text frame from the client: `{"resize": {"rows": R, "cols": C}}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientControl {
    /// The terminal's new size (the client's window changed).
    pub resize: TerminalSize,
}

/// A text frame from the manager: `{"exit_code": N}` (then the manager closes the socket) when
/// the process ended, N null when it was killed or its code is unknown; or `{"error": {"code",
/// "message"}}` for a control frame it could not take (the terminal goes on) or a terminal it
/// lost (the socket closes after it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerControl {
    /// The process's exit code: present (maybe null) only in the last frame.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "serde_with_null"
    )]
    pub exit_code: Option<Option<i64>>,
    /// What went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::model::error::ErrorDetail>,
}

/// `Option<Option<T>>` as "key absent" / `null` / value.
mod serde_with_null {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Option<i64>>, s: S) -> Result<S::Ok, S::Error> {
        v.flatten().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<i64>>, D::Error> {
        Option::<i64>::deserialize(d).map(Some)
    }
}

impl ServerControl {
    /// The last frame: the process ended with `code`.
    pub fn exited(code: Option<i64>) -> ServerControl {
        ServerControl {
            exit_code: Some(code),
            error: None,
        }
    }

    /// An error frame of `code` with `message`.
    pub fn error(code: &str, message: &str) -> ServerControl {
        ServerControl {
            exit_code: None,
            error: Some(crate::model::error::ErrorBody::new(code, message).error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn control_frames_round_trip() {
        let c: ClientControl =
            serde_json::from_value(json!({"resize": {"rows": 30, "cols": 100}})).unwrap();
        assert_eq!(
            c.resize,
            TerminalSize {
                rows: 30,
                cols: 100
            }
        );
        for bad in [
            json!({"resize": {"rows": 30}}),
            json!({"resize": {"rows": -1, "cols": 2}}),
            json!({"resize": {"rows": 1, "cols": 2}, "x": 1}),
            json!({"rezise": {"rows": 1, "cols": 2}}),
        ] {
            assert!(
                serde_json::from_value::<ClientControl>(bad.clone()).is_err(),
                "{bad}"
            );
        }

        let exit = serde_json::to_value(ServerControl::exited(Some(7))).unwrap();
        assert_eq!(exit, json!({"exit_code": 7}));
        let killed = serde_json::to_value(ServerControl::exited(None)).unwrap();
        assert_eq!(killed, json!({"exit_code": null}));
        let back: ServerControl = serde_json::from_value(killed).unwrap();
        assert_eq!(back.exit_code, Some(None));
        let err: ServerControl = serde_json::from_value(
            serde_json::to_value(ServerControl::error("invalid-request", "bad")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            (err.exit_code, err.error.unwrap().code),
            (None, "invalid-request".into())
        );
    }
}
