//! The manager's event intake over real ZeroMQ with the manager in-process on SQLite: each event
//! applied once in effect (a resent batch is acked again without being re-applied), superseded
//! status updates compacted, malformed events not acked, heartbeats registering the agent; with
//! CURVE, an agent's key bound to its agent id.

use crate::common;

use std::time::Duration;

use rmpv::Value;

use kernelvisor::config::ManagerConfig;
use kernelvisor::manager::store::{NewKernel, Store};
use kernelvisor::manager::Manager;
use kernelvisor::model::session::{KernelStatus, RestartPolicy, SessionType};
use kernelvisor::rpc::curve::{write_certificates, KeyPair};
use kernelvisor::rpc::socket::ClientCurve;
use kernelvisor::rpc::{Call, CallError, Peer, PeerOptions};

use common::agent::{field, free_port, map};

fn event(id: &str, seq: i64, name: &str, kernel: &str, extra: Vec<(&str, Value)>) -> Value {
    let mut pairs = vec![
        ("id", Value::from(id)),
        ("seq", seq.into()),
        ("ts", Value::F64(1.0)),
        ("name", name.into()),
        ("kernel_id", kernel.into()),
        ("session_id", "s".into()),
    ];
    pairs.extend(extra);
    map(pairs)
}

/// GET `url` with `token` as the bearer.
fn admin_get(url: &str, token: &str) -> String {
    ureq::get(url)
        .set("Authorization", &format!("Bearer {token}"))
        .call()
        .unwrap()
        .into_string()
        .unwrap()
}

/// POST `body` to `url` with `token` as the bearer: `(status, JSON answer)`.
fn admin_post(url: &str, token: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let r = match ureq::post(url)
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(body.clone())
    {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST {url}: {e}"),
    };
    (r.status(), r.into_json().unwrap())
}

/// The admin token the manager wrote to `dir/admin-token` at start.
fn admin_token(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("admin-token"))
        .unwrap()
        .trim()
        .to_owned()
}

/// `(concurrency_used, concurrency_limit)` of the test key `AK`.
async fn usage(store: &Store) -> Option<(i64, i64)> {
    let k = store.access_key("AK").await.unwrap()?;
    Some((k.concurrency_used, k.concurrency_limit))
}

/// The slots of the tests' kernels: 0.1 cores, 64 MiB.
fn small_slots() -> kernelvisor::slots::ResourceSlots {
    use kernelvisor::slots::Amount;
    [
        ("cpu".to_owned(), Amount::from_milli(100)),
        ("mem".to_owned(), Amount::from_units(1 << 26)),
    ]
    .into_iter()
    .collect()
}

/// The user key `AK` the tests' kernels belong to.
async fn create_test_key(store: &Store) {
    store
        .create_access_key(
            "AK",
            &kernelvisor::manager::credentials::secret_hash("x"),
            "user",
            "",
            0,
        )
        .await
        .unwrap();
}

fn acked(v: &Value) -> Vec<String> {
    field(v, "acked")
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_owned())
        .collect()
}

#[actix_rt::test]
async fn events_apply_once_compact_and_reject_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let (intake_port, api_port) = (free_port(), free_port());
    let url = format!("sqlite://{}/m.db", dir.path().display());
    let d = dir.path().display();
    let text = format!(
        "[manager]\nevent-listen-addr = {{ host = \"127.0.0.1\", port = {intake_port} }}\nheartbeat-interval = 1\nheartbeat-timeout = 30\nstartup-grace = 2.1\n\
         [store]\nurl = \"{url}\"\n[api]\nlisten-addr = {{ host = \"127.0.0.1\", port = {api_port} }}\nworkers = 1\nadmin-token-file = \"{d}/admin-token\"\n[logging]\nlevel = \"warn\"\n"
    );
    std::fs::write(dir.path().join("m.toml"), text).unwrap();
    let config = ManagerConfig::load(&dir.path().join("m.toml")).unwrap();
    let manager = Manager::start(&config).await.unwrap();

    // Two kernels placed on agent "a1" (as the scheduler would), both live, concurrency 2.
    let store = Store::connect(&url).await.unwrap();
    create_test_key(&store).await;
    for k in ["k1", "k2"] {
        let new = NewKernel {
            cluster_mode: kernelvisor::model::cluster::ClusterMode::SingleNode,
            cluster_size: 1,
            cluster: kernelvisor::model::cluster::ClusterSlot::main(),
            id: k.into(),
            session_id: "s".into(),
            agent_id: "a1".into(),
            access_key: "AK".into(),
            image: "img".into(),
            resource_slots: small_slots(),
            session_type: SessionType::Interactive,
            command: None,
            batch_timeout: None,
            mounts: Vec::new(),
            restart_policy: RestartPolicy::default(),
            priority: 10,
            request: None,
            stop_signal: None,
            grace_period: None,
            preemptible: false,
        };
        store.reserve_kernel(&new, &roomy()).await.unwrap();
    }
    assert_eq!(usage(&store).await, Some((2, 0)));

    let opts = PeerOptions {
        endpoint: manager.intake_endpoint().to_owned(),
        curve: None,
        keepalive: None,
        handshake_timeout: Duration::from_secs(5),
    };
    let peer = Peer::connect(&zmq::Context::new(), &opts).await.unwrap();
    let send = |events: Vec<Value>| {
        let peer = &peer;
        async move {
            peer.call(
                "agent_events",
                &Call {
                    args: vec!["a1".into(), Value::Array(events)],
                    kwargs: vec![],
                    peer_user_id: None,
                },
                Duration::from_secs(10),
            )
            .await
            .unwrap()
        }
    };

    let batch = vec![
        map(vec![
            ("id", "e0".into()),
            ("seq", 1.into()),
            ("name", "agent_started".into()),
        ]),
        event("e1", 2, "kernel_preparing", "k1", vec![]),
        event("e2", 3, "kernel_creating", "k1", vec![]),
        event("e3", 4, "kernel_started", "k1", vec![]),
        event("e4", 5, "kernel_started", "k2", vec![]),
        event(
            "e5",
            6,
            "kernel_terminated",
            "k2",
            vec![
                ("reason", "self-terminated".into()),
                ("exit_code", 3.into()),
            ],
        ),
    ];
    let ids: Vec<String> = (0..6).map(|i| format!("e{i}")).collect();
    assert_eq!(acked(&send(batch.clone()).await), ids);
    assert_eq!(
        store.kernel("k1").await.unwrap().unwrap().status,
        KernelStatus::Running
    );
    let k2 = store.kernel("k2").await.unwrap().unwrap();
    assert_eq!(
        (
            k2.status.as_str(),
            k2.status_reason.as_deref(),
            k2.exit_code
        ),
        ("TERMINATED", Some("self-terminated"), Some(3))
    );
    assert_eq!(usage(&store).await, Some((1, 0)));
    for id in &ids {
        assert!(store.event_processed(id).await.unwrap());
    }

    // The same batch again (a lost ack): acked again, applied never twice.
    assert_eq!(acked(&send(batch).await), ids);
    assert_eq!(
        usage(&store).await,
        Some((1, 0)),
        "kernel_terminated not re-applied"
    );
    // A second termination of k2 under a new id changes nothing either: it left the live set once.
    assert_eq!(
        acked(&send(vec![event("e6", 7, "kernel_terminated", "k2", vec![])]).await),
        vec!["e6"]
    );
    assert_eq!(usage(&store).await, Some((1, 0)));
    // A status event never resurrects a terminated kernel.
    assert_eq!(
        acked(&send(vec![event("e7", 8, "kernel_started", "k2", vec![])]).await),
        vec!["e7"]
    );
    assert_eq!(
        store.kernel("k2").await.unwrap().unwrap().status,
        KernelStatus::Terminated
    );

    // A malformed event is not acked, and neither is anything after it (order per kernel).
    let bad = vec![
        event("e8", 9, "kernel_terminated", "k1", vec![]),
        map(vec![
            ("id", "e9".into()),
            ("name", "kernel_terminated".into()),
        ]),
        event("e10", 10, "kernel_started", "k1", vec![]),
    ];
    assert_eq!(acked(&send(bad).await), vec!["e8"]);
    assert!(!store.event_processed("e10").await.unwrap());
    assert_eq!(usage(&store).await, Some((0, 0)));

    // Wrong argument shapes are FAILUREs; the intake keeps serving.
    let r = peer
        .call(
            "agent_events",
            &Call {
                args: vec!["a1".into(), 5.into()],
                kwargs: vec![],
                peer_user_id: None,
            },
            Duration::from_secs(5),
        )
        .await;
    assert!(
        matches!(r, Err(kernelvisor::rpc::CallError::Failure(ref m)) if m.name == "TypeError"),
        "{r:?}"
    );
    let r = peer
        .call(
            "agent_heartbeat",
            &Call {
                args: vec!["a1".into(), map(vec![])],
                kwargs: vec![],
                peer_user_id: None,
            },
            Duration::from_secs(5),
        )
        .await;
    assert!(
        matches!(r, Err(kernelvisor::rpc::CallError::Failure(ref m)) if m.name == "InvalidHeartbeat"),
        "{r:?}"
    );

    // Metrics: applied by name, duplicates, compacted (e1, e2 by e3; e4 by e5), rejected.
    // HTTP off the actix thread: the API's handlers talk to actors living on this one.
    let api = format!("http://{}", manager.api_addr());
    let token = admin_token(dir.path());
    let get_text = |url: String| {
        let token = token.clone();
        async move {
            actix_rt::task::spawn_blocking(move || admin_get(&url, &token))
                .await
                .unwrap()
        }
    };
    let text = get_text(format!("{api}/metrics")).await;
    let metric = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(metric("kernelvisor_manager_events_duplicate_total"), 6.0);
    assert_eq!(metric("kernelvisor_manager_events_compacted_total"), 3.0);
    assert_eq!(
        metric("kernelvisor_manager_events_rejected_total{reason=\"malformed\"}"),
        1.0
    );
    assert_eq!(
        metric("kernelvisor_manager_events_applied_total{name=\"kernel_terminated\"}"),
        3.0
    );

    // After the start-up grace, a heartbeat gives the agent its address and slots.
    let get = |path: &str| {
        let url = format!("{api}{path}");
        async move { serde_json::from_str::<serde_json::Value>(&get_text(url).await).unwrap() }
    };
    common::wait_until(Duration::from_secs(10), "normal mode", || async {
        get("/health").await["mode"] == "normal"
    })
    .await;
    let slots = map(vec![
        ("cpu", "2".into()),
        ("mem", "1073741824".into()),
        ("cuda.device", "0".into()),
    ]);
    let info = map(vec![
        ("addr", "tcp://127.0.0.1:1".into()),
        ("ts", Value::F64(2.0)),
        ("slots", map(vec![("total", slots)])),
        ("kernels", Value::Array(vec![])),
    ]);
    peer.call(
        "agent_heartbeat",
        &Call {
            args: vec!["a1".into(), info],
            kwargs: vec![],
            peer_user_id: None,
        },
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    common::wait_until(
        Duration::from_secs(10),
        "slots from the heartbeat",
        || async {
            let agents = get("/v1/agents").await;
            let a = &agents["agents"][0];
            a["agent_id"] == "a1"
                && a["status"] == "ALIVE"
                && a["slots_total"]["cpu"] == "2"
                && a["addr"] == "tcp://127.0.0.1:1"
        },
    )
    .await;

    // An agent advertising an accelerator slot (`slot_key_and_units`): the slot and its type show
    // and are stored, and requests are checked against the slots the ALIVE agents have.
    let units = map(vec![
        ("cpu", "count".into()),
        ("mem", "bytes".into()),
        ("cuda.shares", "count".into()),
    ]);
    let total = map(vec![
        ("cpu", "4".into()),
        ("mem", "1073741824".into()),
        ("cuda.shares", "2".into()),
    ]);
    let info = map(vec![
        ("addr", "tcp://127.0.0.1:2".into()),
        ("ts", Value::F64(3.0)),
        ("slots", map(vec![("total", total)])),
        ("slot_key_and_units", units),
        ("kernels", Value::Array(vec![])),
    ]);
    peer.call(
        "agent_heartbeat",
        &Call {
            args: vec!["g1".into(), info],
            kwargs: vec![],
            peer_user_id: None,
        },
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    common::wait_until(Duration::from_secs(10), "g1's slots", || async {
        let agents = get("/v1/agents").await;
        agents["agents"].as_array().unwrap().iter().any(|a| {
            a["agent_id"] == "g1"
                && a["status"] == "ALIVE"
                && a["slots_total"]["cuda.shares"] == "2"
                && a["slots_used"]["cuda.shares"] == "0"
                && a["slot_types"]["cuda.shares"] == "count"
        })
    })
    .await;
    common::wait_until(Duration::from_secs(10), "g1's row", || async {
        store.agents().await.unwrap().iter().any(|a| {
            a.id == "g1"
                && a.slots_total.get("cuda.shares") == kernelvisor::slots::Amount::from_units(2)
                && a.slot_types.get("cuda.shares") == Some(&kernelvisor::slots::SlotType::Count)
        })
    })
    .await;
    for (slots, code) in [
        (
            serde_json::json!({"cpu": 1, "mem": "64m", "rocm.device": 1}),
            "unknown-slot",
        ),
        (
            serde_json::json!({"cpu": 1, "mem": "64m", "cuda.shares": "2.5"}),
            "slots-exceed-capacity",
        ),
        (
            serde_json::json!({"cpu": 1, "mem": "64m", "cuda.shares": "0.0001"}),
            "invalid-request",
        ),
    ] {
        let body = serde_json::json!({"image": "img", "resource_slots": slots, "access_key": "AK"});
        let (url, token) = (format!("{api}/v1/sessions"), token.clone());
        let (status, answer) =
            actix_rt::task::spawn_blocking(move || admin_post(&url, &token, &body))
                .await
                .unwrap();
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some(code)),
            "{slots} → {answer}"
        );
    }

    peer.close();
    store.close().await;
    manager.stop().await;
}

/// With CURVE, an agent's key (`a.key`, so ZAP user id `a`) may report only as agent `a`: a
/// heartbeat or an event batch naming `b` is refused with `AgentIdentityMismatch`, nothing of it
/// applied, the refusal counted; the same connection then reports as `a` normally.
#[actix_rt::test]
async fn curve_key_binds_the_agent_id() {
    let dir = tempfile::tempdir().unwrap();
    let (manager_keys, agent_a) = (KeyPair::generate().unwrap(), KeyPair::generate().unwrap());
    write_certificates(&dir.path().join("keys"), "manager", &manager_keys).unwrap();
    write_certificates(&dir.path().join("agent-keys"), "a", &agent_a).unwrap();
    std::fs::remove_file(dir.path().join("agent-keys/a.key_secret")).unwrap();
    let (intake_port, api_port) = (free_port(), free_port());
    let (d, url) = (
        dir.path().display(),
        format!("sqlite://{}/m.db", dir.path().display()),
    );
    let text = format!(
        "[manager]\nrpc-keypair = \"{d}/keys/manager.key_secret\"\nagent-keys-dir = \"{d}/agent-keys\"\n\
         event-listen-addr = {{ host = \"127.0.0.1\", port = {intake_port} }}\nheartbeat-interval = 1\nheartbeat-timeout = 30\nstartup-grace = 2.1\n\
         [store]\nurl = \"{url}\"\n[api]\nlisten-addr = {{ host = \"127.0.0.1\", port = {api_port} }}\nworkers = 1\nadmin-token-file = \"{d}/admin-token\"\n[logging]\nlevel = \"warn\"\n"
    );
    std::fs::write(dir.path().join("m.toml"), text).unwrap();
    let config = ManagerConfig::load(&dir.path().join("m.toml")).unwrap();
    let manager = Manager::start(&config).await.unwrap();

    // Agent b runs kernel kb: a's key must not be able to terminate it.
    let store = Store::connect(&url).await.unwrap();
    create_test_key(&store).await;
    let kb = NewKernel {
        cluster_mode: kernelvisor::model::cluster::ClusterMode::SingleNode,
        cluster_size: 1,
        cluster: kernelvisor::model::cluster::ClusterSlot::main(),
        id: "kb".into(),
        session_id: "s".into(),
        agent_id: "b".into(),
        access_key: "AK".into(),
        image: "img".into(),
        resource_slots: small_slots(),
        session_type: SessionType::Interactive,
        command: None,
        batch_timeout: None,
        mounts: Vec::new(),
        restart_policy: RestartPolicy::default(),
        priority: 10,
        request: None,
        stop_signal: None,
        grace_period: None,
        preemptible: false,
    };
    store.reserve_kernel(&kb, &roomy()).await.unwrap();
    store
        .advance_kernel("kb", KernelStatus::Running)
        .await
        .unwrap();

    let api = format!("http://{}", manager.api_addr());
    let token = admin_token(dir.path());
    let get = |path: &str| {
        let (url, token) = (format!("{api}{path}"), token.clone());
        async move {
            actix_rt::task::spawn_blocking(move || admin_get(&url, &token))
                .await
                .unwrap()
        }
    };
    let get_json = |path: &'static str| {
        let text = get(path);
        async move { serde_json::from_str::<serde_json::Value>(&text.await).unwrap() }
    };
    let opts = PeerOptions {
        endpoint: manager.intake_endpoint().to_owned(),
        curve: Some(ClientCurve {
            keypair: agent_a,
            server_key: manager_keys.public,
        }),
        keepalive: None,
        handshake_timeout: Duration::from_secs(5),
    };
    let peer = Peer::connect(&zmq::Context::new(), &opts).await.unwrap();
    let call = |method: &'static str, args: Vec<Value>| {
        let peer = &peer;
        async move {
            let call = Call {
                args,
                kwargs: vec![],
                peer_user_id: None,
            };
            peer.call(method, &call, Duration::from_secs(10)).await
        }
    };
    let heartbeat = |agent: &str| {
        let slots = map(vec![
            ("cpu", "2".into()),
            ("mem", "1073741824".into()),
            ("cuda.device", "0".into()),
        ]);
        vec![
            agent.into(),
            map(vec![
                ("addr", "tcp://127.0.0.1:1".into()),
                ("ts", Value::F64(2.0)),
                ("slots", map(vec![("total", slots)])),
                ("kernels", Value::Array(vec![])),
            ]),
        ]
    };
    let refused = |r: Result<Value, CallError>| match r {
        Err(CallError::Failure(m)) if m.name == "AgentIdentityMismatch" => {
            assert!(
                m.repr.contains("'a'") && m.repr.contains("'b'"),
                "{}",
                m.repr
            )
        }
        other => panic!("expected AgentIdentityMismatch, got {other:?}"),
    };

    // As b: refused, nothing applied, nothing acked. Sent within the start-up grace, the forged
    // heartbeat (listing no kernels) would have had kb terminated as `missing-on-agent`.
    refused(call("agent_heartbeat", heartbeat("b")).await);
    let forged = vec![
        map(vec![
            ("id", "x0".into()),
            ("seq", 1.into()),
            ("name", "agent_started".into()),
        ]),
        event("x1", 2, "kernel_terminated", "kb", vec![]),
    ];
    refused(call("agent_events", vec!["b".into(), Value::Array(forged)]).await);
    common::wait_until(
        Duration::from_secs(10),
        "the end of the start-up grace",
        || async { get_json("/health").await["mode"] == "normal" },
    )
    .await;

    for id in ["x0", "x1"] {
        assert!(!store.event_processed(id).await.unwrap(), "{id} applied");
    }
    assert_eq!(
        store.kernel("kb").await.unwrap().unwrap().status,
        KernelStatus::Running
    );
    assert_eq!(usage(&store).await, Some((1, 0)));

    // As a, on the same connection: served.
    call("agent_heartbeat", heartbeat("a")).await.unwrap();
    let ok = call(
        "agent_events",
        vec![
            "a".into(),
            Value::Array(vec![map(vec![
                ("id", "y0".into()),
                ("seq", 1.into()),
                ("name", "agent_started".into()),
            ])]),
        ],
    )
    .await
    .unwrap();
    assert_eq!(acked(&ok), vec!["y0"]);
    common::wait_until(Duration::from_secs(10), "agent a registered", || async {
        let agents = get_json("/v1/agents").await;
        agents["agents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["agent_id"] == "a" && a["status"] == "ALIVE")
    })
    .await;
    let agents = get_json("/v1/agents").await;
    let ids: Vec<&str> = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["agent_id"].as_str())
        .collect();
    assert_eq!(ids, vec!["a"], "b never registered");

    // Both refusals counted, by method.
    let text = get("/metrics").await;
    let metric = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    for method in ["agent_events", "agent_heartbeat"] {
        assert_eq!(
            metric(&format!(
                "kernelvisor_manager_intake_identity_mismatches_total{{method=\"{method}\"}}"
            )),
            Some(1.0),
            "{method}"
        );
    }

    peer.close();
    manager.stop().await;
    // Flushed on stop: a's row, no b.
    let rows = store.agents().await.unwrap();
    assert_eq!(
        rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        vec!["a"]
    );
    store.close().await;
}

/// Slots no test reservation exceeds (the store checks a reservation against its agent's total).
fn roomy() -> kernelvisor::slots::ResourceSlots {
    [
        (
            "cpu".to_owned(),
            kernelvisor::slots::Amount::from_units(1_000),
        ),
        (
            "mem".to_owned(),
            kernelvisor::slots::Amount::from_units(1 << 50),
        ),
    ]
    .into_iter()
    .collect()
}
