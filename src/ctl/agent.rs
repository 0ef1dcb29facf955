//! `agents`: the agents the manager knows, with their slots, kernels and last heartbeat
//! (`GET /v1/agents`); `agent purge-images`: remove images from one agent (`POST
//! /v1/agents/{id}/images/purge`).

use std::io::Write;

use clap::{Args, Subcommand};
use serde_json::json;

use super::client::segment;
use super::{render, show, unix_now, Client, Failure, Output};
use crate::model::image::PurgedImages;

/// Lists the agents: a table, or with `-o json` the API's JSON as it is.
pub(super) fn run(client: &Client, out: Output) -> Result<i32, Failure> {
    let now = unix_now();
    show(out, &client.get("/v1/agents", &[])?, |v| {
        render::agents(v, now)
    })
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
    let p: PurgedImages = render::lenient(v);
    let width = p.images.iter().map(|i| i.image.len()).max().unwrap_or(0);
    p.images
        .iter()
        .map(|i| match &i.error {
            None => format!("{:<width$}  removed\n", i.image),
            Some(e) => format!("{:<width$}  not removed: {e}\n", i.image),
        })
        .collect()
}

/// Runs one `agent …` command.
pub(super) fn run_command(
    client: &Client,
    command: &AgentCommand,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    match command {
        AgentCommand::PurgeImages(args) => {
            let body =
                json!({"images": args.images, "force": args.force, "noprune": args.no_prune});
            let path = format!("/v1/agents/{}/images/purge", segment(&args.id));
            let reply = client.post(&path, &body, None)?;
            super::show_to(out, &reply, purged, stdout)?;
            let p: PurgedImages = render::lenient(&reply.json);
            Ok(i32::from(p.images.iter().any(|i| !i.removed)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::test_util::{parse, text};
    use crate::ctl::testserver::{Answer, Server};
    use crate::ctl::CtlCommand;

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
