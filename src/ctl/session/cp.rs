//! `session cp`: copy one file into or out of a session (`PUT`/`GET
//! /v1/sessions/{id}/files/{path}`); the streaming itself is in `files`.

use std::io::{Read, Write};

use clap::{ArgMatches, Args, FromArgMatches};
use serde_json::json;

use super::files::{self, Downloaded};
use crate::ctl::parse::{self, Endpoint, Transfer};
use crate::ctl::{show_to, Client, Failure, Output};
use crate::model::file::Uploaded;

/// Arguments of `kernelvisor ctl session cp`: what to copy where. Parsing fails (a usage error)
/// unless exactly one side is `ID:PATH`.
#[derive(Debug, Clone)]
pub struct CpArgs {
    pub transfer: Transfer,
    /// `--kernel`: the cluster session's kernel whose file it is (`None`: the main kernel).
    pub kernel: Option<String>,
}

/// `session cp` as clap reads it, before the check that exactly one side is in a session.
#[derive(Debug, Args)]
struct CpSides {
    /// What to copy: ID:PATH (a file of session ID, PATH relative to /home/work), a local
    /// file, or - for stdin.
    #[arg(value_name = "SRC", value_parser = parse::endpoint)]
    src: Endpoint,
    /// Where to copy it: ID:PATH (PATH empty or ending in /: a directory, SRC's file name is
    /// appended), a local file or existing directory, or - for stdout.
    #[arg(value_name = "DST", value_parser = parse::endpoint)]
    dst: Endpoint,
    /// Copy into or out of this kernel of a cluster session: its host name (main1, sub1, …)
    /// or kernel id [default: the main kernel].
    #[arg(long, value_name = "KERNEL")]
    kernel: Option<String>,
}

impl FromArgMatches for CpArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let sides = CpSides::from_arg_matches(matches)?;
        let kernel = sides.kernel;
        Transfer::new(sides.src, sides.dst)
            .map(|transfer| CpArgs { transfer, kernel })
            .map_err(|e| {
                // Formatted here, with the usage of `session cp` (not of the whole program).
                CpSides::augment_args(clap::Command::new("cp"))
                    .bin_name("kernelvisor ctl session cp")
                    .error(clap::error::ErrorKind::ValueValidation, e)
            })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for CpArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        CpSides::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        CpSides::augment_args_for_update(cmd)
    }
}

/// `session cp`: `uploaded N bytes to ID:PATH` / `downloaded N bytes to FILE`, or (`-o json`)
/// the manager's answer to an upload and `{"path", "size"}` for a download. A download to `-`
/// prints only the file.
pub(super) fn cp(
    client: &Client,
    transfer: &Transfer,
    kernel: Option<&str>,
    out: Output,
    stdin: impl Read,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    match transfer {
        Transfer::Upload { local, id, path } => {
            let up = files::upload(client, local, id, kernel, path, stdin)?;
            show_to(
                out,
                &up.reply,
                |v| match crate::ctl::client::lenient::<Option<Uploaded>>(v) {
                    Some(done) => format!("uploaded {} bytes to {id}:{}\n", done.size, done.path),
                    None => format!("uploaded {} bytes to {id}:{}\n", up.size, up.path),
                },
                stdout,
            )
        }
        Transfer::Download { id, path, local } => {
            match files::download(client, id, kernel, path, local, stdout)? {
                Downloaded::Stdout(_) => {}
                Downloaded::File { path, size } => {
                    let shown = path.display();
                    match out {
                        Output::Json => {
                            let v = json!({"path": shown.to_string(), "size": size});
                            writeln!(
                                stdout,
                                "{}",
                                serde_json::to_string_pretty(&v).unwrap_or_default()
                            )?
                        }
                        Output::Table => writeln!(stdout, "downloaded {size} bytes to {shown}")?,
                    }
                    stdout.flush()?;
                }
            }
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::ctl::test_util::{parse, text};
    use crate::ctl::testserver::{Answer, Server};
    use crate::ctl::{ClientError, CtlCommand, SessionCommand};

    #[test]
    fn cp_needs_exactly_one_session_side() {
        for (src, dst, want) in [
            ("a.txt", "b.txt", "neither SRC nor DST is a session path"),
            ("./S:a", "/tmp/x", "neither SRC nor DST is a session path"),
            ("S:a", "T:b", "both SRC and DST are session paths"),
            ("-", "S:dir/", "stdin has no file name"),
            ("S:dir/", "out", "is a directory"),
        ] {
            let err = parse(&["session", "cp", src, dst]).err().unwrap();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
            assert_eq!(err.exit_code(), 2, "a usage error");
            let text = err.to_string();
            assert!(text.contains(want), "{src} {dst}: {text}");
        }
        let err = parse(&["session", "cp", "x", "S:../y"]).err().unwrap();
        assert!(err.to_string().contains("'..' is not allowed"), "{err}");
        assert!(parse(&["session", "cp", "x"]).is_err(), "DST is required");
    }

    /// `n` bytes of every value, in an order that is not periodic in small blocks.
    fn generated(n: usize) -> Vec<u8> {
        let mut x: u32 = 0x9E37_79B9;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 24) as u8
            })
            .collect()
    }

    fn upload(
        client: &Client,
        local: &str,
        remote: &str,
        out: Output,
        stdin: &[u8],
    ) -> Result<String, Failure> {
        let CpArgs { transfer, kernel } =
            match parse(&["session", "cp", local, remote]).unwrap().command {
                CtlCommand::Session(SessionCommand::Cp(cp)) => cp,
                other => panic!("{other:?}"),
            };
        assert_eq!(kernel, None);
        let mut stdout = Vec::new();
        cp(client, &transfer, None, out, stdin, &mut stdout)?;
        Ok(text(stdout))
    }

    #[test]
    fn cp_upload_streams_the_file_with_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("big.bin");
        let data = generated(3 * 1024 * 1024);
        std::fs::write(&file, &data).unwrap();
        let server = Server::start(vec![
            Answer::json(201, r#"{"path": "dir/big.bin", "size": 3145728}"#),
            Answer::json(201, r#"{"path": "sub dir/a?.txt", "size": 5}"#),
        ]);
        let client = Client::new(&server.url).unwrap();
        let local = file.to_str().unwrap();
        let printed = upload(&client, local, "S:dir/", Output::Table, b"").unwrap();
        assert_eq!(printed, "uploaded 3145728 bytes to S:dir/big.bin\n");
        let printed = upload(
            &client,
            "-",
            "S:/home/work/sub dir/a?.txt",
            Output::Json,
            b"hello",
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&printed).unwrap();
        assert_eq!(v, json!({"path": "sub dir/a?.txt", "size": 5}));

        let requests = server.requests();
        assert_eq!(requests[0].line, "PUT /v1/sessions/S/files/dir/big.bin");
        assert_eq!(requests[0].header("content-length"), Some("3145728"));
        assert_eq!(requests[0].header("transfer-encoding"), None);
        assert_eq!(
            requests[0].header("content-type"),
            Some("application/octet-stream")
        );
        assert!(requests[0].bytes == data, "the exact bytes arrived");
        // stdin is spooled to learn its size: it is sent with a Content-Length as well.
        assert_eq!(
            requests[1].line,
            "PUT /v1/sessions/S/files/sub%20dir/a%3F.txt"
        );
        assert_eq!(requests[1].header("content-length"), Some("5"));
        assert_eq!(requests[1].bytes, b"hello");
    }

    #[test]
    fn cp_upload_refused_before_the_body_was_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("big.bin");
        std::fs::write(&file, generated(32 * 1024 * 1024)).unwrap();
        let not_found = r#"{"error": {"code": "session-not-found", "message": "no session S"}}"#;
        let mut refuse = Answer::json(404, not_found);
        refuse.skip_body = true;
        let server = Server::start(vec![refuse]);
        let client = Client::new(&server.url).unwrap();
        // Either the whole file fit in the socket buffers and the answer is read, or the
        // connection broke under the upload: both are errors with a hint of why.
        match upload(&client, file.to_str().unwrap(), "S:x", Output::Table, b"") {
            Err(Failure::Client(e @ ClientError::Api(_))) => {
                assert_eq!(
                    e.to_string(),
                    "error: session-not-found: no session S (HTTP 404)"
                )
            }
            Err(Failure::Client(e @ ClientError::Transport { .. })) => {
                let text = e.to_string();
                assert!(text.starts_with("error: upload cut off by "), "{text}");
                assert!(text.contains("check the session id and path"), "{text}");
                assert_eq!(e.exit_code(), crate::ctl::client::EXIT_UNREACHABLE);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(server.requests()[0].line, "PUT /v1/sessions/S/files/x");
    }

    #[test]
    fn cp_upload_local_errors() {
        // No server is asked: the local side fails first.
        let client = Client::new("http://127.0.0.1:1").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.bin");
        match upload(&client, missing.to_str().unwrap(), "S:", Output::Table, b"") {
            Err(Failure::Local(m)) => assert!(m.starts_with("cannot read "), "{m}"),
            other => panic!("{other:?}"),
        }
        match upload(
            &client,
            dir.path().to_str().unwrap(),
            "S:x",
            Output::Table,
            b"",
        ) {
            Err(Failure::Local(m)) => assert!(
                m.ends_with("is a directory; only files can be copied"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
    }

    /// `--kernel` sends both transfers to the cluster session's kernel (`?kernel=`).
    #[test]
    fn cp_kernel_selects_the_kernel() {
        let server = Server::start(vec![
            Answer::json(201, r#"{"path": "in.txt", "size": 2}"#),
            Answer::bytes(200, "application/octet-stream", b"hi".to_vec()),
        ]);
        let client = Client::new(&server.url).unwrap();
        let run = |args: &[&str], stdin: &[u8]| {
            let CpArgs { transfer, kernel } = match parse(&[&["session", "cp"][..], args].concat())
                .unwrap()
                .command
            {
                CtlCommand::Session(SessionCommand::Cp(cp)) => cp,
                other => panic!("{other:?}"),
            };
            let mut stdout = Vec::new();
            cp(
                &client,
                &transfer,
                kernel.as_deref(),
                Output::Table,
                stdin,
                &mut stdout,
            )
            .unwrap();
            text(stdout)
        };
        assert_eq!(
            run(&["--kernel", "sub1", "-", "S:in.txt"], b"hi"),
            "uploaded 2 bytes to S:in.txt\n"
        );
        assert_eq!(run(&["S:out.txt", "-", "--kernel", "sub 2"], b""), "hi");
        let requests = server.requests();
        assert_eq!(
            requests[0].line,
            "PUT /v1/sessions/S/files/in.txt?kernel=sub1"
        );
        assert_eq!(
            requests[1].line,
            "GET /v1/sessions/S/files/out.txt?kernel=sub%202"
        );
    }

    #[test]
    fn spool_answers_a_rewound_file_and_its_size() {
        let data = generated(100_000);
        let (mut file, size) = files::spool(&data[..]).unwrap();
        assert_eq!(size, 100_000);
        let mut back = Vec::new();
        file.read_to_end(&mut back).unwrap();
        assert!(back == data);
    }

    fn download(
        client: &Client,
        remote: &str,
        local: &str,
        out: Output,
    ) -> Result<Vec<u8>, Failure> {
        let CpArgs { transfer, kernel } =
            match parse(&["session", "cp", remote, local]).unwrap().command {
                CtlCommand::Session(SessionCommand::Cp(cp)) => cp,
                other => panic!("{other:?}"),
            };
        assert_eq!(kernel, None);
        let mut stdout = Vec::new();
        cp(client, &transfer, None, out, &b""[..], &mut stdout)?;
        Ok(stdout)
    }

    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn cp_download_writes_the_exact_bytes() {
        let data = generated(2 * 1024 * 1024 + 7);
        let chunked: Vec<Vec<u8>> = data.chunks(300_000).map(<[u8]>::to_vec).collect();
        let server = Server::start(vec![
            Answer::bytes(200, "application/octet-stream", data.clone()),
            Answer {
                parts: chunked,
                ..Answer::bytes(200, "application/octet-stream", Vec::new())
            },
            Answer::bytes(200, "application/octet-stream", b"to stdout".to_vec()),
        ]);
        let client = Client::new(&server.url).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();

        // Into an existing directory: the file keeps its session name.
        let printed = download(&client, "S:sub/x.bin", d, Output::Table).unwrap();
        let target = dir.path().join("x.bin");
        assert_eq!(
            text(printed),
            format!("downloaded {} bytes to {}\n", data.len(), target.display())
        );
        assert!(std::fs::read(&target).unwrap() == data);

        // A chunked body to a named file, replacing it.
        let named = dir.path().join("copy.bin");
        std::fs::write(&named, b"old").unwrap();
        let printed =
            download(&client, "S:x y.bin", named.to_str().unwrap(), Output::Json).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&printed).unwrap();
        assert_eq!(
            v,
            json!({"path": named.to_str().unwrap(), "size": data.len()})
        );
        assert!(std::fs::read(&named).unwrap() == data);
        assert_eq!(
            names(dir.path()),
            ["copy.bin", "x.bin"],
            "no temporary file left"
        );

        // To stdout: the bytes only.
        assert_eq!(
            download(&client, "S:a.txt", "-", Output::Table).unwrap(),
            b"to stdout"
        );

        let requests = server.requests();
        assert_eq!(requests[0].line, "GET /v1/sessions/S/files/sub/x.bin");
        assert_eq!(requests[1].line, "GET /v1/sessions/S/files/x%20y.bin");
        assert_eq!(requests[2].line, "GET /v1/sessions/S/files/a.txt");
    }

    #[test]
    fn cp_download_failure_leaves_no_file() {
        let not_found = r#"{"error": {"code": "file-not-found", "message": "no file nope.bin"}}"#;
        let mut short = Answer::bytes(200, "application/octet-stream", generated(1000));
        short.announced_length = Some(5000);
        let server = Server::start(vec![Answer::json(404, not_found), short]);
        let client = Client::new(&server.url).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("keep.bin");
        std::fs::write(&target, b"before").unwrap();
        let t = target.to_str().unwrap();

        match download(
            &client,
            "S:nope.bin",
            dir.path().to_str().unwrap(),
            Output::Table,
        ) {
            Err(Failure::Client(e)) => {
                assert_eq!(e.exit_code(), 1);
                assert_eq!(
                    e.to_string(),
                    "error: file-not-found: no file nope.bin (HTTP 404)"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            names(dir.path()),
            ["keep.bin"],
            "no nope.bin, no temporary file"
        );

        // The body ends before its Content-Length: the old file stays as it was.
        match download(&client, "S:x.bin", t, Output::Table) {
            Err(Failure::Client(e)) => {
                assert_eq!(e.exit_code(), crate::ctl::client::EXIT_UNREACHABLE, "{e}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(names(dir.path()), ["keep.bin"]);
        assert_eq!(std::fs::read(&target).unwrap(), b"before");

        // A directory that does not exist: a local error, no request.
        let missing = dir.path().join("no/such/dir/");
        match download(
            &client,
            "S:x.bin",
            &format!("{}/", missing.display()),
            Output::Table,
        ) {
            Err(Failure::Local(m)) => assert!(m.ends_with("is not a directory"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(server.requests().len(), 2);
    }
}
