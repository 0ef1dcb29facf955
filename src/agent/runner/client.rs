//! One kernel's connection to its runner: a PUSH to repl-in and a PULL from repl-out on the
//! host ports the container publishes on 127.0.0.1, a reader that demultiplexes replies from
//! run output, and the run-id turn of Backend.AI's `AbstractCodeRunner`
//! (`src/ai/backend/agent/kernel.py`): one run at a time per kernel, in arrival order, each
//! answered in pieces by `flush_timeout` (`continued`) until a terminal record.
//!
//! Two deliberate differences from upstream: a run's output is held in a byte-bounded buffer
//! and the reader stops reading repl-out while it is full (the runner then blocks on its send:
//! back-pressure, where upstream drops records), and a batch run stays current across its
//! `clean-finished`/`build-finished` answers (upstream drops what the next step prints before
//! the client's `continue` arrives).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::Value as Json;
use tmq::{AsZmqSocket, FromZmqSocket, Multipart};
use tokio::sync::{mpsc, Notify, OwnedMutexGuard};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::protocol::{decode, FromRunner, Step, ToRunner};
use crate::agent::backend::OutputStream;
use crate::agent::exec::console::Utf8Carry;

/// Largest message the agent takes off repl-out, in bytes: a bigger one makes libzmq drop the
/// connection (the reader opens a new one, and ends the run in progress saying so: its end
/// may have been lost with the connection), so a hostile runner's 1 GiB frame never reaches
/// memory. Above upstream's agent's 10 MiB per record (which keeps a bigger record's first
/// 10 MiB; this agent cannot read part of a message): the REPL batches a fast printer's output
/// into messages of several MiB.
pub const MAX_FRAME: i64 = 16 << 20;

/// Messages libzmq queues from repl-out before the runner's sends block (with [`MAX_FRAME`],
/// at most 128 MiB per kernel from a hostile runner, beside the run's buffer).
const RECV_HWM: i32 = 8;

/// Ops queued towards the runner before a sender waits.
const SEND_QUEUE: usize = 64;

/// How long a reply (`status`, `get-apps`, `complete`) may take by default.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The runner's `start-service` reply may take its own 30 s launch check (upstream waits 35 s).
pub const SERVICE_REPLY_TIMEOUT: Duration = Duration::from_secs(35);

/// Keep-alive: a `status` this often (upstream's `ping_status`, for NAT entries).
const KEEPALIVE: Duration = Duration::from_secs(10);

/// The two host ports a runner kernel publishes on 127.0.0.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunnerPorts {
    /// Host port of the runner's PULL (container port 2000): `repl_in_port`.
    pub repl_in: u16,
    /// Host port of the runner's PUSH (container port 2001): `repl_out_port`.
    pub repl_out: u16,
}

/// Why a runner call failed.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The runner did not answer in time (it is busy, gone, or not a runner).
    #[error("the kernel runner did not answer `{op}` within {secs} s")]
    NoReply {
        /// The op.
        op: &'static str,
        /// Seconds waited.
        secs: f64,
    },
    /// `continue`/`input` for a run that is not the kernel's current one.
    #[error("run `{0}` not found (not the kernel's current run: unknown, finished, or abandoned)")]
    RunNotFound(String),
    /// A query or batch with the id of the run in progress.
    #[error("run `{0}` is already in progress: `continue` it")]
    RunExists(String),
    /// The sockets could not be made.
    #[error("cannot connect to the kernel runner: {0}")]
    Socket(String),
    /// The connection was closed (the kernel is ending).
    #[error("the kernel runner connection is closed")]
    Closed,
}

/// One record of a run, decoded.
#[derive(Clone, Debug, PartialEq)]
enum Record {
    Text(OutputStream, String),
    Item(&'static str, Json),
    WaitingInput(Json),
    End(Step, Option<i64>),
    /// The agent's watchdog (`opts.timeout`) interrupted the run.
    Timeout,
    /// The connection closed under the run.
    Gone,
}

impl Record {
    fn bytes(&self) -> usize {
        match self {
            Record::Text(_, t) => t.len(),
            Record::Item(_, v) => v.to_string().len(),
            _ => 0,
        }
    }

    fn ends_answer(&self) -> bool {
        !matches!(self, Record::Text(..) | Record::Item(..))
    }
}

/// An `execute` answer from the runner: Backend.AI's result map.
#[derive(Clone, Debug, PartialEq)]
pub struct RunnerAnswer {
    /// The run.
    pub run_id: String,
    /// `continued`, `waiting-input`, `clean-finished`, `build-finished`, `finished`,
    /// `exec-timeout`.
    pub status: &'static str,
    /// The step's exit code, on `*-finished`.
    pub exit_code: Option<i64>,
    /// `waiting-input`'s options (`{"is_password": bool}`); `None` otherwise.
    pub options: Option<Json>,
    /// `[type, data]` items in order: consecutive stdout (stderr) merged into one item,
    /// `media` as `[mime, data]`.
    pub console: Vec<(String, Json)>,
}

struct Current {
    run_id: String,
    records: VecDeque<Record>,
    bytes: usize,
    last_touch: Instant,
    /// The kernel's turn, released when the run concludes.
    _turn: OwnedMutexGuard<()>,
    /// Which run this is, for its watchdog.
    generation: u64,
}

#[derive(Default)]
struct State {
    current: Option<Current>,
    generation: u64,
    closed: bool,
    /// The runner's `started_at` as first seen: a new value means the runner restarted.
    started_at: Option<f64>,
}

/// A reply slot: the reader `try_send`s, one caller at a time waits.
struct Slot<T> {
    tx: mpsc::Sender<T>,
    rx: tokio::sync::Mutex<mpsc::Receiver<T>>,
}

impl<T> Slot<T> {
    fn new() -> Slot<T> {
        let (tx, rx) = mpsc::channel(8);
        Slot {
            tx,
            rx: tokio::sync::Mutex::new(rx),
        }
    }
}

struct Inner {
    kernel_id: String,
    ports: RunnerPorts,
    out: mpsc::Sender<ToRunner>,
    state: Mutex<State>,
    /// Records arrived (or the run concluded, or the connection closed).
    data: Notify,
    /// An answer took records: there is room in the buffer.
    room: Notify,
    cap: usize,
    idle: Duration,
    turn: Arc<tokio::sync::Mutex<()>>,
    status: Slot<Option<f64>>,
    completion: Slot<Json>,
    service: Slot<Json>,
    apps: Slot<Json>,
    /// Messages dropped as malformed (wrong frame count, unknown op, undecodable payload).
    malformed: std::sync::atomic::AtomicU64,
}

/// A kernel's runner connection; dropping it closes the sockets and ends its tasks.
pub struct RunnerClient {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for RunnerClient {
    fn drop(&mut self) {
        self.inner.close();
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn socket(ctx: &zmq::Context, kind: zmq::SocketType, port: u16) -> Result<zmq::Socket, zmq::Error> {
    let s = ctx.socket(kind)?;
    s.set_linger(50)?;
    if kind == zmq::SocketType::PULL {
        s.set_maxmsgsize(MAX_FRAME)?;
        s.set_rcvhwm(RECV_HWM)?;
    }
    s.connect(&format!("tcp://127.0.0.1:{port}"))?;
    Ok(s)
}

impl RunnerClient {
    /// Connects to the runner of kernel `kernel_id` at `ports` (ZeroMQ connects lazily and
    /// reconnects by itself, so this succeeds before the runner listens). Each run holds at
    /// most `cap` bytes of unread output; a run nobody reads for `idle` is interrupted and
    /// abandoned (as `[agent] exec-idle-timeout` does to process runs).
    ///
    /// Errors: [`RunnerError::Socket`].
    pub fn connect(
        zctx: &zmq::Context,
        kernel_id: &str,
        ports: RunnerPorts,
        cap: usize,
        idle: Duration,
    ) -> Result<RunnerClient, RunnerError> {
        let err = |e: zmq::Error| RunnerError::Socket(e.to_string());
        let push = tmq::push::Push::from_zmq_socket(
            socket(zctx, zmq::SocketType::PUSH, ports.repl_in).map_err(err)?,
        )
        .map_err(|e| RunnerError::Socket(e.to_string()))?;
        let pull = Repl::open(zctx, ports.repl_out)?;
        let (out, out_rx) = mpsc::channel(SEND_QUEUE);
        let inner = Arc::new(Inner {
            kernel_id: kernel_id.to_owned(),
            ports,
            out,
            state: Mutex::new(State::default()),
            data: Notify::new(),
            room: Notify::new(),
            cap: cap.max(1),
            idle,
            turn: Arc::new(tokio::sync::Mutex::new(())),
            status: Slot::new(),
            completion: Slot::new(),
            service: Slot::new(),
            apps: Slot::new(),
            malformed: Default::default(),
        });
        let tasks = vec![
            tokio::spawn(write_loop(push, out_rx)),
            tokio::spawn(read_loop(inner.clone(), zctx.clone(), pull)),
            tokio::spawn(keeper(Arc::downgrade(&inner))),
        ];
        Ok(RunnerClient { inner, tasks })
    }

    /// The host ports it is connected to.
    pub fn ports(&self) -> RunnerPorts {
        self.inner.ports
    }

    /// Messages dropped as malformed so far.
    pub fn malformed(&self) -> u64 {
        self.inner
            .malformed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes of unread run output held (at most the cap, plus one record).
    pub fn buffered(&self) -> usize {
        let st = self.inner.st();
        st.current.as_ref().map_or(0, |c| c.bytes)
    }

    /// Asks `status` and waits for the answer: the runner's `started_at`.
    ///
    /// Errors: [`RunnerError::NoReply`] after `within`.
    pub async fn status(&self, within: Duration) -> Result<Option<f64>, RunnerError> {
        let i = &self.inner;
        i.request(&i.status, ToRunner::Status, "status", within)
            .await
    }

    /// Polls `status` every 0.3 s until the runner answers, for at most `within` (a kernel's
    /// readiness, upstream's `init-polling-*`): its `started_at`.
    ///
    /// Errors: [`RunnerError::NoReply`].
    pub async fn wait_ready(&self, within: Duration) -> Result<Option<f64>, RunnerError> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.status(left.min(Duration::from_millis(300))).await {
                Ok(s) => return Ok(s),
                Err(RunnerError::NoReply { .. }) if !left.is_zero() => {}
                Err(RunnerError::NoReply { .. }) => {
                    return Err(RunnerError::NoReply {
                        op: "status",
                        secs: within.as_secs_f64(),
                    })
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `get-apps`: `{"status": "done", "data": [{"name", "url_template"?, ...}]}`.
    ///
    /// Errors: [`RunnerError::NoReply`] after [`REPLY_TIMEOUT`].
    pub async fn get_apps(&self) -> Result<Json, RunnerError> {
        let i = &self.inner;
        i.request(&i.apps, ToRunner::GetApps, "get-apps", REPLY_TIMEOUT)
            .await
    }

    /// `complete`: `{"suggestions": [...]}`.
    ///
    /// Errors: [`RunnerError::NoReply`] after [`REPLY_TIMEOUT`].
    pub async fn complete(&self, payload: Json) -> Result<Json, RunnerError> {
        let i = &self.inner;
        i.request(
            &i.completion,
            ToRunner::Complete(payload),
            "complete",
            REPLY_TIMEOUT,
        )
        .await
    }

    /// `start-service` `{"name", "port", "ports", "protocol", "options"}`: the runner's
    /// `{"status": "started" | "running" | "failed", "error"?}`.
    ///
    /// Errors: [`RunnerError::NoReply`] after [`SERVICE_REPLY_TIMEOUT`].
    pub async fn start_service(&self, info: Json) -> Result<Json, RunnerError> {
        let i = &self.inner;
        i.request(
            &i.service,
            ToRunner::StartService(info),
            "start-service",
            SERVICE_REPLY_TIMEOUT,
        )
        .await
    }

    /// Sends an op that has no reply (`interrupt`, `shutdown-service`, `event`).
    ///
    /// Errors: [`RunnerError::Closed`].
    pub async fn send(&self, op: ToRunner) -> Result<(), RunnerError> {
        self.inner.send(op).await
    }

    /// Starts run `run_id` with `ops` (`code`, or `clean`+`build`+`exec`) once the kernel's
    /// previous run concluded (in arrival order); with `timeout`, the agent interrupts it then
    /// and answers `exec-timeout`.
    ///
    /// Errors: [`RunnerError::RunExists`] for the id of the run in progress;
    /// [`RunnerError::Closed`].
    pub async fn start(
        &self,
        run_id: &str,
        ops: Vec<ToRunner>,
        timeout: Option<Duration>,
    ) -> Result<(), RunnerError> {
        let i = &self.inner;
        if i.current_is(run_id) {
            return Err(RunnerError::RunExists(run_id.to_owned()));
        }
        let turn = i.turn.clone().lock_owned().await;
        let generation = {
            let mut st = i.st();
            if st.closed {
                return Err(RunnerError::Closed);
            }
            st.generation += 1;
            let generation = st.generation;
            st.current = Some(Current {
                run_id: run_id.to_owned(),
                records: VecDeque::new(),
                bytes: 0,
                last_touch: Instant::now(),
                _turn: turn,
                generation,
            });
            generation
        };
        for op in ops {
            i.send(op).await?;
        }
        if let Some(t) = timeout {
            let weak = Arc::downgrade(&self.inner);
            tokio::spawn(async move {
                tokio::time::sleep(t).await;
                let Some(i) = weak.upgrade() else { return };
                let fired = {
                    let mut st = i.st();
                    match st.current.as_mut() {
                        Some(c) if c.generation == generation => {
                            c.records.push_back(Record::Timeout);
                            true
                        }
                        _ => false,
                    }
                };
                if fired {
                    let _ = i.send(ToRunner::Interrupt).await;
                    i.data.notify_waiters();
                }
            });
        }
        Ok(())
    }

    /// Sends `input` text to the current run `run_id` (which waits for a line).
    ///
    /// Errors: [`RunnerError::RunNotFound`], [`RunnerError::Closed`].
    pub async fn input(&self, run_id: &str, text: &str) -> Result<(), RunnerError> {
        if !self.inner.current_is(run_id) {
            return Err(RunnerError::RunNotFound(run_id.to_owned()));
        }
        self.inner.send(ToRunner::Input(text.to_owned())).await
    }

    /// The next answer of the current run `run_id`: when a terminal record or a
    /// `waiting-input` arrives, when the buffer holds `cap` bytes, or after `flush` (`None`: no
    /// deadline). A `finished` (or `exec-timeout`) answer concludes the run: the next run's turn.
    ///
    /// Errors: [`RunnerError::RunNotFound`] when `run_id` is not the current run.
    pub async fn answer(
        &self,
        run_id: &str,
        flush: Option<Duration>,
    ) -> Result<RunnerAnswer, RunnerError> {
        let i = &self.inner;
        let deadline = flush.and_then(|f| Instant::now().checked_add(f));
        let records = loop {
            let notified = i.data.notified();
            {
                let mut st = i.st();
                let closed = st.closed;
                let Some(c) = st.current.as_mut().filter(|c| c.run_id == run_id) else {
                    return Err(RunnerError::RunNotFound(run_id.to_owned()));
                };
                c.last_touch = Instant::now();
                if closed && !c.records.iter().any(Record::ends_answer) {
                    c.records.push_back(Record::Gone);
                }
                let due = deadline.is_some_and(|d| Instant::now() >= d);
                if due || c.bytes >= i.cap || c.records.iter().any(Record::ends_answer) {
                    break take(c, i.cap);
                }
            }
            crate::agent::exec::notified_or_due(notified, deadline).await;
        };
        i.room.notify_waiters();
        let answer = aggregate(run_id, records);
        if matches!(answer.status, "finished" | "exec-timeout") {
            i.conclude(run_id);
        }
        Ok(answer)
    }

    /// Closes the connection: waiting answers end (`finished`, no exit code), later calls fail
    /// with [`RunnerError::Closed`].
    pub fn close(&self) {
        self.inner.close();
    }

    /// Whether `run_id` is the kernel's current run.
    pub fn is_current(&self, run_id: &str) -> bool {
        self.inner.current_is(run_id)
    }
}

/// Takes the records of one answer: up to and including the first that ends an answer, or
/// until `cap` bytes were taken (at least one record).
fn take(c: &mut Current, cap: usize) -> Vec<Record> {
    let mut out = Vec::new();
    let mut taken = 0;
    while let Some(r) = c.records.pop_front() {
        let n = r.bytes();
        c.bytes -= n;
        taken += n;
        let ends = r.ends_answer();
        out.push(r);
        if ends || taken >= cap {
            break;
        }
    }
    out
}

/// Backend.AI's `aggregate_console` (api_version ≥ 2) and status of one answer's records.
fn aggregate(run_id: &str, records: Vec<Record>) -> RunnerAnswer {
    let mut console: Vec<(String, Json)> = Vec::new();
    let mut status = "continued";
    let mut exit_code = None;
    let mut options = None;
    for r in records {
        match r {
            Record::Text(stream, text) => match console.last_mut() {
                Some((kind, Json::String(s))) if kind == stream.as_str() => s.push_str(&text),
                _ => console.push((stream.as_str().to_owned(), Json::String(text))),
            },
            Record::Item(kind, v) => console.push((kind.to_owned(), v)),
            Record::WaitingInput(o) => {
                status = "waiting-input";
                options = Some(o);
            }
            Record::End(step, code) => {
                status = step.status();
                exit_code = code;
            }
            Record::Timeout => status = "exec-timeout",
            Record::Gone => status = "finished",
        }
    }
    console.retain(|(_, v)| !matches!(v, Json::String(s) if s.is_empty()));
    RunnerAnswer {
        run_id: run_id.to_owned(),
        status,
        exit_code,
        options,
        console,
    }
}

impl Inner {
    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("runner state lock")
    }

    fn current_is(&self, run_id: &str) -> bool {
        self.st()
            .current
            .as_ref()
            .is_some_and(|c| c.run_id == run_id)
    }

    /// Ends run `run_id` (its turn goes to the next run); later output until the next run
    /// starts is dropped, as upstream's agent drops output with no current run.
    fn conclude(&self, run_id: &str) {
        let mut st = self.st();
        if st.current.as_ref().is_some_and(|c| c.run_id == run_id) {
            st.current = None;
        }
        drop(st);
        self.room.notify_waiters();
    }

    fn close(&self) {
        self.st().closed = true;
        self.data.notify_waiters();
        self.room.notify_waiters();
    }

    async fn send(&self, op: ToRunner) -> Result<(), RunnerError> {
        if self.st().closed {
            return Err(RunnerError::Closed);
        }
        self.out.send(op).await.map_err(|_| RunnerError::Closed)
    }

    async fn request<T>(
        &self,
        slot: &Slot<T>,
        op: ToRunner,
        name: &'static str,
        within: Duration,
    ) -> Result<T, RunnerError> {
        let no_reply = || RunnerError::NoReply {
            op: name,
            secs: within.as_secs_f64(),
        };
        let mut rx = match tokio::time::timeout(within, slot.rx.lock()).await {
            Ok(rx) => rx,
            Err(_) => return Err(no_reply()),
        };
        // A reply that came after its caller gave up is not this call's.
        while rx.try_recv().is_ok() {}
        self.send(op).await?;
        match tokio::time::timeout(within, rx.recv()).await {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err(RunnerError::Closed),
            Err(_) => Err(no_reply()),
        }
    }

    /// Appends a record to the current run, waiting while its buffer is full (back-pressure:
    /// the reader stops reading repl-out); dropped when no run is current.
    async fn push(&self, record: Record) {
        loop {
            let room = self.room.notified();
            {
                let mut st = self.st();
                if st.closed {
                    return;
                }
                let Some(c) = st.current.as_mut() else { return };
                if record.ends_answer() || c.bytes < self.cap {
                    c.bytes += record.bytes();
                    c.records.push_back(record);
                    drop(st);
                    self.data.notify_waiters();
                    return;
                }
            }
            room.await;
        }
    }
}

async fn write_loop(mut push: tmq::push::Push, mut ops: mpsc::Receiver<ToRunner>) {
    while let Some(op) = ops.recv().await {
        let [a, b] = op.frames();
        if let Err(e) = push.send(Multipart::from(vec![a, b])).await {
            tracing::warn!(error = %e, "kernel runner: send failed");
        }
    }
}

/// Log at most one line per this many dropped messages (a flood of garbage is not a flood of
/// log lines).
const MALFORMED_LOG_EVERY: u64 = 1000;

/// The agent's end of repl-out, with a monitor of its connection: libzmq never reconnects a
/// connection it dropped for a protocol error (a message over [`MAX_FRAME`] is one), so the
/// reader makes a new socket when the monitor says the connection went.
struct Repl {
    pull: tmq::pull::Pull,
    monitor: tmq::pair::Pair,
}

/// A monitor event's id (the first frame's first two bytes, little-endian).
fn event_id(frame: &[u8]) -> u16 {
    frame
        .get(..2)
        .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]))
}

/// The monitor is switched off before the sockets close. libzmq sends a monitor event with a
/// blocking send, from the thread that saw it (the context's I/O thread for a dropped
/// connection), and a closed socket keeps its monitor until the reaper has finished it
/// (`stop_monitor` in `~socket_base_t`, libzmq 4.3 `src/socket_base.cpp`): a connection that
/// dropped in between, with the reading end already gone, blocked the I/O thread for good,
/// and with it every runner connection of the agent (seen when three cluster kernels' containers
/// restarted at once: no `status` answered for 60 s, no TCP connection to any runner). A
/// monitor on an endpoint nobody reads, for no events, sends nothing.
impl Drop for Repl {
    fn drop(&mut self) {
        let off = format!(
            "inproc://kv-runner-monitor-off-{}",
            uuid::Uuid::new_v4().simple()
        );
        if let Err(e) = self.pull.get_socket().monitor(&off, 0) {
            tracing::warn!(error = %e, "kernel runner: cannot switch off a repl-out monitor");
        }
    }
}

impl Repl {
    fn open(zctx: &zmq::Context, port: u16) -> Result<Repl, RunnerError> {
        let err = |e: &dyn std::fmt::Display| RunnerError::Socket(e.to_string());
        let sock = socket(zctx, zmq::SocketType::PULL, port).map_err(|e| err(&e))?;
        let endpoint = format!(
            "inproc://kv-runner-monitor-{}",
            uuid::Uuid::new_v4().simple()
        );
        sock.monitor(&endpoint, zmq::SocketEvent::DISCONNECTED as i32)
            .map_err(|e| err(&e))?;
        let pair = zctx.socket(zmq::PAIR).map_err(|e| err(&e))?;
        pair.connect(&endpoint).map_err(|e| err(&e))?;
        Ok(Repl {
            pull: tmq::pull::Pull::from_zmq_socket(sock).map_err(|e| err(&e))?,
            monitor: tmq::pair::Pair::from_zmq_socket(pair).map_err(|e| err(&e))?,
        })
    }
}

async fn read_loop(inner: Arc<Inner>, zctx: zmq::Context, mut repl: Repl) {
    let mut carry = Utf8Carry::default();
    loop {
        let msg = tokio::select! {
            msg = repl.pull.next() => msg,
            ev = repl.monitor.next() => {
                let id = ev.and_then(Result::ok).and_then(|m| m.iter().next().map(|f| event_id(f)));
                if id == Some(zmq::SocketEvent::DISCONNECTED as u16) {
                    // Before the runner listens, the engine's proxy takes each connection and
                    // drops it: routine at a kernel's start, so debug, and paced.
                    tracing::debug!(kernel_id = %inner.kernel_id, "kernel runner: repl-out connection dropped; reconnecting");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    // What the old socket already holds is the runner's output: read it first.
                    while let Ok(frames) = repl.pull.get_socket().recv_multipart(zmq::DONTWAIT) {
                        let parts: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
                        handle(&inner, &mut carry, &parts).await;
                    }
                    // The run in progress may have lost output, and its end, with the connection:
                    // it ends here, saying so, rather than hold the kernel's turn forever.
                    if inner.st().current.is_some() {
                        tracing::warn!(kernel_id = %inner.kernel_id, "kernel runner: repl-out connection dropped during a run; the run is ended");
                    }
                    inner
                        .push(Record::Text(
                            OutputStream::Stderr,
                            format!(
                                "[kernelvisor] the kernel runner's connection dropped (a message over {} MiB is refused): this run's output may be incomplete, and it is ended here\n",
                                MAX_FRAME >> 20
                            ),
                        ))
                        .await;
                    inner.push(Record::Gone).await;
                    match Repl::open(&zctx, inner.ports.repl_out) {
                        Ok(r) => repl = r,
                        Err(e) => tracing::warn!(kernel_id = %inner.kernel_id, error = %e, "kernel runner: cannot reconnect repl-out"),
                    }
                }
                continue;
            }
        };
        let Some(msg) = msg else { return };
        let msg = match msg {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(kernel_id = %inner.kernel_id, error = %e, "kernel runner: receive failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let frames: Vec<&[u8]> = msg.iter().map(|m| &m[..]).collect();
        handle(&inner, &mut carry, &frames).await;
    }
}

/// One message off repl-out: a reply to its slot, output to the current run (waiting while
/// its buffer is full), garbage counted and dropped.
async fn handle(inner: &Inner, carry: &mut Utf8Carry, frames: &[&[u8]]) {
    let decoded = decode(frames);
    match decoded {
        Err(e) => {
            let n = inner
                .malformed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n % MALFORMED_LOG_EVERY == 0 {
                tracing::warn!(kernel_id = %inner.kernel_id, error = %e, dropped = n + 1, "kernel runner: dropped a malformed message");
            }
        }
        Ok(FromRunner::Output(stream, bytes)) => {
            let text = carry.decode(stream, bytes);
            if !text.is_empty() {
                inner.push(Record::Text(stream, text)).await;
            }
        }
        Ok(FromRunner::Item(kind, v)) => inner.push(Record::Item(kind, v)).await,
        Ok(FromRunner::WaitingInput(o)) => inner.push(Record::WaitingInput(o)).await,
        Ok(FromRunner::Finished(step, code)) => {
            for (stream, text) in carry.finish() {
                inner.push(Record::Text(stream, text)).await;
            }
            inner.push(Record::End(step, code)).await;
        }
        Ok(FromRunner::Status(s)) => {
            let _ = inner.status.tx.try_send(s);
        }
        Ok(FromRunner::Completion(v)) => {
            let _ = inner.completion.tx.try_send(v);
        }
        Ok(FromRunner::ServiceResult(v)) => {
            let _ = inner.service.tx.try_send(v);
        }
        Ok(FromRunner::AppsResult(v)) => {
            let _ = inner.apps.tx.try_send(v);
        }
        Ok(FromRunner::ModelService) => {}
    }
}

/// Every second: abandons a current run nobody read for the idle time (interrupting it, so
/// the next run gets its turn); every [`KEEPALIVE`]: a `status`, noting a runner restart.
async fn keeper(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_ping = Instant::now();
    loop {
        tick.tick().await;
        let Some(i) = inner.upgrade() else { return };
        let abandoned = {
            let mut st = i.st();
            match &st.current {
                Some(c) if c.last_touch.elapsed() >= i.idle => {
                    let id = c.run_id.clone();
                    st.current = None;
                    Some(id)
                }
                _ => None,
            }
        };
        if let Some(run_id) = abandoned {
            i.room.notify_waiters();
            let _ = i.send(ToRunner::Interrupt).await;
            tracing::info!(kernel_id = %i.kernel_id, %run_id, "runner run abandoned: no reader for exec-idle-timeout; interrupted");
        }
        if last_ping.elapsed() >= KEEPALIVE {
            last_ping = Instant::now();
            if let Ok(Some(started)) = i
                .request(&i.status, ToRunner::Status, "status", REPLY_TIMEOUT)
                .await
            {
                let mut st = i.st();
                match st.started_at {
                    Some(prev) if (prev - started).abs() > f64::EPSILON => {
                        tracing::warn!(kernel_id = %i.kernel_id, "the kernel runner restarted: its REPL state is gone");
                        st.started_at = Some(started);
                    }
                    None => st.started_at = Some(started),
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The client against a fake runner on real ZeroMQ sockets: what a hostile process on the
    //! runner's ports can send.

    use super::*;

    /// A fake runner: its PULL (repl-in) and PUSH (repl-out), bound on free loopback ports.
    struct Fake {
        pull: zmq::Socket,
        push: zmq::Socket,
        ports: RunnerPorts,
        _ctx: zmq::Context,
    }

    fn bind(s: &zmq::Socket) -> u16 {
        s.bind("tcp://127.0.0.1:*").unwrap();
        let ep = s.get_last_endpoint().unwrap().unwrap();
        ep.rsplit(':').next().unwrap().parse().unwrap()
    }

    fn fake() -> Fake {
        let ctx = zmq::Context::new();
        let pull = ctx.socket(zmq::PULL).unwrap();
        let push = ctx.socket(zmq::PUSH).unwrap();
        pull.set_rcvtimeo(5000).unwrap();
        push.set_sndtimeo(5000).unwrap();
        let ports = RunnerPorts {
            repl_in: bind(&pull),
            repl_out: bind(&push),
        };
        Fake {
            pull,
            push,
            ports,
            _ctx: ctx,
        }
    }

    fn send(f: &Fake, frames: &[&[u8]]) {
        f.push.send_multipart(frames.iter().copied(), 0).unwrap();
    }

    fn status_reply(f: &Fake, started: f64) {
        let mut buf = Vec::new();
        let v = rmpv::Value::Map(vec![("started_at".into(), rmpv::Value::F64(started))]);
        rmpv::encode::write_value(&mut buf, &v).unwrap();
        send(f, &[b"status", &buf]);
    }

    fn client(f: &Fake, cap: usize) -> RunnerClient {
        let zctx = zmq::Context::new();
        RunnerClient::connect(&zctx, "k1", f.ports, cap, Duration::from_secs(60)).unwrap()
    }

    /// Answers every `status` the agent sends until `stop` is set (on a thread).
    fn answer_status(
        f: Arc<Mutex<Fake>>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let f = f.lock().unwrap();
            f.pull.set_rcvtimeo(50).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(msg) = f.pull.recv_multipart(0) else {
                    continue;
                };
                if msg.first().map(Vec::as_slice) == Some(b"status") {
                    status_reply(&f, 7.0);
                }
            }
        })
    }

    #[tokio::test]
    async fn garbage_and_oversized_frames_are_dropped_and_the_runner_still_served() {
        let f = fake();
        let c = client(&f, 1 << 16);
        // Wrong frame counts, an unknown op, undecodable payloads, and a frame over the cap.
        send(&f, &[b"stdout"]);
        send(&f, &[b"a", b"b", b"c"]);
        send(&f, &[b"bogus", b""]);
        send(&f, &[b"finished", b"{not json"]);
        send(&f, &[b"status", b"\xc1"]);
        let huge = vec![b'x'; MAX_FRAME as usize + 1];
        send(&f, &[b"stdout", &huge]);
        drop(huge);
        let f = Arc::new(Mutex::new(f));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let t = answer_status(f.clone(), stop.clone());
        // The frame over the cap makes libzmq drop the connection, and the client makes a new
        // one: a reply the fake sent before it saw the old one go is lost with it (as any
        // message in flight then), so the client polls as a kernel's readiness check does.
        let started = c
            .wait_ready(Duration::from_secs(30))
            .await
            .expect("status answered");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        t.join().unwrap();
        assert_eq!(started, Some(7.0));
        assert_eq!(c.malformed(), 5, "the five malformed messages were counted");
        assert_eq!(c.buffered(), 0);
    }

    #[tokio::test]
    async fn a_runner_that_never_answers_is_a_named_error() {
        let f = fake();
        let c = client(&f, 1 << 16);
        let e = c.status(Duration::from_millis(300)).await.unwrap_err();
        assert!(
            matches!(e, RunnerError::NoReply { op: "status", .. }),
            "{e}"
        );
        let e = c
            .answer("nope", Some(Duration::from_millis(10)))
            .await
            .unwrap_err();
        assert!(matches!(e, RunnerError::RunNotFound(_)), "{e}");
        drop(f);
    }

    /// A flood of output with nobody reading: the buffer stays at its cap (the reader stops
    /// reading repl-out, so the flood waits in the runner), and paced answers get every byte,
    /// in order, once.
    #[tokio::test]
    async fn a_flood_is_bounded_and_nothing_is_lost() {
        const CAP: usize = 1 << 16;
        const CHUNK: usize = 4096;
        const CHUNKS: usize = 2048; // 8 MiB
        let f = fake();
        let c = client(&f, CAP);
        c.start("r1", vec![ToRunner::Code("flood()".into())], None)
            .await
            .unwrap();
        let sender = std::thread::spawn(move || {
            let op = f.pull.recv_multipart(0).unwrap();
            assert_eq!(op[0], b"code");
            for i in 0..CHUNKS {
                let byte = b'a' + (i % 26) as u8;
                f.push
                    .send_multipart([&b"stdout"[..], &vec![byte; CHUNK]], 0)
                    .unwrap();
            }
            f.push
                .send_multipart([&b"finished"[..], br#"{"exitCode": 0}"#], 0)
                .unwrap();
            f
        });
        // Nobody reads for a while: the buffer fills to its cap and stays there.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let held = c.buffered();
        assert!((CAP..=CAP + CHUNK).contains(&held), "held {held}");
        let mut got = Vec::with_capacity(CHUNK * CHUNKS);
        let mut answers = 0;
        loop {
            let a = c.answer("r1", Some(Duration::from_secs(10))).await.unwrap();
            answers += 1;
            assert!(c.buffered() <= CAP + CHUNK);
            for (kind, v) in &a.console {
                assert_eq!(kind, "stdout");
                got.extend_from_slice(v.as_str().unwrap().as_bytes());
            }
            if a.status == "finished" {
                assert_eq!(a.exit_code, Some(0));
                break;
            }
            assert_eq!(a.status, "continued");
        }
        let _f = sender.join().unwrap();
        assert_eq!(got.len(), CHUNK * CHUNKS);
        for (i, chunk) in got.chunks(CHUNK).enumerate() {
            assert!(
                chunk.iter().all(|&b| b == b'a' + (i % 26) as u8),
                "chunk {i}"
            );
        }
        assert!(
            answers >= CHUNK * CHUNKS / (CAP + CHUNK),
            "{answers} answers"
        );
        // The run concluded: the next one gets its turn at once.
        assert!(!c.is_current("r1"));
    }
}
