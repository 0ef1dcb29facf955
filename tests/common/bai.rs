//! Helpers of the tests that run Backend.AI's own Python in the trixie root (`tests/it/bai_compat.rs`,
//! `tests/it/bai_events.rs`): processes and directories cleaned up on drop, log tails.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A child process killed (and reaped) on drop.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A directory removed on drop (best effort: the chroot may have written into it as root).
pub struct RemoveOnDrop(pub PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether this process runs as root (`chroot` needs it).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Waits up to 60 s until the agent process `agent` listens on `port` (its RPC port); panics
/// with the tail of its `log` when it exits or does not.
pub fn wait_for_port(port: u16, agent: &mut Child, log: &Path) {
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = agent.try_wait() {
            panic!(
                "the agent exited ({status}); log:\n{}",
                super::agent::read(log)
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the agent's RPC port {port} did not open in 60 s; log:\n{}",
            tail(&super::agent::read(log), 60)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
