//! temporenc (<https://temporenc.org>) decoding for Backend.AI's datetime extension (ext 2),
//! which `ai.backend.common.msgpack` packs with `temporenc.packb(datetime)` and unpacks with
//! `temporenc.unpackb(data).datetime()`.
//!
//! All six temporenc types are parsed (`D`, `T`, `DT`, `DTZ`, `DTS`, `DTSZ`, every sub-second
//! precision) with the Python library's range checks; converting to a datetime needs a full
//! date and time, as Python's strict `.datetime()` does. Backend.AI always sends `DTS`
//! (naive) or `DTSZ` (aware) with microsecond precision.
//!
//! Output ([`to_rfc3339`]): Python's `datetime.isoformat()` of the value, i.e.
//! `YYYY-MM-DDTHH:MM:SS[.ffffff][±HH:MM]`: the offset is present exactly when temporenc carries
//! one, and the time is the *local* time at that offset (temporenc stores UTC; Python's
//! `.datetime()` returns the same instant in UTC, `.datetime(local=True)` this form). The
//! fraction has 6 digits when the microseconds are non-zero (9 when the value carries
//! nanoseconds that are not whole microseconds, which Python would truncate), none otherwise.

/// One decoded temporenc value; `None` marks a component temporenc says is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moment {
    /// 0..=4094.
    pub year: Option<u16>,
    /// 1..=12.
    pub month: Option<u8>,
    /// 1..=31.
    pub day: Option<u8>,
    /// 0..=23.
    pub hour: Option<u8>,
    /// 0..=59.
    pub minute: Option<u8>,
    /// 0..=60 (60: a leap second).
    pub second: Option<u8>,
    /// Sub-second part in nanoseconds, 0..=999_999_999.
    pub nanosecond: Option<u32>,
    /// UTC offset in minutes (a multiple of 15).
    pub tz_offset: Option<i32>,
}

struct Bits<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Bits<'_> {
    /// The next `n` (≤ 32) bits, most significant first; callers checked the length.
    fn read(&mut self, n: usize) -> u32 {
        let mut v = 0u32;
        for _ in 0..n {
            let byte = self.data[self.pos / 8];
            let bit = (byte >> (7 - self.pos % 8)) & 1;
            v = (v << 1) | u32::from(bit);
            self.pos += 1;
        }
        v
    }
}

/// Parses one temporenc value occupying exactly `data`.
///
/// Errors (as Python's `temporenc.unpackb`): an unknown type tag, a length that does not match
/// the type, or a component out of range.
pub fn decode(data: &[u8]) -> Result<Moment, String> {
    let Some(&first) = data.first() else {
        return Err("empty temporenc value".into());
    };
    // (type, tag bits, precision, length)
    let (ty, tag_bits, precision, len) = if first >> 6 == 0b00 {
        ("DT", 2, None, 5)
    } else if first >> 6 == 0b01 {
        let p = (first >> 4) & 0b11;
        ("DTS", 4, Some(p), [7, 8, 9, 6][usize::from(p)])
    } else if first >> 5 == 0b100 {
        ("D", 3, None, 3)
    } else if first >> 1 == 0b101_0000 {
        ("T", 7, None, 3)
    } else if first >> 5 == 0b110 {
        ("DTZ", 3, None, 6)
    } else if first >> 5 == 0b111 {
        let p = (first >> 3) & 0b11;
        ("DTSZ", 5, Some(p), [8, 9, 10, 7][usize::from(p)])
    } else {
        return Err(format!(
            "first byte 0x{first:02x} has no valid temporenc tag"
        ));
    };
    if data.len() != len {
        return Err(format!(
            "temporenc {ty} value must be {len} bytes; got {}",
            data.len()
        ));
    }
    let mut bits = Bits {
        data,
        pos: tag_bits,
    };
    let has_date = ty != "T";
    let has_time = ty != "D";
    let date = has_date.then(|| bits.read(21));
    let time = has_time.then(|| bits.read(17));
    let nanosecond = match precision {
        Some(0b00) => Some(bits.read(10) * 1_000_000),
        Some(0b01) => Some(bits.read(20) * 1_000),
        Some(0b10) => Some(bits.read(30)),
        _ => None,
    };
    let zone = matches!(ty, "DTZ" | "DTSZ").then(|| bits.read(7));

    let mut m = Moment {
        year: None,
        month: None,
        day: None,
        hour: None,
        minute: None,
        second: None,
        nanosecond,
        tz_offset: None,
    };
    if let Some(d) = date {
        let year = d >> 9;
        m.year = (year != 4095).then_some(year as u16);
        let month = (d >> 5) & 0xf;
        m.month = match month {
            15 => None,
            0..=11 => Some(month as u8 + 1),
            _ => return Err("month not within supported range".into()),
        };
        let day = d & 0x1f;
        m.day = (day != 31).then_some(day as u8 + 1);
    }
    if let Some(t) = time {
        let field = |v: u32, empty: u32, max: u32, what: &str| match v {
            v if v == empty => Ok(None),
            v if v > max => Err(format!("{what} not within supported range")),
            v => Ok(Some(v as u8)),
        };
        m.hour = field(t >> 12, 31, 23, "hour")?;
        m.minute = field((t >> 6) & 0x3f, 63, 59, "minute")?;
        m.second = field(t & 0x3f, 63, 60, "second")?;
    }
    if let Some(z) = zone {
        m.tz_offset = (z != 127).then(|| 15 * (z as i32 - 64));
    }
    if m.nanosecond.is_some_and(|n| n > 999_999_999) {
        return Err("sub-second precision not within supported range".into());
    }
    Ok(m)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// The RFC 3339 text of a decoded value (see the module docs for the exact form).
///
/// Errors, as Python's strict `Moment.datetime()` and `datetime` would raise: a missing date
/// or time component, a day past the month's end, year 0, a leap second (60), or a local time
/// outside years 1..=9999.
pub fn to_rfc3339(m: &Moment) -> Result<String, String> {
    let (Some(year), Some(month), Some(day)) = (m.year, m.month, m.day) else {
        return Err("incomplete date information".into());
    };
    let (Some(hour), Some(minute), Some(second)) = (m.hour, m.minute, m.second) else {
        return Err("incomplete time information".into());
    };
    let (mut y, mut mo, mut d) = (i64::from(year), i64::from(month), i64::from(day));
    if y < 1 {
        return Err(format!("year {y} is out of range"));
    }
    if d > days_in_month(y, mo) {
        return Err(format!("day {d} is out of range for {y:04}-{mo:02}"));
    }
    if second > 59 {
        return Err("second must be in 0..59 (leap seconds are not supported)".into());
    }
    let (mut h, mut mi) = (i64::from(hour), i64::from(minute));
    let mut offset = String::new();
    if let Some(off) = m.tz_offset {
        // temporenc stores UTC: shift to the local time at the carried offset.
        let minutes = (days_from_civil(y, mo, d) * 24 + h) * 60 + mi + i64::from(off);
        let days = minutes.div_euclid(1440);
        let in_day = minutes.rem_euclid(1440);
        (y, mo, d) = civil_from_days(days);
        (h, mi) = (in_day / 60, in_day % 60);
        if !(1..=9999).contains(&y) {
            return Err(format!("local year {y} is out of range"));
        }
        let sign = if off < 0 { '-' } else { '+' };
        offset = format!("{sign}{:02}:{:02}", off.abs() / 60, off.abs() % 60);
    }
    let ns = m.nanosecond.unwrap_or(0);
    let fraction = if ns % 1000 != 0 {
        format!(".{ns:09}")
    } else if ns != 0 {
        format!(".{:06}", ns / 1000)
    } else {
        String::new()
    };
    Ok(format!(
        "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{second:02}{fraction}{offset}"
    ))
}

/// Encodes a full `DTS`/`DTSZ` value with microsecond precision, as Python's
/// `temporenc.packb(datetime)` does (`tz_offset` in minutes, the fields already in UTC when
/// an offset is given). For tests and round trips.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub fn encode_us(
    year: u16,
    month: u8,
    day: u8,
    hour: u8,
    minute: u8,
    second: u8,
    us: u32,
    tz_offset: Option<i32>,
) -> Vec<u8> {
    let date = (u128::from(year) << 9) | (u128::from(month - 1) << 5) | u128::from(day - 1);
    let time = (u128::from(hour) << 12) | (u128::from(minute) << 6) | u128::from(second);
    match tz_offset {
        None => {
            // 01 01 D21 T17 S20 00 = 64 bits
            let v = (0b0101u128 << 60) | (date << 39) | (time << 22) | (u128::from(us) << 2);
            v.to_be_bytes()[8..].to_vec()
        }
        Some(off) => {
            // 111 01 D21 T17 S20 Z7 00 = 72 bits
            let z = (off / 15 + 64) as u128;
            let v = (0b11101u128 << 67)
                | (date << 46)
                | (time << 29)
                | (u128::from(us) << 9)
                | (z << 2);
            v.to_be_bytes()[7..].to_vec()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_bytes_decode() {
        // temporenc.packb(datetime(2024,1,2,3,4,5,123456, tzinfo=timezone.utc))
        let m = decode(b"\xeb\xf4\x00\x46\x20\xa3\xc4\x81\x00").unwrap();
        assert_eq!(to_rfc3339(&m).unwrap(), "2024-01-02T03:04:05.123456+00:00");
        assert_eq!(
            encode_us(2024, 1, 2, 3, 4, 5, 123456, Some(0)),
            b"\xeb\xf4\x00\x46\x20\xa3\xc4\x81\x00"
        );
    }

    #[test]
    fn offsets_shift_to_local_time() {
        // 2024-12-31T23:30:00Z at +09:00 is 2025-01-01T08:30:00+09:00.
        let b = encode_us(2024, 12, 31, 23, 30, 0, 0, Some(540));
        assert_eq!(
            to_rfc3339(&decode(&b).unwrap()).unwrap(),
            "2025-01-01T08:30:00+09:00"
        );
        let b = encode_us(2024, 3, 1, 2, 0, 0, 5, Some(-300));
        assert_eq!(
            to_rfc3339(&decode(&b).unwrap()).unwrap(),
            "2024-02-29T21:00:00.000005-05:00"
        );
        let b = encode_us(2024, 3, 1, 2, 0, 0, 0, None);
        assert_eq!(
            to_rfc3339(&decode(&b).unwrap()).unwrap(),
            "2024-03-01T02:00:00"
        );
    }

    #[test]
    fn other_types_and_precisions() {
        // DT 2000-01-01 00:00:00 (tag 00): date=(2000<<9), time=0.
        let v: u64 = (2000u64 << 9) << 17;
        let dt = &v.to_be_bytes()[3..];
        assert_eq!(
            to_rfc3339(&decode(dt).unwrap()).unwrap(),
            "2000-01-01T00:00:00"
        );
        // D alone is incomplete.
        let d = decode(&[0b1000_0000 | 0x0f, 0xa0, 0x00]).unwrap();
        assert_eq!(d.year, Some(2000));
        assert!(to_rfc3339(&d).unwrap_err().contains("incomplete time"));
        assert!(decode(&[0xff]).is_err());
        assert!(decode(&[]).is_err());
        assert!(decode(&[0b1011_0000, 0, 0]).is_err());
    }

    #[test]
    fn civil_roundtrip() {
        for days in (-800_000..3_000_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
            assert!((1..=12).contains(&m) && d >= 1 && d <= days_in_month(y, m));
        }
    }
}
