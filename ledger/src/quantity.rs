//! Memory quantities as operators write them ("4Gi", "4096Mi", "4G") and as people read them ("1.00 GiB").
//!
//! Every unit is binary. The single letters `k`/`m`/`g`/`t` mean KiB/MiB/GiB/TiB, as HAMi-core's
//! `CUDA_DEVICE_MEMORY_LIMIT` does (so "4G" is 4 GiB and "512m" is 512 MiB, never milli); `Ki`/`Mi`/`Gi`/`Ti`
//! (Kubernetes style) and `KiB`/`MiB`/`GiB`/`TiB` mean the same; a bare number or a `B` suffix is bytes.
//! Units are case-insensitive. Decimal units (`GB`, `MB`, ...) are refused rather than guessed: "4GB" means
//! 4·10⁹ to some people and 4 GiB to others, and a quota must not be off by 7 % silently.
//! A fraction is allowed ("1.5Gi"); the result is rounded down to whole bytes.

/// Why a quantity could not be parsed. Its `Display` names the input and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", describe(input, problem))]
pub struct QuantityError {
    input: String,
    problem: QuantityProblem,
}

/// What is wrong with a quantity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantityProblem {
    Empty,
    Negative,
    NoNumber,
    BadNumber,
    /// The unit as written.
    UnknownUnit(String),
    /// A decimal unit (`GB`), as written.
    DecimalUnit(String),
    Overflow,
}

impl QuantityError {
    /// The text that was parsed.
    pub fn input(&self) -> &str {
        &self.input
    }

    pub fn problem(&self) -> &QuantityProblem {
        &self.problem
    }
}

fn describe(input: &str, problem: &QuantityProblem) -> String {
    match problem {
        QuantityProblem::Empty => "empty memory quantity (expected e.g. 4Gi, 512Mi, 4G)".to_string(),
        QuantityProblem::Negative => format!("memory quantity {input:?} is negative"),
        QuantityProblem::NoNumber => format!("memory quantity {input:?} does not start with a number"),
        QuantityProblem::BadNumber => format!("memory quantity {input:?} has a malformed number"),
        QuantityProblem::UnknownUnit(u) => format!(
            "memory quantity {input:?} has unknown unit {u:?} (use B, K/Ki/KiB, M/Mi/MiB, G/Gi/GiB, T/Ti/TiB, P/Pi/PiB; all binary)"
        ),
        QuantityProblem::DecimalUnit(u) => format!(
            "memory quantity {input:?} uses decimal unit {u:?}; vgpu units are binary: write {}i (or {}) for {}iB",
            &u[..1],
            &u[..1],
            u[..1].to_ascii_uppercase()
        ),
        QuantityProblem::Overflow => format!("memory quantity {input:?} is too large (over 16 EiB)"),
    }
}

/// The multiplier of a unit suffix (already trimmed), or the problem with it.
fn unit_multiplier(unit: &str) -> Result<u64, QuantityProblem> {
    let lower = unit.to_ascii_lowercase();
    let shift = match lower.as_str() {
        "" | "b" => 0,
        "k" | "ki" | "kib" => 10,
        "m" | "mi" | "mib" => 20,
        "g" | "gi" | "gib" => 30,
        "t" | "ti" | "tib" => 40,
        "p" | "pi" | "pib" => 50,
        "e" | "ei" | "eib" => 60,
        "kb" | "mb" | "gb" | "tb" | "pb" | "eb" => {
            return Err(QuantityProblem::DecimalUnit(unit.to_string()))
        }
        _ => return Err(QuantityProblem::UnknownUnit(unit.to_string())),
    };
    Ok(1u64 << shift)
}

/// Parse a memory quantity into bytes. Zero parses to 0: whether zero means "no limit" or is an error is
/// the caller's decision.
pub fn parse_quantity(s: &str) -> Result<u64, QuantityError> {
    let err = |problem| QuantityError {
        input: s.to_string(),
        problem,
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(err(QuantityProblem::Empty));
    }
    if t.starts_with('-') {
        return Err(err(QuantityProblem::Negative));
    }
    let t = t.strip_prefix('+').unwrap_or(t);
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(num_end);
    if number.is_empty() {
        return Err(err(QuantityProblem::NoNumber));
    }
    let multiplier = unit_multiplier(unit.trim()).map_err(err)?;

    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(err(QuantityProblem::BadNumber));
    }
    // Integer part × multiplier, checked; the fraction adds floor(frac × multiplier / 10^digits).
    let int: u64 = if int_part.is_empty() {
        0
    } else {
        int_part
            .parse()
            .map_err(|_| err(QuantityProblem::Overflow))?
    };
    let whole = int
        .checked_mul(multiplier)
        .ok_or_else(|| err(QuantityProblem::Overflow))?;
    // Digits beyond 19 cannot change a result in whole bytes below 2^64 by more than rounding; drop them.
    let frac_digits = &frac_part[..frac_part.len().min(19)];
    let frac_bytes = if frac_digits.is_empty() {
        0
    } else {
        let frac: u128 = frac_digits
            .parse()
            .map_err(|_| err(QuantityProblem::BadNumber))?;
        let scale = 10u128.pow(frac_digits.len() as u32);
        (frac * multiplier as u128 / scale) as u64
    };
    whole
        .checked_add(frac_bytes)
        .ok_or_else(|| err(QuantityProblem::Overflow))
}

/// Human-readable bytes with three significant digits: "0 B", "1023 B", "1.50 KiB", "512 MiB", "1.00 GiB".
pub fn format_bytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut unit = 0;
    let mut value = n as f64;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    let text = if value < 10.0 {
        format!("{value:.2}")
    } else if value < 100.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    };
    format!("{text} {}", UNITS[unit])
}

/// The smallest memory quota vgpu accepts: 64 MiB, a floor rather than a measurement. A CUDA context alone
/// takes more (some 300 to 500 MiB on current GPUs), so a smaller quota could never run CUDA and is a mistake
/// (`1` meant as `1G`, `0.0000001Gi`). The hook refuses one in annotations and env, the library in its
/// environment (`vgpu_ledger::envlimits`); `0` in the environment still means "no limit".
pub const MIN_QUOTA: u64 = 64 << 20;

/// A quota below [`MIN_QUOTA`]. `Display` is the reason, worded to end a line that names the setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{} is below the smallest quota vgpu accepts, {} (no CUDA context fits in less)", format_bytes(*.bytes), format_bytes(MIN_QUOTA))]
pub struct BelowFloor {
    /// The quota asked for.
    pub bytes: u64,
}

/// Refuses a quota of `bytes` below [`MIN_QUOTA`] (callers decide what 0 means first).
pub fn check_min_quota(bytes: u64) -> Result<(), BelowFloor> {
    if bytes < MIN_QUOTA {
        return Err(BelowFloor { bytes });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_quota_floor() {
        assert_eq!(MIN_QUOTA, 64 << 20);
        assert!(check_min_quota(MIN_QUOTA).is_ok());
        assert_eq!(check_min_quota(1), Err(BelowFloor { bytes: 1 }));
        // The message is the contract: it ends the one line that names the setting.
        assert_eq!(
            check_min_quota(1).unwrap_err().to_string(),
            "1 B is below the smallest quota vgpu accepts, 64.0 MiB (no CUDA context fits in less)"
        );
        assert!(check_min_quota(MIN_QUOTA - 1).is_err());
    }

    const KI: u64 = 1 << 10;
    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;
    const TI: u64 = 1 << 40;

    #[test]
    fn parses_every_spelling() {
        let cases: &[(&str, u64)] = &[
            ("4Gi", 4 * GI),
            ("4096Mi", 4096 * MI),
            ("4G", 4 * GI),
            ("4g", 4 * GI),
            ("4GiB", 4 * GI),
            ("4gib", 4 * GI),
            ("512m", 512 * MI),
            ("512M", 512 * MI),
            ("512MiB", 512 * MI),
            ("1073741824", GI),
            ("1073741824B", GI),
            ("1k", KI),
            ("2Ki", 2 * KI),
            ("1T", TI),
            ("1Ti", TI),
            ("1.5Gi", GI + GI / 2),
            ("0.5G", GI / 2),
            (".5Mi", MI / 2),
            ("1.", 1),
            ("0.1Ki", 102), // 102.4 rounded down
            (" 4Gi ", 4 * GI),
            ("4 Gi", 4 * GI),
            ("+1Mi", MI),
            ("0", 0),
            ("0Gi", 0),
        ];
        for (input, want) in cases {
            assert_eq!(parse_quantity(input), Ok(*want), "input {input:?}");
        }
    }

    #[test]
    fn errors_say_what_is_wrong() {
        use QuantityProblem::*;
        let problem = |s: &str| parse_quantity(s).unwrap_err().problem().clone();
        assert_eq!(problem("4GB"), DecimalUnit("GB".into()));
        assert_eq!(problem("4X"), UnknownUnit("X".into()));
        assert_eq!(problem("4Gix"), UnknownUnit("Gix".into()));
        assert_eq!(problem(""), Empty);
        assert_eq!(problem("   "), Empty);
        assert_eq!(problem("-1Gi"), Negative);
        assert_eq!(problem("Gi"), NoNumber);
        assert_eq!(problem("1.2.3Gi"), BadNumber);
        assert_eq!(problem(".Gi"), BadNumber);
        assert_eq!(problem("99999999999999999999"), Overflow);
        assert_eq!(problem("16777216Ti"), Overflow); // 2^24 TiB = 2^64
        assert_eq!(problem("17179869184G"), Overflow);
        assert_eq!(parse_quantity(" 4GB").unwrap_err().input(), " 4GB");
    }

    #[test]
    fn the_decimal_unit_message_names_input_and_the_binary_spelling() {
        // The message is the contract here: one line an operator can act on.
        assert_eq!(
            parse_quantity("4GB").unwrap_err().to_string(),
            "memory quantity \"4GB\" uses decimal unit \"GB\"; vgpu units are binary: write Gi (or G) for GiB"
        );
    }

    #[test]
    fn largest_values() {
        assert_eq!(parse_quantity("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_quantity("16777215Ti"), Ok(16777215 * TI));
        assert!(parse_quantity("18446744073709551616").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1024), "1.00 KiB");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(512 * MI), "512 MiB");
        assert_eq!(format_bytes(GI), "1.00 GiB");
        assert_eq!(format_bytes(80 * GI), "80.0 GiB");
        assert_eq!(format_bytes(u64::MAX), "16.0 EiB");
    }

    proptest! {
        #[test]
        fn integer_with_unit_round_trips(n in 0u64..(1 << 20), unit in 0usize..5, spelling in 0usize..3) {
            let names = [["", "B", "b"], ["k", "Ki", "KiB"], ["m", "Mi", "MiB"], ["g", "Gi", "GiB"], ["t", "Ti", "TiB"]];
            let text = format!("{n}{}", names[unit][spelling]);
            prop_assert_eq!(parse_quantity(&text), Ok(n << (10 * unit)));
        }

        #[test]
        fn plain_bytes_round_trip(n: u64) {
            prop_assert_eq!(parse_quantity(&n.to_string()), Ok(n));
        }

        #[test]
        fn formatted_parses_back_within_rounding(n in 1u64..(1 << 62)) {
            let text = format_bytes(n);
            let back = parse_quantity(&text).unwrap();
            // three significant digits: relative error at most half a unit in the third digit
            let err = (back as f64 - n as f64).abs() / n as f64;
            prop_assert!(err <= 0.005 + 1e-12, "{} -> {} -> {} (err {})", n, text, back, err);
        }

        #[test]
        fn never_panics(s in "\\PC{0,24}") {
            let _ = parse_quantity(&s);
        }
    }
}
