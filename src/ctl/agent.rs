//! `agents`: the agents the manager knows, with their scheduling, slots, kernels and last
//! heartbeat (`GET /v1/agents`); `agent purge-images`: remove images from one agent (`POST
//! /v1/agents/{id}/images/purge`); `agent cordon`, `uncordon` and `drain [--deadline SECS]`
//! (`POST /v1/agents/{id}/cordon|uncordon|drain`).

use std::collections::BTreeMap;
use std::io::Write;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::client::read;
use super::format::{ago, bytes, cores, duration};
use super::render::{extra_slots, num, opt, slot, slot_label, table, text, with};
use super::{show, unix_now, Client, Failure, Output};
use crate::model::agent::{Agent, AgentList, DrainRequest};
use crate::model::image::{PurgeImagesRequest, PurgedImages};

/// Lists the agents: a table, or with `-o json` the API's JSON as it is.
pub(super) fn run(client: &Client, out: Output) -> Result<i32, Failure> {
    let now = unix_now();
    show(out, &client.agents()?, |v| agents(v, now))
}

/// `kernelvisor ctl agent …` (admin).
#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Remove images from an agent, as `docker rmi` does (POST /v1/agents/{id}/images/purge).
    ///
    /// Prints each image's outcome; exits 1 when one was not removed. An image a kernel of the
    /// agent runs is refused (naming the kernels) unless --force, which then removes only its
    /// tag while the kernel runs.
    PurgeImages(PurgeImagesArgs),
    /// Stop placing new sessions on an agent; its sessions keep running (POST
    /// /v1/agents/{id}/cordon). Backend.AI's `schedulable = false`.
    Cordon {
        /// Agent id.
        id: String,
    },
    /// Place sessions on an agent again, ending a drain (POST /v1/agents/{id}/uncordon);
    /// queued sessions that fit are placed at once.
    Uncordon {
        /// Agent id.
        id: String,
    },
    /// Cordon an agent and let its sessions end (POST /v1/agents/{id}/drain); with --deadline,
    /// the sessions still there after SECS seconds are terminated (reason `agent-drained`).
    /// The agent stays cordoned afterwards, until `agent uncordon`.
    Drain(DrainArgs),
}

/// Arguments of `kernelvisor ctl agent drain`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// Agent id.
    pub id: String,
    /// Seconds from now after which its remaining sessions are terminated (above 0, decimals
    /// allowed); none by default: they end by themselves.
    #[arg(long, value_name = "SECS", value_parser = super::parse::positive_seconds)]
    pub deadline: Option<f64>,
}

/// Arguments of `kernelvisor ctl agent purge-images`.
#[derive(Debug, Args)]
pub struct PurgeImagesArgs {
    /// Agent id.
    pub id: String,
    /// Images: references (`repo:tag`, `host/repo:tag`) or ids (`sha256:…`).
    #[arg(required = true, num_args = 1..)]
    pub images: Vec<String>,
    /// Remove also images stopped containers use or that have other tags.
    #[arg(long)]
    pub force: bool,
    /// Keep the images' untagged parents.
    #[arg(long)]
    pub no_prune: bool,
}

/// `IMAGE  removed` / `IMAGE  not removed: why` lines.
fn purged(v: &serde_json::Value) -> String {
    let p: PurgedImages = read(v).unwrap_or_default();
    let width = p.images.iter().map(|i| i.image.len()).max().unwrap_or(0);
    p.images
        .iter()
        .map(|i| match &i.error {
            None => format!("{:<width$}  removed\n", i.image),
            Some(e) => format!("{:<width$}  not removed: {e}\n", i.image),
        })
        .collect()
}

/// The one line confirming a cordon, uncordon or drain, from the agent the API answered.
fn scheduled(v: &serde_json::Value, now: f64) -> String {
    let a: Agent = read(v).unwrap_or_default();
    let state = match scheduling(&a, now).as_str() {
        "yes" => "schedulable: new sessions may be placed on it".to_owned(),
        "cordoned" => "cordoned: no new sessions are placed on it".to_owned(),
        "draining" => {
            "draining: no new sessions; its sessions end by themselves (no deadline)".to_owned()
        }
        other => format!(
            "{other}: no new sessions; the remaining ones are terminated then (agent-drained)"
        ),
    };
    format!("agent {} {state}\n", a.agent_id)
}

/// Runs one `agent …` command.
pub(super) fn run_command(
    client: &Client,
    command: &AgentCommand,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    let answer = match command {
        AgentCommand::PurgeImages(args) => {
            let request = PurgeImagesRequest {
                images: args.images.clone(),
                force: args.force,
                noprune: args.no_prune,
            };
            let answer = client.purge_images(&args.id, &request)?;
            super::show_to(out, &answer, purged, stdout)?;
            return Ok(i32::from(
                answer.lenient().images.iter().any(|i| !i.removed),
            ));
        }
        AgentCommand::Cordon { id } => client.cordon(id)?,
        AgentCommand::Uncordon { id } => client.uncordon(id)?,
        AgentCommand::Drain(args) => client.drain(
            &args.id,
            &DrainRequest {
                deadline: args.deadline,
            },
        )?,
    };
    // The agent's new scheduling.
    let now = unix_now();
    super::show_to(out, &answer, |v| scheduled(v, now), stdout)
}

/// An amount of slot `name`: bytes in binary units when `types` (or the built-in `mem`) says
/// `bytes`, else a count.
fn slot_amount(types: &BTreeMap<String, String>, name: &str, v: Option<&Value>) -> String {
    let ty = types.get(name).map(String::as_str);
    if ty == Some("bytes") || (ty.is_none() && name == "mem") {
        bytes(v)
    } else {
        cores(v)
    }
}

/// Whether an agent takes new sessions: `yes`, `cordoned`, `draining`, `draining (deadline in
/// 42s)` or `draining (deadline passed)` (its sessions are being terminated).
pub fn scheduling(a: &Agent, now: f64) -> String {
    match (a.schedulable, a.draining, a.drain_deadline) {
        (_, true, Some(d)) if d > now => format!("draining (deadline in {})", duration(d - now)),
        (_, true, Some(_)) => "draining (deadline passed)".to_owned(),
        (_, true, None) => "draining".to_owned(),
        (true, false, _) => "yes".to_owned(),
        (false, false, _) => "cordoned".to_owned(),
    }
}

/// `GET /v1/agents` (`{"agents": [...]}`) as a table: AGENT, STATUS, SCHEDULING (see
/// [`scheduling`]), ADDR, CPU and MEM as used/total, one used/total column per accelerator
/// slot some agent has (`GPU` for `cuda.device`, else the slot name in capitals:
/// `CUDA.SHARES`), KERNELS, LAST HEARTBEAT.
fn agents(v: &Value, now: f64) -> String {
    with(v, |list: AgentList| {
        let extra = extra_slots(list.agents.iter().map(|a| &a.slots_total));
        let labels: Vec<String> = extra.iter().map(|n| slot_label(n)).collect();
        let mut header = vec!["AGENT", "STATUS", "SCHEDULING", "ADDR", "CPU", "MEM"];
        header.extend(labels.iter().map(String::as_str));
        header.extend(["KERNELS", "LAST HEARTBEAT"]);
        let rows = list
            .agents
            .iter()
            .map(|a| {
                let used_total = |f: fn(Option<&Value>) -> String, name: &str| {
                    format!(
                        "{}/{}",
                        f(slot(&a.slots_used, name).as_ref()),
                        f(slot(&a.slots_total, name).as_ref())
                    )
                };
                let mut row = vec![
                    text(&a.agent_id),
                    text(&a.status),
                    scheduling(a, now),
                    opt(a.addr.as_ref()),
                ];
                row.push(used_total(cores, "cpu"));
                row.push(used_total(bytes, "mem"));
                for name in &extra {
                    row.push(format!(
                        "{}/{}",
                        slot_amount(&a.slot_types, name, slot(&a.slots_used, name).as_ref()),
                        slot_amount(&a.slot_types, name, slot(&a.slots_total, name).as_ref())
                    ));
                }
                row.push(opt(a.kernels));
                row.push(ago(a.last_heartbeat.map(num).as_ref(), now));
                row
            })
            .collect();
        table(header, rows)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::render::tests::NOW;
    use crate::ctl::test_util::{parse, text};
    use crate::ctl::testserver::{Answer, Server};
    use crate::ctl::CtlCommand;
    use serde_json::json;

    #[test]
    fn cordon_uncordon_and_drain_post_and_confirm_in_one_line() {
        assert!(
            parse(&["agent", "drain", "A1", "--deadline", "0"]).is_err(),
            "a deadline is above 0"
        );
        assert!(parse(&["agent", "drain", "A1", "--deadline", "soon"]).is_err());
        assert!(parse(&["agent", "cordon"]).is_err(), "ID is required");
        let agent = |schedulable: bool, draining: bool, deadline: Option<f64>| {
            json!({"agent_id": "A1", "status": "ALIVE", "schedulable": schedulable,
                   "draining": draining, "drain_deadline": deadline})
            .to_string()
        };
        let far = unix_now() + 3600.0 * 5.0;
        let server = Server::start(vec![
            Answer::json(200, agent(false, false, None)),
            Answer::json(200, agent(true, false, None)),
            Answer::json(200, agent(false, true, None)),
            Answer::json(200, agent(false, true, Some(far))),
        ]);
        let client = Client::new(&server.url).unwrap();
        let run = |args: &[&str]| {
            let a = parse(args).unwrap();
            let CtlCommand::Agent(command) = a.command else {
                panic!("{:?}", a.command)
            };
            let mut out = Vec::new();
            let code = run_command(&client, &command, Output::Table, &mut out).unwrap();
            (code, text(out))
        };
        assert_eq!(
            run(&["agent", "cordon", "A1"]),
            (
                0,
                "agent A1 cordoned: no new sessions are placed on it\n".to_owned()
            )
        );
        assert_eq!(
            run(&["agent", "uncordon", "A1"]).1,
            "agent A1 schedulable: new sessions may be placed on it\n"
        );
        assert_eq!(
            run(&["agent", "drain", "A1"]).1,
            "agent A1 draining: no new sessions; its sessions end by themselves (no deadline)\n"
        );
        let (code, line) = run(&["agent", "drain", "A1", "--deadline", "18000"]);
        assert_eq!(code, 0);
        assert!(
            line.starts_with("agent A1 draining (deadline in 4h)")
                || line.starts_with("agent A1 draining (deadline in 5h)"),
            "{line}"
        );
        let requests = server.requests();
        let lines: Vec<&str> = requests.iter().map(|r| r.line.as_str()).collect();
        for (r, path) in lines.iter().zip([
            "POST /v1/agents/A1/cordon",
            "POST /v1/agents/A1/uncordon",
            "POST /v1/agents/A1/drain",
            "POST /v1/agents/A1/drain",
        ]) {
            assert!(r.starts_with(path), "{r}");
        }
        let body = |i: usize| serde_json::from_str::<serde_json::Value>(&requests[i].body).unwrap();
        assert_eq!(body(2), json!({}));
        assert_eq!(body(3), json!({"deadline": 18000}));
    }

    #[test]
    fn purge_images_prints_each_outcome_and_fails_when_one_stays() {
        let a = parse(&["agent", "purge-images", "A1", "a:1", "b:2", "--force"]).unwrap();
        let CtlCommand::Agent(command) = a.command else {
            panic!("{:?}", a.command)
        };
        assert!(
            matches!(&command, AgentCommand::PurgeImages(p) if p.force && !p.no_prune && p.images == ["a:1", "b:2"])
        );
        assert!(
            parse(&["agent", "purge-images", "A1"]).is_err(),
            "IMAGE is required"
        );
        let answer = r#"{"agent_id": "A1", "images": [
            {"image": "a:1", "removed": true, "error": null},
            {"image": "b:2", "removed": false, "error": "image b:2 is in use by kernel(s) k1"}]}"#;
        let server = Server::start(vec![Answer::json(200, answer)]);
        let client = Client::new(&server.url).unwrap();
        let mut out = Vec::new();
        assert_eq!(
            run_command(&client, &command, Output::Table, &mut out).unwrap(),
            1
        );
        assert_eq!(
            text(out),
            "a:1  removed\nb:2  not removed: image b:2 is in use by kernel(s) k1\n"
        );
        let requests = server.requests();
        assert!(
            requests[0]
                .line
                .starts_with("POST /v1/agents/A1/images/purge"),
            "{}",
            requests[0].line
        );
        let body: serde_json::Value = serde_json::from_str(&requests[0].body).unwrap();
        assert_eq!(
            body,
            json!({"images": ["a:1", "b:2"], "force": true, "noprune": false})
        );
    }

    #[test]
    fn scheduling_words() {
        let agent = |schedulable, draining, drain_deadline| Agent {
            schedulable,
            draining,
            drain_deadline,
            ..Agent::default()
        };
        assert_eq!(scheduling(&agent(true, false, None), NOW), "yes");
        assert_eq!(scheduling(&agent(false, false, None), NOW), "cordoned");
        assert_eq!(scheduling(&agent(false, true, None), NOW), "draining");
        assert_eq!(
            scheduling(&agent(false, true, Some(NOW + 90.0)), NOW),
            "draining (deadline in 1m)"
        );
        assert_eq!(
            scheduling(&agent(false, true, Some(NOW - 1.0)), NOW),
            "draining (deadline passed)"
        );
    }

    #[test]
    fn agents_table() {
        let v = json!({"agents": [
            {"agent_id": "i-node1", "status": "ALIVE", "addr": "tcp://10.0.0.5:6001", "region": "local",
             "version": "0.1.0", "slots_total": {"cpu": "8", "mem": "17179869184", "cuda.device": "0"},
             "slots_used": {"cpu": "1.500", "mem": "1610612736", "cuda.device": "0"},
             "kernels": 2, "last_heartbeat": NOW - 3.2, "schedulable": true, "draining": false,
             "drain_deadline": null},
            {"agent_id": "i-node2", "status": "PENDING", "addr": "tcp://10.0.0.6:6001",
             "slots_total": {"cpu": "4", "mem": "8589934592"}, "slots_used": {}, "kernels": 0,
             "last_heartbeat": null, "schedulable": false, "draining": true,
             "drain_deadline": NOW + 42.5}
        ]});
        let out = agents(&v, NOW);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        for h in [
            "AGENT",
            "STATUS",
            "SCHEDULING",
            "ADDR",
            "CPU",
            "MEM",
            "KERNELS",
            "LAST HEARTBEAT",
        ] {
            assert!(lines[0].contains(h), "missing {h}: {out}");
        }
        assert!(
            !lines[0].contains("GPU"),
            "no GPU column without GPUs: {out}"
        );
        assert!(
            !out.contains('|') && !out.contains('─'),
            "borderless: {out}"
        );
        let row1: Vec<&str> = lines[1]
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            row1,
            [
                "i-node1",
                "ALIVE",
                "yes",
                "tcp://10.0.0.5:6001",
                "1.5/8",
                "1.5 GiB/16 GiB",
                "2",
                "3s ago"
            ]
        );
        let row2: Vec<&str> = lines[2]
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            row2,
            [
                "i-node2",
                "PENDING",
                "draining (deadline in 42s)",
                "tcp://10.0.0.6:6001",
                "-/4",
                "-/8 GiB",
                "0",
                "-"
            ]
        );
        // Columns line up: every value starts where its header does.
        let col = lines[0].find("LAST HEARTBEAT").unwrap();
        assert_eq!(&lines[1][col..], "3s ago");
        assert!(
            lines.iter().all(|l| l == &l.trim_end()),
            "no trailing spaces: {out:?}"
        );
    }

    #[test]
    fn agents_gpu_column_when_present() {
        let v = json!({"agents": [{"agent_id": "g1", "status": "ALIVE", "addr": "a",
            "slots_total": {"cpu": "8", "mem": "1024", "cuda.device": "2"},
            "slots_used": {"cpu": "0", "mem": "0", "cuda.device": "1"}, "kernels": 1, "last_heartbeat": NOW - 90.0}]});
        let out = agents(&v, NOW);
        assert!(out.lines().next().unwrap().contains("GPU"), "{out}");
        assert!(
            out.contains("1/2") && out.contains("0 B/1 KiB") && out.contains("1m ago"),
            "{out}"
        );
    }

    #[test]
    fn agents_one_column_per_accelerator_slot() {
        let v = json!({"agents": [
            {"agent_id": "m1", "status": "ALIVE", "addr": "a",
             "slots_total": {"cpu": "8", "mem": "1024", "cuda.shares": "4", "npu.mem": "2147483648"},
             "slots_used": {"cpu": "1", "mem": "0", "cuda.shares": "1.25", "npu.mem": "1073741824"},
             "slot_types": {"cpu": "count", "mem": "bytes", "cuda.shares": "count", "npu.mem": "bytes"},
             "kernels": 2, "last_heartbeat": NOW},
            {"agent_id": "plain", "status": "ALIVE", "addr": "b",
             "slots_total": {"cpu": "4", "mem": "1024", "cuda.device": "0"},
             "slots_used": {"cpu": "0", "mem": "0", "cuda.device": "0"}, "kernels": 0,
             "last_heartbeat": NOW}
        ]});
        let out = agents(&v, NOW);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].contains("CUDA.SHARES") && lines[0].contains("NPU.MEM"),
            "{out}"
        );
        // No agent has a GPU: no GPU column.
        assert!(!lines[0].contains("GPU"), "{out}");
        assert!(
            lines[1].contains("1.25/4") && lines[1].contains("1 GiB/2 GiB"),
            "{out}"
        );
        // An agent without the slot shows `-/-`.
        assert!(lines[2].contains("-/-"), "{out}");
    }

    #[test]
    fn empty_list_still_has_its_header() {
        assert!(agents(&json!({"agents": []}), NOW).starts_with("AGENT"));
    }
}
