//! Size limits of matrix files, checked before anything is expanded: the file's bytes, the
//! cases and trials it would expand to (counted from the axis lengths, not built), and the
//! number and size of split settings.

/// Largest matrix file read (the built-in tiers are under 20 KiB).
pub const MAX_MATRIX_FILE_BYTES: u64 = 1 << 20;
/// Most cases a matrix may expand to (the nightly tier has about 11,000).
pub const MAX_CASES: u64 = 100_000;
/// Most trials a matrix may expand to: cases x split settings x GPU paths.
pub const MAX_TRIALS: u64 = 1_000_000;
/// Most split settings of one group (the tiers use up to 8).
pub const MAX_SPLIT_SETTINGS: usize = 32;
/// Largest forced split count of a matrix file. sheared_bias combines at most 128 splits; only
/// fallback's decode kernel takes more, and 1024 of its 32-key splits already cover 32k keys.
pub const MAX_FORCED_SPLITS: usize = 1024;

/// The product of axis lengths, saturating instead of wrapping.
pub(crate) fn product(lengths: &[usize]) -> u64 {
    lengths
        .iter()
        .fold(1u64, |acc, &n| acc.saturating_mul(n as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_saturate() {
        assert_eq!(product(&[2, 3, 7]), 42);
        assert_eq!(product(&[]), 1);
        assert_eq!(product(&[usize::MAX, usize::MAX]), u64::MAX);
        assert_eq!(product(&[1 << 32, 1 << 32, 0]), 0);
    }
}
