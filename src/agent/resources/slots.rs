//! The agent's resource slots: capacity (`cpu`, `mem` net of `[resource] reserved-cpu` /
//! `reserved-mem`, plus every accelerator slot's devices) and what kernels hold
//! ([`SlotAllocator`], [`SlotAllocation`]); and the legacy fixed-slot [`SlotRequest`], which only
//! the manager still uses until it moves to [`crate::slots`].

use std::collections::BTreeMap;

use crate::agent::accelerators::{Accelerators, DeviceMap, DeviceShares};
use crate::slots::{Amount, ResourceSlots, SlotError, SlotTypes};

use rmpv::Value;
use serde::{Deserialize, Serialize};

/// Legacy: a fixed-slot request (the manager's scheduler still parses with it); the agent uses
/// [`ResourceSlots`]. `cpu` in millicores (`"0.5"` → 500), `mem` in bytes, and a count
/// of whole `cuda.device`s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRequest {
    /// Thousandths of a core.
    pub cpu_millis: u64,
    /// Bytes.
    pub mem_bytes: u64,
    /// Whole GPUs.
    pub cuda_devices: u32,
}

/// Why a legacy [`SlotRequest`] cannot be parsed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// Malformed request: unknown slot name, negative or non-numeric amount.
    #[error("{0}")]
    Invalid(String),
    /// Not enough of `slot` left: `(slot, requested, available)` in the slot's unit (cores,
    /// bytes, devices).
    #[error("not enough {0}: requested {1}, available {2}")]
    Exhausted(&'static str, String, String),
}

impl SlotRequest {
    /// Parses `{"cpu": 1, "mem": 268435456, "cuda.device": 0}`; amounts are numbers or decimal
    /// strings (`"0.5"`, `"268435456"`). `cpu` and `mem` are required.
    ///
    /// Errors: [`RequestError::Invalid`] naming the slot for an unknown name, a negative,
    /// fractional-where-whole or non-numeric amount, more than 3 decimals of `cpu`, or a
    /// missing `cpu`/`mem`.
    pub fn from_value(slots: &Value) -> Result<SlotRequest, RequestError> {
        let map = slots
            .as_map()
            .ok_or_else(|| RequestError::Invalid("resource_slots must be a map".into()))?;
        let (mut cpu, mut mem) = (None, None);
        let mut req = SlotRequest::default();
        for (k, v) in map {
            let name = k.as_str().unwrap_or("<non-string>");
            let amount = decimal(v).ok_or_else(|| {
                RequestError::Invalid(format!(
                    "resource slot `{name}`: `{v}` is not a non-negative number"
                ))
            })?;
            match name {
                "cpu" => {
                    let millis = amount * 1000.0;
                    if (millis - millis.round()).abs() > 1e-6 {
                        return Err(RequestError::Invalid(format!(
                            "resource slot `cpu`: {amount} has more than 3 decimals"
                        )));
                    }
                    cpu = Some(millis.round() as u64);
                }
                "mem" => mem = Some(whole(name, amount)?),
                "cuda.device" => {
                    // Not `as u32`: 2^32 devices wrapped to 0 and was accepted.
                    req.cuda_devices = u32::try_from(whole(name, amount)?).map_err(|_| {
                        RequestError::Invalid(format!(
                            "resource slot `cuda.device`: {amount} is more than {}",
                            u32::MAX
                        ))
                    })?
                }
                other => {
                    return Err(RequestError::Invalid(format!(
                        "unknown resource slot `{other}` (known: cpu, mem, cuda.device)"
                    )))
                }
            }
        }
        req.cpu_millis =
            cpu.ok_or_else(|| RequestError::Invalid("resource slot `cpu` is required".into()))?;
        req.mem_bytes =
            mem.ok_or_else(|| RequestError::Invalid("resource slot `mem` is required".into()))?;
        if req.cpu_millis == 0 {
            return Err(RequestError::Invalid(
                "resource slot `cpu` must be positive".into(),
            ));
        }
        Ok(req)
    }

    /// The request as Backend.AI writes slots: `{"cpu": "0.5", "mem": "268435456", "cuda.device": "0"}`.
    pub fn to_value(&self) -> Value {
        Value::Map(vec![
            ("cpu".into(), format_cores(self.cpu_millis).into()),
            ("mem".into(), self.mem_bytes.to_string().into()),
            ("cuda.device".into(), self.cuda_devices.to_string().into()),
        ])
    }
}

/// `1500` millicores → `"1.5"`.
pub fn format_cores(millis: u64) -> String {
    if millis % 1000 == 0 {
        (millis / 1000).to_string()
    } else {
        format!("{}", millis as f64 / 1000.0)
    }
}

fn decimal(v: &Value) -> Option<f64> {
    let n = match v {
        Value::Integer(i) => i.as_f64()?,
        Value::F32(f) => *f as f64,
        Value::F64(f) => *f,
        Value::String(s) => s.as_str()?.trim().parse().ok()?,
        _ => return None,
    };
    (n.is_finite() && n >= 0.0).then_some(n)
}

fn whole(name: &str, amount: f64) -> Result<u64, RequestError> {
    if amount.fract() != 0.0 || amount > u64::MAX as f64 {
        return Err(RequestError::Invalid(format!(
            "resource slot `{name}`: {amount} is not a whole number"
        )));
    }
    Ok(amount as u64)
}

/// What one kernel holds: its slots and, per accelerator slot, the devices picked for it.
///
/// Stored in the agent's store (`resources.slots`, `resources_version` 2) as
/// `{"slots": {name: "decimal"}, "devices": {slot: {device id: "decimal"}}}`; the version 1
/// layout `{"request": {"cpu_millis", "mem_bytes", "cuda_devices"}, "gpus": [index]}` still loads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SlotAllocation {
    /// The amounts, every slot asked for.
    pub slots: ResourceSlots,
    /// Devices per accelerator slot: `{slot: {device id: amount}}`.
    #[serde(default)]
    pub devices: DeviceMap,
}

impl<'de> Deserialize<'de> for SlotAllocation {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Current {
            slots: ResourceSlots,
            #[serde(default)]
            devices: DeviceMap,
        }
        #[derive(Deserialize)]
        struct V1 {
            request: SlotRequest,
            #[serde(default)]
            gpus: Vec<String>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Any {
            Current(Current),
            V1(V1),
        }
        Ok(match Any::deserialize(d)? {
            Any::Current(c) => SlotAllocation {
                slots: c.slots,
                devices: c.devices,
            },
            Any::V1(v) => SlotAllocation {
                slots: v.request.to_slots(),
                devices: if v.gpus.is_empty() {
                    DeviceMap::new()
                } else {
                    DeviceMap::from([(
                        "cuda.device".to_owned(),
                        v.gpus
                            .into_iter()
                            .map(|g| (g, Amount::from_units(1)))
                            .collect(),
                    )])
                },
            },
        })
    }
}

impl SlotAllocation {
    /// Every device id held, sorted (a kernel's `gpus`).
    pub fn device_ids(&self) -> Vec<String> {
        crate::agent::accelerators::device_ids(&self.devices)
    }
}

impl SlotRequest {
    /// As generic slots: `cpu`, `mem`, and `cuda.device` when non-zero.
    pub fn to_slots(&self) -> ResourceSlots {
        let mut s = ResourceSlots::new();
        s.set(crate::slots::CPU, Amount::from_milli(self.cpu_millis));
        s.set(
            crate::slots::MEM,
            Amount::from_units(self.mem_bytes.min(crate::slots::MAX_UNITS)),
        );
        if self.cuda_devices > 0 {
            s.set("cuda.device", Amount::from_units(self.cuda_devices.into()));
        }
        s
    }
}

/// The node's slots: capacity over every slot, what kernels hold, and which device holds what
/// for which kernel.
#[derive(Debug, Default)]
pub struct SlotAllocator {
    accelerators: Accelerators,
    types: SlotTypes,
    capacity: ResourceSlots,
    used: ResourceSlots,
    /// Per accelerator slot, its devices in order with the amount held on each.
    devices: BTreeMap<String, Vec<(String, Amount)>>,
    /// Per kernel id, the devices it holds.
    holders: BTreeMap<String, DeviceMap>,
}

impl SlotAllocator {
    /// Capacity `cpu` (thousandths of a core) and `mem` (bytes), both net of reservations,
    /// plus one unit of each accelerator device's slot per device.
    pub fn new(cpu_millis: u64, mem_bytes: u64, accelerators: Accelerators) -> SlotAllocator {
        let mut capacity = ResourceSlots::new();
        capacity.set(crate::slots::CPU, Amount::from_milli(cpu_millis));
        capacity.set(
            crate::slots::MEM,
            Amount::from_units(mem_bytes.min(crate::slots::MAX_UNITS)),
        );
        let mut devices: BTreeMap<String, Vec<(String, Amount)>> = BTreeMap::new();
        for p in accelerators.plugins() {
            for d in p.devices() {
                devices
                    .entry(d.slot.clone())
                    .or_default()
                    .push((d.id.clone(), Amount::ZERO));
            }
        }
        for (slot, devs) in &devices {
            capacity.set(slot.clone(), Amount::from_units(devs.len() as u64));
        }
        SlotAllocator {
            types: accelerators.slot_types(),
            accelerators,
            capacity,
            used: ResourceSlots::new(),
            devices,
            holders: BTreeMap::new(),
        }
    }

    /// Every slot this agent knows, with its type (`slot_key_and_units`).
    pub fn slot_types(&self) -> &SlotTypes {
        &self.types
    }

    /// The accelerators whose devices it hands out.
    pub fn accelerators(&self) -> &Accelerators {
        &self.accelerators
    }

    /// Total allocatable slots, every slot (zero where nothing is held yet).
    pub fn capacity(&self) -> ResourceSlots {
        self.capacity.clone()
    }

    /// Slots held by kernels, every slot of the capacity (zero where none).
    pub fn used(&self) -> ResourceSlots {
        self.capacity
            .iter()
            .map(|(k, _)| (k.to_owned(), self.used.get(k)))
            .collect()
    }

    /// Slots free now (capacity minus used; never negative, even after an over-capacity
    /// recovery).
    pub fn available(&self) -> ResourceSlots {
        self.capacity.saturating_sub(&self.used)
    }

    /// Devices held per kernel: `{kernel id: {slot: {device id: amount}}}` (Backend.AI's
    /// `scan_gpu_alloc_map`, per slot), kernels holding none left out.
    pub fn holders(&self) -> &BTreeMap<String, DeviceMap> {
        &self.holders
    }

    /// Takes `req` from what is free for kernel `kernel_id`: the amounts, and devices for each
    /// accelerator slot (whole or packed shares, see [`crate::agent::accelerators`]).
    ///
    /// Errors: [`SlotError::Exhausted`] naming the first short slot (also when free shares are
    /// too fragmented to place), [`SlotError::Invalid`] for a fractional `*.device` amount;
    /// nothing is taken then.
    pub fn allocate(
        &mut self,
        kernel_id: &str,
        req: &ResourceSlots,
    ) -> Result<SlotAllocation, SlotError> {
        req.fits_in(&self.available())?;
        let mut picked = DeviceMap::new();
        for (slot, amount) in req.nonzero() {
            let Some(devs) = self.devices.get(slot) else {
                continue;
            };
            let one = Amount::from_units(1);
            let free: Vec<(String, Amount)> = devs
                .iter()
                .map(|(id, held)| (id.clone(), one.saturating_sub(*held)))
                .collect();
            let got: DeviceShares = match self.accelerators.for_slot(slot) {
                Some(p) => p.allocate(slot, amount, &free)?,
                None => continue,
            };
            picked.insert(slot.to_owned(), got);
        }
        let alloc = SlotAllocation {
            slots: req.clone(),
            devices: picked,
        };
        self.take(kernel_id, &alloc);
        Ok(alloc)
    }

    /// Holds an allocation made before a restart (recovery, a dangling container), devices
    /// included, even past capacity (logged): the kernel is running whatever the books say.
    pub fn reserve_exact(&mut self, kernel_id: &str, alloc: &SlotAllocation) {
        self.take(kernel_id, alloc);
        if alloc.slots.fits_in(&self.capacity).is_err()
            || self.used().fits_in(&self.capacity).is_err()
        {
            tracing::warn!(used = %self.used, capacity = %self.capacity, "recovered kernels exceed the slot capacity");
        }
    }

    /// Gives `alloc` back (kernel `kernel_id`'s).
    pub fn release(&mut self, kernel_id: &str, alloc: &SlotAllocation) {
        self.used = self.used.saturating_sub(&alloc.slots);
        for (slot, held) in &alloc.devices {
            if let Some(devs) = self.devices.get_mut(slot) {
                for (id, h) in devs.iter_mut() {
                    if let Some(a) = held.get(id) {
                        *h = h.saturating_sub(*a);
                    }
                }
            }
        }
        if let Some(mine) = self.holders.get_mut(kernel_id) {
            for (slot, held) in &alloc.devices {
                if let Some(m) = mine.get_mut(slot) {
                    for (id, a) in held {
                        if let Some(x) = m.get_mut(id) {
                            *x = x.saturating_sub(*a);
                        }
                    }
                    m.retain(|_, a| *a > Amount::ZERO);
                }
            }
            mine.retain(|_, m| !m.is_empty());
            if mine.is_empty() {
                self.holders.remove(kernel_id);
            }
        }
    }

    fn take(&mut self, kernel_id: &str, alloc: &SlotAllocation) {
        self.used = self
            .used
            .checked_add(&alloc.slots)
            .unwrap_or_else(|_| self.used.clone());
        for (slot, held) in &alloc.devices {
            if let Some(devs) = self.devices.get_mut(slot) {
                for (id, h) in devs.iter_mut() {
                    if let Some(a) = held.get(id) {
                        *h = h.checked_add(*a).unwrap_or(*h);
                    }
                }
            }
            if held.is_empty() {
                continue;
            }
            let mine = self
                .holders
                .entry(kernel_id.to_owned())
                .or_default()
                .entry(slot.clone())
                .or_default();
            for (id, a) in held {
                let x = mine.entry(id.clone()).or_default();
                *x = x.checked_add(*a).unwrap_or(*x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::agent::accelerators::mock::Mock;
    use crate::config::{ByteSize, MockDeviceConfig};
    use rmpv::Value;

    fn req(v: Value) -> Result<SlotRequest, RequestError> {
        SlotRequest::from_value(&v)
    }

    fn map(pairs: &[(&str, Value)]) -> Value {
        Value::Map(
            pairs
                .iter()
                .map(|(k, v)| (Value::from(*k), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn legacy_request_parses_numbers_and_names_bad_slots() {
        let r = req(map(&[
            ("cpu", "0.5".into()),
            ("mem", Value::from(268435456u64)),
            ("cuda.device", 0.into()),
        ]))
        .unwrap();
        assert_eq!(
            r,
            SlotRequest {
                cpu_millis: 500,
                mem_bytes: 268435456,
                cuda_devices: 0
            }
        );
        let e = req(map(&[
            ("cpu", 1.into()),
            ("mem", 1.into()),
            ("tpu", 1.into()),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("unknown resource slot `tpu`"), "{e}");
    }

    fn mock(slot: &str, n: usize) -> Accelerators {
        let devs: Vec<MockDeviceConfig> = (0..n)
            .map(|i| MockDeviceConfig {
                id: i.to_string(),
                memory: ByteSize(1 << 30),
                slot: slot.into(),
                utilization: None,
            })
            .collect();
        Accelerators::from_plugins(vec![Arc::new(Mock::new(&devs))])
    }

    fn slots(pairs: &[(&str, u64)]) -> ResourceSlots {
        pairs
            .iter()
            .map(|(k, m)| (k.to_string(), Amount::from_milli(*m)))
            .collect()
    }

    #[test]
    fn allocates_until_exhausted_and_releases() {
        let mut a = SlotAllocator::new(2000, 1000, mock("cuda.device", 2));
        assert_eq!(a.capacity().get("cuda.device"), Amount::from_units(2));
        let one = slots(&[("cpu", 1000), ("mem", 400_000), ("cuda.device", 1000)]);
        let x = a.allocate("x", &one).unwrap();
        let y = a.allocate("y", &one).unwrap();
        assert_ne!(x.device_ids(), y.device_ids());
        assert_eq!(a.holders().len(), 2);
        assert!(matches!(
            a.allocate("z", &slots(&[("cpu", 1)])),
            Err(SlotError::Exhausted { ref slot, .. }) if slot == "cpu"
        ));
        a.release("x", &x);
        assert!(matches!(
            a.allocate("z", &slots(&[("cpu", 1), ("mem", 700_000)])),
            Err(SlotError::Exhausted { ref slot, .. }) if slot == "mem"
        ));
        let z = a.allocate("z", &one).unwrap();
        assert_eq!(z.device_ids(), x.device_ids());
        a.release("y", &y);
        a.release("z", &z);
        assert!(a.used().nonzero().next().is_none(), "{}", a.used());
        assert!(a.holders().is_empty());
    }

    #[test]
    fn shares_pack_and_reserve_exact_restores_devices() {
        let mut a = SlotAllocator::new(8000, 1 << 30, mock("cuda.shares", 2));
        let half = slots(&[("cpu", 1000), ("mem", 1000), ("cuda.shares", 500)]);
        let x = a.allocate("x", &half).unwrap();
        let y = a.allocate("y", &half).unwrap();
        assert_eq!(x.device_ids(), y.device_ids());
        let z = a
            .allocate(
                "z",
                &slots(&[("cpu", 1000), ("mem", 1000), ("cuda.shares", 750)]),
            )
            .unwrap();
        assert_ne!(z.device_ids(), x.device_ids());
        assert!(a
            .allocate(
                "w",
                &slots(&[("cpu", 1000), ("mem", 1000), ("cuda.shares", 500)])
            )
            .is_err());
        // A restarted agent re-reserves exactly the same devices.
        let mut b = SlotAllocator::new(8000, 1 << 30, mock("cuda.shares", 2));
        for (k, al) in [("x", &x), ("y", &y), ("z", &z)] {
            let json = serde_json::to_string(al).unwrap();
            b.reserve_exact(k, &serde_json::from_str(&json).unwrap());
        }
        assert_eq!(a.holders(), b.holders());
        assert_eq!(a.available(), b.available());
    }

    #[test]
    fn version_1_allocations_still_load() {
        let old =
            r#"{"request":{"cpu_millis":500,"mem_bytes":1024,"cuda_devices":1},"gpus":["3"]}"#;
        let a: SlotAllocation = serde_json::from_str(old).unwrap();
        assert_eq!(a.slots.get("cpu"), Amount::from_milli(500));
        assert_eq!(a.slots.get("mem"), Amount::from_units(1024));
        assert_eq!(a.device_ids(), ["3"]);
    }
}
