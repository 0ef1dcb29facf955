//! Things that take CPU to make (SSH keys: an RSA-2048 key is 0.1–0.5 s) made ahead, off the
//! path that needs them: a small [`Pool`] refilled on a thread of its own after each take. Each
//! thing goes to one taker only; an empty pool makes one on the spot. The agent keeps its
//! runner kernels' keys this way (`agent/runner/keys.rs`), the manager its cluster sessions'
//! keypairs (`manager/scheduler/cluster/keypair.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Things of one kind made ahead: up to `size` ready, refilled by `make` on a thread of its own.
pub struct Pool<T> {
    what: &'static str,
    size: usize,
    make: Box<dyn Fn() -> std::io::Result<T> + Send + Sync>,
    ready: Mutex<Vec<T>>,
    filling: AtomicBool,
}

impl<T: Send + 'static> Pool<T> {
    /// A pool of `size` `what`s (for the log) made by `make`, filled from now.
    pub fn new(
        what: &'static str,
        size: usize,
        make: impl Fn() -> std::io::Result<T> + Send + Sync + 'static,
    ) -> Arc<Pool<T>> {
        let pool = Arc::new(Pool {
            what,
            size,
            make: Box::new(make),
            ready: Mutex::new(Vec::with_capacity(size)),
            filling: AtomicBool::new(false),
        });
        pool.refill();
        pool
    }

    /// One nobody else got: one made ahead, else one made now (the pool then refills).
    ///
    /// Errors: `make`'s.
    pub fn take(self: &Arc<Self>) -> std::io::Result<T> {
        let ready = self.ready.lock().expect("made-ahead pool lock").pop();
        self.refill();
        match ready {
            Some(key) => Ok(key),
            None => (self.make)(),
        }
    }

    /// How many are ready now.
    pub fn ready(&self) -> usize {
        self.ready.lock().expect("made-ahead pool lock").len()
    }

    /// Fills the pool on a thread of its own, unless one is already at it.
    fn refill(self: &Arc<Self>) {
        if self.ready() >= self.size || self.filling.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("kv-ahead-{}", self.what.replace(' ', "-")))
            .spawn(move || loop {
                while me.ready() < me.size {
                    match (me.make)() {
                        Ok(key) => me.ready.lock().expect("made-ahead pool lock").push(key),
                        Err(e) => {
                            tracing::warn!(what = me.what, error = %e, "cannot make these ahead; each is made when it is needed");
                            me.filling.store(false, Ordering::Release);
                            return;
                        }
                    }
                }
                me.filling.store(false, Ordering::Release);
                // One taken after the last check and before the flag went down found the filler
                // still at it: fill again, unless another filler took over.
                if me.ready() >= me.size || me.filling.swap(true, Ordering::AcqRel) {
                    return;
                }
            });
        if spawned.is_err() {
            self.filling.store(false, Ordering::Release);
        }
    }
}
