//! `gather_hwinfo`: real facts about the host, in Backend.AI's `Mapping[str, HardwareMetadata]`
//! shape: one entry per device kind (`cpu`, `mem`, `os`, and `cuda` when NVML finds GPUs), each
//! `{"status": "healthy", "status_info": nil, "metadata": {str: str}}`. With the agent's
//! accelerators ([`gather_with`]): one entry per accelerator other than `cuda` (e.g. `mock`:
//! `device_count`, `device.<id>.slot`, `device.<id>.memory_total_bytes`,
//! `device.<id>.model`), and in each accelerator's entry its slots' units as
//! `slot.<slot>.unit` (`count`; the whole `slot_key_and_units` map is in the heartbeat).

use rmpv::Value;

fn entry<K: Into<String>>(metadata: Vec<(K, String)>) -> Value {
    let metadata = metadata
        .into_iter()
        .map(|(k, v)| (Value::from(k.into()), Value::from(v)))
        .collect();
    Value::Map(vec![
        (Value::from("status"), Value::from("healthy")),
        (Value::from("status_info"), Value::Nil),
        (Value::from("metadata"), Value::Map(metadata)),
    ])
}

/// Collects CPU model and logical core count, total memory (bytes), OS name, kernel and
/// architecture, and NVIDIA GPUs through NVML. Blocking (reads procfs, loads NVML): call it from
/// `spawn_blocking`.
pub fn gather() -> Value {
    use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};
    let sys = System::new_with_specifics(
        RefreshKind::new()
            .with_cpu(CpuRefreshKind::new())
            .with_memory(MemoryRefreshKind::new().with_ram()),
    );
    let model = sys
        .cpus()
        .first()
        .map(|c| c.brand().trim().to_owned())
        .unwrap_or_default();
    let mut info = vec![
        (
            "cpu",
            entry(vec![
                ("model", model),
                ("cores", sys.cpus().len().to_string()),
                (
                    "physical_cores",
                    sys.physical_core_count()
                        .map(|n| n.to_string())
                        .unwrap_or_default(),
                ),
            ]),
        ),
        (
            "mem",
            entry(vec![("total_bytes", sys.total_memory().to_string())]),
        ),
        (
            "os",
            entry(vec![
                ("name", System::long_os_version().unwrap_or_default()),
                ("kernel", System::kernel_version().unwrap_or_default()),
                ("arch", std::env::consts::ARCH.to_owned()),
                ("hostname", System::host_name().unwrap_or_default()),
            ]),
        ),
    ];
    if let Some(cuda) = gpus() {
        info.push(("cuda", cuda));
    }
    Value::Map(info.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
}

/// [`gather`] plus the agent's accelerators: an entry per non-`cuda` accelerator (as
/// `cuda`'s, with `device.<id>.slot`), each accelerator's entry with `slot.<slot>.unit`.
/// Blocking.
pub fn gather_with(accelerators: &crate::agent::accelerators::Accelerators) -> Value {
    let mut info = match gather() {
        Value::Map(m) => m,
        _ => Vec::new(),
    };
    for p in accelerators.plugins() {
        let units = p.slot_types().into_iter().map(|(slot, t)| {
            (
                Value::from(format!("slot.{slot}.unit")),
                Value::from(t.as_str()),
            )
        });
        if p.name() == "cuda" {
            // NVML's own entry, above (when NVML found devices).
            let nvml = info.iter_mut().find(|(k, _)| k.as_str() == Some("cuda"));
            if let Some(Value::Map(e)) = nvml.map(|(_, v)| v) {
                if let Some((_, Value::Map(meta))) =
                    e.iter_mut().find(|(k, _)| k.as_str() == Some("metadata"))
                {
                    meta.extend(units);
                }
            }
            continue;
        }
        let mut meta: Vec<(String, String)> =
            vec![("device_count".into(), p.devices().len().to_string())];
        for d in p.devices() {
            meta.push((format!("device.{}.slot", d.id), d.slot.clone()));
            meta.push((format!("device.{}.model", d.id), d.model.clone()));
            meta.push((
                format!("device.{}.memory_total_bytes", d.id),
                d.memory.to_string(),
            ));
        }
        meta.extend(
            p.slot_types()
                .into_iter()
                .map(|(slot, t)| (format!("slot.{slot}.unit"), t.as_str().to_owned())),
        );
        info.push((Value::from(p.name()), entry(meta)));
    }
    Value::Map(info)
}

/// GPUs via NVML: `None` when NVML is not installed or finds no device (logged once per call at
/// debug level, never an error).
fn gpus() -> Option<Value> {
    let nvml = match nvml_wrapper::Nvml::init() {
        Ok(n) => n,
        Err(e) => {
            tracing::debug!(error = %e, "NVML unavailable; reporting no GPUs");
            return None;
        }
    };
    let count = nvml.device_count().ok().filter(|&n| n > 0)?;
    let mut meta: Vec<(String, String)> = vec![
        ("device_count".into(), count.to_string()),
        (
            "driver_version".into(),
            nvml.sys_driver_version().unwrap_or_default(),
        ),
        (
            "cuda_driver_version".into(),
            nvml.sys_cuda_driver_version()
                .map(|v| v.to_string())
                .unwrap_or_default(),
        ),
    ];
    for i in 0..count {
        let Ok(dev) = nvml.device_by_index(i) else {
            continue;
        };
        let name = dev.name().unwrap_or_default();
        let mem = dev.memory_info().map(|m| m.total).unwrap_or(0);
        let uuid = dev.uuid().unwrap_or_default();
        meta.push((format!("device.{i}.name"), name));
        meta.push((format!("device.{i}.uuid"), uuid));
        meta.push((format!("device.{i}.memory_total_bytes"), mem.to_string()));
    }
    Some(entry(meta))
}
