//! Values of command-line options shared by several commands.

/// A byte count: a number with an optional binary unit (K, M, G, T: KiB, MiB, GiB, TiB; `B`
/// and `iB` may follow; parsed by `parse-size`), e.g. `67108864`, `64M`, `2GiB`, `1.5G`. Zero
/// and counts past 2^64 are refused.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let bytes = parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|e| match e {
            parse_size::Error::PosOverflow => format!("`{s}` is more than 2^64 bytes"),
            _ => format!("`{s}` is not a byte count (e.g. 67108864, 64M, 2G)"),
        })?;
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
        assert_eq!(parse_bytes("1.5G"), Ok(3 << 29));
        assert!(parse_bytes("1.5X").is_err());
        assert!(parse_bytes("16777216T").is_err());
        assert!(parse_bytes("18446744073709551616").is_err());
        assert!(parse_bytes("").is_err());
    }
}
