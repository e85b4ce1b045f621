#pragma once
#include "query_bias.cuh"
#include "products.cuh"
#include "kv_tma.cuh"
#include "paged_kv.cuh"
#include "softmax.cuh"
// The query block: K/V tiles (by tensor copies on sm_90a), Q K^T, the bias, the online softmax,
// P V, for a block of query rows of one request and KV head.

// A query block on tensor cores with the products of `Products`. K and V tiles of KEY_TILE keys;
// the copy of V(n) overlaps Q K^T(n) and that of K(n + 1) the softmax and P V(n); with wgmma the
// biases of tile n are gathered while the tensor cores form Q K^T(n).
template <class T, class Row, class Products, bool MASKED_STAGE>
__device__ void query_block(const Params& p, const Cta& c, unsigned char* smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const Row ra(p, c, warp * 16 + g), rb(p, c, warp * 16 + g + 8);
    const Products mm(p, c, ra, rb, tq, smem);
    BlockAcc acc;
    const bool aligned = kv_aligned16(p);
    const float scale2 = p.scale * LOG2E;
    i64 kt0;
    const int nt = key_tiles(c, kt0);

    const RelStage<T, Row, MASKED_STAGE> rs(p, c, mm.sr);
    const unsigned bar = mm.sr + REL_STAGE_BYTES;  // K's mbarrier; V's at bar + 8
    KvTma<Products::WG> tma(p, aligned, bar);
    if (nt > 0) {
        if (tma.takes(c, kt0)) tma.issue_k(p, c, kt0, mm.sk, bar);
        else load_tiles<KEY_TILE, true, false, Products::WG>(p, c, kt0, mm.sk, 0u, aligned);
        rs.issue(p, c, ra, rb, warp, g, tq, kt0);
    }
    cp_async_commit();
    for (int it = 0; it < nt; ++it) {
        const i64 kt = kt0 + (i64)it * KEY_TILE;
        // K(it) and V(it) came (or come) by TMA; so does K(it + 1).
        const bool by_tma = tma.takes(c, kt), next_by_tma = it + 1 < nt && tma.takes(c, kt + KEY_TILE);
        __syncthreads();  // every warp is done with V(it - 1)
        if (by_tma) tma.issue_v(p, c, kt, mm.sv, bar + 8);
        else load_tiles<KEY_TILE, false, true, Products::WG>(p, c, kt, 0u, mm.sv, aligned);
        cp_async_commit();
        cp_async_wait<1>();  // K(it) (and Q) have landed, or the stage's rows when K came by TMA
        if (by_tma) tma.wait(bar, tma.parity(c, kt0, it));
        mm.landed();
        // The stage's rows are copied and read by the same quad: with K by TMA only the first
        // tile (Q) needs the CTA barrier.
        if (!by_tma || it == 0) __syncthreads();
        else __syncwarp();
        float s[8][4];
        unsigned x[8][2];
        const bool far = far_tile(p, c, kt, KEY_TILE), plain = rs.interior(p, c, kt);
        mm.qk_issue(s);
        block_biases<T>(p, c, rs, ra, rb, warp, g, tq, kt, far, plain, x);
        mm.qk_wait(s);
        const float sc = scale_scores<T>(far, scale2, x, s);
        __syncthreads();  // every warp is done with K(it)
        if (it + 1 < nt) {
            if (next_by_tma) tma.issue_k(p, c, kt + KEY_TILE, mm.sk, bar);
            else load_tiles<KEY_TILE, true, false, Products::WG>(p, c, kt + KEY_TILE, mm.sk, 0u, aligned);
            rs.issue(p, c, ra, rb, warp, g, tq, kt + KEY_TILE);
        }
        cp_async_commit();
        unsigned pa[4][4];
        float alpha[2];
        softmax_tile<T, 8>(s, sc, acc.m, acc.l, alpha, pa);
        rescale(acc.o, alpha);
        if (by_tma) {
            tma.wait(bar + 8, tma.parity(c, kt0, it));  // V(it) has landed
        } else {
            cp_async_wait<1>();  // V(it) has landed
            mm.landed();
            __syncthreads();
        }
        mm.pv(acc.o, pa);
    }
    cp_async_wait<0>();
    acc.template store<T>(p, c, ra, rb, tq);
}
