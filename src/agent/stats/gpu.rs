//! GPU readings through NVML (`nvml-wrapper`, which loads `libnvidia-ml.so` at run time).

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

/// One reading of one GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSample {
    /// NVML device index (0-based).
    pub index: u32,
    /// Device UUID, e.g. `GPU-5c0f...`.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Percent of the last sample period (1/6 s to 1 s, device dependent) during which a
    /// kernel ran, 0 to 100; NaN when the device does not report it (e.g. with MIG enabled).
    pub util_pct: f64,
    /// Allocated device memory, in bytes.
    pub mem_used_bytes: u64,
    /// Installed device memory, in bytes.
    pub mem_total_bytes: u64,
    /// Core temperature, in degrees Celsius; NaN when not reported.
    pub temperature_c: f64,
    /// Power draw of the board, in watts; NaN when not reported.
    pub power_w: f64,
}

/// Reads GPUs through one NVML handle, opened once.
pub struct GpuSampler {
    nvml: Option<Nvml>,
}

impl GpuSampler {
    /// Opens NVML once. Without a driver or GPU, logs one `info` line and gives a sampler that
    /// is not [`available`](Self::available) and returns no samples; NVML is not tried again.
    pub fn init() -> GpuSampler {
        match Nvml::init() {
            Ok(nvml) => GpuSampler { nvml: Some(nvml) },
            Err(e) => {
                tracing::info!(error = %e, "NVML is unavailable: there will be no GPU metrics");
                GpuSampler { nvml: None }
            }
        }
    }

    /// Whether NVML was opened.
    pub fn available(&self) -> bool {
        self.nvml.is_some()
    }

    /// Reads every GPU, in index order. Empty when NVML is unavailable. A device whose
    /// identity or memory cannot be read is skipped (logged at `debug`); utilization,
    /// temperature and power the device does not support read as NaN.
    pub fn sample(&self) -> Vec<GpuSample> {
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        let count = match nvml.device_count() {
            Ok(count) => count,
            Err(e) => {
                tracing::debug!(error = %e, "NVML device count failed");
                return Vec::new();
            }
        };
        (0..count)
            .filter_map(|index| {
                match nvml
                    .device_by_index(index)
                    .and_then(|device| read_device(index, &device))
                {
                    Ok(sample) => Some(sample),
                    Err(e) => {
                        tracing::debug!(index, error = %e, "skipping GPU whose reading failed");
                        None
                    }
                }
            })
            .collect()
    }
}

impl GpuSampler {
    /// What the processes of one container use of GPU `index`: `(memory bytes, SM utilization
    /// %)`, summed over NVML's running compute processes whose cgroup names `container_id`
    /// (Docker puts the full id in the cgroup path, v1 and v2). `None` without NVML or when the
    /// device cannot be read; utilization is NaN when NVML keeps no per-process samples.
    pub fn container_usage(&self, index: u32, container_id: &str) -> Option<(u64, f64)> {
        let nvml = self.nvml.as_ref()?;
        let device = nvml.device_by_index(index).ok()?;
        let ours = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.contains(container_id))
        };
        let mut pids = Vec::new();
        let mut mem = 0u64;
        for p in device.running_compute_processes().ok()? {
            if ours(p.pid) {
                pids.push(p.pid);
                if let nvml_wrapper::enums::device::UsedGpuMemory::Used(b) = p.used_gpu_memory {
                    mem += b;
                }
            }
        }
        let util = match device.process_utilization_stats(None) {
            Ok(samples) => samples
                .iter()
                .filter(|s| pids.contains(&s.pid))
                .map(|s| f64::from(s.sm_util))
                .sum::<f64>()
                .min(100.0),
            Err(_) => f64::NAN,
        };
        Some((mem, util))
    }
}

fn read_device(index: u32, device: &Device<'_>) -> Result<GpuSample, NvmlError> {
    let memory = device.memory_info()?;
    Ok(GpuSample {
        index,
        uuid: device.uuid()?,
        name: device.name()?,
        util_pct: optional(device.utilization_rates().map(|u| f64::from(u.gpu)))?,
        mem_used_bytes: memory.used,
        mem_total_bytes: memory.total,
        temperature_c: optional(device.temperature(TemperatureSensor::Gpu).map(f64::from))?,
        power_w: optional(
            device
                .power_usage()
                .map(|milliwatts| f64::from(milliwatts) / 1000.0),
        )?,
    })
}

/// NaN for a reading the device does not support; other errors stay errors.
fn optional(reading: Result<f64, NvmlError>) -> Result<f64, NvmlError> {
    match reading {
        Err(NvmlError::NotSupported) => Ok(f64::NAN),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_without_nvml_is_empty_and_with_nvml_reads_devices() {
        let sampler = GpuSampler::init();
        let samples = sampler.sample();
        if !sampler.available() {
            assert!(samples.is_empty());
            return;
        }
        assert!(
            samples.windows(2).all(|w| w[0].index < w[1].index),
            "{samples:?}"
        );
        for gpu in &samples {
            assert!(
                gpu.uuid.starts_with("GPU-") || gpu.uuid.starts_with("MIG-"),
                "{gpu:?}"
            );
            assert!(
                gpu.mem_total_bytes > 0 && gpu.mem_used_bytes <= gpu.mem_total_bytes,
                "{gpu:?}"
            );
            assert!(
                gpu.util_pct.is_nan() || (0.0..=100.0).contains(&gpu.util_pct),
                "{gpu:?}"
            );
        }
    }

    #[test]
    fn unsupported_readings_are_nan() {
        assert!(optional(Err(NvmlError::NotSupported)).unwrap().is_nan());
        assert_eq!(optional(Ok(1.5)).unwrap(), 1.5);
        assert!(optional(Err(NvmlError::GpuLost)).is_err());
    }
}
