//! `session ls`: list a directory of a session (`GET /v1/sessions/{id}/files?dir=PATH`).

use std::io::Write;

use clap::Args;
use serde_json::Value;

use crate::ctl::format::file_mode;
use crate::ctl::render::{opt, table, text, utc, with};
use crate::ctl::{parse, show_to, Client, Failure, Output};
use crate::model::file::FileList;

/// Arguments of `kernelvisor ctl session ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Session id (UUID).
    pub id: String,
    /// Directory relative to /home/work [default: /home/work itself].
    #[arg(value_parser = parse::session_path)]
    pub path: Option<String>,
    /// List it in this kernel of a cluster session: its host name (main1, sub1, …) or kernel
    /// id [default: the main kernel].
    #[arg(long, value_name = "KERNEL")]
    pub kernel: Option<String>,
}

/// `session ls` (in session `id`'s kernel `kernel`, else the main one).
pub(super) fn ls(
    client: &Client,
    id: &str,
    kernel: Option<&str>,
    dir: &str,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    let dir = dir.trim_end_matches('/');
    let reply = client.files(id, kernel, dir)?;
    show_to(out, &reply, files, stdout)
}

/// `GET /v1/sessions/{id}/files` (`{"files": [...]}`) as a table sorted by name: MODE (as
/// `ls -l`: `drwxr-xr-x`), SIZE (bytes), MTIME (UTC), NAME (a directory's with a trailing `/`).
fn files(v: &Value) -> String {
    with(v, |mut list: FileList| {
        list.files.sort_by(|a, b| a.name.cmp(&b.name));
        let rows = list
            .files
            .iter()
            .map(|f| {
                let kind = f.file_type.as_deref();
                let mut shown = text(&f.name);
                if kind == Some("dir") {
                    shown.push('/');
                }
                vec![
                    file_mode(kind, f.mode.as_deref()),
                    opt(f.size),
                    utc(f.mtime),
                    shown,
                ]
            })
            .collect();
        table(vec!["MODE", "SIZE", "MTIME", "NAME"], rows)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::format;
    use crate::ctl::render::tests::{cells, NOW};
    use crate::ctl::test_util::text;
    use crate::ctl::testserver::{Answer, Server};
    use serde_json::json;

    #[test]
    fn ls_table_sorted_and_dir_encoded() {
        let body = r#"{"files": [
            {"name": "zeta.txt", "type": "file", "size": 12, "mode": "0644", "mtime": 1700000000.0},
            {"name": "data", "type": "dir", "size": 4096, "mode": "0755", "mtime": 1700000060.5},
            {"name": "b.py", "type": "file", "size": 0, "mode": "0600", "mtime": 1699999999}
        ]}"#;
        let server = Server::start(vec![
            Answer::json(200, body),
            Answer::json(200, body),
            Answer::json(200, r#"{"files": []}"#),
        ]);
        let client = Client::new(&server.url).unwrap();
        let mut out = Vec::new();
        ls(
            &client,
            "S",
            None,
            "sub dir/a&b=ü/",
            Output::Table,
            &mut out,
        )
        .unwrap();
        let table = text(out);
        let rows: Vec<Vec<&str>> = table.lines().map(cells).collect();
        assert_eq!(
            rows,
            [
                vec!["MODE", "SIZE", "MTIME", "NAME"],
                vec!["-rw-------", "0", "2023-11-14T22:13:19Z", "b.py"],
                vec!["drwxr-xr-x", "4096", "2023-11-14T22:14:20Z", "data/"],
                vec!["-rw-r--r--", "12", "2023-11-14T22:13:20Z", "zeta.txt"],
            ]
        );
        let mut out = Vec::new();
        ls(&client, "S", None, "", Output::Json, &mut out).unwrap();
        assert_eq!(text(out), format::pretty_json(body) + "\n");
        let mut out = Vec::new();
        ls(&client, "S", None, "", Output::Table, &mut out).unwrap();
        assert_eq!(text(out), "MODE  SIZE  MTIME  NAME\n");
        let requests = server.requests();
        assert_eq!(
            requests[0].line,
            "GET /v1/sessions/S/files?dir=sub+dir%2Fa%26b%3D%C3%BC"
        );
        assert_eq!(requests[1].line, "GET /v1/sessions/S/files?dir=");
    }

    /// `--kernel` lists the directory in that kernel of a cluster session.
    #[test]
    fn ls_in_a_kernel() {
        let server = Server::start(vec![Answer::json(200, r#"{"files": []}"#)]);
        let client = Client::new(&server.url).unwrap();
        let mut out = Vec::new();
        ls(&client, "S", Some("sub1"), "data/", Output::Table, &mut out).unwrap();
        assert_eq!(
            server.requests()[0].line,
            "GET /v1/sessions/S/files?dir=data&kernel=sub1"
        );
    }

    #[test]
    fn files_table_sorted_with_dirs_marked() {
        let v = json!({"files": [
            {"name": "b.txt", "type": "file", "size": 12, "mode": "0644", "mtime": NOW},
            {"name": "a", "type": "dir", "size": 4096, "mode": "0755", "mtime": NOW - 60.5},
            {"name": "link", "type": "symlink", "size": 5, "mode": "0777", "mtime": NOW}
        ]});
        let out = files(&v);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(cells(lines[0]), ["MODE", "SIZE", "MTIME", "NAME"]);
        assert_eq!(
            cells(lines[1]),
            ["drwxr-xr-x", "4096", "2023-11-14T22:12:19Z", "a/"]
        );
        assert_eq!(
            cells(lines[2]),
            ["-rw-r--r--", "12", "2023-11-14T22:13:20Z", "b.txt"]
        );
        assert_eq!(cells(lines[3])[3], "link");
        assert_eq!(lines.len(), 4);
        assert!(files(&json!({"files": []})).starts_with("MODE"));
    }
}
