//! CPU-only checks of launch planning: split policies and forced counts, path constraints, the
//! decode pieces the launch cuts splits into, and the output poison image. The split range
//! formulas themselves are routing's (routing/tests/splits.rs).

use relattn_kernels::gpu::{
    attention_smem_bytes, decode_piece_keys, decode_piece_keys_for, decode_piece_layout, files,
    has_single_query_ctas, kv_map_shape, launch_smem_bytes, native_arch, out_poison, padding_bits,
    path_kernels, plan_launches, ring_stages, unwritten_bits, Geometry, GpuError, SmLimits,
    SplitSetting, Stage, ATTN_SMEM_BYTES, CTA_ROWS, CTA_THREADS, DECODE_MIN_PIECE_KEYS,
    DECODE_TARGET_CTAS, DEC_BIAS_BYTES, DEC_MAX_STAGES, DEC_MIN_STAGES, DEC_Q_BYTES,
    DEC_STAGE_BYTES, HEAD_DIM, KEY_TILE, KV_TMA_MIN_PAGE, QUERY_SMEM_BYTES, QUERY_SMEM_BYTES_WG,
    QUERY_SMEM_BYTES_WG_WINDOW, SHEAR_TILE, SMEM_ALIGN, WGMMA_ARCH,
};
use relattn_kernels::routing::{self, decode_split_keys, Capability, PathId};
use relattn_reference::gen::{generate, GenSpec};
use relattn_reference::DType;

fn geometry(spec: &GenSpec) -> Geometry {
    Geometry::of(&generate(spec).unwrap())
}

fn unsupported(r: Result<relattn_kernels::gpu::LaunchPlan, GpuError>) -> String {
    match r {
        Err(GpuError::Unsupported { reason, .. }) => reason,
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

fn stages(plan: &relattn_kernels::gpu::LaunchPlan) -> Vec<Stage> {
    plan.launches.iter().map(|l| l.stage).collect()
}

#[test]
fn windowed_layers_take_the_windowed_entry_of_score_mod_and_fallback() {
    let local = geometry(&GenSpec::local(8, 2, 128, vec![(40, 300), (1, 200)], 2));
    let global = geometry(&GenSpec::global(8, 2, vec![(40, 300), (1, 200)], 2));
    for path in [PathId::ScoreMod, PathId::Fallback] {
        let plan = plan_launches(path, &local, SplitSetting::Policy).unwrap();
        assert_eq!(stages(&plan), [Stage::Windowed], "{path}");
        let plan = plan_launches(path, &global, SplitSetting::Policy).unwrap();
        assert_eq!(stages(&plan), [Stage::Main], "{path}");
    }
    // sheared_bias carries the window in its buffer: one main kernel for both.
    let plan = plan_launches(PathId::ShearedBias, &local, SplitSetting::Policy).unwrap();
    assert_eq!(stages(&plan), [Stage::Prologue, Stage::Main]);
    // The windowed decode-only launch of fallback stays the decode kernel.
    let mut decode = GenSpec::local(8, 2, 128, vec![(1, 300), (1, 20)], 3);
    decode.page_size = 64;
    let plan = plan_launches(PathId::Fallback, &geometry(&decode), SplitSetting::Policy).unwrap();
    assert_eq!(stages(&plan), [Stage::Decode]);
    assert_eq!(Stage::Windowed.as_str(), "windowed");
    // The windowed entry takes the attention launch's shared memory, as the main entry does.
    for stage in [Stage::Main, Stage::Windowed, Stage::Decode] {
        assert!(stage.is_attention());
    }
    assert!(!Stage::Prologue.is_attention() && !Stage::Combine.is_attention());
    assert!(path_kernels(PathId::Fallback).has(Stage::Windowed));
    assert!(!path_kernels(PathId::ShearedBias).has(Stage::Windowed));
}

#[test]
fn score_mod_refuses_split_kv() {
    let g = geometry(&GenSpec::global(4, 2, vec![(40, 100), (0, 5), (1, 9)], 1));
    let plan = plan_launches(PathId::ScoreMod, &g, SplitSetting::Policy).unwrap();
    assert_eq!(plan.num_splits, 1);
    assert_eq!(stages(&plan), [Stage::Main]);
    // 64 virtual rows per CTA = 32 query rows x the G = 2 heads of a KV head.
    assert_eq!(plan.launches[0].grid, (2, 2, 3));
    assert_eq!(
        plan_launches(PathId::ScoreMod, &g, SplitSetting::Forced(1)).unwrap(),
        plan
    );
    assert!(
        unsupported(plan_launches(PathId::ScoreMod, &g, SplitSetting::Forced(2))).contains("split")
    );
}

#[test]
fn sheared_bias_constraints_are_typed() {
    let mut spec = GenSpec::global(4, 2, vec![(3, 30)], 2);
    spec.rel_extent = 1000;
    assert!(unsupported(plan_launches(
        PathId::ShearedBias,
        &geometry(&spec),
        SplitSetting::Policy
    ))
    .contains("128"));
    let mut local = GenSpec::local(4, 2, 256, vec![(3, 30)], 2);
    local.window_left = 100;
    assert!(unsupported(plan_launches(
        PathId::ShearedBias,
        &geometry(&local),
        SplitSetting::Policy
    ))
    .contains("window"));
    let mut d64 = GenSpec::global(4, 2, vec![(3, 30)], 2);
    d64.head_dim = 64;
    for path in PathId::ALL {
        assert!(
            unsupported(plan_launches(path, &geometry(&d64), SplitSetting::Policy))
                .contains("head_dim")
        );
    }
    let fits = GenSpec::global(4, 2, vec![(3, 30)], 2);
    for path in PathId::ALL {
        assert!(unsupported(plan_launches(
            path,
            &geometry(&fits),
            SplitSetting::Forced(0)
        ))
        .contains("at least 1"));
    }
}

#[test]
fn sheared_bias_splits_follow_the_sm100_policy_or_the_forced_count() {
    let mut spec = GenSpec::global(8, 1, vec![(1, 5000)], 3);
    spec.rel_extent = 256;
    let g = geometry(&spec);
    let row = routing::lookup(Capability::new(10, 0)).unwrap();
    let expected = routing::num_splits(row, &g.shape());
    assert!(expected > 1, "a single long decode splits on SM100");
    let plan = plan_launches(PathId::ShearedBias, &g, SplitSetting::Policy).unwrap();
    assert_eq!(plan.num_splits, expected);
    assert_eq!(
        routing::policy_splits(PathId::ShearedBias, &g.shape()),
        expected
    );
    assert_eq!(
        stages(&plan),
        [Stage::Prologue, Stage::Main, Stage::Combine]
    );
    for n in [1usize, 2, 3, 7, 16, 128] {
        let plan = plan_launches(PathId::ShearedBias, &g, SplitSetting::Forced(n)).unwrap();
        assert_eq!(plan.num_splits, n);
        assert_eq!(
            plan.launches[0].grid.1 as usize, 8,
            "prologue: one CTA per head"
        );
        assert_eq!(plan.launches[1].grid.1 as usize, n, "kv heads x splits");
        assert_eq!(plan.workspace_splits, if n > 1 { n } else { 0 });
        assert_eq!(stages(&plan).contains(&Stage::Combine), n > 1);
        assert_eq!(plan.shear_width, 256 + 128);
    }
    // Local layers never split under the policy.
    let local = geometry(&GenSpec::local(8, 1, 128, vec![(1, 5000)], 3));
    assert_eq!(
        plan_launches(PathId::ShearedBias, &local, SplitSetting::Policy)
            .unwrap()
            .num_splits,
        1
    );
}

#[test]
fn fallback_decode_follows_spec_4_3_and_needs_decode_only_batches() {
    let mut spec = GenSpec::global(8, 2, vec![(1, 9000), (0, 3), (1, 20)], 4);
    spec.page_size = 16;
    let g = geometry(&spec);
    let plan = plan_launches(PathId::Fallback, &g, SplitSetting::Policy).unwrap();
    // One launch: the merge runs in the last CTA of each request and KV head.
    assert_eq!(stages(&plan), [Stage::Decode]);
    assert!(plan.has_stage(Stage::Decode) && !plan.has_stage(Stage::Main));
    assert_eq!(plan.num_splits, routing::decode_split_count(9000, -1));
    assert_eq!(plan.num_splits, 5);
    // 30 split CTAs, far from DECODE_TARGET_CTAS: splits of 1824 keys are cut into 2 pieces of
    // at most DECODE_MIN_PIECE_KEYS (1024), a CTA and a partial per piece; the workspace also
    // holds the 5 splits' merged partials.
    assert_eq!(plan.piece_keys, DECODE_MIN_PIECE_KEYS);
    assert_eq!(plan.decode_pieces, 2);
    assert_eq!(plan.launches[0].grid, (10, 2, 3));
    assert_eq!(plan.workspace_splits, 10 + 5);
    let forced = plan_launches(PathId::Fallback, &g, SplitSetting::Forced(3)).unwrap();
    assert_eq!((forced.num_splits, forced.decode_pieces), (3, 3));
    assert_eq!(forced.workspace_splits, 9 + 3);
    // SplitSetting no longer than a piece are one piece each: a CTA per split.
    let forced = plan_launches(PathId::Fallback, &g, SplitSetting::Forced(32)).unwrap();
    assert_eq!(forced.decode_pieces, 1);
    assert_eq!(
        (forced.launches[0].grid.0, forced.workspace_splits),
        (32, 32)
    );
    // More splits than the policy's 32 (routing::FALLBACK_MAX_SPLITS: the kernel's one bound is
    // its grid): still a CTA and a partial per split, the empty ones among them included.
    for n in [64usize, 128, 1024] {
        let forced = plan_launches(PathId::Fallback, &g, SplitSetting::Forced(n)).unwrap();
        assert_eq!(stages(&forced), [Stage::Decode]);
        assert_eq!(
            (
                forced.num_splits,
                forced.decode_pieces,
                forced.workspace_splits
            ),
            (n, 1, n)
        );
        assert_eq!(forced.launches[0].grid, (n as u32, 2, 3));
    }
    let one = plan_launches(PathId::Fallback, &g, SplitSetting::Forced(1)).unwrap();
    assert_eq!(stages(&one), [Stage::Main]);
    // Short global decode with small pages: the main kernel.
    let short = geometry(&GenSpec::global(8, 2, vec![(1, 100)], 4));
    assert_eq!(
        stages(&plan_launches(PathId::Fallback, &short, SplitSetting::Policy).unwrap()),
        [Stage::Main]
    );
    let prefill = geometry(&GenSpec::global(8, 2, vec![(20, 100), (1, 40)], 4));
    assert!(unsupported(plan_launches(
        PathId::Fallback,
        &prefill,
        SplitSetting::Forced(2)
    ))
    .contains("decode-only"));
    // G query heads share a CTA: rows per CTA = 64 / G.
    let main = plan_launches(PathId::Fallback, &prefill, SplitSetting::Policy).unwrap();
    assert_eq!(
        main.launches[0].grid,
        (2, 2, 2),
        "ceil(20 / (64 / 4)) tiles"
    );
}

/// The split count a plan launches, the policy's or a forced one, is checked against the path's
/// limits before anything is planned.
#[test]
fn plans_check_the_split_count_they_launch() {
    let mut spec = GenSpec::global(8, 1, vec![(1, 5000)], 3);
    spec.rel_extent = 256;
    let sheared = geometry(&spec);
    let decode = geometry(&GenSpec::global(8, 2, vec![(1, 9000), (1, 20)], 4));
    for (path, g) in [
        (PathId::ShearedBias, &sheared),
        (PathId::ScoreMod, &decode),
        (PathId::Fallback, &decode),
    ] {
        let max = routing::path_spec(path).max_splits;
        let plan = plan_launches(path, g, SplitSetting::Forced(max)).unwrap();
        assert_eq!(plan.num_splits, max, "{path}");
        let refused = unsupported(plan_launches(path, g, SplitSetting::Forced(max + 1)));
        let limit = routing::path_spec(path).check_splits(max + 1).unwrap_err();
        assert_eq!(refused, limit.to_string(), "{path}");
        let policy = plan_launches(path, g, SplitSetting::Policy).unwrap();
        assert_eq!(
            policy.num_splits,
            routing::policy_splits(path, &g.shape()),
            "{path}"
        );
    }
}

#[test]
fn empty_batches_launch_nothing() {
    let g = geometry(&GenSpec::global(4, 4, vec![(0, 10), (0, 0)], 5));
    for path in PathId::ALL {
        assert!(
            plan_launches(path, &g, SplitSetting::Policy)
                .unwrap()
                .launches
                .is_empty(),
            "{path}"
        );
    }
}

#[test]
fn decode_pieces_fill_a_launch_only_when_splits_are_too_few() {
    assert_eq!(DECODE_TARGET_CTAS, 256);
    // decode128k (8 KV heads x 32 splits of 4096 keys): enough CTAs, no cut.
    assert_eq!(
        decode_piece_layout(4096, decode_piece_keys_for(256, 4096)).1,
        1
    );
    // decode8k_b32 (32 requests x 8 KV heads x 4 splits): no cut.
    assert_eq!(
        decode_piece_layout(2048, decode_piece_keys_for(1024, 2048)).1,
        1
    );
    // decode1m (1 KV head x 32 splits of 32768 keys): 8 pieces of 4096 keys, 256 CTAs.
    assert_eq!(decode_piece_keys_for(32, 32768), 4096);
    assert_eq!(decode_piece_layout(32768, 4096), (4096, 8));
    // Short splits are never cut below DECODE_MIN_PIECE_KEYS.
    assert_eq!(decode_piece_keys_for(1, 128), DECODE_MIN_PIECE_KEYS);
    assert_eq!(decode_piece_layout(128, DECODE_MIN_PIECE_KEYS).1, 1);
    assert_eq!(decode_piece_keys_for(1, 1 << 20), 4096);
    for (ctas, split_len) in [(1usize, 1usize), (3, 5000), (40, 70000), (300, 1 << 20)] {
        let keys = decode_piece_keys_for(ctas, split_len);
        assert!(keys >= DECODE_MIN_PIECE_KEYS && keys.is_multiple_of(64));
        let pieces = decode_piece_layout(split_len, keys).1;
        assert!(
            ctas * pieces <= DECODE_TARGET_CTAS.max(ctas) + ctas,
            "{ctas} {split_len}"
        );
    }
}

#[test]
fn decode_pieces_partition_each_split_in_order() {
    for (kv_len, window) in [
        (0usize, -1i64),
        (1, -1),
        (1025, -1),
        (5000, -1),
        (9000, 127),
        (9000, 4999),
        (131072, -1),
        (1 << 20, -1),
    ] {
        for splits in [1usize, 2, 3, 5, 32] {
            for piece_keys in [0usize, 64, 100, 1000, DECODE_MIN_PIECE_KEYS, 4096, 1 << 30] {
                let what = format!(
                    "kv_len {kv_len} window {window} splits {splits} piece_keys {piece_keys}"
                );
                let eff =
                    decode_split_keys(kv_len, window, splits, 0).map_or(0, |r| kv_len - r.start);
                let split_len = eff.div_ceil(splits).div_ceil(32) * 32;
                let (piece_len, pieces) = decode_piece_layout(split_len, piece_keys);
                assert!(piece_len.is_multiple_of(32) && pieces >= 1, "{what}");
                assert!(
                    piece_len <= piece_keys.max(32).div_ceil(32) * 32 || pieces == 1,
                    "{what}"
                );
                if split_len <= piece_keys {
                    assert_eq!(
                        pieces, 1,
                        "a split of at most piece_keys keys is one piece: {what}"
                    );
                }
                let slots = splits * pieces;
                let live: Vec<_> = (0..slots + pieces)
                    .map(|u| decode_piece_keys(kv_len, window, splits, piece_keys, u))
                    .collect();
                // The non-empty pieces come first (the merging CTA reads the first n), and their
                // count is the kernel's `DecodePieces::nonempty`.
                let n = live.iter().take_while(|r| r.is_some()).count();
                assert!(live[n..].iter().all(Option::is_none), "{what}");
                let expect = if eff == 0 {
                    0
                } else {
                    let full = eff.div_ceil(split_len);
                    (full - 1) * pieces + (eff - (full - 1) * split_len).div_ceil(piece_len)
                };
                assert_eq!(n, expect, "{what}");
                // In order, without gaps, each inside one split, and together each split.
                let live: Vec<_> = live.into_iter().flatten().collect();
                for w in live.windows(2) {
                    assert_eq!(w[0].end, w[1].start, "{what}");
                }
                for (u, r) in live.iter().enumerate() {
                    assert!(r.start < r.end && r.len() <= piece_len, "{what}");
                    let split = decode_split_keys(kv_len, window, splits, u / pieces).unwrap();
                    assert!(split.start <= r.start && r.end <= split.end, "{what}");
                }
                for s in 0..splits {
                    let of_split: Vec<_> = live.iter().skip(s * pieces).take(pieces).collect();
                    match decode_split_keys(kv_len, window, splits, s) {
                        Some(split) => {
                            assert_eq!(of_split.first().unwrap().start, split.start, "{what}");
                            assert_eq!(
                                of_split.iter().map(|r| r.len()).sum::<usize>(),
                                split.len(),
                                "{what}"
                            );
                        }
                        None => assert!(of_split.is_empty(), "{what}"),
                    }
                }
            }
        }
    }
}

#[test]
fn out_poison_marks_real_and_padding_rows() {
    let mut spec = GenSpec::global(2, 1, vec![(2, 4)], 6);
    spec.padding_rows = 1;
    spec.dtype = DType::F16;
    let g = geometry(&spec);
    let image = out_poison(&g);
    assert_eq!(image.len(), 3 * 2 * 128 * 2);
    let at = |i: usize| u16::from_le_bytes([image[2 * i], image[2 * i + 1]]) as u32;
    assert_eq!(at(0), unwritten_bits(DType::F16));
    assert_eq!(at(2 * 256 - 1), unwritten_bits(DType::F16));
    assert_eq!(at(2 * 256), padding_bits(DType::F16));
    for dt in [DType::Bf16, DType::F16, DType::F32] {
        let nan = relattn_kernels::gpu::decode_bits(dt, unwritten_bits(dt));
        assert!(nan.is_nan(), "{dt} poison is a NaN");
        assert_ne!(unwritten_bits(dt), padding_bits(dt));
    }
}

/// The value of `#define NAME value` in the shared headers.
fn c_define(name: &str) -> Option<usize> {
    let shared: String = files(PathId::ScoreMod)
        .iter()
        .map(|(_, text)| *text)
        .collect::<Vec<_>>()
        .join("\n");
    shared.lines().find_map(|line| {
        let rest = line.strip_prefix("#define ")?.strip_prefix(name)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

#[test]
fn grid_constants_mirror_the_kernels() {
    assert_eq!(c_define("MMA_ROWS"), Some(CTA_ROWS));
    assert_eq!(c_define("DEC_STAGE_BYTES"), Some(DEC_STAGE_BYTES));
    assert_eq!(c_define("DEC_MIN_STAGES"), Some(DEC_MIN_STAGES));
    assert_eq!(c_define("DEC_MAX_STAGES"), Some(DEC_MAX_STAGES));
    assert_eq!(c_define("ATTN_SMEM_BYTES"), Some(ATTN_SMEM_BYTES));
    assert_eq!(c_define("SMEM_ALIGN"), Some(SMEM_ALIGN));
    assert_eq!(c_define("DEC_Q_BYTES"), Some(DEC_Q_BYTES));
    assert_eq!(c_define("DEC_BIAS_BYTES"), Some(DEC_BIAS_BYTES));
    assert_eq!(c_define("THREADS"), Some(CTA_THREADS as usize));
    assert_eq!(c_define("SHEAR_TILE"), Some(SHEAR_TILE));
    assert_eq!(c_define("HEAD_DIM"), Some(HEAD_DIM));
    // The path limits routing states are the kernels' tiles.
    assert_eq!(
        routing::path_spec(PathId::ShearedBias).extent_multiple_of,
        Some(SHEAR_TILE)
    );
    for path in PathId::ALL {
        assert_eq!(routing::path_spec(path).head_dim, HEAD_DIM, "{path}");
    }
    assert_eq!(c_define("KEY_TILE"), Some(KEY_TILE));
    assert_eq!(c_define("KV_TMA_MIN_PAGE"), Some(KV_TMA_MIN_PAGE));
    // The prologue grid counts 32-row blocks of one head.
    assert_eq!(c_define("ROWS"), Some(32));
    let mut spec = GenSpec::global(8, 2, vec![(33, 40)], 7);
    spec.rel_extent = 128;
    let plan = plan_launches(
        PathId::ShearedBias,
        &geometry(&spec),
        SplitSetting::Forced(1),
    )
    .unwrap();
    assert_eq!(plan.launches[0].grid, (2, 8, 1), "ceil(33 / 32) blocks x H");
    assert_eq!(
        plan.launches[1].grid,
        (3, 2, 1),
        "ceil(33 / (64 / 4)) blocks x Hkv"
    );
    // Groups larger than a CTA's rows are refused with a typed error.
    let wide = geometry(&GenSpec::global(128, 1, vec![(1, 40)], 7));
    for path in PathId::ALL {
        assert!(
            unsupported(plan_launches(path, &wide, SplitSetting::Policy)).contains("GQA group")
        );
    }
}

/// An H200's SMs: 132 of 228 KiB, 227 KiB per CTA, three sm_90a attention CTAs by registers.
const H200: SmLimits = SmLimits {
    sm_count: 132,
    smem_per_sm: 233_472,
    smem_per_block: 232_448,
    resident_ctas: 3,
};

/// The shared memory of the fallback path's launch of `g`.
fn fallback_smem(g: &Geometry, stages: usize, arch: &str) -> usize {
    let plan = plan_launches(PathId::Fallback, g, SplitSetting::Policy).unwrap();
    launch_smem_bytes(&plan, g, stages, arch)
}

/// Shared memory `n` CTAs of `bytes` dynamic shared memory take on an SM (the driver reserves
/// 1 KiB per CTA).
fn on_sm(n: usize, bytes: usize) -> usize {
    n * (bytes + 1024)
}

#[test]
fn decode_rings_fill_the_shared_memory_of_the_ctas_an_sm_holds() {
    // decode128k-like, scaled down in length (the ring depends on CTAs, not on Lk): fallback's
    // policy gives 32 splits x 8 KV heads = 256 CTAs, two per SM: 3 stages of 35 KiB each (K/V
    // and bias chunks), the deepest ring two CTAs fit.
    let decode = geometry(&GenSpec::global(64, 8, vec![(1, 9000)], 3));
    let fallback = plan_launches(PathId::Fallback, &decode, SplitSetting::Forced(32)).unwrap();
    let s = ring_stages(&fallback, &decode, &H200);
    assert_eq!(s, 3);
    assert!(on_sm(2, attention_smem_bytes(s)) <= H200.smem_per_sm);
    assert!(on_sm(2, attention_smem_bytes(s + 1)) > H200.smem_per_sm);
    assert_eq!(
        fallback_smem(&decode, s, WGMMA_ARCH),
        attention_smem_bytes(s)
    );
    // 16 splits x 8 = 128 CTAs: one per SM, the deepest ring.
    let sheared = plan_launches(PathId::ShearedBias, &decode, SplitSetting::Forced(16)).unwrap();
    assert_eq!(ring_stages(&sheared, &decode, &H200), DEC_MAX_STAGES);
    assert!(on_sm(1, attention_smem_bytes(DEC_MAX_STAGES)) <= H200.smem_per_sm);
    assert!(attention_smem_bytes(DEC_MAX_STAGES) <= H200.smem_per_block);
    // 1024 CTAs: as many per SM as registers allow (3 on sm_90a: the minimum ring; 2: 3 stages).
    let batch = geometry(&GenSpec::global(64, 8, vec![(1, 64); 32], 3));
    let wide = plan_launches(PathId::Fallback, &batch, SplitSetting::Forced(4)).unwrap();
    assert_eq!(ring_stages(&wide, &batch, &H200), DEC_MIN_STAGES);
    assert!(on_sm(3, attention_smem_bytes(DEC_MIN_STAGES)) <= H200.smem_per_sm);
    let two = SmLimits {
        resident_ctas: 2,
        ..H200
    };
    assert_eq!(ring_stages(&wide, &batch, &two), 3);
    assert_eq!(
        ring_stages(&fallback, &decode, &two),
        3,
        "256 CTAs: two per SM"
    );
    // A 100 KiB SM (sm_86/89) with one CTA: what fits.
    let small = SmLimits {
        sm_count: 84,
        smem_per_sm: 102_400,
        smem_per_block: 101_376,
        resident_ctas: 1,
    };
    let s = ring_stages(&fallback, &decode, &small);
    assert!(on_sm(1, attention_smem_bytes(s)) <= small.smem_per_sm && s >= DEC_MIN_STAGES);
    // Degenerate limits never divide by zero and keep the minimum.
    let none = SmLimits {
        sm_count: 0,
        smem_per_sm: 0,
        smem_per_block: 0,
        resident_ctas: 0,
    };
    assert_eq!(ring_stages(&fallback, &decode, &none), DEC_MIN_STAGES);
    // Query blocks and mixed batches keep the minimum (their CTAs do not stream a ring).
    let prefill = geometry(&GenSpec::global(64, 8, vec![(64, 200)], 3));
    let main = plan_launches(PathId::ScoreMod, &prefill, SplitSetting::Policy).unwrap();
    assert_eq!(ring_stages(&main, &prefill, &H200), DEC_MIN_STAGES);
    assert_eq!(
        attention_smem_bytes(DEC_MIN_STAGES),
        ATTN_SMEM_BYTES + SMEM_ALIGN
    );
    // G > 16: single-query CTAs are query blocks too.
    let wide_group = geometry(&GenSpec::global(32, 1, vec![(1, 9000)], 3));
    let plan = plan_launches(PathId::ScoreMod, &wide_group, SplitSetting::Policy).unwrap();
    assert_eq!(ring_stages(&plan, &wide_group, &H200), DEC_MIN_STAGES);
}

#[test]
fn launches_without_single_query_ctas_take_only_the_query_block_tiles() {
    // Prefill only: two CTAs fit a 100 KiB SM.
    let prefill = geometry(&GenSpec::global(64, 8, vec![(64, 200), (9, 40)], 3));
    assert!(!has_single_query_ctas(&prefill));
    assert_eq!(
        fallback_smem(&prefill, 3, "sm_86"),
        QUERY_SMEM_BYTES + SMEM_ALIGN
    );
    assert!(on_sm(2, fallback_smem(&prefill, 3, "sm_89")) <= 102_400);
    // The wgmma query blocks (sm_90a) also stage rel_logits rows; three still fit an H200 SM,
    // as their `__launch_bounds__` assume.
    assert_eq!(WGMMA_ARCH, native_arch(Capability::new(9, 0)));
    let wg = fallback_smem(&prefill, 3, WGMMA_ARCH);
    assert_eq!(wg, QUERY_SMEM_BYTES_WG + SMEM_ALIGN);
    assert!(on_sm(3, wg) <= H200.smem_per_sm);
    // Their windowed blocks alternate between two V tiles: three still fit.
    let local = geometry(&GenSpec::local(64, 8, 128, vec![(64, 200), (9, 40)], 3));
    let wg_local = fallback_smem(&local, 3, WGMMA_ARCH);
    assert_eq!(wg_local, QUERY_SMEM_BYTES_WG_WINDOW + SMEM_ALIGN);
    assert!(wg_local > wg && on_sm(3, wg_local) <= H200.smem_per_sm);
    // Only the windowed entries (score_mod and fallback) take it: sheared_bias's launch on the
    // same layer keeps the smaller size, as shared memory not taken is the SM's L1 cache.
    let score_mod = plan_launches(PathId::ScoreMod, &local, SplitSetting::Policy).unwrap();
    assert_eq!(
        launch_smem_bytes(&score_mod, &local, 3, WGMMA_ARCH),
        wg_local
    );
    let sheared = plan_launches(PathId::ShearedBias, &local, SplitSetting::Policy).unwrap();
    assert!(!sheared.has_stage(Stage::Windowed));
    assert_eq!(launch_smem_bytes(&sheared, &local, 3, WGMMA_ARCH), wg);
    assert_eq!(
        fallback_smem(&local, 3, "sm_90"),
        QUERY_SMEM_BYTES + SMEM_ALIGN
    );
    assert_eq!(
        fallback_smem(&prefill, 3, "sm_90"),
        QUERY_SMEM_BYTES + SMEM_ALIGN
    );
    // A q_len-1 request anywhere in the batch brings the ring.
    let mixed = geometry(&GenSpec::global(64, 8, vec![(64, 200), (1, 40)], 3));
    assert!(has_single_query_ctas(&mixed));
    for arch in ["sm_80", WGMMA_ARCH] {
        assert_eq!(
            fallback_smem(&mixed, DEC_MIN_STAGES, arch),
            attention_smem_bytes(DEC_MIN_STAGES)
        );
    }
    // Its query blocks get what the prefill's would.
    assert!(fallback_smem(&mixed, DEC_MIN_STAGES, WGMMA_ARCH) >= wg);
    // G > 16 runs query blocks, even for q_len 1.
    assert!(!has_single_query_ctas(&geometry(&GenSpec::global(
        32,
        1,
        vec![(1, 40)],
        3
    ))));
    // The C side states the same sizes.
    assert_eq!(c_define("QUERY_SMEM_BYTES"), Some(QUERY_SMEM_BYTES));
    assert_eq!(c_define("QUERY_SMEM_BYTES_WG"), Some(QUERY_SMEM_BYTES_WG));
    assert_eq!(
        c_define("QUERY_SMEM_BYTES_WG_WINDOW"),
        Some(QUERY_SMEM_BYTES_WG_WINDOW)
    );
}

#[test]
fn hopper_builds_for_its_architecture_specific_target() {
    assert_eq!(native_arch(Capability::new(9, 0)), "sm_90a");
    assert_eq!(native_arch(Capability::new(8, 0)), "sm_80");
    assert_eq!(native_arch(Capability::new(8, 9)), "sm_89");
    assert_eq!(native_arch(Capability::new(10, 0)), "sm_100");
    assert_eq!(native_arch(Capability::new(12, 1)), "sm_121");
}

/// The byte offset a tensor map gives element 0 of (block, slot, head).
fn map_offset(m: &relattn_kernels::gpu::KvMapShape, block: usize, slot: usize, head: usize) -> u64 {
    m.offset + head as u64 * m.strides[0] + slot as u64 * m.strides[1] + block as u64 * m.strides[2]
}

#[test]
fn tensor_maps_describe_the_cache_only_where_the_sm90a_blocks_copy_through_them() {
    use relattn_reference::CacheLayout;
    let spec = |page: usize, layout: CacheLayout| {
        let mut s = GenSpec::global(8, 2, vec![(100, 300)], 3);
        s.page_size = page;
        s.layout = layout;
        s
    };
    // NHD packed, page 128: rows K(D) | V(D) of 512 bytes per head, Hkv heads per slot.
    let g = geometry(&spec(128, CacheLayout::NhdPacked));
    let k = kv_map_shape(&g, &g.k, WGMMA_ARCH).expect("an aligned NHD cache with page 128");
    let v = kv_map_shape(&g, &g.v, WGMMA_ARCH).unwrap();
    assert_eq!(k.dims, [128, 2, 128, g.num_blocks as u64]);
    assert_eq!(k.strides, [512, 1024, 128 * 1024]);
    assert_eq!(k.boxes, [64, 1, KEY_TILE as u32, 1]);
    assert_eq!((k.offset, v.offset), (0, 256));
    // Every dimension and stride the driver reads matches the view's own element arithmetic,
    // in every layout (HND's head stride is larger than its slot stride).
    for (page, layout, (block, slot)) in [
        (128, CacheLayout::NhdPacked, (3, 5)),
        (64, CacheLayout::Contiguous, (2, 63)),
        (64, CacheLayout::HndPacked, (2, 63)),
    ] {
        let g = geometry(&spec(page, layout));
        for view in [&g.k, &g.v] {
            let m = kv_map_shape(&g, view, WGMMA_ARCH).unwrap();
            let want = 2 * view.at(block, slot, 1) as u64;
            assert_eq!(map_offset(&m, block, slot, 1), want, "{layout:?}");
        }
    }
    // Other architectures, pages under KV_TMA_MIN_PAGE keys or not a power of two, fp32: no map.
    assert_eq!(kv_map_shape(&g, &g.k, "sm_90"), None);
    assert_eq!(kv_map_shape(&g, &g.k, "sm_100"), None);
    for page in [1, 8, 48, 96] {
        let g = geometry(&spec(page, CacheLayout::NhdPacked));
        assert_eq!(kv_map_shape(&g, &g.k, WGMMA_ARCH), None, "page {page}");
    }
    // Pages smaller than a tile: a box per page (R = page keys).
    for page in [16, 32] {
        let g = geometry(&spec(page, CacheLayout::NhdPacked));
        let m = kv_map_shape(&g, &g.k, WGMMA_ARCH).unwrap();
        assert_eq!(m.boxes, [64, 1, page as u32, 1]);
        assert_eq!(m.dims[2], page as u64);
    }
}

/// No kernel is built for fp32 (not an operator dtype): every path refuses it as unsupported.
#[test]
fn fp32_is_refused_by_every_path() {
    let mut spec = GenSpec::global(8, 2, vec![(1, 40), (5, 60)], 3);
    spec.dtype = DType::F32;
    let g = geometry(&spec);
    for path in PathId::ALL {
        match plan_launches(path, &g, SplitSetting::Policy) {
            Err(GpuError::Unsupported { reason, .. }) => {
                assert!(reason.contains("fp32"), "{path}: {reason}")
            }
            other => panic!("{path}: {other:?}"),
        }
    }
    assert!(relattn_kernels::gpu::entries(PathId::Fallback)
        .iter()
        .all(|e| !e.ends_with("_fp32")));
}
