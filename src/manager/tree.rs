//! The manager's supervision tree: one child per piece, each holding what `Manager::start`
//! prepared (the store, leadership, actors already started, bound listeners) from the tree's
//! start until asked to stop, then stopping it as the piece requires.
//!
//! The pieces are started by `Manager::start` itself, in tree order, because each needs the
//! ones before it to be running while it is built (agents are registered with the pool, the
//! registry reads the store's agent rows, the API state holds every address) and because a bad
//! address or key file must fail the start. The tree owns their lifetimes and stop order.
//!
//! Strategy: `one_for_all` with intensity 0, i.e. fail-stop. The pieces cannot restart one by
//! one without a change of behaviour: every later piece holds the addresses of the earlier
//! ones (the registry the pool's, the intake the registry's, the scheduler both, the API all),
//! and restarting all would bind the ports and run the bootstrap again. So a child that ends by
//! itself (none does: each lives until asked to stop, so only a panic could) stops the others
//! in reverse order and the supervisor exits [`actors::ExitReason::Failed`], as the manager
//! without a supervisor kept on without restarting anything.

use std::future::Future;
use std::sync::{Arc, Mutex};

use actix::Addr;
use actors::{ChildSpec, Intensity, Shutdown, StopSignal, Strategy, Supervisor, SupervisorBuilder};

use super::leader::{Leadership, SqliteLock};
use super::pool::{AgentPool, ClosePool};
use super::registry::{AgentRegistry, FlushAgents};
use super::scheduler::Scheduler;
use super::store::Store;
use crate::rpc::RpcServer;

/// The manager supervisor's configuration, before its children: `one_for_all`, no restart.
pub fn supervisor() -> SupervisorBuilder {
    Supervisor::build("manager")
        .strategy(Strategy::OneForAll)
        .intensity(Intensity::new(0, 1))
}

/// A child `id` holding `piece` until asked to stop, then awaiting `stop(piece)`; it waits as
/// long as that takes ([`Shutdown::Infinity`]), as the manager's stop always did.
fn holder<T, F, Fut>(id: &str, piece: T, stop: F) -> ChildSpec
where
    T: Send + 'static,
    F: Fn(T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let piece = Arc::new(Mutex::new(Some(piece)));
    let stop = Arc::new(stop);
    let id_owned = id.to_owned();
    ChildSpec::task(id, move |signal: StopSignal| {
        let taken = piece.lock().expect("manager piece lock").take();
        let (stop, id) = (stop.clone(), id_owned.clone());
        async move {
            // Never restarted (intensity 0); a second start would be a bug in this module.
            let piece = taken.ok_or_else(|| format!("the manager's `{id}` cannot restart"))?;
            signal.requested().await;
            stop(piece).await;
            Ok::<_, String>(())
        }
    })
    .shutdown(Shutdown::Infinity)
}

/// `store`: the store (and, on SQLite, the file lock, released once the store is closed).
pub fn store(store: Store, lock: Option<SqliteLock>) -> ChildSpec {
    holder("store", (store, lock), |(store, lock)| async move {
        store.close().await;
        drop(lock);
    })
}

/// `leader`: this replica's [`Leadership`] (the advisory-lock loop runs until every clone is
/// dropped).
pub fn leader(leader: Leadership) -> ChildSpec {
    holder("leader", leader, |_| async {})
}

/// `pool`: the agent connections; stopped, they are closed ([`ClosePool`]).
pub fn pool(pool: Addr<AgentPool>) -> ChildSpec {
    holder("pool", pool, |pool| async move {
        let _ = pool.send(ClosePool).await;
    })
}

/// `registry`: agent liveness on its own arbiter; stopped, it writes its agent rows
/// ([`FlushAgents`]) and its thread ends.
pub fn registry(registry: Addr<AgentRegistry>, thread: actix::Arbiter) -> ChildSpec {
    holder(
        "registry",
        (registry, thread),
        |(registry, thread)| async move {
            let _ = registry.send(FlushAgents).await;
            thread.stop();
        },
    )
}

/// `intake`: the event intake's RPC server on its own arbiter; stopped, the server shuts down
/// and its thread ends.
pub fn intake(server: Addr<RpcServer>, thread: actix::Arbiter) -> ChildSpec {
    holder("intake", (server, thread), |(server, thread)| async move {
        let _ = server.send(crate::rpc::server::Shutdown).await;
        thread.stop();
    })
}

/// `scheduler`: placement and the session calls; it ends once its last address is dropped.
/// Stopped, the thread its admission rounds run on ends (a round in flight is dropped; the
/// queue is in the store, so the next leader's first round does its work).
pub fn scheduler(scheduler: Addr<Scheduler>, rounds: actix::Arbiter) -> ChildSpec {
    holder("scheduler", (scheduler, rounds), |(_, rounds)| async move {
        rounds.stop();
    })
}

/// `api`: the HTTP API, serving from the tree's start; stopped, in-flight requests get the
/// server's graceful period (5 s) to finish.
pub fn api(server: actix_web::dev::Server) -> ChildSpec {
    let handle = server.handle();
    let server = Arc::new(Mutex::new(Some(server)));
    let serving = ChildSpec::task("api", move |signal: StopSignal| {
        // Spawned here, in the tree's start, rather than when this child is first polled.
        let spawned = server
            .lock()
            .expect("api server lock")
            .take()
            .map(actix_rt::spawn);
        let handle = handle.clone();
        async move {
            spawned.ok_or("the manager's `api` cannot restart")?;
            signal.requested().await;
            handle.stop(true).await;
            Ok::<_, String>(())
        }
    });
    serving.shutdown(Shutdown::Infinity)
}
