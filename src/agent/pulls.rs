//! Image pulls of this agent, for `check_and_pull` and for a kernel's `image` stage.
//!
//! - **One engine pull per image at a time**: a second caller for an image being pulled waits
//!   for the same pull (Backend.AI's agent tracks active pulls the same way, `track_pull`).
//! - **Its own phase**: each pull is bounded by `[container] image-pull-timeout` (1 h), not by
//!   any RPC deadline, and runs in its own task, so a caller that goes away does not cancel it.
//! - **Progress in bytes**: the engine's per-layer lines (`Downloading 1.2MB/40MB`, `Pull
//!   complete`, `Already exists`) summed into [`PullProgress`].
//! - The outcome of the last [`RECENT`] pulls is kept, so `image_pull_status` right after a
//!   pull ended still answers it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::backend::{ContainerBackend, ImageInfo, PullProgress as EngineLine, RegistryAuth};
use super::kernel::config::run_reference;
use super::kernel::KernelError;
use super::metrics::AgentMetrics;
use super::node::normalize_image;
use crate::model::pull::PullProgress;
use crate::rpc::agent_api::images::PullState;
use crate::rpc::agent_api::kernel::{registry_host, AutoPullBehavior, ImageConfig, ImageRegistry};

/// Outcomes of ended pulls kept for `image_pull_status`.
pub const RECENT: usize = 256;

/// The failure of a [`PullState::Failed`] as the kernel error of that name; `None` for any
/// other state.
pub fn pull_error(state: &PullState) -> Option<KernelError> {
    let PullState::Failed { error, message } = state else {
        return None;
    };
    let m = message.clone();
    use crate::rpc::failure::Failure;
    Some(match Failure::parse(error) {
        Some(Failure::ImageNotFound) => KernelError::ImageNotFound(m),
        Some(Failure::RegistryUnreachable) => KernelError::RegistryUnreachable(m),
        Some(Failure::RegistryAuthFailed) => KernelError::RegistryAuthFailed(m),
        Some(Failure::ImagePullTimeout) => KernelError::PullTimeout(m),
        Some(Failure::ContainerEngineUnavailable) => KernelError::EngineUnavailable(m),
        _ => KernelError::Engine(m),
    })
}

/// The credentials of `registry` for pulling or pushing `reference`, keyed by the host the
/// reference names (as the engine keys them): only when it has both a user name and a password
/// (upstream's rule); `None` is an anonymous pull or push.
pub fn registry_auth(reference: &str, registry: &ImageRegistry) -> Option<RegistryAuth> {
    match (registry.username.as_deref(), registry.password.as_deref()) {
        (Some(u), Some(p)) if !u.is_empty() && !p.is_empty() => Some(RegistryAuth {
            username: u.to_owned(),
            password: p.to_owned(),
            server: registry_host(reference),
        }),
        _ => None,
    }
}

/// The per-layer lines of one pull, summed.
#[derive(Default)]
struct Layers {
    /// layer id → (bytes downloaded, size when known, done)
    layers: HashMap<String, (u64, u64, bool)>,
}

impl Layers {
    fn apply(&mut self, line: &EngineLine) {
        // Lines about the whole image carry the tag or digest as their id (`Pulling from
        // team/img`, id `1`): only layer statuses make a layer.
        const LAYER_STATUSES: &[&str] = &[
            "Pulling fs layer",
            "Waiting",
            "Downloading",
            "Verifying Checksum",
            "Download complete",
            "Extracting",
            "Pull complete",
            "Already exists",
        ];
        let Some(id) = &line.layer else { return };
        if !LAYER_STATUSES.contains(&line.status.as_str()) {
            return;
        }
        let entry = self.layers.entry(id.clone()).or_default();
        let (current, total) = (
            line.current.unwrap_or(0).max(0) as u64,
            line.total.unwrap_or(0).max(0) as u64,
        );
        match line.status.as_str() {
            "Downloading" => {
                entry.0 = current;
                if total > 0 {
                    entry.1 = total;
                }
            }
            "Download complete" | "Verifying Checksum" => entry.0 = entry.1,
            "Extracting" => {
                if total > 0 {
                    entry.1 = entry.1.max(total);
                }
                entry.0 = entry.1;
            }
            "Pull complete" => {
                entry.0 = entry.1;
                entry.2 = true;
            }
            "Already exists" => entry.2 = true,
            _ => {}
        }
    }

    fn progress(&self) -> PullProgress {
        let mut p = PullProgress::default();
        for (current, total, done) in self.layers.values() {
            p.current_bytes += current;
            p.total_bytes += total;
            p.layers_total += 1;
            p.layers_done += u32::from(*done);
        }
        p
    }
}

/// A started or joined pull: its state as it changes.
pub struct PullWatch {
    /// Whether this call started the engine pull (`false`: it joined one in flight).
    pub started: bool,
    rx: watch::Receiver<PullState>,
}

impl PullWatch {
    /// The state now.
    pub fn now(&self) -> PullState {
        self.rx.borrow().clone()
    }

    /// Waits until the state changes (`false` when the pull task went away).
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }

    /// Waits for the end: `Ok` once the image is local.
    ///
    /// Errors: the failure's kernel error (`ImageNotFound`, `RegistryUnreachable`, …).
    pub async fn finish(mut self) -> Result<(), KernelError> {
        loop {
            let state = self.now();
            if let Some(e) = pull_error(&state) {
                return Err(e);
            }
            if state.is_over() {
                return Ok(());
            }
            if !self.changed().await {
                return Err(KernelError::Engine("the image pull task stopped".into()));
            }
        }
    }
}

/// See the module docs. One per agent (`AgentContext::pulls`).
pub struct ImagePulls {
    backend: Arc<dyn ContainerBackend>,
    metrics: Arc<AgentMetrics>,
    timeout: Duration,
    inflight: Mutex<HashMap<String, watch::Receiver<PullState>>>,
    recent: Mutex<VecDeque<(String, PullState)>>,
}

impl ImagePulls {
    /// Pulls through `backend`, each bounded by `timeout`.
    pub fn new(
        backend: Arc<dyn ContainerBackend>,
        metrics: Arc<AgentMetrics>,
        timeout: Duration,
    ) -> ImagePulls {
        ImagePulls {
            backend,
            metrics,
            timeout,
            inflight: Mutex::default(),
            recent: Mutex::default(),
        }
    }

    /// Whether an engine pull of `reference` is in flight (`check_pulling`).
    pub fn is_pulling(&self, reference: &str) -> bool {
        self.inflight
            .lock()
            .expect("pulls lock")
            .contains_key(&normalize_image(reference))
    }

    /// The pull of `reference` in flight, else the outcome of its last pull; `None` when this
    /// agent has not pulled it lately.
    pub fn status(&self, reference: &str) -> Option<PullState> {
        let key = normalize_image(reference);
        if let Some(rx) = self.inflight.lock().expect("pulls lock").get(&key) {
            return Some(rx.borrow().clone());
        }
        self.recent
            .lock()
            .expect("pulls lock")
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, s)| s.clone())
    }

    /// Records that `reference` needed no pull (it is local), for [`ImagePulls::status`].
    pub fn note_present(&self, reference: &str) {
        self.remember(
            normalize_image(reference),
            PullState::Done {
                progress: PullProgress::default(),
            },
        );
    }

    /// Records that `reference` cannot be had (e.g. `auto_pull = none` and absent).
    pub fn note_failed(&self, reference: &str, e: &KernelError) {
        self.remember(
            normalize_image(reference),
            PullState::Failed {
                error: e.name().into(),
                message: e.to_string(),
            },
        );
    }

    fn remember(&self, key: String, state: PullState) {
        let mut recent = self.recent.lock().expect("pulls lock");
        recent.retain(|(k, _)| *k != key);
        if recent.len() >= RECENT {
            recent.pop_front();
        }
        recent.push_back((key, state));
    }

    /// The local image to use for `image` (the engine's name for it: `run_reference`), or
    /// `None` when it must be pulled: never for a local image (`is_local`, registry `local`) or
    /// with `auto_pull = none`; otherwise when the node lacks it, or, with `auto_pull = digest`
    /// and a known `digest`, when the local image's id differs (Backend.AI's `check_image`). A
    /// `digest` policy without a digest behaves as `tag`.
    ///
    /// Errors: [`KernelError::ImageNotFound`] when it is absent and may not be pulled; an engine
    /// error.
    pub async fn local_image(&self, image: &ImageConfig) -> Result<Option<ImageInfo>, KernelError> {
        let local = self.backend.inspect_image(&run_reference(image)).await?;
        let never = image.is_local
            || image.registry.name == "local"
            || image.auto_pull == AutoPullBehavior::None;
        match local {
            None if never => Err(KernelError::ImageNotFound(format!(
                "{} is not on this node, and a local image (or `auto_pull = none`) is never pulled",
                run_reference(image)
            ))),
            None => Ok(None),
            Some(info) if never => Ok(Some(info)),
            Some(info) => {
                let stale = image.auto_pull == AutoPullBehavior::Digest
                    && !image.digest.is_empty()
                    && info.id != image.digest;
                Ok((!stale).then_some(info))
            }
        }
    }

    /// Starts an engine pull of `reference` with `auth`, or joins the one in flight.
    pub fn start(self: &Arc<Self>, reference: &str, auth: Option<RegistryAuth>) -> PullWatch {
        let key = normalize_image(reference);
        let mut inflight = self.inflight.lock().expect("pulls lock");
        if let Some(rx) = inflight.get(&key) {
            return PullWatch {
                started: false,
                rx: rx.clone(),
            };
        }
        let (tx, rx) = watch::channel(PullState::Pulling {
            progress: PullProgress::default(),
        });
        inflight.insert(key.clone(), rx.clone());
        drop(inflight);
        let me = self.clone();
        let reference = reference.to_owned();
        actix_rt::spawn(async move {
            let state = me.run(&reference, auth.as_ref(), &tx).await;
            // Recent first, then out of flight: `status` never answers `None` in between.
            me.remember(key.clone(), state.clone());
            me.inflight.lock().expect("pulls lock").remove(&key);
            let _ = tx.send(state);
        });
        PullWatch { started: true, rx }
    }

    async fn run(
        &self,
        reference: &str,
        auth: Option<&RegistryAuth>,
        tx: &watch::Sender<PullState>,
    ) -> PullState {
        let layers = Mutex::new(Layers::default());
        let on_line = |line: EngineLine| {
            let progress = {
                let mut l = layers.lock().expect("layers lock");
                l.apply(&line);
                l.progress()
            };
            tx.send_if_modified(|s| {
                let changed = *s != PullState::Pulling { progress };
                *s = PullState::Pulling { progress };
                changed
            });
        };
        tracing::info!(image = %reference, authenticated = auth.is_some(), "pulling image");
        let started = std::time::Instant::now();
        let pulled: Result<ImageInfo, KernelError> = match tokio::time::timeout(
            self.timeout,
            self.backend.pull_image(reference, auth, &on_line),
        )
        .await
        {
            Ok(r) => r.map_err(KernelError::from),
            Err(_) => Err(KernelError::PullTimeout(format!(
                "{reference}: not pulled within {} s ([container] image-pull-timeout)",
                self.timeout.as_secs()
            ))),
        };
        let progress = layers.lock().expect("layers lock").progress();
        let result = match &pulled {
            Ok(_) => "pulled",
            Err(KernelError::ImageNotFound(_)) => "not-found",
            Err(KernelError::RegistryUnreachable(_)) => "unreachable",
            Err(KernelError::RegistryAuthFailed(_)) => "auth-failed",
            Err(KernelError::PullTimeout(_)) => "timeout",
            Err(_) => "error",
        };
        self.metrics.image_pulled(result);
        match pulled {
            Ok(_) => {
                tracing::info!(image = %reference, bytes = progress.total_bytes, seconds = started.elapsed().as_secs_f64(), "image pulled");
                PullState::Done { progress }
            }
            Err(e) => {
                tracing::warn!(image = %reference, error = %e, "image pull failed");
                PullState::Failed {
                    error: e.name().into(),
                    message: e.to_string(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(layer: &str, status: &str, current: i64, total: i64) -> EngineLine {
        EngineLine {
            layer: Some(layer.into()),
            status: status.into(),
            current: (current > 0).then_some(current),
            total: (total > 0).then_some(total),
        }
    }

    /// Lines as Docker 28 sends them for a two-layer image, one of which the node had.
    #[test]
    fn layer_lines_sum_into_bytes() {
        let mut l = Layers::default();
        l.apply(&EngineLine {
            layer: Some("1".into()),
            status: "Pulling from team/busy".into(),
            ..EngineLine::default()
        });
        l.apply(&line("a", "Pulling fs layer", 0, 0));
        l.apply(&line("b", "Already exists", 0, 0));
        l.apply(&line("a", "Downloading", 400, 1000));
        assert_eq!(
            l.progress(),
            PullProgress {
                current_bytes: 400,
                total_bytes: 1000,
                layers_done: 1,
                layers_total: 2
            }
        );
        l.apply(&line("a", "Verifying Checksum", 0, 0));
        l.apply(&line("a", "Download complete", 0, 0));
        l.apply(&line("a", "Extracting", 1000, 1000));
        l.apply(&line("a", "Pull complete", 0, 0));
        let p = l.progress();
        assert_eq!((p.current_bytes, p.total_bytes), (1000, 1000));
        assert_eq!((p.layers_done, p.layers_total), (2, 2));
    }

    #[test]
    fn credentials_come_from_the_registry_of_the_image_config() {
        let reference = "127.0.0.1:5000/team/img:1";
        let mut image = ImageConfig::by_reference(reference);
        assert_eq!(registry_auth(reference, &image.registry), None, "anonymous");
        image.registry.url = "http://127.0.0.1:5000".into();
        image.registry.username = Some("kv".into());
        assert_eq!(
            registry_auth(reference, &image.registry),
            None,
            "no password"
        );
        image.registry.password = Some("pw".into());
        let auth = registry_auth(reference, &image.registry).unwrap();
        assert_eq!(
            (
                auth.username.as_str(),
                auth.password.as_str(),
                auth.server.as_str()
            ),
            ("kv", "pw", "127.0.0.1:5000")
        );
        assert!(!format!("{auth:?}").contains("pw\""), "{auth:?}");
    }

    #[test]
    fn failures_keep_their_names() {
        let s = PullState::Failed {
            error: "RegistryAuthFailed".into(),
            message: "no".into(),
        };
        assert_eq!(pull_error(&s).unwrap().name(), "RegistryAuthFailed");
        assert!(s.is_over());
        let p = PullState::Pulling {
            progress: PullProgress::default(),
        };
        assert!(!p.is_over() && pull_error(&p).is_none());
    }
}
