//! Stats sampling: node (procfs), containers (cgroup v1/v2 files, Docker stats API as the
//! fallback) and GPUs (NVML), published as Prometheus gauges by the sampler actor.

pub mod cgroup;
pub mod gpu;
pub mod node;
pub mod sampler;
