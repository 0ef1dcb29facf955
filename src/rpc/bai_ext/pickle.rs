//! A restricted pickle *reader*: a small stack machine that turns the protocol-5 pickles
//! Backend.AI's `ai.backend.common.msgpack.packb` puts in its extension types into a tree of
//! plain data. It never imports, calls or constructs anything: a class reference is only a
//! checked name, and `REDUCE`/`NEWOBJ`/`BUILD` only record "this class, these arguments, this
//! state" for the typed layer ([`super::shapes`]) to read.
//!
//! What it accepts is exactly what `pickle.dumps(obj, protocol=5)` (CPython 3.13) writes for
//! `Decimal`, the `ai.backend` `StrEnum`s, `ImageRef`, `ResourceSlot`, `SlotName` and
//! `BinarySize` (see `tests/fixtures/bai/`), plus the text `GLOBAL` opcode so that a classic
//! hostile pickle is refused *by its class name*:
//!
//! | opcodes | |
//! |---|---|
//! | framing | `PROTO` (≤ 5), `FRAME`, `STOP` |
//! | scalars | `NONE`, `NEWTRUE`, `NEWFALSE`, `BININT`, `BININT1`, `BININT2`, `LONG1` (≤ 16 bytes) |
//! | text | `SHORT_BINUNICODE`, `BINUNICODE`, `BINUNICODE8` (UTF-8) |
//! | containers | `MARK`, `EMPTY_TUPLE`, `TUPLE1`, `TUPLE2`, `TUPLE3`, `TUPLE`, `EMPTY_DICT`, `SETITEM`, `SETITEMS` |
//! | memo | `MEMOIZE`, `BINPUT`, `LONG_BINPUT`, `BINGET`, `LONG_BINGET` |
//! | objects | `STACK_GLOBAL`, `GLOBAL` (allow-listed classes only), `REDUCE`, `NEWOBJ`, `BUILD` |
//!
//! Anything else (lists, bytes, floats, `NEWOBJ_EX`, `INST`/`OBJ`, persistent ids, extension
//! registry codes, out-of-band buffers, …) is refused with [`PickleError::Opcode`]; a class
//! outside the caller's allow-list with [`PickleError::Class`], naming it as `module.name`.
//!
//! Bounds: the input is at most [`MAX_PICKLE_BYTES`]; every length is checked against the
//! bytes that remain before anything is allocated; the stack holds at most [`MAX_STACK`]
//! items, the memo [`MAX_MEMO`] entries, and no object nests deeper than [`MAX_DEPTH`]. Every
//! opcode does O(1) work apart from popping what it consumes, so time is linear in the input.

use std::collections::HashMap;
use std::fmt;

/// Largest pickle accepted, in bytes. Real ones are 40–300 bytes (a `ResourceSlot` grows by
/// ~40 bytes per slot).
pub const MAX_PICKLE_BYTES: usize = 64 * 1024;
/// Most items (values and marks) the stack may hold at once.
pub const MAX_STACK: usize = 1024;
/// Most memo entries.
pub const MAX_MEMO: usize = 8192;
/// Deepest nesting of tuples, dicts and objects (real pickles nest at most 5 deep).
pub const MAX_DEPTH: u32 = 32;
/// Largest `LONG1` integer, in bytes (two's complement, so ±2^127).
const MAX_LONG_BYTES: usize = 16;

/// A Python class (or other global) a pickle may name: `module` and qualified `name`, compared
/// exactly (no prefix matching, no attribute walking).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PyClass {
    /// Module, e.g. `ai.backend.common.types`.
    pub module: &'static str,
    /// Qualified name in that module, e.g. `SessionTypes`.
    pub name: &'static str,
}

impl fmt::Display for PyClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.module, self.name)
    }
}

/// Why a pickle was refused. Every variant says where (byte offset) or what.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PickleError {
    /// A `GLOBAL`/`STACK_GLOBAL` named a class outside the allow-list (`module.name`).
    #[error("class `{class}` is not allowed")]
    Class {
        /// The refused global as `module.name`.
        class: String,
    },
    /// An opcode this reader does not implement (it is never needed for the allowed types).
    #[error("opcode 0x{opcode:02x} ({}) at byte {at} is not allowed", opcode_name(*.opcode))]
    Opcode {
        /// The opcode byte.
        opcode: u8,
        /// Its offset in the pickle.
        at: usize,
    },
    /// The pickle is not well formed: truncated, unbalanced, a bad memo reference, a wrong
    /// operand type, trailing bytes after `STOP`, …
    #[error("malformed pickle at byte {at}: {reason}")]
    Malformed {
        /// Offset of the opcode that failed.
        at: usize,
        /// What was wrong.
        reason: String,
    },
    /// A size limit was exceeded (input length, stack, memo, nesting).
    #[error("pickle exceeds the {what} limit of {limit}")]
    Limit {
        /// Which limit.
        what: &'static str,
        /// Its value.
        limit: usize,
    },
    /// The pickle is well formed but is not the shape the extension type expects.
    #[error("{0}")]
    Shape(String),
}

/// Index of an object in a [`Pickled`]'s arena.
pub type Ref = usize;

/// One unpickled object. Containers hold [`Ref`]s, so memo sharing (and mutation of a shared
/// dict by `SETITEM`) behaves as in Python without reference counting.
#[derive(Clone, Debug, PartialEq)]
pub enum Obj {
    /// `None`.
    None,
    /// `True`/`False`.
    Bool(bool),
    /// An int that fits in i128.
    Int(i128),
    /// A str.
    Str(String),
    /// A tuple.
    Tuple(Vec<Ref>),
    /// A dict as `(key, value)` pairs in insertion order; a repeated key keeps every pair
    /// (readers take the last one, as Python's dict would).
    Dict(Vec<(Ref, Ref)>),
    /// An allow-listed class, not yet applied.
    Class(PyClass),
    /// `class(*args)` recorded by `REDUCE` (`new_obj = false`) or `class.__new__(class, *args)`
    /// by `NEWOBJ` (`new_obj = true`), with the state a later `BUILD` gave it.
    Instance {
        /// The class.
        class: PyClass,
        /// The argument tuple.
        args: Ref,
        /// Whether it came from `NEWOBJ` (else `REDUCE`).
        new_obj: bool,
        /// The `BUILD` state, if any.
        state: Option<Ref>,
    },
}

/// The result of [`load`]: an arena of objects and the root `STOP` returned.
#[derive(Debug)]
pub struct Pickled {
    objs: Vec<Obj>,
    depth: Vec<u32>,
    /// The object the pickle evaluates to.
    pub root: Ref,
}

impl Pickled {
    /// Nesting depth of the object at `r` as built (1 for a scalar).
    pub fn depth(&self, r: Ref) -> u32 {
        self.depth[r]
    }

    /// The object at `r` (a `Ref` from this arena).
    pub fn get(&self, r: Ref) -> &Obj {
        &self.objs[r]
    }

    /// The str at `r`, if it is one.
    pub fn str_at(&self, r: Ref) -> Option<&str> {
        match self.get(r) {
            Obj::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value under str key `key` of the dict at `dict` (last occurrence wins).
    pub fn dict_get(&self, dict: Ref, key: &str) -> Option<Ref> {
        match self.get(dict) {
            Obj::Dict(pairs) => pairs
                .iter()
                .rev()
                .find(|(k, _)| self.str_at(*k) == Some(key))
                .map(|(_, v)| *v),
            _ => None,
        }
    }
}

#[derive(Clone, Copy)]
enum Item {
    Mark,
    Obj(Ref),
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    at: usize,
    allowed: &'a [PyClass],
    objs: Vec<Obj>,
    depth: Vec<u32>,
    stack: Vec<Item>,
    memo: HashMap<u32, Ref>,
}

/// Reads a pickle, admitting only the globals in `allowed`.
///
/// Errors: see [`PickleError`]; never panics, for any input.
pub fn load(data: &[u8], allowed: &[PyClass]) -> Result<Pickled, PickleError> {
    if data.len() > MAX_PICKLE_BYTES {
        return Err(PickleError::Limit {
            what: "input bytes",
            limit: MAX_PICKLE_BYTES,
        });
    }
    let mut m = Machine {
        data,
        pos: 0,
        at: 0,
        allowed,
        objs: Vec::new(),
        depth: Vec::new(),
        stack: Vec::new(),
        memo: HashMap::new(),
    };
    let root = m.run()?;
    Ok(Pickled {
        objs: m.objs,
        depth: m.depth,
        root,
    })
}

// Opcode bytes (CPython `Lib/pickle.py`).
const MARK: u8 = b'(';
const STOP: u8 = b'.';
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const NONE: u8 = b'N';
const REDUCE: u8 = b'R';
const BINUNICODE: u8 = b'X';
const EMPTY_DICT: u8 = b'}';
const BUILD: u8 = b'b';
const GLOBAL: u8 = b'c';
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';
const BINPUT: u8 = b'q';
const LONG_BINPUT: u8 = b'r';
const SETITEM: u8 = b's';
const TUPLE: u8 = b't';
const SETITEMS: u8 = b'u';
const EMPTY_TUPLE: u8 = b')';
const PROTO: u8 = 0x80;
const NEWOBJ: u8 = 0x81;
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const LONG1: u8 = 0x8a;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE8: u8 = 0x8d;
const STACK_GLOBAL: u8 = 0x93;
const MEMOIZE: u8 = 0x94;
const FRAME: u8 = 0x95;

/// CPython's name for an opcode byte (for error messages); `?` when it is not one.
pub fn opcode_name(op: u8) -> &'static str {
    match op {
        b'(' => "MARK",
        b'.' => "STOP",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'F' => "FLOAT",
        b'I' => "INT",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'L' => "LONG",
        b'M' => "BININT2",
        b'N' => "NONE",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        b'R' => "REDUCE",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'X' => "BINUNICODE",
        b'a' => "APPEND",
        b'b' => "BUILD",
        b'c' => "GLOBAL",
        b'd' => "DICT",
        b'}' => "EMPTY_DICT",
        b'e' => "APPENDS",
        b'g' => "GET",
        b'h' => "BINGET",
        b'i' => "INST",
        b'j' => "LONG_BINGET",
        b'l' => "LIST",
        b']' => "EMPTY_LIST",
        b'o' => "OBJ",
        b'p' => "PUT",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        b's' => "SETITEM",
        b't' => "TUPLE",
        b')' => "EMPTY_TUPLE",
        b'u' => "SETITEMS",
        b'G' => "BINFLOAT",
        0x80 => "PROTO",
        0x81 => "NEWOBJ",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        0x8a => "LONG1",
        0x8b => "LONG4",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x8c => "SHORT_BINUNICODE",
        0x8d => "BINUNICODE8",
        0x8e => "BINBYTES8",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x92 => "NEWOBJ_EX",
        0x93 => "STACK_GLOBAL",
        0x94 => "MEMOIZE",
        0x95 => "FRAME",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "?",
    }
}

impl Machine<'_> {
    fn bad<T>(&self, reason: impl Into<String>) -> Result<T, PickleError> {
        Err(PickleError::Malformed {
            at: self.at,
            reason: reason.into(),
        })
    }

    fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        let rest = self.data.len() - self.pos;
        if n > rest {
            return Err(PickleError::Malformed {
                at: self.at,
                reason: format!("needs {n} bytes, {rest} left"),
            });
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A length operand, checked against the bytes that remain before any allocation.
    fn len_operand(&mut self, n: u64) -> Result<usize, PickleError> {
        let rest = (self.data.len() - self.pos) as u64;
        if n > rest {
            return self.bad(format!("length {n} exceeds the {rest} bytes left"));
        }
        Ok(n as usize)
    }

    fn new_obj(&mut self, obj: Obj, depth: u32) -> Result<Ref, PickleError> {
        if depth > MAX_DEPTH {
            return Err(PickleError::Limit {
                what: "nesting depth",
                limit: MAX_DEPTH as usize,
            });
        }
        self.objs.push(obj);
        self.depth.push(depth);
        Ok(self.objs.len() - 1)
    }

    fn push_item(&mut self, item: Item) -> Result<(), PickleError> {
        if self.stack.len() >= MAX_STACK {
            return Err(PickleError::Limit {
                what: "stack",
                limit: MAX_STACK,
            });
        }
        self.stack.push(item);
        Ok(())
    }

    fn push(&mut self, obj: Obj) -> Result<(), PickleError> {
        let r = self.new_obj(obj, 1)?;
        self.push_item(Item::Obj(r))
    }

    fn pop(&mut self) -> Result<Ref, PickleError> {
        match self.stack.pop() {
            Some(Item::Obj(r)) => Ok(r),
            Some(Item::Mark) => self.bad("expected a value, found a MARK"),
            None => self.bad("stack underflow"),
        }
    }

    fn top(&self) -> Result<Ref, PickleError> {
        match self.stack.last() {
            Some(Item::Obj(r)) => Ok(*r),
            Some(Item::Mark) => self.bad("expected a value, found a MARK"),
            None => self.bad("stack underflow"),
        }
    }

    /// Pops everything above the topmost MARK, and the MARK.
    fn pop_mark(&mut self) -> Result<Vec<Ref>, PickleError> {
        let Some(i) = self.stack.iter().rposition(|x| matches!(x, Item::Mark)) else {
            return self.bad("no MARK on the stack");
        };
        // Above the topmost MARK there are only values.
        let items = self
            .stack
            .drain(i + 1..)
            .filter_map(|x| match x {
                Item::Obj(r) => Some(r),
                Item::Mark => None,
            })
            .collect();
        self.stack.pop();
        Ok(items)
    }

    fn max_depth(&self, refs: &[Ref]) -> u32 {
        refs.iter().map(|r| self.depth[*r]).max().unwrap_or(0)
    }

    fn tuple(&mut self, items: Vec<Ref>) -> Result<(), PickleError> {
        let d = self.max_depth(&items) + 1;
        let r = self.new_obj(Obj::Tuple(items), d)?;
        self.push_item(Item::Obj(r))
    }

    fn text(&mut self, n: usize) -> Result<(), PickleError> {
        let bytes = self.take(n)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                let s = s.to_owned();
                self.push(Obj::Str(s))
            }
            Err(e) => self.bad(format!("str is not UTF-8: {e}")),
        }
    }

    fn global(&mut self, module: &str, name: &str) -> Result<(), PickleError> {
        match self
            .allowed
            .iter()
            .find(|c| c.module == module && c.name == name)
        {
            Some(c) => self.push(Obj::Class(*c)),
            None => Err(PickleError::Class {
                class: format!("{module}.{name}"),
            }),
        }
    }

    /// One `\n`-terminated UTF-8 line of a text `GLOBAL` operand (at most 256 bytes).
    fn line(&mut self) -> Result<String, PickleError> {
        let rest = &self.data[self.pos..];
        let Some(n) = rest.iter().take(257).position(|b| *b == b'\n') else {
            return self.bad("GLOBAL operand without a newline within 256 bytes");
        };
        let line = std::str::from_utf8(&rest[..n]).map(str::to_owned);
        self.pos += n + 1;
        line.or_else(|e| self.bad(format!("GLOBAL operand is not UTF-8: {e}")))
    }

    fn memo_put(&mut self, key: u32) -> Result<(), PickleError> {
        let r = self.top()?;
        if self.memo.len() >= MAX_MEMO && !self.memo.contains_key(&key) {
            return Err(PickleError::Limit {
                what: "memo",
                limit: MAX_MEMO,
            });
        }
        self.memo.insert(key, r);
        Ok(())
    }

    fn memo_get(&mut self, key: u32) -> Result<(), PickleError> {
        match self.memo.get(&key) {
            Some(r) => self.push_item(Item::Obj(*r)),
            None => self.bad(format!("memo reference {key} was never stored")),
        }
    }

    fn set_items(&mut self, dict: Ref, kvs: &[Ref]) -> Result<(), PickleError> {
        for k in kvs.iter().step_by(2) {
            if !matches!(
                self.objs[*k],
                Obj::Str(_) | Obj::Int(_) | Obj::Bool(_) | Obj::None
            ) {
                return self.bad("dict key is not a str, int, bool or None");
            }
        }
        let d = self.max_depth(kvs) + 1;
        if d > MAX_DEPTH {
            return Err(PickleError::Limit {
                what: "nesting depth",
                limit: MAX_DEPTH as usize,
            });
        }
        let Obj::Dict(pairs) = &mut self.objs[dict] else {
            return self.bad("SETITEM(S) target is not a dict");
        };
        pairs.extend(kvs.chunks_exact(2).map(|kv| (kv[0], kv[1])));
        self.depth[dict] = self.depth[dict].max(d);
        Ok(())
    }

    fn apply(&mut self, new_obj: bool) -> Result<(), PickleError> {
        let args = self.pop()?;
        let callable = self.pop()?;
        if !matches!(self.objs[args], Obj::Tuple(_)) {
            return self.bad("REDUCE/NEWOBJ arguments are not a tuple");
        }
        let d = self.depth[args] + 1;
        let Obj::Class(class) = self.objs[callable] else {
            return self.bad("REDUCE/NEWOBJ target is not a class");
        };
        let r = self.new_obj(
            Obj::Instance {
                class,
                args,
                new_obj,
                state: None,
            },
            d,
        )?;
        self.push_item(Item::Obj(r))
    }

    fn build(&mut self) -> Result<(), PickleError> {
        let state = self.pop()?;
        let inst = self.top()?;
        let d = self.depth[state] + 1;
        if d > MAX_DEPTH {
            return Err(PickleError::Limit {
                what: "nesting depth",
                limit: MAX_DEPTH as usize,
            });
        }
        match &mut self.objs[inst] {
            Obj::Instance {
                state: s @ None, ..
            } => *s = Some(state),
            Obj::Instance { .. } => return self.bad("BUILD on an object that already has state"),
            _ => return self.bad("BUILD target is not an object"),
        }
        self.depth[inst] = self.depth[inst].max(d);
        Ok(())
    }

    fn run(&mut self) -> Result<Ref, PickleError> {
        loop {
            self.at = self.pos;
            let [op] = self.take_array::<1>().map_err(|_| PickleError::Malformed {
                at: self.at,
                reason: "ended without STOP".into(),
            })?;
            match op {
                PROTO => {
                    let [v] = self.take_array::<1>()?;
                    if v > 5 {
                        return self.bad(format!("unsupported pickle protocol {v}"));
                    }
                }
                FRAME => {
                    let n = u64::from_le_bytes(self.take_array::<8>()?);
                    self.len_operand(n)?;
                }
                STOP => {
                    let root = self.pop()?;
                    if !self.stack.is_empty() {
                        return self.bad(format!(
                            "{} items left on the stack at STOP",
                            self.stack.len()
                        ));
                    }
                    if self.pos != self.data.len() {
                        return self.bad(format!(
                            "{} trailing bytes after STOP",
                            self.data.len() - self.pos
                        ));
                    }
                    return Ok(root);
                }
                MARK => self.push_item(Item::Mark)?,
                NONE => self.push(Obj::None)?,
                NEWTRUE => self.push(Obj::Bool(true))?,
                NEWFALSE => self.push(Obj::Bool(false))?,
                BININT => {
                    let v = i32::from_le_bytes(self.take_array::<4>()?);
                    self.push(Obj::Int(v.into()))?;
                }
                BININT1 => {
                    let [v] = self.take_array::<1>()?;
                    self.push(Obj::Int(v.into()))?;
                }
                BININT2 => {
                    let v = u16::from_le_bytes(self.take_array::<2>()?);
                    self.push(Obj::Int(v.into()))?;
                }
                LONG1 => {
                    let [n] = self.take_array::<1>()?;
                    let n = usize::from(n);
                    if n > MAX_LONG_BYTES {
                        return self.bad(format!("LONG1 of {n} bytes exceeds {MAX_LONG_BYTES}"));
                    }
                    let bytes = self.take(n)?;
                    let mut buf = if bytes.last().is_some_and(|b| b & 0x80 != 0) {
                        [0xffu8; 16]
                    } else {
                        [0u8; 16]
                    };
                    buf[..n].copy_from_slice(bytes);
                    self.push(Obj::Int(i128::from_le_bytes(buf)))?;
                }
                SHORT_BINUNICODE => {
                    let [n] = self.take_array::<1>()?;
                    self.text(n.into())?;
                }
                BINUNICODE => {
                    let n = u32::from_le_bytes(self.take_array::<4>()?);
                    let n = self.len_operand(n.into())?;
                    self.text(n)?;
                }
                BINUNICODE8 => {
                    let n = u64::from_le_bytes(self.take_array::<8>()?);
                    let n = self.len_operand(n)?;
                    self.text(n)?;
                }
                STACK_GLOBAL => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (Obj::Str(module), Obj::Str(name)) = (&self.objs[module], &self.objs[name])
                    else {
                        return self.bad("STACK_GLOBAL operands are not two strs");
                    };
                    let (module, name) = (module.clone(), name.clone());
                    self.global(&module, &name)?;
                }
                GLOBAL => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.global(&module, &name)?;
                }
                MEMOIZE => {
                    let key = u32::try_from(self.memo.len()).unwrap_or(u32::MAX);
                    self.memo_put(key)?;
                }
                BINPUT => {
                    let [k] = self.take_array::<1>()?;
                    self.memo_put(k.into())?;
                }
                LONG_BINPUT => {
                    let k = u32::from_le_bytes(self.take_array::<4>()?);
                    self.memo_put(k)?;
                }
                BINGET => {
                    let [k] = self.take_array::<1>()?;
                    self.memo_get(k.into())?;
                }
                LONG_BINGET => {
                    let k = u32::from_le_bytes(self.take_array::<4>()?);
                    self.memo_get(k)?;
                }
                EMPTY_TUPLE => self.tuple(Vec::new())?,
                TUPLE1 | TUPLE2 | TUPLE3 => {
                    let n = usize::from(op - TUPLE1 + 1);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.tuple(items)?;
                }
                TUPLE => {
                    let items = self.pop_mark()?;
                    self.tuple(items)?;
                }
                EMPTY_DICT => self.push(Obj::Dict(Vec::new()))?,
                SETITEM => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let d = self.top()?;
                    self.set_items(d, &[k, v])?;
                }
                SETITEMS => {
                    let kvs = self.pop_mark()?;
                    if kvs.len() % 2 != 0 {
                        return self.bad("SETITEMS with an odd number of items");
                    }
                    let d = self.top()?;
                    self.set_items(d, &kvs)?;
                }
                REDUCE => self.apply(false)?,
                NEWOBJ => self.apply(true)?,
                BUILD => self.build()?,
                other => {
                    return Err(PickleError::Opcode {
                        opcode: other,
                        at: self.at,
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DECIMAL: PyClass = PyClass {
        module: "decimal",
        name: "Decimal",
    };

    #[test]
    fn reads_a_decimal_pickle() {
        // pickle.dumps(Decimal("1.5"), protocol=5)
        let p = b"\x80\x05\x95!\x00\x00\x00\x00\x00\x00\x00\x8c\x07decimal\x94\x8c\x07Decimal\x94\x93\x94\x8c\x031.5\x94\x85\x94R\x94.";
        let got = load(p, &[DECIMAL]).unwrap();
        let Obj::Instance {
            class,
            args,
            new_obj,
            state,
        } = got.get(got.root)
        else {
            panic!("not an instance: {:?}", got.get(got.root));
        };
        assert_eq!((*class, *new_obj, *state), (DECIMAL, false, None));
        let Obj::Tuple(items) = got.get(*args) else {
            panic!()
        };
        assert_eq!(got.str_at(items[0]), Some("1.5"));
        assert_eq!(got.depth(got.root), 3);
    }

    #[test]
    fn refuses_by_name_and_by_opcode() {
        let e = load(b"cos\nsystem\n(S'id'\ntR.", &[DECIMAL]).unwrap_err();
        assert_eq!(
            e,
            PickleError::Class {
                class: "os.system".into()
            }
        );
        let e = load(b"\x80\x05]\x94.", &[]).unwrap_err();
        assert_eq!(
            e,
            PickleError::Opcode {
                opcode: b']',
                at: 2
            }
        );
        assert!(e.to_string().contains("EMPTY_LIST"), "{e}");
    }

    #[test]
    fn structural_errors() {
        let cases: &[&[u8]] = &[
            b"",                           // no STOP
            b"N",                          // no STOP
            b".",                          // empty stack
            b"NN.",                        // unbalanced
            b"(.",                         // a MARK at STOP
            b"N.x",                        // trailing bytes
            b"h\x00.",                     // bad memo ref
            b"Nu.",                        // SETITEMS without a MARK
            b"N)\x81.",                    // NEWOBJ on a non-class
            b"\x8c\x05ab.",                // truncated str
            b"X\xff\xff\xff\xff.",         // oversized length
            b"\x8c\x01\xff.",              // not UTF-8
            b"\x8a\x11xxxxxxxxxxxxxxxxx.", // LONG1 too long
            b"\x80\x06N.",                 // protocol 6
            b"}NNs.",                      // None key is fine, this one is ok
        ];
        for (i, c) in cases.iter().enumerate() {
            let r = load(c, &[]);
            if i == cases.len() - 1 {
                assert!(r.is_ok(), "{r:?}");
            } else {
                assert!(
                    matches!(r, Err(PickleError::Malformed { .. })),
                    "case {i}: {r:?}"
                );
            }
        }
    }

    #[test]
    fn limits() {
        let deep: Vec<u8> = std::iter::once(b'N')
            .chain(std::iter::repeat_n(0x85, 40))
            .chain(std::iter::once(b'.'))
            .collect();
        assert_eq!(
            load(&deep, &[]).unwrap_err(),
            PickleError::Limit {
                what: "nesting depth",
                limit: MAX_DEPTH as usize
            }
        );
        let wide: Vec<u8> = std::iter::repeat_n(b'N', MAX_STACK + 1)
            .chain(std::iter::once(b'.'))
            .collect();
        assert!(matches!(
            load(&wide, &[]),
            Err(PickleError::Limit { what: "stack", .. })
        ));
        // A dict that contains itself nests one level deeper per SETITEM, and is refused.
        let mut cyc = b"}\x94".to_vec();
        for _ in 0..40 {
            cyc.extend_from_slice(b"Kah\x00s");
        }
        cyc.push(b'.');
        assert!(matches!(
            load(&cyc, &[]),
            Err(PickleError::Limit {
                what: "nesting depth",
                ..
            })
        ));
        assert!(matches!(
            load(&vec![b'N'; MAX_PICKLE_BYTES + 1], &[]),
            Err(PickleError::Limit { .. })
        ));
    }

    #[test]
    fn long1_and_binint_values() {
        let read = |p: &[u8]| {
            let got = load(p, &[]).unwrap();
            got.get(got.root).clone()
        };
        assert_eq!(read(b"\x8a\x00."), Obj::Int(0));
        assert_eq!(read(b"\x8a\x01\xff."), Obj::Int(-1));
        assert_eq!(
            read(b"\x8a\x06\x00\x00\x00\x00\x00\x01."),
            Obj::Int(1 << 40)
        );
        assert_eq!(read(b"J\xff\xff\xff\xff."), Obj::Int(-1));
        assert_eq!(read(b"M\x00\x04."), Obj::Int(1024));
    }
}
