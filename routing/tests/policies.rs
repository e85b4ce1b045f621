//! The policies of docs/operator.md section 4 on tables of values computed by hand from the
//! formulas (the arithmetic is in the comments), not by calling the code under test.

use relattn_routing::{
    bucket_max_seqlen_q, decide, decode_split_count, decode_split_keys, lookup, num_splits,
    use_split_kv_decode, Capability, PathId, Shape,
};
use rstest::rstest;

const KV_LENS: [usize; 5] = [512, 8192, 65536, 131072, 1048576];

fn shape(batch: usize, q: usize, h: usize, hkv: usize, kv: usize) -> Shape {
    Shape {
        batch,
        max_query_len: q,
        num_heads: h,
        num_kv_heads: hkv,
        max_kv_len: kv,
        page_size: 16,
        window_left: -1,
        is_local: false,
    }
}

fn local(batch: usize, q: usize, h: usize, hkv: usize, kv: usize) -> Shape {
    Shape {
        window_left: 511,
        is_local: true,
        ..shape(batch, q, h, hkv, kv)
    }
}

#[test]
fn bucket_examples_of_section_4_4() {
    let inputs = [1, 2, 3, 4, 5, 9, 17];
    let expected = [1, 2, 4, 4, 8, 16, 32];
    assert_eq!(inputs.map(bucket_max_seqlen_q), expected);
    // bit_length(max(0, 0 - 1)) = bit_length(0) = 0 -> 1.
    assert_eq!(bucket_max_seqlen_q(0), 1);
    // 128 -> bit_length(127) = 7 -> 128; 129 -> bit_length(128) = 8 -> 256; 2048 stays.
    assert_eq!(bucket_max_seqlen_q(128), 128);
    assert_eq!(bucket_max_seqlen_q(129), 256);
    assert_eq!(bucket_max_seqlen_q(2048), 2048);
    assert_eq!(bucket_max_seqlen_q(65), 128);
}

/// Global layers on a `split_kv` row (SM100), every column one of `KV_LENS`.
/// Global heads per TP: 64/8, 32/4, 16/2, 8/1, so G = 8 everywhere; q_rows = bucket(q) * 8.
#[rustfmt::skip]
const GLOBAL: [(usize, usize, usize, usize, [usize; 5]); 36] = [
    // q = 1: q_rows = 8, q_tiles = 1.
    // batch 1: target 256, base = Hkv; ceil(kv/128) = 4, 64, 512, 1024, 8192.
    //   Hkv 8: 256/8 = 32, max_split 16          -> min(32,16,c): 4, 16, 16, 16, 16
    (1, 1, 64, 8, [4, 16, 16, 16, 16]),
    //   Hkv 4: 256/4 = 64, max_split 32          -> 4, 32, 32, 32, 32
    (1, 1, 32, 4, [4, 32, 32, 32, 32]),
    //   Hkv 2: 256/2 = 128, max_split 32 (kv <= 8192), 64 (<= 65536), else 128
    //          -> min(128,32,4)=4, min(128,32,64)=32, min(128,64,512)=64, 128, 128
    (1, 1, 16, 2, [4, 32, 64, 128, 128]),
    //   Hkv 1: 256/1 = 256, same max_split      -> 4, 32, 64, 128, 128
    (1, 1, 8, 1, [4, 32, 64, 128, 128]),
    // batch 8: target 128, max_split 128, base = 8 * Hkv.
    //   Hkv 8: 128/64 = 2                       -> 2 everywhere (c >= 4)
    (8, 1, 64, 8, [2, 2, 2, 2, 2]),
    //   Hkv 4: 128/32 = 4                       -> 4 everywhere (c = 4 at 512)
    (8, 1, 32, 4, [4, 4, 4, 4, 4]),
    //   Hkv 2: 128/16 = 8                       -> min(8, 4) = 4 at 512, else 8
    (8, 1, 16, 2, [4, 8, 8, 8, 8]),
    //   Hkv 1: 128/8 = 16                       -> 4 at 512, else 16
    (8, 1, 8, 1, [4, 16, 16, 16, 16]),
    // batch 32: target 128, base = 32 * Hkv.
    //   Hkv 8: 128/256 = 0 -> max(1, 0) = 1; Hkv 4: 128/128 = 1; Hkv 2: 128/64 = 2; Hkv 1: 128/32 = 4
    (32, 1, 64, 8, [1, 1, 1, 1, 1]),
    (32, 1, 32, 4, [1, 1, 1, 1, 1]),
    (32, 1, 16, 2, [2, 2, 2, 2, 2]),
    (32, 1, 8, 1, [4, 4, 4, 4, 4]),
    // q = 128: q_rows = 1024, q_tiles = 4, target 64, max_split 128, base = batch * Hkv * 4.
    //   batch 1: Hkv 8: 64/32 = 2; Hkv 4: 64/16 = 4; Hkv 2: 64/8 = 8 (4 at 512); Hkv 1: 64/4 = 16 (4 at 512)
    (1, 128, 64, 8, [2, 2, 2, 2, 2]),
    (1, 128, 32, 4, [4, 4, 4, 4, 4]),
    (1, 128, 16, 2, [4, 8, 8, 8, 8]),
    (1, 128, 8, 1, [4, 16, 16, 16, 16]),
    //   batch 8: Hkv 8: 64/256 = 0 -> 1; Hkv 4: 64/128 = 0 -> 1; Hkv 2: 64/64 = 1; Hkv 1: 64/32 = 2
    (8, 128, 64, 8, [1, 1, 1, 1, 1]),
    (8, 128, 32, 4, [1, 1, 1, 1, 1]),
    (8, 128, 16, 2, [1, 1, 1, 1, 1]),
    (8, 128, 8, 1, [2, 2, 2, 2, 2]),
    //   batch 32: base >= 32 * 1 * 4 = 128 > 64 -> 0 -> 1
    (32, 128, 64, 8, [1, 1, 1, 1, 1]),
    (32, 128, 32, 4, [1, 1, 1, 1, 1]),
    (32, 128, 16, 2, [1, 1, 1, 1, 1]),
    (32, 128, 8, 1, [1, 1, 1, 1, 1]),
    // q = 2048: q_rows = 16384, q_tiles = 64, target 64, base >= 64 -> 64/64 = 1 at best -> 1
    (1, 2048, 64, 8, [1, 1, 1, 1, 1]),
    (1, 2048, 32, 4, [1, 1, 1, 1, 1]),
    (1, 2048, 16, 2, [1, 1, 1, 1, 1]),
    (1, 2048, 8, 1, [1, 1, 1, 1, 1]),
    (8, 2048, 64, 8, [1, 1, 1, 1, 1]),
    (8, 2048, 32, 4, [1, 1, 1, 1, 1]),
    (8, 2048, 16, 2, [1, 1, 1, 1, 1]),
    (8, 2048, 8, 1, [1, 1, 1, 1, 1]),
    (32, 2048, 64, 8, [1, 1, 1, 1, 1]),
    (32, 2048, 32, 4, [1, 1, 1, 1, 1]),
    (32, 2048, 16, 2, [1, 1, 1, 1, 1]),
    (32, 2048, 8, 1, [1, 1, 1, 1, 1]),
];

#[rstest]
fn num_splits_on_blackwell_global_layers(#[values((10, 0), (10, 3), (11, 0))] cc: (u32, u32)) {
    let row = lookup(Capability::new(cc.0, cc.1)).unwrap();
    for (batch, q, h, hkv, expected) in GLOBAL {
        for (kv, want) in KV_LENS.into_iter().zip(expected) {
            let s = shape(batch, q, h, hkv, kv);
            assert_eq!(num_splits(row, &s), want, "{:?} {s:?}", row.cc);
        }
    }
}

#[test]
fn num_splits_buckets_the_raw_query_length() {
    let row = lookup(Capability::new(10, 0)).unwrap();
    // batch 1, Hkv 1, G 8, kv 131072 (ceil(kv/128) = 1024):
    // q = 65 -> bucket 128 -> q_rows 1024 -> q_tiles 4 -> target 64, base 4 -> 16.
    // (Unbucketed, 520 rows would give 3 tiles and 64/3 = 21.)
    assert_eq!(num_splits(row, &shape(1, 65, 8, 1, 131072)), 16);
    // q = 9 -> bucket 16 -> 128 rows -> 1 tile, batch 1: target 256, max_split 128 -> 128.
    assert_eq!(num_splits(row, &shape(1, 9, 8, 1, 131072)), 128);
    // q = 33 -> bucket 64 -> 512 rows -> 2 tiles: target 64, base 2 -> 32.
    assert_eq!(num_splits(row, &shape(1, 33, 8, 1, 131072)), 32);
    // q = 32 -> 256 rows -> 1 tile -> 128.
    assert_eq!(num_splits(row, &shape(1, 32, 8, 1, 131072)), 128);
}

#[test]
fn num_splits_is_one_on_local_layers_and_rows_without_split_kv() {
    // Local heads per TP: 64/16, 32/8, 16/4, 8/2.
    let local_heads = [(64, 16), (32, 8), (16, 4), (8, 2)];
    let global_heads = [(64, 8), (32, 4), (16, 2), (8, 1)];
    let blackwell = lookup(Capability::new(10, 0)).unwrap();
    let others = [
        (7, 0),
        (7, 5),
        (8, 0),
        (8, 6),
        (8, 7),
        (8, 9),
        (9, 0),
        (12, 0),
        (12, 1),
    ];
    for batch in [1, 8, 32] {
        for q in [1, 128, 2048] {
            for kv in KV_LENS {
                for (h, hkv) in local_heads {
                    assert_eq!(num_splits(blackwell, &local(batch, q, h, hkv, kv)), 1);
                }
                for (major, minor) in others {
                    let row = lookup(Capability::new(major, minor)).unwrap();
                    for (h, hkv) in global_heads {
                        assert_eq!(
                            num_splits(row, &shape(batch, q, h, hkv, kv)),
                            1,
                            "{:?}",
                            row.cc
                        );
                    }
                }
            }
        }
    }
}

/// (max_query_len, max_kv_len, page_size, window_left, enabled, expected)
#[rstest]
#[case::disabled(1, 131072, 16, -1, false, false)]
#[case::not_a_decode_batch(2, 1048576, 128, -1, true, false)]
#[case::not_a_decode_batch_windowed(128, 131072, 16, 511, true, false)]
#[case::kv_at_least_8192(1, 8192, 16, -1, true, true)]
#[case::short_global_small_pages(1, 8191, 16, -1, true, false)]
#[case::page_at_least_64(1, 512, 64, -1, true, true)]
#[case::global_page_32_below_64(1, 512, 32, -1, true, false)]
#[case::windowed_page_at_least_32(1, 512, 32, 511, true, true)]
#[case::windowed_page_16_below_32(1, 512, 16, 511, true, false)]
#[case::long_cache_comes_first(1, 131072, 16, 511, true, true)]
fn split_kv_decode_switch(
    #[case] q: usize,
    #[case] kv: usize,
    #[case] page: usize,
    #[case] w: i64,
    #[case] enabled: bool,
    #[case] want: bool,
) {
    assert_eq!(
        use_split_kv_decode(q, kv, page, w, enabled),
        want,
        "{q} {kv} {page} {w} {enabled}"
    );
}

/// Windowed: min(4, max(1, ceil(min(L, w + 1) / 128))).
#[rstest]
#[case::kv512(512, 511, 4)] // ceil(512/128) = 4
#[case::kv100(100, 511, 1)] // ceil(100/128) = 1
#[case::kv300(300, 511, 3)] // ceil(300/128) = 3
#[case::long_kv(1048576, 511, 4)] // min(L, 512) = 512 -> 4
#[case::empty(0, 511, 1)] // ceil(0/128) = 0 -> max(1, 0) = 1
#[case::window1024(1048576, 1023, 4)] // ceil(1024/128) = 8 -> min(4, 8) = 4
#[case::window1(1048576, 0, 1)] // min(L, 1) = 1 -> 1
#[case::window256(131072, 255, 2)] // ceil(256/128) = 2
fn decode_split_counts_windowed(#[case] kv: usize, #[case] w: i64, #[case] want: usize) {
    assert_eq!(decode_split_count(kv, w), want, "kv {kv} window {w}");
}

/// Global: min(32, max(1, ceil(max(1, L) / 2048))).
#[rstest]
#[case::kv512(512, 1)] // ceil(512/2048) = 1
#[case::kv8192(8192, 4)] // 4
#[case::kv65536(65536, 32)] // 32
#[case::kv131072(131072, 32)] // 64 -> 32
#[case::kv1048576(1048576, 32)] // 512 -> 32
#[case::empty(0, 1)] // max(1, 0) = 1 -> 1
#[case::kv2048(2048, 1)]
#[case::kv2049(2049, 2)]
#[case::kv63488(63488, 31)] // 31 * 2048
#[case::kv63489(63489, 32)]
fn decode_split_counts_global(#[case] kv: usize, #[case] want: usize) {
    assert_eq!(decode_split_count(kv, -1), want, "kv {kv}");
}

/// Expected (start, end) of each split; `None` marks an empty split.
fn check_ranges(kv: usize, w: i64, splits: usize, expected: &[Option<(usize, usize)>]) {
    assert_eq!(splits, expected.len(), "kv {kv} w {w} S {splits}");
    for (s, want) in expected.iter().enumerate() {
        let got = decode_split_keys(kv, w, splits, s).map(|r| (r.start, r.end));
        assert_eq!(got, *want, "split {s} of kv {kv} w {w} S {splits}");
    }
    // Past the last split there is nothing either.
    assert_eq!(decode_split_keys(kv, w, splits, splits), None);
}

#[test]
fn decode_split_ranges_by_hand() {
    // global Lk 8192, S 4: eff 8192, ceil(8192/4) = 2048, already a multiple of 32.
    check_ranges(
        8192,
        -1,
        4,
        &[
            Some((0, 2048)),
            Some((2048, 4096)),
            Some((4096, 6144)),
            Some((6144, 8192)),
        ],
    );
    // global Lk 100, S 4: ceil(100/4) = 25 -> 32.
    check_ranges(
        100,
        -1,
        4,
        &[
            Some((0, 32)),
            Some((32, 64)),
            Some((64, 96)),
            Some((96, 100)),
        ],
    );
    // global Lk 40, S 4: ceil(40/4) = 10 -> 32; 2 * 32 = 64 >= 40 -> splits 2 and 3 empty.
    check_ranges(40, -1, 4, &[Some((0, 32)), Some((32, 40)), None, None]);
    // global Lk 200, S 8: ceil(25) -> 32; split 6 = [192, 200); split 7 starts at 224 >= 200.
    let mut e: Vec<_> = (0..7)
        .map(|s| Some((s * 32, ((s + 1) * 32).min(200))))
        .collect();
    e.push(None);
    check_ranges(200, -1, 8, &e);
    // global Lk 1, S 32: split_len 32, only split 0 = [0, 1).
    let mut e = vec![Some((0, 1))];
    e.extend(std::iter::repeat_n(None, 31));
    check_ranges(1, -1, 32, &e);
    // global Lk 65537, S 32: ceil(65537/32) = 2049 -> ceil(2049/32) = 65 -> 2080;
    // 31 * 2080 = 64480 < 65537, so all 32 are non-empty and the last is [64480, 65537).
    let e: Vec<_> = (0..32)
        .map(|s| Some((s * 2080, ((s + 1) * 2080).min(65537))))
        .collect();
    check_ranges(65537, -1, 32, &e);
    // windowed w 511, Lk 131072, S 4: eff 512, kv_offset 130560, ceil(512/4) = 128.
    check_ranges(
        131072,
        511,
        4,
        &[
            Some((130560, 130688)),
            Some((130688, 130816)),
            Some((130816, 130944)),
            Some((130944, 131072)),
        ],
    );
    // windowed w 511, Lk 600, S 4: eff 512, kv_offset 88, split_len 128.
    check_ranges(
        600,
        511,
        4,
        &[
            Some((88, 216)),
            Some((216, 344)),
            Some((344, 472)),
            Some((472, 600)),
        ],
    );
    // windowed w 511, Lk 300, S 3: eff 300, offset 0, ceil(300/3) = 100 -> 128.
    check_ranges(
        300,
        511,
        3,
        &[Some((0, 128)), Some((128, 256)), Some((256, 300))],
    );
    // windowed w 99, Lk 530, S 4: eff 100, offset 430, ceil(100/4) = 25 -> 32:
    // [430,462) [462,494) [494,526) [526,530).
    check_ranges(
        530,
        99,
        4,
        &[
            Some((430, 462)),
            Some((462, 494)),
            Some((494, 526)),
            Some((526, 530)),
        ],
    );
    // Lk 0: eff 0, split_len 0, every split empty.
    check_ranges(0, -1, 2, &[None, None]);
    // No splits count as one.
    assert_eq!(decode_split_keys(100, -1, 0, 0), Some(0..100));
}

#[test]
fn decisions_for_model_shapes() {
    let cc = |major, minor| Capability::new(major, minor);
    // TP8 global decode, batch 1, 1M context.
    let s = shape(1, 1, 8, 1, 1048576);
    // SM100: num_splits 128 (row above), no decode kernel on this row.
    let d = decide(cc(10, 0), &s);
    assert_eq!(d.path, Some(PathId::ShearedBias));
    assert_eq!(
        (d.num_splits, d.split_kv_decode, d.decode_splits),
        (Some(128), false, Some(1))
    );
    assert_eq!(d.max_seqlen_q_bucket, 1);
    // SM90: no split-KV of any kind.
    let d = decide(cc(9, 0), &s);
    assert_eq!(d.path, Some(PathId::ScoreMod));
    assert_eq!(
        (d.num_splits, d.split_kv_decode, d.decode_splits),
        (Some(1), false, Some(1))
    );
    // SM80: decode kernel (kv >= 8192), ceil(1048576/2048) = 512 -> 32 splits.
    let d = decide(cc(8, 0), &s);
    assert_eq!(d.path, Some(PathId::Fallback));
    assert_eq!(
        (d.num_splits, d.split_kv_decode, d.decode_splits),
        (Some(1), true, Some(32))
    );
    // SM89 local decode, window 511: kv >= 8192 -> decode kernel, min(4, ceil(512/128)) = 4.
    let d = decide(cc(8, 9), &local(8, 1, 8, 2, 131072));
    assert_eq!(
        (d.num_splits, d.split_kv_decode, d.decode_splits),
        (Some(1), true, Some(4))
    );
    // SM86 prefill (q 2048): no decode kernel, bucket 2048.
    let d = decide(cc(8, 6), &shape(1, 2048, 64, 8, 8192));
    assert_eq!(
        (d.split_kv_decode, d.decode_splits, d.max_seqlen_q_bucket),
        (false, Some(1), 2048)
    );
    // SM121: rejected, bucket still reported (q 9 -> 16).
    let d = decide(cc(12, 1), &shape(8, 9, 8, 1, 131072));
    assert!(d.rejected);
    assert_eq!((d.path, d.num_splits, d.decode_splits), (None, None, None));
    assert!(d.reason.unwrap().contains("no paged-KV forward"));
    assert_eq!(d.max_seqlen_q_bucket, 16);
}

#[test]
fn decision_json_has_the_eight_keys() {
    let d = decide(Capability::new(12, 1), &shape(1, 1, 8, 1, 512));
    let v = serde_json::to_value(&d).unwrap();
    let mut keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    let expected = [
        "cc",
        "decode_splits",
        "max_seqlen_q_bucket",
        "num_splits",
        "path",
        "reason",
        "rejected",
        "split_kv_decode",
    ];
    assert_eq!(keys, expected);
    assert_eq!(v["cc"], "12.1");
    assert!(v["path"].is_null() && v["num_splits"].is_null() && v["decode_splits"].is_null());
    let d = decide(Capability::new(9, 0), &shape(1, 1, 8, 1, 512));
    let v = serde_json::to_value(&d).unwrap();
    assert_eq!(v["path"], "score_mod");
    assert!(v["reason"].is_null());
}

#[test]
fn shape_validation() {
    assert!(shape(1, 1, 8, 1, 512).validate().is_ok());
    assert!(local(1, 1, 8, 2, 512).validate().is_ok());
    let bad = [
        shape(0, 1, 8, 1, 512),
        shape(1, 0, 8, 1, 512),
        shape(1, 1, 0, 1, 512),
        shape(1, 1, 8, 0, 512),
        shape(1, 1, 8, 3, 512),
        shape(1, 1024, 8, 1, 512),
        shape(1, 1, 8, 1, 1 << 31),
        Shape {
            window_left: 511,
            ..shape(1, 1, 8, 1, 512)
        },
        Shape {
            window_left: -1,
            ..local(1, 1, 8, 2, 512)
        },
        Shape {
            page_size: 0,
            ..shape(1, 1, 8, 1, 512)
        },
    ];
    for s in bad {
        assert!(s.validate().is_err(), "{s:?} must be invalid");
    }
}
