//! The manager's supervision tree: one child per piece, each in its own module beside the
//! conversion of its config into the piece it holds; `Manager::start` lists them in order.
//! Each child holds what `Manager::start` prepared (the store, leadership, actors already
//! started, bound listeners) from the tree's start until asked to stop, then stops it as the
//! piece requires.
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

pub(super) mod api;
pub(super) mod intake;
pub(super) mod leader;
pub(super) mod pool;
pub(super) mod registry;
pub(super) mod scheduler;
pub(super) mod store;

use std::future::Future;
use std::sync::{Arc, Mutex};

use actors::{ChildSpec, Intensity, Shutdown, StopSignal, Strategy, Supervisor, SupervisorBuilder};

/// The manager supervisor's configuration, before its children: `one_for_all`, no restart.
pub(super) fn supervisor() -> SupervisorBuilder {
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
