//! `mock`: devices declared in `agent.toml` (`[[accelerator.mock.devices]]`), allocated exactly
//! as real ones, so GPU scheduling and allocation run without a GPU (Backend.AI's
//! `backend.ai-accelerator-mock`). The container gets the environment a real device would give
//! but no device node; with no runtime to renumber, `CUDA_VISIBLE_DEVICES` lists the allocated
//! ids in the agent's numbering.

use std::time::{SystemTime, UNIX_EPOCH};

use super::{Accelerator, ContainerConfig, Device, DeviceMap, DeviceSample};
use crate::config::MockDeviceConfig;

/// Mock devices.
#[derive(Debug)]
pub struct Mock {
    devices: Vec<Device>,
    /// Each device's fixed utilization reading (`utilization` in its config), by index.
    fixed: Vec<Option<f64>>,
}

impl Mock {
    /// The configured devices, in config order.
    pub fn new(config: &[MockDeviceConfig]) -> Mock {
        Mock {
            devices: config
                .iter()
                .map(|d| Device {
                    id: d.id.clone(),
                    slot: d.slot.clone(),
                    memory: d.memory.0,
                    model: "Mock GPU".into(),
                })
                .collect(),
            fixed: config.iter().map(|d| d.utilization).collect(),
        }
    }
}

impl Accelerator for Mock {
    fn name(&self) -> &'static str {
        "mock"
    }

    fn devices(&self) -> &[Device] {
        &self.devices
    }

    fn container_config(&self, devices: &DeviceMap) -> ContainerConfig {
        ContainerConfig {
            env: vec![(
                "CUDA_VISIBLE_DEVICES".into(),
                super::device_ids(devices).join(","),
            )],
            nvidia_device_ids: Vec::new(),
            device_nodes: Vec::new(),
            binds: Vec::new(),
        }
    }

    /// Plausible readings: utilization drifting between 0 and 100 % over a minute (offset per
    /// device), a quarter to three quarters of the memory in use; a device configured with a
    /// `utilization` reads that instead.
    fn sample(&self) -> Vec<DeviceSample> {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let phase = (t / 60.0 + i as f64 / 4.0) * std::f64::consts::TAU;
                let wave = (phase.sin() + 1.0) / 2.0;
                DeviceSample {
                    id: d.id.clone(),
                    utilization_pct: self
                        .fixed
                        .get(i)
                        .copied()
                        .flatten()
                        .unwrap_or((wave * 100.0).clamp(0.0, 100.0)),
                    mem_used_bytes: (d.memory as f64 * (0.25 + wave / 2.0)) as u64,
                    mem_total_bytes: d.memory,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ByteSize;

    #[test]
    fn samples_are_plausible_and_env_names_agent_ids() {
        let m = Mock::new(&[
            MockDeviceConfig {
                id: "0".into(),
                memory: ByteSize(16 << 30),
                slot: "cuda.device".into(),
                utilization: None,
            },
            MockDeviceConfig {
                id: "3".into(),
                memory: ByteSize(8 << 30),
                slot: "cuda.device".into(),
                utilization: None,
            },
        ]);
        for s in m.sample() {
            assert!((0.0..=100.0).contains(&s.utilization_pct), "{s:?}");
            assert!(s.mem_used_bytes <= s.mem_total_bytes, "{s:?}");
        }
        let alloc = DeviceMap::from([(
            "cuda.device".to_owned(),
            [("3".to_owned(), crate::slots::Amount::from_units(1))].into(),
        )]);
        let c = m.container_config(&alloc);
        assert_eq!(c.env, vec![("CUDA_VISIBLE_DEVICES".into(), "3".into())]);
        assert!(c.nvidia_device_ids.is_empty());
    }
}
