//! Backend.AI's extension types through the real RPC server (ZeroMQ over loopback): a call
//! whose arguments are the real `ai.backend.common.msgpack.packb` output is decoded to plain
//! values, and a hostile pickle gets a FAILURE (`PickleRefused`) naming the refused class while the server
//! keeps serving (`docs/wire-protocol.md`: an extension value we do not understand gets a
//! FAILURE naming it, not a crash).

use crate::common;

use rmpv::Value;

use common::*;
use kernelvisor::rpc::codec::{self, Call, Message, MsgType, OrderKey};

const LOCAL: &str = "tcp://127.0.0.1:0";

fn fixture_value(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/bai/{name}.msgpack",
        env!("CARGO_MANIFEST_DIR")
    );
    codec::from_msgpack(&std::fs::read(&path).expect(&path)).unwrap()
}

/// Sends each FUNCTION from one DEALER and returns the reply to each (waiting up to 5 s).
async fn exchange(endpoint: String, calls: Vec<Message>) -> Vec<Message> {
    tokio::task::spawn_blocking(move || {
        let ctx = zmq::Context::new();
        let sock = ctx.socket(zmq::DEALER).unwrap();
        sock.set_linger(0).unwrap();
        sock.connect(&endpoint).unwrap();
        calls
            .iter()
            .map(|msg| {
                let (h, b) = codec::encode_message(msg);
                sock.send_multipart([b"UPPER".to_vec(), h, b], 0).unwrap();
                assert!(sock.poll(zmq::POLLIN, 5000).unwrap() > 0, "no reply");
                let frames = sock.recv_multipart(0).unwrap();
                assert_eq!(frames[0], b"UPPER");
                codec::decode_message(&frames[1], &frames[2]).unwrap()
            })
            .collect()
    })
    .await
    .unwrap()
}

fn ping(seq: u32, arg: Value) -> Message {
    let payload = Call {
        args: vec![arg],
        kwargs: vec![],
        peer_user_id: None,
    }
    .encode();
    Message::function("ping", OrderKey::Bin(vec![]), seq, payload)
}

#[actix_rt::test]
async fn packb_arguments_decode_and_hostile_pickles_get_a_failure_naming_them() {
    let server = start_server(LOCAL, None);
    let calls = vec![
        // ping echoes its argument: the ImageRef comes back as the plain map.
        ping(1, fixture_value("image_ref_local")),
        ping(2, fixture_value("hostile_os_system")),
        ping(3, fixture_value("hostile_subclass")),
        ping(4, fixture_value("unknown_ext_42")),
        ping(5, fixture_value("datetime_kst")),
    ];
    let replies = exchange(server.endpoint.clone(), calls).await;

    assert_eq!(replies[0].header.msg_type, MsgType::Result, "{replies:?}");
    let image = codec::from_msgpack(replies[0].payload.as_deref().unwrap()).unwrap();
    let Value::Map(pairs) = image else {
        panic!("{image}")
    };
    assert_eq!(
        codec::map_get(&pairs, "canonical").and_then(Value::as_str),
        Some("local/lablup/kernelvisor-test:latest")
    );

    for (reply, seq, needle) in [
        (&replies[1], 2, "posix.system"),
        (&replies[2], 3, "__main__.EvilSlot"),
        (&replies[3], 4, "UnsupportedExtType"),
    ] {
        assert_eq!(
            (reply.header.msg_type, reply.header.seq),
            (MsgType::Failure, seq),
            "{reply:?}"
        );
        let err = reply.error.as_ref().unwrap();
        let text = format!("{}: {}", err.name, err.repr);
        assert!(text.contains(needle), "{text}");
        let name = if seq < 4 {
            "PickleRefused"
        } else {
            "UnsupportedExtType"
        };
        assert_eq!(err.name, name, "{text}");
    }

    // And the server kept serving.
    assert_eq!(replies[4].header.msg_type, MsgType::Result);
    assert_eq!(
        codec::from_msgpack(replies[4].payload.as_deref().unwrap()).unwrap(),
        Value::from("2025-01-01T08:30:00+09:00")
    );
}
