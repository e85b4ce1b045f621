#pragma once
#include "query_block.cuh"
#include "sm90.cuh"
// The sm_90a query block of windowed layers (local layers' blocks near the diagonal).

#ifdef __CUDA_ARCH_FEAT_SM90_ALL
// Tensor copies of the windowed blocks (`window_block`): as `KvTma` (same conditions and boxes),
// but a tile comes this way when every key of it is one the request's rows may read, inside
// [first_visible(first row), kv_len), not only inside the CTA's [lo, hi): keys the CTA's rows do
// not see are masked (-inf scores, p = 0 against finite values; cache slots outside that range
// may hold anything, NaN included, and are never read). Only a CTA's first tile (when it starts
// before that range) and its last (when it ends past kv_len) take the cp.async copies, so the
// tiles that come by TMA are consecutive: tile `it` is the u = it - skip0'th, K's phase is u's
// parity, and V tiles alternate between two buffers, each with its mbarrier (at bar + 8 and
// bar + 16), whose phase is the parity of u / 2. `on` and `takes` are uniform.
struct RangeKvTma {
    bool on;
    i64 first, last;  // tiles [first, last] of 64-aligned keys may come by TMA

    __device__ __forceinline__ RangeKvTma(const Params& p, const Cta& c, bool aligned, unsigned bar)
        : on(KvTma<true>::usable(p, aligned)), first(first_visible(p, c.r.prefix())), last(c.r.kv_len - KEY_TILE) {
        if (on) KvTma<true>::init_barriers(bar, 3);
    }
    // Uniform: tile kt (64-aligned) comes by TMA.
    __device__ __forceinline__ bool takes(i64 kt) const { return on && kt >= first && kt <= last; }
};

// The sm_90a query block of windowed layers (every tile near the diagonal, 9 tiles a CTA in the
// model), whose time is the latency of each tile's chain of copies, products, bias and softmax
// rather than any throughput: the pieces of that chain overlap more than in `query_block`.
// Tile n's K (one buffer) and V (buffer u & 1) are copied together, in iteration n - 1 once
// Q K^T(n - 1) and P V(n - 2) are complete, so V has more than an iteration to land; the
// stage's rows of tile n + 1 are copied as soon as the quad has read tile n's (before Q K^T(n)
// completes); P V(n) is issued and not waited for: it runs while the warps wait for K(n + 1),
// issue Q K^T(n + 1) and read its biases, and one wait covers both. Per tile: one CTA barrier
// (every warp is done with K(n) and V(n - 1)) and, with K by TMA, a warp sync after the copies
// landed (the staged bias rows are copied and read by the same quad). It takes 16 KiB more
// shared memory than `query_block` (the second V tile; QUERY_SMEM_BYTES_WG_WINDOW), and the
// global layers keep `query_block`: in their entries this loop raised the spills (92 bytes
// instead of 50 on sm_90a) and prefill8k took 2% longer.
template <class T, class Row>
__device__ void window_block(const Params& p, const Cta& c, unsigned char* smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const Row ra(p, c, warp * 16 + g), rb(p, c, warp * 16 + g + 8);
    const WgProducts<T, 2> mm(p, c, ra, rb, tq, smem);
    BlockAcc acc;
    const bool aligned = kv_aligned16(p);
    const float scale2 = p.scale * LOG2E;
    i64 kt0;
    const int nt = key_tiles(c, kt0);

    const RelStage<T, Row, true> rs(p, c, mm.sr);
    const unsigned bar = mm.sr + REL_STAGE_BYTES;  // K's mbarrier; V buffer b's at bar + 8 + 8 b
    const RangeKvTma tma(p, c, aligned, bar);
    const int skip0 = tma.takes(kt0) ? 0 : 1;
    // Tile it's K and V (into buffer (it - skip0) & 1).
    auto issue_kv = [&](int it) {
        const i64 kt = kt0 + (i64)it * KEY_TILE;
        const int b = (it - skip0) & 1;
        const unsigned v = mm.sv + (unsigned)b * WgProducts<T, 2>::TILE_BYTES;
        if (tma.takes(kt)) {
            KvTma<true>::issue_k(p, c, kt, mm.sk, bar);
            KvTma<true>::issue_v(p, c, kt, v, bar + 8 + 8 * b);
        } else {
            load_tiles<KEY_TILE, true, true, true>(p, c, kt, mm.sk, v, aligned);
        }
    };
    if (nt > 0) {
        issue_kv(0);
        rs.issue(p, c, ra, rb, warp, g, tq, kt0);
    }
    cp_async_commit();
    for (int it = 0; it < nt; ++it) {
        const i64 kt = kt0 + (i64)it * KEY_TILE;
        const int u = it - skip0;
        const bool by_tma = tma.takes(kt);
        cp_async_wait<0>();  // this thread's copies of tile it (and Q) have landed
        if (by_tma) mbar_wait(bar, (unsigned)u & 1u);
        fence_proxy_async();
        // The stage's rows are copied and read by the same quad: with K by TMA only the first
        // tile (Q) needs the CTA barrier.
        if (!by_tma || it == 0) __syncthreads();
        else __syncwarp();
        float s[8][4];
        unsigned x[8][2];
        const bool far = far_tile(p, c, kt, KEY_TILE), plain = rs.interior(p, c, kt);
        mm.qk_issue(s);
        block_biases<T>(p, c, rs, ra, rb, warp, g, tq, kt, far, plain, x);
        if (it + 1 < nt) {
            __syncwarp();  // the quad is done reading its rows of the stage
            rs.issue(p, c, ra, rb, warp, g, tq, kt + KEY_TILE);
        }
        mm.qk_pv_wait(s, acc.o);
        const float sc = scale_scores<T>(far, scale2, x, s);
        __syncthreads();  // every warp is done with K(it) and V(it - 1)
        if (it + 1 < nt) issue_kv(it + 1);
        cp_async_commit();
        unsigned pa[4][4];
        float alpha[2];
        softmax_tile<T, 8>(s, sc, acc.m, acc.l, alpha, pa);
        rescale(acc.o, alpha);
        if (by_tma) mbar_wait(bar + 8 + 8 * (u & 1), (unsigned)(u >> 1) & 1u);  // V(it) has landed
        mm.pv_issue(acc.o, pa, u & 1);
    }
    mm.pv_wait(acc.o);
    cp_async_wait<0>();
    acc.template store<T>(p, c, ra, rb, tq);
}
#endif

// Whether this architecture has the windowed query block (sm_90a). Elsewhere it is only declared,
// for the dispatch's discarded branch (`if constexpr`), and never instantiated.
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
constexpr bool HAS_WINDOW_BLOCK = true;
#else
constexpr bool HAS_WINDOW_BLOCK = false;
template <class T, class Row>
__device__ void window_block(const Params& p, const Cta& c, unsigned char* smem);
#endif
