//! `agents`: the agents the manager knows, with their slots, kernels and last heartbeat
//! (`GET /v1/agents`).

use super::{render, show, unix_now, Client, Failure, Output};

/// Lists the agents: a table, or with `-o json` the API's JSON as it is.
pub(super) fn run(client: &Client, out: Output) -> Result<i32, Failure> {
    let now = unix_now();
    show(out, &client.get("/v1/agents", &[])?, |v| {
        render::agents(v, now)
    })
}
