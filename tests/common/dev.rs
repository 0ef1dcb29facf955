//! `scripts/dev-run.sh` (what `just run` starts) in a temporary root: a copy of `scripts/` and
//! `configs/dev/` on free ports, so a test never meets a developer's own `just run`.

use std::path::{Path, PathBuf};

use super::agent::free_port;
use super::pty::Pty;

/// A copy of the dev setup on free ports.
pub struct DevRoot {
    pub dir: tempfile::TempDir,
    /// The manager API's port.
    pub api: u16,
    /// Every port of the pair: API, intake, agent RPC, agent metrics.
    pub ports: Vec<u16>,
}

impl DevRoot {
    pub fn new() -> DevRoot {
        let dir = tempfile::tempdir().unwrap();
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        std::fs::create_dir_all(dir.path().join("scripts")).unwrap();
        std::fs::create_dir_all(dir.path().join("configs/dev")).unwrap();
        // A link to the script, not a copy: a copy is a file this process wrote, and a sibling
        // thread's fork while it was open for writing made exec fail with `Text file busy`.
        std::os::unix::fs::symlink(
            repo.join("scripts/dev-run.sh"),
            dir.path().join("scripts/dev-run.sh"),
        )
        .unwrap();
        let (api, event, rpc, metrics) = (free_port(), free_port(), free_port(), free_port());
        let base = 30_000 + (free_port() % 20) * 100 + 5_000;
        let manager = std::fs::read_to_string(repo.join("configs/dev/manager.toml"))
            .unwrap()
            .replace("port = 8081", &format!("port = {api}"))
            .replace("port = 16021", &format!("port = {event}"));
        let agent = std::fs::read_to_string(repo.join("configs/dev/agent.toml"))
            .unwrap()
            .replace("port = 16011", &format!("port = {rpc}"))
            .replace("port = 16021", &format!("port = {event}"))
            .replace(
                "port-range = [30000, 30100]",
                &format!("port-range = [{base}, {}]", base + 99),
            )
            .replace(
                "[manager]",
                &format!(
                    "service-addr = {{ host = \"127.0.0.1\", port = {metrics} }}\n\n[manager]"
                ),
            );
        assert!(
            agent.contains(&format!("port = {rpc}")) && manager.contains(&format!("port = {api}"))
        );
        std::fs::write(dir.path().join("configs/dev/manager.toml"), manager).unwrap();
        std::fs::write(dir.path().join("configs/dev/agent.toml"), agent).unwrap();
        DevRoot {
            dir,
            api,
            ports: vec![api, event, rpc, metrics],
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// The pid in `var/dev/NAME.pid`.
    pub fn pid(&self, name: &str) -> Option<i32> {
        std::fs::read_to_string(self.dir.path().join(format!("var/dev/{name}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// A shell in the root, the script's binary the one under test.
    pub fn shell(&self) -> Pty {
        Pty::shell(
            self.dir.path(),
            40,
            200,
            &[("KV_BIN", env!("CARGO_BIN_EXE_kernelvisor"))],
        )
    }
}

impl Drop for DevRoot {
    fn drop(&mut self) {
        // A failed test must not leave a pair or its kernels behind.
        for name in ["agent", "manager"] {
            if let Some(pid) = self.pid(name) {
                // SAFETY: signalling a pid.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let root = self.path();
        let _ = std::process::Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                "label=ai.backend.agent-id=agent-dev",
            ])
            .output()
            .map(|o| {
                for id in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    let mounts = std::process::Command::new("docker")
                        .args(["inspect", "-f", "{{json .Mounts}}", id])
                        .output()
                        .map(|m| String::from_utf8_lossy(&m.stdout).into_owned())
                        .unwrap_or_default();
                    if mounts.contains(&root.to_string_lossy().into_owned()) {
                        let _ = std::process::Command::new("docker")
                            .args(["rm", "-f", id])
                            .output();
                    }
                }
            });
    }
}
