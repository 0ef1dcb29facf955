//! `runner`: a runner kernel's connection to Backend.AI's kernel runner in its container
//! (`crate::agent::runner`). Set up when the runner answered `status` and then `get-apps`
//! (its REPL started, `bootstrap.sh` run, the intrinsic services up: upstream's
//! `create_kernel` init polling, `src/ai/backend/agent/agent.py`), so the kernel turns
//! `RUNNING` only then; a container that exits first fails the create with its log tail.
//! Teardown drops the connection, never the runner (a graceful agent stop leaves the REPL
//! serving, and the next agent reconnects from the container's published ports).

use std::time::Duration;

use actors::{BoxError, Provisioner, Resources, StageKey};
use futures::StreamExt;

use super::{Found, KernelStage, Plan, CONTAINER, IMAGE, PORTS};
use crate::agent::kernel::{KernelError, KernelHandle};
use crate::agent::runner::launch::{REPL_IN, REPL_OUT, RUNNER_LABEL};
use crate::agent::runner::protocol::ToRunner;
use crate::agent::runner::{Gate, RunnerPorts};

/// Connects to the kernel's runner and waits until it serves.
pub struct RunnerStage(pub KernelHandle);

/// This stage's key: its name, typed with its resource.
pub const RUNNER: StageKey<Option<RunnerPorts>> = StageKey::of::<RunnerStage>("runner");

/// How often a booting runner's repl ports are probed: a refused connection costs the agent
/// a few microseconds, and the runner binds them only ~1 s before it serves, so a tight poll
/// costs nothing and loses at most this much.
const LISTEN_POLL: Duration = Duration::from_millis(20);

/// Waits (until `deadline`) for the runner's repl ports to take TCP connections at container
/// `id`'s own address (not through the engine's proxy), probing each every [`LISTEN_POLL`];
/// returns at once when the container is not running or has no address of its own (host
/// networking), and at the deadline otherwise.
async fn wait_listening(h: &KernelHandle, id: &str, deadline: tokio::time::Instant) {
    // The address is the container's for as long as it runs: asked once.
    let ip = match h.ctx.backend.inspect_container(id).await {
        Ok(Some(s)) if s.running => s.ip_address.filter(|ip| !ip.is_empty()),
        _ => return,
    };
    let Some(ip) = ip.and_then(|ip| ip.parse::<std::net::IpAddr>().ok()) else {
        return;
    };
    let mut closed = vec![REPL_IN, REPL_OUT];
    while tokio::time::Instant::now() < deadline {
        let mut still = Vec::with_capacity(closed.len());
        for port in closed {
            let probe = tokio::net::TcpStream::connect((ip, port));
            if !matches!(tokio::time::timeout(Duration::from_secs(1), probe).await, Ok(Ok(_))) {
                still.push(port);
            }
        }
        if still.is_empty() {
            return;
        }
        closed = still;
        tokio::time::sleep(LISTEN_POLL).await;
    }
}

/// How long a new kernel's runner connection waits for `status` before it is made anew.
const READY_RECONNECT: Duration = Duration::from_secs(5);

/// Bytes of a failed runner container's log kept for the error (its tail).
const LOG_TAIL: usize = 2048;

/// The last [`LOG_TAIL`] bytes of container `id`'s log (at most 2 s are spent reading: the
/// stream of a container still running does not end).
async fn log_tail(handle: &KernelHandle, id: &str) -> String {
    let mut tail: Vec<u8> = Vec::new();
    let mut logs = handle.ctx.backend.follow_logs(id, 0);
    let read = async {
        while let Some(Ok(chunk)) = logs.next().await {
            tail.extend_from_slice(&chunk);
            if tail.len() > LOG_TAIL {
                tail.drain(..tail.len() - LOG_TAIL);
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), read).await;
    String::from_utf8_lossy(&tail).trim().to_owned()
}

/// Waits until kernel `h`'s runner in container `container_id` serves on `ports`: its repl
/// ports listen, it answers `status`, then `get-apps` with anything but `failed` (its REPL
/// started, `bootstrap.sh` run, the intrinsic services up: upstream's `create_kernel` init
/// polling, `src/ai/backend/agent/agent.py`), within `[kernel-runner] init-timeout`. A new
/// kernel's creation waits for it, and so does a kernel whose container was restarted or made
/// anew, before it is `RUNNING` again.
///
/// Where the runtime type keeps a Python REPL (`KernelInfo::runner_repl`), an empty query run
/// checks it too. Upstream's runner gives its Jupyter kernel 10 s to answer
/// (`_init_jupyter_kernel`, `src/ai/backend/kernel/base.py`) and otherwise turns query mode off
/// for good: every run then ends at once with exit code 127 and no output (seen in CI with two
/// runner kernels booting on a loaded 2-core machine). Such a container is restarted once (a
/// second boot finds its files in the page cache); if its REPL is still off, the kernel runs
/// without it (batch mode and the services work), the agent says so in its log, and each query
/// says so on its stderr (`KernelInfo::runner_repl_off`).
///
/// Errors: `KernelError::Engine` naming what the runner did not do in time, or the container's
/// exit, with its log tail; the restart's engine error.
pub async fn wait_serving(
    h: &KernelHandle,
    container_id: &str,
    ports: RunnerPorts,
) -> Result<(), KernelError> {
    if serve_once(h, container_id, ports).await? != Repl::Off {
        h.update(|i| i.runner_repl_off = false);
        return Ok(());
    }
    tracing::warn!(agent_id = %h.ctx.agent_id, kernel_id = %h.id,
        "the kernel runner's Python REPL did not start (upstream's runner gives its Jupyter kernel 10 s, then turns query mode off): restarting its container once");
    // Its exit during the restart is expected: the container's watcher skips it (as for
    // `restart_kernel`, which may be the caller: the flag is put back as it was).
    let was = h.info().manual_restart;
    h.update(|i| i.manual_restart = true);
    let restarted = h
        .ctx
        .backend
        .restart_container(container_id, REPL_RESTART_GRACE)
        .await;
    let served = match restarted {
        Ok(()) => serve_once(h, container_id, ports).await,
        Err(e) => Err(KernelError::from(e)),
    };
    h.update(|i| i.manual_restart = was);
    let off = served? == Repl::Off;
    h.update(|i| i.runner_repl_off = off);
    if off {
        tracing::warn!(agent_id = %h.ctx.agent_id, kernel_id = %h.id,
            "the kernel runner's Python REPL did not start after a restart either: the kernel runs without query mode (batch mode and services work); the node may be overloaded");
    }
    Ok(())
}

/// The grace of the restart that gives a runner a second boot (nothing in it is the user's yet).
const REPL_RESTART_GRACE: Duration = Duration::from_secs(2);

/// What the readiness check found of a runner's REPL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Repl {
    /// It answered the empty query run.
    Up,
    /// The run ended with exit code 127: query mode is off.
    Off,
    /// Not checked: the runtime type has none.
    Unchecked,
}

/// One wait for the runner to serve ([`wait_serving`]'s first part): what it found of the REPL.
async fn serve_once(
    h: &KernelHandle,
    container_id: &str,
    ports: RunnerPorts,
) -> Result<Repl, KernelError> {
    let ctx = &h.ctx;
    let within = ctx.runners.config.init_timeout.0;
    // A container restarted or made anew: the old one's connection served a REPL that is gone.
    ctx.runners.forget(&h.id);
    let ready = async {
        let deadline = tokio::time::Instant::now() + within;
        // Until the runner listens, the engine's proxy takes each connection to a published
        // port and drops it; ZeroMQ sockets caught in that churn were seen never to get a
        // `status` answer (three creates in two of eight CI runs). So the runner's own
        // ports are probed at the container's address first, and ZeroMQ connects only
        // once they take connections.
        wait_listening(h, container_id, deadline).await;
        // Should a connection still be left broken, the sockets are made anew every few
        // seconds without an answer.
        let client = loop {
            let client = ctx.runners.client(&h.id, ports)?;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match client.wait_ready(left.min(READY_RECONNECT)).await {
                Ok(_) => break client,
                // Out of time: said with the whole limit, not the nothing that was left of it.
                Err(crate::agent::runner::RunnerError::NoReply { op, .. }) if left.is_zero() => {
                    return Err(crate::agent::runner::RunnerError::NoReply {
                        op,
                        secs: within.as_secs_f64(),
                    });
                }
                Err(crate::agent::runner::RunnerError::NoReply { .. }) => {
                    tracing::debug!(kernel_id = %h.id, "kernel runner: no status yet; reconnecting");
                    ctx.runners.forget(&h.id);
                }
                Err(e) => return Err(e),
            }
        };
        // `get-apps` answers `failed` while the runner is still starting: asked again.
        let apps = loop {
            let apps = client.get_apps().await?;
            if apps.get("status").and_then(|s| s.as_str()) != Some("failed") {
                break apps;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        if !h.info().runner_repl {
            return Ok::<_, crate::agent::runner::RunnerError>((apps, Repl::Unchecked));
        }
        // The runner answers `status` only once its REPL's start is over, whichever way it
        // went; an empty cell runs in no time and leaves nothing in the user's namespace.
        let probe = format!("readiness-{}", uuid::Uuid::new_v4().simple());
        client
            .start(&probe, vec![ToRunner::Code(String::new())], None)
            .await?;
        let answer = client.answer(&probe, None).await?;
        // 127 for an empty cell is the runner's "query mode is disabled" (its log line may
        // come before or after, on stderr).
        let off = answer.status == "finished" && answer.exit_code == Some(127);
        Ok((apps, if off { Repl::Off } else { Repl::Up }))
    };
    let exited = async {
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            match ctx.backend.inspect_container(container_id).await {
                Ok(Some(s)) if s.running => {}
                Ok(s) => return s.and_then(|s| s.exit_code),
                Err(_) => {}
            }
        }
    };
    let outcome = tokio::select! {
        r = tokio::time::timeout(within + Duration::from_secs(10), ready) => r,
        code = exited => {
            ctx.runners.forget(&h.id);
            let tail = log_tail(h, container_id).await;
            return Err(KernelError::Engine(format!(
                "the kernel runner's container exited ({}) before the runner served: {tail}",
                code.map_or("no exit code".into(), |c| format!("exit code {c}"))
            )));
        }
    };
    match outcome {
        Ok(Ok((apps, repl))) => {
            tracing::debug!(kernel_id = %h.id, %apps, ?repl, "kernel runner serves");
            h.update(|i| i.runner = Some(ports));
            Ok(repl)
        }
        Ok(Err(e)) => {
            ctx.runners.forget(&h.id);
            // What the container said is what tells why (the runner logs its start).
            let tail = log_tail(h, container_id).await;
            Err(KernelError::Engine(format!(
                "{e} (the runner never served); its container's log ends: {tail}"
            )))
        }
        Err(_) => {
            ctx.runners.forget(&h.id);
            let tail = log_tail(h, container_id).await;
            Err(KernelError::Engine(format!(
                "the kernel runner did not serve within {} s; its container's log ends: {tail}",
                within.as_secs_f64()
            )))
        }
    }
}

impl Provisioner for RunnerStage {
    /// (container id, repl host ports, whether its runtime type keeps a Python REPL) for a
    /// runner kernel.
    type Spec = Option<(String, RunnerPorts, bool)>;
    type Resource = Option<RunnerPorts>;

    fn name(&self) -> &'static str {
        RUNNER.name()
    }

    /// Errors: what [`wait_serving`] says.
    async fn setup(&self, spec: Self::Spec) -> Result<Option<RunnerPorts>, BoxError> {
        let Some((container_id, ports, repl)) = spec else {
            return Ok(None);
        };
        self.0.update(|i| i.runner_repl = repl);
        wait_serving(&self.0, &container_id, ports).await?;
        Ok(Some(ports))
    }

    async fn teardown(&self, _ports: Option<RunnerPorts>) -> Result<(), BoxError> {
        self.0.ctx.runners.forget(&self.0.id);
        Ok(())
    }
}

impl KernelStage for RunnerStage {
    fn new(handle: KernelHandle) -> Self {
        RunnerStage(handle)
    }

    /// A runner kernel's container, the last two host ports (repl-in, repl-out), and whether
    /// its runtime type is `python` (the runner's class that keeps a Jupyter REPL).
    fn spec(plan: &Plan, r: &Resources<'_>) -> Result<Self::Spec, BoxError> {
        let Gate::Runner { runtime_type, .. } = plan.gate(r.of(IMAGE)?) else {
            return Ok(None);
        };
        let ports = r.of(PORTS)?;
        let [.., repl_in, repl_out] = ports.as_slice() else {
            return Ok(None);
        };
        Ok(Some((
            r.of(CONTAINER)?.id.clone(),
            RunnerPorts {
                repl_in: *repl_in,
                repl_out: *repl_out,
            },
            runtime_type == "python",
        )))
    }

    /// The host ports a runner container (labelled so) publishes 2000 and 2001 on.
    fn rebuild(found: &Found<'_>) -> Result<Option<RunnerPorts>, String> {
        if !found.desc.spec.labels.contains_key(RUNNER_LABEL) {
            return Ok(None);
        }
        let port = |c: u16| {
            found
                .desc
                .spec
                .ports
                .iter()
                .find(|p| p.container_port == c)
                .map(|p| p.host_port)
                .ok_or_else(|| format!("its kernel runner's port {c} is not published"))
        };
        Ok(Some(RunnerPorts {
            repl_in: port(REPL_IN)?,
            repl_out: port(REPL_OUT)?,
        }))
    }
}
