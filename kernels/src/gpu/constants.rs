//! The sizes the kernels are built with, each mirroring a define of the CUDA sources
//! (`constants.cuh`, which `source.rs` writes from these): below every module that plans,
//! writes or launches the programs.

/// Virtual rows (query row x query head of one KV head's group) an attention CTA computes;
/// is `MMA_ROWS` in the CUDA (constants.cuh). A CTA holds `CTA_ROWS / G` query rows.
pub const CTA_ROWS: usize = 64;
/// Query rows (of one head) a sheared_bias prologue CTA fills; mirrors `ROWS` in basics.cuh.
pub(crate) const PROLOGUE_ROWS: usize = 32;
/// Threads per CTA; is `THREADS` in the CUDA (constants.cuh).
pub const CTA_THREADS: u32 = 128;
/// The only head dim the kernels are built for; mirrors `HEAD_DIM`.
pub use crate::routing::HEAD_DIM;
/// Key tile of the sheared bias buffer and of sheared_bias splits; mirrors `SHEAR_TILE`.
pub use crate::routing::SHEAR_TILE;
/// Shared memory of one stage of the single-query CTAs' K/V ring; mirrors `DEC_STAGE_BYTES`.
pub const DEC_STAGE_BYTES: usize = 32768;
/// Ring depths the kernels accept; mirror `DEC_MIN_STAGES` and `DEC_MAX_STAGES`.
pub const DEC_MIN_STAGES: usize = 2;
pub const DEC_MAX_STAGES: usize = 6;
/// Shared memory of a single-query CTA's Q tile, ahead of its ring; mirrors `DEC_Q_BYTES`.
pub const DEC_Q_BYTES: usize = 4096;
/// Shared memory of the rel_logits chunks a ring stage's tile reads, after the ring's K/V
/// stages (the decode entry stages them); mirrors `DEC_BIAS_BYTES`.
pub const DEC_BIAS_BYTES: usize = 3072;
/// What each ring stage takes: its K/V tile and its bias chunks.
pub const DEC_RING_STAGE_BYTES: usize = DEC_STAGE_BYTES + DEC_BIAS_BYTES;
/// Least dynamic shared memory of an attention CTA before alignment slack; mirrors
/// `ATTN_SMEM_BYTES`.
pub const ATTN_SMEM_BYTES: usize = 75776;
/// Least dynamic shared memory of a launch without single-query CTAs, before alignment slack;
/// mirrors `QUERY_SMEM_BYTES`.
pub const QUERY_SMEM_BYTES: usize = 49152;
/// The same for the wgmma query blocks (built for `sm_90a`), which also stage rel_logits rows
/// in shared memory and keep two mbarriers for their tensor copies; mirrors `QUERY_SMEM_BYTES_WG`.
pub const QUERY_SMEM_BYTES_WG: usize = 58432;
/// The same for the wgmma query blocks of windowed layers, which alternate between two V tiles
/// (and keep a third mbarrier); mirrors `QUERY_SMEM_BYTES_WG_WINDOW`.
pub const QUERY_SMEM_BYTES_WG_WINDOW: usize = 74784;
/// Keys per K/V tile of a query block; mirrors `KEY_TILE`.
pub const KEY_TILE: usize = 64;
/// Smallest page whose tiles the sm_90a query blocks copy by TMA (a box per page and half of the
/// head dim, 8 per tile at this size); mirrors `KV_TMA_MIN_PAGE`.
pub const KV_TMA_MIN_PAGE: usize = 16;
/// The architecture whose query blocks are the wgmma kernels.
pub const WGMMA_ARCH: &str = "sm_90a";
/// Alignment the kernels give their tiles inside the dynamic shared memory (the launch adds this
/// much slack); mirrors `SMEM_ALIGN`.
pub const SMEM_ALIGN: usize = 1024;
/// Shared memory the driver reserves per resident CTA (sm_80 and later).
pub const SMEM_RESERVED_PER_CTA: usize = 1024;
/// CTAs a fallback decode launch aims for: when `batch x num_kv_heads x num_splits` is fewer, the
/// decode kernel cuts each split into pieces (`decode_piece_keys`), a CTA and a partial each, and
/// merges a split's pieces into the split's partial. A function of the problem only, so results
/// do not depend on the GPU's SM count.
pub const DECODE_TARGET_CTAS: usize = 256;
/// Fewest keys of a decode piece (16 key tiles): shorter pieces would spend more on starting
/// CTAs and merging than they win.
pub const DECODE_MIN_PIECE_KEYS: usize = 1024;
