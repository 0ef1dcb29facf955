//! What `kernel_started` tells Backend.AI's manager about a kernel the agent created
//! ([`StartedInfo`], upstream's `KernelCreationInfo`), built from the kernel's facts and the
//! agent's slot allocator when the kernel becomes `RUNNING`.
//!
//! `used_devices` follows upstream's `UsedDevices.from_allocations`
//! (`ai/backend/common/events/event_types/kernel/types.py`): `{device: {unit: {model_name,
//! used: {slot: "decimal"}, processing_units, memory_size}}}`. The intrinsic devices are `cpu`
//! (one unit `"0"` holding all the kernel's cores: the agent does not pin cores, and the
//! manager books the per-slot sums) and `mem` (unit `"root"`, as upstream's memory plugin);
//! their `model_name` is `""` and they have no capacities, as upstream's intrinsic plugins
//! report them. Accelerator units carry the device's model and memory.

use std::collections::BTreeMap;

use crate::agent::context::AgentContext;
use crate::agent::events::{StartedInfo, StartedServicePort, UsedDevice};

use super::KernelInfo;

/// The [`StartedInfo`] of `info`'s kernel on the agent of `ctx`.
pub fn started_info(ctx: &AgentContext, info: &KernelInfo) -> StartedInfo {
    let c = &ctx.config.container;
    let kernel_host = c
        .advertised_host
        .clone()
        .unwrap_or_else(|| c.bind_host.clone());
    let mut used_devices: BTreeMap<String, BTreeMap<String, UsedDevice>> = BTreeMap::new();
    let intrinsic = |slot: &str, unit: &str| {
        info.config
            .slots
            .iter()
            .find(|(s, _)| *s == slot)
            .map(|(_, a)| {
                (
                    unit.to_owned(),
                    UsedDevice {
                        model_name: Some(String::new()),
                        used: BTreeMap::from([(slot.to_owned(), a.to_string())]),
                        processing_units: None,
                        memory_size: None,
                    },
                )
            })
    };
    for (device, unit) in [("cpu", "0"), ("mem", "root")] {
        if let Some(u) = intrinsic(device, unit) {
            used_devices.insert(device.into(), BTreeMap::from([u]));
        }
    }
    let slots = ctx.slots.lock().expect("slot allocator lock");
    if let Some(held) = slots.holders().get(&info.id) {
        let models: BTreeMap<(&str, &str), (&str, u64)> = slots
            .accelerators()
            .plugins()
            .iter()
            .flat_map(|p| p.devices())
            .map(|d| {
                (
                    (d.slot.as_str(), d.id.as_str()),
                    (d.model.as_str(), d.memory),
                )
            })
            .collect();
        for (slot, shares) in held {
            let device = slot.split('.').next().unwrap_or(slot).to_owned();
            let units = used_devices.entry(device.clone()).or_default();
            for (id, amount) in shares {
                let model = models.get(&(slot.as_str(), id.as_str()));
                let unit = units.entry(id.clone()).or_insert_with(|| UsedDevice {
                    model_name: model.map(|(m, _)| (*m).to_owned()),
                    used: BTreeMap::new(),
                    processing_units: None,
                    memory_size: model.and_then(|(_, mem)| (*mem > 0).then_some(*mem as i64)),
                });
                unit.used.insert(slot.clone(), amount.to_string());
            }
        }
    }
    drop(slots);
    StartedInfo {
        container_id: info.container_id.clone().unwrap_or_default(),
        kernel_host,
        repl_in_port: 0,
        repl_out_port: 0,
        service_ports: info
            .service_ports
            .iter()
            .map(|s| StartedServicePort {
                name: s.name.clone(),
                protocol: s.protocol.clone(),
                container_ports: s.container_ports.clone(),
                host_ports: s.host_ports.clone(),
            })
            .collect(),
        used_devices,
    }
}
