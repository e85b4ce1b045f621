//! What a path launches for a problem: which stages, their grids, the split count (from the
//! production policy or forced) and the workspaces. Pure, so it is tested without a GPU. The
//! split arithmetic (policy counts, split keys) is routing's; the kernels derive split ranges
//! from the same formulas (`routing::sheared_split_keys`, `routing::decode_split_keys`); the
//! decode pieces below are the launch's own cut of those splits.

#![deny(unsafe_code)]

use super::error::GpuError;
use super::geometry::Geometry;
use super::paths::path_kernels;
use super::paths::Stage;
use super::source::DTYPES;
use crate::routing::{self, PathId, SplitSetting};
use std::ops::Range;

pub(crate) use super::constants::PROLOGUE_ROWS;
pub use super::constants::{
    ATTN_SMEM_BYTES, CTA_ROWS, CTA_THREADS, DECODE_MIN_PIECE_KEYS, DECODE_TARGET_CTAS,
    DEC_BIAS_BYTES, DEC_MAX_STAGES, DEC_MIN_STAGES, DEC_Q_BYTES, DEC_RING_STAGE_BYTES,
    DEC_STAGE_BYTES, HEAD_DIM, KEY_TILE, KV_TMA_MIN_PAGE, QUERY_SMEM_BYTES, QUERY_SMEM_BYTES_WG,
    QUERY_SMEM_BYTES_WG_WINDOW, SHEAR_TILE, SMEM_ALIGN, SMEM_RESERVED_PER_CTA, WGMMA_ARCH,
};

/// One kernel launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub stage: Stage,
    pub grid: (u32, u32, u32),
}

/// Everything `run_path` launches for one (path, problem, splits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchPlan {
    pub path: PathId,
    /// KV splits (1 = none).
    pub num_splits: usize,
    /// In launch order; launches with an empty grid are left out.
    pub launches: Vec<Launch>,
    /// Partials the fp32 workspace holds, one per split or decode piece (0 = no workspace).
    pub workspace_splits: usize,
    /// Most keys of a fallback decode piece (0 = no decode launch).
    pub piece_keys: usize,
    /// Pieces per split of the longest decode request (1 = splits are not cut; 0 = no decode
    /// launch). With more than 1 the workspace also holds the splits' merged partials.
    pub decode_pieces: usize,
    /// Slots per (row, head) of the sheared bias buffer (0 = no buffer).
    pub shear_width: usize,
}

impl LaunchPlan {
    /// Whether one of the launches runs `stage`.
    pub fn has_stage(&self, stage: Stage) -> bool {
        self.launches.iter().any(|l| l.stage == stage)
    }
}

fn unsupported(path: PathId, reason: impl Into<String>) -> GpuError {
    GpuError::Unsupported {
        path,
        reason: reason.into(),
    }
}

fn dim(path: PathId, what: &str, n: usize, max: usize) -> Result<u32, GpuError> {
    if n > max {
        return Err(unsupported(
            path,
            format!("{what} = {n} exceeds the grid limit {max}"),
        ));
    }
    Ok(n as u32)
}

/// How the fallback decode kernel cuts a split of `split_len` keys into pieces of at most
/// `piece_keys` (mirrors `DecodePieces` in fallback.cu): `(piece_len, pieces)` with
/// `k = ceil(split_len / piece_keys)`, `piece_len = ceil(ceil(split_len / k) / 32) * 32` and
/// `pieces = ceil(split_len / piece_len) <= k`.
pub fn decode_piece_layout(split_len: usize, piece_keys: usize) -> (usize, usize) {
    let k = split_len.div_ceil(piece_keys.max(1)).max(1);
    let piece_len = (split_len.div_ceil(k).div_ceil(32) * 32).max(32);
    (piece_len, split_len.div_ceil(piece_len).max(1))
}

/// Keys of decode piece `u` (CTA and workspace slot `u = s * pieces + j`: piece j of split s), or
/// None when it is empty. The pieces of a split partition its keys in order, so the merge over
/// the pieces is docs/operator.md section 4.3's merge over the splits on a finer partition of the
/// same keys; a split of at most `piece_keys` keys is one piece, the split itself.
pub fn decode_piece_keys(
    kv_len: usize,
    window_left: i64,
    splits: usize,
    piece_keys: usize,
    u: usize,
) -> Option<Range<usize>> {
    let split_len = routing::decode_split_len(routing::visible_len(kv_len, window_left), splits);
    let (piece_len, pieces) = decode_piece_layout(split_len, piece_keys);
    let split = routing::decode_split_keys(kv_len, window_left, splits, u / pieces)?;
    let start = split.start + (u % pieces) * piece_len;
    (start < split.end).then(|| start..(start + piece_len).min(split.end))
}

/// Most keys of a fallback decode piece for a launch of `ctas` split CTAs (`batch x num_kv_heads
/// x num_splits`) whose longest split has `split_len` keys: the split length cut into as many
/// pieces as bring the launch to `DECODE_TARGET_CTAS`, rounded up to whole key tiles, at least
/// `DECODE_MIN_PIECE_KEYS`. At least `split_len` (one piece per split) when no cut is needed.
pub fn decode_piece_keys_for(ctas: usize, split_len: usize) -> usize {
    let k = DECODE_TARGET_CTAS.div_ceil(ctas.max(1)).max(1);
    (split_len.div_ceil(k).div_ceil(64) * 64).max(DECODE_MIN_PIECE_KEYS)
}

/// What the launcher knows of the device's multiprocessors when it sizes shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmLimits {
    pub sm_count: usize,
    /// Shared memory of one SM (bytes).
    pub smem_per_sm: usize,
    /// Shared memory one CTA may opt in to (bytes).
    pub smem_per_block: usize,
    /// Attention CTAs one SM holds at the least shared memory (the occupancy API's answer:
    /// registers usually decide it).
    pub resident_ctas: usize,
}

/// Whether any attention CTA of this problem is a single-query CTA (a request with q_len 1,
/// G <= 16): the only CTAs that use the K/V ring (mirrors `run_cta`).
pub fn has_single_query_ctas(g: &Geometry) -> bool {
    g.group() <= 16 && g.shape.has_decode_request()
}

/// Whether the kernels may stage rel_logits in shared memory rather than gather it per cell: E a
/// multiple of 8 (rel_logits is allocated 16-byte aligned); mirrors the uniform part of
/// `decode_bias_staged` and `RelStage::on` in attention.cuh (query blocks also want the CTA's
/// rows all real).
pub fn bias_stages(g: &Geometry) -> bool {
    g.rel_extent > 0 && g.rel_extent.is_multiple_of(8)
}

/// Whether the attention CTAs of this problem are all single-query streaming CTAs (a decode-only
/// batch with G <= 16, bf16 or fp16), the launches whose ring may grow past the minimum.
pub fn streams_kv(g: &Geometry) -> bool {
    g.decode_only() && has_single_query_ctas(g)
}

/// Depth of the single-query CTAs' K/V ring. Decode is bound by the bytes in flight, so each
/// attention CTA takes the largest ring that still lets an SM hold as many CTAs as the launch
/// gives it (`ceil(CTAs / SMs)`, at most what its registers allow): one CTA per SM gets up to
/// `DEC_MAX_STAGES` stages. Query blocks (and mixed batches) keep `DEC_MIN_STAGES`.
pub fn ring_stages(plan: &LaunchPlan, g: &Geometry, sm: &SmLimits) -> usize {
    if !streams_kv(g) {
        return DEC_MIN_STAGES;
    }
    let ctas: usize = plan
        .launches
        .iter()
        .filter(|l| l.stage.is_attention())
        .map(|l| l.grid.0 as usize * l.grid.1 as usize * l.grid.2 as usize)
        .max()
        .unwrap_or(0);
    let per_sm = ctas
        .div_ceil(sm.sm_count.max(1))
        .clamp(1, sm.resident_ctas.max(1));
    let per_cta = (sm.smem_per_sm / per_sm)
        .saturating_sub(SMEM_RESERVED_PER_CTA)
        .min(sm.smem_per_block)
        .saturating_sub(SMEM_ALIGN + DEC_Q_BYTES);
    (per_cta / DEC_RING_STAGE_BYTES).clamp(DEC_MIN_STAGES, DEC_MAX_STAGES)
}

/// Dynamic shared memory of an attention launch with single-query CTAs whose ring has `stages`
/// stages.
pub fn attention_smem_bytes(stages: usize) -> usize {
    ATTN_SMEM_BYTES.max(DEC_Q_BYTES + stages * DEC_RING_STAGE_BYTES) + SMEM_ALIGN
}

/// Dynamic shared memory of a problem's attention launch (`plan`) for kernels built for `arch`:
/// with single-query CTAs their ring (`attention_smem_bytes`), else only the query block's tiles
/// (and on `WGMMA_ARCH` its staged rel_logits rows, and in the windowed entries a second V
/// tile), so GPUs with 100 KiB per SM still hold two query-block CTAs. Other launches keep the
/// smaller size on `WGMMA_ARCH`: shared memory an SM does not give to CTAs is its L1 cache.
pub fn launch_smem_bytes(plan: &LaunchPlan, g: &Geometry, stages: usize, arch: &str) -> usize {
    if has_single_query_ctas(g) {
        attention_smem_bytes(stages)
    } else if arch == WGMMA_ARCH && plan.has_stage(Stage::Windowed) {
        QUERY_SMEM_BYTES_WG_WINDOW + SMEM_ALIGN
    } else if arch == WGMMA_ARCH {
        QUERY_SMEM_BYTES_WG + SMEM_ALIGN
    } else {
        QUERY_SMEM_BYTES + SMEM_ALIGN
    }
}

/// A cache view as the 4-d tensor the sm_90a query blocks copy whole K or V tiles from
/// (tensor memory access, `cuTensorMapEncodeTiled`): 16-bit elements at byte `offset` of the
/// cache buffer, dims `(D, Hkv, page, blocks)` innermost first, byte strides of dims 1..,
/// boxes of `(64, 1, R, 1)` elements, R = min(page, KEY_TILE): half a tile's dims (a 128-byte
/// swizzled row) for the keys of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvMapShape {
    pub offset: u64,
    pub dims: [u64; 4],
    pub strides: [u64; 3],
    pub boxes: [u32; 4],
}

/// The tensor of `view` when kernels built for `arch` copy through one: only `WGMMA_ARCH`, 16-bit
/// dtypes, D = HEAD_DIM, pages a power of two of at least KV_TMA_MIN_PAGE keys, and a 16-byte aligned
/// cache view (both views' offsets and strides multiples of 8 elements, which the kernels check
/// too). None: every tile takes cp.async.
pub fn kv_map_shape(
    g: &Geometry,
    view: &relattn_reference::KvView,
    arch: &str,
) -> Option<KvMapShape> {
    let elem = g.dtype.size_bytes();
    let ps = g.page_size;
    let usable = arch == WGMMA_ARCH
        && elem == 2
        && g.head_dim == HEAD_DIM
        && ps >= KV_TMA_MIN_PAGE
        && ps.is_power_of_two()
        && g.num_blocks > 0;
    let aligned = [&g.k, &g.v]
        .iter()
        .all(|v| (v.offset | v.block_stride | v.slot_stride | v.head_stride) % 8 == 0);
    if !usable || !aligned {
        return None;
    }
    // A single KV head's stride is never stepped: any valid one will do.
    let head = if g.num_kv_heads > 1 {
        view.head_stride
    } else {
        HEAD_DIM
    };
    let strides = [head, view.slot_stride, view.block_stride].map(|s| (s * elem) as u64);
    if strides.iter().any(|&s| s == 0 || s >= 1 << 40) {
        return None;
    }
    Some(KvMapShape {
        offset: (view.offset * elem) as u64,
        dims: [HEAD_DIM, g.num_kv_heads, ps, g.num_blocks].map(|d| d as u64),
        strides,
        boxes: [64, 1, ps.min(KEY_TILE) as u32, 1],
    })
}

/// Plan the launches of `path` on a problem, or say why the path cannot take it.
pub fn plan_launches(
    path: PathId,
    g: &Geometry,
    splits: SplitSetting,
) -> Result<LaunchPlan, GpuError> {
    // The path's limits (routing's `PathSpec`): the case first, then the split count the
    // launches will really use, the policy's or the forced one.
    let spec = routing::path_spec(path);
    let limit = |l: routing::PathLimit| unsupported(path, l.to_string());
    let case = routing::PathCase {
        rel_extent: g.rel_extent,
        window_left: g.window_left,
        head_dim: g.head_dim,
    };
    spec.check_case(&case).map_err(limit)?;
    if !DTYPES.contains(&g.dtype) {
        return Err(unsupported(
            path,
            format!(
                "dtype {} (the kernels store q, K, V and rel_logits as bf16 or fp16)",
                g.dtype
            ),
        ));
    }
    let shape = g.shape();
    let num_splits = match splits {
        SplitSetting::Policy => routing::policy_splits(path, &shape),
        SplitSetting::Forced(n) => n,
    };
    spec.check_splits(num_splits).map_err(limit)?;
    let h = g.num_heads;
    let batch = dim(path, "batch", g.batch(), 65535)?;
    let heads = dim(path, "num_heads", h, 65535)?;
    let rows = dim(path, "real rows", g.real_rows, i32::MAX as usize)?;
    let q_tiles = |rows_per_cta: usize| {
        dim(
            path,
            "query tiles",
            g.max_query_len().div_ceil(rows_per_cta),
            i32::MAX as usize,
        )
    };
    // Every attention kernel puts the G query heads of one KV head in a CTA.
    let g_size = g.group();
    if g_size > CTA_ROWS {
        return Err(unsupported(
            path,
            format!("GQA group {g_size} exceeds {CTA_ROWS} heads per KV head"),
        ));
    }
    let kv_heads = dim(path, "num_kv_heads", g.num_kv_heads, 65535)?;
    let group_tiles = q_tiles(CTA_ROWS / g_size)?;
    let mut launches = Vec::new();
    let (mut piece_keys, mut decode_pieces) = (0, 0);
    // Windowed layers take the path's windowed entry where it has one.
    let kernels = path_kernels(path);
    let query_stage = if g.is_local() && kernels.has(Stage::Windowed) {
        Stage::Windowed
    } else {
        Stage::Main
    };
    let (workspace_splits, shear_width) = match path {
        PathId::ScoreMod => {
            launches.push(Launch {
                stage: query_stage,
                grid: (group_tiles, kv_heads, batch),
            });
            (0, 0)
        }
        PathId::ShearedBias => {
            let s = num_splits;
            launches.push(Launch {
                stage: Stage::Prologue,
                grid: (q_tiles(PROLOGUE_ROWS)?, heads, batch),
            });
            let split_heads = dim(
                path,
                "num_kv_heads x num_splits",
                g.num_kv_heads.saturating_mul(s),
                65535,
            )?;
            launches.push(Launch {
                stage: query_stage,
                grid: (group_tiles, split_heads, batch),
            });
            if s > 1 {
                launches.push(Launch {
                    stage: Stage::Combine,
                    grid: (rows, heads, 1),
                });
            }
            (if s > 1 { s } else { 0 }, g.rel_extent + SHEAR_TILE)
        }
        PathId::Fallback => {
            // Policy: the two-stage decode kernel when docs/operator.md section 4.3 says so
            // (possibly with one split); forced: the decode kernel for more than one split.
            let s = num_splits;
            let decode = match splits {
                SplitSetting::Policy => routing::fallback_decode_splits(&shape).is_some(),
                SplitSetting::Forced(n) => n > 1,
            };
            if decode && !g.decode_only() {
                return Err(unsupported(
                    path,
                    format!("split-KV decode needs a decode-only batch (every q_len <= 1), max q_len is {}", g.max_query_len()),
                ));
            }
            if decode {
                // A CTA per piece of a split; the longest request's splits have the most pieces.
                let split_len = routing::decode_split_len(
                    routing::visible_len(g.max_kv_len(), g.window_left),
                    s,
                );
                let ctas = g.batch().saturating_mul(g.num_kv_heads).saturating_mul(s);
                piece_keys = decode_piece_keys_for(ctas, split_len);
                let (_, pieces) = decode_piece_layout(split_len, piece_keys);
                decode_pieces = pieces;
                let slots = s.saturating_mul(pieces);
                let sx = dim(path, "num_splits x decode pieces", slots, i32::MAX as usize)?;
                // One launch: its last CTA per request and KV head merges the pieces.
                launches.push(Launch {
                    stage: Stage::Decode,
                    grid: (sx, kv_heads, batch),
                });
                // Piece partials, then (when a split has several pieces) the splits' partials.
                (if pieces > 1 { slots + s } else { slots }, 0)
            } else {
                launches.push(Launch {
                    stage: query_stage,
                    grid: (group_tiles, kv_heads, batch),
                });
                (0, 0)
            }
        }
    };
    launches.retain(|l| l.grid.0 > 0 && l.grid.1 > 0 && l.grid.2 > 0);
    debug_assert!(launches.iter().all(|l| kernels.has(l.stage)), "{path}");
    Ok(LaunchPlan {
        path,
        num_splits,
        launches,
        workspace_splits,
        piece_keys,
        decode_pieces,
        shear_width,
    })
}
