//! Stats sampling: node (procfs), containers (cgroup v1/v2 files, Docker stats API as the
//! fallback) and GPUs (NVML), published as Prometheus gauges by the sampler actor, and kept as
//! Backend.AI's live stats ([`live`]) for the `valkey` child.

pub mod cgroup;
pub mod gpu;
pub mod live;
pub mod node;
pub mod process;
pub mod sampler;

use std::sync::Arc;

use actors::{ChildSpec, StopSignal};

use crate::agent::context::AgentContext;
use crate::agent::kernels::CurrentRegistry;
use crate::config::StatsSection;

/// The agent tree's `stats` child: a [`sampler::StatsSampler`] of the current registry, at
/// `[stats]` intervals, until stopped.
pub fn child_spec(
    ctx: Arc<AgentContext>,
    registry: CurrentRegistry,
    intervals: StatsSection,
) -> ChildSpec {
    ChildSpec::task("stats", move |stop: StopSignal| {
        let sampler = sampler::StatsSampler::new(ctx.clone(), registry.get(), intervals.clone());
        async move {
            sampler.run(stop.requested()).await;
            Ok::<_, String>(())
        }
    })
}
