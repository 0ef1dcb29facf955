//! `health`: the manager's status, mode and live agents (`GET /health`).

use super::{render, show, Client, Failure, Output};

/// Shows the manager's health: `key: value` lines, or with `-o json` the API's JSON as it is.
pub(super) fn run(client: &Client, out: Output) -> Result<i32, Failure> {
    show(out, &client.health()?, render::health)
}
