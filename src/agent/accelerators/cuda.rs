//! `cuda`: NVIDIA GPUs through NVML ([`GpuSampler`]), each serving one `cuda.device`. A kernel's
//! devices go to Docker as a device request with driver `nvidia` and their NVML indexes; the
//! nvidia runtime renumbers them from 0 inside the container, so `CUDA_VISIBLE_DEVICES` is
//! `0..n-1` (Backend.AI's CUDA plugin does the same).

use super::{Accelerator, ContainerConfig, Device, DeviceMap, DeviceSample};
use crate::agent::stats::gpu::GpuSampler;

/// The slot each NVIDIA GPU serves.
pub const SLOT: &str = "cuda.device";

/// NVIDIA GPUs found through NVML.
pub struct Cuda {
    sampler: GpuSampler,
    devices: Vec<Device>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda")
            .field("devices", &self.devices)
            .finish()
    }
}

impl Cuda {
    /// Opens NVML and lists the GPUs; `None` without NVML or without a GPU (logged at `info`).
    pub fn detect() -> Option<Cuda> {
        let sampler = GpuSampler::init();
        let devices: Vec<Device> = sampler
            .sample()
            .into_iter()
            .map(|g| Device {
                id: g.index.to_string(),
                slot: SLOT.to_owned(),
                memory: g.mem_total_bytes,
                model: g.name,
            })
            .collect();
        if devices.is_empty() {
            tracing::info!("NVML finds no GPU: no cuda.device slots");
            return None;
        }
        Some(Cuda { sampler, devices })
    }
}

impl Accelerator for Cuda {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn devices(&self) -> &[Device] {
        &self.devices
    }

    fn container_config(&self, devices: &DeviceMap) -> ContainerConfig {
        let ids = super::device_ids(devices);
        ContainerConfig {
            env: vec![(
                "CUDA_VISIBLE_DEVICES".into(),
                (0..ids.len())
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            )],
            nvidia_device_ids: ids,
            device_nodes: Vec::new(),
            binds: Vec::new(),
        }
    }

    fn kernel_sample(&self, held: &DeviceMap, container_id: &str) -> Option<(u64, f64)> {
        let (mut mem, mut util, mut n) = (0u64, 0.0f64, 0u32);
        for id in super::device_ids(held) {
            let (m, u) = self
                .sampler
                .container_usage(id.parse().ok()?, container_id)?;
            mem += m;
            util += u;
            n += 1;
        }
        (n > 0).then(|| (mem, util / f64::from(n)))
    }

    fn sample(&self) -> Vec<DeviceSample> {
        self.sampler
            .sample()
            .into_iter()
            .map(|g| DeviceSample {
                id: g.index.to_string(),
                utilization_pct: g.util_pct,
                mem_used_bytes: g.mem_used_bytes,
                mem_total_bytes: g.mem_total_bytes,
            })
            .collect()
    }
}
