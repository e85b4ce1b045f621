#pragma once
#include "query_bias.cuh"
#include "products.cuh"
#include "query_block.cuh"
#include "window_block.cuh"
#include "decode.cuh"
// The attention loops (the shared device code after the CTA's pieces: cta.cuh, ptx.cuh,
// paged_kv.cuh, softmax.cuh), one concern a file:
// query_bias.cuh (biases, scores, softmax rescale), products.cuh (mma.sync and wgmma),
// query_block.cuh, window_block.cuh (sm_90a), decode.cuh (single-query and FMA CTAs); here the
// dispatch between them.

// Run one CTA with the path's row type, in the dynamic shared memory the launcher sized
// (at least ATTN_SMEM_BYTES + SMEM_ALIGN, and the decode ring), aligned here to SMEM_ALIGN.
// WINDOWED (the `*_windowed_*` entries of windowed layers) makes the query blocks also stage the
// tiles that need masks (`RelStage`); it is a separate entry, not a branch, because one entry's
// registers are allocated over every block it holds, and the masked staging's would cost the
// global layers' blocks.
template <class T, class Row, bool WINDOWED = false>
__device__ __forceinline__ void run_cta(const Params& p, const Cta& c) {
    extern __shared__ __align__(128) unsigned char dyn_smem[];
    unsigned char* smem = dyn_smem + ((SMEM_ALIGN - (smem_addr(dyn_smem) & (SMEM_ALIGN - 1))) & (SMEM_ALIGN - 1));
    const int q_len = c.r.q_len;
    if (q_len == 1 && p.G <= 16) mma_decode<T, Row>(p, c, smem);
    else if constexpr (HAS_WINDOW_BLOCK && WINDOWED && Row::REL_ROWS) window_block<T, Row>(p, c, smem);
    else query_block<T, Row, ArchProducts<T>, WINDOWED && Row::REL_ROWS>(p, c, smem);
}

// Run a CTA of a decode-only kernel (every CTA has q_len 1): the streaming single-query CTA when
// G <= 16 (always so in the model), else the FMA loop. Leaving the query-block kernels out of
// the entry keeps its register count, and so the CTAs an SM holds, the decode loop's own.
template <class T, class Row>
__device__ __forceinline__ void run_decode_cta(const Params& p, const Cta& c) {
    extern __shared__ __align__(128) unsigned char dyn_smem[];
    unsigned char* smem = dyn_smem + ((SMEM_ALIGN - (smem_addr(dyn_smem) & (SMEM_ALIGN - 1))) & (SMEM_ALIGN - 1));
    if (p.G <= 16) mma_decode<T, Row, true>(p, c, smem);
    else fma_cta<T, Row>(p, c, smem);
}
