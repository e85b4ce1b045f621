//! The split arithmetic the launch plans and the kernels share: sheared_bias's whole-tile splits
//! and the decode splits of docs/operator.md section 4.3 (the hand-computed ranges are in
//! policies.rs).

use relattn_routing::{decode_split_keys, sheared_split_keys};

#[test]
fn sheared_splits_partition_the_keys_in_whole_tiles() {
    for kv_len in [1usize, 127, 128, 129, 1000, 4096, 5000] {
        for splits in [1usize, 2, 3, 7, 16, 128] {
            let ranges: Vec<_> = (0..splits)
                .map(|s| sheared_split_keys(kv_len, splits, s))
                .collect();
            let live: Vec<_> = ranges.iter().flatten().cloned().collect();
            // Non-empty splits come first, are non-empty, tile aligned and contiguous from 0 to Lk.
            assert!(ranges.iter().skip(live.len()).all(Option::is_none));
            assert_eq!(live.first().unwrap().start, 0);
            assert_eq!(live.last().unwrap().end, kv_len);
            for w in live.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert_eq!(w[0].end % 128, 0);
            }
            assert!(live.iter().all(|r| r.start < r.end));
            assert!(
                live.len() <= kv_len.div_ceil(128),
                "more live splits than tiles"
            );
        }
    }
}

#[test]
fn decode_splits_partition_the_visible_keys() {
    for (kv_len, window) in [
        (1usize, -1i64),
        (31, -1),
        (64, -1),
        (5000, -1),
        (9000, 127),
        (100, 511),
        (2048, 511),
    ] {
        for splits in [1usize, 2, 3, 4, 7, 32, 40] {
            let live: Vec<_> = (0..splits)
                .filter_map(|s| decode_split_keys(kv_len, window, splits, s))
                .collect();
            let eff = if window >= 0 {
                kv_len.min(window as usize + 1)
            } else {
                kv_len
            };
            assert_eq!(live.first().unwrap().start, kv_len - eff);
            assert_eq!(live.last().unwrap().end, kv_len);
            assert!(
                live.iter().all(|r| r.start < r.end),
                "a non-empty split holds keys"
            );
            for w in live.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
            // The decode kernel's merging CTA takes the non-empty splits to be exactly the first
            // ceil(eff / split_len) (`DecodePieces::splits` in fallback.cu).
            let split_len = eff.div_ceil(splits).div_ceil(32) * 32;
            let n = eff.div_ceil(split_len);
            assert_eq!(
                live.len(),
                n,
                "kv_len {kv_len} window {window} splits {splits}"
            );
            assert!((0..splits)
                .all(|s| decode_split_keys(kv_len, window, splits, s).is_some() == (s < n)));
        }
    }
}
