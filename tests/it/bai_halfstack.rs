//! kernelvisor as the agent of a real Backend.AI 26.9.6 deployment, side by side with upstream's
//! own agent in the same run.
//!
//! `tests/bai_halfstack/halfstack.sh` brings up a halfstack in the trixie root of
//! `scripts/bai-compat-env.sh` (`just bai-env`, `$KV_BAI_ROOT`): PostgreSQL 17, Valkey and etcd
//! on free loopback ports of 37000–37099 with their own data directories, the schema, fixtures,
//! the `default` project's members, a `local` registry and its image rescan, and the real
//! `backend.ai mgr start-server`. Then:
//! 1. kernelvisor's agent (CURVE keys the halfstack made, `[redis]` at its Valkey,
//!    `[kernel-runner]` at `$KV_KRUNNER_DIR`, resource group `default`, host ports 37100–37199)
//!    is started, registered by the manager from its heartbeats, and the session scenario
//!    (`halfstack.py scenario`, the real client SDK and `backend.ai` CLI) runs on it, on the
//!    image `local/kernelvisor/test-py:bash` (`just test-image-py`; `/bin/bash` as its command,
//!    as upstream's base images), then Backend.AI's own suite (`backend.ai-test` 26.9.6, its
//!    single-node session specs that need no storage proxy or webserver; `halfstack.py suite`,
//!    with shims for two quirks of upstream's own, docs/backend-ai.md);
//! 2. kernelvisor's agent is stopped (SIGTERM: `agent_terminated` on the bus) and upstream's own
//!    agent (`backend.ai-agent` 26.9.6, ports 37200–37299) runs the same scenario and suite;
//! 3. the table step → outcome on upstream / on kernelvisor is printed, and the test asserts
//!    that kernelvisor passes every step upstream's agent passes (and that upstream's agent ran
//!    sessions at all, so the comparison means something).
//!
//! Everything the halfstack started is stopped by pid and every container of both agents
//! removed by its agent id (`halfstack.py down`), also when the test fails.
//! Without `KV_BAI_ROOT` or `KV_KRUNNER_DIR` the test is skipped (said on stderr).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use common::agent::{docker, read, run_id, spawn_agent_process, AgentFixture};
use common::bai::{tail, wait_for_port, KillOnDrop};
use common::halfstack::Halfstack;

/// The image both agents run: `kernelvisor-test-py` with `/bin/bash` as its command
/// (`just test-image-py`), as the halfstack's `local` registry of project `kernelvisor` names it.
const IMAGE: &str = "local/kernelvisor/test-py:bash";
const ENGINE_IMAGE: &str = "kernelvisor/test-py:bash";

/// The scenario's steps, in order (`halfstack.py scenario`).
const STEPS: &[&str] = &[
    "agent_registered",
    "interactive_session_running",
    "rest_query_state",
    "websocket_query_state",
    "batch_mode_exec",
    "upload_list_download",
    "logs",
    "service_ports_ttyd_sshd",
    "destroy",
    "batch_session_success",
    "batch_session_failure",
    "cli_run_rm",
];

/// Ports: the halfstack's servers, kernelvisor's agent (RPC at the start, kernels' host ports
/// after), upstream's agent.
const HALFSTACK_PORTS: &str = "37000-37099";
const KV_AGENT_PORTS: (u16, u16) = (37_100, 37_199);
const UPSTREAM_AGENT_PORTS: &str = "37200-37299";

/// Brings the halfstack up in a new work directory (removed with it); panics with its output
/// when it does not come up. Its seconds to come up.
fn up(root: &Path) -> (Halfstack, f64) {
    let work = std::env::temp_dir().join(format!("kv-halfstack-{}", run_id()));
    std::fs::create_dir_all(&work).unwrap();
    let hs = Halfstack::new(root, work);
    let start = Instant::now();
    let out = hs
        .command(&["up", "--ports", HALFSTACK_PORTS])
        .output()
        .expect("run halfstack.sh");
    let secs = start.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "halfstack up: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        tail(&String::from_utf8_lossy(&out.stderr), 60)
    );
    (hs, secs)
}

/// Runs a subcommand; its stdout's JSON lines (each line also echoed on stderr with `label`),
/// whether it succeeded, and its stderr's tail.
fn run(hs: &Halfstack, label: &str, args: &[&str]) -> (Vec<serde_json::Value>, bool, String) {
    let stderr_path = hs.work.join(format!("{label}.stderr"));
    let stderr = Stdio::from(std::fs::File::create(&stderr_path).unwrap());
    let (lines, ok) = match hs.lines(args, stderr, |line, _| eprintln!("{label}: {line}")) {
        Ok((lines, status)) => (lines, status.success()),
        Err(e) => panic!("halfstack.sh {}: {e}", args.join(" ")),
    };
    (lines, ok, tail(&read(&stderr_path), 40))
}

/// The last lines of the halfstack's log of `name` (`manager`, `upstream-agent`, …).
fn log_tail(hs: &Halfstack, name: &str) -> String {
    tail(&read(&hs.work.join("logs").join(format!("{name}.log"))), 40)
}

/// Every step: the scenario's, then the suite's specs as either run reported them.
fn all_steps(runs: &[&[serde_json::Value]]) -> Vec<String> {
    let mut steps: Vec<String> = STEPS.iter().map(|s| (*s).to_owned()).collect();
    for lines in runs {
        for v in lines.iter() {
            if let Some(name) = v["step"].as_str() {
                if !steps.iter().any(|s| s == name) {
                    steps.push(name.to_owned());
                }
            }
        }
    }
    steps
}

/// One agent's outcome per step: `Some(Ok(extra))` / `Some(Err(error))` / `None` (not reported).
fn outcomes(
    steps: &[String],
    lines: &[serde_json::Value],
) -> Vec<(String, Option<Result<String, String>>)> {
    steps
        .iter()
        .map(|step| {
            let rec = lines.iter().find(|v| v["step"] == *step);
            let outcome = rec.map(|v| {
                if v["ok"] == true {
                    Ok(format!("{:.1}s", v["secs"].as_f64().unwrap_or_default()))
                } else {
                    Err(v["error"].as_str().unwrap_or("?").to_owned())
                }
            });
            (step.clone(), outcome)
        })
        .collect()
}

fn cell(o: &Option<Result<String, String>>) -> String {
    match o {
        Some(Ok(t)) => format!("ok ({t})"),
        Some(Err(_)) => "FAILED".to_owned(),
        None => "not run".to_owned(),
    }
}

#[test]
fn a_real_backend_ai_halfstack_runs_sessions_on_kernelvisor_wherever_upstream_runs_them() {
    let Some(root) = std::env::var_os("KV_BAI_ROOT").map(PathBuf::from) else {
        eprintln!("SKIPPED bai_halfstack: KV_BAI_ROOT is not set (`just test-all` sets it)");
        return;
    };
    let Ok(krunner) = std::env::var("KV_KRUNNER_DIR") else {
        eprintln!("SKIPPED bai_halfstack: KV_KRUNNER_DIR is not set (`just test-all` sets it)");
        return;
    };
    assert!(
        root.join("usr/lib/postgresql/17/bin/postgres").exists(),
        "KV_BAI_ROOT={} has no PostgreSQL 17: run `just bai-env`",
        root.display()
    );
    assert!(
        docker(&["image", "inspect", "-f", "{{.Id}}", ENGINE_IMAGE]).starts_with("sha256:"),
        "no image {ENGINE_IMAGE}: run `just test-image-py`"
    );

    let (mut hs, up_secs) = up(&root);
    let state: serde_json::Value =
        serde_json::from_str(&read(&hs.work.join("halfstack.json"))).unwrap();
    eprintln!("halfstack up in {up_secs:.1} s: {}", state["timings"]);

    // kernelvisor's agent: the halfstack's CURVE keys, its Valkey, the runner.
    let mut fx = AgentFixture::new(
        "bai-halfstack",
        KV_AGENT_PORTS.0 + 10 + 12_000,
        KV_AGENT_PORTS.1 - KV_AGENT_PORTS.0 - 9,
    );
    fx.rpc_port = (KV_AGENT_PORTS.0..KV_AGENT_PORTS.0 + 10)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port for kernelvisor's RPC");
    hs.agent_ids.push(fx.agent_id.clone());
    let keys = &state["keys"];
    let config = fx.dir.path().join("agent.toml");
    std::fs::write(
        &config,
        fx.config_toml(&format!(
            "rpc-auth-manager-public-key = {mk}\nrpc-auth-agent-keypair = {ak}\nscaling-group = \"default\"\n\
             \n[redis]\naddr = {{ host = \"127.0.0.1\", port = {valkey} }}\n\
             \n[kernel-runner]\ndir = \"{krunner}\"\nmode = \"auto\"\ninit-timeout = 60\n",
            mk = keys["manager.key"],
            ak = keys["agent.key_secret"],
            valkey = state["ports"]["valkey"],
        )),
    )
    .unwrap();
    let log = fx.dir.path().join("agent.log");
    let mut agent = KillOnDrop(spawn_agent_process(&fx, &config));
    wait_for_port(fx.rpc_port, &mut agent.0, &log);
    let (reg, reg_ok, reg_err) = run(
        &hs,
        "kv-register",
        &["wait-agent", "--agent-id", &fx.agent_id, "--limit", "90"],
    );
    assert!(
        reg_ok,
        "the manager did not register kernelvisor's agent: {reg:?}\n{reg_err}\nagent log:\n{}\nmanager log:\n{}",
        tail(&read(&log), 40),
        log_tail(&hs, "manager")
    );
    let (mut kv_lines, _, kv_err) = run(
        &hs,
        "kernelvisor",
        &[
            "scenario",
            "--agent-id",
            &fx.agent_id,
            "--label",
            "kernelvisor",
            "--image",
            IMAGE,
        ],
    );
    // Backend.AI's own suite (backend.ai-test 26.9.6), its session specs that need no storage
    // proxy or webserver.
    let (suite, _, _) = run(
        &hs,
        "kernelvisor-suite",
        &["suite", "--label", "kernelvisor", "--image", IMAGE],
    );
    kv_lines.extend(suite);
    // Stopped as an operator would (SIGTERM): `agent_terminated` takes it out of scheduling.
    let _ = Command::new("kill")
        .args(["-TERM", &agent.0.id().to_string()])
        .status();
    let _ = agent.0.wait();
    let (_, gone_ok, gone_err) = run(
        &hs,
        "kv-terminated",
        &[
            "wait-agent",
            "--agent-id",
            &fx.agent_id,
            "--status",
            "TERMINATED",
            "--limit",
            "60",
        ],
    );
    assert!(
        gone_ok,
        "the manager still schedules on kernelvisor's stopped agent:\n{gone_err}"
    );

    // Upstream's own agent, the same scenario.
    let up_id = format!("upstream-{}", run_id());
    hs.agent_ids.push(up_id.clone());
    let (up_start, up_start_ok, up_start_err) = run(
        &hs,
        "upstream-up",
        &[
            "agent-up",
            "--agent-id",
            &up_id,
            "--ports",
            UPSTREAM_AGENT_PORTS,
        ],
    );
    let up_lines = if up_start_ok {
        let (mut lines, _, _) = run(
            &hs,
            "upstream",
            &[
                "scenario",
                "--agent-id",
                &up_id,
                "--label",
                "upstream",
                "--image",
                IMAGE,
            ],
        );
        let (suite, _, _) = run(
            &hs,
            "upstream-suite",
            &["suite", "--label", "upstream", "--image", IMAGE],
        );
        lines.extend(suite);
        let _ = run(&hs, "upstream-down", &["agent-down"]);
        lines
    } else {
        eprintln!("upstream's agent did not start: {up_start:?}\n{up_start_err}");
        Vec::new()
    };

    // The table.
    let steps = all_steps(&[&kv_lines, &up_lines]);
    let kv = outcomes(&steps, &kv_lines);
    let up = outcomes(&steps, &up_lines);
    let mut table = format!(
        "\n{:<76} {:<16} {:<16}\n",
        "step", "upstream", "kernelvisor"
    );
    for ((step, u), (_, k)) in up.iter().zip(&kv) {
        table += &format!("{step:<76} {:<16} {:<16}\n", cell(u), cell(k));
    }
    let timing = |lines: &[serde_json::Value]| {
        lines
            .iter()
            .find(|v| v["step"] == "interactive_session_running")
            .and_then(|v| v["create_to_running"].as_f64())
    };
    table += &format!(
        "halfstack up {up_secs:.1} s; create -> RUNNING through the manager: upstream {:?} s, kernelvisor {:?} s\n",
        timing(&up_lines),
        timing(&kv_lines)
    );
    eprintln!("{table}");

    let mut problems = Vec::new();
    for ((step, u), (_, k)) in up.iter().zip(&kv) {
        if matches!(u, Some(Ok(_))) && !matches!(k, Some(Ok(_))) {
            let why = match k {
                Some(Err(e)) => e.clone(),
                _ => "not reported".into(),
            };
            problems.push(format!(
                "{step}: passes on upstream's agent, not on kernelvisor: {why}"
            ));
        }
    }
    for step in ["agent_registered", "interactive_session_running"] {
        let (_, u) = up.iter().find(|(s, _)| s == step).unwrap();
        if !matches!(u, Some(Ok(_))) {
            problems.push(format!(
                "{step} failed on upstream's agent ({u:?}): the comparison would prove nothing\n{}",
                log_tail(&hs, "upstream-agent")
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} problem(s):\n  {}\n{table}\nkernelvisor's scenario stderr:\n{kv_err}\nkernelvisor's agent log:\n{}\nmanager log:\n{}",
        problems.len(),
        problems.join("\n  "),
        tail(&read(&log), 60),
        log_tail(&hs, "manager")
    );
    drop(fx);
}
