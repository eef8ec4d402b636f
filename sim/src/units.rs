//! Human-readable quantities: byte sizes (`40GiB`, `80GB`) and grouped digits.

/// Parses a byte size: a number with an optional unit, `B`, decimal `KB`,
/// `MB`, `GB`, `TB` (powers of 1000) or binary `KiB`, `MiB`, `GiB`, `TiB`
/// (powers of 1024). Units are case-insensitive, spaces around them are
/// allowed, and fractions round down to whole bytes: `40GiB`, `1.5 TB`,
/// `512mib`, `1000`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().map_err(|_| {
        format!("invalid size {text:?}: expected a number and a unit, like 40GiB or 80GB")
    })?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        other => {
            return Err(format!(
                "invalid size {text:?}: unknown unit {other:?} (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"
            ))
        }
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("invalid size {text:?}: too large"));
    }
    Ok(bytes as u64)
}

/// Formats bytes in binary units with one decimal: `40.0 GiB`, `512.0 MiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Bytes in GiB, as a float.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / 1024f64.powi(3)
}

/// An integer with thousands separators: `1,048,576`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_decimal_and_binary_units() {
        assert_eq!(parse_bytes("40GiB"), Ok(40 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("80GB"), Ok(80_000_000_000));
        assert_eq!(parse_bytes("1.5 tb"), Ok(1_500_000_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes(" 2 KiB "), Ok(2048));
    }

    #[test]
    fn bad_sizes_say_why() {
        assert!(parse_bytes("40 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_bytes("GiB")
            .unwrap_err()
            .contains("expected a number"));
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("-1GB").is_err());
        assert!(parse_bytes("1.2.3GB").is_err());
        assert!(parse_bytes("99999999999TiB")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn formatting() {
        assert_eq!(format_bytes(40 << 30), "40.0 GiB");
        assert_eq!(format_bytes(1000), "1000 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_048_576), "1,048,576");
    }
}
