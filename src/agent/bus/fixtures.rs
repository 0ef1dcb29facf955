//! Our encoder against what the real Backend.AI 26.9.6 classes write for the same events
//! (`tests/fixtures/bai/events/*.json`, written by `scripts/bai-bus-fixtures.py` in the
//! 26.9.6 root): the stream fields and the broadcast message must carry the same values, so
//! a codec regression fails here, without Redis.

use std::collections::BTreeMap;

use serde_json::Value;

use super::encode::{self, AgentInfo, BusMessage, SlotEntry};
use crate::agent::events::{AgentEvent, StartedInfo, StartedServicePort, UsedDevice};

const AGENT: &str = "i-fixture-agent";
const KID: &str = "5b2c6f6e-1d2a-4c4e-9a51-0c8f3d7b9e01";
const SID: &str = "a1f0e4d2-3b5c-4e6f-8a7b-9c0d1e2f3a4b";
const CONTAINER: &str = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa99887766554433221100";
const IMAGE: &str = "cr.backend.ai/stable/python:3.9-ubuntu20.04";

/// [`IMAGE`] as a check_and_pull's image config names it (registry `cr.backend.ai`, project
/// `stable`), by its parts.
fn image_ref() -> Option<crate::rpc::agent_api::kernel::ImageRef> {
    let mut config = crate::rpc::agent_api::kernel::ImageConfig::by_reference(IMAGE);
    config.registry.name = "cr.backend.ai".into();
    config.project = Some("stable".into());
    config.architecture = "x86_64".into();
    let r = config.image_ref();
    assert!(r.is_some(), "{IMAGE} parses");
    r
}

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/bai/events/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).expect(&path)).unwrap()
}

/// A JSON string holding JSON, parsed.
fn inner(v: &Value) -> Value {
    serde_json::from_str(v.as_str().expect("a JSON string")).expect("JSON inside")
}

fn check(fixture_name: &str, msg: &BusMessage) {
    let f = fixture(fixture_name);
    assert_eq!(msg.name, f["name"], "{fixture_name}: name");
    let fields: BTreeMap<&str, String> = msg.stream_fields(AGENT).into_iter().collect();
    let want = f["xadd_fields"].as_object().unwrap();
    assert_eq!(
        fields.keys().copied().collect::<Vec<_>>(),
        want.keys().map(String::as_str).collect::<Vec<_>>(),
        "{fixture_name}: stream field names"
    );
    for k in ["name", "source", "metadata"] {
        assert_eq!(fields[k], want[k], "{fixture_name}: field {k}");
    }
    assert_eq!(
        serde_json::from_str::<Value>(&fields["payload"]).unwrap(),
        inner(&want["payload"]),
        "{fixture_name}: payload"
    );
    match &f["publish_message"] {
        Value::Null => assert!(
            !msg.broadcast,
            "{fixture_name}: upstream does not broadcast it"
        ),
        wire => {
            assert!(msg.broadcast, "{fixture_name}: upstream broadcasts it");
            let ours: Value = serde_json::from_str(&msg.broadcast_json(AGENT)).unwrap();
            let theirs = inner(wire);
            for k in ["name", "source", "metadata"] {
                assert_eq!(ours[k], theirs[k], "{fixture_name}: broadcast {k}");
            }
            assert_eq!(
                inner(&ours["payload"]),
                inner(&theirs["payload"]),
                "{fixture_name}: broadcast payload"
            );
            assert_eq!(
                ours.as_object().unwrap().len(),
                theirs.as_object().unwrap().len(),
                "{fixture_name}: broadcast keys"
            );
        }
    }
}

fn enc(e: AgentEvent) -> BusMessage {
    encode::encode(&e, AGENT).unwrap_or_else(|| panic!("{e:?} goes on the bus"))
}

fn started_info() -> StartedInfo {
    let unit = |model: &str, slot: &str, amount: &str, mem: Option<i64>| UsedDevice {
        model_name: Some(model.into()),
        used: BTreeMap::from([(slot.to_owned(), amount.to_owned())]),
        processing_units: None,
        memory_size: mem,
    };
    StartedInfo {
        container_id: CONTAINER.into(),
        kernel_host: "10.0.0.11".into(),
        repl_in_port: 0,
        repl_out_port: 0,
        service_ports: vec![StartedServicePort {
            name: "jupyter".into(),
            protocol: "http".into(),
            container_ports: vec![8888],
            host_ports: vec![30001],
        }],
        used_devices: BTreeMap::from([
            (
                "cpu".into(),
                BTreeMap::from([("0".into(), unit("", "cpu", "1.5", None))]),
            ),
            (
                "cuda".into(),
                BTreeMap::from([(
                    "0".into(),
                    unit("NVIDIA H100", "cuda.device", "1", Some(85_899_345_920)),
                )]),
            ),
            (
                "mem".into(),
                BTreeMap::from([("root".into(), unit("", "mem", "1073741824", None))]),
            ),
        ]),
    }
}

#[test]
fn every_event_encodes_as_upstream_does() {
    let (k, s) = (KID.to_owned(), SID.to_owned());
    check("agent_started", &enc(AgentEvent::AgentStarted));
    check(
        "agent_terminated",
        &enc(AgentEvent::AgentTerminated {
            reason: "shutdown".into(),
        }),
    );
    check(
        "agent_error",
        &enc(AgentEvent::AgentError {
            message: "boom".into(),
            traceback: Some("at stage image".into()),
        }),
    );
    check(
        "kernel_preparing",
        &enc(AgentEvent::KernelPreparing {
            kernel_id: k.clone(),
            session_id: s.clone(),
        }),
    );
    check(
        "kernel_pulling",
        &enc(AgentEvent::KernelPulling {
            kernel_id: k.clone(),
            session_id: s.clone(),
            image: Some(IMAGE.into()),
        }),
    );
    check(
        "kernel_creating",
        &enc(AgentEvent::KernelCreating {
            kernel_id: k.clone(),
            session_id: s.clone(),
        }),
    );
    check(
        "kernel_started",
        &enc(AgentEvent::KernelStarted {
            kernel_id: k.clone(),
            session_id: s.clone(),
            creation_info: Some(Box::new(started_info())),
        }),
    );
    check(
        "kernel_terminated",
        &enc(AgentEvent::KernelTerminated {
            kernel_id: k.clone(),
            session_id: s.clone(),
            reason: "user-requested".into(),
            exit_code: None,
        }),
    );
    check(
        "kernel_terminated_oom",
        &enc(AgentEvent::KernelTerminated {
            kernel_id: k.clone(),
            session_id: s.clone(),
            reason: "oom-killed".into(),
            exit_code: Some(137),
        }),
    );
    check(
        "session_success",
        &enc(AgentEvent::SessionSuccess {
            kernel_id: k.clone(),
            session_id: s.clone(),
            exit_code: Some(0),
        }),
    );
    check(
        "session_failure",
        &enc(AgentEvent::SessionFailure {
            kernel_id: k.clone(),
            session_id: s.clone(),
            reason: "self-terminated".into(),
            exit_code: Some(3),
        }),
    );
    check(
        "session_failure_timeout",
        &enc(AgentEvent::SessionFailure {
            kernel_id: k.clone(),
            session_id: s.clone(),
            reason: "batch-timeout".into(),
            exit_code: None,
        }),
    );
    let run = || ("r".to_owned(), k.clone(), s.clone());
    let (run_id, kernel_id, session_id) = run();
    check(
        "execution_started",
        &enc(AgentEvent::ExecutionStarted {
            kernel_id,
            session_id,
            run_id,
        }),
    );
    let (run_id, kernel_id, session_id) = run();
    check(
        "execution_finished",
        &enc(AgentEvent::ExecutionFinished {
            kernel_id,
            session_id,
            run_id,
            exit_code: Some(0),
        }),
    );
    let (run_id, kernel_id, session_id) = run();
    check(
        "execution_timeout",
        &enc(AgentEvent::ExecutionTimeout {
            kernel_id,
            session_id,
            run_id,
        }),
    );
    check(
        "image_pull_started",
        &enc(AgentEvent::ImagePullStarted {
            image: IMAGE.into(),
            timestamp: 1767225600.25,
            image_ref: image_ref(),
        }),
    );
    check(
        "image_pull_finished",
        &enc(AgentEvent::ImagePullFinished {
            image: IMAGE.into(),
            timestamp: 1767225600.25,
            msg: Some("Image already exists".into()),
            image_ref: image_ref(),
        }),
    );
    check(
        "image_pull_failed",
        &enc(AgentEvent::ImagePullFailed {
            image: IMAGE.into(),
            msg: "timeout (s:60)".into(),
            image_ref: image_ref(),
        }),
    );
    check(
        "do_sync_kernel_logs",
        &enc(AgentEvent::DoSyncKernelLogs {
            kernel_id: k,
            container_id: CONTAINER.into(),
        }),
    );
}

#[test]
fn the_heartbeat_is_upstreams_agent_info() {
    let slot = |t: &str, q: &str| SlotEntry {
        resource_type: t.into(),
        quantity: q.into(),
    };
    let info = AgentInfo {
        ip: "10.0.0.11".into(),
        region: Some("local".into()),
        scaling_group: Some("default".into()),
        addr: "tcp://10.0.0.11:6011".into(),
        public_key: Some("Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID".into()),
        public_host: "10.0.0.11".into(),
        available_resource_slots: vec![
            slot("cpu", "8"),
            slot("cuda.device", "2"),
            slot("mem", "17179869184"),
        ],
        slot_key_and_units: BTreeMap::from([
            ("cpu".into(), "count".into()),
            ("cuda.device".into(), "count".into()),
            ("mem".into(), "bytes".into()),
        ]),
        version: "0.1.0".into(),
        compute_plugins: BTreeMap::from([
            (
                "cpu".into(),
                serde_json::json!({"agent_version": "0.1.0", "machine": "x86_64", "os_type": "Linux", "version": "0.1.0"}),
            ),
            ("cuda".into(), serde_json::json!({"version": "0.1.0"})),
            ("mem".into(), serde_json::json!({"version": "0.1.0"})),
        ]),
        architecture: "x86_64".into(),
        auto_terminate_abusing_kernel: false,
    };
    check("agent_heartbeat", &encode::heartbeat(&info));
}

#[test]
fn what_upstream_has_no_class_for_stays_off_the_bus() {
    let (k, s) = (KID.to_owned(), SID.to_owned());
    let off = [
        AgentEvent::KernelRestarting {
            kernel_id: k.clone(),
            session_id: s.clone(),
            restart_count: 1,
            reason: "oom-killed".into(),
            exit_code: Some(137),
        },
        // An adopted kernel: no creation info to report.
        AgentEvent::KernelStarted {
            kernel_id: k.clone(),
            session_id: s.clone(),
            creation_info: None,
        },
        // Not UUIDs: upstream's KernelId / SessionId would refuse them.
        AgentEvent::KernelCreating {
            kernel_id: "k1".into(),
            session_id: "s1".into(),
        },
        // Upstream reports no session result for a batch kernel destroyed by a call.
        AgentEvent::SessionFailure {
            kernel_id: k,
            session_id: s,
            reason: "user-requested".into(),
            exit_code: None,
        },
    ];
    for e in &off {
        assert!(!encode::on_bus(e), "{e:?}");
    }
    assert_eq!(
        encode::termination_reason("shm-exceeded"),
        "self-terminated"
    );
    assert_eq!(encode::termination_reason("whatever"), "unknown");
    assert_eq!(
        encode::termination_reason("failed-to-create"),
        "failed-to-create"
    );
}
