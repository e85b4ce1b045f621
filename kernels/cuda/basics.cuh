#pragma once
// The basics every relattn file uses: the sizes (from the Rust side, and the kernel-only ones),
// bf16 and fp16 as 16-bit patterns with their conversions, and integer helpers. NVRTC gets the
// project's headers in memory (`gpu::source`); it has no toolkit headers on the target machines,
// so nothing else is included. bf16 and fp16 are converted by bit operations and inline PTX.
//
// Organisation shared by the three paths' attention kernels. A CTA (THREADS = 4 warps) owns
// MMA_ROWS "virtual rows" of one request and one KV head: virtual row vr is query row
// i0 + vr / G of the request and the query head of group member vr % G, so the G query heads
// that read one KV head share every K/V tile the CTA loads. The CTA walks its keys [lo, hi) in
// tiles; each path supplies a row type (its bias and masks) and the kernel entry that picks
// the CTA's rows and keys. bf16/fp16 run on tensor cores (mma.sync m16n8k16, ldmatrix,
// cp.async; wgmma on sm_90a): `query_block` for query blocks, `mma_decode` for single-query
// CTAs (q_len 1, G <= 16) where bandwidth is all that matters; decode groups of G > 16 keep an
// FMA loop (`fma_cta`).

typedef long long i64;

// The sizes the launch planning shares (HEAD_DIM, THREADS, MMA_ROWS, KEY_TILE, SHEAR_TILE,
// KV_TMA_MIN_PAGE, the decode ring's and the shared-memory sizes) come from the Rust side.
#include "constants.cuh"
// A CTA of the FMA loop and the prologue computes ROWS "virtual rows" (a query row and a head)
// with LANES threads each.
#define ROWS 32
#define LANES 4
#define DIMS_PER_LANE (HEAD_DIM / LANES)
// Keys staged through shared memory at a time.
#define KCHUNK 32
// Single-query CTAs: tiles of DEC_TILE keys (K and V) in the ring of DEC_STAGE_BYTES stages.
#define DEC_TILE 64
// The rel_logits chunks each ring stage's tile reads, when the decode entry stages them: 48
// bytes per warp and row (`issue_decode_bias`), after the ring's K/V stages.
#define DEC_BIAS_ROW 48
static_assert(DEC_BIAS_BYTES == 4 * 16 * DEC_BIAS_ROW, "a bias region: 4 warps x 16 rows");
static_assert(DEC_STAGE_BYTES == 2 * DEC_TILE * HEAD_DIM * 2, "a ring stage holds K and V of DEC_TILE keys");
static_assert(DEC_TILE == 4 * 16, "each of the 4 warps of a decode CTA takes 16 keys of a tile");
static_assert(QUERY_SMEM_BYTES >= 3 * KEY_TILE * HEAD_DIM * 2, "Q, K and V tiles of a query block fit");
static_assert(QUERY_SMEM_BYTES >= 2 * KCHUNK * HEAD_DIM * 4, "the FMA loop's fp32 K and V chunks fit");
static_assert(ATTN_SMEM_BYTES >= QUERY_SMEM_BYTES && ATTN_SMEM_BYTES >= QUERY_SMEM_BYTES_WG &&
                  ATTN_SMEM_BYTES >= QUERY_SMEM_BYTES_WG_WINDOW,
              "a launch with single-query CTAs runs query blocks too");
static_assert(ATTN_SMEM_BYTES >= DEC_Q_BYTES + DEC_MIN_STAGES * (DEC_STAGE_BYTES + DEC_BIAS_BYTES),
              "the minimal decode ring and its bias regions fit");
static_assert(DEC_Q_BYTES == 16 * HEAD_DIM * 2, "Q of a single-query CTA: 16 rows");
static_assert(MMA_ROWS == KEY_TILE, "the wgmma kernel lays Q out like a key tile");
static_assert(ATTN_SMEM_BYTES >= (4 * 16 * HEAD_DIM + 2 * 4 * 16) * 4, "the decode merge fits");
static_assert(ATTN_SMEM_BYTES >= 2 * KCHUNK * HEAD_DIM * 4, "the FMA loop's fp32 K and V chunks fit");
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

struct bf16 {
    unsigned short bits;
};
struct fp16 {
    unsigned short bits;
};

__device__ __forceinline__ float to_f32(bf16 x) { return __uint_as_float(((unsigned int)x.bits) << 16); }
__device__ __forceinline__ float to_f32(fp16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float to_f32(float x) { return x; }

template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) {
    bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}
template <> __device__ __forceinline__ fp16 from_f32<fp16>(float x) {
    fp16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ i64 imin(i64 a, i64 b) { return a < b ? a : b; }
__device__ __forceinline__ i64 imax(i64 a, i64 b) { return a > b ? a : b; }
__device__ __forceinline__ i64 cdiv(i64 a, i64 b) { return (a + b - 1) / b; }
// A window or extent for 32-bit comparisons with distances d <= INT32_MAX (positions are int32):
// values past that compare the same as INT32_MAX.
__device__ __forceinline__ int clamp_i32(i64 x) { return (int)imin(x, 0x7fffffff); }
