//! Human sizes on the command line: `4096`, `512K`, `64M`, `1G`, `2T` (binary units).

/// Parses a size in bytes with an optional K/M/G/T suffix (powers of 1024,
/// an optional trailing `B` or `iB` is accepted).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|e| format!("'{text}' is not a size ({e}): use a number of bytes with an optional K, M, G or T suffix (e.g. 1G)"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("'{text}' is too large"))
}

/// Formats a byte count the way nvme-cli does ("1.07 GB"), decimal units.
pub fn human_decimal(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1000.0 && i + 1 < UNITS.len() {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
    }

    #[test]
    fn bad_sizes_say_what_is_expected() {
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn decimal_sizes_read_like_nvme_cli() {
        assert_eq!(human_decimal(1 << 30), "1.07 GB");
        assert_eq!(human_decimal(512), "512 B");
    }
}
