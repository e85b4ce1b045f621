// Generated from kernels/src/gpu/source.rs (SHARED_CONSTANTS): edit the Rust constants,
// then write this file from `gpu::constants_header()` (a test prints it when they differ).
#pragma once
// The head dim the kernels are built for.
#define HEAD_DIM 128
// Threads of a CTA (4 warps).
#define THREADS 128
// Virtual rows of a tensor-core CTA (16 per warp).
#define MMA_ROWS 64
// Keys of a tensor-core CTA's tile.
#define KEY_TILE 64
// Key tile of the sheared bias buffer and of sheared_bias splits.
#define SHEAR_TILE 128
// Smallest page whose whole tiles the sm_90a query blocks copy by TMA (a box per page and half head dim: 8 per tile at this size).
#define KV_TMA_MIN_PAGE 16
// A stage of the single-query CTAs' K/V ring (`Params::ring_stages` stages, the launcher sizes the dynamic shared memory for them).
#define DEC_STAGE_BYTES 32768
// The fewest stages of that ring.
#define DEC_MIN_STAGES 2
// The most stages of that ring.
#define DEC_MAX_STAGES 6
// The single-query CTAs' Q tile (16 rows), in shared memory ahead of the ring.
#define DEC_Q_BYTES 4096
// A ring stage's staged rel_logits chunks (4 warps x 16 rows), after the K/V stages.
#define DEC_BIAS_BYTES 3072
// Shared memory of every attention CTA at least (Q, K and V tiles, the FMA loop's fp32 chunks, a minimal decode ring, the decode merge), plus SMEM_ALIGN of slack.
#define ATTN_SMEM_BYTES 75776
// The alignment the kernels give their shared-memory tiles.
#define SMEM_ALIGN 1024
// Launches without single-query CTAs: the query block's tiles.
#define QUERY_SMEM_BYTES 49152
// The wgmma query blocks (sm_90a): also the staged rel_logits rows and two mbarriers.
#define QUERY_SMEM_BYTES_WG 58432
// Their windowed entries (`window_block`): also a second V tile and a third mbarrier.
#define QUERY_SMEM_BYTES_WG_WINDOW 74784
