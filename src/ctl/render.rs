//! What the table-mode renderers of `kernelvisor ctl` share: reading an answer into its reply
//! type, cells (`-` for what is missing), slot columns, borderless tables and `key: value`
//! lines. Each noun's renderers live beside its command (`agent.rs`, `access_key.rs`,
//! `vfolder.rs`, `health.rs`, `session/show.rs`, …).
//!
//! A renderer takes the JSON value exactly as the API returns it (`docs/manager-api.md`), reads
//! it into the API's own reply type ([`crate::model`], lenient: a missing key is its default, an
//! unknown key is ignored) and answers the text to print, ending in a newline. Missing or
//! `null` fields show as `-`; an answer that does not read as its type (a field of another type)
//! shows as one line saying so, not as a table of `-`. Times are relative to the `now` passed in
//! (Unix seconds), so output is deterministic in tests.

use std::fmt::Display;

use comfy_table::{presets::NOTHING, Table};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::client::read;
use super::format::{amount, timestamp};
use crate::model::slots::SlotAmounts;

pub(super) fn with<T: DeserializeOwned + Default>(
    v: &Value,
    f: impl FnOnce(T) -> String,
) -> String {
    read(v).map_or_else(|e| e, f)
}

/// A string, or `-` when empty.
pub(super) fn text(s: &str) -> String {
    if s.is_empty() {
        "-".to_owned()
    } else {
        s.to_owned()
    }
}

/// An optional value, or `-` (an empty string too).
pub(super) fn opt<T: Display>(v: Option<T>) -> String {
    v.map_or("-".to_owned(), |v| text(&v.to_string()))
}

/// An enum's wire name (`batch`, `SUCCESS`, `setting-up`), or `-`.
pub(super) fn word<T: Serialize>(v: Option<&T>) -> String {
    v.and_then(|v| serde_json::to_value(v).ok())
        .and_then(|v| v.as_str().map(str::to_owned))
        .map_or("-".to_owned(), |s| text(&s))
}

/// Slot `name` of `slots` as the formatters take it (a decimal string).
pub(super) fn slot(slots: &SlotAmounts, name: &str) -> Option<Value> {
    slots.get(name).map(|v| Value::from(v.as_str()))
}

/// A number as the formatters take it.
pub(super) fn num(n: f64) -> Value {
    Value::from(n)
}

/// The accelerator slots (every slot but `cpu` and `mem`) some row has a non-zero amount of,
/// by name: one column each.
pub(super) fn extra_slots<'a>(rows: impl Iterator<Item = &'a SlotAmounts>) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    for slots in rows {
        for (name, v) in slots {
            if name != "cpu"
                && name != "mem"
                && amount(&Value::from(v.as_str())).is_some_and(|n| n > 0.0)
            {
                names.insert(name.clone());
            }
        }
    }
    names.into_iter().collect()
}

/// A slot's column header or field name: `GPU` for `cuda.device` (whole GPUs), else the slot
/// name in capitals (`CUDA.SHARES`).
pub(super) fn slot_label(name: &str) -> String {
    match name {
        "cuda.device" => "GPU".to_owned(),
        other => other.to_uppercase(),
    }
}

/// A borderless table, columns two spaces apart, no trailing spaces.
pub(super) fn table(header: Vec<&str>, rows: Vec<Vec<String>>) -> String {
    let mut t = Table::new();
    t.load_preset(NOTHING).set_header(header);
    for row in rows {
        t.add_row(row);
    }
    for column in t.column_iter_mut() {
        column.set_padding((0, 2));
    }
    let mut out: String = t.lines().map(|l| l.trim_end().to_owned() + "\n").collect();
    if out.is_empty() {
        out.push('\n');
    }
    out
}

/// `key: value` lines with the values aligned.
pub(super) fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    pairs
        .iter()
        .map(|(k, v)| format!("{:<width$} {v}\n", format!("{k}:")))
        .collect()
}

/// A Unix time in UTC (`2023-11-14T22:13:20Z`), or `-`.
pub(super) fn utc(t: Option<f64>) -> String {
    t.map_or("-".to_owned(), timestamp)
}

#[cfg(test)]
pub(crate) mod tests {
    /// The `now` of every renderer test (2023-11-14T22:13:20Z).
    pub(crate) const NOW: f64 = 1_700_000_000.0;

    /// A table line's cells (columns are separated by two or more spaces).
    pub(crate) fn cells(line: &str) -> Vec<&str> {
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect()
    }
}
