//! Accelerator plugins, compiled in (Backend.AI's `ai.backend.accelerator.*` packages): each
//! detects its devices, declares the resource slots they serve (`cuda.device`, `cuda.shares`, …
//! with their [`SlotType`]), picks devices for a kernel's request ([`Accelerator::allocate`]:
//! whole devices for a `*.device` slot, shares packed onto devices for a `*.shares` slot), gives
//! the container its configuration for an allocation ([`Accelerator::container_config`]) and
//! samples its devices ([`Accelerator::sample`]).
//!
//! Plugins: [`cuda`] (NVML) and [`mock`] (devices declared in `agent.toml`, so that every path
//! but NVML itself runs without a GPU, as Backend.AI's `backend.ai-accelerator-mock`).

pub mod cuda;
pub mod mock;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::agent::backend::Bind;
use crate::config::AgentConfig;
use crate::slots::{Amount, SlotError, SlotType, SlotTypes};

/// Devices of one slot held by one kernel: device id → amount (1 per whole device; the share
/// for `*.shares`).
pub type DeviceShares = BTreeMap<String, Amount>;

/// Devices held by one kernel, per slot: `{slot: {device id: amount}}`.
pub type DeviceMap = BTreeMap<String, DeviceShares>;

/// One device an accelerator found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// Its id in the agent's numbering (NVML index for `cuda`, the configured id for `mock`).
    pub id: String,
    /// The slot it serves (`cuda.device` or `cuda.shares`).
    pub slot: String,
    /// Installed memory, in bytes (0 when unknown).
    pub memory: u64,
    /// Product name.
    pub model: String,
}

/// What a container gets for an allocation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerConfig {
    /// Environment variables (`CUDA_VISIBLE_DEVICES`, …).
    pub env: Vec<(String, String)>,
    /// Device ids passed as Docker device requests with driver `nvidia`.
    pub nvidia_device_ids: Vec<String>,
    /// Host device nodes (`/dev/…`) passed through at the same path.
    pub device_nodes: Vec<String>,
    /// Extra bind mounts.
    pub binds: Vec<Bind>,
}

/// One reading of one device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceSample {
    /// Device id (as [`Device::id`]).
    pub id: String,
    /// Percent busy over the last sample period, 0 to 100 (NaN when not reported).
    pub utilization_pct: f64,
    /// Memory in use, bytes.
    pub mem_used_bytes: u64,
    /// Memory installed, bytes.
    pub mem_total_bytes: u64,
}

/// How a slot's devices are handed out, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    /// `*.device`: whole devices, the amount must be whole.
    Whole,
    /// `*.shares`: each device holds 1.0 share; fractions are packed best fit.
    Shares,
}

impl SlotKind {
    /// `*.shares` → shares; anything else (`*.device`) → whole devices.
    pub fn of(slot: &str) -> SlotKind {
        if slot.ends_with(".shares") {
            SlotKind::Shares
        } else {
            SlotKind::Whole
        }
    }
}

/// One accelerator plugin.
pub trait Accelerator: Send + Sync + std::fmt::Debug {
    /// Its name (`cuda`, `mock`): the `gather_hwinfo` key.
    fn name(&self) -> &'static str;

    /// The devices it found, in its numbering order.
    fn devices(&self) -> &[Device];

    /// The slots its devices serve, with their types (`{"cuda.device": count}`).
    fn slot_types(&self) -> SlotTypes {
        self.devices()
            .iter()
            .map(|d| (d.slot.clone(), SlotType::Count))
            .collect()
    }

    /// Picks devices for `amount` of `slot`, given each device's free amount (devices of the
    /// slot only, in order; 1.0 is a free device). Whole devices for `*.device`; for
    /// `*.shares` whole free devices for the integer part and a best-fit device for the rest
    /// (see [`pack_shares`]).
    ///
    /// Errors: [`SlotError::Invalid`] for a fractional `*.device` amount;
    /// [`SlotError::Exhausted`] when the devices cannot hold it.
    fn allocate(
        &self,
        slot: &str,
        amount: Amount,
        free: &[(String, Amount)],
    ) -> Result<DeviceShares, SlotError> {
        match SlotKind::of(slot) {
            SlotKind::Whole => pack_whole(slot, amount, free),
            SlotKind::Shares => pack_shares(slot, amount, free),
        }
    }

    /// The container's configuration for the devices it holds of this accelerator's slots.
    fn container_config(&self, devices: &DeviceMap) -> ContainerConfig;

    /// Reads every device (per-kernel readings are derived by the caller from the allocation).
    fn sample(&self) -> Vec<DeviceSample>;

    /// What one kernel's container itself uses of `held` (this plugin's devices of the kernel):
    /// `(memory bytes, utilization %)`, when the plugin can tell processes apart (NVML's
    /// per-process accounting). `None` (the default): the sampler apportions each device's
    /// sample by the share the kernel holds.
    fn kernel_sample(&self, held: &DeviceMap, container_id: &str) -> Option<(u64, f64)> {
        let _ = (held, container_id);
        None
    }
}

/// Whole devices: the first `amount` devices that are entirely free.
///
/// Errors: [`SlotError::Invalid`] naming the slot for a fractional amount;
/// [`SlotError::Exhausted`] with the number of free devices.
pub fn pack_whole(
    slot: &str,
    amount: Amount,
    free: &[(String, Amount)],
) -> Result<DeviceShares, SlotError> {
    if !amount.is_whole() {
        return Err(SlotError::Invalid(format!(
            "resource slot `{slot}`: {amount} is not a whole number of devices"
        )));
    }
    let one = Amount::from_units(1);
    let whole: Vec<&String> = free
        .iter()
        .filter(|(_, f)| *f >= one)
        .map(|(id, _)| id)
        .collect();
    let n = amount.units() as usize;
    if n > whole.len() {
        return Err(SlotError::Exhausted {
            slot: slot.to_owned(),
            requested: amount,
            available: Amount::from_units(whole.len() as u64),
        });
    }
    Ok(whole
        .into_iter()
        .take(n)
        .map(|id| (id.clone(), one))
        .collect())
}

/// Shares: the integer part takes whole free devices (first free first), the fraction goes to
/// the device with the least free share that still holds it (best fit, first in order on a
/// tie), so `0.5 + 0.5` share one device and a later `0.75` goes to another.
///
/// Errors: [`SlotError::Exhausted`] when no placement fits (also when the total free would,
/// but fragmented).
pub fn pack_shares(
    slot: &str,
    amount: Amount,
    free: &[(String, Amount)],
) -> Result<DeviceShares, SlotError> {
    let exhausted = || SlotError::Exhausted {
        slot: slot.to_owned(),
        requested: amount,
        available: free
            .iter()
            .fold(Amount::ZERO, |s, (_, f)| s.checked_add(*f).unwrap_or(s)),
    };
    let one = Amount::from_units(1);
    let mut out = DeviceShares::new();
    let whole = amount.units() as usize;
    for (id, _) in free.iter().filter(|(_, f)| *f >= one).take(whole) {
        out.insert(id.clone(), one);
    }
    if out.len() < whole {
        return Err(exhausted());
    }
    let rest = Amount::from_milli(amount.milli() % 1000);
    if rest > Amount::ZERO {
        let best = free
            .iter()
            .filter(|(id, f)| !out.contains_key(id) && *f >= rest)
            .min_by_key(|(_, f)| *f)
            .ok_or_else(exhausted)?;
        out.insert(best.0.clone(), rest);
    }
    Ok(out)
}

/// The agent's accelerators, detected once at start.
#[derive(Clone, Debug, Default)]
pub struct Accelerators {
    plugins: Vec<Arc<dyn Accelerator>>,
}

impl Accelerators {
    /// Detects the configured accelerators: `cuda` per `[accelerator] cuda` (auto: NVML when it
    /// loads and finds a device; never an error without a GPU), then `mock` when
    /// `[[accelerator.mock.devices]]` are declared.
    pub fn detect(config: &AgentConfig) -> Accelerators {
        let a = &config.accelerator;
        let mut plugins: Vec<Arc<dyn Accelerator>> = Vec::new();
        if a.cuda != Some(false) {
            if let Some(c) = cuda::Cuda::detect() {
                plugins.push(Arc::new(c));
            } else if a.cuda == Some(true) {
                tracing::warn!("[accelerator] cuda = true but NVML finds no GPU");
            }
        }
        // A mock device may not shadow a real one (same slot and id): it is skipped, logged.
        let taken: std::collections::BTreeSet<(&str, &str)> = plugins
            .iter()
            .flat_map(|p| p.devices().iter())
            .map(|d| (d.slot.as_str(), d.id.as_str()))
            .collect();
        let mocks: Vec<_> = a
            .mock
            .devices
            .iter()
            .filter(|d| {
                let dup = taken.contains(&(d.slot.as_str(), d.id.as_str()));
                if dup {
                    tracing::warn!(id = %d.id, slot = %d.slot, "mock device shadows a real one: skipped");
                }
                !dup
            })
            .cloned()
            .collect();
        drop(taken);
        if !mocks.is_empty() {
            plugins.push(Arc::new(mock::Mock::new(&mocks)));
        }
        Accelerators { plugins }
    }

    /// From plugins (tests).
    pub fn from_plugins(plugins: Vec<Arc<dyn Accelerator>>) -> Accelerators {
        Accelerators { plugins }
    }

    /// Every plugin.
    pub fn plugins(&self) -> &[Arc<dyn Accelerator>] {
        &self.plugins
    }

    /// The built-in slot types plus every accelerator's (`slot_key_and_units`).
    pub fn slot_types(&self) -> SlotTypes {
        let mut t = crate::slots::builtin_types();
        for p in &self.plugins {
            t.extend(p.slot_types());
        }
        t
    }

    /// The plugin serving `slot`.
    pub fn for_slot(&self, slot: &str) -> Option<&Arc<dyn Accelerator>> {
        self.plugins
            .iter()
            .find(|p| p.devices().iter().any(|d| d.slot == slot))
    }

    /// The container configuration of an allocation: each plugin's, for the slots it serves.
    pub fn container_config(&self, devices: &DeviceMap) -> ContainerConfig {
        let mut out = ContainerConfig::default();
        for p in &self.plugins {
            // Only this plugin's devices (a slot may be served by two plugins, e.g. a mock
            // `cuda.device` next to real GPUs).
            let mine: DeviceMap = devices
                .iter()
                .map(|(slot, held)| {
                    let held: DeviceShares = held
                        .iter()
                        .filter(|(id, _)| {
                            p.devices()
                                .iter()
                                .any(|dev| &dev.slot == slot && &dev.id == *id)
                        })
                        .map(|(id, a)| (id.clone(), *a))
                        .collect();
                    (slot.clone(), held)
                })
                .filter(|(_, held)| !held.is_empty())
                .collect();
            if mine.is_empty() {
                continue;
            }
            let c = p.container_config(&mine);
            out.env.extend(c.env);
            out.nvidia_device_ids.extend(c.nvidia_device_ids);
            out.device_nodes.extend(c.device_nodes);
            out.binds.extend(c.binds);
        }
        out
    }
}

/// Device ids of an allocation, every slot, sorted and deduplicated.
pub fn device_ids(devices: &DeviceMap) -> Vec<String> {
    let mut ids: Vec<String> = devices.values().flat_map(|d| d.keys().cloned()).collect();
    ids.sort();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(v: &[(&str, u64)]) -> Vec<(String, Amount)> {
        v.iter()
            .map(|(id, m)| (id.to_string(), Amount::from_milli(*m)))
            .collect()
    }

    fn a(m: u64) -> Amount {
        Amount::from_milli(m)
    }

    #[test]
    fn whole_devices_take_free_ones_in_order() {
        let f = free(&[("0", 1000), ("1", 0), ("2", 1000), ("3", 1000)]);
        let got = pack_whole("cuda.device", a(2000), &f).unwrap();
        assert_eq!(got.keys().collect::<Vec<_>>(), ["0", "2"]);
        assert!(matches!(
            pack_whole("cuda.device", a(4000), &f),
            Err(SlotError::Exhausted { .. })
        ));
        let e = pack_whole("cuda.device", a(500), &f).unwrap_err();
        assert!(e.to_string().contains("`cuda.device`"), "{e}");
        assert!(pack_whole("cuda.device", a(0), &f).unwrap().is_empty());
    }

    #[test]
    fn shares_pack_best_fit() {
        // Two halves share device 0; 0.75 goes to device 1.
        let mut f = free(&[("0", 1000), ("1", 1000)]);
        let x = pack_shares("cuda.shares", a(500), &f).unwrap();
        assert_eq!(x, DeviceShares::from([("0".into(), a(500))]));
        f[0].1 = a(500);
        let y = pack_shares("cuda.shares", a(500), &f).unwrap();
        assert_eq!(y, DeviceShares::from([("0".into(), a(500))]));
        f[0].1 = a(0);
        let z = pack_shares("cuda.shares", a(750), &f).unwrap();
        assert_eq!(z, DeviceShares::from([("1".into(), a(750))]));
        // Best fit: the fullest device that still holds it.
        let f = free(&[("0", 1000), ("1", 300), ("2", 400)]);
        let got = pack_shares("cuda.shares", a(300), &f).unwrap();
        assert_eq!(got, DeviceShares::from([("1".into(), a(300))]));
        // 0.1 + 0.2 fits exactly in 0.3.
        let got = pack_shares("cuda.shares", a(200), &free(&[("0", 200)])).unwrap();
        assert_eq!(got, DeviceShares::from([("0".into(), a(200))]));
    }

    #[test]
    fn shares_above_one_take_whole_devices_plus_a_remainder() {
        let f = free(&[("0", 600), ("1", 1000), ("2", 1000)]);
        let got = pack_shares("cuda.shares", a(1500), &f).unwrap();
        assert_eq!(
            got,
            DeviceShares::from([("1".into(), a(1000)), ("0".into(), a(500))])
        );
        // 1.5 free in total but fragmented: no device holds the rest next to a whole one.
        let f = free(&[("0", 700), ("1", 800)]);
        assert!(matches!(
            pack_shares("cuda.shares", a(1500), &f),
            Err(SlotError::Exhausted { .. })
        ));
    }
}
