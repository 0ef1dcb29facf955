//! `kernelvisor ctl session exec` with stdin and with a terminal, end to end: a manager and an
//! agent process (CURVE on), the real Docker engine, the real HTTP API and its WebSocket route,
//! and the real `ctl` binary, which the terminal test drives through a pseudo-terminal of its
//! own (openpty: the test is the user's terminal emulator).
//!
//! Agent host ports: 34800–34839 (20 per agent).

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{wait_for, Cluster, Db};

const LONG: Duration = Duration::from_secs(60);

/// A cluster with one agent, ready for sessions, and one running session's id.
fn cluster(name: &str, ports: u16) -> (Cluster, String) {
    let mut c = Cluster::new(Db::Sqlite);
    c.start_manager();
    let a = c.add_agent(name, ports, "");
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", LONG);
    wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });
    let sid = c.create_session()["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    (c, sid)
}

/// `kernelvisor ctl --api <api>` with the cluster's user token.
fn ctl(c: &Cluster, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kernelvisor"));
    cmd.arg("ctl")
        .arg("--api")
        .arg(&c.api)
        .env("KERNELVISOR_TOKEN", &c.token)
        .args(args);
    cmd
}

/// Runs `cmd` with `input` piped to its stdin, written by a thread in `input.len()`-sized
/// pieces `times` times (as a pipe would feed it; the test never holds more than one piece);
/// returns its exit code, stdout, stderr and its peak resident memory in KiB (`VmHWM`, polled).
fn run_piped(mut cmd: Command, input: Vec<u8>, times: usize) -> (i32, String, String, u64) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // ru_maxrss would not do: a child spawned with vfork accounts the parent's peak to itself.
    let status = format!("/proc/{}/status", child.id());
    let peak = std::thread::spawn(move || {
        let mut peak = 0;
        // Until the process has exited (a zombie's status has no VmHWM).
        while let Some(kib) = std::fs::read_to_string(&status).ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        }) {
            peak = peak.max(kib);
            std::thread::sleep(Duration::from_millis(20));
        }
        peak
    });
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        for _ in 0..times {
            // The code may close its stdin early (`head -1`): a broken pipe here is expected.
            if stdin.write_all(&input).is_err() {
                break;
            }
        }
    });
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).unwrap();
        s
    });
    let mut stdout = String::new();
    out.read_to_string(&mut stdout).unwrap();
    let code = child.wait().unwrap().code().expect("ctl ended by a signal");
    writer.join().unwrap();
    (code, stdout, reader.join().unwrap(), peak.join().unwrap())
}

#[test]
fn exec_forwards_stdin_in_bounded_chunks() {
    let (c, sid) = cluster("stdin", 34800);

    let (code, out, err, _) = run_piped(
        ctl(&c, &["session", "exec", &sid, "cat"]),
        b"x\n".to_vec(),
        1,
    );
    assert_eq!(
        (code, out.as_str()),
        (0, "x\n"),
        "piped stdin reaches the code: {err}"
    );

    // Without input to forward the run's stdin is closed at once: `cat` ends.
    let (code, out, err, _) = run_piped(
        ctl(&c, &["session", "exec", &sid, "cat; echo done"]),
        vec![],
        1,
    );
    assert_eq!((code, out.as_str()), (0, "done\n"), "{err}");

    // A code that stops reading early: the rest of the input is dropped, not an error.
    let lines: String = (1..=100_000).map(|i| format!("{i}\n")).collect();
    let (code, out, err, _) = run_piped(
        ctl(&c, &["session", "exec", &sid, "head -2; exit 5"]),
        lines.into_bytes(),
        1,
    );
    assert_eq!((code, out.as_str()), (5, "1\n2\n"), "{err}");

    // Large input streams through in chunks: ctl's memory does not grow with it. Its peak with
    // 1 MiB and with 32 MiB of input differs by less than a few chunks.
    let mib: Vec<u8> = (0..1 << 20).map(|i| b'a' + (i % 26) as u8).collect();
    let count = |n: usize| {
        let started = Instant::now();
        let cmd = ctl(&c, &["session", "exec", &sid, "wc -c"]);
        let (code, out, err, peak) = run_piped(cmd, mib.clone(), n);
        assert_eq!(code, 0, "{err}");
        assert_eq!(out.trim(), (n << 20).to_string(), "every byte arrived");
        eprintln!(
            "{n} MiB through stdin in {:?}, ctl peak RSS {peak} KiB",
            started.elapsed()
        );
        peak
    };
    let small = count(1);
    let large = count(32);
    assert!(
        large < small + 2 * 1024,
        "ctl's peak RSS grew with its input: {small} KiB for 1 MiB, {large} KiB for 32 MiB"
    );

    // `-t` needs a terminal: a clear error, before anything is opened.
    let out = ctl(&c, &["session", "exec", "-t", &sid])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("-t needs a terminal on stdin"), "{err}");
}

/// A pseudo-terminal: the test holds the master side, a child gets the slave side as its
/// controlling terminal. What the child writes is collected by a thread.
struct Pty {
    master: std::fs::File,
    slave: OwnedFd,
    output: Arc<Mutex<Vec<u8>>>,
}

impl Pty {
    fn open(rows: u16, cols: u16) -> Pty {
        let (mut m, mut s) = (0, 0);
        // SAFETY: openpty writes two new descriptors; null pointers: no name, default settings.
        let rc = unsafe {
            libc::openpty(
                &mut m,
                &mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty");
        // SAFETY: both descriptors are new and owned here.
        let (master, slave) = unsafe { (std::fs::File::from_raw_fd(m), OwnedFd::from_raw_fd(s)) };
        let pty = Pty {
            master,
            slave,
            output: Arc::new(Mutex::new(Vec::new())),
        };
        pty.resize(rows, cols);
        let mut reader = pty.master.try_clone().unwrap();
        let output = pty.output.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Ends with EIO once no process holds the slave side.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                output.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        pty
    }

    /// Sets the window size (the kernel sends SIGWINCH to the terminal's foreground group).
    fn resize(&self, rows: u16, cols: u16) {
        let ws = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize from a local.
        assert_eq!(
            unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &ws) },
            0
        );
    }

    /// Starts `cmd` in a new session with this terminal as its stdin, stdout, stderr and
    /// controlling terminal.
    fn spawn(&self, mut cmd: Command) -> Child {
        use std::os::unix::process::CommandExt;
        let fd = || Stdio::from(self.slave.try_clone().unwrap());
        cmd.stdin(fd()).stdout(fd()).stderr(fd());
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn().unwrap()
    }

    /// Types `bytes`, as a user would.
    fn type_in(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).unwrap();
    }

    /// Everything written to the terminal so far, as text.
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Waits until the output (after `from` bytes) contains `needle`; answers the output after
    /// `from` up to the end of the needle.
    fn wait_for(&self, from: usize, needle: &str, limit: Duration) -> String {
        let started = Instant::now();
        loop {
            let text = self.text();
            let after = text.get(from..).unwrap_or_default();
            if let Some(i) = after.find(needle) {
                return after[..i + needle.len()].to_owned();
            }
            assert!(
                started.elapsed() < limit,
                "no {needle:?} on the terminal within {limit:?}; it shows:\n{after}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `line` in the remote shell, followed by a marker whose output (`M<n>`) differs
    /// from its echo (`M$((n-1+1))`); answers the output between the command and the marker.
    fn run_line(&mut self, line: &str, n: u32) -> String {
        let from = self.text().len();
        self.type_in(format!("{line}; echo M$(({n}-1+1))\r").as_bytes());
        let out = self.wait_for(from, &format!("M{n}\r\n"), Duration::from_secs(20));
        // The echo of the typed line ends with the marker's expression: skip past it.
        let echo = format!("M$(({n}-1+1))");
        match out.rfind(&echo) {
            Some(i) => out[i + echo.len()..].to_owned(),
            None => out,
        }
    }

    /// The slave side's local flags (ICANON, ECHO, ISIG, …).
    fn lflag(&self) -> libc::tcflag_t {
        // SAFETY: reads the settings of an open terminal into a zeroed termios.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { libc::tcgetattr(self.slave.as_raw_fd(), &mut t) },
            0
        );
        t.c_lflag
    }
}

/// Waits up to `limit` for `child` to exit; answers its exit code.
fn exit_code(child: &mut Child, limit: Duration) -> Option<i32> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    None
}

#[test]
fn exec_it_is_a_real_terminal() {
    let (c, sid) = cluster("tty", 34820);
    let mut pty = Pty::open(33, 101);
    let cooked = pty.lflag();
    let mut child = pty.spawn(ctl(&c, &["session", "exec", "-it", &sid]));

    // The image's shell answers; ctl put the local terminal in raw mode meanwhile.
    let tty = pty.run_line("tty", 1);
    assert!(tty.contains("/dev/pts/"), "tty: {tty:?}");
    assert_eq!(
        pty.lflag() & (libc::ICANON | libc::ECHO | libc::ISIG),
        0,
        "raw mode"
    );

    // The window size went with the upgrade, and a resize follows (SIGWINCH → resize frame).
    let size = pty.run_line("stty size", 2);
    assert!(size.contains("33 101"), "stty size: {size:?}");
    pty.resize(40, 120);
    let mut n = 3;
    wait_for(
        Duration::from_secs(20),
        "the resize to reach the remote terminal",
        || {
            n += 1;
            pty.run_line("stty size", n)
                .contains("40 120")
                .then_some(())
        },
    );

    // Ctrl+C interrupts the foreground process: the prompt comes back long before 100 s.
    let from = pty.text().len();
    pty.type_in(b"sleep 100\r");
    pty.wait_for(from, "sleep 100\r\n", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(500));
    let interrupted = Instant::now();
    pty.type_in(&[0x03]);
    let after = pty.run_line("echo back", 100);
    assert!(after.contains("back"), "{after:?}");
    assert!(
        interrupted.elapsed() < Duration::from_secs(20),
        "Ctrl+C did not interrupt sleep"
    );

    // The shell's exit code is ctl's, and the local terminal is as it was.
    pty.type_in(b"exit 7\r");
    assert_eq!(
        exit_code(&mut child, Duration::from_secs(30)),
        Some(7),
        "{}",
        pty.text()
    );
    assert_eq!(pty.lflag(), cooked, "ctl restored the terminal's settings");

    // A command instead of the shell, and its exit code.
    let from = pty.text().len();
    let mut child = pty.spawn(ctl(
        &c,
        &[
            "session",
            "exec",
            "-it",
            &sid,
            "echo in-a-tty; [ -t 0 ] && exit 3",
        ],
    ));
    pty.wait_for(from, "in-a-tty", Duration::from_secs(20));
    assert_eq!(exit_code(&mut child, Duration::from_secs(30)), Some(3));

    // `-i` forwards a terminal's input without a remote terminal (cooked: line by line).
    let from = pty.text().len();
    let mut child = pty.spawn(ctl(
        &c,
        &["session", "exec", "-i", &sid, "head -1 | tr a-z A-Z"],
    ));
    pty.type_in(b"hello\r");
    pty.wait_for(from, "HELLO", Duration::from_secs(20));
    assert_eq!(exit_code(&mut child, Duration::from_secs(30)), Some(0));

    // An unknown session, and another key's session: the API's 404, ctl exits 1.
    let (_, other_token) = c.new_key(false);
    for (id, token) in [
        ("no-such-session", c.token.as_str()),
        (sid.as_str(), other_token.as_str()),
    ] {
        let from = pty.text().len();
        let mut cmd = ctl(&c, &["session", "exec", "-it", id]);
        cmd.env("KERNELVISOR_TOKEN", token);
        let mut child = pty.spawn(cmd);
        assert_eq!(exit_code(&mut child, Duration::from_secs(30)), Some(1));
        pty.wait_for(from, "session-not-found", Duration::from_secs(5));
        assert_eq!(pty.lflag(), cooked);
    }
}

/// The WebSocket route itself, as any client sees it: control frames, bad input answered
/// without ending the terminal, the exit code frame, and refusals before the upgrade.
#[test]
fn pty_route_serves_and_refuses() {
    use tungstenite::client::IntoClientRequest;
    use tungstenite::Message;

    let (c, sid) = cluster("ws", 34840);
    let ws_url = |query: &str| {
        format!(
            "{}/v1/sessions/{sid}/pty?{query}",
            c.api.replace("http://", "ws://")
        )
    };
    let connect = |url: String, token: &str| {
        let mut req = url.into_client_request().unwrap();
        req.headers_mut()
            .insert("Authorization", Cluster::bearer(token).parse().unwrap());
        let connected = tungstenite::connect(req);
        if let Ok((ws, _)) = &connected {
            // A frame that never comes fails the test instead of hanging it.
            if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            }
        }
        connected
    };
    // Reads frames until `want` says it has what it waits for (binary frames as text).
    let read_until = |ws: &mut tungstenite::WebSocket<_>, want: &dyn Fn(&str, &Message) -> bool| {
        let mut seen = String::new();
        loop {
            let m = ws.read().expect("a frame");
            if let Message::Binary(b) = &m {
                seen.push_str(&String::from_utf8_lossy(b));
            }
            if want(&seen, &m) {
                return (seen, m);
            }
        }
    };

    let (mut ws, resp) = connect(
        ws_url("rows=10&cols=50&command=stty%20size%3B%20cat"),
        &c.token,
    )
    .unwrap();
    assert_eq!(resp.status(), 101);
    read_until(&mut ws, &|seen, _| seen.contains("10 50"));
    // A malformed control frame is answered with an error frame; the terminal goes on.
    for bad in [
        "{bad",
        r#"{"resize": {"rows": 0, "cols": 5}}"#,
        r#"{"resize": {"rows": 5}}"#,
    ] {
        ws.send(Message::text(bad)).unwrap();
        let (_, m) = read_until(&mut ws, &|_, m| matches!(m, Message::Text(_)));
        let v: serde_json::Value = serde_json::from_str(m.to_text().unwrap()).unwrap();
        assert_eq!(v["error"]["code"], "invalid-request", "{bad}: {v}");
    }
    ws.send(Message::binary(b"ping-pong\r".to_vec())).unwrap();
    read_until(&mut ws, &|seen, _| seen.matches("ping-pong").count() >= 2); // echo + cat
    ws.send(Message::binary(vec![0x04])).unwrap(); // Ctrl+D: cat ends
    let (_, m) = read_until(&mut ws, &|_, m| matches!(m, Message::Text(_)));
    let v: serde_json::Value = serde_json::from_str(m.to_text().unwrap()).unwrap();
    assert_eq!(v, serde_json::json!({"exit_code": 0}));
    assert!(
        matches!(ws.read(), Ok(Message::Close(_))),
        "closed after the exit code"
    );

    // A client that goes away kills its terminal: the agent holds no run after a while.
    let (ws, _) = connect(ws_url("command=sleep%20600"), &c.token).unwrap();
    drop(ws);
    wait_for(LONG, "the abandoned terminal to be killed", || {
        (c.agent_metric(0, "kernelvisor_exec_runs") == Some(0.0)).then_some(())
    });

    // Refused before the upgrade, with the API's errors.
    let status = |r: Result<_, tungstenite::Error>| match r {
        Err(tungstenite::Error::Http(resp)) => {
            let body: serde_json::Value =
                serde_json::from_slice(resp.body().as_deref().unwrap_or_default()).unwrap();
            (
                resp.status().as_u16(),
                body["error"]["code"].as_str().unwrap().to_owned(),
            )
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("upgraded"),
    };
    assert_eq!(
        status(connect(ws_url("rows=0"), &c.token)),
        (400, "invalid-request".into())
    );
    assert_eq!(
        status(connect(ws_url("bogus=1"), &c.token)),
        (400, "invalid-request".into())
    );
    let (_, other) = c.new_key(false);
    assert_eq!(
        status(connect(ws_url(""), &other)),
        (404, "session-not-found".into())
    );
    assert_eq!(
        status(connect(ws_url(""), "wrong")),
        (401, "unauthorized".into())
    );
    // A plain GET (no upgrade) is a 400, not a terminal.
    let plain = c.get(&format!("/v1/sessions/{sid}/pty")).unwrap();
    assert_eq!(
        (plain.status, plain.code()),
        (400, "invalid-request"),
        "{plain:?}"
    );
    // A session that ended has no terminal.
    assert_eq!(c.delete(&format!("/v1/sessions/{sid}")).status, 200);
    assert_eq!(
        status(connect(ws_url(""), &c.token)),
        (409, "session-not-running".into())
    );
}
