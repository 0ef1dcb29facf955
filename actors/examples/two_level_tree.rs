//! A two-level supervision tree and what it does when children crash.
//!
//! ```text
//! root (one_for_one, 3 restarts / 5 s)
//! ├─ logger            an actix actor
//! └─ pool (one_for_all, 2 restarts / 1 s)
//!    ├─ worker-1
//!    ├─ worker-2       panics once
//!    └─ worker-3       fails three more times, exhausting the pool's intensity once
//! ```
//!
//! Run with `cargo run -p actors --example two_level_tree`; it exits by itself.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Context};
use actors::{ChildSpec, Intensity, Strategy, Supervisor};

/// The tree's logger: prints when it starts and stops.
struct Logger;

impl Actor for Logger {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Context<Self>) {
        println!("  logger   started");
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        println!("  logger   stopped");
    }
}

/// A worker that runs until asked to stop, unless its crash budget says otherwise.
fn worker(n: u32, panics: Arc<AtomicU32>, failures: Arc<AtomicU32>) -> ChildSpec {
    ChildSpec::task(format!("worker-{n}"), move |stop| {
        let (panics, failures) = (panics.clone(), failures.clone());
        async move {
            println!("  worker-{n} started");
            tokio::select! {
                _ = stop.requested() => {
                    println!("  worker-{n} stopped on request");
                    Ok(())
                }
                _ = tokio::time::sleep(Duration::from_millis(20 * u64::from(n))) => {
                    if n == 2 && take_one(&panics) {
                        panic!("worker-2 hit a bug");
                    }
                    if n == 3 && take_one(&failures) {
                        println!("  worker-3 fails");
                        return Err("upstream unavailable".to_owned());
                    }
                    stop.requested().await;
                    println!("  worker-{n} stopped on request");
                    Ok(())
                }
            }
        }
    })
}

/// Takes one unit of a crash budget; `false` once it is spent.
fn take_one(budget: &AtomicU32) -> bool {
    budget
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[actix_rt::main]
async fn main() {
    // The supervisors' own account (restarts, escalation) comes through `tracing`.
    tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .with_ansi(false)
        .init();
    std::panic::set_hook(Box::new(|info| println!("  (panic: {info})")));
    let panics = Arc::new(AtomicU32::new(1));
    let failures = Arc::new(AtomicU32::new(3));

    let pool = (1..=3).fold(
        Supervisor::build("pool")
            .strategy(Strategy::OneForAll)
            .intensity(Intensity::new(2, 1)),
        |pool, n| pool.child(worker(n, panics.clone(), failures.clone())),
    );
    println!("starting the tree: children start in order");
    let root = Supervisor::build("root")
        .intensity(Intensity::new(3, 5))
        .child(ChildSpec::actor("logger", |_, _| Logger))
        .child(ChildSpec::supervisor("pool", pool))
        .start();

    // worker-2 panics: the pool stops the others in reverse and restarts all three.
    // worker-3 then fails three times: two restarts fit the pool's intensity, the third
    // exceeds it, so the pool stops its workers and exits, and root restarts the pool.
    tokio::time::sleep(Duration::from_millis(400)).await;

    println!("shutting the tree down: children stop in reverse order");
    let reason = root.shutdown().await;
    println!("root exited: {reason}");
}
