//! Rates in tc's spelling.
//!
//! A [`Rate`] is a whole number of bits per second. It is written the way `tc` writes
//! rates: a decimal number followed by a unit, e.g. `"10mbit"`, `"1.9mbit"`, `".3mbit"`,
//! `"1500bit"` or `"2mibps"`:
//!
//! | units | meaning |
//! | --- | --- |
//! | `bit`, `kbit`, `mbit`, `gbit`, `tbit` | bits per second, powers of 1000 |
//! | `kibit`, `mibit`, `gibit`, `tibit` | bits per second, powers of 1024 |
//! | `bps`, `kbps`, `mbps`, `gbps`, `tbps` | **bytes** per second, powers of 1000 (as in tc) |
//! | `kibps`, `mibps`, `gibps`, `tibps` | bytes per second, powers of 1024 |
//!
//! Units are case-insensitive and a bare number means bits per second, as with tc. Numbers
//! are parsed exactly, with integer arithmetic: `"1.9mbit"` is exactly 1 900 000 bit/s, and
//! a spelling that does not come to a whole number of bits per second (`"0.1bit"`,
//! `"0.3bps"`) is an error rather than a rounded value.
//!
//! [`Rate`]'s `Display` prints the shortest exact spelling in `bit`/`kbit`/`mbit`/`gbit`/
//! `tbit` (`"1.9mbit"`, `"10mbit"`, `"300kbit"`, `"1500bit"`), which parses back to the same
//! rate.
//!
//! A [`RateSpec`] is what a class's `rate` and `ceil` accept: an absolute [`Rate`] or a
//! percentage (`"25%"`, `"12.5%"`) of a parent rate, resolved with [`RateSpec::resolve`].
//!
//! With serde, both deserialize from their string spelling (so TOML says
//! `rate = "10mbit"`) and also from an integer number of bits per second. A [`Rate`]
//! serializes as an integer number of bits per second, the unit of the JSON control API.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde::{Serialize, Serializer};

/// A data rate: a whole number of bits per second.
///
/// Parse it from tc's spelling with [`str::parse`], print it back with `Display`.
///
/// ```
/// use shaper::rate::Rate;
///
/// let r: Rate = "1.9mbit".parse().unwrap();
/// assert_eq!(r.bits_per_sec(), 1_900_000);
/// assert_eq!(r.to_string(), "1.9mbit");
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Rate(u64);

impl Rate {
    /// No bandwidth at all.
    pub const ZERO: Rate = Rate(0);

    /// A rate of `bits` bits per second.
    #[must_use]
    pub const fn from_bits_per_sec(bits: u64) -> Rate {
        Rate(bits)
    }

    /// Bits per second.
    #[must_use]
    pub const fn bits_per_sec(self) -> u64 {
        self.0
    }

    /// Bytes per second, rounded to the nearest byte (halves round up), and at least 1 for
    /// any non-zero rate, so that a positive rate never turns into "unlimited" or "stopped"
    /// in a byte-based datapath.
    #[must_use]
    pub const fn bytes_per_sec(self) -> u64 {
        let bytes = self.0 / 8 + if self.0 % 8 >= 4 { 1 } else { 0 };
        if bytes == 0 && self.0 > 0 {
            1
        } else {
            bytes
        }
    }
}

/// A rate unit: the number written is multiplied by `10^pow10 * 2^pow2` to give bit/s.
struct Unit {
    name: &'static str,
    pow10: u32,
    pow2: u32,
}

/// Every unit tc accepts for rates, with its scale relative to one bit per second.
const UNITS: [Unit; 18] = [
    Unit { name: "bit", pow10: 0, pow2: 0 },
    Unit { name: "kbit", pow10: 3, pow2: 0 },
    Unit { name: "mbit", pow10: 6, pow2: 0 },
    Unit { name: "gbit", pow10: 9, pow2: 0 },
    Unit { name: "tbit", pow10: 12, pow2: 0 },
    Unit { name: "kibit", pow10: 0, pow2: 10 },
    Unit { name: "mibit", pow10: 0, pow2: 20 },
    Unit { name: "gibit", pow10: 0, pow2: 30 },
    Unit { name: "tibit", pow10: 0, pow2: 40 },
    // Bytes per second: one more factor of 8 = 2^3.
    Unit { name: "bps", pow10: 0, pow2: 3 },
    Unit { name: "kbps", pow10: 3, pow2: 3 },
    Unit { name: "mbps", pow10: 6, pow2: 3 },
    Unit { name: "gbps", pow10: 9, pow2: 3 },
    Unit { name: "tbps", pow10: 12, pow2: 3 },
    Unit { name: "kibps", pow10: 0, pow2: 13 },
    Unit { name: "mibps", pow10: 0, pow2: 23 },
    Unit { name: "gibps", pow10: 0, pow2: 33 },
    Unit { name: "tibps", pow10: 0, pow2: 43 },
];

/// The valid units, for error messages.
const UNIT_LIST: &str = "bit, kbit, mbit, gbit, tbit, kibit, mibit, gibit, tibit (bits per \
                         second, as is a bare number) and bps, kbps, mbps, gbps, tbps, kibps, \
                         mibps, gibps, tibps (bytes per second)";

/// Why a rate or a rate specification could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseRateError {
    /// Nothing (or only whitespace) was given.
    #[error("empty rate; expected a number and a unit, e.g. \"10mbit\"")]
    Empty,
    /// The number is negative.
    #[error("negative rate \"{input}\"; a rate is a number of at least 0 and a unit, e.g. \"10mbit\"")]
    Negative {
        /// The text as given.
        input: String,
    },
    /// The text does not start with a decimal number.
    #[error(
        "invalid rate \"{input}\"; expected a decimal number and a unit, e.g. \"10mbit\", \
         \"1.5gbit\" or \".3mbit\""
    )]
    InvalidNumber {
        /// The text as given.
        input: String,
    },
    /// The number is followed by something that is not a unit.
    #[error("unknown unit \"{unit}\" in rate \"{input}\"; valid units: {units}", units = UNIT_LIST)]
    UnknownUnit {
        /// The text as given.
        input: String,
        /// What stood where the unit should be.
        unit: String,
    },
    /// The rate does not fit in 64 bits.
    #[error("rate \"{input}\" is too large; the largest rate is {max} bits per second", max = u64::MAX)]
    Overflow {
        /// The text as given.
        input: String,
    },
    /// The rate is not a whole number of bits per second.
    #[error(
        "rate \"{input}\" is not a whole number of bits per second; use fewer decimals or a \
         smaller unit"
    )]
    NotWhole {
        /// The text as given.
        input: String,
    },
    /// A percentage was given where only an absolute rate is meaningful.
    #[error(
        "\"{input}\" is a percentage, which needs a parent rate to be taken from; give an \
         absolute rate here, e.g. \"10mbit\""
    )]
    PercentNeedsParent {
        /// The text as given.
        input: String,
    },
    /// A percentage that is not in `(0, 100]`.
    #[error("percentage \"{input}\" is out of range; expected more than 0% and at most 100%")]
    PercentOutOfRange {
        /// The text as given.
        input: String,
    },
    /// A percentage with more than two decimals.
    #[error("percentage \"{input}\" has more than two decimals; write e.g. \"12.5%\" or \"33.33%\"")]
    PercentTooPrecise {
        /// The text as given.
        input: String,
    },
}

/// A non-negative decimal number as written: its integer digits and its fraction digits,
/// with leading zeros of the integer part and trailing zeros of the fraction dropped.
///
/// Shared with the configuration's duration parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decimal<'a> {
    int: &'a str,
    frac: &'a str,
}

/// Why a [`Decimal`] could not be scaled to a whole `u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScaleError {
    /// The scaled value has a non-zero fractional part.
    NotWhole,
    /// The scaled value does not fit in a `u64`.
    Overflow,
}

impl<'a> Decimal<'a> {
    /// Splits `s` into a leading decimal number (digits with at most one `.`) and the rest.
    /// Returns `None` when `s` does not start with a well-formed number: no digit at all, or
    /// a second `.` right after the number.
    pub(crate) fn split_prefix(s: &'a str) -> Option<(Decimal<'a>, &'a str)> {
        let end = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
        let (number, rest) = s.split_at(end);
        let (int, frac) = match number.split_once('.') {
            Some((_, frac)) if frac.contains('.') => return None,
            Some((int, frac)) => (int, frac),
            None => (number, ""),
        };
        if int.is_empty() && frac.is_empty() {
            return None;
        }
        Some((Decimal { int: int.trim_start_matches('0'), frac: frac.trim_end_matches('0') }, rest))
    }

    /// The exact value of `self * 10^pow10 * 2^pow2`, if it is a whole number that fits
    /// in a `u64`.
    pub(crate) fn scale(self, pow10: u32, pow2: u32) -> Result<u64, ScaleError> {
        // Scaling only ever multiplies, so an integer part that is already too long
        // overflows (u64::MAX has 20 digits).
        if self.int.len() > 20 {
            return Err(ScaleError::Overflow);
        }
        // With k fraction digits, the last one non-zero, the value is m / 10^k with m not a
        // multiple of 10; m * 10^pow10 * 2^pow2 / 10^k is whole only if k <= pow10 + pow2.
        let too_precise = u32::try_from(self.frac.len()).map_or(true, |k| k > pow10 + pow2);
        if too_precise {
            return Err(ScaleError::NotWhole);
        }
        // Most significant digit first; `point` digits stand before the decimal point.
        let mut digits: Vec<u8> = self.int.bytes().chain(self.frac.bytes()).map(|b| b - b'0').collect();
        let mut point = self.int.len() + pow10 as usize;
        if digits.len() < point {
            digits.resize(point, 0);
        }
        // Multiply by 2^pow2, up to 2^16 at a time (digit * 2^16 + carry fits easily).
        let mut remaining = pow2;
        while remaining > 0 {
            let step = remaining.min(16);
            remaining -= step;
            let mut carry = 0u32;
            for d in digits.iter_mut().rev() {
                let v = (u32::from(*d) << step) + carry;
                *d = u8::try_from(v % 10).expect("a decimal digit");
                carry = v / 10;
            }
            while carry > 0 {
                digits.insert(0, u8::try_from(carry % 10).expect("a decimal digit"));
                carry /= 10;
                point += 1;
            }
        }
        if digits[point..].iter().any(|&d| d != 0) {
            return Err(ScaleError::NotWhole);
        }
        digits[..point].iter().try_fold(0u64, |acc, &d| {
            acc.checked_mul(10).and_then(|v| v.checked_add(u64::from(d))).ok_or(ScaleError::Overflow)
        })
    }
}

impl FromStr for Rate {
    type Err = ParseRateError;

    fn from_str(s: &str) -> Result<Rate, ParseRateError> {
        let text = s.trim();
        if text.is_empty() {
            return Err(ParseRateError::Empty);
        }
        if text.ends_with('%') {
            return Err(ParseRateError::PercentNeedsParent { input: s.to_owned() });
        }
        if text.starts_with('-') {
            return Err(ParseRateError::Negative { input: s.to_owned() });
        }
        let Some((number, unit)) = Decimal::split_prefix(text) else {
            return Err(ParseRateError::InvalidNumber { input: s.to_owned() });
        };
        let unit = unit.trim_start();
        let unit = if unit.is_empty() {
            &UNITS[0]
        } else {
            UNITS
                .iter()
                .find(|u| u.name.eq_ignore_ascii_case(unit))
                .ok_or_else(|| ParseRateError::UnknownUnit { input: s.to_owned(), unit: unit.to_owned() })?
        };
        match number.scale(unit.pow10, unit.pow2) {
            Ok(bits) => Ok(Rate(bits)),
            Err(ScaleError::NotWhole) => Err(ParseRateError::NotWhole { input: s.to_owned() }),
            Err(ScaleError::Overflow) => Err(ParseRateError::Overflow { input: s.to_owned() }),
        }
    }
}

/// Writes `value / 10^decimals` exactly, without trailing zeros in the fraction.
fn write_fixed(out: &mut String, value: u64, decimals: u32) {
    use fmt::Write as _;
    let scale = 10u64.pow(decimals);
    let (int, frac) = (value / scale, value % scale);
    // Writing to a String cannot fail.
    let _ = write!(out, "{int}");
    if frac != 0 {
        let width = decimals as usize;
        let frac = format!("{frac:0width$}");
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
}

impl fmt::Display for Rate {
    /// The shortest exact spelling among `bit`, `kbit`, `mbit`, `gbit` and `tbit`; on a tie,
    /// the smaller unit (`"1500bit"` rather than `"1.5kbit"`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut best = String::new();
        for unit in UNITS.iter().take(5) {
            let mut candidate = String::new();
            write_fixed(&mut candidate, self.0, unit.pow10);
            candidate.push_str(unit.name);
            if best.is_empty() || candidate.len() < best.len() {
                best = candidate;
            }
        }
        f.pad(&best)
    }
}

impl Serialize for Rate {
    /// An integer number of bits per second.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

/// Accepts tc's spelling as a string, or a non-negative integer number of bits per second.
struct RateVisitor;

impl Visitor<'_> for RateVisitor {
    type Value = Rate;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a rate such as \"10mbit\", or an integer number of bits per second")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Rate, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Rate, E> {
        Ok(Rate(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Rate, E> {
        u64::try_from(v)
            .map(Rate)
            .map_err(|source| E::custom(format_args!("negative rate {v} ({source}); a rate is at least 0")))
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Rate, D::Error> {
        deserializer.deserialize_any(RateVisitor)
    }
}

/// What a class's `rate` or `ceil` says: an absolute rate, or a percentage of a parent rate.
///
/// ```
/// use shaper::rate::{Rate, RateSpec};
///
/// let spec: RateSpec = "12.5%".parse().unwrap();
/// assert_eq!(spec, RateSpec::Percent(1250));
/// let parent = Rate::from_bits_per_sec(8_000_000);
/// assert_eq!(spec.resolve(parent), Rate::from_bits_per_sec(1_000_000));
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum RateSpec {
    /// This rate, whatever the parent's.
    Absolute(Rate),
    /// A share of the parent's rate in basis points (hundredths of a percent):
    /// `1..=10_000`, where 10 000 is 100%.
    Percent(u32),
}

impl RateSpec {
    /// The rate this specification stands for under a parent of rate `parent`. A
    /// percentage rounds down to a whole bit per second, so that shares never add up to
    /// more than their parent.
    #[must_use]
    pub fn resolve(self, parent: Rate) -> Rate {
        match self {
            RateSpec::Absolute(rate) => rate,
            RateSpec::Percent(basis_points) => {
                let bits = u128::from(parent.0) * u128::from(basis_points) / 10_000;
                // Percentages are at most 100%; clamp anyway for hand-built values.
                Rate(u64::try_from(bits).unwrap_or(u64::MAX))
            }
        }
    }
}

impl From<Rate> for RateSpec {
    fn from(rate: Rate) -> RateSpec {
        RateSpec::Absolute(rate)
    }
}

impl FromStr for RateSpec {
    type Err = ParseRateError;

    /// Everything [`Rate`] accepts, plus `N%` with `0 < N <= 100` and at most two decimals.
    fn from_str(s: &str) -> Result<RateSpec, ParseRateError> {
        let Some(number) = s.trim().strip_suffix('%') else {
            return s.parse().map(RateSpec::Absolute);
        };
        let number = number.trim_end();
        let out_of_range = || ParseRateError::PercentOutOfRange { input: s.to_owned() };
        if number.starts_with('-') {
            return Err(out_of_range());
        }
        let (decimal, rest) =
            Decimal::split_prefix(number).ok_or_else(|| ParseRateError::InvalidNumber { input: s.to_owned() })?;
        if !rest.is_empty() {
            return Err(ParseRateError::InvalidNumber { input: s.to_owned() });
        }
        match decimal.scale(2, 0) {
            Ok(bp) => match u32::try_from(bp) {
                Ok(bp @ 1..=10_000) => Ok(RateSpec::Percent(bp)),
                _ => Err(out_of_range()),
            },
            Err(ScaleError::NotWhole) => Err(ParseRateError::PercentTooPrecise { input: s.to_owned() }),
            Err(ScaleError::Overflow) => Err(out_of_range()),
        }
    }
}

impl fmt::Display for RateSpec {
    /// The rate's spelling, or the percentage without needless decimals (`"12.5%"`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RateSpec::Absolute(rate) => rate.fmt(f),
            RateSpec::Percent(basis_points) => {
                let mut text = String::new();
                write_fixed(&mut text, u64::from(*basis_points), 2);
                text.push('%');
                f.pad(&text)
            }
        }
    }
}

/// Accepts a [`RateSpec`] spelling as a string, or an integer number of bits per second.
struct RateSpecVisitor;

impl Visitor<'_> for RateSpecVisitor {
    type Value = RateSpec;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a rate such as \"10mbit\" or a percentage such as \"25%\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<RateSpec, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<RateSpec, E> {
        RateVisitor.visit_u64(v).map(RateSpec::Absolute)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<RateSpec, E> {
        RateVisitor.visit_i64(v).map(RateSpec::Absolute)
    }
}

impl<'de> Deserialize<'de> for RateSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<RateSpec, D::Error> {
        deserializer.deserialize_any(RateSpecVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bits(s: &str) -> u64 {
        s.parse::<Rate>().unwrap_or_else(|e| panic!("{s:?} should parse: {e}")).bits_per_sec()
    }

    fn err(s: &str) -> ParseRateError {
        s.parse::<Rate>().expect_err(s)
    }

    #[test]
    fn parses_every_unit() {
        let cases: &[(&str, u64)] = &[
            ("1bit", 1),
            ("1kbit", 1_000),
            ("1mbit", 1_000_000),
            ("1gbit", 1_000_000_000),
            ("1tbit", 1_000_000_000_000),
            ("1kibit", 1 << 10),
            ("1mibit", 1 << 20),
            ("1gibit", 1 << 30),
            ("1tibit", 1 << 40),
            ("1bps", 8),
            ("1kbps", 8_000),
            ("1mbps", 8_000_000),
            ("1gbps", 8_000_000_000),
            ("1tbps", 8_000_000_000_000),
            ("1kibps", 8 << 10),
            ("1mibps", 8 << 20),
            ("1gibps", 8 << 30),
            ("1tibps", 8 << 40),
        ];
        for &(s, want) in cases {
            assert_eq!(bits(s), want, "{s}");
        }
        assert_eq!(cases.len(), UNITS.len());
    }

    #[test]
    fn bare_number_is_bits() {
        assert_eq!(bits("1500"), 1500);
        assert_eq!(bits("0"), 0);
        assert_eq!(bits("007"), 7);
    }

    #[test]
    fn units_are_case_insensitive() {
        assert_eq!(bits("10Mbit"), 10_000_000);
        assert_eq!(bits("10MBIT"), 10_000_000);
        assert_eq!(bits("1KiBps"), 8192);
        assert_eq!(bits("1MBps"), 8_000_000);
    }

    #[test]
    fn decimals_are_exact() {
        assert_eq!(bits("1.9mbit"), 1_900_000);
        assert_eq!(bits("2.9mbit"), 2_900_000);
        assert_eq!(bits("4.9mbit"), 4_900_000);
        assert_eq!(bits("0.3mbit"), 300_000);
        assert_eq!(bits(".3mbit"), 300_000);
        assert_eq!(bits("1.mbit"), 1_000_000);
        assert_eq!(bits("1.000000000000000000000000000mbit"), 1_000_000);
        assert_eq!(bits("0.001kbit"), 1);
        assert_eq!(bits("0.125bps"), 1);
        assert_eq!(bits("0.5kibit"), 512);
        assert_eq!(bits("1.5kibps"), 12_288);
        assert_eq!(bits("0.25mibit"), 262_144);
        // 2^-40 tibit is exactly one bit, and needs 40 decimals to write down.
        assert_eq!(bits("0.0000000000009094947017729282379150390625tibit"), 1);
    }

    #[test]
    fn whitespace_around_and_before_unit() {
        assert_eq!(bits(" 10mbit "), 10_000_000);
        assert_eq!(bits("10 mbit"), 10_000_000);
    }

    #[test]
    fn largest_rate() {
        assert_eq!(bits("18446744073709551615bit"), u64::MAX);
        assert_eq!(bits("18446744073709551615"), u64::MAX);
        assert!(matches!(err("18446744073709551616bit"), ParseRateError::Overflow { .. }));
        assert!(matches!(err("18446744073709552tbit"), ParseRateError::Overflow { .. }));
        assert!(matches!(err("2097152tibps"), ParseRateError::Overflow { .. }));
        assert_eq!(bits("2097151tibps"), 2_097_151 << 43);
        assert!(matches!(err("100000000000000000000000000bit"), ParseRateError::Overflow { .. }));
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(err(""), ParseRateError::Empty);
        assert_eq!(err("   "), ParseRateError::Empty);
        assert!(matches!(err("-1mbit"), ParseRateError::Negative { .. }));
        for garbage in ["mbit", "abc", ".mbit", "1.2.3mbit", "+1mbit", "0x10bit", "1e6bit"] {
            let e = err(garbage);
            assert!(
                matches!(e, ParseRateError::InvalidNumber { .. } | ParseRateError::UnknownUnit { .. }),
                "{garbage}: {e:?}"
            );
        }
        assert!(matches!(err("10mb"), ParseRateError::UnknownUnit { ref unit, .. } if unit == "mb"));
        assert!(matches!(err("0.1bit"), ParseRateError::NotWhole { .. }));
        assert!(matches!(err("0.3bps"), ParseRateError::NotWhole { .. }));
        assert!(matches!(err("1.0000001kbit"), ParseRateError::NotWhole { .. }));
        assert!(matches!(err("50%"), ParseRateError::PercentNeedsParent { .. }));
    }

    #[test]
    fn error_messages_help() {
        let unknown = err("10mb").to_string();
        assert!(unknown.contains("\"mb\""), "{unknown}");
        for unit in UNITS {
            assert!(unknown.contains(unit.name), "{unknown} lacks {}", unit.name);
        }
        let percent = err("50%").to_string();
        assert!(percent.contains("percentage") && percent.contains("parent"), "{percent}");
        assert!(err("0.1bit").to_string().contains("whole number"));
        assert!(err("-3mbit").to_string().contains("negative"));
        assert!(err("99999999999tbit").to_string().contains("too large"));
    }

    #[test]
    fn display_is_shortest_exact() {
        let cases: &[(u64, &str)] = &[
            (0, "0bit"),
            (1, "1bit"),
            (999, "999bit"),
            (1000, "1kbit"),
            (1500, "1500bit"),
            (300_000, "300kbit"),
            (1_900_000, "1.9mbit"),
            (1_500_000, "1.5mbit"),
            (10_000_000, "10mbit"),
            (12_345_678, "12345678bit"),
            (1_000_000_000, "1gbit"),
            (2_500_000_000_000, "2.5tbit"),
            (u64::MAX, "18446744073709551615bit"),
        ];
        for &(bits, want) in cases {
            assert_eq!(Rate::from_bits_per_sec(bits).to_string(), want, "{bits}");
        }
        assert_eq!(format!("[{:>8}]", Rate::from_bits_per_sec(10_000_000)), "[  10mbit]");
    }

    #[test]
    fn bytes_per_sec_rounds_to_nearest() {
        let b = |bits| Rate::from_bits_per_sec(bits).bytes_per_sec();
        assert_eq!(b(0), 0);
        assert_eq!(b(1), 1);
        assert_eq!(b(3), 1);
        assert_eq!(b(4), 1);
        assert_eq!(b(8), 1);
        assert_eq!(b(11), 1);
        assert_eq!(b(12), 2);
        assert_eq!(b(10_000_000), 1_250_000);
        assert_eq!(b(1_900_003), 237_500);
        assert_eq!(b(1_900_004), 237_501);
        assert_eq!(b(u64::MAX), u64::MAX / 8 + 1);
        assert_eq!(Rate::ZERO.bits_per_sec(), 0);
    }

    #[test]
    fn rate_spec_parses_percentages() {
        let spec = |s: &str| s.parse::<RateSpec>().unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(spec("50%"), RateSpec::Percent(5000));
        assert_eq!(spec("100%"), RateSpec::Percent(10_000));
        assert_eq!(spec("12.5%"), RateSpec::Percent(1250));
        assert_eq!(spec("0.01%"), RateSpec::Percent(1));
        assert_eq!(spec("33.330%"), RateSpec::Percent(3333));
        assert_eq!(spec(" 7 % "), RateSpec::Percent(700));
        assert_eq!(spec("1.9mbit"), RateSpec::Absolute(Rate(1_900_000)));
        let bad = |s: &str| s.parse::<RateSpec>().expect_err(s);
        for s in ["0%", "0.00%", "100.01%", "101%", "-5%", "99999999999999999999999%"] {
            assert!(matches!(bad(s), ParseRateError::PercentOutOfRange { .. }), "{s}");
        }
        assert!(matches!(bad("12.345%"), ParseRateError::PercentTooPrecise { .. }));
        assert!(matches!(bad("%"), ParseRateError::InvalidNumber { .. }));
        assert!(matches!(bad("5mbit%"), ParseRateError::InvalidNumber { .. }));
        assert!(matches!(bad("10mb"), ParseRateError::UnknownUnit { .. }));
        assert!(bad("101%").to_string().contains("at most 100%"));
    }

    #[test]
    fn rate_spec_resolves() {
        let parent = Rate(10_000_000);
        assert_eq!(RateSpec::Percent(5000).resolve(parent), Rate(5_000_000));
        assert_eq!(RateSpec::Percent(3333).resolve(parent), Rate(3_333_000));
        assert_eq!(RateSpec::Percent(1).resolve(Rate(9_999)), Rate(0), "rounds down");
        assert_eq!(RateSpec::Percent(10_000).resolve(Rate(u64::MAX)), Rate(u64::MAX));
        assert_eq!(RateSpec::Absolute(Rate(5)).resolve(parent), Rate(5));
        assert_eq!(RateSpec::from(Rate(5)), RateSpec::Absolute(Rate(5)));
    }

    #[test]
    fn rate_spec_display() {
        assert_eq!(RateSpec::Percent(1250).to_string(), "12.5%");
        assert_eq!(RateSpec::Percent(10_000).to_string(), "100%");
        assert_eq!(RateSpec::Percent(5).to_string(), "0.05%");
        assert_eq!(RateSpec::Absolute(Rate(1_900_000)).to_string(), "1.9mbit");
    }

    #[derive(serde::Deserialize, Serialize, Debug, PartialEq)]
    struct Wrapper {
        rate: Rate,
    }

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct SpecWrapper {
        rate: RateSpec,
    }

    #[test]
    fn serde_string_in_integer_out() {
        let w: Wrapper = toml::from_str("rate = \"1.9mbit\"").unwrap();
        assert_eq!(w.rate, Rate(1_900_000));
        assert_eq!(toml::to_string(&w).unwrap().trim(), "rate = 1900000");
        let back: Wrapper = toml::from_str(&toml::to_string(&w).unwrap()).unwrap();
        assert_eq!(back, w);
        let e = toml::from_str::<Wrapper>("rate = \"10mb\"").unwrap_err();
        assert!(e.message().contains("unknown unit"), "{e}");
        let e = toml::from_str::<Wrapper>("rate = -5").unwrap_err();
        assert!(e.message().contains("negative"), "{e}");
        let e = toml::from_str::<Wrapper>("rate = 1.5").unwrap_err();
        assert!(e.message().contains("10mbit"), "{e}");

        let s: SpecWrapper = toml::from_str("rate = \"25%\"").unwrap();
        assert_eq!(s.rate, RateSpec::Percent(2500));
        let s: SpecWrapper = toml::from_str("rate = \"3kbit\"").unwrap();
        assert_eq!(s.rate, RateSpec::Absolute(Rate(3000)));
        let s: SpecWrapper = toml::from_str("rate = 3000").unwrap();
        assert_eq!(s.rate, RateSpec::Absolute(Rate(3000)));
        let e = toml::from_str::<SpecWrapper>("rate = \"0%\"").unwrap_err();
        assert!(e.message().contains("out of range"), "{e}");
    }

    /// The exact value of `int.frac` in `unit`, when it is whole and fits.
    fn reference(int: u64, frac: &str, unit: &Unit) -> Option<u64> {
        let k = u32::try_from(frac.len()).unwrap();
        let frac_value: u128 = if frac.is_empty() { 0 } else { frac.parse().unwrap() };
        let mantissa = u128::from(int) * 10u128.pow(k) + frac_value;
        let scaled = mantissa * 10u128.pow(unit.pow10) * (1u128 << unit.pow2);
        let divisor = 10u128.pow(k);
        if !scaled.is_multiple_of(divisor) {
            return None;
        }
        u64::try_from(scaled / divisor).ok()
    }

    proptest! {
        #[test]
        fn display_round_trips(bits in any::<u64>()) {
            let r = Rate::from_bits_per_sec(bits);
            prop_assert_eq!(r.to_string().parse::<Rate>(), Ok(r));
        }

        #[test]
        fn display_round_trips_round_numbers(mantissa in 0u64..100_000, exp in 0u32..15) {
            let r = Rate::from_bits_per_sec(mantissa.saturating_mul(10u64.pow(exp)));
            let text = r.to_string();
            prop_assert_eq!(text.parse::<Rate>(), Ok(r));
            // Never longer than the plain number of bits.
            let plain = format!("{}bit", r.bits_per_sec());
            prop_assert!(text.len() <= plain.len(), "{} longer than {}", text, plain);
        }

        #[test]
        fn parse_matches_exact_arithmetic(
            int in 0u64..1_000_000,
            frac in "[0-9]{0,7}",
            unit in 0usize..UNITS.len(),
            upper in any::<bool>(),
        ) {
            let unit = &UNITS[unit];
            let name = if upper { unit.name.to_uppercase() } else { unit.name.to_owned() };
            let text = if frac.is_empty() { format!("{int}{name}") } else { format!("{int}.{frac}{name}") };
            match (reference(int, &frac, unit), text.parse::<Rate>()) {
                (Some(want), Ok(got)) => prop_assert_eq!(got.bits_per_sec(), want),
                (None, Err(ParseRateError::NotWhole { .. })) => {}
                (want, got) => prop_assert!(false, "{}: want {:?}, got {:?}", text, want, got),
            }
        }

        #[test]
        fn rate_spec_round_trips(bp in 1u32..=10_000, bits in any::<u64>(), percent in any::<bool>()) {
            let spec = if percent { RateSpec::Percent(bp) } else { RateSpec::Absolute(Rate(bits)) };
            prop_assert_eq!(spec.to_string().parse::<RateSpec>(), Ok(spec));
        }

        #[test]
        fn percent_never_exceeds_parent(bp in 1u32..=10_000, bits in any::<u64>()) {
            let parent = Rate(bits);
            prop_assert!(RateSpec::Percent(bp).resolve(parent) <= parent);
        }

        #[test]
        fn bytes_per_sec_is_nearest(bits in any::<u64>()) {
            let bytes = Rate(bits).bytes_per_sec();
            let exact = u128::from(bits);
            let approx = u128::from(bytes) * 8;
            prop_assert!(approx.abs_diff(exact) <= 4 || (bits > 0 && bits < 4 && bytes == 1));
            prop_assert_eq!(bytes == 0, bits == 0);
        }
    }
}
