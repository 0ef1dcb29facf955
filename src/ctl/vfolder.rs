//! `vfolder …`: create, list and delete the caller's vfolders (`/v1/vfolders`), the storage
//! folders `session create --mount NAME[:ro|:rw]` mounts into a session.

use std::io::Write;

use clap::Subcommand;
use serde_json::Value;

use super::client::Client;
use super::render::{fields, table, text, utc, with};
use super::{show_to, Failure, Output};
use crate::model::vfolder::{NewVfolder, Vfolder, VfolderList};

/// `kernelvisor ctl vfolder …`.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum VfolderCommand {
    /// Create a vfolder owned by the token's access key (POST /v1/vfolders).
    Create {
        /// Its name, as `session create --mount NAME` will name it.
        name: String,
    },
    /// List the token's vfolders (GET /v1/vfolders).
    List {
        /// Every key's vfolders (admin tokens only).
        #[arg(long)]
        all: bool,
    },
    /// Delete a vfolder (DELETE /v1/vfolders/{name}).
    Delete {
        /// The vfolder's name.
        name: String,
    },
}

/// Runs one `vfolder` command and prints its answer to `stdout` (a table, or with `-o json`
/// the API's JSON as it is).
pub(super) fn run(
    client: &Client,
    command: &VfolderCommand,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    match command {
        VfolderCommand::Create { name } => show_to(
            out,
            &client.create_vfolder(&NewVfolder { name: name.clone() })?,
            vfolder,
            stdout,
        ),
        VfolderCommand::List { all } => show_to(out, &client.vfolders(*all)?, vfolders, stdout),
        VfolderCommand::Delete { name } => show_to(
            out,
            &client.delete_vfolder(name)?,
            |v| vfolder_deleted(v, name),
            stdout,
        ),
    }
}

/// One vfolder (`{"name", "owner", "created_at"}`: the answer of `POST /v1/vfolders`) as
/// `key: value` lines, the creation time in UTC.
fn vfolder(v: &Value) -> String {
    with(v, |f: Vfolder| {
        fields(&[
            ("Vfolder", text(&f.name)),
            ("Owner", text(&f.owner)),
            ("Created", utc(f.created_at)),
        ])
    })
}

/// `GET /v1/vfolders` (`{"vfolders": [...]}`) as a table: NAME, OWNER (an access key),
/// CREATED (UTC).
fn vfolders(v: &Value) -> String {
    with(v, |list: VfolderList| {
        let rows = list
            .vfolders
            .iter()
            .map(|f| vec![text(&f.name), text(&f.owner), utc(f.created_at)])
            .collect();
        table(vec!["NAME", "OWNER", "CREATED"], rows)
    })
}

/// The answer of `DELETE /v1/vfolders/{name}`: `vfolder NAME deleted` (the name of the answer
/// when it has one, else `name`).
fn vfolder_deleted(v: &Value, name: &str) -> String {
    with(v, |f: Vfolder| {
        let name = if f.name.is_empty() { name } else { &f.name };
        format!("vfolder {name} deleted\n")
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::ctl::render::tests::NOW;
    use crate::ctl::test_util::{parse, text};
    use crate::ctl::testserver::{Answer, Server};
    use crate::ctl::CtlCommand;

    #[test]
    fn vfolder_commands_send_their_requests() {
        let folder = r#"{"name": "data", "owner": "AKUSER", "created_at": 1700000000.0}"#;
        let server = Server::start(vec![
            Answer::json(201, folder),
            Answer::json(200, format!(r#"{{"vfolders": [{folder}]}}"#)),
            Answer::json(200, r#"{"vfolders": []}"#),
            Answer::json(200, folder),
            Answer::bytes(204, "application/json", Vec::new()),
            Answer::bytes(204, "application/json", Vec::new()),
        ]);
        let client = Client::new(&server.url).unwrap();
        let run = |args: &[&str], out: Output| {
            let command = match parse(&[&["vfolder"][..], args].concat()).unwrap().command {
                CtlCommand::Vfolder(c) => c,
                other => panic!("{other:?}"),
            };
            let mut stdout = Vec::new();
            assert_eq!(super::run(&client, &command, out, &mut stdout).unwrap(), 0);
            text(stdout)
        };
        assert_eq!(
            run(&["create", "data"], Output::Table),
            "Vfolder: data\nOwner:   AKUSER\nCreated: 2023-11-14T22:13:20Z\n"
        );
        assert_eq!(
            run(&["list"], Output::Table),
            "NAME  OWNER   CREATED\ndata  AKUSER  2023-11-14T22:13:20Z\n"
        );
        assert_eq!(
            run(&["list", "--all"], Output::Table),
            "NAME  OWNER  CREATED\n"
        );
        assert_eq!(
            run(&["delete", "data"], Output::Table),
            "vfolder data deleted\n"
        );
        // An answer without a body: the table names the folder, JSON prints nothing.
        assert_eq!(
            run(&["delete", "my data"], Output::Table),
            "vfolder my data deleted\n"
        );
        assert_eq!(run(&["delete", "x"], Output::Json), "");
        let requests = server.requests();
        assert_eq!(requests[0].line, "POST /v1/vfolders");
        assert_eq!(
            serde_json::from_str::<Value>(&requests[0].body).unwrap(),
            json!({"name": "data"})
        );
        assert_eq!(requests[1].line, "GET /v1/vfolders");
        assert_eq!(requests[2].line, "GET /v1/vfolders?all=true");
        assert_eq!(requests[3].line, "DELETE /v1/vfolders/data");
        assert_eq!(requests[4].line, "DELETE /v1/vfolders/my%20data");
        assert!(
            requests.iter().all(|r| r.header("authorization").is_none()),
            "no token, no Authorization header"
        );
    }

    #[test]
    fn vfolders_shown() {
        let folder = json!({"name": "data", "owner": "AKUSER1", "created_at": NOW});
        assert_eq!(
            vfolder(&folder),
            "Vfolder: data\nOwner:   AKUSER1\nCreated: 2023-11-14T22:13:20Z\n"
        );
        assert_eq!(
            vfolders(&json!({"vfolders": [folder]})),
            "NAME  OWNER    CREATED\ndata  AKUSER1  2023-11-14T22:13:20Z\n"
        );
        assert_eq!(vfolders(&json!({"vfolders": []})), "NAME  OWNER  CREATED\n");
        assert_eq!(vfolder_deleted(&Value::Null, "d"), "vfolder d deleted\n");
    }
}
