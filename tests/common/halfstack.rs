//! The driver of the Backend.AI halfstack harness, `tests/bai_halfstack/halfstack.sh ROOT WORK
//! SUBCOMMAND …` (`halfstack.py`'s subcommands in the trixie root of `just bai-env`), shared by
//! the halfstack test (`tests/it/bai_halfstack.rs`) and `just bench backend-ai`
//! (`benches/backend_ai.rs`, which includes this file by its path): the command, run as root
//! (else through `sudo -n`: the mount namespace and the chroot need it), a subcommand's JSON
//! lines, and on drop `down` (every process the halfstack started stopped by its pid, every
//! container of [`Halfstack::agent_ids`] removed), the mount point the script made in the root
//! and `WORK` removed. Self-contained: the bench has none of the tests' other helpers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

/// A halfstack's root and work directory, and the agents whose containers go with it.
pub struct Halfstack {
    /// The trixie root (`$KV_BAI_ROOT`).
    pub root: PathBuf,
    /// Its state, logs and keys (`halfstack.json`, `logs/`, `keys/`); an absolute path.
    pub work: PathBuf,
    /// Agent ids whose containers `down` removes (upstream's own agent is known to the state).
    pub agent_ids: Vec<String>,
}

impl Halfstack {
    /// A halfstack in `root` with its state in `work` (nothing is started yet: `up` is a
    /// subcommand).
    pub fn new(root: &Path, work: PathBuf) -> Halfstack {
        Halfstack {
            root: root.to_owned(),
            work,
            agent_ids: Vec::new(),
        }
    }

    /// `halfstack.sh ROOT WORK args…`.
    pub fn command(&self, args: &[&str]) -> Command {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bai_halfstack/halfstack.sh");
        // SAFETY: geteuid has no preconditions.
        let mut cmd = if unsafe { libc::geteuid() } == 0 {
            Command::new(script)
        } else {
            let mut c = Command::new("sudo");
            c.arg("-n").arg(script);
            c
        };
        cmd.arg(&self.root).arg(&self.work).args(args);
        cmd
    }

    /// Runs a subcommand with its stderr to `stderr`: the JSON lines of its stdout, in order,
    /// and its exit status; `each` sees every stdout line and whether it was JSON.
    ///
    /// Errors: the script could not be started, or its stdout not read.
    pub fn lines(
        &self,
        args: &[&str],
        stderr: Stdio,
        mut each: impl FnMut(&str, bool),
    ) -> std::io::Result<(Vec<serde_json::Value>, ExitStatus)> {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            match serde_json::from_str::<serde_json::Value>(&line) {
                Ok(v) => {
                    each(&line, true);
                    lines.push(v);
                }
                Err(_) => each(&line, false),
            }
        }
        Ok((lines, child.wait()?))
    }
}

impl Drop for Halfstack {
    fn drop(&mut self) {
        let mut args = vec!["down".to_owned()];
        for id in &self.agent_ids {
            args.extend(["--agent-id".to_owned(), id.clone()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let _ = self.command(&args).status();
        // What halfstack.sh made inside the root for its mount points.
        if let Ok(inside) = self.work.strip_prefix("/") {
            let _ = std::fs::remove_dir(self.root.join(inside));
        }
        let _ = std::fs::remove_dir_all(&self.work);
    }
}
