//! Backend.AI's kernel runner (`ai.backend.kernel`, PyPI `backend.ai-kernel` 26.9.6) inside a
//! kernel's container, and the agent's side of it (`docs/kernel-runner.md`).
//!
//! `just krunner` provisions the runner offline into a directory (`[kernel-runner] dir`):
//! [`krunner`] locates its parts and the read-only binds a container gets; [`gate`] decides
//! which kernels get it (labelled glibc images, `[kernel-runner] mode`); [`launch`] prepares
//! such a container as upstream's Docker agent does (entrypoint, command, environment,
//! scratch files, ports); [`client`] is the per-kernel connection over the runner's two
//! ZeroMQ sockets ([`protocol`]), held in the agent's [`Runners`] table.

pub mod client;
pub mod gate;
pub mod keys;
pub mod krunner;
pub mod launch;
pub mod protocol;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use client::{RunnerAnswer, RunnerClient, RunnerError, RunnerPorts};
pub use gate::Gate;
pub use keys::{RunnerKeys, UserKeypair};
pub use krunner::Krunner;

use crate::config::KernelRunnerSection;

/// The agent's runner state: the provisioned runner (if any), the glibc answers per image id,
/// and one [`RunnerClient`] per runner kernel.
pub struct Runners {
    /// `[kernel-runner]`.
    pub config: KernelRunnerSection,
    /// The located runner (`None`: no `dir`, or it did not hold one).
    pub krunner: Option<Arc<Krunner>>,
    /// Runner kernels' SSH keys, made ahead with the runner's `dropbearmulti`.
    keys: Option<RunnerKeys>,
    zctx: zmq::Context,
    glibc: Mutex<HashMap<String, bool>>,
    clients: Mutex<HashMap<String, Arc<RunnerClient>>>,
    cap: usize,
    idle: Duration,
}

impl Runners {
    /// The table for `config`, locating the runner in its `dir` (logged: what was found, or
    /// why nothing). Each run buffers at most `cap` bytes and is abandoned after `idle` unread.
    pub fn new(config: KernelRunnerSection, cap: usize, idle: Duration) -> Runners {
        let krunner = match &config.dir {
            None => {
                tracing::info!(mode = ?config.mode, "kernel runner: no [kernel-runner] dir; kernels take the process path");
                None
            }
            Some(dir) => match Krunner::locate(dir) {
                Ok(k) => {
                    tracing::info!(dir = %dir.display(), env = %k.env.display(), krunner_version = k.version, python = %k.python, mode = ?config.mode, "kernel runner found");
                    Some(Arc::new(k))
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "kernel runner: not usable (run `just krunner`); kernels take the process path");
                    None
                }
            },
        };
        let keys = krunner.as_ref().map(|k| RunnerKeys::new(k.dropbearmulti()));
        Runners {
            config,
            krunner,
            keys,
            zctx: zmq::Context::new(),
            glibc: Mutex::new(HashMap::new()),
            clients: Mutex::new(HashMap::new()),
            cap,
            idle,
        }
    }

    /// An sshd host key for a new runner kernel (made ahead, else now).
    ///
    /// Errors: no runner is provisioned; the keygen's.
    pub fn host_key(&self) -> std::io::Result<Vec<u8>> {
        self.keys()?.host.take()
    }

    /// A user keypair for a new runner kernel whose manager sent none (made ahead, else now).
    ///
    /// Errors: no runner is provisioned; the keygen's.
    pub fn user_keypair(&self) -> std::io::Result<UserKeypair> {
        self.keys()?.user.take()
    }

    fn keys(&self) -> std::io::Result<&RunnerKeys> {
        self.keys
            .as_ref()
            .ok_or_else(|| std::io::Error::other("no kernel runner is provisioned"))
    }

    /// The cached glibc answer for image `image_id`, if probed.
    pub fn glibc_known(&self, image_id: &str) -> Option<bool> {
        self.glibc
            .lock()
            .expect("glibc lock")
            .get(image_id)
            .copied()
    }

    /// Records the glibc answer for image `image_id`.
    pub fn set_glibc(&self, image_id: &str, glibc: bool) {
        self.glibc
            .lock()
            .expect("glibc lock")
            .insert(image_id.to_owned(), glibc);
    }

    /// Kernel `kernel_id`'s client, connecting (lazily: also after an agent restart, from the
    /// ports its container publishes) when there is none or it has other ports.
    ///
    /// Errors: [`RunnerError::Socket`].
    pub fn client(
        &self,
        kernel_id: &str,
        ports: RunnerPorts,
    ) -> Result<Arc<RunnerClient>, RunnerError> {
        let mut clients = self.clients.lock().expect("runner clients lock");
        if let Some(c) = clients.get(kernel_id).filter(|c| c.ports() == ports) {
            return Ok(c.clone());
        }
        let c = Arc::new(RunnerClient::connect(
            &self.zctx, kernel_id, ports, self.cap, self.idle,
        )?);
        clients.insert(kernel_id.to_owned(), c.clone());
        Ok(c)
    }

    /// Closes and drops kernel `kernel_id`'s client: a call waiting on it ends at once (its
    /// run `finished` without an exit code); the sockets close once no call holds it.
    pub fn forget(&self, kernel_id: &str) {
        let gone = self
            .clients
            .lock()
            .expect("runner clients lock")
            .remove(kernel_id);
        if let Some(c) = gone {
            c.close();
        }
    }

    /// Clients held.
    pub fn len(&self) -> usize {
        self.clients.lock().expect("runner clients lock").len()
    }

    /// No clients held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
