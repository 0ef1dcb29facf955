//! Supervisor behaviour: strategies, intensity, restart types, shutdown order and timeouts,
//! panics, dynamic children, backoff. Time is paused (and auto-advances when idle), so every
//! timing assertion is exact and the tests take no real time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, ActorContext, Addr, AsyncContext, Context, Handler, Message};
use actors::{
    AddChild, Backoff, ChildInfo, ChildSpec, ExitHandle, ExitReason, Intensity, RemoveChild,
    RestartType, Shutdown, Strategy, Supervisor, SupervisorError, WhichChildren,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Everything the children did, in order.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, event: impl Into<String>) {
        self.0.lock().unwrap().push(event.into());
    }

    /// The events so far, forgetting them.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[derive(Debug)]
enum Cmd {
    Fail,
    Panic,
    Exit,
}

/// A remote control per running child id.
#[derive(Clone, Default)]
struct Controls(Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Cmd>>>>);

impl Controls {
    fn send(&self, id: &str, cmd: Cmd) {
        self.0.lock().unwrap()[id]
            .send(cmd)
            .expect("child is running");
    }
}

/// A task child that logs `start <id>` and `stop <id>` and obeys its control.
fn worker(id: &'static str, log: &Log, controls: &Controls) -> ChildSpec {
    let (log, controls) = (log.clone(), controls.clone());
    ChildSpec::task(id, move |stop| {
        log.push(format!("start {id}"));
        let (tx, mut rx) = mpsc::unbounded_channel();
        controls.0.lock().unwrap().insert(id.to_owned(), tx);
        let log = log.clone();
        async move {
            tokio::select! {
                _ = stop.requested() => {
                    log.push(format!("stop {id}"));
                    Ok(())
                }
                cmd = rx.recv() => match cmd {
                    Some(Cmd::Fail) => Err(format!("{id} failed")),
                    Some(Cmd::Panic) => panic!("{id} panicked on purpose"),
                    Some(Cmd::Exit) | None => Ok(()),
                },
            }
        }
    })
}

/// Lets every ready task run: with paused time the clock only moves when all are idle.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

async fn children(addr: &Addr<Supervisor>) -> Vec<ChildInfo> {
    addr.send(WhichChildren).await.unwrap()
}

fn three(strategy: Strategy, log: &Log, ctl: &Controls) -> actors::SupervisorBuilder {
    Supervisor::build("test")
        .strategy(strategy)
        .intensity(Intensity::new(10, 60))
        .child(worker("a", log, ctl))
        .child(worker("b", log, ctl))
        .child(worker("c", log, ctl))
}

#[actix_rt::test]
async fn children_start_in_order_and_stop_in_reverse() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let root = three(Strategy::OneForOne, &log, &ctl).start();
    settle().await;
    assert_eq!(log.take(), ["start a", "start b", "start c"]);
    assert_eq!(root.shutdown().await, ExitReason::Shutdown);
    assert_eq!(log.take(), ["stop c", "stop b", "stop a"]);
}

#[actix_rt::test]
async fn one_for_one_restarts_only_the_failed_child() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let root = three(Strategy::OneForOne, &log, &ctl).start();
    settle().await;
    log.take();
    ctl.send("b", Cmd::Fail);
    settle().await;
    assert_eq!(log.take(), ["start b"]);
    assert!(children(&root.addr()).await.iter().all(|c| c.running));
}

#[actix_rt::test]
async fn one_for_all_stops_the_others_in_reverse_then_restarts_all_in_order() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let root = three(Strategy::OneForAll, &log, &ctl).start();
    settle().await;
    log.take();
    ctl.send("b", Cmd::Fail);
    settle().await;
    assert_eq!(
        log.take(),
        ["stop c", "stop a", "start a", "start b", "start c"]
    );
    assert!(children(&root.addr()).await.iter().all(|c| c.running));
}

#[actix_rt::test]
async fn rest_for_one_restarts_the_failed_child_and_those_started_after_it() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let root = three(Strategy::RestForOne, &log, &ctl)
        .child(worker("d", &log, &ctl))
        .start();
    settle().await;
    log.take();
    ctl.send("b", Cmd::Fail);
    settle().await;
    assert_eq!(
        log.take(),
        ["stop d", "stop c", "start b", "start c", "start d"]
    );
    // The last child failing restarts only itself.
    ctl.send("d", Cmd::Fail);
    settle().await;
    assert_eq!(log.take(), ["start d"]);
    drop(root);
}

#[actix_rt::test]
async fn intensity_escalates_on_the_failure_after_max_restarts_within_the_window() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let root = Supervisor::build("root")
        .intensity(Intensity::new(3, 10))
        .child(worker("a", &log, &ctl))
        .child(worker("b", &log, &ctl))
        .start();
    settle().await;
    log.take();
    for _ in 0..3 {
        ctl.send("a", Cmd::Fail);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        log.take(),
        ["start a", "start a", "start a"],
        "3 restarts are allowed"
    );
    let addr = root.addr();
    assert!(children(&addr).await.iter().all(|c| c.running));

    ctl.send("a", Cmd::Fail); // the 4th failure within 10 s
    let reason = root.join().await;
    assert!(
        matches!(&reason, ExitReason::Failed(m) if m.contains("intensity")),
        "{reason:?}"
    );
    // a was already down; the others stopped in reverse order, nothing restarted.
    assert_eq!(log.take(), ["stop b"]);
    assert!(
        addr.send(WhichChildren).await.is_err(),
        "the supervisor is gone"
    );
}

#[actix_rt::test]
async fn failures_spread_beyond_the_window_never_escalate() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let root = Supervisor::build("root")
        .intensity(Intensity::new(2, 10))
        .child(worker("a", &log, &ctl))
        .start();
    settle().await;
    log.take();
    // 3 failures in any 10 s would escalate; one every 6 s keeps at most 2 in a window.
    for _ in 0..10 {
        ctl.send("a", Cmd::Fail);
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
    assert_eq!(log.take().len(), 10, "every failure was restarted");
    assert!(children(&root.addr()).await[0].running);
    assert_eq!(root.shutdown().await, ExitReason::Shutdown);
}

#[actix_rt::test]
async fn escalation_restarts_the_failed_subtree_in_its_parent() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let inner = Supervisor::build("inner")
        .intensity(Intensity::new(1, 5))
        .child(worker("w", &log, &ctl));
    let root = Supervisor::build("root")
        .strategy(Strategy::RestForOne)
        .intensity(Intensity::new(5, 60))
        .child(ChildSpec::supervisor("inner", inner))
        .child(worker("after", &log, &ctl))
        .start();
    settle().await;
    assert_eq!(log.take(), ["start w", "start after"]);
    ctl.send("w", Cmd::Fail); // restarted by inner
    settle().await;
    assert_eq!(log.take(), ["start w"]);
    ctl.send("w", Cmd::Fail); // one too many for inner: it exits, root restarts the rest
    settle().await;
    assert_eq!(log.take(), ["stop after", "start w", "start after"]);
    assert_eq!(root.shutdown().await, ExitReason::Shutdown);
    assert_eq!(log.take(), ["stop after", "stop w"]);
}

#[actix_rt::test]
async fn restart_types_permanent_transient_temporary() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let root = Supervisor::build("root")
        .intensity(Intensity::new(10, 60))
        .child(worker("perm", &log, &ctl).restart(RestartType::Permanent))
        .child(worker("trans", &log, &ctl).restart(RestartType::Transient))
        .child(worker("temp", &log, &ctl).restart(RestartType::Temporary))
        .start();
    let addr = root.addr();
    settle().await;
    log.take();

    // Normal exits: only the permanent child comes back.
    ctl.send("perm", Cmd::Exit);
    ctl.send("trans", Cmd::Exit);
    settle().await;
    assert_eq!(log.take(), ["start perm"]);
    let running: Vec<_> = children(&addr)
        .await
        .into_iter()
        .map(|c| (c.id, c.running))
        .collect();
    assert_eq!(
        running,
        [
            ("perm".into(), true),
            ("trans".into(), false),
            ("temp".into(), true)
        ]
    );

    // Abnormal exits: permanent and transient come back, temporary is forgotten.
    ctl.send("perm", Cmd::Fail);
    settle().await;
    root.addr().do_send(AddChild(
        worker("trans2", &log, &ctl).restart(RestartType::Transient),
    ));
    settle().await;
    ctl.send("trans2", Cmd::Fail);
    ctl.send("temp", Cmd::Fail);
    settle().await;
    assert_eq!(log.take(), ["start perm", "start trans2", "start trans2"]);
    let ids: Vec<_> = children(&addr).await.into_iter().map(|c| c.id).collect();
    assert_eq!(ids, ["perm", "trans", "trans2"]);
}

#[actix_rt::test]
async fn temporary_siblings_are_not_restarted_by_a_group_restart() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let root = Supervisor::build("root")
        .strategy(Strategy::OneForAll)
        .intensity(Intensity::new(10, 60))
        .child(worker("a", &log, &ctl))
        .child(worker("temp", &log, &ctl).restart(RestartType::Temporary))
        .start();
    settle().await;
    log.take();
    ctl.send("a", Cmd::Fail);
    settle().await;
    assert_eq!(log.take(), ["stop temp", "start a"]);
    let ids: Vec<_> = children(&root.addr())
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, ["a"]);
}

/// An actor that refuses to stop when asked and logs when it is finally dropped.
struct Stubborn(Log);

impl Actor for Stubborn {
    type Context = Context<Self>;

    fn stopping(&mut self, _: &mut Context<Self>) -> actix::Running {
        self.0.push("stubborn refuses");
        actix::Running::Continue
    }
}

impl Drop for Stubborn {
    fn drop(&mut self) {
        self.0.push("stubborn dropped");
    }
}

#[actix_rt::test]
async fn a_child_that_ignores_shutdown_is_forced_after_its_timeout() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let stubborn_log = log.clone();
    let stubborn_task_log = log.clone();
    let root = Supervisor::build("root")
        .child(worker("a", &log, &ctl))
        .child(
            ChildSpec::actor("stubborn", move |_, _| Stubborn(stubborn_log.clone()))
                .shutdown(Shutdown::millis(300)),
        )
        .child(
            ChildSpec::task("deaf", move |_stop| {
                let log = stubborn_task_log.clone();
                async move {
                    // Never looks at the stop signal.
                    let _guard = Guard(log, "deaf dropped");
                    futures::future::pending::<Result<(), String>>().await
                }
            })
            .shutdown(Shutdown::millis(200)),
        )
        .child(worker("c", &log, &ctl))
        .start();
    settle().await;
    log.take();
    let t0 = Instant::now();
    assert_eq!(root.shutdown().await, ExitReason::Shutdown);
    let mut events = log.take();
    events.dedup(); // actix may ask a refusing actor more than once
    assert_eq!(
        events,
        [
            "stop c",
            "deaf dropped",
            "stubborn refuses",
            "stubborn dropped",
            "stop a"
        ]
    );
    // 200 ms + 300 ms of grace; the timer rounds each deadline up to its next 1 ms tick.
    let elapsed = t0.elapsed();
    assert!(
        elapsed >= Duration::from_millis(500) && elapsed <= Duration::from_millis(502),
        "{elapsed:?}"
    );
}

#[actix_rt::test]
async fn immediate_shutdown_does_not_ask() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let root = Supervisor::build("root")
        .child(worker("a", &log, &ctl).shutdown(Shutdown::Immediate))
        .start();
    settle().await;
    log.take();
    let reason = root.addr().send(RemoveChild("a".into())).await.unwrap();
    assert_eq!(reason, Ok(Some(ExitReason::Killed)));
    assert_eq!(log.take(), Vec::<String>::new(), "no stop request was seen");
}

struct Guard(Log, &'static str);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.push(self.1);
    }
}

/// An actor that panics on [`Boom`], fails through its exit handle on [`Quit`].
struct Fragile {
    log: Log,
    exit: ExitHandle,
}

#[derive(Message)]
#[rtype(result = "()")]
struct Boom;

#[derive(Message)]
#[rtype(result = "()")]
struct Quit {
    fail: bool,
}

impl Actor for Fragile {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Context<Self>) {
        self.log.push("start fragile");
    }
}

impl Handler<Boom> for Fragile {
    type Result = ();

    fn handle(&mut self, _: Boom, _: &mut Context<Self>) {
        panic!("fragile actor panicked on purpose");
    }
}

impl Handler<Quit> for Fragile {
    type Result = ();

    fn handle(&mut self, msg: Quit, ctx: &mut Context<Self>) {
        if msg.fail {
            self.exit.fail("quit with an error");
        }
        ctx.stop();
    }
}

type Slot<A> = Arc<Mutex<Option<Addr<A>>>>;

fn fragile(log: &Log, slot: &Slot<Fragile>) -> ChildSpec {
    let (log, slot) = (log.clone(), slot.clone());
    ChildSpec::actor("fragile", move |ctx, exit| {
        *slot.lock().unwrap() = Some(ctx.address());
        Fragile {
            log: log.clone(),
            exit,
        }
    })
}

fn addr_of<A: Actor>(slot: &Slot<A>) -> Addr<A> {
    slot.lock().unwrap().clone().unwrap()
}

#[actix_rt::test]
async fn a_panicking_child_is_restarted_and_the_process_survives() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let slot = Slot::default();
    let root = Supervisor::build("root")
        .intensity(Intensity::new(10, 60))
        .child(worker("a", &log, &ctl))
        .child(fragile(&log, &slot))
        .start();
    settle().await;
    log.take();

    // A panicking task child.
    ctl.send("a", Cmd::Panic);
    settle().await;
    assert_eq!(log.take(), ["start a"]);

    // A panicking actor handler.
    let first = addr_of(&slot);
    first.do_send(Boom);
    settle().await;
    assert_eq!(log.take(), ["start fragile"]);
    assert!(!first.connected(), "the panicked actor is gone");
    let second = addr_of(&slot);
    assert!(second.connected(), "a fresh one replaced it");

    // The arbiter still runs everything else, the test process included.
    assert!(children(&root.addr()).await.iter().all(|c| c.running));
    assert_eq!(root.shutdown().await, ExitReason::Shutdown);
}

#[actix_rt::test]
async fn a_panicking_start_function_is_a_failed_start() {
    tokio::time::pause();
    let log = Log::default();
    let calls = Arc::new(AtomicU32::new(0));
    let (start_log, start_calls) = (log.clone(), calls.clone());
    let root = Supervisor::build("root")
        .intensity(Intensity::new(2, 60))
        .child(ChildSpec::task("bad", move |stop| {
            start_log.push("start bad");
            assert!(
                start_calls.fetch_add(1, Ordering::SeqCst) >= 2,
                "cannot start yet"
            );
            async move {
                stop.requested().await;
                Ok::<_, String>(())
            }
        }))
        .start();
    settle().await;
    assert_eq!(
        log.take(),
        ["start bad", "start bad", "start bad"],
        "2 panicking starts, then a good one"
    );
    assert!(children(&root.addr()).await[0].running);
}

#[actix_rt::test]
async fn actor_exit_reasons_drive_transient_restarts() {
    tokio::time::pause();
    let log = Log::default();
    let slot = Slot::default();
    let root = Supervisor::build("root")
        .intensity(Intensity::new(10, 60))
        .child(fragile(&log, &slot).restart(RestartType::Transient))
        .start();
    settle().await;
    log.take();
    addr_of(&slot).do_send(Quit { fail: true });
    settle().await;
    assert_eq!(
        log.take(),
        ["start fragile"],
        "failed through ExitHandle: restarted"
    );
    addr_of(&slot).do_send(Quit { fail: false });
    settle().await;
    assert_eq!(
        log.take(),
        Vec::<String>::new(),
        "stopped normally: not restarted"
    );
    assert!(!children(&root.addr()).await[0].running);
}

#[actix_rt::test]
async fn children_are_added_and_removed_at_run_time() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let root = Supervisor::build("registry")
        .child(worker("a", &log, &ctl))
        .start();
    let addr = root.addr();
    addr.send(AddChild(worker("k1", &log, &ctl)))
        .await
        .unwrap()
        .unwrap();
    addr.send(AddChild(worker("k2", &log, &ctl)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        addr.send(AddChild(worker("k1", &log, &ctl))).await.unwrap(),
        Err(SupervisorError::DuplicateId("k1".into()))
    );
    settle().await;
    assert_eq!(log.take(), ["start a", "start k1", "start k2"]);

    assert_eq!(
        addr.send(RemoveChild("k1".into())).await.unwrap(),
        Ok(Some(ExitReason::Shutdown))
    );
    assert_eq!(log.take(), ["stop k1"], "stopped before the reply");
    assert_eq!(
        addr.send(RemoveChild("k1".into())).await.unwrap(),
        Err(SupervisorError::NotFound("k1".into()))
    );
    let ids: Vec<_> = children(&addr).await.into_iter().map(|c| c.id).collect();
    assert_eq!(ids, ["a", "k2"]);

    // Dynamic children take part in the ordered shutdown like the others.
    assert_eq!(root.shutdown().await, ExitReason::Shutdown);
    assert_eq!(log.take(), ["stop k2", "stop a"]);
}

#[actix_rt::test]
async fn backoff_delays_each_restart() {
    tokio::time::pause();
    let (log, ctl) = (Log::default(), Controls::default());
    let root = Supervisor::build("root")
        .intensity(Intensity::new(10, 60))
        .backoff(Backoff::Exponential {
            base: Duration::from_secs(1),
            max: Duration::from_secs(3),
        })
        .child(worker("a", &log, &ctl))
        .start();
    settle().await;
    log.take();
    for expected in [1000, 2000, 3000, 3000] {
        ctl.send("a", Cmd::Fail);
        tokio::time::sleep(Duration::from_millis(expected - 1)).await;
        assert!(log.take().is_empty(), "not restarted before {expected} ms");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(log.take(), ["start a"], "restarted at {expected} ms");
    }
    drop(root);
}
