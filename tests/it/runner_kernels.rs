//! Backend.AI's own kernel runner (PyPI `backend.ai-kernel` 26.9.6 on
//! `backend.ai-krunner-static-gnu` 4.4.0, provisioned by `just krunner`) inside kernels of
//! `kernelvisor-test-py` (`just test-image-py`: Debian trixie with `python3-ipykernel` and
//! upstream's labels), driven through the agent's real ZeroMQ RPC on an in-process agent and
//! the real Docker engine: a persistent REPL (state across runs, errors, `input`, interrupt,
//! continuation), batch steps, `trigger_batch_execution`, the intrinsic sshd/ttyd services, an
//! upstream-format service definition, and teardown. `KV_KRUNNER_DIR` names the runner; without
//! it the tests are skipped (said on stderr); `just test-all` always sets it.

use crate::common;

use std::time::Duration;

use rmpv::Value;

use common::agent::*;
use kernelvisor::agent::Agent;
use kernelvisor::rpc::Peer;

/// The Python kernel image (`just test-image-py`).
pub const PY_IMAGE: &str = "kernelvisor-test-py:latest";

const MIB: u64 = 1 << 20;

/// The runner's directory, or `None` (the test is skipped: said on stderr).
fn krunner_dir(test: &str) -> Option<String> {
    let dir = std::env::var("KV_KRUNNER_DIR").ok();
    if dir.is_none() {
        eprintln!("SKIPPED {test}: KV_KRUNNER_DIR is not set (`just test-all` sets it after `just krunner`)");
    }
    dir
}

/// The agent's `[agent]` extra lines plus a `[kernel-runner]` section on `dir`.
fn runner_section(dir: &str, mode: &str) -> String {
    format!("\n[kernel-runner]\ndir = \"{dir}\"\nmode = \"{mode}\"\ninit-timeout = 60\n")
}

async fn start(fx: &AgentFixture, dir: &str) -> Agent {
    Agent::start(fx.config(&runner_section(dir, "auto")), None)
        .await
        .expect("agent starts (is the Docker engine up?)")
}

/// A config for the Python image, run as uid/gid 1000.
fn py_config() -> Value {
    py_config_with(Vec::new())
}

/// [`py_config`] with `extra` keys (`environ` merged, the others added or replaced).
fn py_config_with(extra: Vec<(&str, Value)>) -> Value {
    let mut pairs = vec![
        ("image", image(PY_IMAGE)),
        ("uid", 1000.into()),
        ("main_gid", 1000.into()),
    ];
    pairs.extend(extra);
    kernel_config("1", 512 * MIB, pairs)
}

/// `execute(session, kernel, 2, run_id, mode, code, opts, flush)`.
async fn execute(
    peer: &Peer,
    kid: &str,
    run_id: &str,
    mode: &str,
    code: &str,
    opts: Vec<(&str, Value)>,
    flush: f64,
) -> Value {
    call(
        peer,
        "execute",
        vec![
            "s".into(),
            kid.into(),
            2.into(),
            run_id.into(),
            mode.into(),
            code.into(),
            map(opts),
            flush.into(),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("execute {mode} {code:?}: {e:?}"))
}

/// Text of the `kind` items of an answer's console.
fn console(answer: &Value, kind: &str) -> String {
    field(answer, "console")
        .as_array()
        .expect("console is a list")
        .iter()
        .filter_map(|item| {
            let pair = item.as_array()?;
            (pair.first()?.as_str()? == kind).then(|| pair.get(1)?.as_str().map(str::to_owned))?
        })
        .collect()
}

fn status(answer: &Value) -> &str {
    field(answer, "status").as_str().unwrap_or("?")
}

/// Runs `code` in query mode and continues until `finished`: (statuses, stdout, stderr, exit).
async fn run(peer: &Peer, kid: &str, code: &str) -> (Vec<String>, String, String, Option<i64>) {
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let mut a = execute(peer, kid, &run_id, "query", code, vec![], 2.0).await;
    let (mut statuses, mut out, mut err) = (Vec::new(), String::new(), String::new());
    loop {
        statuses.push(status(&a).to_owned());
        out += &console(&a, "stdout");
        err += &console(&a, "stderr");
        assert_eq!(field(&a, "runId").as_str(), Some(run_id.as_str()));
        match status(&a) {
            "finished" => return (statuses, out, err, field(&a, "exitCode").as_i64()),
            "continued" => {}
            other => panic!("unexpected status {other}: {a}"),
        }
        assert!(statuses.len() < 200, "no end after 200 answers");
        a = execute(peer, kid, &run_id, "continue", "", vec![], 2.0).await;
    }
}

/// Runs a batch (no clean step, `build`, then `exec`) as run `rid` and continues until
/// `finished`: every answer, in order.
async fn run_batch(peer: &Peer, kid: &str, rid: &str, build: &str, exec: &str) -> Vec<Value> {
    let mut a = execute(
        peer,
        kid,
        rid,
        "batch",
        "",
        vec![
            ("clean", "".into()),
            ("build", build.into()),
            ("exec", exec.into()),
        ],
        5.0,
    )
    .await;
    let mut answers = Vec::new();
    while status(&a) != "finished" {
        let next = execute(peer, kid, rid, "continue", "", vec![], 5.0).await;
        answers.push(std::mem::replace(&mut a, next));
        assert!(answers.len() < 200, "no end after 200 answers");
    }
    answers.push(a);
    answers
}

fn docker_inspect(container: &str, format: &str) -> String {
    docker(&["inspect", "-f", format, container])
}

#[actix_rt::test]
async fn a_python_kernel_keeps_its_repl_through_the_runner() {
    let Some(dir) = krunner_dir("runner_kernels") else {
        return;
    };
    let fx = AgentFixture::new("runner-repl", 36_100, 16);
    let agent = start(&fx, &dir).await;
    let peer = client(agent.endpoint()).await;
    let kid = uuid::Uuid::new_v4().to_string();
    let created = create_one(&peer, "s", &kid, py_config())
        .await
        .expect("create on the Python image");
    // Upstream's shape: repl ports published (on 127.0.0.1), sshd and ttyd service ports.
    let repl_in = field(&created, "repl_in_port").as_u64().unwrap_or(0);
    let repl_out = field(&created, "repl_out_port").as_u64().unwrap_or(0);
    assert!(repl_in > 0 && repl_out > 0, "repl ports: {created}");
    let services: Vec<String> = field(&created, "service_ports")
        .as_array()
        .unwrap()
        .iter()
        .map(|s| field(s, "name").as_str().unwrap_or_default().to_owned())
        .collect();
    for name in ["sshd", "ttyd", "hello"] {
        assert!(
            services.contains(&name.to_owned()),
            "{name} in {services:?}"
        );
    }
    let cid = field(&created, "container_id").as_str().unwrap().to_owned();
    assert_eq!(
        docker_inspect(&cid, "{{json .Config.Entrypoint}}"),
        r#"["/opt/kernel/entrypoint.sh"]"#
    );
    assert_eq!(docker_inspect(&cid, "{{.Config.User}}"), "");
    assert_eq!(docker_inspect(&cid, "{{.HostConfig.Init}}"), "true");
    assert_eq!(docker_inspect(&cid, "{{.Config.StopSignal}}"), "SIGINT");
    assert_eq!(
        docker_inspect(&cid, "{{json .HostConfig.CapAdd}}"),
        r#"["IPC_LOCK","SYS_NICE"]"#
    );
    let env = docker_inspect(&cid, "{{json .Config.Env}}");
    for var in [
        "\"N_GPUS=0\"",
        "\"OMP_NUM_THREADS=1\"",
        "\"LOCAL_USER_ID=1000\"",
    ] {
        assert!(env.contains(var), "{var} in {env}");
    }
    let bindings = docker_inspect(&cid, "{{json .HostConfig.PortBindings}}");
    assert!(
        bindings.contains(&format!(
            r#""2000/tcp":[{{"HostIp":"127.0.0.1","HostPort":"{repl_in}"}}]"#
        )),
        "{bindings}"
    );

    // State across runs.
    let (st, out, _, code) = run(&peer, &kid, "x = 41").await;
    assert_eq!(
        (st.last().map(String::as_str), code),
        (Some("finished"), Some(0)),
        "{out}"
    );
    let (_, out, _, code) = run(&peer, &kid, "print(x + 1)").await;
    assert_eq!((out.as_str(), code), ("42\n", Some(0)));
    // The REPL runs as the kernel's user (the entrypoint's su-exec).
    let (_, out, _, _) = run(&peer, &kid, "import os; print(os.getuid(), os.getgid())").await;
    assert_eq!(out, "1000 1000\n");
    // `opts.shell`: the process path on a runner kernel, as the kernel's user too.
    let a = execute(
        &peer,
        &kid,
        "shell-run",
        "query",
        "id -u",
        vec![("shell", true.into())],
        10.0,
    )
    .await;
    assert_eq!(
        (status(&a), console(&a, "stdout").as_str()),
        ("finished", "1000\n"),
        "{a}"
    );
    // An error: exit code 1 with the traceback; the REPL keeps `x`.
    let (_, _, err, code) = run(&peer, &kid, "1/0").await;
    assert_eq!(code, Some(1));
    assert!(err.contains("ZeroDivisionError"), "{err}");
    let (_, out, _, _) = run(&peer, &kid, "print(x)").await;
    assert_eq!(out, "41\n");

    // input(): waiting-input with upstream's options, then the line.
    let rid = "input-run";
    let a = execute(
        &peer,
        &kid,
        rid,
        "query",
        "name = input('who? ')",
        vec![],
        5.0,
    )
    .await;
    assert_eq!(status(&a), "waiting-input", "{a}");
    assert_eq!(console(&a, "stdout"), "who? ");
    assert_eq!(
        field(field(&a, "options"), "is_password").as_bool(),
        Some(false)
    );
    let a = execute(&peer, &kid, rid, "input", "bob", vec![], 5.0).await;
    assert_eq!(status(&a), "finished", "{a}");
    let (_, out, _, _) = run(&peer, &kid, "print('hi', name)").await;
    assert_eq!(out, "hi bob\n");

    // Continuation: 3 s of printing with flush 0.5 → continued… finished, every line once.
    let rid = "slow-run";
    let code = "import time\nfor i in range(15):\n    print(i, flush=True)\n    time.sleep(0.2)";
    let mut a = execute(&peer, &kid, rid, "query", code, vec![], 0.5).await;
    let (mut statuses, mut out) = (vec![status(&a).to_owned()], console(&a, "stdout"));
    while status(&a) != "finished" {
        a = execute(&peer, &kid, rid, "continue", "", vec![], 0.5).await;
        statuses.push(status(&a).to_owned());
        out += &console(&a, "stdout");
    }
    assert_eq!(statuses[0], "continued", "{statuses:?}");
    let want: String = (0..15).map(|i| format!("{i}\n")).collect();
    assert_eq!(out, want, "{statuses:?}");

    // Interrupt: KeyboardInterrupt ends the run; the REPL (and `x`) stays.
    let rid = "loop-run";
    let a = execute(
        &peer,
        &kid,
        rid,
        "query",
        "import time\nwhile True:\n    time.sleep(0.1)",
        vec![],
        1.0,
    )
    .await;
    assert_eq!(status(&a), "continued");
    call(&peer, "interrupt_kernel", vec![kid.clone().into()])
        .await
        .expect("interrupt_kernel");
    let mut err = String::new();
    let mut a = a;
    while status(&a) != "finished" {
        a = execute(&peer, &kid, rid, "continue", "", vec![], 2.0).await;
        err += &console(&a, "stderr");
    }
    assert_eq!(field(&a, "exitCode").as_i64(), Some(1));
    assert!(err.contains("KeyboardInterrupt"), "{err}");
    let (_, out, _, _) = run(&peer, &kid, "print(x)").await;
    assert_eq!(out, "41\n");

    // Batch: clean, build, exec with their own statuses.
    let answers = run_batch(
        &peer,
        &kid,
        "batch-run",
        "echo b",
        "python3 -c 'print(6*7)'; exit 4",
    )
    .await;
    let seen: Vec<(String, Option<i64>, String)> = answers
        .iter()
        .map(|a| {
            (
                status(a).to_owned(),
                field(a, "exitCode").as_i64(),
                console(a, "stdout"),
            )
        })
        .collect();
    let ends: Vec<(String, Option<i64>)> = seen
        .iter()
        .filter(|(s, _, _)| s != "continued")
        .map(|(s, c, _)| (s.clone(), *c))
        .collect();
    assert_eq!(
        ends,
        vec![
            ("clean-finished".to_owned(), Some(0)),
            ("build-finished".to_owned(), Some(0)),
            ("finished".to_owned(), Some(4)),
        ],
        "{seen:?}"
    );
    let all: String = seen.iter().map(|(_, _, o)| o.as_str()).collect();
    assert!(all.contains("b\n") && all.contains("42\n"), "{all:?}");

    // A flood: 20 MB of output nobody reads for a while, then read in bounded answers. The
    // agent (this process) holds at most its buffer: back-pressure stops the runner, not
    // memory; every line arrives once.
    let rss = || -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kb = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap();
        kb * 1024
    };
    let before = rss();
    let rid = "flood-run";
    // 10 MB in all: however the REPL batches it, no message is over the agent's 16 MiB cap.
    let code = "for i in range(100000):\n    print(f'{i:09d}' + 'x' * 90)";
    let mut a = execute(&peer, &kid, rid, "query", code, vec![], 0.01).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = rss().saturating_sub(before);
    let (mut lines, mut next, mut answers, mut biggest) = (0u64, 0u64, 0u32, 0usize);
    let mut partial = String::new();
    loop {
        let piece = console(&a, "stdout");
        biggest = biggest.max(piece.len());
        partial += &piece;
        let mut rest = partial.as_str();
        while let Some((line, tail)) = rest.split_once('\n') {
            assert_eq!(&line[..9], format!("{next:09}"), "line {next}");
            next += 1;
            lines += 1;
            rest = tail;
        }
        partial = rest.to_owned();
        answers += 1;
        if status(&a) == "finished" {
            break;
        }
        a = execute(&peer, &kid, rid, "continue", "", vec![], 2.0).await;
    }
    assert_eq!(lines, 100_000, "every line once, in order");
    // An answer holds the agent's `exec-buffer-size` (1 MiB) plus at most one runner message.
    assert!(
        answers >= 3 && biggest <= 11 << 20,
        "10 MB came in {answers} answers, the biggest {biggest} bytes"
    );
    assert!(
        held < 64 << 20,
        "the agent grew by {} MiB while 10 MB waited unread",
        held >> 20
    );

    // The intrinsic services answer on their host ports.
    for s in field(&created, "service_ports").as_array().unwrap() {
        let name = field(s, "name").as_str().unwrap_or_default();
        if name == "sshd" || name == "ttyd" {
            let port = field(s, "host_ports").as_array().unwrap()[0]
                .as_u64()
                .unwrap();
            if name == "ttyd" {
                // The web terminal's page, as a browser gets it.
                let page = ureq::get(&format!("http://127.0.0.1:{port}/"))
                    .call()
                    .unwrap_or_else(|e| panic!("ttyd on {port}: {e}"))
                    .into_string()
                    .unwrap();
                assert!(page.contains("ttyd"), "{}", &page[..page.len().min(300)]);
            } else {
                use std::io::Read;
                // dropbear speaks first: its SSH banner.
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port as u16))
                    .unwrap_or_else(|e| panic!("{name} on {port}: {e}"));
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut banner = [0u8; 8];
                s.read_exact(&mut banner).unwrap();
                assert_eq!(&banner, b"SSH-2.0-");
            }
        }
    }

    // Services through the runner: the intrinsic ttyd runs already; the image's upstream-format
    // service-def `hello` starts, serves, stops, and starts again.
    let start_service = |name: &'static str| {
        let (peer, kid) = (&peer, kid.clone());
        async move {
            call(
                peer,
                "start_service",
                vec![kid.into(), name.into(), map(vec![])],
            )
            .await
            .unwrap_or_else(|e| panic!("start_service {name}: {e:?}"))
        }
    };
    let ttyd = start_service("ttyd").await;
    assert!(
        matches!(status(&ttyd), "running" | "started"),
        "ttyd: {ttyd}"
    );
    let hello = start_service("hello").await;
    assert_eq!(status(&hello), "started", "{hello}");
    let port = field(&hello, "host_ports").as_array().unwrap()[0]
        .as_u64()
        .unwrap();
    let page = ureq::get(&format!("http://127.0.0.1:{port}/"))
        .call()
        .expect("hello serves")
        .into_string()
        .unwrap();
    assert_eq!(page, "hello from a service-def\n");
    call(
        &peer,
        "shutdown_service",
        vec![kid.clone().into(), "hello".into()],
    )
    .await
    .expect("shutdown_service");
    assert!(
        ureq::get(&format!("http://127.0.0.1:{port}/"))
            .call()
            .is_err(),
        "hello still serves after shutdown_service"
    );
    let again = start_service("hello").await;
    assert_eq!(status(&again), "started", "{again}");
    let nope = start_service("nope").await;
    assert_eq!(status(&nope), "failed", "{nope}");

    // A graceful agent stop leaves the REPL serving; the next agent reconnects to it.
    agent
        .shutdown(kernelvisor::config::OnShutdown::Preserve)
        .await;
    let agent = start(&fx, &dir).await;
    let peer = client(agent.endpoint()).await;
    let (_, out, _, _) = run(&peer, &kid, "print(x)").await;
    assert_eq!(out, "41\n", "the REPL's state after an agent restart");

    // One message over the agent's 16 MiB frame cap (a 20 MB print): refused whole (memory
    // stays bounded), the run ends saying so, and nothing hangs. (Last on this kernel: the
    // runner's own end of that run may still arrive.)
    let (st, _, err, code) = run(&peer, &kid, "print('y' * 20_000_000)").await;
    assert_eq!(
        (st.last().map(String::as_str), code),
        (Some("finished"), None),
        "{err}"
    );
    assert!(err.contains("connection dropped"), "{err}");

    call(&peer, "destroy_kernel", vec![kid.clone().into()])
        .await
        .expect("destroy");
    common::wait_until(
        Duration::from_secs(30),
        "the kernel's container goes",
        || async { fx.containers().is_empty() },
    )
    .await;
    assert!(
        fx.scratch_entries().is_empty(),
        "{:?}",
        fx.scratch_entries()
    );
    // It was stopped, not killed: the runner logged its shutdown (the log the agent keeps).
    let logs = call(&peer, "get_logs", vec![kid.clone().into()])
        .await
        .expect("the ended kernel's logs");
    let text = field(&logs, "logs").as_str().unwrap_or_default().to_owned();
    assert!(
        text.contains("shutting down"),
        "{}",
        &text[text.len().saturating_sub(2000)..]
    );
    agent
        .shutdown(kernelvisor::config::OnShutdown::Terminate)
        .await;
}

/// The runner is a stranger in a container its user controls: the user kills it mid-run. The
/// run's caller gets an end, not a hang; the kernel ends; a later call fails by name; a second
/// runner kernel on the same agent is served throughout. And a SIGKILLed agent process comes
/// back to a REPL that kept its state.
#[actix_rt::test]
async fn a_killed_runner_ends_its_kernel_and_a_killed_agent_finds_its_repl() {
    let Some(dir) = krunner_dir("runner_kernels") else {
        return;
    };
    let fx = AgentFixture::new("runner-kill", 36_700, 16);
    let config = fx.write_config(&runner_section(&dir, "auto"));
    let mut agent = spawn_agent_process(&fx, &config);
    let peer = connect_process(&fx).await;
    let (victim, other) = (
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
    );
    for kid in [&victim, &other] {
        create_one(&peer, "s", kid, py_config())
            .await
            .expect("create on the Python image");
    }
    let (_, out, _, _) = run(&peer, &other, "x = 41; print('set')").await;
    assert_eq!(out, "set\n");
    // As root in the victim's container, kill its runner in the middle of a run.
    let rid = "doomed";
    let a = execute(
        &peer,
        &victim,
        rid,
        "query",
        "import time\nwhile True:\n    time.sleep(0.1)",
        vec![],
        1.0,
    )
    .await;
    assert_eq!(status(&a), "continued");
    let cid = fx
        .containers()
        .into_iter()
        .find(|c| docker_inspect(c, "{{index .Config.Labels \"ai.backend.kernel-id\"}}") == victim)
        .expect("the victim's container");
    docker(&[
        "exec",
        "-u",
        "0",
        &cid,
        "pkill",
        "-KILL",
        "-f",
        "bai-krunner",
    ]);
    // Within a few answers the run ends or is gone, and the kernel is no longer RUNNING.
    let mut ended = false;
    for _ in 0..30 {
        let r = call(
            &peer,
            "execute",
            vec![
                "s".into(),
                victim.clone().into(),
                2.into(),
                rid.into(),
                "continue".into(),
                "".into(),
                map(vec![]),
                1.0.into(),
            ],
        )
        .await;
        match r {
            Ok(a) if status(&a) == "continued" => {}
            Ok(a) => {
                assert_eq!(status(&a), "finished", "{a}");
                ended = true;
                break;
            }
            Err(e) => {
                let name = failure_name(&Err(e));
                assert!(
                    ["RunNotFound", "KernelNotRunning", "KernelNotFound"].contains(&name.as_str()),
                    "{name}"
                );
                ended = true;
                break;
            }
        }
    }
    assert!(ended, "the killed runner's run never ended");
    // The other kernel's REPL served all along.
    let (_, out, _, _) = run(&peer, &other, "print(x)").await;
    assert_eq!(out, "41\n");

    // SIGKILL the agent: the next one reconnects to the surviving REPL.
    agent.kill().expect("SIGKILL the agent");
    let _ = agent.wait();
    let mut agent = spawn_agent_process(&fx, &config);
    let peer = connect_process(&fx).await;
    let (_, out, _, _) = run(&peer, &other, "print(x + 1)").await;
    assert_eq!(out, "42\n", "the REPL's state after a SIGKILLed agent");
    let _ = call(&peer, "destroy_kernel", vec![other.clone().into()]).await;
    let _ = call(&peer, "destroy_kernel", vec![victim.clone().into()]).await;
    common::wait_until(
        Duration::from_secs(30),
        "the kernels' containers go",
        || async { fx.containers().is_empty() },
    )
    .await;
    let _ = agent.kill();
    let _ = agent.wait();
}

/// `trigger_batch_execution` on a runner kernel runs its code as the runner's batch `exec`
/// (upstream's `execute_batch`): the session's result follows its exit code.
#[actix_rt::test]
async fn a_batch_execution_ends_by_the_runners_exit_code() {
    use kernelvisor::agent::events::AgentEvent;
    let Some(dir) = krunner_dir("runner_kernels") else {
        return;
    };
    let fx = AgentFixture::new("runner-batch", 36_400, 16);
    let agent = start(&fx, &dir).await;
    let peer = client(agent.endpoint()).await;
    let mut events = agent.ctx.events.subscribe();
    let kid = uuid::Uuid::new_v4().to_string();
    create_one(&peer, "s", &kid, py_config())
        .await
        .expect("create on the Python image");
    for (code, want_success, want_exit) in [
        ("python3 -c 'print(6*7)'; exit 4", false, Some(4)),
        ("python3 -c 'print(6*7)'", true, Some(0)),
    ] {
        call(
            &peer,
            "trigger_batch_execution",
            vec!["s".into(), kid.clone().into(), code.into(), 60.0.into()],
        )
        .await
        .expect("trigger_batch_execution");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let (success, exit) = loop {
            let e = tokio::time::timeout_at(deadline, events.recv())
                .await
                .expect("the batch's result in time")
                .expect("event bus");
            match e {
                AgentEvent::SessionSuccess {
                    kernel_id,
                    exit_code,
                    ..
                } if kernel_id == kid => break (true, exit_code),
                AgentEvent::SessionFailure {
                    kernel_id,
                    exit_code,
                    ..
                } if kernel_id == kid => break (false, exit_code),
                _ => {}
            }
        };
        assert_eq!((success, exit), (want_success, want_exit), "{code}");
    }
    call(&peer, "destroy_kernel", vec![kid.clone().into()])
        .await
        .expect("destroy");
    agent
        .shutdown(kernelvisor::config::OnShutdown::Terminate)
        .await;
}

/// `[kernel-runner] mode = "require"` refuses an image the runner cannot serve (the static
/// busybox test image: no glibc), by name; `auto` gives it the process path.
#[actix_rt::test]
async fn require_refuses_an_image_without_glibc_and_auto_keeps_the_process_path() {
    let Some(dir) = krunner_dir("runner_kernels") else {
        return;
    };
    let fx = AgentFixture::new("runner-require", 36_500, 8);
    let agent = Agent::start(fx.config(&runner_section(&dir, "require")), None)
        .await
        .expect("agent starts");
    let peer = client(agent.endpoint()).await;
    let kid = uuid::Uuid::new_v4().to_string();
    let r = create_one(&peer, "s", &kid, kernel_config("0.1", 64 * MIB, vec![])).await;
    assert_eq!(failure_name(&r), "InvalidKernelConfig");
    let text = format!("{r:?}");
    assert!(
        text.contains("require") && text.contains(TEST_IMAGE) && text.contains("glibc"),
        "{text}"
    );
    assert!(
        fx.containers().is_empty(),
        "nothing left: {:?}",
        fx.containers()
    );
    agent
        .shutdown(kernelvisor::config::OnShutdown::Terminate)
        .await;

    let fx = AgentFixture::new("runner-auto-bb", 36_510, 8);
    let agent = start(&fx, &dir).await;
    let peer = client(agent.endpoint()).await;
    let kid = uuid::Uuid::new_v4().to_string();
    let created = create_one(&peer, "s", &kid, kernel_config("0.1", 64 * MIB, vec![]))
        .await
        .expect("busybox takes the process path in auto");
    assert_eq!(field(&created, "repl_in_port").as_u64(), Some(0));
    let info = call(&peer, "get_kernel", vec![kid.clone().into()])
        .await
        .expect("get_kernel");
    assert_eq!(
        field(&info, "exec_path").as_str(),
        Some("process"),
        "{info}"
    );
    call(&peer, "destroy_kernel", vec![kid.clone().into()])
        .await
        .expect("destroy");
    agent
        .shutdown(kernelvisor::config::OnShutdown::Terminate)
        .await;
}

/// The user's own SSH keypair, as Backend.AI's manager sends it (`internal_data.ssh_keypair`),
/// goes where upstream's agent puts it (`/home/work/.ssh/authorized_keys`, `.ssh/id_rsa`,
/// `/home/work/id_container`; the user's, 0600): the runner's sshd lets the user in with it.
#[actix_rt::test]
async fn a_users_own_ssh_keypair_lets_them_in_over_the_runners_sshd() {
    let Some(dir) = krunner_dir("runner_kernels") else {
        return;
    };
    let keys = tempfile::tempdir().unwrap();
    let id = keys.path().join("id");
    let made = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "user@test", "-f"])
        .arg(&id)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let private = std::fs::read_to_string(&id).unwrap();
    let public = std::fs::read_to_string(id.with_extension("pub")).unwrap();
    let fx = AgentFixture::new("runner-userkey", 37_700, 16);
    let agent = start(&fx, &dir).await;
    let peer = client(agent.endpoint()).await;
    let kid = uuid::Uuid::new_v4().to_string();
    let config = py_config_with(vec![(
        "internal_data",
        map(vec![(
            "ssh_keypair",
            map(vec![
                ("public_key", public.trim().into()),
                ("private_key", private.clone().into()),
            ]),
        )]),
    )]);
    let created = create_one(&peer, "s", &kid, config.clone())
        .await
        .expect("create on the Python image");
    let cid = field(&created, "container_id").as_str().unwrap().to_owned();
    let sh = |script: &str| {
        let out = std::process::Command::new("docker")
            .args(["exec", &cid, "sh", "-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(
        sh("cat /home/work/id_container /home/work/.ssh/id_rsa"),
        private.repeat(2)
    );
    assert_eq!(
        sh("stat -c '%a %u:%g %n' /home/work/.ssh /home/work/.ssh/authorized_keys /home/work/id_container"),
        "700 1000:1000 /home/work/.ssh\n600 1000:1000 /home/work/.ssh/authorized_keys\n600 1000:1000 /home/work/id_container\n"
    );
    let sshd_port = field(&created, "service_ports")
        .as_array()
        .unwrap()
        .iter()
        .find(|s| field(s, "name").as_str() == Some("sshd"))
        .and_then(|s| field(s, "host_ports").as_array()?.first()?.as_u64())
        .expect("sshd's host port");
    let ssh = std::process::Command::new("/usr/bin/ssh")
        .arg("-i")
        .arg(&id)
        .args([
            "-p",
            &sshd_port.to_string(),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=20",
            "work@127.0.0.1",
            "echo ssh-ok; id -un",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&ssh.stdout),
        String::from_utf8_lossy(&ssh.stderr),
    );
    assert!(ssh.status.success(), "ssh: {out}{err}");
    assert_eq!(out, "ssh-ok\nwork\n", "{err}");

    // A container made anew for the kernel (`restart_kernel` with its config) keeps its sshd
    // host key (its users' `known_hosts` stay right) and the user's keys, and its runner serves
    // again.
    let host_key =
        "sha256sum /home/config/ssh/dropbear_rsa_host_key /home/work/.ssh/authorized_keys";
    let before = sh(host_key);
    let restarted = call(
        &peer,
        "restart_kernel",
        vec!["s".into(), kid.clone().into(), Value::Nil, config],
    )
    .await
    .expect("restart_kernel of a runner kernel");
    let new_cid = field(&restarted, "container_id")
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(new_cid, cid, "a new container");
    let hashed = std::process::Command::new("docker")
        .args(["exec", &new_cid, "sh", "-c", host_key])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&hashed.stdout), before);
    let (_, out, _, code) = run(&peer, &kid, "print(6 * 7)").await;
    assert_eq!((out.as_str(), code), ("42\n", Some(0)));

    call(&peer, "destroy_kernel", vec![kid.clone().into()])
        .await
        .expect("destroy");
    agent
        .shutdown(kernelvisor::config::OnShutdown::Terminate)
        .await;
}

/// A config for the Python image whose IPython start-up file (`PYTHONSTARTUP`, from a
/// read-only vfolder at `/data/startup`) sleeps 12 s, past the runner's 10 s for its REPL, on
/// the first boot only or, with `every_boot`, on each; every boot adds a line to
/// `/home/work/repl-boots`.
fn slow_repl_config(fx: &AgentFixture, every_boot: bool) -> Value {
    let vf = fx.vfolder_root().join("startup");
    std::fs::create_dir_all(&vf).unwrap();
    let sleeps = if every_boot { "True" } else { "first" };
    std::fs::write(
        vf.join("slow_boot.py"),
        format!(
            "def _slow_boot():\n    import os, time\n    path = '/home/work/repl-boots'\n    \
             first = not os.path.exists(path)\n    with open(path, 'a') as f:\n        \
             f.write('boot\\n')\n    if {sleeps}:\n        time.sleep(12)\n\n\
             _slow_boot()\ndel _slow_boot\n"
        ),
    )
    .unwrap();
    py_config_with(vec![
        (
            "environ",
            map(vec![("PYTHONSTARTUP", "/data/startup/slow_boot.py".into())]),
        ),
        (
            "mounts",
            Value::Array(vec![map(vec![
                ("name", "startup".into()),
                ("host_path", vf.display().to_string().into()),
                ("kernel_path", "/data/startup".into()),
                ("permission", "ro".into()),
            ])]),
        ),
    ])
}

/// An agent on a fixture `name` (host ports from `lo`) and one kernel created on
/// [`slow_repl_config`]: (the fixture, the agent, its client, the kernel's id).
async fn slow_repl_kernel(
    dir: &str,
    name: &str,
    lo: u16,
    every_boot: bool,
) -> (AgentFixture, Agent, Peer, String) {
    let fx = AgentFixture::new(name, lo, 16);
    let agent = start(&fx, dir).await;
    let peer = client(agent.endpoint()).await;
    let kid = uuid::Uuid::new_v4().to_string();
    create_one(&peer, "s", &kid, slow_repl_config(&fx, every_boot))
        .await
        .expect("create on the Python image");
    (fx, agent, peer, kid)
}

/// Destroys kernel `kid` and stops `agent`, its containers with it.
async fn destroy_and_stop(peer: &Peer, kid: &str, agent: Agent) {
    call(peer, "destroy_kernel", vec![kid.into()])
        .await
        .expect("destroy");
    agent
        .shutdown(kernelvisor::config::OnShutdown::Terminate)
        .await;
}

/// Upstream's runner gives its Jupyter kernel 10 s to answer and otherwise turns query mode off
/// for good (every run: exit code 127, no output). A REPL whose first boot misses that (here
/// [`slow_repl_config`]; on a loaded node it is the imports) gets its container restarted once
/// by the agent's readiness check: the kernel is created, its REPL answers, and it booted
/// twice.
#[actix_rt::test]
async fn a_repl_that_misses_the_runners_10_s_gets_a_second_boot() {
    let Some(dir) = krunner_dir("runner_kernels") else {
        return;
    };
    let (_fx, agent, peer, kid) = slow_repl_kernel(&dir, "runner-slow-repl", 44_740, false).await;
    let (_, out, err, code) = run(&peer, &kid, "print(6 * 7)").await;
    assert_eq!((out.as_str(), code), ("42\n", Some(0)), "{err}");
    let (_, out, err, code) = run(
        &peer,
        &kid,
        "print(open('/home/work/repl-boots').read().count('boot'))",
    )
    .await;
    assert_eq!((out.as_str(), code), ("2\n", Some(0)), "{err}");
    destroy_and_stop(&peer, &kid, agent).await;
}

/// A REPL that misses the runner's 10 s on both boots: the kernel runs without query mode
/// (created, batch mode works), and each query, which upstream's runner ends with a bare exit
/// code 127, says why on its stderr.
#[actix_rt::test]
async fn a_repl_that_never_starts_keeps_batch_mode_and_each_query_says_why() {
    let Some(dir) = krunner_dir("runner_kernels") else {
        return;
    };
    let (_fx, agent, peer, kid) = slow_repl_kernel(&dir, "runner-no-repl", 44_720, true).await;
    for _ in 0..2 {
        let (_, out, err, code) = run(&peer, &kid, "print(6 * 7)").await;
        assert_eq!((out.as_str(), code), ("", Some(127)), "{err}");
        assert!(
            err.contains("query mode is off in this kernel") && err.contains("Batch mode"),
            "{err}"
        );
    }
    // Batch mode runs in the same kernel: both boots are on record.
    let answers = run_batch(
        &peer,
        &kid,
        "batch-without-repl",
        "",
        "grep -c boot /home/work/repl-boots",
    )
    .await;
    let out: String = answers.iter().map(|a| console(a, "stdout")).collect();
    let a = answers.last().expect("an answer");
    assert_eq!(
        (out.as_str(), field(a, "exitCode").as_i64()),
        ("2\n", Some(0)),
        "{a}"
    );
    destroy_and_stop(&peer, &kid, agent).await;
}
