//! Backend.AI's msgpack extension types, decoded safely into plain msgpack values.
//!
//! Upstream: `ai.backend.common.msgpack` (backend.ai-common 26.x), whose `packb` turns these
//! Python types into msgpack `ExtType`s (and whose `unpackb` turns them back, with
//! `pickle.loads` for five of them). We never execute a pickle: [`pickle`] is a data reader
//! that admits only the classes each type needs, and [`normalize`] replaces every extension
//! value of a decoded message with a plain value:
//!
//! | code | Python (`ExtTypes`) | payload | becomes |
//! |---|---|---|---|
//! | 1 | `uuid.UUID` (`UUID`) | 16 raw bytes | str, canonical lowercase `8-4-4-4-12` (also as a map key) |
//! | 2 | `datetime.datetime` (`DATETIME`) | temporenc | str, RFC 3339 / Python `isoformat()`: `2024-01-02T03:04:05.123456+09:00`, no offset when naive ([`temporenc`]) |
//! | 3 | `decimal.Decimal` (`DECIMAL`) | pickle | str, Python's `str(d)` (`"1.5"`, `"1E+3"`); NaN and ±Infinity refused |
//! | 4 | `pathlib.PosixPath` (`POSIX_PATH`) | `os.fsencode` | str (must be UTF-8) |
//! | 5 | `pathlib.PurePosixPath` (`PURE_POSIX_PATH`) | `os.fsencode` | str (must be UTF-8) |
//! | 6 | an `enum.Enum` member (`ENUM`) | pickle | the member's value, str or int; allow-listed classes only ([`shapes::ENUMS`]) |
//! | 7 | `ai.backend.common.docker.ImageRef` (`IMAGE_REF`) | pickle | map `{name, project (str\|nil), tag, registry, architecture, is_local, canonical}` |
//! | 8 | `ai.backend.common.types.ResourceSlot` (`RESOURCE_SLOT`) | pickle | map slot name → decimal str |
//! | 9 | `ai.backend.common.types.SlotName` (`SLOT_NAME`) | pickle | str |
//! | 16 | `ai.backend.common.types.BinarySize` (`BACKENDAI_BINARY_SIZE`) | pickle | int |
//! | 17 | `ai.backend.common.typed_validators.AutoDirectoryPath` (`AUTO_DIRECTORY_PATH`) | `os.fsencode` | str (must be UTF-8) |
//!
//! Any other code is refused ([`ExtError::Unsupported`]). Fixtures made with the real
//! `packb` are under `tests/fixtures/bai/` (`scripts/bai-fixtures.py`).

pub mod pickle;
pub mod shapes;
pub mod temporenc;

#[cfg(test)]
mod tests;

use std::fmt;

use rmpv::Value;

pub use pickle::PickleError;

/// Backend.AI's extension type codes (`ai.backend.common.msgpack.ExtTypes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i8)]
pub enum ExtType {
    /// 1: `uuid.UUID`, 16 raw bytes.
    Uuid = 1,
    /// 2: `datetime.datetime`, temporenc bytes.
    Datetime = 2,
    /// 3: `decimal.Decimal`, pickled.
    Decimal = 3,
    /// 4: `pathlib.PosixPath`, fsencoded.
    PosixPath = 4,
    /// 5: `pathlib.PurePosixPath`, fsencoded.
    PurePosixPath = 5,
    /// 6: an `enum.Enum` member, pickled.
    Enum = 6,
    /// 7: `ImageRef`, pickled.
    ImageRef = 7,
    /// 8: `ResourceSlot`, pickled.
    ResourceSlot = 8,
    /// 9: `SlotName`, pickled.
    SlotName = 9,
    /// 16: `BinarySize`, pickled.
    BinarySize = 16,
    /// 17: `AutoDirectoryPath`, fsencoded.
    AutoDirectoryPath = 17,
}

impl ExtType {
    /// Every type, in code order.
    pub const ALL: [ExtType; 11] = [
        Self::Uuid,
        Self::Datetime,
        Self::Decimal,
        Self::PosixPath,
        Self::PurePosixPath,
        Self::Enum,
        Self::ImageRef,
        Self::ResourceSlot,
        Self::SlotName,
        Self::BinarySize,
        Self::AutoDirectoryPath,
    ];

    /// The type with wire code `code`, if Backend.AI defines one.
    pub fn from_code(code: i8) -> Option<Self> {
        Self::ALL.into_iter().find(|t| *t as i8 == code)
    }

    /// The member name in `ExtTypes`, e.g. `IMAGE_REF`.
    pub fn python_name(self) -> &'static str {
        match self {
            Self::Uuid => "UUID",
            Self::Datetime => "DATETIME",
            Self::Decimal => "DECIMAL",
            Self::PosixPath => "POSIX_PATH",
            Self::PurePosixPath => "PURE_POSIX_PATH",
            Self::Enum => "ENUM",
            Self::ImageRef => "IMAGE_REF",
            Self::ResourceSlot => "RESOURCE_SLOT",
            Self::SlotName => "SLOT_NAME",
            Self::BinarySize => "BACKENDAI_BINARY_SIZE",
            Self::AutoDirectoryPath => "AUTO_DIRECTORY_PATH",
        }
    }

    /// The classes a pickle of this type may name (empty for the types that are not pickled).
    pub fn allowed_classes(self) -> &'static [pickle::PyClass] {
        use shapes::*;
        match self {
            Self::Decimal => &[DECIMAL],
            Self::Enum => ENUMS,
            Self::ImageRef => &[IMAGE_REF, PLATFORM_TAG_SET],
            Self::ResourceSlot => &[RESOURCE_SLOT, DECIMAL],
            Self::SlotName => &[SLOT_NAME],
            Self::BinarySize => &[BINARY_SIZE],
            _ => &[],
        }
    }
}

impl fmt::Display for ExtType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", *self as i8, self.python_name())
    }
}

/// Why an extension value was not decoded. The `Display` text starts with [`ExtError::name`],
/// so it names the problem wherever it is shown (the RPC server puts it in the ERROR reply).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExtError {
    /// An extension code Backend.AI does not define.
    #[error("UnsupportedExtType: unsupported msgpack extension type {0}")]
    Unsupported(i8),
    /// A pickled type whose pickle the reader refused (a class outside the allow-list, an
    /// opcode it does not implement, a malformed or oversized pickle, or the wrong shape).
    #[error("PickleRefused: ext {ext}: {reason}")]
    Pickle {
        /// The extension type.
        ext: ExtType,
        /// What the reader refused.
        reason: PickleError,
    },
    /// A non-pickled payload that is invalid (a UUID not 16 bytes, bad temporenc, a path not
    /// UTF-8), or a non-finite Decimal.
    #[error("InvalidExtValue: ext {ext}: {reason}")]
    Invalid {
        /// The extension type.
        ext: ExtType,
        /// What was wrong.
        reason: String,
    },
}

impl ExtError {
    /// A stable name for the error class: `UnsupportedExtType`, `PickleRefused` or
    /// `InvalidExtValue` (what an RPC error reply's `name` should carry).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Unsupported(_) => "UnsupportedExtType",
            Self::Pickle { .. } => "PickleRefused",
            Self::Invalid { .. } => "InvalidExtValue",
        }
    }

    /// The refused class as `module.name`, when a pickle named one outside the allow-list.
    pub fn refused_class(&self) -> Option<&str> {
        match self {
            Self::Pickle {
                reason: PickleError::Class { class },
                ..
            } => Some(class),
            _ => None,
        }
    }
}

/// Canonical lowercase hyphenated text of 16 UUID bytes.
fn uuid_text(bytes: &[u8]) -> Option<String> {
    uuid::Uuid::from_slice(bytes)
        .ok()
        .map(|u| u.hyphenated().to_string())
}

/// Decodes one extension value (`code`, payload) into a plain msgpack value (shapes in the
/// module docs).
///
/// Errors: [`ExtError`]; never panics, for any code and bytes.
pub fn decode_ext(code: i8, data: &[u8]) -> Result<Value, ExtError> {
    let ext = ExtType::from_code(code).ok_or(ExtError::Unsupported(code))?;
    let invalid = |reason: String| ExtError::Invalid { ext, reason };
    match ext {
        ExtType::Uuid => uuid_text(data)
            .map(Value::from)
            .ok_or_else(|| invalid(format!("a UUID is 16 bytes, got {}", data.len()))),
        ExtType::Datetime => temporenc::decode(data)
            .and_then(|m| temporenc::to_rfc3339(&m))
            .map(Value::from)
            .map_err(invalid),
        ExtType::PosixPath | ExtType::PurePosixPath | ExtType::AutoDirectoryPath => {
            std::str::from_utf8(data)
                .map(Value::from)
                .map_err(|e| invalid(format!("path is not UTF-8: {e}")))
        }
        ExtType::Decimal
        | ExtType::Enum
        | ExtType::ImageRef
        | ExtType::ResourceSlot
        | ExtType::SlotName
        | ExtType::BinarySize => {
            let refuse = |reason| ExtError::Pickle { ext, reason };
            let p = pickle::load(data, ext.allowed_classes()).map_err(refuse)?;
            let shaped = match ext {
                ExtType::Decimal => shapes::decimal(&p),
                ExtType::Enum => shapes::enum_value(&p),
                ExtType::ImageRef => shapes::image_ref(&p),
                ExtType::ResourceSlot => shapes::resource_slot(&p),
                ExtType::SlotName => shapes::slot_name(&p),
                _ => shapes::binary_size(&p),
            };
            shaped.map_err(|e| match e {
                shapes::ShapeError::Refused(reason) => refuse(reason),
                // A non-finite Decimal is a value we refuse, not a bad pickle.
                shapes::ShapeError::Invalid(reason) => invalid(reason),
            })
        }
    }
}

/// Replaces, in place, every extension value in `value` (at any depth, map keys included)
/// with its plain form ([`decode_ext`]).
///
/// Errors: the first extension value that does not decode; `value` may then be partly
/// normalized.
pub fn normalize(value: &mut Value) -> Result<(), ExtError> {
    match value {
        Value::Ext(code, data) => {
            *value = decode_ext(*code, data)?;
            Ok(())
        }
        Value::Array(items) => items.iter_mut().try_for_each(normalize),
        Value::Map(pairs) => pairs.iter_mut().try_for_each(|(k, v)| {
            normalize(k)?;
            normalize(v)
        }),
        _ => Ok(()),
    }
}
