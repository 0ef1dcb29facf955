//! Resource slots (Backend.AI's `cpu`, `mem`, `cuda.device`): what a kernel asks for, and the
//! agent's capacity minus `[resource] reserved-cpu` / `reserved-mem`.

use std::collections::BTreeSet;

use rmpv::Value;
use serde::{Deserialize, Serialize};

/// A kernel's slot request: `cpu` in millicores (`"0.5"` → 500), `mem` in bytes, and a count
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

/// Why a slot request cannot be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SlotError {
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
    /// Errors: [`SlotError::Invalid`] naming the slot for an unknown name, a negative,
    /// fractional-where-whole or non-numeric amount, more than 3 decimals of `cpu`, or a
    /// missing `cpu`/`mem`.
    pub fn from_value(slots: &Value) -> Result<SlotRequest, SlotError> {
        let map = slots
            .as_map()
            .ok_or_else(|| SlotError::Invalid("resource_slots must be a map".into()))?;
        let (mut cpu, mut mem) = (None, None);
        let mut req = SlotRequest::default();
        for (k, v) in map {
            let name = k.as_str().unwrap_or("<non-string>");
            let amount = decimal(v).ok_or_else(|| {
                SlotError::Invalid(format!(
                    "resource slot `{name}`: `{v}` is not a non-negative number"
                ))
            })?;
            match name {
                "cpu" => {
                    let millis = amount * 1000.0;
                    if (millis - millis.round()).abs() > 1e-6 {
                        return Err(SlotError::Invalid(format!(
                            "resource slot `cpu`: {amount} has more than 3 decimals"
                        )));
                    }
                    cpu = Some(millis.round() as u64);
                }
                "mem" => mem = Some(whole(name, amount)?),
                "cuda.device" => {
                    // Not `as u32`: 2^32 devices wrapped to 0 and was accepted.
                    req.cuda_devices = u32::try_from(whole(name, amount)?).map_err(|_| {
                        SlotError::Invalid(format!(
                            "resource slot `cuda.device`: {amount} is more than {}",
                            u32::MAX
                        ))
                    })?
                }
                other => {
                    return Err(SlotError::Invalid(format!(
                        "unknown resource slot `{other}` (known: cpu, mem, cuda.device)"
                    )))
                }
            }
        }
        req.cpu_millis =
            cpu.ok_or_else(|| SlotError::Invalid("resource slot `cpu` is required".into()))?;
        req.mem_bytes =
            mem.ok_or_else(|| SlotError::Invalid("resource slot `mem` is required".into()))?;
        if req.cpu_millis == 0 {
            return Err(SlotError::Invalid(
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

fn whole(name: &str, amount: f64) -> Result<u64, SlotError> {
    if amount.fract() != 0.0 || amount > u64::MAX as f64 {
        return Err(SlotError::Invalid(format!(
            "resource slot `{name}`: {amount} is not a whole number"
        )));
    }
    Ok(amount as u64)
}

/// What one kernel holds: its request and the GPUs picked for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotAllocation {
    /// The amounts.
    pub request: SlotRequest,
    /// GPU indexes (as NVML numbers them), `request.cuda_devices` of them.
    pub gpus: Vec<String>,
}

/// The node's slots: capacity (detected minus reserved) and what kernels hold.
#[derive(Debug)]
pub struct SlotAllocator {
    capacity: SlotRequest,
    used: SlotRequest,
    gpus: Vec<String>,
    gpus_used: BTreeSet<String>,
}

impl SlotAllocator {
    /// Capacity `cpu_millis`/`mem_bytes` (already net of reservations) and the GPU indexes.
    pub fn new(cpu_millis: u64, mem_bytes: u64, gpus: Vec<String>) -> SlotAllocator {
        let capacity = SlotRequest {
            cpu_millis,
            mem_bytes,
            cuda_devices: gpus.len() as u32,
        };
        SlotAllocator {
            capacity,
            used: SlotRequest::default(),
            gpus,
            gpus_used: BTreeSet::new(),
        }
    }

    /// Total allocatable slots.
    pub fn capacity(&self) -> SlotRequest {
        self.capacity
    }

    /// Slots held by kernels.
    pub fn used(&self) -> SlotRequest {
        self.used
    }

    /// Slots free now (capacity minus used; never negative, even after an over-capacity
    /// recovery).
    pub fn available(&self) -> SlotRequest {
        SlotRequest {
            cpu_millis: self
                .capacity
                .cpu_millis
                .saturating_sub(self.used.cpu_millis),
            mem_bytes: self.capacity.mem_bytes.saturating_sub(self.used.mem_bytes),
            cuda_devices: self
                .capacity
                .cuda_devices
                .saturating_sub(self.used.cuda_devices),
        }
    }

    /// Takes `req` from what is free.
    ///
    /// Errors: [`SlotError::Exhausted`] naming the first short slot; nothing is taken then.
    pub fn allocate(&mut self, req: SlotRequest) -> Result<SlotAllocation, SlotError> {
        let free = self.available();
        if req.cpu_millis > free.cpu_millis {
            return Err(SlotError::Exhausted(
                "cpu",
                format_cores(req.cpu_millis),
                format_cores(free.cpu_millis),
            ));
        }
        if req.mem_bytes > free.mem_bytes {
            return Err(SlotError::Exhausted(
                "mem",
                req.mem_bytes.to_string(),
                free.mem_bytes.to_string(),
            ));
        }
        let free_gpus: Vec<&String> = self
            .gpus
            .iter()
            .filter(|g| !self.gpus_used.contains(*g))
            .collect();
        if req.cuda_devices as usize > free_gpus.len() {
            return Err(SlotError::Exhausted(
                "cuda.device",
                req.cuda_devices.to_string(),
                free_gpus.len().to_string(),
            ));
        }
        let gpus: Vec<String> = free_gpus
            .into_iter()
            .take(req.cuda_devices as usize)
            .cloned()
            .collect();
        let alloc = SlotAllocation { request: req, gpus };
        self.take(&alloc);
        Ok(alloc)
    }

    /// Holds an allocation made before a restart (recovery), even past capacity (logged):
    /// the kernel is running whatever the books say.
    pub fn reserve_exact(&mut self, alloc: &SlotAllocation) {
        self.take(alloc);
        if self.used.cpu_millis > self.capacity.cpu_millis
            || self.used.mem_bytes > self.capacity.mem_bytes
        {
            tracing::warn!(used = ?self.used, capacity = ?self.capacity, "recovered kernels exceed the slot capacity");
        }
    }

    /// Gives `alloc` back.
    pub fn release(&mut self, alloc: &SlotAllocation) {
        self.used.cpu_millis = self
            .used
            .cpu_millis
            .saturating_sub(alloc.request.cpu_millis);
        self.used.mem_bytes = self.used.mem_bytes.saturating_sub(alloc.request.mem_bytes);
        self.used.cuda_devices = self
            .used
            .cuda_devices
            .saturating_sub(alloc.request.cuda_devices);
        for g in &alloc.gpus {
            self.gpus_used.remove(g);
        }
    }

    fn take(&mut self, alloc: &SlotAllocation) {
        self.used.cpu_millis += alloc.request.cpu_millis;
        self.used.mem_bytes += alloc.request.mem_bytes;
        self.used.cuda_devices += alloc.request.cuda_devices;
        self.gpus_used.extend(alloc.gpus.iter().cloned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Value) -> Result<SlotRequest, SlotError> {
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
    fn parses_numbers_and_decimal_strings() {
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
        let r = req(map(&[("cpu", Value::F64(2.0)), ("mem", "1024".into())])).unwrap();
        assert_eq!(r.cpu_millis, 2000);
    }

    #[test]
    fn refuses_bad_requests_naming_the_slot() {
        let e = req(map(&[("cpu", 1.into()), ("mem", Value::from(-5))])).unwrap_err();
        assert!(e.to_string().contains("`mem`"), "{e}");
        let e = req(map(&[
            ("cpu", 1.into()),
            ("mem", 1.into()),
            ("tpu", 1.into()),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("unknown resource slot `tpu`"), "{e}");
        assert!(req(map(&[("cpu", "0.0001".into()), ("mem", 1.into())])).is_err());
        assert!(req(map(&[("mem", 1.into())])).is_err());
        assert!(req(map(&[("cpu", 1.into()), ("mem", "lots".into())])).is_err());
        let e = req(map(&[
            ("cpu", 1.into()),
            ("mem", 1.into()),
            ("cuda.device", Value::from(1u64 << 32)),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("`cuda.device`"), "{e}");
    }

    #[test]
    fn allocates_until_exhausted_and_releases() {
        let mut a = SlotAllocator::new(2000, 1000, vec!["0".into(), "1".into()]);
        let one = SlotRequest {
            cpu_millis: 1000,
            mem_bytes: 400,
            cuda_devices: 1,
        };
        let x = a.allocate(one).unwrap();
        let y = a.allocate(one).unwrap();
        assert_ne!(x.gpus, y.gpus);
        assert!(matches!(
            a.allocate(SlotRequest {
                cpu_millis: 1,
                ..Default::default()
            }),
            Err(SlotError::Exhausted("cpu", ..))
        ));
        a.release(&x);
        assert!(matches!(
            a.allocate(SlotRequest {
                cpu_millis: 1,
                mem_bytes: 700,
                cuda_devices: 0
            }),
            Err(SlotError::Exhausted("mem", ..))
        ));
        let z = a.allocate(one).unwrap();
        assert_eq!(z.gpus, x.gpus);
        a.release(&y);
        a.release(&z);
        assert_eq!(a.used(), SlotRequest::default());
    }
}
