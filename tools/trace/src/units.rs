//! Byte counts as a user writes them (`8MiB`, `512K`, `1073741824`) and as the tool prints them.
//!
//! Owns parsing of sizes and counts on the command line and the printing of byte counts in the
//! human report (through the core's [`ReadableBytes`]).

use devcmd::memory::ReadableBytes;

/// Bytes in a MiB.
pub const MIB: u64 = 1 << 20;
/// Bytes in a GiB.
pub const GIB: u64 = 1 << 30;

/// Parses a byte count: a whole number with an optional binary unit (`B`, `K`/`KiB`, `M`/`MiB`,
/// `G`/`GiB`, `T`/`TiB`, case-insensitive; `KB`, `MB`, ... are read as binary units too).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let scale: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "{text:?} is not a byte count (e.g. 4096, 64KiB, 8MiB, 2GiB)"
            ));
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count (e.g. 4096, 64KiB, 8MiB, 2GiB)"))?;
    n.checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large a byte count"))
}

/// Parses a whole number (a count).
pub fn parse_count(text: &str) -> Result<u64, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number"))
}

/// A byte count for people: `1.50 GiB`, `12 MiB`, `100 B`.
pub fn bytes(n: u64) -> String {
    ReadableBytes(n).to_string()
}

/// A ratio with two decimals, or `-` when the denominator is 0.
pub fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64KiB"), Ok(64 << 10));
        assert_eq!(parse_bytes("8 MiB"), Ok(8 << 20));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        assert!(parse_bytes("12x").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }
}
