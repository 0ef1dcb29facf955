//! `KernelHandle`: a kernel's identity plus the agent context, through which its actor and
//! stages update the kernel's facts and publish its status events.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::config::KernelConfig;
use super::status::{KernelInfo, KernelStatus};
use crate::agent::context::AgentContext;
use crate::agent::events::AgentEvent;

/// A kernel's identity plus the agent context, given to its actor and its stages: they read
/// and update the shared [`KernelInfo`] and publish status events through it.
#[derive(Clone)]
pub struct KernelHandle {
    /// Kernel id.
    pub id: String,
    /// Session id.
    pub session_id: String,
    /// Shared with the registry, which answers status queries without asking the actor.
    pub info: Arc<Mutex<KernelInfo>>,
    /// The agent.
    pub ctx: Arc<AgentContext>,
    /// Bumped when the engine reports something about its container (an exit, an OOM) or a
    /// reconcile asks for a check: the container stage's watcher then inspects it.
    pub container_events: Arc<watch::Sender<u64>>,
}

impl KernelHandle {
    /// A handle for a new kernel (`PREPARING`) or one being adopted.
    pub fn new(
        kernel_id: &str,
        session_id: &str,
        config: KernelConfig,
        ctx: Arc<AgentContext>,
    ) -> KernelHandle {
        KernelHandle {
            id: kernel_id.to_owned(),
            session_id: session_id.to_owned(),
            info: Arc::new(Mutex::new(KernelInfo::new(
                kernel_id,
                session_id,
                Arc::new(config),
            ))),
            ctx,
            container_events: Arc::new(watch::channel(0).0),
        }
    }

    /// Asks the container stage's watcher to look at the container again.
    pub fn poke_container(&self) {
        self.container_events
            .send_modify(|n| *n = n.wrapping_add(1));
    }
    /// The current facts.
    pub fn info(&self) -> KernelInfo {
        self.info.lock().expect("kernel info lock").clone()
    }

    /// Updates the facts.
    pub fn update(&self, f: impl FnOnce(&mut KernelInfo)) {
        f(&mut self.info.lock().expect("kernel info lock"));
    }

    /// Sets the status and publishes its event (`kernel_pulling`, …); `TERMINATED` is
    /// published by [`KernelHandle::terminated`] with its reason.
    pub fn set_status(&self, status: KernelStatus) {
        self.update(|i| i.status = status);
        tracing::info!(agent_id = %self.ctx.agent_id, kernel_id = %self.id, status = status.as_str(), "kernel status");
        let (kernel_id, session_id) = (self.id.clone(), self.session_id.clone());
        let event = match status {
            KernelStatus::Preparing => AgentEvent::KernelPreparing {
                kernel_id,
                session_id,
            },
            KernelStatus::Pulling => AgentEvent::KernelPulling {
                kernel_id,
                session_id,
                image: Some(self.info().config.image.clone()),
            },
            KernelStatus::Creating => AgentEvent::KernelCreating {
                kernel_id,
                session_id,
            },
            KernelStatus::Running => self.started_event(),
            _ => return,
        };
        self.ctx.events.emit(event);
    }

    /// Publishes `kernel_started` again, with the kernel's creation info as it is now: the
    /// answer to a `create_kernels` retry for a kernel already `RUNNING` (Backend.AI's manager
    /// re-sends the call when it missed the event; see `KernelRegistry`'s `CreateKernels`).
    pub fn announce_started(&self) {
        tracing::info!(agent_id = %self.ctx.agent_id, kernel_id = %self.id, "kernel_started sent again");
        self.ctx.events.emit_again(self.started_event());
    }

    /// `kernel_started` with the kernel's creation info.
    fn started_event(&self) -> AgentEvent {
        AgentEvent::KernelStarted {
            kernel_id: self.id.clone(),
            session_id: self.session_id.clone(),
            creation_info: Some(Box::new(super::started::started_info(
                &self.ctx,
                &self.info(),
            ))),
        }
    }

    /// Marks the kernel `TERMINATED` with `reason` and publishes `do_sync_kernel_logs` (when it
    /// had a container) and `kernel_terminated` unless `suppress_events`.
    pub fn terminated(&self, reason: &str, exit_code: Option<i64>, suppress_events: bool) {
        self.update(|i| {
            i.status = KernelStatus::Terminated;
            i.reason = Some(reason.to_owned());
            i.exit_code = exit_code;
        });
        tracing::info!(agent_id = %self.ctx.agent_id, kernel_id = %self.id, reason, ?exit_code, "kernel terminated");
        if !suppress_events {
            // Its logs are complete: Backend.AI's manager fetches them (upstream sends this from
            // `clean_kernel`, before `kernel_terminated`; on its bus only).
            if let Some(container_id) = self.info().container_id {
                self.ctx.events.emit(AgentEvent::DoSyncKernelLogs {
                    kernel_id: self.id.clone(),
                    container_id,
                });
            }
            self.ctx.events.emit(AgentEvent::KernelTerminated {
                kernel_id: self.id.clone(),
                session_id: self.session_id.clone(),
                reason: reason.to_owned(),
                exit_code,
            });
        }
    }
}
