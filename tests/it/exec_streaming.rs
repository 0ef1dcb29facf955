//! `execute`'s continuation protocol on an in-process agent over its real ZeroMQ RPC, against the
//! real Docker engine: `continued` answers that never repeat or lose a byte, answers bounded by
//! `exec-buffer-size`, backpressure on a run nobody reads, `input` into a run's stdin, the run
//! timeout, `exec-idle-timeout` killing an abandoned run, the execution events, and batch
//! sessions' `session_success` / `session_failure` with logs that outlive the container.
//!
//! Every test has its own agent (own id, temp dir, host ports 32500–32599).

use crate::common;

use std::time::Duration;

use rmpv::Value;
use tokio::sync::broadcast;

use common::agent::*;
use kernelvisor::agent::events::AgentEvent;
use kernelvisor::agent::Agent;
use kernelvisor::config::OnShutdown;
use kernelvisor::rpc::Peer;

const MIB: u64 = 1 << 20;

async fn start(fx: &AgentFixture, extra: &str) -> Agent {
    Agent::start(fx.config(extra), None)
        .await
        .expect("agent starts (is the Docker engine up?)")
}

/// `execute(session, kernel, 2, run_id, mode, code, opts, flush_timeout)`.
async fn execute(
    peer: &Peer,
    kernel: &str,
    run_id: &str,
    mode: &str,
    code: &str,
    opts: Vec<(&str, Value)>,
    flush: f64,
) -> Result<Value, kernelvisor::rpc::CallError> {
    call(
        peer,
        "execute",
        vec![
            "s".into(),
            kernel.into(),
            2.into(),
            run_id.into(),
            mode.into(),
            code.into(),
            map(opts),
            Value::F64(flush),
        ],
    )
    .await
}

/// The console of an answer as (stdout, stderr) text, and its total size in bytes.
fn console(out: &Value) -> (String, String, usize) {
    let (mut o, mut e) = (String::new(), String::new());
    for entry in field(out, "console").as_array().expect("console is a list") {
        let pair = entry.as_array().expect("[stream, text]");
        let text = pair[1].as_str().expect("text");
        match pair[0].as_str() {
            Some("stdout") => o.push_str(text),
            Some("stderr") => e.push_str(text),
            other => panic!("unknown stream {other:?}"),
        }
    }
    let n = o.len() + e.len();
    (o, e, n)
}

fn status(out: &Value) -> &str {
    field(out, "status").as_str().expect("status")
}

/// Continues `run_id` until it is no longer `continued`; returns stdout, stderr, the number of
/// answers, the largest answer (bytes) and the last answer.
async fn drain(
    peer: &Peer,
    kernel: &str,
    run_id: &str,
    first: Value,
    flush: f64,
) -> (String, String, usize, usize, Value) {
    let (mut o, mut e, mut answers, mut largest) = (String::new(), String::new(), 0, 0);
    let mut out = first;
    loop {
        let (so, se, n) = console(&out);
        o.push_str(&so);
        e.push_str(&se);
        answers += 1;
        largest = largest.max(n);
        if status(&out) != "continued" {
            return (o, e, answers, largest, out);
        }
        out = execute(peer, kernel, run_id, "continue", "", vec![], flush)
            .await
            .expect("continue");
    }
}

async fn kernel(peer: &Peer, name: &str) -> String {
    let kid = format!("k-{name}-{}", run_id());
    create_one(peer, "s", &kid, kernel_config("0.5", 64 * MIB, vec![]))
        .await
        .expect("create");
    kid
}

#[actix_rt::test]
async fn continued_answers_lose_and_repeat_nothing_and_are_bounded() {
    let fx = AgentFixture::new("stream", 32500, 4);
    let agent = start(&fx, "exec-buffer-size = \"64k\"").await;
    let mut events = agent.ctx.events.subscribe();
    let peer = client(agent.endpoint()).await;
    let kid = kernel(&peer, "stream").await;

    // Output that comes slowly: the first answer comes at the flush timeout with what came so far.
    let slow = "for i in 1 2 3 4 5; do echo $i; sleep 0.3; done; echo warn >&2; exit 4";
    let first = execute(&peer, &kid, "r-slow", "query", slow, vec![], 0.2)
        .await
        .unwrap();
    assert_eq!(status(&first), "continued", "{first:?}");
    let (o, e, answers, _, last) = drain(&peer, &kid, "r-slow", first, 0.2).await;
    assert_eq!(o, "1\n2\n3\n4\n5\n");
    assert_eq!(e, "warn\n");
    assert!(
        answers >= 3,
        "a 1.5 s run in 0.2 s flushes gives several answers, got {answers}"
    );
    assert_eq!(
        (status(&last), field(&last, "exitCode").as_i64()),
        ("finished", Some(4))
    );
    // Its last answer given, the run is gone.
    assert_eq!(
        failure_name(&execute(&peer, &kid, "r-slow", "continue", "", vec![], 0.2).await),
        "RunNotFound"
    );

    // 3 MB at once: answers of at most exec-buffer-size (64 KiB), every byte once, in order.
    let big = "yes abcdefghij | head -c 3000000";
    let first = execute(&peer, &kid, "r-big", "query", big, vec![], 5.0)
        .await
        .unwrap();
    let (o, _, answers, largest, last) = drain(&peer, &kid, "r-big", first, 5.0).await;
    assert_eq!(o.len(), 3_000_000);
    assert!(
        o.as_bytes()
            .chunks(11)
            .all(|c| c == &b"abcdefghij\n"[..c.len()]),
        "the stream is intact"
    );
    assert!(
        largest <= 64 * 1024,
        "an answer carries at most exec-buffer-size: {largest}"
    );
    assert!(answers >= 3_000_000 / (64 * 1024), "{answers} answers");
    assert_eq!(field(&last, "exitCode").as_i64(), Some(0));

    // Each run: one execution_started and one execution_finished with its exit code (the
    // events follow the answers: wait until both runs' execution_finished are in).
    let mut seen = Vec::new();
    common::wait_until(
        Duration::from_secs(10),
        "both runs' execution_finished",
        || {
            seen.extend(drained(&mut events));
            let both = ["r-slow", "r-big"].iter().all(|run| {
                seen.iter().any(
                    |e| matches!(e, AgentEvent::ExecutionFinished { run_id, .. } if run_id == run),
                )
            });
            async move { both }
        },
    )
    .await;
    for (run, code) in [("r-slow", 4), ("r-big", 0)] {
        let started = seen
            .iter()
            .filter(|e| matches!(e, AgentEvent::ExecutionStarted { run_id, .. } if run_id == run))
            .count();
        let finished: Vec<_> = seen
            .iter()
            .filter_map(|e| match e {
                AgentEvent::ExecutionFinished {
                    run_id, exit_code, ..
                } if run_id == run => Some(*exit_code),
                _ => None,
            })
            .collect();
        assert_eq!((started, finished), (1, vec![Some(code)]), "{run}");
    }
    agent.shutdown(OnShutdown::Terminate).await;
}

/// A gauge of the agent's `/metrics` text.
fn gauge(agent: &Agent, name: &str) -> f64 {
    gauge_of(agent, name).unwrap_or_else(|| panic!("{name} not in the metrics"))
}

/// A gauge of the agent's `/metrics` text, if it is there.
fn gauge_of(agent: &Agent, name: &str) -> Option<f64> {
    let text = agent.ctx.metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn drained(events: &mut broadcast::Receiver<AgentEvent>) -> Vec<AgentEvent> {
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    seen
}

#[actix_rt::test]
async fn an_unread_run_is_held_back_then_killed_when_abandoned() {
    let fx = AgentFixture::new("abandon", 32510, 4);
    let agent = start(&fx, "exec-buffer-size = \"64k\"\nexec-idle-timeout = 2").await;
    let peer = client(agent.endpoint()).await;
    let kid = kernel(&peer, "abandon").await;

    // Endless output, read once: the answer is full and no larger than the buffer.
    let first = execute(&peer, &kid, "r-yes", "query", "yes abcdefghij", vec![], 1.0)
        .await
        .unwrap();
    let (o, _, n) = console(&first);
    assert_eq!(status(&first), "continued");
    assert!(n <= 64 * 1024 && n > 0, "{n}");
    assert!(o.starts_with("abcdefghij\n"));
    // Nobody reads: the process blocks on its write. Its progress stays bounded by the pipes
    // (the agent reads nothing), so a later answer is still at most one buffer. (A deliberate
    // window for the process to run on: what is checked is that nothing grows past the bound.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = execute(&peer, &kid, "r-yes", "continue", "", vec![], 0.1)
        .await
        .unwrap();
    assert!(console(&again).2 <= 64 * 1024);
    let ps = |peer: Peer, kid: String| async move {
        let out = execute(
            &peer,
            &kid,
            &format!("r-ps-{}", run_id()),
            "query",
            "ps -o comm",
            vec![],
            0.0,
        )
        .await
        .unwrap();
        (peer, console(&out).0)
    };
    let (peer, before) = ps(peer, kid.clone()).await;
    assert!(
        before.lines().any(|l| l.trim() == "yes"),
        "the run is alive while read: {before}"
    );

    // The runs in flight and their unread bytes are on /metrics (the reaper reports each second).
    common::wait_until(
        Duration::from_secs(10),
        "the reaper's report of the run",
        || {
            let reported = gauge_of(&agent, "kernelvisor_exec_runs").is_some_and(|n| n >= 1.0)
                && gauge_of(&agent, "kernelvisor_exec_buffered_bytes").is_some_and(|b| b > 0.0);
            async move { reported }
        },
    )
    .await;
    let buffered = gauge(&agent, "kernelvisor_exec_buffered_bytes");
    assert!(gauge(&agent, "kernelvisor_exec_runs") >= 1.0);
    assert!(
        buffered > 0.0 && buffered <= (64 * 1024 + 64 * 1024) as f64,
        "{buffered}"
    );

    // Abandoned for exec-idle-timeout (2 s): killed and freed. (Waited for without touching the
    // run: the reaper forgets it, then kills its process.)
    common::wait_until(Duration::from_secs(20), "the abandoned run reaped", || {
        let empty = agent.ctx.runs.is_empty();
        async move { empty }
    })
    .await;
    assert_eq!(
        failure_name(&execute(&peer, &kid, "r-yes", "continue", "", vec![], 0.1).await),
        "RunNotFound"
    );
    let (mut peer, mut after) = ps(peer, kid.clone()).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while after.lines().any(|l| l.trim() == "yes") && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        (peer, after) = ps(peer, kid.clone()).await;
    }
    assert!(
        !after.lines().any(|l| l.trim() == "yes"),
        "the abandoned run's process is gone: {after}"
    );
    assert!(agent.ctx.runs.is_empty(), "no run held");
    // The reaper's next report (each second) shows it.
    let buffered = common::settle(
        Duration::from_secs(10),
        || async { gauge(&agent, "kernelvisor_exec_buffered_bytes") },
        |b| *b == 0.0,
    )
    .await;
    assert_eq!(buffered, 0.0);
    drop(peer);
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn input_feeds_stdin_and_timeouts_kill() {
    let fx = AgentFixture::new("input", 32520, 4);
    let agent = start(&fx, "").await;
    let mut events = agent.ctx.events.subscribe();
    let peer = client(agent.endpoint()).await;
    let kid = kernel(&peer, "input").await;

    let first = execute(
        &peer,
        &kid,
        "r-read",
        "query",
        "echo ready; read x; echo got $x",
        vec![("stdin", true.into())],
        0.5,
    )
    .await
    .unwrap();
    // The run waits on `read`: every answer is `continued` until it is fed. A loaded machine
    // may not have flushed `ready` by the first answer's 0.5 s: continue until it has.
    let mut answer = first;
    let mut shown = String::new();
    for _ in 0..40 {
        assert_eq!(status(&answer), "continued", "{answer:?}");
        shown.push_str(&console(&answer).0);
        if !shown.is_empty() {
            break;
        }
        answer = execute(&peer, &kid, "r-read", "continue", "", vec![], 0.5)
            .await
            .unwrap();
    }
    assert_eq!(shown, "ready\n");
    let fed = execute(&peer, &kid, "r-read", "input", "hello\n", vec![], 2.0)
        .await
        .unwrap();
    let (o, _, _, _, last) = drain(&peer, &kid, "r-read", fed, 2.0).await;
    assert_eq!(o, "got hello\n");
    assert_eq!(field(&last, "exitCode").as_i64(), Some(0));

    // eof closes stdin: `cat` ends.
    execute(
        &peer,
        &kid,
        "r-cat",
        "query",
        "cat",
        vec![("stdin", true.into())],
        0.1,
    )
    .await
    .unwrap();
    let fed = execute(
        &peer,
        &kid,
        "r-cat",
        "input",
        "one\ntwo\n",
        vec![("eof", true.into())],
        2.0,
    )
    .await
    .unwrap();
    let (o, _, _, _, last) = drain(&peer, &kid, "r-cat", fed, 2.0).await;
    assert_eq!(
        (o.as_str(), field(&last, "exitCode").as_i64()),
        ("one\ntwo\n", Some(0))
    );

    // A run without stdin refuses input.
    execute(&peer, &kid, "r-nostdin", "query", "sleep 1", vec![], 0.1)
        .await
        .unwrap();
    assert_eq!(
        failure_name(&execute(&peer, &kid, "r-nostdin", "input", "x\n", vec![], 0.1).await),
        "RunHasNoStdin"
    );
    // A run id in use is refused; another kernel's run is not found.
    assert_eq!(
        failure_name(&execute(&peer, &kid, "r-nostdin", "query", "true", vec![], 0.1).await),
        "RunExists"
    );
    assert_eq!(
        failure_name(&execute(&peer, "k-other", "r-nostdin", "continue", "", vec![], 0.1).await),
        "RunNotFound"
    );

    // The run timeout kills it: exec-timeout, with the output it had written.
    let first = execute(
        &peer,
        &kid,
        "r-slow",
        "query",
        "echo before; sleep 30",
        vec![("timeout", Value::F64(1.0))],
        10.0,
    )
    .await
    .unwrap();
    let (o, _, _, _, last) = drain(&peer, &kid, "r-slow", first, 10.0).await;
    assert_eq!(
        (o.as_str(), status(&last), field(&last, "exitCode")),
        ("before\n", "exec-timeout", &Value::Nil)
    );
    let timeout = common::settle(
        Duration::from_secs(10),
        || std::future::ready(drained(&mut events)),
        |seen| {
            seen.iter().any(
                |e| matches!(e, AgentEvent::ExecutionTimeout { run_id, .. } if run_id == "r-slow"),
            )
        },
    );
    assert!(timeout
        .await
        .iter()
        .any(|e| matches!(e, AgentEvent::ExecutionTimeout { run_id, .. } if run_id == "r-slow")));
    agent.shutdown(OnShutdown::Terminate).await;
}

/// Waits for `session_success` / `session_failure` and `kernel_terminated` of `kernel_id`.
async fn batch_end(
    events: &mut broadcast::Receiver<AgentEvent>,
    kernel_id: &str,
) -> (AgentEvent, AgentEvent) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut result = None;
    loop {
        let e = tokio::time::timeout_at(deadline, events.recv())
            .await
            .expect("batch session ended in time")
            .expect("event bus");
        match &e {
            AgentEvent::SessionSuccess { kernel_id: k, .. }
            | AgentEvent::SessionFailure { kernel_id: k, .. }
                if k == kernel_id =>
            {
                assert!(result.is_none(), "one result per session");
                result = Some(e);
            }
            AgentEvent::KernelTerminated { kernel_id: k, .. } if k == kernel_id => {
                return (
                    result.expect("the result comes before kernel_terminated"),
                    e,
                );
            }
            _ => {}
        }
    }
}

#[actix_rt::test]
async fn batch_sessions_report_their_result_and_keep_their_logs() {
    let fx = AgentFixture::new("batch", 32530, 4);
    let agent = start(&fx, "").await;
    let mut events = agent.ctx.events.subscribe();
    let peer = client(agent.endpoint()).await;
    let batch = |cmd: &str, timeout: Option<f64>| {
        let mut extra = vec![
            ("session_type", Value::from("batch")),
            ("startup_command", cmd.into()),
        ];
        if let Some(t) = timeout {
            extra.push(("batch_timeout", Value::F64(t)));
        }
        kernel_config("0.5", 64 * MIB, extra)
    };

    let k_fail = format!("k-fail-{}", run_id());
    create_one(
        &peer,
        "s1",
        &k_fail,
        batch("echo start; pwd; sleep 1; echo done >&2; exit 3", None),
    )
    .await
    .unwrap();
    let (result, term) = batch_end(&mut events, &k_fail).await;
    assert!(
        matches!(result, AgentEvent::SessionFailure { ref reason, exit_code: Some(3), .. } if reason == "self-terminated"),
        "{result:?}"
    );
    assert!(
        matches!(
            term,
            AgentEvent::KernelTerminated {
                exit_code: Some(3),
                ..
            }
        ),
        "{term:?}"
    );
    // The container is gone; its logs are not.
    assert!(fx.containers().is_empty());
    let logs = call(&peer, "get_logs", vec![k_fail.clone().into()])
        .await
        .unwrap();
    let text = field(&logs, "logs").as_str().unwrap();
    assert!(
        text.contains("start\n/home/work\n") && text.contains("done"),
        "{text:?}"
    );
    assert_eq!(field(&logs, "active"), &Value::from(false));

    let k_ok = format!("k-ok-{}", run_id());
    create_one(&peer, "s2", &k_ok, batch("exit 0", None))
        .await
        .unwrap();
    let (result, _) = batch_end(&mut events, &k_ok).await;
    assert!(
        matches!(
            result,
            AgentEvent::SessionSuccess {
                exit_code: Some(0),
                ..
            }
        ),
        "{result:?}"
    );

    let k_slow = format!("k-slow-{}", run_id());
    create_one(&peer, "s3", &k_slow, batch("sleep 60", Some(1.5)))
        .await
        .unwrap();
    let (result, term) = batch_end(&mut events, &k_slow).await;
    assert!(
        matches!(result, AgentEvent::SessionFailure { ref reason, .. } if reason == "batch-timeout"),
        "{result:?}"
    );
    assert!(
        matches!(term, AgentEvent::KernelTerminated { ref reason, .. } if reason == "batch-timeout"),
        "{term:?}"
    );

    // A batch session without a command is refused before anything is made.
    let r = create_one(
        &peer,
        "s4",
        "k-nocmd",
        kernel_config("0.5", 64 * MIB, vec![("session_type", "batch".into())]),
    )
    .await;
    assert_eq!(failure_name(&r), "InvalidKernelConfig");
    agent.shutdown(OnShutdown::Terminate).await;
}
