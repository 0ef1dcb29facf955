//! A test receiver for the agent's events and heartbeats: the manager side of `docs/events.md`
//! reduced to recording what arrives, with failure injection (the real one: `src/manager/intake.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use rmpv::Value;

use kernelvisor::rpc::agent_api::to_value;
use kernelvisor::rpc::curve::KeyPair;
use kernelvisor::rpc::intake_api::{EventsReply, EVENTS_METHOD, HEARTBEAT_METHOD};
use kernelvisor::rpc::{Dispatcher, RpcServer, ServerCurve};

/// What the receiver saw.
#[derive(Clone, Default)]
pub struct Received {
    /// Every event map of every batch, in arrival order (resends included).
    pub events: Arc<Mutex<Vec<Value>>>,
    /// `(arrival, heartbeat map)`.
    pub heartbeats: Arc<Mutex<Vec<(Instant, Value)>>>,
    /// Batches still to "lose the ack" of: recorded, but answered only after the agent gave up.
    pub lose_acks: Arc<AtomicUsize>,
}

pub fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .and_then(|(_, v)| v.as_str())
}

pub fn int_field(v: &Value, key: &str) -> Option<i64> {
    v.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .and_then(|(_, v)| v.as_i64())
}

impl Received {
    pub fn event_count(&self) -> usize {
        self.events.lock().unwrap().len()
    }

    pub fn heartbeat_count(&self) -> usize {
        self.heartbeats.lock().unwrap().len()
    }
}

/// Starts the receiver at `endpoint` with the manager's key pair, admitting `agent_key`.
pub fn start_intake(
    endpoint: &str,
    manager: &KeyPair,
    agent_key: kernelvisor::rpc::CurveKey,
    received: &Received,
) -> Addr<RpcServer> {
    let mut d = Dispatcher::new(None);
    let r = received.clone();
    d.register(EVENTS_METHOD, move |call| {
        let r = r.clone();
        async move {
            let events = call
                .args
                .get(1)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let acked = events
                .iter()
                .filter_map(|e| str_field(e, "id").map(str::to_owned))
                .collect();
            r.events.lock().unwrap().extend(events);
            if r.lose_acks
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                // Applied, but the ack never makes it back in time.
                actix_rt::time::sleep(Duration::from_secs(30)).await;
            }
            Ok(to_value(&EventsReply { acked }))
        }
    });
    let r = received.clone();
    d.register(HEARTBEAT_METHOD, move |call| {
        let r = r.clone();
        async move {
            r.heartbeats.lock().unwrap().push((
                Instant::now(),
                call.args.get(1).cloned().unwrap_or(Value::Nil),
            ));
            Ok(Value::Map(vec![]))
        }
    });
    let curve = ServerCurve {
        keypair: manager.clone(),
        allowed_clients: vec![(agent_key, "agent".into())],
        reload: None,
    };
    RpcServer::bind(endpoint, Some(curve), d)
        .expect("bind the test intake")
        .start()
}
