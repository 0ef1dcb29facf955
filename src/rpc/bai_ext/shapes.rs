//! The pickled extension types as plain values: which classes each may name, and how the
//! object [`super::pickle::load`] read is turned into msgpack. Shapes follow CPython 3.13's
//! `pickle.dumps(obj, protocol=5)` of the backend.ai-common 26.9.6 classes (fixtures under
//! `tests/fixtures/bai/`, made by `scripts/bai-fixtures.py`).

use rmpv::Value;

use super::pickle::{Obj, PickleError, Pickled, PyClass, Ref};

const fn class(module: &'static str, name: &'static str) -> PyClass {
    PyClass { module, name }
}

const TYPES: &str = "ai.backend.common.types";
const DOCKER: &str = "ai.backend.common.docker";

/// `decimal.Decimal`: `REDUCE(Decimal, (str(d),))`.
pub const DECIMAL: PyClass = class("decimal", "Decimal");
/// `ai.backend.common.types.ResourceSlot` (`UserDict[str, Decimal]` with `__slots__ = ("data",)`):
/// `NEWOBJ(ResourceSlot, ())` then `BUILD((None, {"data": {name: Decimal}}))`.
pub const RESOURCE_SLOT: PyClass = class(TYPES, "ResourceSlot");
/// `ai.backend.common.types.SlotName` (a `UserString`): `NEWOBJ(SlotName, (s,))` then
/// `BUILD(({"data": s}, {…lazily parsed slots…}))`.
pub const SLOT_NAME: PyClass = class(TYPES, "SlotName");
/// `ai.backend.common.types.BinarySize` (an `int`): `NEWOBJ(BinarySize, (n,))`.
pub const BINARY_SIZE: PyClass = class(TYPES, "BinarySize");
/// `ai.backend.common.docker.ImageRef` (a dataclass): `NEWOBJ(ImageRef, ())` then
/// `BUILD({name, project, tag, registry, architecture, is_local, _tag_set})`.
pub const IMAGE_REF: PyClass = class(DOCKER, "ImageRef");
/// `ai.backend.common.docker.PlatformTagSet`, inside `ImageRef._tag_set` (read, then ignored:
/// it is derived from `tag`).
pub const PLATFORM_TAG_SET: PyClass = class(DOCKER, "PlatformTagSet");

/// The enums ext 6 may carry: `REDUCE(cls, (member.value,))`. An exact list, not a module
/// prefix: the `StrEnum`s whose members reach the agent's RPC methods in Backend.AI 26.x
/// (`KernelCreationConfig.auto_pull`/`session_type`/`cluster_mode`, `destroy_kernel(reason=)`,
/// service-port protocols, mount permissions and types, commit status, session results,
/// kernel and container statuses, slot types). Decoding one yields its value and runs nothing,
/// so the list only limits what a manager may send; any other class is refused by name.
pub const ENUMS: &[PyClass] = &[
    class(TYPES, "AutoPullBehavior"),
    class(TYPES, "SessionTypes"),
    class(TYPES, "ClusterMode"),
    class(TYPES, "SessionResult"),
    class(TYPES, "ServicePortProtocols"),
    class(TYPES, "MountPermission"),
    class(TYPES, "MountTypes"),
    class(TYPES, "CommitStatus"),
    class(TYPES, "KernelLifecycleStatus"),
    class(TYPES, "ContainerStatus"),
    class(TYPES, "SlotTypes"),
    class(TYPES, "VFolderUsageMode"),
    class(
        "ai.backend.common.events.event_types.kernel.types",
        "KernelLifecycleEventReason",
    ),
];

/// Why a pickle that loaded is not a value of its extension type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShapeError {
    /// Not the shape the type pickles to ([`PickleError::Shape`]) or another pickle error.
    Refused(PickleError),
    /// The right shape with a value we do not accept (a non-finite `Decimal`).
    Invalid(String),
}

impl From<PickleError> for ShapeError {
    fn from(e: PickleError) -> Self {
        ShapeError::Refused(e)
    }
}

fn shape(what: &str, detail: impl std::fmt::Display) -> ShapeError {
    ShapeError::Refused(PickleError::Shape(format!(
        "not a pickled {what}: {detail}"
    )))
}

/// An instance as [`instance`] found it.
struct Inst<'p> {
    /// The argument tuple's items.
    args: &'p [Ref],
    /// Made by `NEWOBJ` (else `REDUCE`).
    new_obj: bool,
    /// The `BUILD` state.
    state: Option<Ref>,
}

/// The object `r` when it is an instance of one of `cls`.
fn instance<'p>(
    p: &'p Pickled,
    r: Ref,
    cls: &[PyClass],
    what: &str,
) -> Result<Inst<'p>, ShapeError> {
    match p.get(r) {
        Obj::Instance {
            class,
            args,
            new_obj,
            state,
        } if cls.contains(class) => {
            let Obj::Tuple(items) = p.get(*args) else {
                return Err(shape(what, "arguments are not a tuple"));
            };
            Ok(Inst {
                args: items,
                new_obj: *new_obj,
                state: *state,
            })
        }
        Obj::Instance { class, .. } => Err(shape(what, format!("an instance of `{class}`"))),
        Obj::Class(class) => Err(shape(what, format!("the class `{class}` itself"))),
        other => Err(shape(what, format!("a {}", kind(other)))),
    }
}

fn kind(o: &Obj) -> &'static str {
    match o {
        Obj::None => "None",
        Obj::Bool(_) => "bool",
        Obj::Int(_) => "int",
        Obj::Str(_) => "str",
        Obj::Tuple(_) => "tuple",
        Obj::Dict(_) => "dict",
        Obj::Class(_) => "class",
        Obj::Instance { .. } => "object",
    }
}

/// The instance `__dict__` of a `BUILD` state: a dict, or the dict/slots pair
/// `(dict | None, slots_dict)` of a class with `__slots__` (both merged, slots last).
fn state_get(p: &Pickled, state: Option<Ref>, key: &str) -> Option<Ref> {
    let state = state?;
    match p.get(state) {
        Obj::Dict(_) => p.dict_get(state, key),
        Obj::Tuple(pair) if pair.len() == 2 => p
            .dict_get(pair[1], key)
            .or_else(|| p.dict_get(pair[0], key)),
        _ => None,
    }
}

/// Python's `str(Decimal)` text of a finite value: `-?D+(.D+)?([Ee][+-]?D+)?`.
/// Errors: [`ShapeError::Invalid`] for non-finite values (`NaN`, `sNaN`, `Infinity`, signed),
/// [`ShapeError::Refused`] for anything else that is not such a literal.
pub fn check_decimal(s: &str) -> Result<(), ShapeError> {
    let unsigned = s.strip_prefix(['-', '+']).unwrap_or(s);
    let lower = unsigned.get(..4).unwrap_or(unsigned).to_ascii_lowercase();
    if lower.starts_with("inf") || lower.starts_with("nan") || lower.starts_with("snan") {
        return Err(ShapeError::Invalid(format!(
            "non-finite Decimal {:?} is not accepted (only finite values)",
            s.chars().take(64).collect::<String>()
        )));
    }
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let (mantissa, exp) = match unsigned.split_once(['E', 'e']) {
        Some((m, e)) => (m, Some(e)),
        None => (unsigned, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((i, f)) => digits(i) && digits(f),
        None => digits(mantissa),
    };
    let exp_ok = exp.is_none_or(|e| digits(e.strip_prefix(['+', '-']).unwrap_or(e)));
    if mantissa_ok && exp_ok && !s.starts_with('+') {
        Ok(())
    } else {
        Err(shape(
            "Decimal",
            format!(
                "{:?} is not a decimal literal",
                s.chars().take(64).collect::<String>()
            ),
        ))
    }
}

/// A `Decimal` object's text, checked by [`check_decimal`].
fn decimal_text(p: &Pickled, r: Ref) -> Result<String, ShapeError> {
    let Inst {
        args,
        new_obj,
        state,
    } = instance(p, r, &[DECIMAL], "Decimal")?;
    let [arg] = args else {
        return Err(shape("Decimal", format!("{} arguments", args.len())));
    };
    if new_obj || state.is_some() {
        return Err(shape("Decimal", "not REDUCE(Decimal, (str,))"));
    }
    let s = p
        .str_at(*arg)
        .ok_or_else(|| shape("Decimal", "its argument is not a str"))?;
    check_decimal(s)?;
    Ok(s.to_owned())
}

fn int_value(v: i128, what: &str) -> Result<Value, ShapeError> {
    if let Ok(i) = i64::try_from(v) {
        Ok(Value::from(i))
    } else if let Ok(u) = u64::try_from(v) {
        Ok(Value::from(u))
    } else {
        Err(shape(what, format!("{v} does not fit a msgpack int")))
    }
}

/// Ext 3: `Decimal` → its text (`"1.5"`, `"1E+3"`, `"-0.001"`, …) as a msgpack str.
pub fn decimal(p: &Pickled) -> Result<Value, ShapeError> {
    decimal_text(p, p.root).map(Value::from)
}

/// Ext 6: an allow-listed enum member → its value (str, or int for an `IntEnum`).
pub fn enum_value(p: &Pickled) -> Result<Value, ShapeError> {
    let Inst {
        args,
        new_obj,
        state,
    } = instance(p, p.root, ENUMS, "enum member")?;
    if new_obj || state.is_some() || args.len() != 1 {
        return Err(shape("enum member", "not REDUCE(cls, (value,))"));
    }
    match p.get(args[0]) {
        Obj::Str(s) => Ok(Value::from(s.as_str())),
        Obj::Int(i) => int_value(*i, "enum member"),
        other => Err(shape(
            "enum member",
            format!("its value is a {}", kind(other)),
        )),
    }
}

/// Ext 16: `BinarySize` → the integer.
pub fn binary_size(p: &Pickled) -> Result<Value, ShapeError> {
    let Inst { args, .. } = instance(p, p.root, &[BINARY_SIZE], "BinarySize")?;
    match args {
        [a] => match p.get(*a) {
            Obj::Int(i) => int_value(*i, "BinarySize"),
            other => Err(shape(
                "BinarySize",
                format!("its value is a {}", kind(other)),
            )),
        },
        _ => Err(shape("BinarySize", format!("{} arguments", args.len()))),
    }
}

/// Ext 9: `SlotName` → its text (the `data` attribute; the constructor argument when the
/// pickle has no state).
pub fn slot_name(p: &Pickled) -> Result<Value, ShapeError> {
    let Inst { args, state, .. } = instance(p, p.root, &[SLOT_NAME], "SlotName")?;
    let data = state_get(p, state, "data").or(match args {
        [a] => Some(*a),
        _ => None,
    });
    data.and_then(|r| p.str_at(r))
        .map(Value::from)
        .ok_or_else(|| shape("SlotName", "no str `data`"))
}

/// Ext 8: `ResourceSlot` → a map slot name → decimal text, in the pickle's order (a repeated
/// name keeps its last value, as Python's dict does).
pub fn resource_slot(p: &Pickled) -> Result<Value, ShapeError> {
    let Inst { state, .. } = instance(p, p.root, &[RESOURCE_SLOT], "ResourceSlot")?;
    let data = state_get(p, state, "data").ok_or_else(|| shape("ResourceSlot", "no `data`"))?;
    let Obj::Dict(pairs) = p.get(data) else {
        return Err(shape("ResourceSlot", "`data` is not a dict"));
    };
    let mut out: Vec<(Value, Value)> = Vec::with_capacity(pairs.len());
    let mut index: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::with_capacity(pairs.len());
    for (k, v) in pairs {
        let name = p
            .str_at(*k)
            .ok_or_else(|| shape("ResourceSlot", "a slot name is not a str"))?;
        let amount = Value::from(decimal_text(p, *v)?);
        match index.get(name) {
            Some(&i) => out[i].1 = amount,
            None => {
                index.insert(name, out.len());
                out.push((Value::from(name), amount));
            }
        }
    }
    Ok(Value::Map(out))
}

/// Ext 7: `ImageRef` → `{"name", "project", "tag", "registry", "architecture", "is_local",
/// "canonical"}`; `project` is nil when `None`, and `canonical` is `ImageRef.canonical`:
/// the non-empty ones of registry, project, name joined by `/`, then `:tag`.
pub fn image_ref(p: &Pickled) -> Result<Value, ShapeError> {
    let Inst { state, .. } = instance(p, p.root, &[IMAGE_REF], "ImageRef")?;
    let field = |key: &str| {
        state_get(p, state, key).ok_or_else(|| shape("ImageRef", format!("no `{key}`")))
    };
    let text = |key: &str| {
        let r = field(key)?;
        p.str_at(r)
            .map(str::to_owned)
            .ok_or_else(|| shape("ImageRef", format!("`{key}` is not a str")))
    };
    let name = text("name")?;
    let project = match p.get(field("project")?) {
        Obj::None => None,
        Obj::Str(s) => Some(s.clone()),
        _ => return Err(shape("ImageRef", "`project` is not a str or None")),
    };
    let tag = text("tag")?;
    let registry = text("registry")?;
    let architecture = text("architecture")?;
    let Obj::Bool(is_local) = *p.get(field("is_local")?) else {
        return Err(shape("ImageRef", "`is_local` is not a bool"));
    };
    let joined = [
        Some(registry.as_str()),
        project.as_deref(),
        Some(name.as_str()),
    ]
    .into_iter()
    .flatten()
    .filter(|s| !s.is_empty())
    .collect::<Vec<_>>()
    .join("/");
    let canonical = format!("{joined}:{tag}");
    Ok(Value::Map(vec![
        (Value::from("name"), Value::from(name)),
        (
            Value::from("project"),
            project.map(Value::from).unwrap_or(Value::Nil),
        ),
        (Value::from("tag"), Value::from(tag)),
        (Value::from("registry"), Value::from(registry)),
        (Value::from("architecture"), Value::from(architecture)),
        (Value::from("is_local"), Value::Boolean(is_local)),
        (Value::from("canonical"), Value::from(canonical)),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_literals() {
        for ok in [
            "1.5",
            "0",
            "-0",
            "1E+3",
            "0E-7",
            "1.23E-7",
            "268435456",
            "-0.001",
        ] {
            assert_eq!(check_decimal(ok), Ok(()), "{ok}");
        }
        for bad in [
            "", "1.", ".5", "+1", "1e", "1E+", "1.2.3", "0x10", "1 ", "١",
        ] {
            assert!(check_decimal(bad).is_err(), "{bad}");
        }
        for nonfinite in ["NaN", "-NaN", "sNaN", "NaN123", "Infinity", "-Infinity"] {
            let e = check_decimal(nonfinite).unwrap_err();
            assert!(matches!(e, ShapeError::Invalid(_)), "{e:?}");
        }
        assert!(matches!(
            check_decimal("1.x"),
            Err(ShapeError::Refused(PickleError::Shape(_)))
        ));
    }
}
