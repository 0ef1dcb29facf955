//! `session exec -t`: a terminal in a session (`GET /v1/sessions/{id}/pty`, a WebSocket).
//!
//! The local terminal goes into raw mode (restored on every way out: a guard's `Drop`, which
//! also runs when a panic unwinds), so every key, Ctrl+C (`0x03`) included, is sent as typed and
//! the remote terminal's line discipline does the rest (echo, `SIGINT` to its foreground
//! process). One thread `poll`s stdin, the socket and a SIGWINCH self-pipe: keys go out as
//! binary frames, the terminal's bytes come back as binary frames to stdout, a window change
//! sends `{"resize": …}`, and the manager's last frame `{"exit_code": N}` is the exit status.
//! Writes block while the manager does not take them, so nothing queues up here.

use std::io::{self, IsTerminal, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use tungstenite::Message;

use crate::ctl::websocket::Socket;
use crate::ctl::{Client, ClientError, Failure};
use crate::model::terminal::{ClientControl, ServerControl, TerminalSize};

/// How long one read of the socket may wait for the rest of a frame whose start arrived (then
/// the loop polls again).
const READ_SLICE: Duration = Duration::from_millis(10);

/// Opens the terminal (`command`, or the image's shell) in session `id`'s kernel `kernel` (`None`:
/// the main kernel) and relays until its process ends;
/// answers its exit code (0–255; outside that range, or unknown, 1).
///
/// Errors: [`Failure::Local`] when stdin is not a terminal; the API's errors (404
/// `session-not-found`, 409 `session-not-running`); a connection that ends without an exit code.
pub(super) fn run(
    client: &Client,
    id: &str,
    kernel: Option<&str>,
    command: Option<&str>,
) -> Result<i32, Failure> {
    let stdin = io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::Local(
            "-t needs a terminal on stdin (run it from an interactive shell, or drop -t to \
             forward piped input)"
                .into(),
        ));
    }
    let fd = stdin.as_raw_fd();
    let size = window_size(fd).unwrap_or(TerminalSize { rows: 24, cols: 80 });
    let mut socket = client.terminal(id, kernel, size, command)?;
    let (winch, winch_pipe) = UnixStream::pair()?;
    winch.set_nonblocking(true)?;
    let signal = signal_hook::low_level::pipe::register(signal_hook::consts::SIGWINCH, winch_pipe)?;
    let result = {
        let _raw = RawMode::enter(fd)?;
        relay(&mut socket, fd, &winch)
    };
    signal_hook::low_level::unregister(signal);
    let url = client.url("/pty");
    match result {
        Ok(Some(code)) => Ok(exit_status(code)),
        Ok(None) => Err(ClientError::Transport {
            what: "the terminal ended without an exit code:",
            url,
            detail: "the connection closed".into(),
        }
        .into()),
        Err(Relay::Io(e)) => Err(e.into()),
        Err(Relay::Socket(e)) => Err(ClientError::Transport {
            what: "the terminal's connection failed:",
            url,
            detail: e.to_string(),
        }
        .into()),
        Err(Relay::Lost(code, message)) => Err(Failure::Local(format!("{code}: {message}"))),
    }
}

/// The exit status ctl exits with for the process's exit code (`None`: killed, or unknown).
fn exit_status(code: Option<i64>) -> i32 {
    match code {
        Some(c @ 0..=255) => c as i32,
        _ => 1,
    }
}

/// Why the relay stopped without an exit code frame.
enum Relay {
    Io(io::Error),
    Socket(tungstenite::Error),
    /// The manager lost the terminal: its error frame's code and message.
    Lost(String, String),
}

impl From<io::Error> for Relay {
    fn from(e: io::Error) -> Self {
        Relay::Io(e)
    }
}

impl From<tungstenite::Error> for Relay {
    fn from(e: tungstenite::Error) -> Self {
        match e {
            tungstenite::Error::Io(e) => Relay::Io(e),
            e => Relay::Socket(e),
        }
    }
}

/// Relays until the manager's exit-code frame (`Ok(Some(code))`) or the socket closes without
/// one (`Ok(None)`).
fn relay(
    socket: &mut Socket,
    stdin: RawFd,
    winch: &UnixStream,
) -> Result<Option<Option<i64>>, Relay> {
    socket.get_ref().set_read_timeout(Some(READ_SLICE))?;
    let mut stdout = io::stdout().lock();
    let mut buf = [0u8; 4096];
    let mut stdin_open = true;
    let mut exit_code = None;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: socket.get_ref().raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: winch.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // A negative fd is ignored by poll(2): stdin once it ended.
                fd: if stdin_open { stdin } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs for the call's duration.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue; // SIGWINCH: its byte is in the pipe
            }
            return Err(e.into());
        }
        if fds[0].revents != 0 {
            // Everything that arrived, until a read finds nothing more (TLS may hold decrypted
            // frames that poll cannot see).
            loop {
                match socket.read() {
                    Ok(Message::Binary(data)) => {
                        stdout.write_all(&data)?;
                        stdout.flush()?;
                    }
                    Ok(Message::Text(text)) => {
                        let c: ServerControl =
                            serde_json::from_str(text.as_str()).unwrap_or_default();
                        if let Some(code) = c.exit_code {
                            exit_code = Some(code);
                        } else if let Some(e) = c.error {
                            // Raw mode: a line needs its own carriage return.
                            let mut err = io::stderr().lock();
                            write!(err, "\r\nerror: {}: {}\r\n", e.code, e.message)?;
                            err.flush()?;
                            if e.code != "invalid-request" {
                                return Err(Relay::Lost(e.code, e.message));
                            }
                        }
                    }
                    Ok(Message::Close(_)) => {
                        // Answer the close and finish the closing handshake.
                        let _ = socket.flush();
                        return Ok(exit_code);
                    }
                    Ok(_) => {}
                    // Nothing more for now; or a signal (SIGWINCH) interrupted the read, which
                    // a socket with a read timeout never restarts: poll again.
                    Err(tungstenite::Error::Io(e))
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock
                                | io::ErrorKind::TimedOut
                                | io::ErrorKind::Interrupted
                        ) =>
                    {
                        break
                    }
                    Err(
                        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed,
                    ) => return Ok(exit_code),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if fds[1].revents != 0 {
            let mut drain = [0u8; 64];
            while matches!((&*winch).read(&mut drain), Ok(n) if n > 0) {}
            if let Some(size) = window_size(stdin) {
                let frame = serde_json::to_string(&ClientControl { resize: size })
                    .expect("a control frame serializes");
                send(socket, Message::text(frame))?;
            }
        }
        if stdin_open && fds[2].revents != 0 {
            // SAFETY: reads at most `buf.len()` bytes into `buf`, which lives across the call.
            let n = unsafe { libc::read(stdin, buf.as_mut_ptr().cast(), buf.len()) };
            match n {
                n if n > 0 => send(socket, Message::binary(buf[..n as usize].to_vec()))?,
                0 => stdin_open = false,
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e.into());
                    }
                }
            }
        }
    }
}

/// Sends `message`, finishing the write when a signal interrupted it (the frame is buffered by
/// then: flushing again sends the rest).
fn send(socket: &mut Socket, message: Message) -> Result<(), Relay> {
    let mut result = socket.send(message);
    loop {
        match result {
            Err(tungstenite::Error::Io(e)) if e.kind() == io::ErrorKind::Interrupted => {
                result = socket.flush();
            }
            r => return Ok(r?),
        }
    }
}

/// The window size of the terminal `fd`, or `None` when it has none (or says 0×0).
fn window_size(fd: RawFd) -> Option<TerminalSize> {
    // SAFETY: TIOCGWINSZ writes one `winsize` into `ws`, which lives across the call.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_row > 0 && ws.ws_col > 0).then_some(TerminalSize {
        rows: ws.ws_row,
        cols: ws.ws_col,
    })
}

/// The terminal `fd` in raw mode until dropped (then its settings as they were).
struct RawMode {
    fd: RawFd,
    saved: libc::termios,
}

impl RawMode {
    fn enter(fd: RawFd) -> io::Result<RawMode> {
        // SAFETY: tcgetattr fills `saved`; cfmakeraw and tcsetattr read a valid termios.
        unsafe {
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(fd, &mut saved) != 0 {
                return Err(io::Error::last_os_error());
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(fd, libc::TCSANOW, &raw) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(RawMode { fd, saved })
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in `enter` on the same descriptor.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses() {
        assert_eq!(exit_status(Some(0)), 0);
        assert_eq!(exit_status(Some(7)), 7);
        assert_eq!(exit_status(Some(256)), 1);
        assert_eq!(exit_status(Some(-1)), 1);
        assert_eq!(exit_status(None), 1);
    }

    #[test]
    fn raw_mode_is_restored_on_drop_and_on_panic() {
        // A pseudo-terminal of our own: the test's stdin may be anything.
        let (mut master, mut slave) = (0, 0);
        // SAFETY: openpty writes two descriptors; the null pointers ask for no name/settings.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0);
        let lflag = || {
            // SAFETY: reads the settings of an open terminal into a zeroed termios.
            let mut t: libc::termios = unsafe { std::mem::zeroed() };
            assert_eq!(unsafe { libc::tcgetattr(slave, &mut t) }, 0);
            t.c_lflag
        };
        let cooked = lflag();
        assert_ne!(cooked & libc::ICANON, 0, "a new terminal is cooked");
        {
            let _raw = RawMode::enter(slave).unwrap();
            assert_eq!(lflag() & (libc::ICANON | libc::ECHO | libc::ISIG), 0);
        }
        assert_eq!(lflag(), cooked);
        let panicked = std::panic::catch_unwind(|| {
            let _raw = RawMode::enter(slave).unwrap();
            panic!("on purpose");
        });
        assert!(panicked.is_err());
        assert_eq!(lflag(), cooked, "restored while unwinding");
        // SAFETY: closes the descriptors openpty gave.
        unsafe {
            libc::close(master);
            libc::close(slave);
        }
    }
}
