//! Node-level state the RPC methods share with the agent's run loop: host ports handed out by
//! `assign_port` until `release_port`, and a shutdown asked for by `shutdown_agent` (image
//! pulls are `pulls.rs`).

use std::collections::BTreeSet;
use std::sync::Mutex;

use tokio::sync::watch;

use crate::config::OnShutdown;

/// See the module docs. Every method is cheap and never holds a lock across an await.
pub struct NodeState {
    assigned_ports: Mutex<BTreeSet<u16>>,
    shutdown: watch::Sender<Option<OnShutdown>>,
}

impl Default for NodeState {
    fn default() -> Self {
        NodeState {
            assigned_ports: Mutex::default(),
            shutdown: watch::channel(None).0,
        }
    }
}

/// `reference` as the engine names it: without `docker.io/` or `library/`, with `:latest`
/// when it has neither a tag nor a digest (`python` and `docker.io/library/python:latest` are
/// one image).
pub fn normalize_image(reference: &str) -> String {
    let r = reference.strip_prefix("docker.io/").unwrap_or(reference);
    let r = r.strip_prefix("library/").unwrap_or(r);
    let last = r.rsplit('/').next().unwrap_or(r);
    if r.contains('@') || last.contains(':') {
        r.to_owned()
    } else {
        format!("{r}:latest")
    }
}

impl NodeState {
    /// Records `port` as handed out by `assign_port`.
    pub fn port_assigned(&self, port: u16) {
        self.assigned_ports
            .lock()
            .expect("assigned ports lock")
            .insert(port);
    }

    /// Forgets `port` as handed out; `false` when `assign_port` did not hand it out (a
    /// kernel's port is never released this way).
    pub fn port_unassigned(&self, port: u16) -> bool {
        self.assigned_ports
            .lock()
            .expect("assigned ports lock")
            .remove(&port)
    }

    /// The ports `assign_port` handed out and nobody released, ascending.
    pub fn assigned_ports(&self) -> Vec<u16> {
        self.assigned_ports
            .lock()
            .expect("assigned ports lock")
            .iter()
            .copied()
            .collect()
    }

    /// Asks the agent's run loop to shut down as on SIGTERM, kernels kept or destroyed per
    /// `mode`. The first request wins.
    pub fn request_shutdown(&self, mode: OnShutdown) {
        self.shutdown.send_if_modified(|m| {
            let first = m.is_none();
            if first {
                *m = Some(mode);
            }
            first
        });
    }

    /// Resolves with the mode once a shutdown was requested (at once if it already was).
    pub async fn shutdown_requested(&self) -> OnShutdown {
        let mut rx = self.shutdown.subscribe();
        loop {
            if let Some(mode) = *rx.borrow_and_update() {
                return mode;
            }
            if rx.changed().await.is_err() {
                // The sender lives as long as `self`: unreachable while borrowed.
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_named_as_the_engine_names_them() {
        assert_eq!(normalize_image("python"), "python:latest");
        assert_eq!(
            normalize_image("docker.io/library/python:latest"),
            "python:latest"
        );
        assert_eq!(normalize_image("library/python"), "python:latest");
        assert_eq!(
            normalize_image("cr.backend.ai/stable/python:3.9"),
            "cr.backend.ai/stable/python:3.9"
        );
        assert_eq!(normalize_image("host:5000/x"), "host:5000/x:latest");
        assert_eq!(normalize_image("x@sha256:ab"), "x@sha256:ab");
    }

    #[tokio::test]
    async fn the_first_shutdown_request_wins() {
        let n = NodeState::default();
        n.request_shutdown(OnShutdown::Terminate);
        n.request_shutdown(OnShutdown::Preserve);
        assert_eq!(n.shutdown_requested().await, OnShutdown::Terminate);
        n.port_assigned(30001);
        assert!(n.port_unassigned(30001) && !n.port_unassigned(30001));
    }
}
