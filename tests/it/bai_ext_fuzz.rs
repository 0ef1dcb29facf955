//! Fuzzing of the Backend.AI extension-type decoder (`kernelvisor::rpc::bai_ext`) on the stable
//! toolchain: a plain test that mutates the real fixtures `ai.backend.common.msgpack.packb`
//! wrote (`tests/fixtures/bai/`) for a bounded number of iterations, and asserts that no input
//! panics and none takes long.
//!
//! Mutations, one to four stacked per input: bit flips, interesting bytes (0, 0x7f, 0x80, 0xff),
//! truncation, random tails, splices of two payloads, inserted pickle opcodes (with and without
//! operands), duplicated or deleted runs, huge length operands, and the payload sent under
//! another extension code. Each input goes through `decode_ext` on its own and through
//! `Call::decode` inside a FUNCTION payload; whole fixture messages are mutated and decoded too.
//!
//! `KV_FUZZ_ITERS` (default 1500000, about 20 s on 2 cores in a debug build) sets the number of
//! inputs, `KV_FUZZ_SEED` the seed (printed, so a failure can be replayed).

use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use kernelvisor::rpc::bai_ext::{decode_ext, normalize, pickle::MAX_PICKLE_BYTES, ExtType};
use kernelvisor::rpc::codec::{self, Call};
use rmpv::Value;

/// Slowest any one input may decode (debug build, a loaded 2-core machine; real inputs take
/// microseconds).
const PER_INPUT_LIMIT: Duration = Duration::from_millis(500);

/// xorshift64*: small, seedable, good enough to drive mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A named fixture's bytes.
type Fixture = (String, Vec<u8>);
/// An extension value: code and payload.
type Ext = (i8, Vec<u8>);

/// Every fixture's msgpack bytes, and every extension value in them.
fn corpus() -> (Vec<Fixture>, Vec<Ext>) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/bai");
    let mut files: Vec<Fixture> = std::fs::read_dir(dir)
        .expect("tests/fixtures/bai")
        .filter_map(|e| {
            let path = e.ok()?.path();
            (path.extension()? == "msgpack").then(|| {
                let name = path.file_stem().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&path).unwrap())
            })
        })
        .collect();
    files.sort();
    let mut exts = Vec::new();
    for (_, bytes) in &files {
        collect_exts(&codec::from_msgpack(bytes).unwrap(), &mut exts);
    }
    assert!(
        files.len() >= 30 && exts.len() >= 30,
        "fixtures missing: {} files, {} ext values",
        files.len(),
        exts.len()
    );
    (files, exts)
}

fn collect_exts(v: &Value, out: &mut Vec<Ext>) {
    match v {
        Value::Ext(t, d) => out.push((*t, d.clone())),
        Value::Array(items) => items.iter().for_each(|x| collect_exts(x, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(k, x)| {
            collect_exts(k, out);
            collect_exts(x, out);
        }),
        _ => {}
    }
}

/// Opcodes the reader implements, with plausible operands, and some it refuses.
const OPCODES: &[&[u8]] = &[
    b"\x80\x05",
    b"\x95\x10\x00\x00\x00\x00\x00\x00\x00",
    b"(",
    b".",
    b"N",
    b"\x88",
    b"\x89",
    b")",
    b"}",
    b"\x85",
    b"\x86",
    b"\x87",
    b"t",
    b"s",
    b"u",
    b"R",
    b"\x81",
    b"b",
    b"\x93",
    b"\x94",
    b"h\x00",
    b"h\x03",
    b"j\x01\x00\x00\x00",
    b"q\x05",
    b"r\x05\x00\x00\x00",
    b"K\x01",
    b"M\x00\x04",
    b"J\xff\xff\xff\xff",
    b"\x8a\x02\x00\x80",
    b"\x8c\x011",
    b"\x8c\x04data",
    b"X\x03\x00\x00\x00abc",
    b"\x8d\x01\x00\x00\x00\x00\x00\x00\x00x",
    b"\x8c\x07decimal\x8c\x07Decimal",
    b"\x8c\x17ai.backend.common.types\x8c\x0cResourceSlot",
    b"cbuiltins\neval\n",
    b"]",
    b"G\x00\x00\x00\x00\x00\x00\x00\x00",
    b"C\x01x",
    b"\x92",
    b"0",
];

fn mutate(rng: &mut Rng, data: &mut Vec<u8>, code: &mut i8, exts: &[Ext]) {
    for _ in 0..1 + rng.below(4) {
        let n = data.len();
        match rng.below(11) {
            0 if n > 0 => {
                let i = rng.below(n);
                data[i] ^= 1 << rng.below(8);
            }
            1 if n > 0 => {
                let i = rng.below(n);
                data[i] = [0, 0x7f, 0x80, 0xff, rng.byte()][rng.below(5)];
            }
            2 => data.truncate(rng.below(n + 1)),
            3 => {
                let extra = rng.below(16);
                data.extend((0..extra).map(|_| rng.byte()));
            }
            4 => {
                // Splice: a prefix of this payload, a suffix of another.
                let other = &exts[rng.below(exts.len())].1;
                let cut = rng.below(n + 1);
                let from = rng.below(other.len() + 1);
                data.truncate(cut);
                data.extend_from_slice(&other[from..]);
            }
            5 | 6 => {
                let op = OPCODES[rng.below(OPCODES.len())];
                let at = rng.below(n + 1);
                data.splice(at..at, op.iter().copied());
            }
            7 if n > 1 => {
                let a = rng.below(n);
                let len = 1 + rng.below((n - a).min(32));
                let run: Vec<u8> = data[a..a + len].to_vec();
                let at = rng.below(n + 1);
                data.splice(at..at, run);
            }
            8 if n > 1 => {
                let a = rng.below(n);
                let len = 1 + rng.below((n - a).min(16));
                data.drain(a..a + len);
            }
            9 if n > 4 => {
                // A huge length operand somewhere.
                let i = rng.below(n - 4);
                data[i..i + 4].copy_from_slice(&[0xff, 0xff, 0xff, 0x7f]);
            }
            10 => {
                *code = if rng.below(8) == 0 {
                    rng.byte() as i8
                } else {
                    ExtType::ALL[rng.below(ExtType::ALL.len())] as i8
                };
            }
            _ => {}
        }
    }
}

/// Runs `f` on `input`, failing the test (with a replayable dump) on a panic or a slow input.
fn check(what: &str, seed: u64, iter: u64, input: &[u8], f: impl FnOnce() -> String) -> String {
    let start = Instant::now();
    let outcome = panic::catch_unwind(AssertUnwindSafe(f));
    let took = start.elapsed();
    let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
    match outcome {
        Ok(kind) => {
            assert!(
                took < PER_INPUT_LIMIT,
                "{what} took {took:?} (seed {seed}, iteration {iter}): {hex}"
            );
            kind
        }
        Err(_) => panic!("{what} panicked (seed {seed}, iteration {iter}) on {hex}"),
    }
}

fn outcome<E: std::fmt::Display>(r: Result<impl Sized, E>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => e.to_string().split(':').next().unwrap_or("").to_owned(),
    }
}

#[test]
fn mutated_fixtures_never_panic_and_decode_quickly() {
    let iters = env_u64("KV_FUZZ_ITERS", 1_500_000);
    let seed = env_u64("KV_FUZZ_SEED", 0x6b76_6261_6965_7874) | 1;
    eprintln!("bai_ext fuzz: {iters} inputs, KV_FUZZ_SEED={seed}");
    let (files, exts) = corpus();
    let mut rng = Rng(seed);
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let start = Instant::now();
    for iter in 0..iters {
        match rng.below(10) {
            // Whole messages: msgpack framing and extension payloads both mutated.
            0 => {
                let mut bytes = files[rng.below(files.len())].1.clone();
                let mut code = 0;
                mutate(&mut rng, &mut bytes, &mut code, &exts);
                let kind =
                    check(
                        "normalize(message)",
                        seed,
                        iter,
                        &bytes,
                        || match codec::from_msgpack(&bytes) {
                            Ok(mut v) => outcome(normalize(&mut v)),
                            Err(_) => "not msgpack".into(),
                        },
                    );
                *outcomes.entry(format!("message {kind}")).or_default() += 1;
            }
            // One payload inside a FUNCTION call, as the server decodes it.
            1 => {
                let (mut code, mut data) = exts[rng.below(exts.len())].clone();
                mutate(&mut rng, &mut data, &mut code, &exts);
                let payload = codec::to_msgpack(&Value::Map(vec![
                    (
                        Value::from("args"),
                        Value::Array(vec![Value::Ext(code, data)]),
                    ),
                    (Value::from("kwargs"), Value::Map(vec![])),
                ]));
                let kind = check("Call::decode", seed, iter, &payload, || {
                    outcome(Call::decode(&payload))
                });
                *outcomes.entry(format!("call {kind}")).or_default() += 1;
            }
            _ => {
                let (mut code, mut data) = exts[rng.below(exts.len())].clone();
                mutate(&mut rng, &mut data, &mut code, &exts);
                let kind = check("decode_ext", seed, iter, &data, || {
                    outcome(decode_ext(code, &data))
                });
                *outcomes.entry(format!("ext {kind}")).or_default() += 1;
            }
        }
    }
    eprintln!("bai_ext fuzz: {iters} inputs in {:?}", start.elapsed());
    for (k, n) in &outcomes {
        eprintln!("  {k}: {n}");
    }
    // The mutations must reach every outcome, not just the first check.
    for kind in [
        "ext ok",
        "ext PickleRefused",
        "ext InvalidExtValue",
        "ext UnsupportedExtType",
    ] {
        assert!(
            outcomes.contains_key(kind) || iters < 10_000,
            "no {kind:?} in {outcomes:?}"
        );
    }
}

#[test]
fn largest_inputs_decode_in_bounded_time() {
    // The worst the limits allow: the biggest pickle, full of cheap or stack-heavy opcodes.
    let fill = |unit: &[u8]| -> Vec<u8> {
        let mut v = b"\x80\x05".to_vec();
        while v.len() + unit.len() < MAX_PICKLE_BYTES {
            v.extend_from_slice(unit);
        }
        v
    };
    let cases = [
        fill(b"\x80\x05"),                             // PROTO forever: no STOP
        fill(b"\x95\x00\x00\x00\x00\x00\x00\x00\x00"), // empty FRAMEs
        fill(b"N0"),                                   // a refused opcode early
        fill(b"(N"),                                   // marks and values until the stack limit
        fill(b"}\x94h\x00h\x00s"),                     // a dict set into itself (depth limit)
        fill(b"N\x94"),                                // memo until the memo limit
        fill(b"\x8c\x00h\x00\x86\x94"),                // tuples of memoized tuples
        {
            let mut v = fill(b"\x8c\x04data\x94");
            v.truncate(MAX_PICKLE_BYTES);
            v
        },
        vec![b'N'; MAX_PICKLE_BYTES + 1], // over the input limit
    ];
    for (i, case) in cases.iter().enumerate() {
        for code in [3i8, 6, 7, 8, 9, 16] {
            let start = Instant::now();
            let r = decode_ext(code, case);
            let took = start.elapsed();
            assert!(r.is_err(), "case {i}");
            assert!(took < PER_INPUT_LIMIT * 2, "case {i} took {took:?}: {r:?}");
        }
    }
}
