//! Image-aware placement with real processes (issue 28, item 4): a manager and two agents on the
//! `dummy` engine, each holding a different image (`[dummy] images`), which their heartbeats
//! list. A session of an image lands on the agent holding it, even where the id or the load
//! alone would pick the other agent, and that holds either way round; a session of an image
//! nobody holds goes to the least loaded agent, and once that agent runs it (its next heartbeat
//! lists the image), the image's second session follows the first there.
//!
//! Agent host ports: 33700–33739.

use crate::common;

use std::time::Duration;

use common::cluster::{wait_for, Cluster, Db};
use serde_json::json;

const LONG: Duration = Duration::from_secs(60);

/// A session of `image` (its id kept in `sessions`): the agent it landed on.
fn place(c: &Cluster, sessions: &mut Vec<String>, image: &str) -> String {
    let a = c.post(
        "/v1/sessions",
        &json!({"image": image, "resource_slots": {"cpu": 0.25, "mem": "64m"}}),
    );
    assert_eq!(a.status, 201, "create a session of {image}: {a:?}");
    sessions.push(a.body["session_id"].as_str().unwrap().to_owned());
    a.body["agent_id"].as_str().unwrap().to_owned()
}

/// Live kernels on each of `ids`, as the manager counts them.
fn kernels(c: &Cluster, ids: [&str; 2]) -> [i64; 2] {
    ids.map(|id| c.agent_view(id).unwrap()["kernels"].as_i64().unwrap())
}

#[test]
fn a_session_lands_on_the_agent_that_holds_its_image() {
    let mut c = Cluster::new(Db::Sqlite);
    c.start_manager();
    // Ids `test-aa-…` < `test-bb-…`: between idle agents the id picks `aa`.
    let dummy = |image: &str| format!("\n[dummy]\nimages = [\"{image}\"]\n");
    let aa = c.add_agent_with(
        "aa",
        33700,
        "backend = \"dummy\"",
        &dummy("kv-locality-a:1"),
    );
    let bb = c.add_agent_with(
        "bb",
        33720,
        "backend = \"dummy\"",
        &dummy("registry.example.com:5000/team/kv-locality-b:2"),
    );
    let (a_id, b_id) = (c.agents[aa].id().to_owned(), c.agents[bb].id().to_owned());
    for id in [&a_id, &b_id] {
        c.wait_agent_status(id, "ALIVE", LONG);
        wait_for(LONG, "the agent's images known", || {
            (c.agent_view(id)?["image_count"] == 1).then_some(())
        });
    }
    wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });

    let mut sessions = Vec::new();
    // `bb` holds b: its sessions land there although the id prefers `aa` (both idle) and then
    // the load does (`bb` busier).
    let b = "registry.example.com:5000/team/kv-locality-b:2";
    assert_eq!(
        place(&c, &mut sessions, b),
        b_id,
        "idle agents, bb holds the image"
    );
    assert_eq!(kernels(&c, [&a_id, &b_id]), [0, 1]);
    assert_eq!(
        place(&c, &mut sessions, b),
        b_id,
        "bb holds the image, aa is less loaded"
    );
    assert_eq!(kernels(&c, [&a_id, &b_id]), [0, 2]);

    // The other way round: `aa` holds a (asked for in another spelling of the same image), and
    // gets its sessions until it is busier than `bb`.
    for _ in 0..4 {
        assert_eq!(
            place(&c, &mut sessions, "docker.io/library/kv-locality-a:1"),
            a_id
        );
    }
    assert_eq!(
        kernels(&c, [&a_id, &b_id]),
        [4, 2],
        "aa took a's fourth session although bb was less loaded"
    );

    // An image nobody holds: the least loaded agent (`bb`), which then holds it (the dummy
    // engine stores what it runs) and lists it in a heartbeat soon after the kernel started.
    let new = "kv-locality-new:3";
    assert_eq!(
        place(&c, &mut sessions, new),
        b_id,
        "nobody holds it: the least loaded"
    );
    wait_for(LONG, "the new image listed", || {
        (c.agent_view(&b_id)?["image_count"] == 2).then_some(())
    });
    assert_eq!(kernels(&c, [&a_id, &b_id]), [4, 3]);
    // `aa` is less loaded now, yet the second session of the image does not pull it there.
    let view = c.agent_view(&a_id).unwrap();
    assert_eq!(view["image_count"], 1, "{view}");
    assert_eq!(
        place(&c, &mut sessions, new),
        b_id,
        "the second session follows the first"
    );
    for sid in &sessions {
        assert_eq!(c.delete(&format!("/v1/sessions/{sid}")).status, 200);
    }
    assert_eq!(kernels(&c, [&a_id, &b_id]), [0, 0]);
    assert_eq!(c.concurrency_used(), 0);
}
