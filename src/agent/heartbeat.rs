//! The heartbeat: every `heartbeat-interval` (default 20 s) the agent tells the manager who it
//! is, what it has and which kernels it runs (`docs/events.md`).
//!
//! Latest-wins: a heartbeat goes on its own connection, never behind events, and one that
//! cannot be delivered is dropped, never queued or replayed: the next one supersedes it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;
use actors::{ChildSpec, StopSignal};

use super::backend::ContainerBackend;
use super::context::AgentContext;
use super::intakes::Intakes;
use super::kernels::CurrentRegistry;
use super::node::normalize_image;
use super::registry::{KernelRegistry, ListKernels};
use crate::rpc::intake_api::heartbeat::{HeartbeatInfo, HeartbeatKernel, HeartbeatSlots};
use crate::rpc::{Call, Peer, PeerOptions};

/// The intake method that takes a heartbeat: `agent_heartbeat(agent_id, info)`.
pub const HEARTBEAT_METHOD: &str = crate::rpc::intake_api::HEARTBEAT_METHOD;

/// What a heartbeat says besides the live facts: set once at start.
#[derive(Clone, Debug)]
pub struct Identity {
    /// `[agent] region`.
    pub region: String,
    /// The RPC endpoint the manager should call, `tcp://host:port`.
    pub rpc_addr: String,
    /// The agent's CURVE public key (Z85), when CURVE is on.
    pub public_key: Option<String>,
}

/// At most this many image references go into a heartbeat's `images`: the largest images'
/// first, as the kubelet reports only its largest images in the node status
/// (`--node-status-max-images`, 50 there), so a node holding thousands of images cannot bloat
/// every heartbeat (1,000 references are about 50 KiB).
pub const MAX_HEARTBEAT_IMAGES: usize = 1000;

/// How long one listing of the engine's images serves the heartbeats (Backend.AI's agent
/// rescans every 20 s, `ScanImagesTask`): listing on every beat against a busy engine is
/// wasteful. A kernel running an image the listing lacks (pulled since) makes the next beat
/// rescan sooner, at most every [`IMAGE_RESCAN_MIN`].
pub const IMAGE_RESCAN_INTERVAL: Duration = Duration::from_secs(30);

/// The shortest time between two listings of the engine's images.
pub const IMAGE_RESCAN_MIN: Duration = Duration::from_secs(5);

/// The longest one listing of the engine's images may take; a slower engine keeps the last
/// listing in the heartbeat rather than delaying it.
const IMAGE_LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// The engine's local images as heartbeats report them: a cached listing, rescanned every
/// [`IMAGE_RESCAN_INTERVAL`] (or sooner, see there). Each entry is a reference as the engine
/// names it ([`normalize_image`]), at most [`MAX_HEARTBEAT_IMAGES`], the largest images'
/// first; an engine that cannot list keeps the last listing (none before the first).
#[derive(Debug)]
pub struct LocalImages {
    every: Duration,
    min: Duration,
    last: tokio::sync::Mutex<Option<ImageScan>>,
}

impl Default for LocalImages {
    /// Rescanned every [`IMAGE_RESCAN_INTERVAL`], at most every [`IMAGE_RESCAN_MIN`].
    fn default() -> Self {
        LocalImages::new(IMAGE_RESCAN_INTERVAL, IMAGE_RESCAN_MIN)
    }
}

#[derive(Debug)]
struct ImageScan {
    at: Instant,
    refs: Arc<Vec<String>>,
    set: HashSet<String>,
}

impl LocalImages {
    /// A cache listing again after `every`, or after `min` when a kernel's image is missing.
    pub fn new(every: Duration, min: Duration) -> LocalImages {
        LocalImages {
            every,
            min,
            last: tokio::sync::Mutex::default(),
        }
    }

    /// The references, listed again when the last listing is older than `every`
    /// ([`IMAGE_RESCAN_INTERVAL`]), or older than `min` ([`IMAGE_RESCAN_MIN`]) and one of
    /// `in_use` (the images of kernels whose container exists, any spelling) is not in it.
    pub async fn get(&self, backend: &dyn ContainerBackend, in_use: &[&str]) -> Arc<Vec<String>> {
        let mut last = self.last.lock().await;
        let stale = match &*last {
            None => true,
            Some(scan) => {
                let age = scan.at.elapsed();
                age >= self.every
                    || (age >= self.min
                        && in_use
                            .iter()
                            .any(|r| !scan.set.contains(&normalize_image(r))))
            }
        };
        if stale {
            match tokio::time::timeout(IMAGE_LIST_TIMEOUT, backend.list_images()).await {
                Ok(Ok(images)) => {
                    let refs = heartbeat_images(images);
                    *last = Some(ImageScan {
                        at: Instant::now(),
                        set: refs.iter().cloned().collect(),
                        refs: Arc::new(refs),
                    });
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "listing the engine's images failed; the heartbeat keeps the last listing")
                }
                Err(_) => tracing::debug!(
                    "listing the engine's images took over {IMAGE_LIST_TIMEOUT:?}; the heartbeat keeps the last listing"
                ),
            }
        }
        last.as_ref()
            .map(|scan| scan.refs.clone())
            .unwrap_or_default()
    }
}

/// The references of `images` for a heartbeat: every tag as the engine names it
/// ([`normalize_image`]), the largest images' first (ties by name), each once, at most
/// [`MAX_HEARTBEAT_IMAGES`].
pub fn heartbeat_images(mut images: Vec<super::backend::ImageSummary>) -> Vec<String> {
    for i in &mut images {
        i.tags.sort();
    }
    images.sort_by(|a, b| b.size_bytes.cmp(&a.size_bytes).then(a.tags.cmp(&b.tags)));
    let mut seen = HashSet::new();
    images
        .iter()
        .flat_map(|i| &i.tags)
        .map(|t| normalize_image(t))
        .filter(|r| seen.insert(r.clone()))
        .take(MAX_HEARTBEAT_IMAGES)
        .collect()
}

/// Builds the heartbeat ([`HeartbeatInfo`], `docs/events.md`): the identity, `ts` (Unix
/// seconds), every slot's total, available and occupied amount (`cpu` cores, `mem` bytes, each
/// accelerator slot such as `cuda.device` / `cuda.shares`) and unit, every kernel not
/// `TERMINATED`, and the engine's local images from `images` ([`LocalImages`]; at most
/// [`MAX_HEARTBEAT_IMAGES`]).
pub async fn build(
    ctx: &AgentContext,
    registry: &Addr<KernelRegistry>,
    who: &Identity,
    images: &LocalImages,
) -> HeartbeatInfo {
    let (slots, units) = {
        let slots = ctx.slots.lock().expect("slot allocator lock");
        (
            HeartbeatSlots {
                total: slots.capacity(),
                available: slots.available(),
                occupied: slots.used(),
            },
            slots.slot_types().clone(),
        )
    };
    let kernels = registry.send(ListKernels).await.unwrap_or_default();
    // Idle reclaim: a run still going (an `execute`, a terminal) is activity now.
    let running = ctx.runs.live_kernels();
    let live = kernels
        .iter()
        .filter(|k| k.status != super::kernel::KernelStatus::Terminated)
        .map(|k| {
            if running.contains(&k.id) {
                ctx.activity.touch(&k.id);
            }
            let activity = ctx.activity.take(&k.id);
            HeartbeatKernel {
                id: k.id.clone(),
                session_id: k.session_id.clone(),
                status: k.status.as_str().to_owned(),
                last_activity: activity.last_activity,
                utilization: activity.utilization,
            }
        })
        .collect();
    // Kernels whose container exists: their images are stored in the engine.
    let in_use: Vec<&str> = kernels
        .iter()
        .filter(|k| {
            use super::kernel::KernelStatus::{Creating, Restarting, Running};
            matches!(k.status, Creating | Running | Restarting)
        })
        .map(|k| k.config.image.as_str())
        .collect();
    let images = images.get(ctx.backend.as_ref(), &in_use).await.to_vec();
    HeartbeatInfo {
        agent_id: ctx.agent_id.clone(),
        region: who.region.clone(),
        addr: who.rpc_addr.clone(),
        public_key: who.public_key.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
        architecture: std::env::consts::ARCH.into(),
        ts: super::store::now(),
        slots,
        slot_key_and_units: Some(units),
        kernels: live,
        images,
    }
}

/// The agent tree's `heartbeat` child: [`run`] with the current registry until stopped.
pub fn child_spec(
    ctx: Arc<AgentContext>,
    registry: CurrentRegistry,
    who: Identity,
    peer: Option<(PeerOptions, Arc<Intakes>)>,
    interval: Duration,
) -> ChildSpec {
    ChildSpec::task("heartbeat", move |stop: StopSignal| {
        let run = run(
            ctx.clone(),
            registry.get(),
            who.clone(),
            peer.clone(),
            interval,
            async move { stop.requested().await },
        );
        async move {
            run.await;
            Ok::<_, String>(())
        }
    })
}

/// Sends a heartbeat every `interval` until `stop`. Without `peer` (standalone) it still
/// refreshes `backendai_agent_heartbeat`.
pub async fn run(
    ctx: Arc<AgentContext>,
    registry: Addr<KernelRegistry>,
    who: Identity,
    peer: Option<(PeerOptions, Arc<Intakes>)>,
    interval: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    let zmq = zmq::Context::new();
    let mut conn: Option<Peer> = None;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut stop = std::pin::pin!(stop);
    let images = LocalImages::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut stop => break,
        }
        let beat = build(&ctx, &registry, &who, &images).await;
        ctx.metrics.heartbeat(super::store::now());
        let Some((opts, intakes)) = &peer else {
            continue;
        };
        // The intake the event sender uses too; a failed beat moves both on.
        let (index, endpoint) = intakes.current();
        // Bounded by the interval: a slow manager never makes heartbeats pile up.
        let timeout = interval.min(Duration::from_secs(5));
        let delivery = tokio::time::timeout(interval, async {
            let p = match &conn {
                Some(p) if !p.is_closed() && p.endpoint() == endpoint => p.clone(),
                _ => {
                    if let Some(old) = conn.take() {
                        old.close();
                    }
                    let mut o = opts.clone();
                    o.endpoint = endpoint.to_owned();
                    o.handshake_timeout = timeout;
                    let p = Peer::connect(&zmq, &o)
                        .await
                        .map_err(|e| ("connect", e.to_string()))?;
                    conn = Some(p.clone());
                    p
                }
            };
            let call = Call {
                args: vec![ctx.agent_id.clone().into(), beat.to_value()],
                kwargs: Vec::new(),
                peer_user_id: None,
            };
            p.call(HEARTBEAT_METHOD, &call, timeout).await.map_err(|e| {
                (
                    if e.is_connection_error() {
                        "unreachable"
                    } else {
                        "rejected"
                    },
                    e.to_string(),
                )
            })
        });
        // Stopping does not wait for a beat in flight.
        let delivered = tokio::select! {
            biased;
            _ = &mut stop => break,
            d = delivery => d,
        };
        let failure = match delivered {
            Ok(Ok(_)) => None,
            Ok(Err(f)) => Some(f),
            Err(_) => Some((
                "timeout",
                "no answer within the heartbeat interval".to_owned(),
            )),
        };
        if let Some((reason, error)) = failure {
            ctx.metrics.heartbeat_failed(reason);
            tracing::debug!(agent_id = %ctx.agent_id, reason, error, "heartbeat not delivered (dropped; the next one supersedes it)");
            if reason != "rejected" {
                if let Some(p) = conn.take() {
                    p.close();
                }
                intakes.failed(index);
            }
        }
    }
    if let Some(p) = conn {
        p.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::backend::dummy::{DummyBackend, DummyDelays};
    use crate::agent::backend::ImageSummary;

    fn image(size: u64, tags: &[&str]) -> ImageSummary {
        ImageSummary {
            id: format!("sha256:{size}"),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            size_bytes: size,
            labels: Default::default(),
        }
    }

    #[test]
    fn largest_images_first_each_once_capped() {
        let refs = heartbeat_images(vec![
            image(10, &["small:1"]),
            image(
                15_000_000_000,
                &["nvcr.io/nvidia/pytorch:24.01", "pt:latest"],
            ),
            image(0, &[]),
            image(500, &["docker.io/library/python:3.12", "python:3.12"]),
        ]);
        assert_eq!(
            refs,
            [
                "nvcr.io/nvidia/pytorch:24.01",
                "pt:latest",
                "python:3.12",
                "small:1"
            ]
        );
        // A node with more images than a heartbeat carries: the largest ones.
        let many = (0..MAX_HEARTBEAT_IMAGES as u64 + 10)
            .map(|i| image(i, &[&format!("img:{i}")]))
            .collect();
        let refs = heartbeat_images(many);
        assert_eq!(refs.len(), MAX_HEARTBEAT_IMAGES);
        assert_eq!(refs[0], format!("img:{}", MAX_HEARTBEAT_IMAGES + 9));
        assert!(!refs.contains(&"img:0".to_owned()));
    }

    #[tokio::test]
    async fn the_listing_is_cached_and_rescanned_when_stale_or_missing_a_running_image() {
        let (every, min) = (Duration::from_millis(600), Duration::from_millis(200));
        let engine = DummyBackend::new(DummyDelays::default());
        engine.hold_image("python:3.12");
        let images = LocalImages::new(every, min);
        assert_eq!(*images.get(&engine, &[]).await, ["python:3.12"]);
        // Pulled meanwhile: not listed until the listing is stale…
        engine.hold_image("cuda:12");
        tokio::time::sleep(min).await;
        assert_eq!(*images.get(&engine, &[]).await, ["python:3.12"]);
        // …or a kernel runs an image the listing lacks (after the shortest interval).
        assert_eq!(
            *images.get(&engine, &["python:3.12", "cuda:12"]).await,
            ["cuda:12", "python:3.12"]
        );
        engine.hold_image("later:1");
        assert_eq!(images.get(&engine, &["later"]).await.len(), 2, "too soon");
        tokio::time::sleep(every).await;
        assert_eq!(images.get(&engine, &[]).await.len(), 3);
    }
}
