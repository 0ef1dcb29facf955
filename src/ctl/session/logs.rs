//! `session logs`: copy a session's kernel logs (`GET /v1/sessions/{id}/logs`) to stdout as
//! they stream; [`copy_stream`] also streams `session cp` downloads.

use std::io::{self, Read, Write};

use clap::Args;

use crate::ctl::client::{self, logs_path};
use crate::ctl::{Client, Failure};

/// Read size of `session logs`; stdout is flushed after each read.
const LOG_BUFFER: usize = 64 * 1024;

/// Arguments of `kernelvisor ctl session logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Session id (UUID).
    pub id: String,
    /// Keep printing new output as it comes, until the kernel ends.
    #[arg(long, short)]
    pub follow: bool,
    /// This kernel's logs, of a cluster session: its host name (main1, sub1, …) or kernel id
    /// [default: the main kernel].
    #[arg(long, value_name = "KERNEL")]
    pub kernel: Option<String>,
}

/// Prints the logs as they are, whatever the output format.
pub(super) fn run(client: &Client, args: &LogsArgs) -> Result<i32, Failure> {
    let kernel = args.kernel.as_deref();
    let body = client.logs(&args.id, kernel, args.follow)?;
    let url = client.url(&logs_path(&args.id, kernel));
    copy_stream(&url, body, &mut io::stdout().lock())?;
    Ok(0)
}

/// Copies a streamed body to `out` as it comes, flushing after each read (so a followed log shows
/// each line when it is written), in reads of at most [`LOG_BUFFER`] bytes: memory stays fixed
/// however long the stream. Answers the number of bytes copied.
pub(super) fn copy_stream(
    url: &str,
    mut body: impl Read,
    out: &mut impl Write,
) -> Result<u64, Failure> {
    let mut buf = vec![0; LOG_BUFFER];
    let mut copied = 0;
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => return Ok(copied),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(client::read_error(url, &e).into()),
        };
        out.write_all(&buf[..n])?;
        out.flush()?;
        copied += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that gives `chunks` one read each, then fails with `end` (or ends).
    struct Chunks(Vec<&'static str>, Option<io::ErrorKind>);

    impl Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return self
                    .1
                    .map_or(Ok(0), |kind| Err(io::Error::new(kind, "connection reset")));
            }
            let chunk = self.0.remove(0);
            buf[..chunk.len()].copy_from_slice(chunk.as_bytes());
            Ok(chunk.len())
        }
    }

    /// A writer that records what each flush saw, or fails like a closed pipe.
    #[derive(Default)]
    struct Flushes {
        pending: Vec<u8>,
        flushed: Vec<String>,
        broken: bool,
    }

    impl Write for Flushes {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.broken {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            self.pending.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            self.flushed
                .push(String::from_utf8(std::mem::take(&mut self.pending)).unwrap());
            Ok(())
        }
    }

    #[test]
    fn logs_are_copied_and_flushed_per_read() {
        let mut out = Flushes::default();
        let copied = copy_stream(
            "http://m/logs",
            Chunks(vec!["line 1\n", "line 2\npart", "ial\n"], None),
            &mut out,
        )
        .unwrap();
        assert_eq!(copied, 22);
        assert_eq!(out.flushed, ["line 1\n", "line 2\npart", "ial\n"]);

        let err = copy_stream(
            "http://m/logs",
            Chunks(vec!["x"], Some(io::ErrorKind::ConnectionReset)),
            &mut out,
        )
        .unwrap_err();
        match err {
            Failure::Client(e) => {
                assert_eq!(e.exit_code(), crate::ctl::client::EXIT_UNREACHABLE);
                assert!(
                    e.to_string()
                        .starts_with("error: reading the response from http://m/logs: "),
                    "{e}"
                );
            }
            other => panic!("{other:?}"),
        }
        let mut broken = Flushes {
            broken: true,
            ..Flushes::default()
        };
        let err = copy_stream("http://m/logs", Chunks(vec!["x"], None), &mut broken).unwrap_err();
        assert!(
            matches!(err, Failure::Io(ref e) if e.kind() == io::ErrorKind::BrokenPipe),
            "{err:?}"
        );
    }
}
