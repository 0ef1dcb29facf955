//! `health`: the manager's status, mode and live agents (`GET /health`).

use serde_json::Value;

use super::render::{fields, opt, with, word};
use super::{show, Client, Failure, Output};
use crate::model::health::Health;

/// Shows the manager's health: `key: value` lines, or with `-o json` the API's JSON as it is.
pub(super) fn run(client: &Client, out: Output) -> Result<i32, Failure> {
    show(out, &client.health()?, health)
}

/// `GET /health`: status, mode and the number of `ALIVE` agents.
fn health(v: &Value) -> String {
    with(v, |h: Health| {
        fields(&[
            ("Status", word(h.status.as_ref())),
            ("Mode", word(h.mode.as_ref())),
            ("Agents alive", opt(h.agents_alive)),
        ])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn health_lines() {
        assert_eq!(
            health(&json!({"status": "ok", "mode": "grace", "agents_alive": 2})),
            "Status:       ok\nMode:         grace\nAgents alive: 2\n"
        );
        // Unknown keys (a newer manager) are ignored.
        let out = health(&json!({"status": "ok", "mode": "normal", "agents_alive": 1, "new": 2}));
        assert!(out.starts_with("Status:"), "{out}");
    }
}
