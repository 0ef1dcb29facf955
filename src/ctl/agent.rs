//! `agents`: the agents the manager knows, with their scheduling, slots, kernels and last
//! heartbeat (`GET /v1/agents`); `agent purge-images`: remove images from one agent (`POST
//! /v1/agents/{id}/images/purge`); `agent cordon`, `uncordon` and `drain [--deadline SECS]`
//! (`POST /v1/agents/{id}/cordon|uncordon|drain`).

use std::io::Write;

use clap::{Args, Subcommand};

use super::client::read;
use super::{render, show, unix_now, Client, Failure, Output};
use crate::model::agent::{Agent, DrainRequest};
use crate::model::image::{PurgeImagesRequest, PurgedImages};

/// Lists the agents: a table, or with `-o json` the API's JSON as it is.
pub(super) fn run(client: &Client, out: Output) -> Result<i32, Failure> {
    let now = unix_now();
    show(out, &client.agents()?, |v| render::agents(v, now))
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
    let state = match render::scheduling(&a, now).as_str() {
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

#[cfg(test)]
mod tests {
    use super::*;
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
}
