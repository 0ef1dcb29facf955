//! The RPC layer on real ZeroMQ sockets over loopback: server concurrency, CANCEL, malformed
//! frames, CURVE, and the agent pool's health policy.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use rmpv::Value;

use common::*;
use kernelvisor::manager::pool::{
    AgentCall, AgentCallError, Connect, EntryState, InspectEntry, Invalidate, PoolSpec, SweepNow,
};
use kernelvisor::rpc::codec::{self, Call, Message, MsgType, OrderKey};
use kernelvisor::rpc::peer::{ConnectError, Peer, PeerOptions};
use kernelvisor::rpc::server::{ServerStats, Shutdown};
use kernelvisor::rpc::socket::ClientCurve;
use kernelvisor::rpc::CallError;

const LOCAL: &str = "tcp://127.0.0.1:0";

fn ping(agent: &str, msg: Value, timeout: Duration) -> AgentCall {
    AgentCall::new(agent, "ping", vec![msg], timeout)
}

#[actix_rt::test]
async fn thousand_concurrent_calls_each_resolve_to_their_caller() {
    let keys = Keys::new();
    let server = start_server(LOCAL, Some(keys.server_curve()));
    // No health-check ping during the calls: the server must count exactly the callers' 1000.
    let spec = PoolSpec {
        health_check_interval: Duration::from_secs(3600),
        ..fast_spec()
    };
    let pool = pool_for(
        "a1",
        &server.endpoint,
        Some(keys.agent.public),
        Some(keys.manager.clone()),
        spec,
    )
    .await;
    let calls = (0..1000).map(|i| {
        let pool = pool.clone();
        async move {
            let got = pool
                .send(ping(
                    "a1",
                    Value::from(format!("caller-{i}")),
                    Duration::from_secs(30),
                ))
                .await
                .unwrap()
                .unwrap();
            (i, got)
        }
    });
    let results = futures::future::join_all(calls).await;
    for (i, got) in &results {
        assert_eq!(
            got.as_str(),
            Some(format!("caller-{i}").as_str()),
            "caller {i} got another caller's reply"
        );
    }
    assert_eq!(
        results
            .iter()
            .map(|(i, _)| *i)
            .collect::<HashSet<_>>()
            .len(),
        1000
    );
    // All of them went through one pooled connection.
    let entry = pool
        .send(InspectEntry {
            agent_id: "a1".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        entry,
        Some(EntryState {
            connected: true,
            healthy: true,
            failure_count: 0
        })
    );
    assert_eq!(ServerStats::get(&server.stats.requests), 1000);
}

#[actix_rt::test]
async fn slow_handler_does_not_delay_ping() {
    let server = start_server(LOCAL, None);
    let pool = pool_for("a1", &server.endpoint, None, None, fast_spec()).await;
    let slow = pool.send(AgentCall::new(
        "a1",
        "sleep",
        vec![Value::from(2.0)],
        Duration::from_secs(10),
    ));
    let slow = actix_rt::spawn(slow);
    wait_until(Duration::from_secs(10), "the sleep handler running", || {
        let started = common::SLEEPS_STARTED.load(std::sync::atomic::Ordering::SeqCst) >= 1;
        async move { started }
    })
    .await;
    for i in 0..5 {
        let got = pool
            .send(ping("a1", Value::from(i), Duration::from_secs(10)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, Value::from(i));
        assert!(
            !slow.is_finished(),
            "ping {i} answered only after the 2 s handler finished"
        );
    }
    assert_eq!(slow.await.unwrap().unwrap().unwrap(), Value::from("slept"));
}

#[actix_rt::test]
async fn business_failures_name_the_error_and_never_count_against_the_connection() {
    let server = start_server(LOCAL, None);
    let pool = pool_for("a1", &server.endpoint, None, None, fast_spec()).await;
    for _ in 0..5 {
        let err = pool
            .send(AgentCall::new("a1", "fail", vec![], Duration::from_secs(5)))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(
            err.failure().map(|m| m.name.as_str()),
            Some("KernelNotFound")
        );
        let err = pool
            .send(AgentCall::new(
                "a1",
                "no_such_method",
                vec![],
                Duration::from_secs(5),
            ))
            .await
            .unwrap()
            .unwrap_err();
        let meta = err.failure().expect("unknown method is a FAILURE");
        assert_eq!(meta.name, "UnknownMethod");
        assert!(meta.repr.contains("no_such_method"), "{meta:?}");
    }
    let entry = pool
        .send(InspectEntry {
            agent_id: "a1".into(),
        })
        .await
        .unwrap()
        .unwrap();
    assert!(entry.healthy && entry.failure_count == 0, "{entry:?}");
}

#[actix_rt::test]
async fn wrong_curve_key_gets_no_answer_and_a_clear_error() {
    let keys = Keys::new();
    let server = start_server(LOCAL, Some(keys.server_curve()));
    let intruder = kernelvisor::rpc::KeyPair::generate().unwrap();
    let pool = pool_for(
        "a1",
        &server.endpoint,
        Some(keys.agent.public),
        Some(intruder.clone()),
        fast_spec(),
    )
    .await;
    let err = pool
        .send(ping("a1", Value::from("x"), Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap_err();
    match &err {
        AgentCallError::Unavailable(u) => {
            assert_eq!(u.agent_id, "a1");
            assert!(u.reason.contains("no handshake answer"), "{u}");
        }
        other => panic!("expected AgentConnectionUnavailable, got {other}"),
    }
    // No entry is kept for a connection that never came up.
    assert_eq!(
        pool.send(InspectEntry {
            agent_id: "a1".into()
        })
        .await
        .unwrap(),
        None
    );
    assert_eq!(
        ServerStats::get(&server.stats.requests),
        0,
        "the server must not have run anything"
    );
    // The same with a bare Peer: the handshake error says why it may have failed.
    let opts = PeerOptions {
        endpoint: server.endpoint.clone(),
        curve: Some(ClientCurve {
            keypair: intruder,
            server_key: keys.agent.public,
        }),
        keepalive: None,
        handshake_timeout: Duration::from_millis(500),
    };
    let err = Peer::connect(&zmq::Context::new(), &opts)
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::Handshake { .. }));
    assert!(err.to_string().contains("CURVE key was refused"), "{err}");
    // The right key still works on the same server.
    let pool = pool_for(
        "a1",
        &server.endpoint,
        Some(keys.agent.public),
        Some(keys.manager.clone()),
        fast_spec(),
    )
    .await;
    assert_eq!(
        pool.send(ping("a1", Value::from("ok"), Duration::from_secs(5)))
            .await
            .unwrap()
            .unwrap(),
        Value::from("ok")
    );
}

#[actix_rt::test]
async fn pool_marks_unhealthy_evicts_and_reconnects_after_agent_restart() {
    let first = start_server(LOCAL, None);
    let endpoint = first.endpoint.clone();
    // The periodic check would mark the entry unhealthy on its own first failed ping; keep it
    // out of the way to count call failures, and sweep by hand.
    let spec = kernelvisor::manager::pool::PoolSpec {
        health_check_interval: Duration::from_secs(3600),
        ..fast_spec()
    };
    let pool = pool_for("a1", &endpoint, None, None, spec.clone()).await;
    let inspect = || {
        pool.send(InspectEntry {
            agent_id: "a1".into(),
        })
    };
    assert!(pool
        .send(ping("a1", Value::from(1), Duration::from_secs(5)))
        .await
        .unwrap()
        .is_ok());

    first.addr.send(Shutdown).await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "the first server's socket closed",
        || {
            let closed = common::port_closed(&endpoint);
            async move { closed }
        },
    )
    .await;
    for n in 1..=3 {
        let err = pool
            .send(ping("a1", Value::from(n), Duration::from_millis(200)))
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(
                err,
                AgentCallError::Call {
                    source: CallError::Timeout { .. },
                    ..
                }
            ),
            "{err}"
        );
        let e = inspect().await.unwrap().expect("entry kept until eviction");
        if n < 3 {
            assert!(e.healthy, "unhealthy after only {n} failures");
        }
    }
    // Three connection failures: the entry refuses calls without sending them.
    let err = pool
        .send(ping("a1", Value::from(4), Duration::from_millis(200)))
        .await
        .unwrap()
        .unwrap_err();
    match err {
        AgentCallError::Unavailable(u) => assert_eq!(u.reason, "connection unhealthy"),
        other => panic!("expected AgentConnectionUnavailable, got {other}"),
    }
    // A sweep within the recovery timeout keeps it; one past it evicts it.
    assert_eq!(pool.send(SweepNow).await.unwrap().evicted, 0);
    assert!(inspect().await.unwrap().is_some());
    actix_rt::time::sleep(spec.recovery_timeout).await; // waits out the recovery timeout
    assert_eq!(pool.send(SweepNow).await.unwrap().evicted, 1);
    assert_eq!(inspect().await.unwrap(), None);

    // The agent comes back on the same address: the next call reconnects.
    let second = start_server(&endpoint, None);
    assert_eq!(second.endpoint, endpoint);
    let got = pool
        .send(ping("a1", Value::from("back"), Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, Value::from("back"));
    assert_eq!(
        inspect().await.unwrap(),
        Some(EntryState {
            connected: true,
            healthy: true,
            failure_count: 0
        })
    );
}

#[actix_rt::test]
async fn health_check_loop_evicts_a_dead_agent_by_itself() {
    let server = start_server(LOCAL, None);
    let pool = pool_for("a1", &server.endpoint, None, None, fast_spec()).await;
    pool.send(ping("a1", Value::from(1), Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    server.addr.send(Shutdown).await.unwrap();
    let inspect = || {
        pool.send(InspectEntry {
            agent_id: "a1".into(),
        })
    };
    wait_until(
        Duration::from_secs(10),
        "unhealthy by health check",
        || async { inspect().await.unwrap().is_some_and(|e| !e.healthy) },
    )
    .await;
    wait_until(
        Duration::from_secs(10),
        "eviction by health check",
        || async { inspect().await.unwrap().is_none() },
    )
    .await;
}

#[actix_rt::test]
async fn invalidated_entry_is_healed_by_a_successful_health_check() {
    let server = start_server(LOCAL, None);
    let spec = kernelvisor::manager::pool::PoolSpec {
        health_check_interval: Duration::from_secs(3600),
        ..fast_spec()
    };
    let pool = pool_for("a1", &server.endpoint, None, None, spec).await;
    pool.send(ping("a1", Value::from(1), Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    pool.send(Invalidate {
        agent_id: "a1".into(),
    })
    .await
    .unwrap();
    assert!(
        !pool
            .send(InspectEntry {
                agent_id: "a1".into()
            })
            .await
            .unwrap()
            .unwrap()
            .healthy
    );
    assert!(matches!(
        pool.send(ping("a1", Value::from(2), Duration::from_secs(5)))
            .await
            .unwrap(),
        Err(AgentCallError::Unavailable(_))
    ));
    let report = pool.send(SweepNow).await.unwrap();
    assert_eq!((report.pinged, report.healthy, report.evicted), (1, 1, 0));
    assert_eq!(
        pool.send(ping("a1", Value::from(3), Duration::from_secs(5)))
            .await
            .unwrap()
            .unwrap(),
        Value::from(3)
    );
}

/// A persistent peer ([`Connect`]) whose agent was not up yet is connected by a later sweep,
/// without any call: every known agent keeps its peer and health checks.
#[actix_rt::test]
async fn a_persistent_peer_that_failed_its_handshake_is_connected_by_the_next_sweep() {
    let endpoint = format!("tcp://127.0.0.1:{}", common::agent::free_port());
    let spec = kernelvisor::manager::pool::PoolSpec {
        health_check_interval: Duration::from_secs(3600),
        handshake_timeout: Duration::from_millis(300),
        ..fast_spec()
    };
    let pool = pool_for("a1", &endpoint, None, None, spec).await;
    let inspect = || {
        pool.send(InspectEntry {
            agent_id: "a1".into(),
        })
    };
    pool.send(Connect {
        agent_id: "a1".into(),
    })
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(5),
        "the failed handshake to drop the entry",
        || async { inspect().await.unwrap().is_none() },
    )
    .await;
    let server = start_server(&endpoint, None);
    let report = pool.send(SweepNow).await.unwrap();
    assert_eq!(report.pinged, 0, "the new connection is still handshaking");
    wait_until(
        Duration::from_secs(5),
        "the sweep's reconnection to finish",
        || async { inspect().await.unwrap().is_some_and(|e| e.connected) },
    )
    .await;
    let report = pool.send(SweepNow).await.unwrap();
    assert_eq!((report.pinged, report.healthy), (1, 1));
    assert!(
        ServerStats::get(&server.stats.requests) >= 1,
        "pinged by the sweep"
    );
}

#[actix_rt::test]
async fn unknown_agent_is_unavailable() {
    let pool = kernelvisor::manager::pool::AgentPool::new(fast_spec(), None).expect("pool");
    let pool = actix::Actor::start(pool);
    match pool
        .send(ping("ghost", Value::Nil, Duration::from_secs(1)))
        .await
        .unwrap()
    {
        Err(AgentCallError::Unavailable(u)) => assert_eq!(
            (u.agent_id.as_str(), u.reason.as_str()),
            ("ghost", "unknown agent")
        ),
        other => panic!("{other:?}"),
    }
}

/// Sends raw frame sets from a DEALER (on a blocking thread) and returns what came back
/// within `wait` after each one.
async fn raw_exchange(
    endpoint: String,
    sends: Vec<(Vec<Vec<u8>>, Duration)>,
) -> Vec<Vec<Vec<Vec<u8>>>> {
    tokio::task::spawn_blocking(move || {
        let ctx = zmq::Context::new();
        let sock = ctx.socket(zmq::DEALER).unwrap();
        sock.set_linger(0).unwrap();
        sock.connect(&endpoint).unwrap();
        let mut all = Vec::new();
        for (frames, wait) in sends {
            sock.send_multipart(frames, 0).unwrap();
            let mut got = Vec::new();
            while sock.poll(zmq::POLLIN, wait.as_millis() as i64).unwrap() > 0 {
                got.push(sock.recv_multipart(0).unwrap());
            }
            all.push(got);
        }
        all
    })
    .await
    .unwrap()
}

fn upper(msg: &Message) -> Vec<Vec<u8>> {
    let (h, b) = codec::encode_message(msg);
    vec![b"UPPER".to_vec(), h, b]
}

fn decode_reply(frames: &[Vec<u8>]) -> Message {
    assert_eq!(frames[0], b"UPPER");
    codec::decode_message(&frames[1], &frames[2]).unwrap()
}

#[actix_rt::test]
async fn malformed_frames_are_dropped_and_counted_and_the_server_keeps_serving() {
    let server = start_server(LOCAL, None);
    let ping_call = Call {
        args: vec![Value::from("still here")],
        kwargs: vec![],
        peer_user_id: None,
    }
    .encode();
    let valid_header = codec::encode_header(
        &Message::function("ping", OrderKey::Str("k".into()), 9, vec![]).header,
    );
    let sends = vec![
        vec![b"JUNK".to_vec()],                           // unknown marker, 1 frame
        vec![b"UPPER".to_vec(), b"only-header".to_vec()], // wrong frame count
        vec![b"UPPER".to_vec(), vec![0xc1, 0xff], vec![0x00]], // undecodable header
        vec![b"UPPER".to_vec(), valid_header, vec![0x93, 0xc1]], // header ok, body garbage → ERROR
        upper(&Message::function(
            "ping",
            OrderKey::Str("k".into()),
            10,
            ping_call,
        )),
    ];
    let sends = sends
        .into_iter()
        .map(|f| (f, Duration::from_millis(300)))
        .collect();
    let replies = raw_exchange(server.endpoint.clone(), sends).await;
    assert!(
        replies[0].is_empty() && replies[1].is_empty() && replies[2].is_empty(),
        "{replies:?}"
    );
    assert_eq!(replies[3].len(), 1);
    let err = decode_reply(&replies[3][0]);
    assert_eq!((err.header.msg_type, err.header.seq), (MsgType::Error, 9));
    assert_eq!(
        err.header.okey,
        OrderKey::Str("k".into()),
        "okey echoed as str"
    );
    let ok = decode_reply(&replies[4][0]);
    assert_eq!(ok.header.msg_type, MsgType::Result);
    assert_eq!(
        codec::from_msgpack(ok.payload.as_deref().unwrap()).unwrap(),
        Value::from("still here")
    );
    assert_eq!(ServerStats::get(&server.stats.malformed_frames), 3);
    assert_eq!(ServerStats::get(&server.stats.errors), 1);
}

#[actix_rt::test]
async fn cancel_aborts_the_running_handler_and_answers_cancelled() {
    let server = start_server(LOCAL, None);
    let slow = Message::function(
        "sleep",
        OrderKey::default(),
        1,
        Call {
            args: vec![Value::from(1.0)],
            kwargs: vec![],
            peer_user_id: None,
        }
        .encode(),
    );
    let sends = vec![
        (upper(&slow), Duration::from_millis(200)),
        (
            upper(&Message::cancel(&slow.header)),
            Duration::from_millis(1500),
        ),
    ];
    let replies = raw_exchange(server.endpoint.clone(), sends).await;
    assert!(
        replies[0].is_empty(),
        "nothing before the CANCEL: {:?}",
        replies[0]
    );
    // After CANCEL: exactly CANCELLED, and no late RESULT even though we waited past the 1 s sleep.
    assert_eq!(replies[1].len(), 1, "{:?}", replies[1]);
    let reply = decode_reply(&replies[1][0]);
    assert_eq!(
        (reply.header.msg_type, reply.header.seq, reply.header.okey),
        (MsgType::Cancelled, 1, OrderKey::Bin(vec![]))
    );
    assert_eq!(ServerStats::get(&server.stats.cancelled), 1);
}

#[actix_rt::test]
async fn peer_timeout_sends_cancel_to_the_server() {
    let server = start_server(LOCAL, None);
    let peer = Peer::connect(
        &zmq::Context::new(),
        &PeerOptions {
            endpoint: server.endpoint.clone(),
            curve: None,
            keepalive: None,
            handshake_timeout: Duration::from_secs(2),
        },
    )
    .await
    .unwrap();
    let err = peer
        .call(
            "sleep",
            &Call {
                args: vec![Value::from(5.0)],
                kwargs: vec![],
                peer_user_id: None,
            },
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
    assert!(err.is_connection_error() && matches!(err, CallError::Timeout { .. }));
    wait_until(
        Duration::from_secs(5),
        "server-side cancellation",
        || async { ServerStats::get(&server.stats.cancelled) == 1 },
    )
    .await;
    assert_eq!(
        peer.call(
            "ping",
            &Call {
                args: vec![Value::from(1)],
                kwargs: vec![],
                peer_user_id: None,
            },
            Duration::from_secs(2)
        )
        .await
        .unwrap(),
        Value::from(1)
    );
}

#[actix_rt::test]
async fn a_panicking_handler_gets_an_error_reply_and_the_server_survives() {
    let server = start_server(LOCAL, None);
    let pool = pool_for("a1", &server.endpoint, None, None, fast_spec()).await;
    for after_await in [false, true] {
        let err = pool
            .send(AgentCall::new(
                "a1",
                "panic",
                vec![Value::from(after_await)],
                Duration::from_secs(5),
            ))
            .await
            .unwrap()
            .unwrap_err();
        match err {
            AgentCallError::Call {
                source: CallError::Remote(meta),
                ..
            } => {
                assert_eq!(meta.name, "HandlerPanicked");
                assert!(meta.repr.contains("deliberate handler panic"), "{meta:?}");
            }
            other => panic!("expected an ERROR reply, got {other}"),
        }
    }
    assert_eq!(
        pool.send(ping("a1", Value::from("alive"), Duration::from_secs(5)))
            .await
            .unwrap()
            .unwrap(),
        Value::from("alive")
    );
    assert_eq!(ServerStats::get(&server.stats.errors), 2);
}

/// `socket::send_frames` sends without waiting while libzmq has room and falls back to tmq's
/// sink, which waits, at the high-water mark; nothing is lost or reordered either way.
#[actix_rt::test]
async fn a_send_at_the_high_water_mark_waits_for_room_and_keeps_order() {
    use tmq::{AsZmqSocket, FromZmqSocket};
    let ctx = zmq::Context::new();
    // A free port, released at once (a libzmq listener would close in the background).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("tcp://127.0.0.1:{port}");

    // No peer yet: the DEALER's pipe exists (connect does not wait) and holds SNDHWM messages.
    let sock = ctx.socket(zmq::DEALER).unwrap();
    sock.set_sndhwm(2).unwrap();
    sock.set_linger(0).unwrap();
    sock.connect(&endpoint).unwrap();
    let mut dealer = tmq::dealer::Dealer::from_zmq_socket(sock).unwrap();
    let mut queued = 0;
    while dealer
        .get_socket()
        .send_multipart([&b"m"[..], queued.to_string().as_bytes()], zmq::DONTWAIT)
        .is_ok()
    {
        queued += 1;
        assert!(queued < 1000, "the high-water mark never stopped a send");
    }
    assert!(queued >= 1, "nothing was queued before the high-water mark");

    // The next send waits until a peer drains the queue.
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
    let last = queued;
    actix_rt::spawn(async move {
        let r = kernelvisor::rpc::socket::send_frames(
            &mut dealer,
            vec![b"m".to_vec(), last.to_string().into_bytes()],
        )
        .await;
        let _ = done_tx.send((r.map_err(|e| e.to_string()), dealer));
    });
    tokio::time::sleep(Duration::from_millis(300)).await; // a negative check: it stays blocked
    assert!(
        done_rx.try_recv().is_err(),
        "a send at the high-water mark returned without room"
    );

    // The peer appears; it reads on its own thread while the waiting send's task runs here.
    let router = ctx.socket(zmq::ROUTER).unwrap();
    router.set_linger(0).unwrap();
    router.set_rcvtimeo(5000).unwrap();
    router.bind(&endpoint).unwrap();
    let reader = std::thread::spawn(move || {
        let got = (0..=last)
            .map(|_| {
                let frames = router
                    .recv_multipart(0)
                    .expect("every queued message arrives");
                String::from_utf8(frames[2].clone()).unwrap()
            })
            .collect::<Vec<String>>();
        router.set_rcvtimeo(300).unwrap();
        assert!(router.recv_multipart(0).is_err(), "a message arrived twice");
        got
    });
    let (sent, _dealer) = tokio::time::timeout(Duration::from_secs(5), done_rx)
        .await
        .expect("the waiting send completes")
        .unwrap();
    sent.unwrap();
    let got = reader.join().unwrap();
    let want: Vec<String> = (0..=last).map(|i| i.to_string()).collect();
    assert_eq!(got, want, "messages lost or reordered");
}
