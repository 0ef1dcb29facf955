//! The callosum 1.0 wire format as pure functions: frames, the header map, the body map.
//!
//! Source: `docs/wire-protocol.md`, after lablup/callosum `lower/zeromq.py` (frames, PING/PONG)
//! and `rpc/message.py` (header and body maps). Nothing here touches a socket, so every
//! function is unit-tested and property-tested: arbitrary bytes yield an error, never a panic.
//!
//! Shapes:
//! - frames client→server `[b"UPPER", header, body]`, server side `[peer_id, b"UPPER", header, body]`;
//!   handshake `[b"PING", x, y]` answered `[b"PONG", x, y]` (server side prefixed with `peer_id`).
//! - header: msgpack map `{type: int, meth: str, okey: str|bin, seq: u32, zip: bool}`.
//! - body: msgpack map `{meta: bin, body: bin|nil}`; `meta` is `b""` (FUNCTION), `0x90` (empty
//!   array: RESULT, CANCEL, CANCELLED) or a packed `[name, repr, traceback]` (FAILURE, ERROR).

use std::fmt;

use rmpv::Value;

use super::bai_ext;

/// First frame (after the ROUTER's peer id) of an RPC message.
pub const UPPER: &[u8] = b"UPPER";
/// First frame of the client's connection handshake.
pub const PING: &[u8] = b"PING";
/// First frame of the server's handshake answer.
pub const PONG: &[u8] = b"PONG";

/// Largest decompressed body accepted from a `zip = true` message, in bytes (callosum's
/// `max_body_size` default is 10 MiB; we allow the same and refuse more).
pub const MAX_BODY_BYTES: usize = 10 * 1024 * 1024;

/// callosum's `RPCMessageTypes`: all seven, with their wire values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MsgType {
    /// 0: never sent by callosum; decoded so it can be refused by name.
    Null = 0,
    /// 1: client calls a method.
    Function = 1,
    /// 2: server returns the method's value.
    Result = 2,
    /// 3: the handler raised (a user-level error).
    Failure = 3,
    /// 4: the RPC layer itself failed (bad body, unknown encoding).
    Error = 4,
    /// 5: client timed out or cancelled; the server cancels the handler.
    Cancel = 5,
    /// 6: the server cancelled the handler.
    Cancelled = 6,
}

impl MsgType {
    /// Maps a wire value to a type; `None` for values outside 0..=6.
    pub fn from_wire(v: u64) -> Option<Self> {
        Some(match v {
            0 => Self::Null,
            1 => Self::Function,
            2 => Self::Result,
            3 => Self::Failure,
            4 => Self::Error,
            5 => Self::Cancel,
            6 => Self::Cancelled,
            _ => return None,
        })
    }

    /// Whether the body map's `body` carries an application payload (FUNCTION, RESULT).
    pub fn has_payload(self) -> bool {
        matches!(self, Self::Function | Self::Result)
    }

    /// Whether `meta` carries `[name, repr, traceback]` (FAILURE, ERROR).
    pub fn has_error_meta(self) -> bool {
        matches!(self, Self::Failure | Self::Error)
    }
}

/// The order key, kept with the msgpack type it arrived with: callosum's client matches a
/// reply by `(meth, okey, seq)` and Python's `b"" != ""`, so a reply that changed the type
/// would never resolve (`docs/wire-protocol.md`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OrderKey {
    /// msgpack str.
    Str(String),
    /// msgpack bin (callosum's `invoke` default, `b""`).
    Bin(Vec<u8>),
}

impl Default for OrderKey {
    /// callosum's default order key, `b""`.
    fn default() -> Self {
        OrderKey::Bin(Vec::new())
    }
}

/// The header frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Message type.
    pub msg_type: MsgType,
    /// Method name.
    pub method: String,
    /// Order key, echoed back unchanged.
    pub okey: OrderKey,
    /// Client sequence id (u32, wraps at 2^32), echoed back unchanged.
    pub seq: u32,
    /// Whether the body frame is snappy-compressed (raw snappy, as python-snappy's `compress`).
    pub zip: bool,
}

/// `[name, repr, traceback]` of a FAILURE or ERROR (callosum's `ErrorMetadata`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorMeta {
    /// Exception type name, e.g. `KernelNotFound`; a stable name clients match on.
    pub name: String,
    /// Human-readable description (Python's `repr(exc)`).
    pub repr: String,
    /// Traceback text; may be empty.
    pub traceback: String,
}

impl fmt::Display for ErrorMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.repr)
    }
}

/// One decoded RPC message (header and body frames, without the transport's peer id).
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// The header map.
    pub header: Header,
    /// Error metadata; `Some` only for FAILURE and ERROR.
    pub error: Option<ErrorMeta>,
    /// The application payload, still msgpack-encoded; `Some` only for FUNCTION and RESULT.
    pub payload: Option<Vec<u8>>,
}

/// Why bytes could not be decoded. Every variant is a clear, loggable reason; none panics.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// The frame count or the marker frame is not a callosum message.
    #[error("malformed frames: {0}")]
    Frames(String),
    /// The header frame is not the expected msgpack map.
    #[error("malformed header: {0}")]
    Header(String),
    /// The body frame is not the expected msgpack map (the header decoded, so a reply is possible).
    #[error("malformed body: {0}")]
    Body(String),
}

/// What a set of frames is, once the transport's envelope is known.
#[derive(Debug, PartialEq, Eq)]
pub enum Frames<'a> {
    /// Connection handshake; the two trailing frames are echoed in the PONG.
    Ping(&'a [u8], &'a [u8]),
    /// Handshake answer.
    Pong,
    /// An RPC message: header and body frames.
    Upper(&'a [u8], &'a [u8]),
}

/// Classifies frames as received. `frames` excludes the ROUTER's peer id.
///
/// Errors: anything that is not `PING`/`PONG`/`UPPER` followed by exactly two frames.
pub fn classify<'a>(frames: &[&'a [u8]]) -> Result<Frames<'a>, CodecError> {
    match frames {
        [kind, h, b] if *kind == PING => Ok(Frames::Ping(h, b)),
        [kind, _, _] if *kind == PONG => Ok(Frames::Pong),
        [kind, h, b] if *kind == UPPER => Ok(Frames::Upper(h, b)),
        [kind, ..] => Err(CodecError::Frames(format!(
            "{} frames starting with {:?}",
            frames.len(),
            String::from_utf8_lossy(&kind[..kind.len().min(16)])
        ))),
        [] => Err(CodecError::Frames("no frames".into())),
    }
}

fn read_value(bytes: &[u8]) -> Result<Value, String> {
    let mut cursor = bytes;
    let value = rmpv::decode::read_value(&mut cursor).map_err(|e| e.to_string())?;
    if !cursor.is_empty() {
        return Err(format!("{} trailing bytes", cursor.len()));
    }
    Ok(value)
}

/// Encodes a value as msgpack bytes. Writing into a `Vec` cannot fail.
pub fn to_msgpack(value: &Value) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    rmpv::encode::write_value(&mut buf, value).expect("writing msgpack into a Vec cannot fail");
    buf
}

/// Decodes msgpack bytes that must hold exactly one value.
pub fn from_msgpack(bytes: &[u8]) -> Result<Value, String> {
    read_value(bytes)
}

/// The value under string key `key` of a msgpack map (callosum's maps and the event and
/// heartbeat maps of `docs/events.md`); `None` when absent.
pub fn map_get<'v>(map: &'v [(Value, Value)], key: &str) -> Option<&'v Value> {
    map.iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

/// Decodes the header frame.
///
/// Errors: not a map, a missing or mistyped `type`/`meth`/`okey`/`seq`, or `type` outside 0..=6.
/// A missing `zip` reads as `false`.
pub fn decode_header(bytes: &[u8]) -> Result<Header, CodecError> {
    let err = CodecError::Header;
    let value = read_value(bytes).map_err(err)?;
    let Value::Map(map) = value else {
        return Err(err("not a map".into()));
    };
    let raw_type = map_get(&map, "type")
        .and_then(Value::as_u64)
        .ok_or_else(|| err("`type` missing or not an int".into()))?;
    let msg_type =
        MsgType::from_wire(raw_type).ok_or_else(|| err(format!("unknown type {raw_type}")))?;
    let method = map_get(&map, "meth")
        .and_then(Value::as_str)
        .ok_or_else(|| err("`meth` missing or not a str".into()))?
        .to_owned();
    let okey = match map_get(&map, "okey") {
        Some(Value::String(s)) => OrderKey::Str(
            s.as_str()
                .ok_or_else(|| err("`okey` is not valid UTF-8".into()))?
                .to_owned(),
        ),
        Some(Value::Binary(b)) => OrderKey::Bin(b.clone()),
        // callosum's Python side may send `okey = None` when a caller passes it explicitly.
        Some(Value::Nil) | None => OrderKey::Bin(Vec::new()),
        Some(other) => return Err(err(format!("`okey` has unsupported type: {other}"))),
    };
    let seq = map_get(&map, "seq")
        .and_then(Value::as_u64)
        .ok_or_else(|| err("`seq` missing or not an int".into()))?;
    let seq = u32::try_from(seq).map_err(|_| err(format!("`seq` {seq} exceeds u32")))?;
    let zip = match map_get(&map, "zip") {
        None | Some(Value::Nil) => false,
        Some(Value::Boolean(b)) => *b,
        Some(other) => return Err(err(format!("`zip` is not a bool: {other}"))),
    };
    Ok(Header {
        msg_type,
        method,
        okey,
        seq,
        zip,
    })
}

/// Encodes the header frame with callosum's key order.
pub fn encode_header(h: &Header) -> Vec<u8> {
    let okey = match &h.okey {
        OrderKey::Str(s) => Value::from(s.as_str()),
        OrderKey::Bin(b) => Value::Binary(b.clone()),
    };
    to_msgpack(&Value::Map(vec![
        (Value::from("type"), Value::from(h.msg_type as u8)),
        (Value::from("meth"), Value::from(h.method.as_str())),
        (Value::from("okey"), okey),
        (Value::from("seq"), Value::from(h.seq)),
        (Value::from("zip"), Value::Boolean(h.zip)),
    ]))
}

/// Decodes the body frame of a message whose header is already decoded.
///
/// Errors: a snappy body that does not decompress (or exceeds [`MAX_BODY_BYTES`]), a body that is
/// not `{meta: bin, body: bin|nil}`, FAILURE/ERROR metadata that is not three strings, or a
/// FUNCTION/RESULT without a payload.
pub fn decode_body(header: &Header, bytes: &[u8]) -> Result<Message, CodecError> {
    let err = CodecError::Body;
    let decompressed;
    let bytes = if header.zip {
        let len = snap::raw::decompress_len(bytes).map_err(|e| err(format!("snappy: {e}")))?;
        if len > MAX_BODY_BYTES {
            return Err(err(format!(
                "decompressed body of {len} bytes exceeds {MAX_BODY_BYTES}"
            )));
        }
        decompressed = snap::raw::Decoder::new()
            .decompress_vec(bytes)
            .map_err(|e| err(format!("snappy: {e}")))?;
        &decompressed[..]
    } else {
        bytes
    };
    let Value::Map(mut map) = read_value(bytes).map_err(err)? else {
        return Err(err("not a map".into()));
    };
    // The payload is moved out of the map, not copied (it may be megabytes of a file).
    let body = map
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some("body"))
        .map(|(_, v)| std::mem::replace(v, Value::Nil));
    let meta = match map_get(&map, "meta") {
        Some(Value::Binary(b)) => b.as_slice(),
        Some(Value::Nil) | None => &[],
        Some(other) => return Err(err(format!("`meta` is not bin: {other}"))),
    };
    let error = if header.msg_type.has_error_meta() {
        Some(decode_error_meta(meta).map_err(err)?)
    } else {
        None
    };
    let payload = match body {
        Some(Value::Binary(b)) if header.msg_type.has_payload() => Some(b),
        Some(Value::Nil) | None if header.msg_type.has_payload() => {
            return Err(err(format!("{:?} without a payload", header.msg_type)));
        }
        Some(Value::Binary(_)) | Some(Value::Nil) | None => None,
        Some(other) => return Err(err(format!("`body` is not bin or nil: {other}"))),
    };
    Ok(Message {
        header: header.clone(),
        error,
        payload,
    })
}

fn decode_error_meta(meta: &[u8]) -> Result<ErrorMeta, String> {
    let value = read_value(meta)?;
    match value {
        Value::Array(items) if items.len() == 3 => {
            let s = |v: &Value| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or("error metadata is not 3 strings")
            };
            Ok(ErrorMeta {
                name: s(&items[0])?,
                repr: s(&items[1])?,
                traceback: s(&items[2])?,
            })
        }
        _ => Err("error metadata is not [name, repr, traceback]".into()),
    }
}

/// Encodes the body frame of `msg` (uncompressed; we always send `zip = false`, as callosum does).
pub fn encode_body(msg: &Message) -> Vec<u8> {
    let meta: Vec<u8> = match (&msg.error, msg.header.msg_type) {
        (Some(e), _) => to_msgpack(&Value::Array(vec![
            Value::from(e.name.as_str()),
            Value::from(e.repr.as_str()),
            Value::from(e.traceback.as_str()),
        ])),
        // callosum sends FUNCTION with `metadata=None` → b"" and the others with an empty tuple.
        (None, MsgType::Function) => Vec::new(),
        (None, _) => vec![0x90],
    };
    // Written field by field: the payload (it may be megabytes of a file) is copied once, into
    // the frame, and never cloned into a `Value` first.
    let payload_len = msg.payload.as_ref().map_or(0, Vec::len);
    let mut buf = Vec::with_capacity(32 + meta.len() + payload_len);
    let write = |buf: &mut Vec<u8>| -> Result<(), rmp::encode::ValueWriteError> {
        rmp::encode::write_map_len(buf, 2)?;
        rmp::encode::write_str(buf, "meta")?;
        rmp::encode::write_bin(buf, &meta)?;
        rmp::encode::write_str(buf, "body")?;
        match &msg.payload {
            Some(p) => rmp::encode::write_bin(buf, p)?,
            None => rmp::encode::write_nil(buf)
                .map_err(rmp::encode::ValueWriteError::InvalidMarkerWrite)?,
        }
        Ok(())
    };
    write(&mut buf).expect("writing msgpack into a Vec cannot fail");
    buf
}

/// The body frame of a FUNCTION carrying `call`, written straight into the frame (the call's
/// payload is not encoded apart first and copied in): `{meta: b"", body: bin(payload)}` as
/// [`encode_body`] writes it, but for the payload's `bin 32` header, which any msgpack reader
/// takes whatever the length (a file's chunk is megabytes: one copy fewer).
pub fn encode_function_body(call: &Call) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    rmp::encode::write_map_len(&mut buf, 2).expect("writing into a Vec cannot fail");
    rmp::encode::write_str(&mut buf, "meta").expect("writing into a Vec cannot fail");
    rmp::encode::write_bin(&mut buf, &[]).expect("writing into a Vec cannot fail");
    rmp::encode::write_str(&mut buf, "body").expect("writing into a Vec cannot fail");
    buf.push(0xc6);
    let at = buf.len();
    buf.extend_from_slice(&[0; 4]);
    call.encode_into(&mut buf);
    let len = u32::try_from(buf.len() - at - 4).expect("a call payload under 4 GiB");
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
    buf
}

/// Decodes header and body frames into a message.
pub fn decode_message(header: &[u8], body: &[u8]) -> Result<Message, CodecError> {
    let header = decode_header(header)?;
    decode_body(&header, body)
}

/// Encodes a message into its `(header, body)` frames.
pub fn encode_message(msg: &Message) -> (Vec<u8>, Vec<u8>) {
    (encode_header(&msg.header), encode_body(msg))
}

impl Message {
    /// A FUNCTION call of `method` carrying an already-encoded payload.
    pub fn function(method: &str, okey: OrderKey, seq: u32, payload: Vec<u8>) -> Self {
        let header = Header {
            msg_type: MsgType::Function,
            method: method.to_owned(),
            okey,
            seq,
            zip: false,
        };
        Message {
            header,
            error: None,
            payload: Some(payload),
        }
    }

    /// A reply to `request` of type `msg_type` (same `meth`, `okey` and `seq`).
    fn reply(
        request: &Header,
        msg_type: MsgType,
        error: Option<ErrorMeta>,
        payload: Option<Vec<u8>>,
    ) -> Self {
        let header = Header {
            msg_type,
            zip: false,
            ..request.clone()
        };
        Message {
            header,
            error,
            payload,
        }
    }

    /// RESULT for `request` with an encoded payload.
    pub fn result(request: &Header, payload: Vec<u8>) -> Self {
        Self::reply(request, MsgType::Result, None, Some(payload))
    }

    /// FAILURE for `request`: the handler failed with a user-level error.
    pub fn failure(request: &Header, error: ErrorMeta) -> Self {
        Self::reply(request, MsgType::Failure, Some(error), None)
    }

    /// ERROR for `request`: the RPC layer failed.
    pub fn error(request: &Header, error: ErrorMeta) -> Self {
        Self::reply(request, MsgType::Error, Some(error), None)
    }

    /// CANCEL for `request` (client side).
    pub fn cancel(request: &Header) -> Self {
        Self::reply(request, MsgType::Cancel, None, None)
    }

    /// CANCELLED for `request` (server side).
    pub fn cancelled(request: &Header) -> Self {
        Self::reply(request, MsgType::Cancelled, None, None)
    }
}

/// The application payload of a FUNCTION: `{"args": [...], "kwargs": {...}}`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Call {
    /// Positional arguments.
    pub args: Vec<Value>,
    /// Keyword arguments; keys are strings.
    pub kwargs: Vec<(String, Value)>,
    /// The ZAP user id of the connection the call arrived on (libzmq's `User-Id` message
    /// property): with CURVE, the name the server admitted the caller's key under (on the
    /// manager's intake, the agent id from `<agent-id>.key`). `None` without CURVE, and on calls
    /// built locally rather than received; never encoded on the wire.
    pub peer_user_id: Option<String>,
}

/// msgpack extension type Backend.AI registers for UUIDs (16 raw bytes).
pub const EXT_UUID: i8 = 1;

/// Why [`Call::decode_payload`] failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// The payload is not `{"args": [...], "kwargs": {...}}`.
    #[error("{0}")]
    Shape(String),
    /// An extension value was refused ([`bai_ext::ExtError`]).
    #[error(transparent)]
    Ext(#[from] bai_ext::ExtError),
}

impl PayloadError {
    /// The error as an ERROR reply's metadata: `name` is the extension error's name
    /// (`UnsupportedExtType`, `PickleRefused`, `InvalidExtValue`) or `BadCallPayload`.
    pub fn to_meta(&self) -> ErrorMeta {
        let name = match self {
            PayloadError::Shape(_) => "BadCallPayload",
            PayloadError::Ext(e) => e.name(),
        };
        ErrorMeta {
            name: name.into(),
            repr: self.to_string(),
            traceback: String::new(),
        }
    }
}

impl Call {
    /// Decodes a FUNCTION payload.
    ///
    /// Backend.AI's extension values become plain values ([`bai_ext::normalize`]: UUIDs as
    /// their canonical strings, datetimes as RFC 3339, Decimals as text, enums as their values,
    /// ...), since our methods take plain msgpack. Errors: not a map, `args` not an array,
    /// `kwargs` not a map with string keys, or an extension value that is refused (the message
    /// starts with the [`bai_ext::ExtError`] name, e.g. `PickleRefused: ...`).
    pub fn decode(payload: &[u8]) -> Result<Call, String> {
        Self::decode_payload(payload).map_err(|e| e.to_string())
    }

    /// [`Call::decode`] with a typed error ([`PayloadError::to_meta`] gives the reply's metadata).
    pub fn decode_payload(payload: &[u8]) -> Result<Call, PayloadError> {
        let shape = PayloadError::Shape;
        let Value::Map(mut map) = read_value(payload).map_err(shape)? else {
            return Err(shape("payload is not a map of args and kwargs".into()));
        };
        // Moved out of the map, not copied (an argument may be megabytes of a file).
        let args = match map
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some("args"))
            .map(|(_, v)| std::mem::replace(v, Value::Nil))
        {
            Some(Value::Array(a)) => a,
            Some(Value::Nil) | None => Vec::new(),
            Some(other) => return Err(shape(format!("`args` is not an array: {other}"))),
        };
        let kwargs = match map_get(&map, "kwargs") {
            Some(Value::Map(m)) => m
                .iter()
                .map(|(k, v)| {
                    k.as_str()
                        .map(|k| (k.to_owned(), v.clone()))
                        .ok_or_else(|| shape(format!("kwarg key {k} is not a str")))
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(Value::Nil) | None => Vec::new(),
            Some(other) => return Err(shape(format!("`kwargs` is not a map: {other}"))),
        };
        let mut call = Call {
            args,
            kwargs,
            peer_user_id: None,
        };
        for v in call
            .args
            .iter_mut()
            .chain(call.kwargs.iter_mut().map(|(_, v)| v))
        {
            bai_ext::normalize(v)?;
        }
        Ok(call)
    }

    /// Encodes a FUNCTION payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(64);
        self.encode_into(&mut buf);
        buf
    }

    /// Appends the FUNCTION payload to `buf`.
    pub fn encode_into(&self, buf: &mut Vec<u8>) {
        // Written field by field from the borrowed arguments: a large one (a file's chunk) is
        // copied once, into the payload, and never cloned into a `Value` first.
        let write = |buf: &mut Vec<u8>| -> Result<(), rmpv::encode::Error> {
            rmp::encode::write_map_len(buf, 2)?;
            rmp::encode::write_str(buf, "args")?;
            rmp::encode::write_array_len(buf, self.args.len() as u32)?;
            for v in &self.args {
                rmpv::encode::write_value(buf, v)?;
            }
            rmp::encode::write_str(buf, "kwargs")?;
            rmp::encode::write_map_len(buf, self.kwargs.len() as u32)?;
            for (k, v) in &self.kwargs {
                rmp::encode::write_str(buf, k)?;
                rmpv::encode::write_value(buf, v)?;
            }
            Ok(())
        };
        write(buf).expect("writing msgpack into a Vec cannot fail");
    }

    /// The positional argument at `i`, or the keyword argument `name`.
    pub fn arg(&self, i: usize, name: &str) -> Option<&Value> {
        self.args.get(i).or_else(|| self.kwarg(name))
    }

    /// The keyword argument `name`.
    pub fn kwarg(&self, name: &str) -> Option<&Value> {
        self.kwargs.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// Moves argument `i` named `name` (positional or keyword) out of the call, leaving nil (a
    /// large binary argument is not copied).
    pub fn take_arg(&mut self, i: usize, name: &str) -> Option<Value> {
        match self.args.get_mut(i) {
            Some(v) => Some(std::mem::replace(v, Value::Nil)),
            None => self.take_kwarg(name),
        }
    }

    /// Removes and returns the keyword argument `name`.
    pub fn take_kwarg(&mut self, name: &str) -> Option<Value> {
        let i = self.kwargs.iter().position(|(k, _)| k == name)?;
        Some(self.kwargs.remove(i).1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(t: MsgType, okey: OrderKey) -> Header {
        Header {
            msg_type: t,
            method: "ping".into(),
            okey,
            seq: 7,
            zip: false,
        }
    }

    #[test]
    fn header_roundtrip_keeps_okey_type() {
        for okey in [
            OrderKey::Bin(vec![]),
            OrderKey::Str(String::new()),
            OrderKey::Str("k".into()),
        ] {
            let h = header(MsgType::Function, okey.clone());
            let back = decode_header(&encode_header(&h)).unwrap();
            assert_eq!(back, h);
            let reply = Message::result(&back, to_msgpack(&Value::Nil));
            assert_eq!(
                reply.header.okey, okey,
                "reply must echo okey with its msgpack type"
            );
        }
    }

    #[test]
    fn a_function_body_written_in_place_decodes_as_encode_body_writes_it() {
        let call = Call {
            args: vec![Value::from("k"), Value::Binary(vec![7; 70_000])],
            kwargs: vec![("opts".into(), Value::Map(vec![]))],
            peer_user_id: None,
        };
        let h = header(MsgType::Function, OrderKey::Bin(vec![]));
        let written = decode_body(&h, &encode_function_body(&call)).unwrap();
        let usual = decode_body(
            &h,
            &encode_body(&Message::function(
                "ping",
                OrderKey::Bin(vec![]),
                7,
                call.encode(),
            )),
        )
        .unwrap();
        assert_eq!(written, usual);
        assert_eq!(
            Call::decode_payload(&written.payload.unwrap()).unwrap(),
            call
        );
    }

    #[test]
    fn header_matches_python_msgpack_bytes() {
        // msgpack.packb({"type": 1, "meth": "ping", "okey": b"", "seq": 0, "zip": False}, use_bin_type=True)
        let py = b"\x85\xa4type\x01\xa4meth\xa4ping\xa4okey\xc4\x00\xa3seq\x00\xa3zip\xc2";
        let h = decode_header(py).unwrap();
        assert_eq!(
            h,
            Header {
                msg_type: MsgType::Function,
                method: "ping".into(),
                okey: OrderKey::Bin(vec![]),
                seq: 0,
                zip: false
            }
        );
        assert_eq!(encode_header(&h), py.to_vec());
    }

    #[test]
    fn all_seven_types_roundtrip() {
        let err = ErrorMeta {
            name: "KeyError".into(),
            repr: "KeyError('x')".into(),
            traceback: "tb".into(),
        };
        for t in 0..=6u64 {
            let t = MsgType::from_wire(t).unwrap();
            let h = header(t, OrderKey::default());
            let msg = Message {
                header: h.clone(),
                error: t.has_error_meta().then(|| err.clone()),
                payload: t.has_payload().then(|| to_msgpack(&Value::from("x"))),
            };
            let (hb, bb) = encode_message(&msg);
            assert_eq!(decode_message(&hb, &bb).unwrap(), msg, "{t:?}");
        }
        assert_eq!(MsgType::from_wire(7), None);
    }

    #[test]
    fn body_meta_bytes_follow_callosum() {
        let h = header(MsgType::Result, OrderKey::default());
        let body = encode_body(&Message::result(&h, vec![0xc0]));
        // {"meta": b"\x90", "body": b"\xc0"}
        assert_eq!(
            body,
            b"\x82\xa4meta\xc4\x01\x90\xa4body\xc4\x01\xc0".to_vec()
        );
        let f = Message::function("ping", OrderKey::default(), 0, vec![0x80]);
        assert_eq!(
            encode_body(&f),
            b"\x82\xa4meta\xc4\x00\xa4body\xc4\x01\x80".to_vec()
        );
    }

    #[test]
    fn failure_meta_is_three_strings() {
        let h = header(MsgType::Function, OrderKey::default());
        let e = ErrorMeta {
            name: "KernelNotFound".into(),
            repr: "no such kernel".into(),
            traceback: String::new(),
        };
        let (hb, bb) = encode_message(&Message::failure(&h, e.clone()));
        let m = decode_message(&hb, &bb).unwrap();
        assert_eq!(m.header.msg_type, MsgType::Failure);
        assert_eq!(m.error, Some(e));
        assert_eq!(m.payload, None);
    }

    #[test]
    fn zipped_body_is_accepted() {
        let mut h = header(MsgType::Function, OrderKey::default());
        let plain = encode_body(&Message::function(
            "ping",
            OrderKey::default(),
            7,
            Call::default().encode(),
        ));
        let zipped = snap::raw::Encoder::new().compress_vec(&plain).unwrap();
        h.zip = true;
        let m = decode_body(&h, &zipped).unwrap();
        assert_eq!(
            Call::decode(m.payload.as_deref().unwrap()).unwrap(),
            Call::default()
        );
        assert!(matches!(
            decode_body(&h, b"garbage"),
            Err(CodecError::Body(_))
        ));
    }

    #[test]
    fn classify_frames() {
        assert_eq!(
            classify(&[b"PING", b"", b""]).unwrap(),
            Frames::Ping(b"", b"")
        );
        assert_eq!(
            classify(&[b"UPPER", b"h", b"b"]).unwrap(),
            Frames::Upper(b"h", b"b")
        );
        assert!(classify(&[b"UPPER", b"h"]).is_err());
        assert!(classify(&[b"JUNK", b"h", b"b"]).is_err());
        assert!(classify(&[]).is_err());
    }

    #[test]
    fn call_payload_and_uuid_ext() {
        let mut uuid = vec![0u8; 16];
        uuid[15] = 1;
        let payload = to_msgpack(&Value::Map(vec![
            (
                Value::from("args"),
                Value::Array(vec![Value::Ext(EXT_UUID, uuid), Value::from(3)]),
            ),
            (
                Value::from("kwargs"),
                Value::Map(vec![(Value::from("agent_id"), Value::from("a1"))]),
            ),
        ]));
        let mut call = Call::decode(&payload).unwrap();
        assert_eq!(
            call.args[0].as_str(),
            Some("00000000-0000-0000-0000-000000000001")
        );
        assert_eq!(call.take_kwarg("agent_id").unwrap().as_str(), Some("a1"));
        let pickled = to_msgpack(&Value::Map(vec![(
            Value::from("args"),
            Value::Array(vec![Value::Ext(42, vec![1])]),
        )]));
        assert_eq!(
            Call::decode(&pickled).unwrap_err(),
            "UnsupportedExtType: unsupported msgpack extension type 42"
        );
        let meta = Call::decode_payload(&pickled).unwrap_err().to_meta();
        assert_eq!(meta.name, "UnsupportedExtType");
        assert_eq!(
            Call::decode_payload(b"\x01").unwrap_err().to_meta().name,
            "BadCallPayload"
        );
    }

    #[test]
    fn call_payload_from_backend_ai_packb() {
        // ai.backend.common.msgpack.packb({"args": [UUID, KernelLifecycleEventReason], "kwargs":
        // {"suppress_events": False, "size": BinarySize(256 MiB)}}) (scripts/bai-fixtures.py).
        let payload = include_bytes!("../../tests/fixtures/bai/call_payload.msgpack");
        let call = Call::decode(payload).unwrap();
        assert_eq!(
            call.args,
            vec![
                Value::from("00000000-0000-0000-0000-00000000000a"),
                Value::from("user-requested")
            ]
        );
        assert_eq!(call.kwarg("size"), Some(&Value::from(268_435_456)));
        // A pickle that names os.system is refused by name, as an error the server replies with.
        let hostile = include_bytes!("../../tests/fixtures/bai/hostile_os_system.msgpack");
        let mut cursor = &hostile[..];
        let ext = rmpv::decode::read_value(&mut cursor).unwrap();
        let payload = to_msgpack(&Value::Map(vec![(
            Value::from("args"),
            Value::Array(vec![ext]),
        )]));
        let meta = Call::decode_payload(&payload).unwrap_err().to_meta();
        assert_eq!(meta.name, "PickleRefused");
        assert!(meta.repr.contains("posix.system"), "{}", meta.repr);
    }

    #[test]
    fn bad_headers_are_clear_errors() {
        assert!(decode_header(b"").is_err());
        assert!(decode_header(&to_msgpack(&Value::from(1))).is_err());
        let bad_type = to_msgpack(&Value::Map(vec![
            (Value::from("type"), Value::from(9)),
            (Value::from("meth"), Value::from("x")),
            (Value::from("okey"), Value::from("")),
            (Value::from("seq"), Value::from(0)),
        ]));
        assert_eq!(
            decode_header(&bad_type).unwrap_err(),
            CodecError::Header("unknown type 9".into())
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn arbitrary_bytes_never_panic(h in proptest::collection::vec(any::<u8>(), 0..256),
                                       b in proptest::collection::vec(any::<u8>(), 0..256),
                                       zip in any::<bool>()) {
            let _ = decode_message(&h, &b);
            let _ = Call::decode(&b);
            let _ = classify(&[&h[..], &b[..], &h[..]]);
            let hdr = Header { msg_type: MsgType::Function, method: "m".into(), okey: OrderKey::default(), seq: 0, zip };
            let _ = decode_body(&hdr, &b);
        }

        #[test]
        fn encoded_messages_roundtrip(method in "[a-z_]{1,20}", seq in any::<u32>(), key in proptest::option::of("[a-z]{0,8}"),
                                      payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let okey = key.map(OrderKey::Str).unwrap_or_default();
            let msg = Message::function(&method, okey, seq, payload);
            let (h, b) = encode_message(&msg);
            prop_assert_eq!(decode_message(&h, &b).unwrap(), msg);
        }
    }
}
