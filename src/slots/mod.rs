//! Resource slots as data, for the agent and the manager alike (Backend.AI's slot model).
//!
//! A slot has a name (`cpu`, `mem`, `cuda.device`, `cuda.shares`, `rocm.device`, …) and a
//! [`SlotType`]: `count` (up to 3 decimals: cores, devices, shares), `bytes` (whole bytes), or
//! `unique` (whole, indivisible devices). `cpu` (count) and `mem` (bytes) are built in; every
//! other slot is declared by an accelerator plugin on the agent, advertised in its heartbeats
//! as `slot_key_and_units` (Backend.AI's name) and known to the manager from there. Amounts are
//! exact ([`Amount`], thousandths), so `0.1 + 0.2` shares fit in `0.3`.

mod amount;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub use amount::{Amount, MAX_UNITS};

/// A slot's unit, as Backend.AI's `SlotTypes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotType {
    /// A countable amount with up to 3 decimals (`cpu` cores, `cuda.shares`, `cuda.device`).
    Count,
    /// Whole bytes (`mem`); requests may use suffixes (`"256m"`).
    Bytes,
    /// Whole, indivisible devices.
    Unique,
}

impl SlotType {
    /// `count`, `bytes` or `unique`.
    pub fn as_str(self) -> &'static str {
        match self {
            SlotType::Count => "count",
            SlotType::Bytes => "bytes",
            SlotType::Unique => "unique",
        }
    }

    /// Parses `count`, `bytes` or `unique`.
    pub fn parse(s: &str) -> Option<SlotType> {
        match s {
            "count" => Some(SlotType::Count),
            "bytes" => Some(SlotType::Bytes),
            "unique" => Some(SlotType::Unique),
            _ => None,
        }
    }
}

/// The built-in slots: `cpu` (cores, count) and `mem` (bytes).
pub const CPU: &str = "cpu";
/// See [`CPU`].
pub const MEM: &str = "mem";

/// Slot names and their types (`slot_key_and_units`).
pub type SlotTypes = BTreeMap<String, SlotType>;

/// The built-in slot types: `{"cpu": count, "mem": bytes}`.
pub fn builtin_types() -> SlotTypes {
    SlotTypes::from([
        (CPU.to_owned(), SlotType::Count),
        (MEM.to_owned(), SlotType::Bytes),
    ])
}

/// A slot name is `[a-z0-9]` then `[a-z0-9._-]`, at most 64 characters (`cuda.device`).
pub fn check_name(name: &str) -> Result<(), SlotError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
    ok.then_some(())
        .ok_or_else(|| SlotError::Invalid(format!("`{name}` is not a valid resource slot name")))
}

/// Why slots could not be parsed or served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// A slot no one declares (the manager's 400 `unknown-slot`).
    #[error("unknown resource slot `{0}`")]
    Unknown(String),
    /// A malformed amount or map; the message names the slot.
    #[error("{0}")]
    Invalid(String),
    /// Not enough of `slot`: requested, available (in the slot's unit).
    #[error("not enough {slot}: requested {requested}, available {available}")]
    Exhausted {
        /// The slot.
        slot: String,
        /// What was asked for.
        requested: Amount,
        /// What is left.
        available: Amount,
    },
}

/// An amount per slot name. Absent slots are zero; zero amounts are kept only as given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ResourceSlots(BTreeMap<String, Amount>);

impl Serialize for Amount {
    /// As a decimal string (`"0.5"`), Backend.AI's wire form.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Amount {
    /// From a decimal string or a number.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Amount, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            U(u64),
            F(f64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::U(n) if n <= MAX_UNITS => Ok(Amount::from_units(n)),
            Raw::U(n) => Err(serde::de::Error::custom(format!("{n} is too large"))),
            Raw::F(f) => Amount::from_f64(f).map_err(serde::de::Error::custom),
            Raw::S(s) => Amount::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

/// One amount as a request gives it, before its slot's type is applied.
#[derive(Clone, Debug)]
pub enum RawAmount {
    /// A whole number.
    Int(u64),
    /// A number with a fraction (JSON float, msgpack f32/f64).
    Float(f64),
    /// Text: a decimal (`"0.5"`), or for `bytes` a size (`"256m"`).
    Text(String),
    /// Anything else (negative, a map, …), as text for the error.
    Other(String),
}

impl RawAmount {
    /// From msgpack.
    pub fn from_msgpack(v: &rmpv::Value) -> RawAmount {
        match v {
            rmpv::Value::Integer(i) => match i.as_u64() {
                Some(n) => RawAmount::Int(n),
                None => RawAmount::Other(v.to_string()),
            },
            rmpv::Value::F32(f) => RawAmount::Float(f64::from(*f)),
            rmpv::Value::F64(f) => RawAmount::Float(*f),
            rmpv::Value::String(s) => match s.as_str() {
                Some(t) => RawAmount::Text(t.to_owned()),
                None => RawAmount::Other(v.to_string()),
            },
            other => RawAmount::Other(other.to_string()),
        }
    }

    /// From JSON.
    pub fn from_json(v: &serde_json::Value) -> RawAmount {
        match v {
            serde_json::Value::Number(n) => match n.as_u64() {
                Some(u) => RawAmount::Int(u),
                None => match n.as_f64() {
                    Some(f) if f >= 0.0 && n.as_i64().is_none() => RawAmount::Float(f),
                    _ => RawAmount::Other(n.to_string()),
                },
            },
            serde_json::Value::String(s) => RawAmount::Text(s.clone()),
            other => RawAmount::Other(other.to_string()),
        }
    }

    /// The amount in a slot of type `ty`, named `slot` in errors.
    ///
    /// Errors: [`SlotError::Invalid`] naming the slot: not a non-negative number, more than 3
    /// decimals, fractional for `bytes` / `unique`, too large.
    pub fn amount(&self, slot: &str, ty: SlotType) -> Result<Amount, SlotError> {
        let bad = |why: String| SlotError::Invalid(format!("resource slot `{slot}`: {why}"));
        let amount = match (self, ty) {
            (RawAmount::Int(n), _) if *n <= MAX_UNITS => Amount::from_units(*n),
            (RawAmount::Int(n), _) => return Err(bad(format!("{n} is too large"))),
            (RawAmount::Float(f), _) => Amount::from_f64(*f).map_err(bad)?,
            (RawAmount::Text(t), SlotType::Bytes) => match Amount::parse(t) {
                Ok(a) => a,
                Err(_) => {
                    let b = crate::config::ByteSize::parse(t).map_err(bad)?;
                    if b.0 > MAX_UNITS {
                        return Err(bad(format!("`{t}` is too large")));
                    }
                    Amount::from_units(b.0)
                }
            },
            (RawAmount::Text(t), _) => Amount::parse(t).map_err(bad)?,
            (RawAmount::Other(t), _) => {
                return Err(bad(format!("`{t}` is not a non-negative number")))
            }
        };
        if ty != SlotType::Count && !amount.is_whole() {
            return Err(bad(format!(
                "{amount} is not a whole number ({} slot)",
                ty.as_str()
            )));
        }
        Ok(amount)
    }
}

impl ResourceSlots {
    /// No slots.
    pub fn new() -> ResourceSlots {
        ResourceSlots::default()
    }

    /// Parses a request's `resource_slots` (`name → amount`) against the slot types known.
    ///
    /// Errors: [`SlotError::Unknown`] for a name not in `types`; [`SlotError::Invalid`] naming
    /// the slot for a bad amount.
    pub fn parse(
        pairs: impl IntoIterator<Item = (String, RawAmount)>,
        types: &SlotTypes,
    ) -> Result<ResourceSlots, SlotError> {
        let mut out = ResourceSlots::new();
        for (name, raw) in pairs {
            let ty = *types
                .get(&name)
                .ok_or_else(|| SlotError::Unknown(name.clone()))?;
            let amount = raw.amount(&name, ty)?;
            out.0.insert(name, amount);
        }
        Ok(out)
    }

    /// Parses a kernel request from msgpack (`create_kernels`' `resource_slots`): `cpu` (> 0)
    /// and `mem` required.
    ///
    /// Errors: as [`ResourceSlots::parse`], plus a missing or zero `cpu`, a missing `mem`.
    pub fn request_from_msgpack(
        v: &rmpv::Value,
        types: &SlotTypes,
    ) -> Result<ResourceSlots, SlotError> {
        let map = v
            .as_map()
            .ok_or_else(|| SlotError::Invalid("resource_slots must be a map".into()))?;
        let pairs = map.iter().map(|(k, v)| {
            (
                k.as_str().map_or_else(|| k.to_string(), str::to_owned),
                RawAmount::from_msgpack(v),
            )
        });
        ResourceSlots::parse(pairs, types)?.checked_request()
    }

    /// Parses a kernel request from JSON (the manager's API): as
    /// [`ResourceSlots::request_from_msgpack`].
    pub fn request_from_json(
        map: &BTreeMap<String, serde_json::Value>,
        types: &SlotTypes,
    ) -> Result<ResourceSlots, SlotError> {
        let pairs = map
            .iter()
            .map(|(k, v)| (k.clone(), RawAmount::from_json(v)));
        ResourceSlots::parse(pairs, types)?.checked_request()
    }

    /// `cpu` present and positive, `mem` present.
    fn checked_request(self) -> Result<ResourceSlots, SlotError> {
        if !self.0.contains_key(CPU) {
            return Err(SlotError::Invalid("resource slot `cpu` is required".into()));
        }
        if self.get(CPU) == Amount::ZERO {
            return Err(SlotError::Invalid(
                "resource slot `cpu` must be positive".into(),
            ));
        }
        if !self.0.contains_key(MEM) {
            return Err(SlotError::Invalid("resource slot `mem` is required".into()));
        }
        Ok(self)
    }

    /// Reads a map of decimal strings or numbers (heartbeats, stored JSON, wire replies) with
    /// no type checks; entries that do not parse are skipped.
    pub fn from_wire_msgpack(v: &rmpv::Value) -> ResourceSlots {
        let mut out = ResourceSlots::new();
        for (k, v) in v.as_map().map(Vec::as_slice).unwrap_or_default() {
            if let (Some(name), Ok(a)) = (
                k.as_str(),
                RawAmount::from_msgpack(v).amount("", SlotType::Count),
            ) {
                out.0.insert(name.to_owned(), a);
            }
        }
        out
    }

    /// As msgpack: `{name: "decimal string"}` (Backend.AI's wire form).
    pub fn to_msgpack(&self) -> rmpv::Value {
        rmpv::Value::Map(
            self.0
                .iter()
                .map(|(k, v)| (k.as_str().into(), v.to_string().into()))
                .collect(),
        )
    }

    /// As JSON: `{name: "decimal string"}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.to_string())))
                .collect(),
        )
    }

    /// The amount of `slot` (zero when absent).
    pub fn get(&self, slot: &str) -> Amount {
        self.0.get(slot).copied().unwrap_or_default()
    }

    /// Sets `slot` to `amount`.
    pub fn set(&mut self, slot: impl Into<String>, amount: Amount) {
        self.0.insert(slot.into(), amount);
    }

    /// Every `(slot, amount)`, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Amount)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Slot names with a non-zero amount.
    pub fn nonzero(&self) -> impl Iterator<Item = (&str, Amount)> {
        self.iter().filter(|(_, a)| *a != Amount::ZERO)
    }

    /// `self + other`, slot by slot.
    ///
    /// Errors: [`SlotError::Invalid`] naming the slot on overflow.
    pub fn checked_add(&self, other: &ResourceSlots) -> Result<ResourceSlots, SlotError> {
        let mut out = self.clone();
        for (k, v) in other.iter() {
            let sum = out
                .get(k)
                .checked_add(v)
                .ok_or_else(|| SlotError::Invalid(format!("resource slot `{k}`: too large")))?;
            out.0.insert(k.to_owned(), sum);
        }
        Ok(out)
    }

    /// `self - other`, slot by slot, at least zero.
    pub fn saturating_sub(&self, other: &ResourceSlots) -> ResourceSlots {
        let mut out = self.clone();
        for (k, v) in other.iter() {
            let left = out.get(k).saturating_sub(v);
            out.0.insert(k.to_owned(), left);
        }
        out
    }

    /// Whether this request fits in `free`: every non-zero slot asked for is there in full.
    ///
    /// Errors: [`SlotError::Exhausted`] with the first slot (by name) that does not fit.
    pub fn fits_in(&self, free: &ResourceSlots) -> Result<(), SlotError> {
        for (slot, requested) in self.nonzero() {
            let available = free.get(slot);
            if requested > available {
                return Err(SlotError::Exhausted {
                    slot: slot.to_owned(),
                    requested,
                    available,
                });
            }
        }
        Ok(())
    }

    /// Whether this request fits beside `used` in `total`: what
    /// `self.fits_in(&total.saturating_sub(used))` answers, without building the difference
    /// (placement asks it of every agent for every session).
    pub fn fits_beside(&self, used: &ResourceSlots, total: &ResourceSlots) -> bool {
        self.nonzero().all(|(slot, requested)| {
            total
                .get(slot)
                .checked_sub(used.get(slot))
                .is_some_and(|free| requested <= free)
        })
    }

    /// The highest `used / total` over the slots `total` has (0.0 with none): how loaded an
    /// agent is, for least-loaded placement.
    pub fn load(used: &ResourceSlots, total: &ResourceSlots) -> f64 {
        total
            .nonzero()
            .map(|(k, t)| used.get(k).as_f64() / t.as_f64())
            .fold(0.0, f64::max)
    }
}

impl fmt::Display for ResourceSlots {
    /// `cpu=1.5 mem=268435456 cuda.device=2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&parts.join(" "))
    }
}

impl FromIterator<(String, Amount)> for ResourceSlots {
    fn from_iter<I: IntoIterator<Item = (String, Amount)>>(iter: I) -> Self {
        ResourceSlots(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types() -> SlotTypes {
        let mut t = builtin_types();
        t.insert("cuda.shares".into(), SlotType::Count);
        t.insert("cuda.device".into(), SlotType::Count);
        t.insert("tpu.device".into(), SlotType::Unique);
        t
    }

    fn json(v: serde_json::Value) -> BTreeMap<String, serde_json::Value> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn shares_add_up_exactly() {
        let t = types();
        let a = ResourceSlots::request_from_json(
            &json(serde_json::json!({"cpu": 1, "mem": "1g", "cuda.shares": 0.1})),
            &t,
        )
        .unwrap();
        let b = ResourceSlots::request_from_json(
            &json(serde_json::json!({"cpu": "0.5", "mem": 1024, "cuda.shares": "0.2"})),
            &t,
        )
        .unwrap();
        let both = a.checked_add(&b).unwrap();
        assert_eq!(both.get("cuda.shares"), Amount::parse("0.3").unwrap());
        let mut free = ResourceSlots::new();
        free.set("cuda.shares", Amount::parse("0.3").unwrap());
        free.set("cpu", Amount::from_units(2));
        free.set("mem", Amount::from_units((1 << 30) + 1024));
        assert_eq!(both.fits_in(&free), Ok(()));
        assert_eq!(both.get("mem"), Amount::from_units((1 << 30) + 1024));
        assert_eq!(both.to_json()["cpu"], "1.5");
    }

    #[test]
    fn errors_name_the_slot() {
        let t = types();
        let parse = |v| ResourceSlots::request_from_json(&json(v), &t);
        assert_eq!(
            parse(serde_json::json!({"cpu": 1, "mem": 1, "rocm.device": 1})),
            Err(SlotError::Unknown("rocm.device".into()))
        );
        for (v, word) in [
            (serde_json::json!({"cpu": -1, "mem": 1}), "`cpu`"),
            (serde_json::json!({"cpu": "0.0001", "mem": 1}), "`cpu`"),
            (serde_json::json!({"cpu": 1, "mem": 1.5}), "`mem`"),
            (serde_json::json!({"cpu": 1, "mem": "lots"}), "`mem`"),
            (
                serde_json::json!({"cpu": 1, "mem": 1, "tpu.device": 0.5}),
                "`tpu.device`",
            ),
            (
                serde_json::json!({"cpu": 1, "mem": 1, "cuda.shares": [1]}),
                "`cuda.shares`",
            ),
            (serde_json::json!({"mem": 1}), "`cpu`"),
            (serde_json::json!({"cpu": 0, "mem": 1}), "`cpu`"),
            (serde_json::json!({"cpu": 1}), "`mem`"),
        ] {
            let e = parse(v.clone()).unwrap_err().to_string();
            assert!(e.contains(word), "{v}: {e}");
        }
        let short = ResourceSlots::from_iter([("cuda.device".to_owned(), Amount::from_units(3))]);
        let free = ResourceSlots::from_iter([("cuda.device".to_owned(), Amount::from_units(2))]);
        assert_eq!(
            short.fits_in(&free).unwrap_err().to_string(),
            "not enough cuda.device: requested 3, available 2"
        );
    }

    #[test]
    fn msgpack_and_wire_round_trip() {
        let t = types();
        let v = rmpv::Value::Map(vec![
            ("cpu".into(), "0.25".into()),
            ("mem".into(), 268435456.into()),
            ("cuda.shares".into(), rmpv::Value::F64(0.75)),
        ]);
        let r = ResourceSlots::request_from_msgpack(&v, &t).unwrap();
        assert_eq!(ResourceSlots::from_wire_msgpack(&r.to_msgpack()), r);
        let back: ResourceSlots =
            serde_json::from_value(serde_json::to_value(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(r.to_string(), "cpu=0.25 cuda.shares=0.75 mem=268435456");
    }

    #[test]
    fn load_is_the_fullest_slot() {
        let total = ResourceSlots::from_iter([
            ("cpu".to_owned(), Amount::from_units(4)),
            ("cuda.device".to_owned(), Amount::from_units(4)),
        ]);
        let used = ResourceSlots::from_iter([
            ("cpu".to_owned(), Amount::from_units(1)),
            ("cuda.device".to_owned(), Amount::from_units(3)),
        ]);
        assert_eq!(ResourceSlots::load(&used, &total), 0.75);
        assert!(
            check_name("cuda.device").is_ok()
                && check_name("Cuda").is_err()
                && check_name("").is_err()
        );
    }
}
