//! The quantities of a link spec — durations, bit rates, sizes and percentages — parsed from
//! and formatted to text exactly (integer arithmetic, no floating-point rounding), so that a
//! config printed with `Display` parses back to the same value.
//!
//! Units follow `tc`: rates are decimal (`kbit` = 1000 bit/s), sizes are binary (`kb` = 1024
//! bytes).

use std::time::Duration;

use thiserror::Error;

/// Why a value in a spec could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ValueError {
    /// The text is not a plain decimal number (digits with at most one `.`).
    #[error("`{0}` is not a decimal number")]
    NotANumber(String),
    /// A number without its unit.
    #[error("missing unit (use one of: {expected})")]
    MissingUnit {
        /// The units accepted here.
        expected: &'static str,
    },
    /// A unit that is not accepted here.
    #[error("unknown unit `{unit}` (use one of: {expected})")]
    UnknownUnit {
        /// What was given.
        unit: String,
        /// The units accepted here.
        expected: &'static str,
    },
    /// More decimals than the unit's resolution (durations: 1 ns; rates: 1 bit/s; sizes: 1 byte).
    #[error("`{0}` is finer than the resolution of its unit")]
    TooPrecise(String),
    /// A value that does not fit the field.
    #[error("`{0}` is too large")]
    TooLarge(String),
    /// A probability written without `%`.
    #[error("`{0}` needs a % suffix, e.g. 0.1%")]
    NeedsPercent(String),
    /// A percentage above 100 %.
    #[error("`{0}` is above 100%")]
    AboveHundredPercent(String),
}

const DURATION_UNITS: &str = "ns, us, ms, s";
const RATE_UNITS: &str = "bit, kbit, mbit, gbit";
const SIZE_UNITS: &str = "b, kb, mb";

/// Parses a non-negative decimal `int[.frac]` and scales it by `10^scale`, exactly.
/// Returns `TooPrecise` if the scaled value is not an integer.
fn parse_scaled_decimal(text: &str, scale: u32) -> Result<u128, ValueError> {
    let not_a_number = || ValueError::NotANumber(text.to_owned());
    let (int_part, frac_part) = match text.split_once('.') {
        Some((i, f)) => (i, f),
        None => (text, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(not_a_number());
    }
    if !int_part.bytes().all(|b| b.is_ascii_digit())
        || !frac_part.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(not_a_number());
    }
    let too_large = || ValueError::TooLarge(text.to_owned());
    let mut value: u128 = 0;
    for digit in int_part.bytes() {
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u128::from(digit - b'0')))
            .ok_or_else(too_large)?;
    }
    let frac_significant = frac_part.trim_end_matches('0');
    if frac_significant.len() > scale as usize {
        return Err(ValueError::TooPrecise(text.to_owned()));
    }
    value = value.checked_mul(10u128.pow(scale)).ok_or_else(too_large)?;
    let mut frac_value: u128 = 0;
    for digit in frac_significant.bytes() {
        frac_value = frac_value * 10 + u128::from(digit - b'0');
    }
    frac_value *= 10u128.pow(scale - frac_significant.len() as u32);
    value.checked_add(frac_value).ok_or_else(too_large)
}

/// Splits `12.5ms` into (`12.5`, `ms`).
fn split_number_unit(text: &str) -> (&str, &str) {
    // The unit starts at the first letter; whatever precedes it must be the number.
    let end = text.find(|c: char| c.is_alphabetic()).unwrap_or(text.len());
    text.split_at(end)
}

/// Parses a duration such as `35ms`, `1.5s`, `250us`, `100ns` (a unit is required).
pub fn parse_duration(text: &str) -> Result<Duration, ValueError> {
    let (number, unit) = split_number_unit(text.trim());
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" => {
            return Err(ValueError::MissingUnit {
                expected: DURATION_UNITS,
            });
        }
        "ns" => 0,
        "us" | "µs" => 3,
        "ms" => 6,
        "s" => 9,
        _ => {
            return Err(ValueError::UnknownUnit {
                unit: unit.to_owned(),
                expected: DURATION_UNITS,
            });
        }
    };
    let nanos = parse_scaled_decimal(number, scale)?;
    let nanos = u64::try_from(nanos).map_err(|_| ValueError::TooLarge(text.to_owned()))?;
    Ok(Duration::from_nanos(nanos))
}

/// Formats a duration in the largest unit that represents it exactly (`1500ms`, `20us`, `0ms`).
pub fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos == 0 {
        return "0ms".to_owned();
    }
    for (unit, per) in [("s", 1_000_000_000u128), ("ms", 1_000_000), ("us", 1_000)] {
        if nanos.is_multiple_of(per) {
            return format!("{}{unit}", nanos / per);
        }
    }
    format!("{nanos}ns")
}

/// Parses a bit rate such as `8mbit`, `1.5mbit`, `64kbit`, `1gbit`, `9600bit` into bits/s.
pub fn parse_rate(text: &str) -> Result<u64, ValueError> {
    let (number, unit) = split_number_unit(text.trim());
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" => {
            return Err(ValueError::MissingUnit {
                expected: RATE_UNITS,
            });
        }
        "bit" => 0,
        "kbit" => 3,
        "mbit" => 6,
        "gbit" => 9,
        _ => {
            return Err(ValueError::UnknownUnit {
                unit: unit.to_owned(),
                expected: RATE_UNITS,
            });
        }
    };
    let bits = parse_scaled_decimal(number, scale)?;
    u64::try_from(bits).map_err(|_| ValueError::TooLarge(text.to_owned()))
}

/// Formats bits/s in the largest decimal unit that represents it exactly (`8mbit`).
pub fn format_rate(bits_per_second: u64) -> String {
    for (unit, per) in [
        ("gbit", 1_000_000_000u64),
        ("mbit", 1_000_000),
        ("kbit", 1_000),
    ] {
        if bits_per_second != 0 && bits_per_second.is_multiple_of(per) {
            return format!("{}{unit}", bits_per_second / per);
        }
    }
    format!("{bits_per_second}bit")
}

/// Parses a size in bytes such as `64kb` (65 536), `1mb`, `1500b`. Binary multiples, as in `tc`.
pub fn parse_size(text: &str) -> Result<u64, ValueError> {
    let (number, unit) = split_number_unit(text.trim());
    let multiplier: u128 = match unit.to_ascii_lowercase().as_str() {
        "" => {
            return Err(ValueError::MissingUnit {
                expected: SIZE_UNITS,
            });
        }
        "b" => 1,
        "kb" | "kib" => 1024,
        "mb" | "mib" => 1024 * 1024,
        _ => {
            return Err(ValueError::UnknownUnit {
                unit: unit.to_owned(),
                expected: SIZE_UNITS,
            });
        }
    };
    // Allow `1.5kb` when it is a whole number of bytes.
    let thousandths = parse_scaled_decimal(number, 3)?;
    let scaled = thousandths
        .checked_mul(multiplier)
        .ok_or_else(|| ValueError::TooLarge(text.to_owned()))?;
    if scaled % 1000 != 0 {
        return Err(ValueError::TooPrecise(text.to_owned()));
    }
    u64::try_from(scaled / 1000).map_err(|_| ValueError::TooLarge(text.to_owned()))
}

/// Formats a byte count in the largest binary unit that represents it exactly (`64kb`, `1500b`).
pub fn format_size(bytes: u64) -> String {
    for (unit, per) in [("mb", 1024 * 1024u64), ("kb", 1024)] {
        if bytes != 0 && bytes.is_multiple_of(per) {
            return format!("{}{unit}", bytes / per);
        }
    }
    format!("{bytes}b")
}

/// Parses a percentage such as `0.1%` into the probability 0.001.
///
/// The decimal point is moved as text and then parsed once, so the result is the `f64` nearest
/// to the exact decimal value (and [`format_percent`] reproduces the text).
pub fn parse_percent(text: &str) -> Result<f64, ValueError> {
    let text = text.trim();
    let Some(number) = text.strip_suffix('%') else {
        return Err(ValueError::NeedsPercent(text.to_owned()));
    };
    let not_a_number = || ValueError::NotANumber(text.to_owned());
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if (int_part.is_empty() && frac_part.is_empty())
        || !int_part.bytes().all(|b| b.is_ascii_digit())
        || !frac_part.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(not_a_number());
    }
    // number / 100: pad the integer part to at least two digits and move the point left by two.
    let padded = format!("{int_part:0>2}");
    let (whole, moved) = padded.split_at(padded.len() - 2);
    let whole = if whole.is_empty() { "0" } else { whole };
    let decimal = format!("{whole}.{moved}{frac_part}");
    let probability: f64 = decimal.parse().map_err(|_| not_a_number())?;
    if probability > 1.0 {
        return Err(ValueError::AboveHundredPercent(text.to_owned()));
    }
    Ok(probability)
}

/// Formats a probability as a percentage (`0.001` → `0.1%`), exactly reversible by
/// [`parse_percent`] for every probability in `[0, 1]`.
pub fn format_percent(probability: f64) -> String {
    // Rust prints the shortest decimal that parses back to the same f64, never in exponent
    // form; moving the point right by two as text keeps that property.
    let text = format!("{probability}");
    let (int_part, frac_part) = text.split_once('.').unwrap_or((&text, ""));
    let frac_padded = format!("{frac_part:0<2}");
    let (moved, rest) = frac_padded.split_at(2);
    let whole = format!("{int_part}{moved}");
    let whole = whole.trim_start_matches('0');
    let whole = if whole.is_empty() { "0" } else { whole };
    let rest = rest.trim_end_matches('0');
    if rest.is_empty() {
        format!("{whole}%")
    } else {
        format!("{whole}.{rest}%")
    }
}

/// Serde support: a [`Duration`] as a string such as `"35ms"`.
pub mod serde_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    /// Serializes as [`super::format_duration`] text.
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::format_duration(*duration))
    }

    /// Deserializes [`super::parse_duration`] text.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::parse_duration(&text).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_exactly() {
        assert_eq!(parse_duration("35ms"), Ok(Duration::from_millis(35)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0.000000001s"), Ok(Duration::from_nanos(1)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("7ns"), Ok(Duration::from_nanos(7)));
        assert_eq!(parse_duration("2MS"), Ok(Duration::from_millis(2)));
        assert_eq!(parse_duration(".5ms"), Ok(Duration::from_micros(500)));
        assert!(matches!(
            parse_duration("35"),
            Err(ValueError::MissingUnit { .. })
        ));
        assert!(matches!(
            parse_duration("35min"),
            Err(ValueError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_duration("1.5ns"),
            Err(ValueError::TooPrecise(_))
        ));
        assert!(matches!(
            parse_duration("-1ms"),
            Err(ValueError::NotANumber(_))
        ));
        assert!(matches!(
            parse_duration("1.2.3ms"),
            Err(ValueError::NotANumber(_))
        ));
        assert!(matches!(
            parse_duration("ms"),
            Err(ValueError::NotANumber(_))
        ));
        assert!(matches!(
            parse_duration("99999999999999999999s"),
            Err(ValueError::TooLarge(_))
        ));
    }

    #[test]
    fn durations_round_trip() {
        for nanos in [
            0u64,
            1,
            999,
            1_000,
            20_000_000,
            1_500_000_000,
            3_000_000_001,
        ] {
            let d = Duration::from_nanos(nanos);
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{nanos}");
        }
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn rates_and_sizes() {
        assert_eq!(parse_rate("8mbit"), Ok(8_000_000));
        assert_eq!(parse_rate("1.5mbit"), Ok(1_500_000));
        assert_eq!(parse_rate("9600bit"), Ok(9600));
        assert!(matches!(
            parse_rate("8mbps"),
            Err(ValueError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_rate("0.5bit"),
            Err(ValueError::TooPrecise(_))
        ));
        assert_eq!(format_rate(8_000_000), "8mbit");
        assert_eq!(format_rate(1_500_000), "1500kbit");
        assert_eq!(format_rate(1), "1bit");
        assert_eq!(parse_size("64kb"), Ok(65_536));
        assert_eq!(parse_size("1.5kb"), Ok(1536));
        assert_eq!(parse_size("1500b"), Ok(1500));
        assert_eq!(parse_size("2mb"), Ok(2 * 1024 * 1024));
        assert!(matches!(
            parse_size("1.0001kb"),
            Err(ValueError::TooPrecise(_))
        ));
        assert!(matches!(
            parse_size("12"),
            Err(ValueError::MissingUnit { .. })
        ));
        for bytes in [1u64, 1500, 65_536, 3 * 1024 * 1024, 1025] {
            assert_eq!(parse_size(&format_size(bytes)), Ok(bytes));
        }
    }

    #[test]
    fn percentages_round_trip() {
        assert_eq!(parse_percent("0.1%"), Ok(0.001));
        assert_eq!(parse_percent("30%"), Ok(0.3));
        assert_eq!(parse_percent("100%"), Ok(1.0));
        assert_eq!(parse_percent("5%"), Ok(0.05));
        assert_eq!(parse_percent(".5%"), Ok(0.005));
        assert!(matches!(
            parse_percent("0.1"),
            Err(ValueError::NeedsPercent(_))
        ));
        assert!(matches!(
            parse_percent("101%"),
            Err(ValueError::AboveHundredPercent(_))
        ));
        assert!(matches!(
            parse_percent("x%"),
            Err(ValueError::NotANumber(_))
        ));
        assert_eq!(format_percent(0.001), "0.1%");
        assert_eq!(format_percent(1.0), "100%");
        assert_eq!(format_percent(0.0), "0%");
        assert_eq!(format_percent(0.3), "30%");
        for p in [0.0, 1e-9, 0.001, 0.0125, 0.3, 0.5, 0.999, 1.0, 1.0 / 3.0] {
            assert_eq!(parse_percent(&format_percent(p)), Ok(p), "{p}");
        }
    }
}
