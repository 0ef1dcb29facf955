//! Placement over every resource slot with real processes: two agents, one with a mock
//! accelerator (4 devices serving `cuda.device`) and one without. Accelerator requests always
//! land on the first, plain ones spread over both; the manager learns the slot from the agent's
//! heartbeats (`slot_key_and_units`), refuses a slot no agent has (400 `unknown-slot`), answers
//! 409 `no-capacity` when the devices are taken, and the devices are free again afterwards.
//! Device and per-kernel GPU metrics of the mock show on the agent's `/metrics`.
//!
//! Agent host ports: 33400–33439.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::agent::TEST_IMAGE;
use common::cluster::{wait_for, Cluster, Db};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);

const MOCK_GPUS: &str = "
[[accelerator.mock.devices]]
id = \"0\"
memory = \"16g\"
slot = \"cuda.device\"

[[accelerator.mock.devices]]
id = \"1\"
memory = \"16g\"
slot = \"cuda.device\"

[[accelerator.mock.devices]]
id = \"2\"
memory = \"16g\"
slot = \"cuda.device\"

[[accelerator.mock.devices]]
id = \"3\"
memory = \"16g\"
slot = \"cuda.device\"
";

fn create(c: &Cluster, slots: Value) -> (u16, Value) {
    let a = c.post(
        "/v1/sessions",
        &json!({"image": TEST_IMAGE, "resource_slots": slots}),
    );
    (a.status, a.body)
}

fn scrape(c: &Cluster, i: usize) -> String {
    ureq::get(&format!(
        "http://127.0.0.1:{}/metrics",
        c.agents[i].metrics_port
    ))
    .call()
    .unwrap()
    .into_string()
    .unwrap()
}

#[test]
fn accelerator_requests_land_on_the_agent_that_has_it() {
    let mut c = Cluster::new(Db::Sqlite);
    c.start_manager();
    let gpu = c.add_agent_with("gpu", 33400, "", MOCK_GPUS);
    let plain = c.add_agent("plain", 33420, "");
    let (gpu_id, plain_id) = (
        c.agents[gpu].id().to_owned(),
        c.agents[plain].id().to_owned(),
    );
    c.wait_agent_status(&gpu_id, "ALIVE", LONG);
    c.wait_agent_status(&plain_id, "ALIVE", LONG);
    // The manager knows the slot once the agent's heartbeat advertised it.
    wait_for(LONG, "cuda.device advertised", || {
        let v = c.agent_view(&gpu_id)?;
        (v["slots_total"]["cuda.device"] == "4").then_some(())
    });
    wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });

    // Plain requests spread over both agents.
    let mut plain_agents = BTreeSet::new();
    let mut plain_sessions = Vec::new();
    for _ in 0..4 {
        let (status, body) = create(&c, json!({"cpu": 0.25, "mem": "64m"}));
        assert_eq!(status, 201, "{body}");
        plain_agents.insert(body["agent_id"].as_str().unwrap().to_owned());
        plain_sessions.push(body["session_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        plain_agents,
        BTreeSet::from([gpu_id.clone(), plain_id.clone()]),
        "plain requests use both agents"
    );
    for sid in &plain_sessions {
        assert_eq!(c.delete(&format!("/v1/sessions/{sid}")).status, 200);
    }

    // Two sessions of 2 devices: both on the GPU agent, disjoint devices.
    let mut gpu_sessions = Vec::new();
    for _ in 0..2 {
        let (status, body) = create(&c, json!({"cpu": 0.25, "mem": "64m", "cuda.device": 2}));
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["agent_id"], gpu_id.as_str(), "{body}");
        gpu_sessions.push(body);
    }
    let s = c
        .get(&format!(
            "/v1/sessions/{}",
            gpu_sessions[0]["session_id"].as_str().unwrap()
        ))
        .unwrap()
        .body;
    assert_eq!(s["resource_slots"]["cuda.device"], "2", "{s}");
    let map = c.agent_call(gpu, "scan_gpu_alloc_map", vec![]);
    let devices: Vec<BTreeSet<String>> = gpu_sessions
        .iter()
        .map(|b| {
            let kid = b["kernel_id"].as_str().unwrap();
            let entry = map
                .as_map()
                .unwrap()
                .iter()
                .find(|(k, _)| k.as_str() == Some(kid))
                .unwrap_or_else(|| panic!("{kid} in {map:?}"))
                .1
                .clone();
            entry
                .as_map()
                .unwrap()
                .iter()
                .map(|(d, _)| d.as_str().unwrap().to_owned())
                .collect()
        })
        .collect();
    assert_eq!(devices[0].len(), 2);
    assert_eq!(devices[1].len(), 2);
    assert!(devices[0].is_disjoint(&devices[1]), "{devices:?}");

    // Device metrics for each mock device, and per-kernel GPU memory for a kernel holding some.
    let kid = gpu_sessions[0]["kernel_id"].as_str().unwrap().to_owned();
    wait_for(LONG, "device and kernel GPU metrics", || {
        let text = scrape(&c, gpu);
        let devices_shown = (0..4).all(|d| {
            text.lines().any(|l| {
                l.starts_with("backendai_device_utilization{")
                    && l.contains("device_metric_name=\"cuda_util\"")
                    && l.contains(&format!("device_id=\"{d}\""))
            })
        });
        let kernel_shown = text.lines().any(|l| {
            l.starts_with("backendai_container_utilization{")
                && l.contains("container_metric_name=\"cuda_mem\"")
                && l.contains(&format!("kernel_id=\"{kid}\""))
        });
        (devices_shown && kernel_shown).then_some(())
    });

    // The GPU agent is full: a third accelerator request waits, saying which slot is short
    // (and with `enqueue: false` is refused at once). Deleting it cancels it.
    let (status, body) = create(&c, json!({"cpu": 0.25, "mem": "64m", "cuda.device": 1}));
    assert_eq!(
        (status, body["status"].as_str()),
        (201, Some("PENDING")),
        "{body}"
    );
    assert_eq!(body["pending_reason"]["code"], "no-capacity", "{body}");
    assert!(
        body["pending_reason"]["message"]
            .as_str()
            .unwrap()
            .contains("`cuda.device`"),
        "{body}"
    );
    let d = c.delete(&format!(
        "/v1/sessions/{}",
        body["session_id"].as_str().unwrap()
    ));
    assert_eq!(d.body["status"], "CANCELLED", "{d:?}");
    let a = c.post(
        "/v1/sessions",
        &json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m", "cuda.device": 1}, "enqueue": false}),
    );
    assert_eq!((a.status, a.code()), (409, "no-capacity"), "{a:?}");
    // More than any agent has, or a slot no agent has.
    let (status, body) = create(&c, json!({"cpu": 0.25, "mem": "64m", "cuda.device": 5}));
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("slots-exceed-capacity")),
        "{body}"
    );
    let (status, body) = create(&c, json!({"cpu": 0.25, "mem": "64m", "rocm.device": 1}));
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("unknown-slot")),
        "{body}"
    );
    assert!(body.to_string().contains("rocm.device"), "{body}");

    // Devices come back when the sessions end; the kernel's GPU series go.
    for b in &gpu_sessions {
        let sid = b["session_id"].as_str().unwrap();
        assert_eq!(c.delete(&format!("/v1/sessions/{sid}")).status, 200);
    }
    wait_for(LONG, "the kernel's series gone", || {
        (!scrape(&c, gpu).contains(&format!("kernel_id=\"{kid}\""))).then_some(())
    });
    let map = c.agent_call(gpu, "scan_gpu_alloc_map", vec![]);
    assert!(map.as_map().is_none_or(Vec::is_empty), "{map:?}");
    let (status, body) = create(&c, json!({"cpu": 0.25, "mem": "64m", "cuda.device": 4}));
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["agent_id"], gpu_id.as_str());
    let sid = body["session_id"].as_str().unwrap().to_owned();
    assert_eq!(c.delete(&format!("/v1/sessions/{sid}")).status, 200);
    c.check_invariants();
}
