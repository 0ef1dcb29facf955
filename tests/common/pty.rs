//! A shell on a pseudo-terminal, as a person's: `bash -i` as the session leader with the pty as
//! its controlling terminal, so job control, Ctrl+C (the byte 0x03 typed) and `| tee` behave as
//! at a real terminal. Output is collected by a thread; [`Pty::expect`] waits for a text in it.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An interactive shell on a pty.
pub struct Pty {
    master: File,
    child: Child,
    out: Arc<Mutex<Vec<u8>>>,
}

impl Pty {
    /// Starts `bash --norc -i` in `dir` on a new pty of `rows`×`cols`, with `env` added.
    pub fn shell(dir: &std::path::Path, rows: u16, cols: u16, env: &[(&str, &str)]) -> Pty {
        let (mut master, mut slave) = (0, 0);
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: out-pointers to two ints and a winsize that live across the call.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                &size,
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: openpty gave us these two descriptors; each File owns one.
        let (master, slave) = unsafe { (File::from_raw_fd(master), File::from_raw_fd(slave)) };
        let mut cmd = Command::new("bash");
        cmd.args(["--norc", "--noprofile", "-i"])
            .current_dir(dir)
            .env("PS1", "$ ")
            .env("TERM", "dumb")
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        for (k, v) in env {
            cmd.env(k, v);
        }
        // SAFETY: setsid and ioctl are async-signal-safe; the child makes the pty (its stdin)
        // its controlling terminal, as a login shell's would be.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("bash");
        let out = Arc::new(Mutex::new(Vec::new()));
        let (mut reader, sink) = (master.try_clone().unwrap(), out.clone());
        std::thread::spawn(move || {
            let mut buf = [0; 8192];
            // EIO once every holder of the slave side has gone.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Pty { master, child, out }
    }

    /// Types `text` (a line needs its `\n`; Ctrl+C is `"\x03"`).
    pub fn send(&mut self, text: &str) {
        self.master.write_all(text.as_bytes()).unwrap();
        self.master.flush().unwrap();
    }

    /// Everything the terminal showed so far, lossily decoded.
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    /// Waits until the output holds `text` after byte `from`; answers where it ends, or `None`
    /// after `timeout`.
    pub fn expect_from(&self, from: usize, text: &str, timeout: Duration) -> Option<usize> {
        let end = Instant::now() + timeout;
        loop {
            {
                let out = self.out.lock().unwrap();
                let hay = String::from_utf8_lossy(&out[from.min(out.len())..]).into_owned();
                if let Some(i) = hay.find(text) {
                    return Some(from + i + text.len());
                }
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// How many bytes the output holds now (a mark for [`Pty::expect_from`]).
    pub fn mark(&self) -> usize {
        self.out.lock().unwrap().len()
    }

    /// Sets the window size (the kernel sends the foreground job SIGWINCH).
    pub fn resize(&self, rows: u16, cols: u16) {
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads the winsize we pass.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ as _, &size) };
        assert_eq!(rc, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
