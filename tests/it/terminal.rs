//! `kernelvisor ctl session exec` with stdin and with a terminal, end to end: a manager and an
//! agent process (CURVE on), the real Docker engine, the real HTTP API and its WebSocket route,
//! and the real `ctl` binary, which the terminal test drives through a pseudo-terminal of its
//! own (openpty: the test is the user's terminal emulator).
//!
//! Agent host ports: 34800–34839 (20 per agent).

use crate::common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::cluster::{wait_for, Cluster, Db};
use common::pty::Pty;

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

/// Types `line` into the terminal and waits up to `limit` for `want` after it; answers what the
/// terminal showed meanwhile. `want` must differ from the typed line's echo (`M$((1))` shows
/// as `M1`).
fn line(pty: &mut Pty, line: &str, want: &str, limit: Duration) -> String {
    let from = pty.mark();
    pty.send(line);
    let end = pty.expect_from(from, want, limit).unwrap_or_else(|| {
        panic!(
            "no {want:?} within {limit:?} after typing {line:?}; the terminal shows:\n{}",
            String::from_utf8_lossy(&pty.output().as_bytes()[from..])
        )
    });
    String::from_utf8_lossy(&pty.output().as_bytes()[from..end]).into_owned()
}

/// How many processes of session `sid` run exactly `args` (asked through the API, beside the
/// terminal).
fn remote_processes(c: &Cluster, sid: &str, args: &str) -> usize {
    let ps = c.post(
        &format!("/v1/sessions/{sid}/execute"),
        &serde_json::json!({"code": format!("ps -o args | grep -c '^{args}$' || true")}),
    );
    ps.body["console"][0][1]
        .as_str()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Runs `command` in the remote shell (a line ended by Enter, `\r`), followed by a marker;
/// answers what it printed (after the echo of the typed line).
fn remote(pty: &mut Pty, command: &str, n: u32) -> String {
    let echo = format!("M$(({n}-1+1))");
    let shown = line(
        pty,
        &format!("{command}; echo {echo}\r"),
        &format!("M{n}\r\n"),
        Duration::from_secs(20),
    );
    match shown.rfind(&echo) {
        Some(i) => shown[i + echo.len()..].to_owned(),
        None => shown,
    }
}

#[test]
fn exec_it_is_a_real_terminal() {
    let (c, sid) = cluster("tty", 34820);
    let bin = env!("CARGO_BIN_EXE_kernelvisor");
    let env = [
        ("KERNELVISOR_API", c.api.as_str()),
        ("KERNELVISOR_TOKEN", c.token.as_str()),
    ];
    // A person's shell on a 33x101 terminal, from which ctl runs as the foreground job.
    let mut pty = Pty::shell(c.dir.path(), 33, 101, &env);
    let long = Duration::from_secs(30);
    line(
        &mut pty,
        "stty -g > before.stty; echo R$((1))\n",
        "R1",
        long,
    );
    pty.send(&format!(
        "{bin} ctl session exec -it {sid}; echo EXIT=$((0+$?))\n"
    ));

    // The image's shell answers, on a terminal of the window's size (sent with the upgrade).
    let tty = remote(&mut pty, "tty", 1);
    assert!(tty.contains("/dev/pts/"), "tty: {tty:?}");
    let size = remote(&mut pty, "stty size", 2);
    assert!(size.contains("33 101"), "stty size: {size:?}");
    // A resize follows (SIGWINCH to ctl, a resize frame, the engine's resize).
    pty.resize(40, 120);
    let mut n = 3;
    wait_for(
        Duration::from_secs(20),
        "the resize to reach the remote terminal",
        || {
            n += 1;
            remote(&mut pty, "stty size", n)
                .contains("40 120")
                .then_some(())
        },
    );

    // Ctrl+C interrupts the remote foreground process (not ctl: raw mode), and the remote
    // shell's prompt comes back long before 100 s.
    line(&mut pty, "sleep 100\r", "sleep 100\r\n", long);
    wait_for(long, "the remote sleep running", || {
        (remote_processes(&c, &sid, "sleep 100") >= 1).then_some(())
    });
    let interrupted = Instant::now();
    pty.send("\x03");
    let pwd = remote(&mut pty, "pwd", 100);
    assert!(
        pwd.contains("/home/work"),
        "still the remote shell: {pwd:?}"
    );
    assert!(interrupted.elapsed() < Duration::from_secs(20));

    // The remote shell's exit code is ctl's, and the local terminal is as it was.
    line(&mut pty, "exit 7\r", "EXIT=7", long);
    let same = "stty -g | cmp -s - before.stty; echo CMP=$((0+$?))\n";
    line(&mut pty, same, "CMP=0", long);

    // A command instead of the shell, and its exit code.
    let shown = line(
        &mut pty,
        &format!("{bin} ctl session exec -it {sid} 'echo in-a-tty; [ -t 0 ] && exit 3'; echo EXIT=$((0+$?))\n"),
        "EXIT=3",
        long,
    );
    assert!(shown.contains("in-a-tty"), "{shown}");

    // `-i` forwards a terminal's input without a remote terminal (cooked: line by line).
    let from = pty.mark();
    pty.send(&format!(
        "{bin} ctl session exec -i {sid} 'head -1 | tr a-z A-Z'; echo EXIT=$((0+$?))\n"
    ));
    // A head start for ctl before typing (no condition to wait for: input typed earlier waits
    // in the terminal's buffer anyway).
    std::thread::sleep(Duration::from_millis(500));
    line(&mut pty, "hello\n", "HELLO", long);
    assert!(
        pty.expect_from(from, "EXIT=0", long).is_some(),
        "{}",
        pty.output()
    );

    // An unknown session, and another key's session: the API's 404 before any upgrade, ctl
    // exits 1, the terminal untouched.
    let (_, other_token) = c.new_key(false);
    for (id, token) in [
        ("no-such-session", c.token.as_str()),
        (sid.as_str(), other_token.as_str()),
    ] {
        let shown = line(
            &mut pty,
            &format!(
                "KERNELVISOR_TOKEN={token} {bin} ctl session exec -it {id}; echo EXIT=$((0+$?))\n"
            ),
            "EXIT=1",
            long,
        );
        assert!(shown.contains("session-not-found"), "{shown}");
        line(&mut pty, same, "CMP=0", long);
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
    // A browser's way: the secret as a subprotocol next to `kernelvisor.pty`, no
    // Authorization header; the answer names `kernelvisor.pty` (tungstenite, like a browser,
    // fails a handshake that names none of the offered ones).
    let connect_proto = |url: String, protocols: String| {
        let mut req = url.into_client_request().unwrap();
        req.headers_mut()
            .insert("Sec-WebSocket-Protocol", protocols.parse().unwrap());
        tungstenite::connect(req)
    };
    let token_proto = |secret: &str| {
        use base64::Engine;
        format!(
            "kernelvisor.bearer.{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
        )
    };
    let (mut ws, resp) = connect_proto(
        ws_url("command=echo%20by-subprotocol"),
        format!("{}, kernelvisor.pty", token_proto(&c.token)),
    )
    .unwrap();
    assert_eq!(resp.status(), 101);
    assert_eq!(
        resp.headers()["sec-websocket-protocol"],
        "kernelvisor.pty",
        "the answer names the real subprotocol, not the token"
    );
    read_until(&mut ws, &|seen, _| seen.contains("by-subprotocol"));
    // The same ownership rules; a malformed or unknown token is a 401.
    let (_, other) = c.new_key(false);
    assert_eq!(
        status(connect_proto(
            ws_url(""),
            format!("{}, kernelvisor.pty", token_proto(&other))
        )),
        (404, "session-not-found".into())
    );
    assert_eq!(
        status(connect_proto(
            ws_url(""),
            "kernelvisor.bearer.%%%, kernelvisor.pty".into()
        )),
        (401, "unauthorized".into())
    );
    assert_eq!(
        status(connect_proto(
            ws_url(""),
            format!(
                "{}, kernelvisor.pty",
                token_proto(&other.replace("kvs_", "kvs_x"))
            )
        )),
        (401, "unauthorized".into())
    );
    // The token protocol on a request that is not an upgrade is refused, even a good one.
    let plain = c
        .raw_get_with(
            &format!("/v1/sessions/{sid}/pty"),
            &[("Sec-WebSocket-Protocol", &token_proto(&c.token))],
        )
        .unwrap();
    assert_eq!(
        (plain.status, plain.code()),
        (401, "unauthorized"),
        "{plain:?}"
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
