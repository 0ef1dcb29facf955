//! Tests over the fixtures the real `ai.backend.common.msgpack.packb` wrote
//! (`tests/fixtures/bai/`, `scripts/bai-fixtures.py`), plus property tests: arbitrary bytes
//! never panic, and values pickled/encoded here the way CPython does round-trip.

use std::collections::BTreeSet;

use proptest::prelude::*;
use rmpv::Value;

use super::*;

macro_rules! fixtures {
    ($($name:ident),* $(,)?) => {
        &[$((
            stringify!($name),
            include_bytes!(concat!("../../../tests/fixtures/bai/", stringify!($name), ".msgpack"))
                as &[u8],
        )),*]
    };
}

/// Every `tests/fixtures/bai/*.msgpack` (checked against `expected.json` below).
const FIXTURES: &[(&str, &[u8])] = fixtures![
    auto_directory_path,
    binary_size,
    binary_size_big,
    call_payload,
    datetime_kst,
    datetime_naive,
    datetime_naive_whole,
    datetime_utc,
    decimal_1_5,
    decimal_big,
    decimal_exp,
    decimal_inf,
    decimal_nan,
    decimal_neg_small,
    decimal_tiny,
    enum_autopullbehavior_digest,
    enum_autopullbehavior_none,
    enum_autopullbehavior_tag,
    enum_clustermode_multi_node,
    enum_clustermode_single_node,
    enum_kernel_lifecycle_reason,
    enum_sessiontypes_batch,
    enum_sessiontypes_inference,
    enum_sessiontypes_interactive,
    enum_sessiontypes_system,
    hostile_cross_type,
    hostile_eval,
    hostile_global_text,
    hostile_nested_eval,
    hostile_os_system,
    hostile_other_enum,
    hostile_subclass,
    image_ref_local,
    image_ref_registry,
    posix_path,
    pure_posix_path,
    resource_slot,
    resource_slot_fraction,
    slot_name,
    unknown_ext_42,
    uuid,
    uuid_key,
];

const EXPECTED: &str = include_str!("../../../tests/fixtures/bai/expected.json");

fn expected() -> serde_json::Map<String, serde_json::Value> {
    match serde_json::from_str(EXPECTED).expect("expected.json parses") {
        serde_json::Value::Object(m) => m,
        other => panic!("expected.json is not an object: {other}"),
    }
}

fn read(bytes: &[u8]) -> Value {
    let mut cursor = bytes;
    let v = rmpv::decode::read_value(&mut cursor).expect("fixture is msgpack");
    assert!(cursor.is_empty(), "trailing bytes in a fixture");
    v
}

fn ext_codes(v: &Value, out: &mut BTreeSet<i64>) {
    match v {
        Value::Ext(t, _) => {
            out.insert((*t).into());
        }
        Value::Array(items) => items.iter().for_each(|x| ext_codes(x, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            ext_codes(k, out);
            ext_codes(v, out);
        }),
        _ => {}
    }
}

#[test]
fn every_fixture_is_listed_and_expected() {
    let listed: BTreeSet<&str> = FIXTURES.iter().map(|(n, _)| *n).collect();
    let want = expected();
    let described: BTreeSet<&str> = want.keys().map(String::as_str).collect();
    assert_eq!(listed, described, "FIXTURES and expected.json disagree");
    let on_disk: BTreeSet<String> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/bai"))
            .map(|dir| {
                dir.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter_map(|n| n.strip_suffix(".msgpack").map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
    // Outside this crate's tree (e.g. a scratch build) there is nothing to compare.
    if !on_disk.is_empty() {
        let listed: BTreeSet<String> = listed.iter().map(|s| s.to_string()).collect();
        assert_eq!(listed, on_disk, "a fixture file is missing from FIXTURES");
    }
}

#[test]
fn fixtures_decode_as_expected() {
    let want = expected();
    let mut checked = 0;
    for (name, bytes) in FIXTURES {
        let spec = &want[*name];
        let mut value = read(bytes);
        let mut codes = BTreeSet::new();
        ext_codes(&value, &mut codes);
        let want_codes: BTreeSet<i64> = spec["ext"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_i64().unwrap())
            .collect();
        assert_eq!(codes, want_codes, "{name}: extension codes");
        let got = normalize(&mut value);
        if let Some(v) = spec.get("value") {
            assert_eq!(got, Ok(()), "{name}");
            let json = serde_json::to_value(&value).expect("normalized value is JSON");
            assert_eq!(&json, v, "{name}");
        } else if let Some(class) = spec.get("refused").and_then(|c| c.as_str()) {
            let e = got.expect_err(name);
            assert_eq!(e.name(), "PickleRefused", "{name}: {e}");
            assert_eq!(e.refused_class(), Some(class), "{name}: {e}");
            assert!(e.to_string().contains(class), "{name}: {e}");
        } else {
            let e = got.expect_err(name);
            assert_eq!(Some(e.name()), spec["error"].as_str(), "{name}: {e}");
        }
        checked += 1;
    }
    assert_eq!(checked, FIXTURES.len());
}

#[test]
fn error_messages_name_the_problem() {
    let e = decode_ext(42, b"x").unwrap_err();
    assert_eq!(
        e.to_string(),
        "UnsupportedExtType: unsupported msgpack extension type 42"
    );
    let (_, bytes) = FIXTURES
        .iter()
        .find(|(n, _)| *n == "hostile_os_system")
        .unwrap();
    let e = normalize(&mut read(bytes)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "PickleRefused: ext 6 (ENUM): class `posix.system` is not allowed"
    );
    let e = decode_ext(1, &[0; 15]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "InvalidExtValue: ext 1 (UUID): a UUID is 16 bytes, got 15"
    );
    let e = decode_ext(4, b"\xff").unwrap_err();
    assert_eq!(e.name(), "InvalidExtValue");
    // An allowed class in the wrong place is a shape error, still PickleRefused.
    let e = decode_ext(6, &pickle_decimal("1")).unwrap_err();
    assert_eq!(e.refused_class(), Some("decimal.Decimal"), "{e}");
    let e = decode_ext(3, &pickle_enum("ClusterMode", "single-node")).unwrap_err();
    assert_eq!(
        e.refused_class(),
        Some("ai.backend.common.types.ClusterMode")
    );
    let e = decode_ext(9, &pickle_binary_size(1)).unwrap_err();
    assert_eq!(e.name(), "PickleRefused");
}

#[test]
fn ext_type_table() {
    for t in ExtType::ALL {
        assert_eq!(ExtType::from_code(t as i8), Some(t));
        let pickled = matches!(
            t,
            ExtType::Decimal
                | ExtType::Enum
                | ExtType::ImageRef
                | ExtType::ResourceSlot
                | ExtType::SlotName
                | ExtType::BinarySize
        );
        assert_eq!(!t.allowed_classes().is_empty(), pickled, "{t}");
    }
    for code in [0, 10, 15, 18, -1, i8::MIN, i8::MAX] {
        assert_eq!(ExtType::from_code(code), None);
    }
}

// ---- a tiny pickle writer, emitting what CPython's protocol 5 does for these types ----

fn s(out: &mut Vec<u8>, text: &str) {
    if text.len() < 256 {
        out.push(0x8c);
        out.push(text.len() as u8);
    } else {
        out.push(b'X');
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(text.as_bytes());
    out.push(0x94); // MEMOIZE
}

fn global(out: &mut Vec<u8>, module: &str, name: &str) {
    s(out, module);
    s(out, name);
    out.push(0x93); // STACK_GLOBAL
    out.push(0x94);
}

fn int(out: &mut Vec<u8>, v: i64) {
    if (0..256).contains(&v) {
        out.extend_from_slice(&[b'K', v as u8]);
    } else if (0..65536).contains(&v) {
        out.push(b'M');
        out.extend_from_slice(&(v as u16).to_le_bytes());
    } else if i32::try_from(v).is_ok() {
        out.push(b'J');
        out.extend_from_slice(&(v as i32).to_le_bytes());
    } else {
        // LONG1: minimal two's complement, little-endian.
        let mut bytes = v.to_le_bytes().to_vec();
        while bytes.len() > 1 {
            let last = bytes[bytes.len() - 1];
            let prev = bytes[bytes.len() - 2];
            if (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0) {
                bytes.pop();
            } else {
                break;
            }
        }
        out.extend_from_slice(&[0x8a, bytes.len() as u8]);
        out.extend_from_slice(&bytes);
    }
}

fn framed(body: Vec<u8>) -> Vec<u8> {
    let mut out = vec![0x80, 5, 0x95];
    out.extend_from_slice(&(body.len() as u64 + 1).to_le_bytes());
    out.extend(body);
    out.push(b'.');
    out
}

fn decimal_obj(out: &mut Vec<u8>, text: &str) {
    global(out, "decimal", "Decimal");
    s(out, text);
    out.extend_from_slice(&[0x85, 0x94, b'R', 0x94]); // TUPLE1 MEMOIZE REDUCE MEMOIZE
}

fn pickle_decimal(text: &str) -> Vec<u8> {
    let mut b = Vec::new();
    decimal_obj(&mut b, text);
    framed(b)
}

fn pickle_enum(class: &str, value: &str) -> Vec<u8> {
    let mut b = Vec::new();
    global(&mut b, "ai.backend.common.types", class);
    s(&mut b, value);
    b.extend_from_slice(&[0x85, 0x94, b'R', 0x94]);
    framed(b)
}

fn pickle_binary_size(n: i64) -> Vec<u8> {
    let mut b = Vec::new();
    global(&mut b, "ai.backend.common.types", "BinarySize");
    int(&mut b, n);
    b.extend_from_slice(&[0x85, 0x94, 0x81, 0x94]); // TUPLE1 NEWOBJ
    framed(b)
}

fn pickle_resource_slot(slots: &[(String, String)]) -> Vec<u8> {
    let mut b = Vec::new();
    global(&mut b, "ai.backend.common.types", "ResourceSlot");
    b.extend_from_slice(&[b')', 0x81, 0x94, b'N', b'}', 0x94]); // () NEWOBJ None {}
    s(&mut b, "data");
    b.extend_from_slice(&[b'}', 0x94, b'(']);
    for (k, v) in slots {
        s(&mut b, k);
        decimal_obj(&mut b, v);
    }
    b.extend_from_slice(&[b'u', b's', 0x86, 0x94, b'b']); // SETITEMS SETITEM TUPLE2 BUILD
    framed(b)
}

#[test]
fn hand_pickles_match_python_bytes() {
    // pickle.dumps(Decimal("1.5"), protocol=5) and BinarySize(1024).
    assert_eq!(
        pickle_decimal("1.5"),
        b"\x80\x05\x95!\x00\x00\x00\x00\x00\x00\x00\x8c\x07decimal\x94\x8c\x07Decimal\x94\x93\x94\x8c\x031.5\x94\x85\x94R\x94."
    );
    assert_eq!(
        pickle_binary_size(1024),
        b"\x80\x05\x951\x00\x00\x00\x00\x00\x00\x00\x8c\x17ai.backend.common.types\x94\x8c\nBinarySize\x94\x93\x94M\x00\x04\x85\x94\x81\x94."
    );
}

fn decimal_literal() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        "[0-9]{1,20}",
        proptest::option::of("[0-9]{1,12}"),
        proptest::option::of((prop_oneof!["\\+", "-"], 0u32..400)),
    )
        .prop_map(|(neg, int, frac, exp)| {
            let mut t = String::new();
            if neg {
                t.push('-');
            }
            t += &int;
            if let Some(f) = frac {
                t.push('.');
                t += &f;
            }
            if let Some((sign, e)) = exp {
                t += &format!("E{sign}{e}");
            }
            t
        })
}

/// Opcodes with operands, and operands, that real pickles contain: random sequences of them
/// reach deep into the reader (more than random bytes do).
const CHUNKS: &[&[u8]] = &[
    b"\x80\x05",
    b"(",
    b"N",
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
    b"\x94",
    b"\x93",
    b"h\x00",
    b"h\x02",
    b"K\x07",
    b"\x88",
    b".",
    b"\x8c\x07decimal\x8c\x07Decimal",
    b"\x8c\x17ai.backend.common.types\x8c\x0cResourceSlot",
    b"\x8c\x04data",
    b"\x8c\x011",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn arbitrary_bytes_never_panic(code in prop_oneof![
            proptest::sample::select(ExtType::ALL.map(|t| t as i8).to_vec()),
            any::<i8>(),
        ],
        data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_ext(code, &data);
    }

    #[test]
    fn pickle_like_bytes_never_panic(code in proptest::sample::select(vec![3i8, 6, 7, 8, 9, 16]),
        picks in proptest::collection::vec(0..CHUNKS.len() + 256, 0..60)) {
        let data: Vec<u8> = picks
            .iter()
            .flat_map(|&i| match CHUNKS.get(i) {
                Some(chunk) => chunk.to_vec(),
                None => vec![(i - CHUNKS.len()) as u8],
            })
            .collect();
        let _ = decode_ext(code, &data);
    }

    #[test]
    fn uuid_roundtrip(bytes in any::<[u8; 16]>()) {
        let v = decode_ext(1, &bytes).unwrap();
        let text = v.as_str().unwrap();
        prop_assert_eq!(text.len(), 36);
        prop_assert_eq!(text.to_ascii_lowercase(), text);
        let back = uuid::Uuid::parse_str(text).unwrap();
        prop_assert_eq!(back.as_bytes(), &bytes);
    }

    #[test]
    fn datetime_roundtrip(y in 1u16..=4094, mo in 1u8..=12, d in 1u8..=28, h in 0u8..24,
                          mi in 0u8..60, sec in 0u8..60, us in 0u32..1_000_000,
                          off in proptest::option::of(-64i32..=62)) {
        let offset = off.map(|q| q * 15);
        let v = decode_ext(2, &temporenc::encode_us(y, mo, d, h, mi, sec, us, offset))
            .map(|v| v.as_str().map(str::to_owned));
        let frac = if us == 0 { String::new() } else { format!(".{us:06}") };
        match offset {
            None => prop_assert_eq!(
                v.unwrap().unwrap(),
                format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{sec:02}{frac}")
            ),
            Some(0) => prop_assert_eq!(
                v.unwrap().unwrap(),
                format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{sec:02}{frac}+00:00")
            ),
            Some(off) => {
                // Shifting back by the offset gives the UTC fields that were encoded.
                let text = v.unwrap().unwrap();
                let n = |a: usize, b: usize| text[a..b].parse::<i64>().unwrap();
                let local_min = (n(0, 4), n(5, 7), n(8, 10), n(11, 13), n(14, 16));
                let sign = if &text[text.len() - 6..text.len() - 5] == "-" { -1 } else { 1 };
                let shown = sign * (n(text.len() - 5, text.len() - 3) * 60 + n(text.len() - 2, text.len()));
                prop_assert_eq!(shown, i64::from(off));
                let to_min = |(y, mo, d, h, mi): (i64, i64, i64, i64, i64)| {
                    let days = {
                        // days_from_civil, restated
                        let y = if mo <= 2 { y - 1 } else { y };
                        let era = y.div_euclid(400);
                        let yoe = y - era * 400;
                        let doy = (153 * ((mo + 9) % 12) + 2) / 5 + d - 1;
                        era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy
                    };
                    (days * 24 + h) * 60 + mi
                };
                let utc = (i64::from(y), i64::from(mo), i64::from(d), i64::from(h), i64::from(mi));
                prop_assert_eq!(to_min(local_min) - i64::from(off), to_min(utc));
                let suffix = format!(
                    "{}{:02}:{:02}", if off < 0 { '-' } else { '+' }, off.abs() / 60, off.abs() % 60
                );
                prop_assert!(text.ends_with(&suffix), "{} does not end with {}", text, suffix);
            }
        }
    }

    #[test]
    fn decimal_roundtrip(text in decimal_literal()) {
        prop_assert_eq!(decode_ext(3, &pickle_decimal(&text)).unwrap(), Value::from(text.as_str()));
    }

    #[test]
    fn enum_roundtrip(value in "[a-z_-]{0,300}",
                      class in proptest::sample::select(vec!["SessionTypes", "ClusterMode", "AutoPullBehavior"])) {
        prop_assert_eq!(decode_ext(6, &pickle_enum(class, &value)).unwrap(), Value::from(value.as_str()));
    }

    #[test]
    fn binary_size_roundtrip(n in any::<i64>()) {
        prop_assert_eq!(decode_ext(16, &pickle_binary_size(n)).unwrap(), Value::from(n));
    }

    #[test]
    fn resource_slot_roundtrip(slots in proptest::collection::btree_map("[a-z][a-z.:]{0,12}", decimal_literal(), 0..12)) {
        let slots: Vec<(String, String)> = slots.into_iter().collect();
        let want = Value::Map(slots.iter().map(|(k, v)| (Value::from(k.as_str()), Value::from(v.as_str()))).collect());
        prop_assert_eq!(decode_ext(8, &pickle_resource_slot(&slots)).unwrap(), want);
    }

    #[test]
    fn path_roundtrip(path in any::<String>(), code in proptest::sample::select(vec![4i8, 5, 17])) {
        prop_assert_eq!(decode_ext(code, path.as_bytes()).unwrap(), Value::from(path.as_str()));
    }

    #[test]
    fn mutated_fixtures_never_panic(i in 0..FIXTURES.len(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
                                    cut in any::<usize>()) {
        let mut v = read(FIXTURES[i].1);
        mutate(&mut v, &flips, cut);
        let _ = normalize(&mut v);
    }
}

/// Flips bytes in, and truncates, every extension payload of `v`.
fn mutate(v: &mut Value, flips: &[(usize, u8)], cut: usize) {
    match v {
        Value::Ext(_, data) if !data.is_empty() => {
            for (at, x) in flips {
                let n = data.len();
                data[at % n] ^= x;
            }
            if cut % 3 == 0 {
                data.truncate(cut % (data.len() + 1));
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|x| mutate(x, flips, cut)),
        Value::Map(pairs) => pairs.iter_mut().for_each(|(k, x)| {
            mutate(k, flips, cut);
            mutate(x, flips, cut);
        }),
        _ => {}
    }
}
