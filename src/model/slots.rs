//! The schemas of slot maps and port lists, for `#[schema(schema_with = …)]` on the model's
//! fields: shapes no Rust type of the model spells out (numbers or decimal strings, bounds).

use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::RefOr;

/// Slot amounts as Backend.AI writes them: `{slot name: decimal string}`.
pub type SlotAmounts = std::collections::BTreeMap<String, String>;

/// `resource_slots` of `POST /v1/sessions`: `cpu` cores (a number, or a decimal string; at most
/// 3 decimals; positive), `mem` bytes (a whole number, or a size string such as `"256m"`), and
/// any accelerator slot an `ALIVE` agent advertises (`cuda.device`, `cuda.shares`, …: a
/// non-negative number or decimal string in the slot's unit). A slot no agent has is 400
/// `unknown-slot`.
///
/// `exclusiveMinimum` comes with a `minimum` of the same value here and in the `#[schema]`
/// attributes: the same bound in OpenAPI 3.1, and tools that still read `exclusiveMinimum` the
/// draft-4 way (a flag on `minimum`; schemathesis 3's negative data) need it.
pub fn resource_slots_schema() -> Schema {
    let number_or_string = |t: Type| SchemaType::from_iter([t, Type::String]);
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(
            "Requested slots: `cpu` cores (number or decimal string, at most 3 decimals, \
             positive), `mem` bytes (whole number, or a size string such as \"256m\", \"1g\"; at \
             least 6 MiB, Docker's minimum), and any accelerator slot an ALIVE agent advertises \
             (`cuda.device`, `cuda.shares`, …: a non-negative number or decimal string, at most 3 \
             decimals, whole for `bytes` and `unique` slots). A slot no agent has: 400 \
             `unknown-slot`.",
        ))
        .property(
            "cpu",
            ObjectBuilder::new()
                .schema_type(number_or_string(Type::Number))
                .minimum(Some(0))
                .exclusive_minimum(Some(0)),
        )
        .property(
            "mem",
            ObjectBuilder::new()
                .schema_type(number_or_string(Type::Integer))
                .minimum(Some(MIN_MEM_BYTES)),
        )
        .required("cpu")
        .required("mem")
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(
            ObjectBuilder::new()
                .schema_type(number_or_string(Type::Number))
                .minimum(Some(0))
                .into(),
        ))))
        .into()
}

/// Slot amounts as Backend.AI writes them: `{slot name: decimal string}` over any slot names
/// (`{"cpu": "1.5", "mem": "268435456", "cuda.shares": "0.5"}`).
pub fn slot_amounts_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(
            "`{slot name: decimal string}`: `cpu` cores, `mem` bytes, accelerator slots in \
             their unit.",
        ))
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(r"^[0-9]+(\.[0-9]+)?$"))
                .into(),
        ))))
        .into()
}

/// Slot types: `{slot name: "count" | "bytes" | "unique"}`.
pub fn slot_types_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some("`{slot name: unit}`: `count`, `bytes` or `unique`."))
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(["count", "bytes", "unique"]))
                .into(),
        ))))
        .into()
}

/// The smallest `mem` an agent takes (Docker refuses less; the agent answers 400 first).
const MIN_MEM_BYTES: u64 = 6 << 20;

/// Container ports of a `service_ports` entry: TCP port numbers (1–65535).
pub fn container_ports_schema() -> Schema {
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(1))
                .maximum(Some(u16::MAX)),
        )
        .into()
}
