//! Slot columns shared by the agent and kernel tables: slots are stored as JSON
//! (`0005_resource_slots`), with the columns from before it still written and read for rows
//! that predate it.

use sqlx::any::AnyRow;
use sqlx::Row;

use crate::slots::{Amount, ResourceSlots};

/// Slots from the columns written before `0005_resource_slots` (millicores, bytes, devices);
/// `cuda.device` only when non-zero.
fn legacy_slots(cpu_millis: i64, mem_bytes: i64, cuda_devices: i64) -> ResourceSlots {
    let mut s = ResourceSlots::new();
    s.set(
        crate::slots::CPU,
        Amount::from_milli(cpu_millis.max(0) as u64),
    );
    s.set(
        crate::slots::MEM,
        Amount::from_units(mem_bytes.max(0) as u64),
    );
    if cuda_devices > 0 {
        s.set("cuda.device", Amount::from_units(cuda_devices as u64));
    }
    s
}

/// Slots from their JSON column, or (`''`, a row from before `0005_resource_slots`) from the old
/// columns.
pub(super) fn slots_column(r: &AnyRow, column: &str) -> Result<ResourceSlots, sqlx::Error> {
    let text: String = r.try_get(column)?;
    if text.is_empty() {
        return Ok(legacy_slots(
            r.try_get("cpu_millis")?,
            r.try_get("mem_bytes")?,
            r.try_get("cuda_devices")?,
        ));
    }
    serde_json::from_str(&text).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

/// The old columns' values for `slots` (still written, for compatibility): millicores, bytes,
/// whole `cuda.device`s.
pub(super) fn legacy_columns(slots: &ResourceSlots) -> (i64, i64, i64) {
    let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    (
        clamp(slots.get(crate::slots::CPU).milli()),
        clamp(slots.get(crate::slots::MEM).units()),
        clamp(slots.get("cuda.device").units()),
    )
}
