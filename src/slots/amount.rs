//! An exact, non-negative slot amount: thousandths of the slot's unit, so that `0.1 + 0.2` is
//! exactly `0.3` (Backend.AI keeps slot amounts as `Decimal` for the same reason).

use std::fmt;

/// Thousandths of a unit (a core, a device, a share, a byte). `Amount::from_units(2)` is 2 units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Amount(u64);

/// The largest amount: `u64::MAX` thousandths (about 1.8e16 units).
pub const MAX_UNITS: u64 = u64::MAX / 1000;

impl Amount {
    /// Zero.
    pub const ZERO: Amount = Amount(0);

    /// `milli` thousandths of a unit.
    pub const fn from_milli(milli: u64) -> Amount {
        Amount(milli)
    }

    /// `units` whole units; saturates at the largest amount.
    pub const fn from_units(units: u64) -> Amount {
        Amount(units.saturating_mul(1000))
    }

    /// Thousandths of a unit.
    pub const fn milli(self) -> u64 {
        self.0
    }

    /// Whole units, rounded down.
    pub const fn units(self) -> u64 {
        self.0 / 1000
    }

    /// Whether it is a whole number of units.
    pub const fn is_whole(self) -> bool {
        self.0 % 1000 == 0
    }

    /// `self + other`, or `None` past the largest amount.
    pub fn checked_add(self, other: Amount) -> Option<Amount> {
        self.0.checked_add(other.0).map(Amount)
    }

    /// `self - other`, or `None` below zero.
    pub fn checked_sub(self, other: Amount) -> Option<Amount> {
        self.0.checked_sub(other.0).map(Amount)
    }

    /// `self - other`, at least zero.
    pub fn saturating_sub(self, other: Amount) -> Amount {
        Amount(self.0.saturating_sub(other.0))
    }

    /// As a float, for ratios and metrics (inexact; never for accounting).
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    /// Parses a decimal: `"1"`, `"0.5"`, `"2.125"`, `" 3 "`; at most 3 decimals, no sign, no
    /// exponent.
    ///
    /// Errors: a message saying what is wrong (the caller names the slot).
    pub fn parse(text: &str) -> Result<Amount, String> {
        let t = text.trim();
        let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if (whole.is_empty() && frac.is_empty()) || !digits(whole) || !digits(frac) {
            return Err(format!("`{text}` is not a non-negative decimal number"));
        }
        if frac.len() > 3 {
            return Err(format!("`{text}` has more than 3 decimals"));
        }
        let units: u64 = if whole.is_empty() {
            0
        } else {
            whole
                .parse()
                .map_err(|_| format!("`{text}` is too large"))?
        };
        let frac_milli = format!("{frac:0<3}").parse::<u64>().unwrap_or(0);
        units
            .checked_mul(1000)
            .and_then(|m| m.checked_add(frac_milli))
            .map(Amount)
            .ok_or_else(|| format!("`{text}` is too large"))
    }

    /// From a JSON-ish number: integers exactly, floats rounded to thousandths when they are
    /// within 1e-9 of them.
    ///
    /// Errors: negative, not finite, more than 3 decimals, too large.
    pub fn from_f64(n: f64) -> Result<Amount, String> {
        if !n.is_finite() || n < 0.0 {
            return Err(format!("{n} is not a non-negative number"));
        }
        let milli = n * 1000.0;
        if (milli - milli.round()).abs() > 1e-6 * milli.abs().max(1.0) {
            return Err(format!("{n} has more than 3 decimals"));
        }
        if milli.round() >= u64::MAX as f64 {
            return Err(format!("{n} is too large"));
        }
        Ok(Amount(milli.round() as u64))
    }
}

impl fmt::Display for Amount {
    /// `1500` thousandths → `1.5`; `2000` → `2`; `125` → `0.125`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (units, frac) = (self.0 / 1000, self.0 % 1000);
        if frac == 0 {
            write!(f, "{units}")
        } else {
            let frac = format!("{frac:03}");
            write!(f, "{units}.{}", frac.trim_end_matches('0'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_exact() {
        let a = Amount::parse("0.1").unwrap();
        let b = Amount::parse("0.2").unwrap();
        assert_eq!(a.checked_add(b), Some(Amount::parse("0.3").unwrap()));
        assert_eq!(
            Amount::from_f64(0.1)
                .unwrap()
                .checked_add(Amount::from_f64(0.2).unwrap()),
            Some(Amount::from_milli(300))
        );
        assert_eq!(Amount::parse("1.5").unwrap().to_string(), "1.5");
        assert_eq!(Amount::parse(".25").unwrap().to_string(), "0.25");
        assert_eq!(Amount::parse("3").unwrap().to_string(), "3");
        assert_eq!(Amount::from_milli(125).to_string(), "0.125");
        assert_eq!(
            Amount::from_units(2).checked_sub(Amount::from_milli(2001)),
            None
        );
    }

    #[test]
    fn bad_text_is_refused() {
        for bad in [
            "",
            ".",
            "-1",
            "1e3",
            "0.0001",
            "abc",
            "1.2.3",
            "99999999999999999999",
        ] {
            assert!(Amount::parse(bad).is_err(), "{bad}");
        }
        assert!(Amount::from_f64(-1.0).is_err());
        assert!(Amount::from_f64(f64::NAN).is_err());
        assert!(Amount::from_f64(0.0005).is_err());
        assert!(Amount::from_f64(1e300).is_err());
    }
}
