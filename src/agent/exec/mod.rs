//! `execute` runs: Backend.AI's continuation protocol with bounded memory.
//!
//! A run is one process started in a kernel's container (`<interpreter> -c <code>`), owned by a
//! pump task that moves its output into a [`Console`] of at most `[agent] exec-buffer-size`
//! bytes. When the console is full the pump stops reading, so the engine stops reading the
//! process's pipes and the process blocks on its write: memory never grows with what a run
//! prints. Each `execute` answer (`query`, `continue`, `input`) drains at most that many bytes and
//! comes when the run ended, when the buffer is full, or after `flush_timeout` (status
//! `continued`). A run nobody reads for `exec-idle-timeout` is killed and forgotten by
//! [`Runs::reap`]; a run whose last answer was given is forgotten at once.

pub mod console;
pub mod terminal;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actors::{ChildSpec, StopSignal};
use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;
use tokio::time::Instant;

use self::console::{Console, Utf8Carry};
use super::backend::{
    exec_exit_code, ContainerBackend, ExecSession, ExecSpec, OutputStream, TtySize,
};
use super::events::{AgentEvent, EventBus};
use crate::rpc::failure::Failure;

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// The process exited (`None`: the engine did not say with what, e.g. the container went).
    Exited(Option<i64>),
    /// Its `timeout` killed it.
    TimedOut,
    /// Killed for want of a reader (`exec-idle-timeout`).
    Abandoned,
    /// The engine's stream failed.
    Failed(String),
}

/// An answer's status: Backend.AI's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerStatus {
    /// More output may follow: `continue` for it.
    Continued,
    /// The run exited; `exit_code` says how.
    Finished,
    /// The run's timeout killed it.
    ExecTimeout,
}

impl AnswerStatus {
    /// `continued`, `finished`, `exec-timeout`.
    pub fn as_str(self) -> &'static str {
        match self {
            AnswerStatus::Continued => "continued",
            AnswerStatus::Finished => "finished",
            AnswerStatus::ExecTimeout => "exec-timeout",
        }
    }
}

/// One `execute` answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// See [`AnswerStatus`].
    pub status: AnswerStatus,
    /// Output since the previous answer: (`stdout` | `stderr`, text), in order.
    pub console: Vec<(OutputStream, String)>,
    /// The exit code, on the `finished` answer.
    pub exit_code: Option<i64>,
}

/// Why a run request was refused.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No run with this id (never started, already finished and read, or reaped).
    #[error("run `{0}` not found (unknown, or finished and fully read)")]
    NotFound(String),
    /// `input` to a run started without stdin.
    #[error("run `{0}` was started without stdin (pass opts.stdin = true to the query)")]
    NoStdin(String),
    /// The run id is already in use.
    #[error("run `{0}` already exists")]
    Exists(String),
    /// Writing its stdin failed (it exited, or closed its stdin).
    #[error("cannot write the stdin of run `{0}`: {1}")]
    Stdin(String, String),
    /// A terminal request (resize) to a run started without a terminal.
    #[error("run `{0}` has no terminal")]
    NoTty(String),
    /// The engine refused to start it (the container is gone, …).
    #[error(transparent)]
    Engine(#[from] crate::agent::backend::BackendError),
}

impl RunError {
    /// The FAILURE name on the wire.
    pub fn name(&self) -> Failure {
        match self {
            RunError::NotFound(_) => Failure::RunNotFound,
            RunError::NoStdin(_) => Failure::RunHasNoStdin,
            RunError::Exists(_) => Failure::RunExists,
            RunError::Stdin(..) => Failure::RunStdinClosed,
            RunError::NoTty(_) => Failure::RunHasNoTty,
            RunError::Engine(crate::agent::backend::BackendError::Unavailable(_)) => {
                Failure::ContainerEngineUnavailable
            }
            RunError::Engine(_) => Failure::ContainerEngineError,
        }
    }
}

#[derive(Debug)]
struct State {
    console: Console,
    end: Option<RunEnd>,
    last_touch: Instant,
}

/// What the pump and the readers share.
#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Output arrived or the run ended.
    data: Notify,
    /// A reader drained the console.
    room: Notify,
    cap: usize,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("run state lock")
    }

    /// A read's wait: until `ready` holds of the state, the run ended, or `deadline` passed
    /// (`None`: no deadline); then `take` from the state and wake the pump (there is room). Each
    /// look touches the run, so a reader keeps it from the idle reaper.
    async fn take_when<T>(
        &self,
        deadline: Option<Instant>,
        ready: impl Fn(&State) -> bool,
        mut take: impl FnMut(&mut State) -> T,
    ) -> T {
        loop {
            let notified = self.data.notified();
            let taken = {
                let mut st = self.state();
                st.last_touch = Instant::now();
                let due = deadline.is_some_and(|d| Instant::now() >= d);
                (st.end.is_some() || due || ready(&st)).then(|| take(&mut st))
            };
            if let Some(t) = taken {
                self.room.notify_waiters();
                return t;
            }
            notified_or_due(notified, deadline).await;
        }
    }
}

/// Identity of a run, for its events.
#[derive(Clone, Debug)]
pub struct RunIds {
    /// Run id (the caller's, or a fresh UUID).
    pub run_id: String,
    /// Kernel it runs in.
    pub kernel_id: String,
    /// Its session.
    pub session_id: String,
}

type Stdin = Pin<Box<dyn AsyncWrite + Send>>;

/// One run: its shared output, its stdin, and its pump.
pub struct Run {
    ids: RunIds,
    exec_id: String,
    shared: Arc<Shared>,
    stdin: tokio::sync::Mutex<Option<Stdin>>,
    has_stdin: bool,
    /// Started with a terminal ([`RunRequest::tty`]).
    tty: bool,
    /// Held by the one reader at a time (answers never interleave); the decoder's state.
    reader: tokio::sync::Mutex<Utf8Carry>,
    pump: tokio::task::JoinHandle<()>,
}

impl Drop for Run {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

impl Run {
    /// The run's ids.
    pub fn ids(&self) -> &RunIds {
        &self.ids
    }

    /// Waits for the next answer: at most `cap` bytes of output, when the run ended, the console
    /// is full, or `flush` passed (`None`: no flush deadline).
    pub async fn answer(&self, flush: Option<Duration>) -> Answer {
        let mut carry = self.reader.lock().await;
        // A flush too far away for an `Instant` is no flush deadline.
        let deadline = flush.and_then(|f| Instant::now().checked_add(f));
        let cap = self.shared.cap;
        let (chunks, end) = self
            .shared
            .take_when(
                deadline,
                |st| st.console.len() >= cap,
                |st| {
                    let chunks = st.console.take(cap);
                    (chunks, st.end.clone().filter(|_| st.console.is_empty()))
                },
            )
            .await;
        let mut console: Vec<(OutputStream, String)> = chunks
            .into_iter()
            .map(|(s, b)| (s, carry.decode(s, b)))
            .filter(|(_, t)| !t.is_empty())
            .collect();
        let (status, exit_code) = match end {
            None => (AnswerStatus::Continued, None),
            Some(end) => {
                console.extend(carry.finish());
                match end {
                    RunEnd::Exited(code) => (AnswerStatus::Finished, code),
                    RunEnd::TimedOut => (AnswerStatus::ExecTimeout, None),
                    RunEnd::Abandoned | RunEnd::Failed(_) => (AnswerStatus::Finished, None),
                }
            }
        };
        Answer {
            status,
            console,
            exit_code,
        }
    }

    /// Writes `data` to the run's stdin, then closes it when `eof`.
    ///
    /// Errors: [`RunError::NoStdin`], or [`RunError::Stdin`] when it is closed or the write
    /// does not complete within `limit` (the process does not read).
    pub async fn input(&self, data: &[u8], eof: bool, limit: Duration) -> Result<(), RunError> {
        if !self.has_stdin {
            return Err(RunError::NoStdin(self.ids.run_id.clone()));
        }
        let mut stdin = self.stdin.lock().await;
        let id = || self.ids.run_id.clone();
        let Some(w) = stdin.as_mut() else {
            return Err(RunError::Stdin(id(), "stdin was closed (eof)".into()));
        };
        let write = async {
            w.write_all(data).await?;
            w.flush().await?;
            if eof {
                w.shutdown().await?;
            }
            Ok::<_, std::io::Error>(())
        };
        match tokio::time::timeout(limit, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(RunError::Stdin(id(), e.to_string())),
            Err(_) => {
                return Err(RunError::Stdin(
                    id(),
                    format!(
                        "the process did not read it within {} s",
                        limit.as_secs_f64()
                    ),
                ))
            }
        }
        if eof {
            *stdin = None;
        }
        Ok(())
    }

    /// Whether nobody has asked for an answer for `idle`.
    fn idle_for(&self, idle: Duration) -> bool {
        self.shared.state().last_touch.elapsed() >= idle
    }

    /// Whether the run ended and its last answer was taken.
    fn drained(&self) -> bool {
        let st = self.shared.state();
        st.end.is_some() && st.console.is_empty()
    }
}

/// Moves `session`'s output into `shared` until it ends, the timeout passes (kill), or the
/// console is full (then waits for a reader to drain it).
async fn pump(
    shared: Arc<Shared>,
    mut session: ExecSession,
    deadline: Option<Instant>,
    backend: Arc<dyn ContainerBackend>,
    events: EventBus,
    ids: RunIds,
) {
    let read = async {
        loop {
            // Backpressure: read nothing more while the console is full.
            loop {
                let room = shared.room.notified();
                if shared.state().console.len() < shared.cap {
                    break;
                }
                room.await;
            }
            match session.output.next().await {
                Some(Ok((stream, bytes))) => {
                    shared.state().console.push(stream, &bytes);
                    shared.data.notify_waiters();
                }
                Some(Err(e)) => return RunEnd::Failed(e.to_string()),
                None => return RunEnd::Exited(exec_exit_code(&*backend, &session.exec_id).await),
            }
        }
    };
    let end = match deadline {
        Some(d) => tokio::time::timeout_at(d, read)
            .await
            .unwrap_or(RunEnd::TimedOut),
        None => read.await,
    };
    let (kernel_id, session_id, run_id) = (ids.kernel_id, ids.session_id, ids.run_id);
    match &end {
        RunEnd::TimedOut => {
            if let Err(e) = backend.exec_kill(&session.exec_id).await {
                tracing::warn!(%kernel_id, %run_id, error = %e, "cannot kill a timed-out run");
            }
            events.emit(AgentEvent::ExecutionTimeout {
                kernel_id,
                session_id,
                run_id,
            });
        }
        RunEnd::Exited(code) => events.emit(AgentEvent::ExecutionFinished {
            kernel_id,
            session_id,
            run_id,
            exit_code: *code,
        }),
        RunEnd::Failed(e) => {
            tracing::warn!(%kernel_id, %run_id, error = %e, "run output stream failed");
            events.emit(AgentEvent::ExecutionFinished {
                kernel_id,
                session_id,
                run_id,
                exit_code: None,
            });
        }
        RunEnd::Abandoned => {}
    }
    shared.state().end = Some(end);
    shared.data.notify_waiters();
}

/// The agent tree's `exec-reaper` child: every second, [`Runs::reap`] on the runs `runs`
/// finds in `owner`, reporting [`Runs::usage`] to `report`. (The owner is the agent's context,
/// which holds the runs; taking it generically keeps this module free of the context.)
pub fn reaper_spec<O: Send + Sync + 'static>(
    owner: Arc<O>,
    runs: fn(&O) -> &Runs,
    backend: Arc<dyn ContainerBackend>,
    report: impl Fn(usize, usize) + Clone + Send + Sync + 'static,
) -> ChildSpec {
    ChildSpec::task("exec-reaper", move |stop: StopSignal| {
        let (owner, backend, report) = (owner.clone(), backend.clone(), report.clone());
        async move {
            runs(&owner)
                .reap_every(backend, Duration::from_secs(1), report, stop.requested())
                .await;
            Ok::<_, String>(())
        }
    })
}

/// The agent's runs by id.
pub struct Runs {
    runs: Mutex<HashMap<String, Arc<Run>>>,
    cap: usize,
    idle: Duration,
}

/// How to start a run.
#[derive(Clone, Debug)]
pub struct RunRequest {
    /// Ids (run, kernel, session).
    pub ids: RunIds,
    /// The container.
    pub container_id: String,
    /// The full command (`[interpreter, "-c", code]`).
    pub cmd: Vec<String>,
    /// Kill it after this long.
    pub timeout: Option<Duration>,
    /// Keep its stdin open for `input`.
    pub stdin: bool,
    /// Give it a terminal of this size ([`terminal`]); `None`: pipes.
    pub tty: Option<TtySize>,
    /// Extra `KEY=VALUE` environment (a terminal's `TERM`).
    pub env: Vec<String>,
    /// `uid:gid` to run as ([`crate::agent::kernel::KernelInfo::exec_user`]); the container's
    /// user when `None`.
    pub user: Option<String>,
}

impl Runs {
    /// No runs; each holds at most `cap` bytes of unread output and is killed after `idle`
    /// without a reader.
    pub fn new(cap: usize, idle: Duration) -> Runs {
        Runs {
            runs: Mutex::new(HashMap::new()),
            cap: cap.max(1),
            idle,
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Run>>> {
        self.runs.lock().expect("runs lock")
    }

    /// Starts a run (in `/home/work`) and its pump; emits `execution_started`.
    ///
    /// Errors: [`RunError::Exists`], [`RunError::Engine`].
    pub async fn start(
        &self,
        backend: &Arc<dyn ContainerBackend>,
        events: &EventBus,
        req: RunRequest,
    ) -> Result<Arc<Run>, RunError> {
        if self.table().contains_key(&req.ids.run_id) {
            return Err(RunError::Exists(req.ids.run_id));
        }
        let mut session = backend
            .exec_start(
                &req.container_id,
                ExecSpec {
                    cmd: req.cmd,
                    working_dir: Some("/home/work".into()),
                    stdin: req.stdin,
                    tty: req.tty,
                    env: req.env,
                    user: req.user,
                    ..Default::default()
                },
            )
            .await?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                console: Console::default(),
                end: None,
                last_touch: Instant::now(),
            }),
            data: Notify::new(),
            room: Notify::new(),
            cap: self.cap,
        });
        let exec_id = session.exec_id.clone();
        let has_stdin = session.stdin.is_some();
        let stdin = tokio::sync::Mutex::new(session.stdin.take());
        events.emit(AgentEvent::ExecutionStarted {
            kernel_id: req.ids.kernel_id.clone(),
            session_id: req.ids.session_id.clone(),
            run_id: req.ids.run_id.clone(),
        });
        // A timeout too long for an `Instant` (a fuzzed 9.2e18 s panicked here) is none.
        let deadline = req.timeout.and_then(|t| Instant::now().checked_add(t));
        let pump = tokio::spawn(pump(
            shared.clone(),
            session,
            deadline,
            backend.clone(),
            events.clone(),
            req.ids.clone(),
        ));
        let run = Arc::new(Run {
            ids: req.ids.clone(),
            exec_id,
            shared,
            stdin,
            has_stdin,
            tty: req.tty.is_some(),
            reader: tokio::sync::Mutex::new(Utf8Carry::default()),
            pump,
        });
        self.table().insert(req.ids.run_id, run.clone());
        Ok(run)
    }

    /// The run `run_id`.
    ///
    /// Errors: [`RunError::NotFound`].
    pub fn get(&self, run_id: &str) -> Result<Arc<Run>, RunError> {
        self.table()
            .get(run_id)
            .cloned()
            .ok_or_else(|| RunError::NotFound(run_id.to_owned()))
    }

    /// Forgets `run` when its last answer has been taken (a `continue` on it is then
    /// `RunNotFound`).
    pub fn forget_if_done(&self, run: &Run) {
        if run.drained() {
            self.table().remove(&run.ids.run_id);
        }
    }

    /// The kernels with a run still going (an `execute` or a terminal): active, for idle
    /// reclaim (`agent/activity.rs`).
    pub fn live_kernels(&self) -> std::collections::HashSet<String> {
        self.table()
            .values()
            .filter(|r| r.shared.state().end.is_none())
            .map(|r| r.ids.kernel_id.clone())
            .collect()
    }

    /// No runs held.
    pub fn is_empty(&self) -> bool {
        self.table().is_empty()
    }

    /// Kills and forgets every run nobody read for `exec-idle-timeout`; returns how many.
    pub async fn reap(&self, backend: &Arc<dyn ContainerBackend>) -> usize {
        let idle: Vec<Arc<Run>> = {
            let mut table = self.table();
            let ids: Vec<String> = table
                .iter()
                .filter(|(_, r)| r.idle_for(self.idle))
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| table.remove(id)).collect()
        };
        for run in &idle {
            run.pump.abort();
            let ended = run.shared.state().end.is_some();
            if !ended {
                if let Err(e) = backend.exec_kill(&run.exec_id).await {
                    tracing::warn!(run_id = %run.ids.run_id, error = %e, "cannot kill an abandoned run");
                }
                run.shared.state().end = Some(RunEnd::Abandoned);
            }
            tracing::info!(run_id = %run.ids.run_id, kernel_id = %run.ids.kernel_id, "run abandoned: no reader for exec-idle-timeout; killed and freed");
        }
        idle.len()
    }

    /// Runs held and the unread output they hold, in bytes.
    pub fn usage(&self) -> (usize, usize) {
        let table = self.table();
        (
            table.len(),
            table.values().map(|r| r.shared.state().console.len()).sum(),
        )
    }

    /// Reaps every `period` until `stop` resolves, reporting [`Runs::usage`] to `report` after
    /// each round.
    pub async fn reap_every(
        &self,
        backend: Arc<dyn ContainerBackend>,
        period: Duration,
        report: impl Fn(usize, usize),
        stop: impl std::future::Future<Output = ()>,
    ) {
        let mut stop = std::pin::pin!(stop);
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    self.reap(&backend).await;
                    let (runs, buffered) = self.usage();
                    report(runs, buffered);
                }
                _ = &mut stop => return,
            }
        }
    }
}

/// Waits until `notified` fires or `deadline` passes (`None`: no deadline, as for a wait too
/// long for an `Instant`): one step of [`Shared::take_when`].
pub(crate) async fn notified_or_due(
    notified: tokio::sync::futures::Notified<'_>,
    deadline: Option<Instant>,
) {
    match deadline {
        Some(d) => {
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(d) => {}
            }
        }
        None => notified.await,
    }
}
