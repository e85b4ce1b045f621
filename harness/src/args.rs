//! Values of command-line options shared by several commands.

/// A byte count: digits with an optional binary suffix K, M, G or T (KiB, MiB, GiB, TiB; `B`
/// and `iB` may follow), e.g. `67108864`, `64M`, `2GiB`. Zero and counts past 2^64 are refused.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => {
            return Err(format!(
                "`{s}` is not a byte count (e.g. 67108864, 64M, 2G)"
            ))
        }
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{s}` is not a byte count (e.g. 67108864, 64M, 2G)"))?;
    let bytes = n
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{s}` is more than 2^64 bytes"))?;
    if bytes == 0 {
        return Err("the limit must be at least 1 byte".into());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("1t"), Ok(1 << 40));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("1.5G").is_err());
        assert!(parse_bytes("16777216T").is_err());
        assert!(parse_bytes("18446744073709551616").is_err());
        assert!(parse_bytes("").is_err());
    }
}
