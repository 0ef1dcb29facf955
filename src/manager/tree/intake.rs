//! The manager tree's `intake` child: the event intake's RPC server (`[manager]
//! event-listen-addr`, CURVE with `rpc-keypair` and `agent-keys-dir`) on an arbiter of its own.

use std::sync::Arc;

use actix::{Actor, Addr, Arbiter};
use actors::ChildSpec;
use anyhow::Context as _;

use crate::config::ManagerConfig;
use crate::manager::intake;
use crate::manager::metrics::ManagerMetrics;
use crate::manager::registry::{AgentRegistry, HeartbeatInbox};
use crate::rpc::{KeyPair, RpcServer, ServerCurve};

/// Intake calls handled at once; past it the intake stops reading its socket until one is
/// answered, so agents wait in their own queues (ZeroMQ's high-water marks) instead of the
/// manager's memory. Heartbeats are answered at once and never count; this bounds the
/// `agent_events` batches waiting for the registry.
const INTAKE_MAX_IN_FLIGHT: usize = 1024;

/// The nice value of the intake's thread (`setpriority` on the thread alone: 0 is the
/// process's own, 19 the lowest; 10 weighs about a tenth of a normal thread on a busy core).
const INTAKE_NICE: i32 = 10;

/// The started intake.
pub(in crate::manager) struct Started {
    /// The intake's RPC server.
    pub server: Addr<RpcServer>,
    /// Its thread.
    pub thread: Arbiter,
    /// The endpoint bound, `tcp://host:port`.
    pub endpoint: String,
}

/// CURVE for the intake: with `keypair` and `[manager] agent-keys-dir`, the agents' keys in
/// that directory (re-read when an unknown key knocks); else none (with a warning).
///
/// Errors: the directory cannot be read.
fn curve(config: &ManagerConfig, keypair: Option<KeyPair>) -> anyhow::Result<Option<ServerCurve>> {
    Ok(match (keypair, &config.manager.agent_keys_dir) {
        (Some(keypair), Some(dir)) => {
            let allowed = intake::load_agent_keys(dir)
                .with_context(|| format!("manager.agent-keys-dir {}", dir.display()))?;
            tracing::info!(keys = allowed.len(), dir = %dir.display(), "event intake admits these agent keys (CURVE)");
            let dir2 = dir.clone();
            let reload = crate::rpc::zap::KeyReload(Arc::new(
                move || match intake::load_agent_keys(&dir2) {
                    Ok(keys) => Some(keys),
                    Err(e) => {
                        tracing::warn!(error = %e, "re-reading manager.agent-keys-dir failed; keeping the keys admitted so far");
                        None
                    }
                },
            ));
            Some(ServerCurve {
                keypair,
                allowed_clients: allowed,
                reload: Some(reload),
            })
        }
        _ => {
            tracing::warn!("event intake is unauthenticated: set [manager] rpc-keypair and agent-keys-dir for CURVE");
            None
        }
    })
}

/// Binds the intake and starts it on a new arbiter at a lower priority, handing heartbeats to
/// `inbox` and events to `registry`.
///
/// Errors: `agent-keys-dir` is unreadable; `event-listen-addr` cannot be bound.
pub(in crate::manager) fn start(
    config: &ManagerConfig,
    keypair: Option<KeyPair>,
    registry: &Addr<AgentRegistry>,
    inbox: Arc<HeartbeatInbox>,
    metrics: &Arc<ManagerMetrics>,
) -> anyhow::Result<Started> {
    let m = &config.manager;
    let server = RpcServer::bind(
        &m.event_listen_addr.zmq_endpoint(),
        curve(config, keypair)?,
        intake::dispatcher(registry.clone(), inbox, metrics.clone()),
    )
    .with_context(|| format!("manager.event-listen-addr {}", m.event_listen_addr))?
    .max_in_flight(INTAKE_MAX_IN_FLIGHT);
    let endpoint = server.endpoint().to_owned();
    // Its own thread: decoding a fleet's heartbeats and events does not take the thread
    // the scheduler and pool share.
    let thread = Arbiter::new();
    // Below the API's and the scheduler's threads in the kernel's CPU scheduling: on a
    // saturated host a fleet's heartbeats (superseded by the next, latest wins) wait, not
    // the creates and status changes (seed 004: status updates prioritised over the volume
    // of node messages). Best effort: a host that refuses it runs the intake at the normal
    // priority.
    thread.spawn(async { lower_this_threads_priority(INTAKE_NICE) });
    let server = RpcServer::start_in_arbiter(&thread.handle(), |_| server);
    Ok(Started {
        server,
        thread,
        endpoint,
    })
}

/// `intake`: the event intake's RPC server on its own arbiter; stopped, the server shuts down
/// and its thread ends.
pub(in crate::manager) fn child_spec(server: Addr<RpcServer>, thread: Arbiter) -> ChildSpec {
    super::holder("intake", (server, thread), |(server, thread)| async move {
        let _ = server.send(crate::rpc::server::Shutdown).await;
        thread.stop();
    })
}

/// Sets the calling thread's nice value to `nice` (Linux: a thread is its own scheduling
/// entity). Logs and keeps the priority when refused.
fn lower_this_threads_priority(nice: i32) {
    // SAFETY: gettid and setpriority take no pointers; they act on this thread only.
    let r = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice)
    };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "the intake's thread keeps its priority");
    }
}
