//! `session create`: start a session (`POST /v1/sessions`) from its image, resources, mounts,
//! type and restart policy.

use std::collections::BTreeMap;
use std::io::Write;

use clap::Args;
use serde_json::Value;

use crate::ctl::parse::{self, Mount};
use crate::ctl::render::{fields, text, with, word};
use crate::ctl::{show, Client, Failure, Output};
use crate::model::cluster::ClusterMode;
use crate::model::session::{NewRestartPolicy, NewSession, SessionCreated};

/// Session type of `session create --type` and the restart policy's mode of `--restart`: the
/// API's own enums (their CLI help is in `crate::model::session`).
pub use crate::model::session::{RestartMode, SessionType};

/// Arguments of `kernelvisor ctl session create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Container image, e.g. kernelvisor-test:latest.
    #[arg(long)]
    pub image: String,
    /// CPU cores, up to 3 decimals (e.g. 1 or 0.5).
    #[arg(long, value_name = "CORES", allow_hyphen_values = true, value_parser = parse::cores)]
    pub cpu: String,
    /// Memory: bytes, or with a unit suffix such as 256m or 1g.
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = parse::mem_size)]
    pub mem: String,
    /// An accelerator slot an agent advertises, e.g. cuda.device=1 or cuda.shares=0.5
    /// (repeatable; a later NAME wins). A slot no agent has is refused (unknown-slot).
    #[arg(long = "slot", value_name = "NAME=AMOUNT", value_parser = parse::slot)]
    pub slots: Vec<(String, String)>,
    /// Access key the session is charged to [default: the token's]; an admin token may name
    /// another key, to create the session on its behalf.
    #[arg(long, value_name = "KEY")]
    pub access_key: Option<String>,
    /// Environment variable for the kernel (repeatable; a later KEY wins).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse::env)]
    pub env: Vec<(String, String)>,
    /// A vfolder to mount at /home/work/NAME, read-write unless :ro (repeatable).
    #[arg(long = "mount", value_name = "NAME[:ro|:rw]", value_parser = parse::mount)]
    pub mounts: Vec<Mount>,
    /// Session type [default: interactive]; batch needs --command.
    #[arg(long = "type", value_name = "TYPE", value_enum)]
    pub session_type: Option<SessionType>,
    /// Shell command line, run as `sh -c` in /home/work: a batch session's job (required with
    /// --type batch), or what an interactive session runs instead of the image's command.
    #[arg(long, value_name = "SHELL", required_if_eq("session_type", "batch"))]
    pub command: Option<String>,
    /// Batch sessions: end the job as FAILURE (reason batch-timeout) after this many seconds.
    #[arg(long, value_name = "SECS", value_parser = parse::positive_seconds)]
    pub batch_timeout: Option<f64>,
    /// Restart the container when it exits [default: never]: on-failure after a non-zero exit,
    /// an OOM kill or a failing HEALTHCHECK (a batch job is retried); always after any exit.
    #[arg(long = "restart", value_name = "MODE", value_enum)]
    pub restart: Option<RestartMode>,
    /// With --restart: at most this many restarts within --restart-window [default: 3]; one
    /// more and the session ends with reason restart-limit-exceeded.
    #[arg(long, value_name = "N", requires = "restart")]
    pub max_restarts: Option<u32>,
    /// With --restart: the window of --max-restarts, in seconds [default: 60].
    #[arg(long, value_name = "SECS", value_parser = parse::positive_seconds, requires = "restart")]
    pub restart_window: Option<f64>,
    /// With --restart: seconds before the first restart, doubling with each further one up to
    /// 300 [default: 1].
    #[arg(long, value_name = "SECS", value_parser = parse::seconds, requires = "restart")]
    pub restart_backoff: Option<f64>,
    /// 0 (lowest) to 100: a higher priority is admitted first when sessions wait for room
    /// [default: 10].
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = clap::value_parser!(i64).range(0..=100))]
    pub priority: Option<i64>,
    /// Fail (exit 1, `no-capacity`) instead of queueing the session when nothing fits now.
    #[arg(long)]
    pub no_queue: bool,
    /// A cluster session of this many kernels (1 to 64), main1, sub1 … each with --cpu,
    /// --mem and --slot, placed together or not at all [default: 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub cluster_size: Option<u32>,
    /// Where a cluster's kernels go [default: single-node].
    #[arg(long, value_name = "MODE", value_enum)]
    pub cluster_mode: Option<ClusterMode>,
    /// The signal its workload gets when the session ends: SIGTERM (the default; SIGINT for a
    /// runner kernel), SIGINT, SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2.
    #[arg(long, value_name = "SIGNAL")]
    pub stop_signal: Option<String>,
    /// Seconds its workload has to exit after the stop signal before it is killed [default:
    /// the manager's `[scheduler] grace-period`].
    #[arg(long, value_name = "SECS", value_parser = parse::seconds)]
    pub grace_period: Option<f64>,
    /// Print only the new session's id (for `sid=$(kernelvisor ctl session create … -q)`).
    #[arg(long, short)]
    pub quiet: bool,
    // Preemption (issue 41 item 2).
    /// Whether a pending session of a higher priority may evict it (`true`/`false`)
    /// [default: the access key's default].
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub preemptible: Option<bool>,
    // Idle reclaim (the manager's `docs/design.md`, "Idle reclaim").
    /// Seconds without activity (an exec, a terminal, a file transfer, a service connection)
    /// before it ends `idle-timeout` [default: the access key's, then the manager's].
    #[arg(long, value_name = "SECS", value_parser = parse::positive_seconds)]
    pub idle_timeout: Option<f64>,
    /// Seconds it may run once placed; then it ends `lifetime-exceeded`.
    #[arg(long, value_name = "SECS", value_parser = parse::positive_seconds)]
    pub max_lifetime: Option<f64>,
    /// A utilization floor, `SLOT=PERCENT` (`cpu=5`, `cuda.device=10`; whole percents);
    /// repeatable. Under every floor for `--utilization-window`, it ends `low-utilization`.
    #[arg(long, value_name = "SLOT=PERCENT", value_parser = parse::slot_percent)]
    pub min_utilization: Vec<(String, u32)>,
    /// Seconds under the floor before it ends [default: the manager's `[reclaim]`].
    #[arg(long, value_name = "SECS", value_parser = parse::positive_seconds)]
    pub utilization_window: Option<f64>,
}

impl CreateArgs {
    /// The `POST /v1/sessions` body; `access_key`, `environ`, `mounts` (`[{"name",
    /// "permission"}]`), `type`, `command`, `batch_timeout` and `restart_policy` (`{"mode", …}`
    /// with the limits given) only when given.
    pub fn request(&self) -> NewSession {
        let mut resource_slots = BTreeMap::from([
            ("cpu".to_owned(), self.cpu.clone()),
            ("mem".to_owned(), self.mem.clone()),
        ]);
        resource_slots.extend(self.slots.iter().cloned());
        NewSession {
            image: self.image.clone(),
            resource_slots,
            access_key: self.access_key.clone(),
            // A map: a later KEY wins, as `--env` promises.
            environ: self.env.iter().cloned().collect(),
            mounts: self.mounts.iter().map(Mount::spec).collect(),
            session_type: self.session_type,
            command: self.command.clone(),
            batch_timeout: self.batch_timeout,
            restart_policy: self.restart.map(|mode| NewRestartPolicy {
                mode,
                max_restarts: self.max_restarts,
                window: self.restart_window,
                backoff: self.restart_backoff,
            }),
            priority: self.priority,
            enqueue: self.no_queue.then_some(false),
            cluster_size: self.cluster_size,
            cluster_mode: self.cluster_mode,
            stop_signal: self.stop_signal.clone(),
            grace_period: self.grace_period,
            preemptible: self.preemptible,
            max_lifetime: self.max_lifetime,
            idle_timeout: self.idle_timeout,
            utilization_window: self.utilization_window,
            min_utilization: self
                .min_utilization
                .iter()
                .map(|(slot, pct)| (slot.clone(), f64::from(*pct)))
                .collect(),
        }
    }
}

/// Creates the session and prints what was created, or with `-o json` the API's JSON as it is.
pub(super) fn run(client: &Client, args: &CreateArgs, out: Output) -> Result<i32, Failure> {
    let reply = client.create_session(&args.request())?;
    let created = reply.lenient();
    let code = if args.quiet {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}", created.session_id)?;
        stdout.flush()?;
        0
    } else {
        show(out, &reply, created_fields)?
    };
    if created.status == crate::model::session::KernelStatus::Pending.as_str() {
        // On stderr, as the pull's note: stdout stays the answer.
        let why = created
            .pending_reason
            .as_ref()
            .map(|r| format!(" ({}: {})", r.code, r.message))
            .unwrap_or_default();
        eprintln!(
            "queued at position {pos}{why}; it starts when there is room \
             (kernelvisor ctl session show {id}; kernelvisor ctl session wait {id})",
            pos = created.queue_position.unwrap_or(0),
            id = created.session_id
        );
    }
    if created.status == crate::model::session::KernelStatus::Pulling.as_str() {
        // On stderr: stdout stays the answer (a pipe reading `-o json` gets only that).
        eprintln!(
            "the agent is pulling the image; the session starts when it is done \
             (progress: kernelvisor ctl session show {id}; wait for it to end: kernelvisor ctl session wait {id})",
            id = created.session_id
        );
    }
    Ok(code)
}

/// The answer of `POST /v1/sessions` (`session_id`, `kernel_id`, `agent_id`, `status`; a
/// queued session's `queue_position` and `pending_reason` too; a cluster session's size and
/// mode, and its kernels as `host@agent`, `main1` first: a queued one lists `main1` only).
fn created_fields(v: &Value) -> String {
    with(v, |c: SessionCreated| {
        let mut pairs = vec![
            ("Session", text(&c.session_id)),
            ("Kernel", text(&c.kernel_id)),
            ("Agent", text(&c.agent_id)),
            ("Status", text(&c.status)),
        ];
        if c.cluster_size > 1 {
            let mode = word(c.cluster_mode.as_ref());
            pairs.push(("Cluster", format!("{} kernels, {mode}", c.cluster_size)));
            let kernels: Vec<String> = c
                .kernels
                .iter()
                .map(|k| match k.agent_id.as_str() {
                    "" => text(&k.cluster_hostname),
                    agent => format!("{}@{agent}", text(&k.cluster_hostname)),
                })
                .collect();
            pairs.push(("Kernels", kernels.join(", ")));
        }
        if let Some(n) = c.queue_position {
            pairs.push(("Queue position", n.to_string()));
        }
        if let Some(r) = &c.pending_reason {
            pairs.push((
                "Waiting",
                format!("{}: {}", text(&r.code), text(&r.message)),
            ));
        }
        fields(&pairs)
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ctl::test_util::parse;
    use crate::ctl::{CtlCommand, SessionCommand};

    impl CreateArgs {
        /// The body as sent.
        fn to_json(&self) -> Value {
            serde_json::to_value(self.request()).unwrap()
        }
    }

    #[test]
    fn create_body() {
        let a = parse(&[
            "session",
            "create",
            "--image",
            "img:1",
            "--cpu",
            "0.5",
            "--mem",
            "256m",
            "--access-key",
            "AK",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--mount",
            "data:ro",
            "--mount",
            "scratch",
        ])
        .unwrap();
        let CtlCommand::Session(SessionCommand::Create(c)) = a.command else {
            panic!("not create")
        };
        assert_eq!(
            c.to_json(),
            json!({"image": "img:1", "resource_slots": {"cpu": "0.5", "mem": "256m"}, "access_key": "AK",
                   "environ": {"A": "1", "B": "x=y"},
                   "mounts": [{"name": "data", "permission": "ro"},
                              {"name": "scratch", "permission": "rw"}]})
        );
        let a = parse(&[
            "session",
            "create",
            "--image",
            "i",
            "--cpu",
            "1",
            "--mem",
            "1g",
            "--access-key",
            "AK",
        ])
        .unwrap();
        let CtlCommand::Session(SessionCommand::Create(c)) = a.command else {
            panic!("not create")
        };
        assert!(c.to_json().get("environ").is_none() && c.to_json().get("mounts").is_none());
        assert!(c.to_json().get("priority").is_none() && c.to_json().get("enqueue").is_none());
    }

    #[test]
    fn create_priority_and_no_queue() {
        let c = create(&["--priority", "50", "--no-queue"]).unwrap();
        assert_eq!(c.to_json()["priority"], json!(50));
        assert_eq!(c.to_json()["enqueue"], json!(false));
        for bad in ["101", "-1", "x"] {
            let e = create(&["--priority", bad]).unwrap_err().to_string();
            assert!(e.contains("--priority"), "{bad}: {e}");
        }
    }

    #[test]
    fn create_with_accelerator_slots() {
        let c = create(&[
            "--slot",
            "cuda.device=2",
            "--slot",
            "cuda.shares=0.5",
            "--slot",
            "cuda.device=1",
        ])
        .unwrap();
        assert_eq!(
            c.to_json()["resource_slots"],
            json!({"cpu": "1", "mem": "1g", "cuda.device": "1", "cuda.shares": "0.5"})
        );
        for (bad, word) in [
            ("cuda.device", "'='"),
            ("Cuda=1", "slot name"),
            ("cpu=2", "--cpu"),
            ("mem=1g", "--mem"),
            ("cuda.device=", "empty"),
        ] {
            let e = create(&["--slot", bad]).unwrap_err().to_string();
            assert!(e.contains(word), "{bad}: {e}");
        }
    }

    fn create(extra: &[&str]) -> Result<CreateArgs, clap::Error> {
        let base = [
            "session",
            "create",
            "--image",
            "i",
            "--cpu",
            "1",
            "--mem",
            "1g",
            "--access-key",
            "AK",
        ];
        match parse(&[&base[..], extra].concat())?.command {
            CtlCommand::Session(SessionCommand::Create(c)) => Ok(*c),
            other => panic!("not create: {other:?}"),
        }
    }

    #[test]
    fn create_restart_policy() {
        let c = create(&[
            "--restart",
            "on-failure",
            "--max-restarts",
            "2",
            "--restart-backoff",
            "0.5",
        ])
        .unwrap();
        assert_eq!(
            c.to_json()["restart_policy"],
            json!({"mode": "on-failure", "max_restarts": 2, "backoff": 0.5})
        );
        assert_eq!(
            create(&["--restart", "always", "--restart-window", "30"])
                .unwrap()
                .to_json()["restart_policy"],
            json!({"mode": "always", "window": 30})
        );
        assert!(create(&[])
            .unwrap()
            .to_json()
            .get("restart_policy")
            .is_none());
        assert!(
            create(&["--max-restarts", "2"]).is_err(),
            "limits need --restart"
        );
        assert!(create(&["--restart", "sometimes"]).is_err());
    }

    #[test]
    fn create_batch_body() {
        let c = create(&[
            "--type",
            "batch",
            "--command",
            "python train.py > out.txt",
            "--batch-timeout",
            "3600",
        ])
        .unwrap();
        assert_eq!(c.session_type, Some(SessionType::Batch));
        assert_eq!(
            c.to_json(),
            json!({"image": "i", "resource_slots": {"cpu": "1", "mem": "1g"}, "access_key": "AK",
                   "type": "batch", "command": "python train.py > out.txt", "batch_timeout": 3600})
        );
        assert_eq!(
            create(&[
                "--type",
                "batch",
                "--command",
                "x",
                "--batch-timeout",
                "1.5"
            ])
            .unwrap()
            .to_json()["batch_timeout"],
            json!(1.5)
        );
        // An interactive session may replace the image's command; the type is sent when given.
        let body = create(&["--command", "sleep infinity"]).unwrap().to_json();
        assert_eq!(
            (body.get("type"), &body["command"]),
            (None, &json!("sleep infinity"))
        );
        assert_eq!(
            create(&["--type", "interactive"]).unwrap().to_json()["type"],
            "interactive"
        );
        assert!(create(&[]).unwrap().to_json().get("command").is_none());
    }

    #[test]
    fn batch_without_command_is_a_usage_error() {
        let err = create(&["--type", "batch"]).err().unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--command <SHELL>"), "{err}");
        let err = create(&["--type", "cron", "--command", "x"]).err().unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
        let err = create(&["--batch-timeout=-5"]).err().unwrap();
        assert!(
            err.to_string()
                .contains("expected a non-negative number of seconds"),
            "{err}"
        );
        assert!(
            create(&["--batch-timeout", "0"]).is_err(),
            "the manager wants a positive batch_timeout"
        );
    }

    // Idle reclaim.
    #[test]
    fn reclaim_flags_go_into_the_body() {
        let c = create(&[
            "--idle-timeout",
            "600",
            "--max-lifetime",
            "3600",
            "--min-utilization",
            "cpu=5",
            "--min-utilization",
            "cuda.device=10",
            "--utilization-window",
            "0.5",
        ])
        .unwrap();
        let v = c.to_json();
        assert_eq!(v["idle_timeout"], json!(600));
        assert_eq!(v["max_lifetime"], json!(3600));
        assert_eq!(v["utilization_window"], json!(0.5));
        assert_eq!(
            v["min_utilization"],
            json!({"cpu": 5.0, "cuda.device": 10.0})
        );
        // None given: none sent (the key's and the manager's defaults apply).
        let v = create(&[]).unwrap().to_json();
        for field in [
            "idle_timeout",
            "max_lifetime",
            "utilization_window",
            "min_utilization",
        ] {
            assert!(v.get(field).is_none(), "{field}: {v}");
        }
        // Bad values are usage errors, with `access-key set-reclaim`'s words.
        let text = create(&["--min-utilization", "cpu"])
            .err()
            .unwrap()
            .to_string();
        assert!(text.contains("expected SLOT=PERCENT"), "{text}");
        let err = create(&["--idle-timeout", "0"]).err().unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
    }

    #[test]
    fn malformed_env_and_mount_are_usage_errors() {
        let err = create(&["--env", "NOEQUALS"]).err().unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        let text = err.to_string();
        assert!(
            text.contains("NOEQUALS") && text.contains("expected KEY=VALUE"),
            "{text}"
        );
        let text = create(&["--mount", "data=/vfroot/data"])
            .err()
            .unwrap()
            .to_string();
        assert!(text.contains("expected NAME[:ro|:rw]"), "{text}");
        assert!(
            parse(&["session", "create", "--image", "i"]).is_err(),
            "cpu/mem are required"
        );
    }

    #[test]
    fn create_without_access_key_and_with_one() {
        let a = parse(&[
            "session", "create", "--image", "i", "--cpu", "1", "--mem", "1g", "--mount", "d:ro",
        ])
        .unwrap();
        let CtlCommand::Session(SessionCommand::Create(c)) = a.command else {
            panic!("not create")
        };
        assert_eq!(
            c.to_json(),
            json!({"image": "i", "resource_slots": {"cpu": "1", "mem": "1g"},
                   "mounts": [{"name": "d", "permission": "ro"}]})
        );
        assert_eq!(create(&[]).unwrap().to_json()["access_key"], "AK");
    }

    #[test]
    fn created_lines() {
        assert_eq!(
            created_fields(
                &json!({"session_id": "s", "kernel_id": "k", "agent_id": "a", "status": "RUNNING"})
            ),
            "Session: s\nKernel:  k\nAgent:   a\nStatus:  RUNNING\n"
        );
        let kernel = |host: &str, agent: &str| json!({"cluster_hostname": host, "agent_id": agent});
        let cluster = json!({"session_id": "s", "kernel_id": "k", "agent_id": "a", "status": "RUNNING",
                             "cluster_size": 3, "cluster_mode": "multi-node",
                             "kernels": [kernel("main1", "a"), kernel("sub1", "b"), kernel("sub2", "c")]});
        assert_eq!(
            created_fields(&cluster),
            "Session: s\nKernel:  k\nAgent:   a\nStatus:  RUNNING\nCluster: 3 kernels, multi-node\n\
             Kernels: main1@a, sub1@b, sub2@c\n"
        );
        let mut queued = cluster.clone();
        queued["kernels"] = json!([kernel("main1", "")]);
        assert!(
            created_fields(&queued).ends_with("Kernels: main1\n"),
            "{}",
            created_fields(&queued)
        );
    }
}
