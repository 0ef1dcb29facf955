//! Formatting of single values for `kernelvisor ctl`: slot amounts, durations, timestamps, and
//! order-preserving JSON pretty-printing. All pure.

use serde_json::Value;

/// A slot amount as the API writes it (a decimal string, or a number) as `f64`.
pub fn amount(v: &Value) -> Option<f64> {
    match v {
        Value::String(s) => s.trim().parse().ok(),
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// A count or core amount with at most 3 decimals and no trailing zeros: `"4"`, `"0.5"`.
///
/// A string that is not a number is shown as it is; `null`/missing as `-`.
pub fn cores(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".to_owned(),
        Some(v) => match amount(v) {
            Some(n) => trim_decimals(format!("{n:.3}")),
            None => v.as_str().map_or_else(|| v.to_string(), str::to_owned),
        },
    }
}

/// Bytes (a decimal string or number) in binary units: `"512 B"`, `"256 MiB"`, `"1.5 GiB"`.
///
/// A string that is not a number is shown as it is; `null`/missing as `-`.
pub fn bytes(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".to_owned(),
        Some(v) => match amount(v) {
            Some(n) => human_bytes(n),
            None => v.as_str().map_or_else(|| v.to_string(), str::to_owned),
        },
    }
}

/// An image pull's progress: a 20-cell bar, the percentage, the bytes and the layers:
/// `[########------------]  40%  4 MiB / 10 MiB, 1/3 layers`. Before any layer's size is known
/// the bar is empty and the percentage `?`.
pub fn pull_bar(p: &crate::model::pull::PullProgress) -> String {
    const CELLS: u64 = 20;
    let (filled, percent) = if p.total_bytes == 0 {
        (0, "  ?%".to_owned())
    } else {
        let done = p.current_bytes.min(p.total_bytes);
        (
            (done * CELLS / p.total_bytes) as usize,
            format!("{:>3}%", done * 100 / p.total_bytes),
        )
    };
    format!(
        "[{}{}] {percent}  {} / {}, {}/{} layers",
        "#".repeat(filled),
        "-".repeat(CELLS as usize - filled),
        human_bytes(p.current_bytes as f64),
        human_bytes(p.total_bytes as f64),
        p.layers_done,
        p.layers_total
    )
}

/// `n` bytes with one decimal in the largest binary unit that keeps it ≥ 1: `1.5 GiB`.
pub fn human_bytes(n: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if n.abs() < 1024.0 {
        return format!("{n:.0} B");
    }
    let mut value = n;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    let mut text = trim_decimals(format!("{value:.1}"));
    // 1023.96 MiB rounds to "1024": show it as the next unit instead.
    if text == "1024" && unit < UNITS.len() - 1 {
        text = "1".to_owned();
        unit += 1;
    }
    format!("{text} {}", UNITS[unit])
}

fn trim_decimals(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// A duration in seconds as its largest whole unit: `"42s"`, `"5m"`, `"3h"`, `"2d"`.
/// Negative durations (clock skew) count as 0.
pub fn duration(secs: f64) -> String {
    let s = if secs.is_finite() && secs > 0.0 {
        secs as u64
    } else {
        0
    };
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86_399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// How long before `now` the Unix time `at` was: `"3s ago"`; `-` when `at` is not a number.
pub fn ago(at: Option<&Value>, now: f64) -> String {
    match at.and_then(Value::as_f64) {
        Some(t) => format!("{} ago", duration(now - t)),
        None => "-".to_owned(),
    }
}

/// A Unix time (seconds) as RFC 3339 UTC to the second: `2023-11-14T22:13:20Z`.
pub fn timestamp(unix: f64) -> String {
    let secs = unix.floor() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day) (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// A file's type (`file`, `dir`, `symlink`, `other`) and octal permission bits (`"0644"`,
/// `"1777"`) as `ls -l` shows them: `-rw-r--r--`, `drwxrwxrwt`. Bits that are not octal are
/// shown after the type letter as they are; a missing mode as `?` after it.
pub fn file_mode(kind: Option<&str>, mode: Option<&str>) -> String {
    let letter = match kind {
        Some("file") => '-',
        Some("dir") => 'd',
        Some("symlink") => 'l',
        _ => '?',
    };
    let Some(mode) = mode else {
        return format!("{letter}?");
    };
    let Ok(bits) = u32::from_str_radix(mode, 8) else {
        return format!("{letter}{mode}");
    };
    let mut out = String::with_capacity(10);
    out.push(letter);
    // (shift of the rwx triplet, special bit, its letter when x is set / not set)
    for (shift, special, set, unset) in [
        (6, 0o4000, 's', 'S'),
        (3, 0o2000, 's', 'S'),
        (0, 0o1000, 't', 'T'),
    ] {
        let t = (bits >> shift) & 0o7;
        out.push(if t & 4 != 0 { 'r' } else { '-' });
        out.push(if t & 2 != 0 { 'w' } else { '-' });
        out.push(match (t & 1 != 0, bits & special != 0) {
            (true, true) => set,
            (false, true) => unset,
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    out
}

/// Re-indents valid JSON text with two spaces per level (the layout of
/// `serde_json::to_string_pretty`) without parsing it, so key order and number spelling stay
/// exactly as the API wrote them. Empty `{}` / `[]` stay on one line.
pub fn pretty_json(raw: &str) -> String {
    fn newline(out: &mut String, depth: usize) {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    }
    let mut out = String::with_capacity(raw.len() * 2);
    let mut depth = 0usize;
    let mut chars = raw.trim().chars().peekable();
    let (mut in_string, mut escaped) = (false, false);
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while chars.peek().is_some_and(|c| c.is_ascii_whitespace()) {
                    chars.next();
                }
                out.push(c);
                if chars.peek() == Some(&close) {
                    chars.next();
                    out.push(close);
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(',');
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_ascii_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

/// Valid JSON text on one line (an NDJSON line): whitespace outside strings dropped, key order
/// and number spelling exactly as the API wrote them.
pub fn compact_json(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in raw.trim().chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_ascii_whitespace() {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pull_bars() {
        use crate::model::pull::PullProgress;
        let p = |current_bytes, total_bytes, layers_done, layers_total| PullProgress {
            current_bytes,
            total_bytes,
            layers_done,
            layers_total,
        };
        assert_eq!(
            pull_bar(&p(0, 0, 0, 2)),
            "[--------------------]   ?%  0 B / 0 B, 0/2 layers"
        );
        assert_eq!(
            pull_bar(&p(4 << 20, 10 << 20, 1, 3)),
            "[########------------]  40%  4 MiB / 10 MiB, 1/3 layers"
        );
        assert_eq!(
            pull_bar(&p(10 << 20, 10 << 20, 3, 3)),
            "[####################] 100%  10 MiB / 10 MiB, 3/3 layers"
        );
    }

    #[test]
    fn memory_in_binary_units() {
        assert_eq!(human_bytes(0.0), "0 B");
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(268_435_456.0), "256 MiB");
        assert_eq!(human_bytes(1_610_612_736.0), "1.5 GiB");
        assert_eq!(human_bytes(1_073_741_823.0), "1 GiB");
        assert_eq!(bytes(Some(&json!("8589934592"))), "8 GiB");
        assert_eq!(bytes(Some(&json!(1536))), "1.5 KiB");
        assert_eq!(bytes(Some(&json!("lots"))), "lots");
        assert_eq!(bytes(None), "-");
        assert_eq!(bytes(Some(&Value::Null)), "-");
    }

    #[test]
    fn cores_trimmed() {
        assert_eq!(cores(Some(&json!("4"))), "4");
        assert_eq!(cores(Some(&json!("0.500"))), "0.5");
        assert_eq!(cores(Some(&json!(1.25))), "1.25");
        assert_eq!(cores(Some(&json!("0"))), "0");
        assert_eq!(cores(None), "-");
    }

    #[test]
    fn relative_times() {
        let now = 1_700_000_000.0;
        assert_eq!(ago(Some(&json!(now - 3.4)), now), "3s ago");
        assert_eq!(ago(Some(&json!(now - 300.0)), now), "5m ago");
        assert_eq!(ago(Some(&json!(now - 7300.0)), now), "2h ago");
        assert_eq!(ago(Some(&json!(now - 3.0 * 86_400.0)), now), "3d ago");
        assert_eq!(ago(Some(&json!(now + 5.0)), now), "0s ago");
        assert_eq!(ago(Some(&Value::Null), now), "-");
        assert_eq!(ago(None, now), "-");
    }

    #[test]
    fn timestamps_in_utc() {
        assert_eq!(timestamp(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(timestamp(1_700_000_000.9), "2023-11-14T22:13:20Z");
        assert_eq!(timestamp(951_782_400.0), "2000-02-29T00:00:00Z");
        assert_eq!(timestamp(-1.0), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn file_modes() {
        assert_eq!(file_mode(Some("file"), Some("0644")), "-rw-r--r--");
        assert_eq!(file_mode(Some("dir"), Some("0755")), "drwxr-xr-x");
        assert_eq!(file_mode(Some("symlink"), Some("777")), "lrwxrwxrwx");
        assert_eq!(file_mode(Some("dir"), Some("1777")), "drwxrwxrwt");
        assert_eq!(file_mode(Some("file"), Some("6644")), "-rwSr-Sr--");
        assert_eq!(file_mode(Some("other"), Some("0600")), "?rw-------");
        assert_eq!(file_mode(Some("file"), Some("rw")), "-rw");
        assert_eq!(file_mode(None, None), "??");
    }

    #[test]
    fn pretty_json_matches_serde_layout_and_keeps_order() {
        let raw = r#"{"b":[1,2.50,{}],"a":{"s":"x, {y}: \"z\" ","e":[ ]},"n":null}"#;
        assert_eq!(
            pretty_json(raw),
            "{\n  \"b\": [\n    1,\n    2.50,\n    {}\n  ],\n  \"a\": {\n    \"s\": \"x, {y}: \\\"z\\\" \",\n    \"e\": []\n  },\n  \"n\": null\n}"
        );
        // Same layout as serde_json where the order agrees (keys already sorted).
        let sorted = r#"{ "a": {"x": [true, false]}, "z": "q" }"#;
        let v: Value = serde_json::from_str(sorted).unwrap();
        assert_eq!(
            pretty_json(sorted),
            serde_json::to_string_pretty(&v).unwrap()
        );
    }

    #[test]
    fn compact_json_keeps_strings_and_order() {
        let raw = "{\n  \"runId\": \"r 1\",\n  \"console\": [[\"stdout\", \"a \\\" b\\n\"]],\n  \"exitCode\": 1.0\n}\n";
        assert_eq!(
            compact_json(raw),
            r#"{"runId":"r 1","console":[["stdout","a \" b\n"]],"exitCode":1.0}"#
        );
        assert_eq!(
            compact_json(r#"{"a": "\\", "b" : [ ]}"#),
            r#"{"a":"\\","b":[]}"#
        );
    }
}
