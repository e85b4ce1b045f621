// The attention loops (part 3 of the shared device code, after cta.cuh): tensor-core query
// blocks, single-query decode CTAs, the fp32 FMA loop, and the dispatch between them.

// A query block on tensor cores. Warp w owns virtual rows [16 w, 16 w + 16): S = Q K^T and
// O += P V with m16n8k16 MMAs, Q in registers, K and V tiles of KEY_TILE keys in swizzled shared
// memory. The copy of V(n) overlaps Q K^T(n) and that of K(n + 1) the softmax and P V(n).
template <class T, class Row>
__device__ void mma_main(const Params& p, const Cta& c, unsigned char* smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const unsigned sk = smem_addr(smem), sv = sk + KEY_TILE * HEAD_DIM * 2;
    const Row ra(p, c, warp * 16 + g), rb(p, c, warp * 16 + g + 8);
    unsigned qf[8][4];
    load_q_frag(p, ra, rb, tq, qf);
    float o[16][4];
#pragma unroll
    for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
    const bool aligned = kv_aligned16(p);
    const float scale2 = p.scale * LOG2E;
    const i64 kt0 = c.lo / KEY_TILE * KEY_TILE;
    const int nt = c.hi > c.lo ? (int)cdiv(c.hi - kt0, KEY_TILE) : 0;
    // ldmatrix row/chunk of this lane: K (B of Q K^T, two n-tiles per x4) and V (B of P V, .trans).
    const int k_row = (lane & 7) + ((lane >> 4) << 3), k_ch = (lane >> 3) & 1;
    const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_ch = lane >> 4;

    if (nt > 0) load_tiles<KEY_TILE, true, false>(p, c, kt0, sk, 0u, aligned);
    cp_async_commit();
    for (int it = 0; it < nt; ++it) {
        const i64 kt = kt0 + (i64)it * KEY_TILE;
        __syncthreads();  // every warp is done with V(it - 1)
        load_tiles<KEY_TILE, false, true>(p, c, kt, 0u, sv, aligned);
        cp_async_commit();
        cp_async_wait<1>();  // K(it) has landed
        __syncthreads();
        float s[8][4];
#pragma unroll
        for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                unsigned b0, b1, b2, b3;
                ldsm_x4(sk + swz(16 * np + k_row, 2 * ks + k_ch), b0, b1, b2, b3);
                Tc<T>::mma(s[2 * np], qf[ks], b0, b1);
                Tc<T>::mma(s[2 * np + 1], qf[ks], b2, b3);
            }
        }
        // Scale and bias (after the MMAs: holding the bias through them costs the registers
        // the MMA pipeline needs; far tiles have no bias work at all).
        if (far_tile(p, c, kt, KEY_TILE)) {
#pragma unroll
            for (int n = 0; n < 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[n][e] *= scale2;
        } else {
#pragma unroll
            for (int n = 0; n < 8; ++n) {
                const int j = (int)kt + 8 * n + 2 * tq;
                float x[4];
                bias_cells(p, c, ra, j, x[0], x[1]);
                bias_cells(p, c, rb, j, x[2], x[3]);
#pragma unroll
                for (int e = 0; e < 4; ++e) s[n][e] = fmaf(s[n][e], scale2, x[e]);
            }
        }
        __syncthreads();  // every warp is done with K(it)
        if (it + 1 < nt) load_tiles<KEY_TILE, true, false>(p, c, kt + KEY_TILE, sk, 0u, aligned);
        cp_async_commit();
        unsigned pa[4][4];
        float alpha[2];
        softmax_tile<T, 8>(s, m, l, alpha, pa);
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
        cp_async_wait<1>();  // V(it) has landed
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
            for (int dp = 0; dp < 8; ++dp) {
                unsigned b0, b1, b2, b3;
                ldsm_x4_trans(sv + swz(16 * kk + v_row, 2 * dp + v_ch), b0, b1, b2, b3);
                Tc<T>::mma(o[2 * dp], pa[kk], b0, b1);
                Tc<T>::mma(o[2 * dp + 1], pa[kk], b2, b3);
            }
        }
    }
    cp_async_wait<0>();
    const float la = quad_sum(l[0]), lb = quad_sum(l[1]);
    store_row<T>(p, c, ra, m[0], la, o, 0, 0, tq, tq == 0);
    store_row<T>(p, c, rb, m[1], lb, o, 1, 0, tq, tq == 0);
}

// A single-query CTA (q_len 1, G <= 16: one 16-row fragment holds every head of the group) that
// streams K/V at bandwidth: DEC_STAGES - 1 tiles in flight while one is computed. Every warp
// computes the same S = Q K^T and softmax state (identical instructions on identical data) and
// then P V for its own quarter of the head dim, so no warp waits on another's partial result.
template <class T, class Row>
__device__ void mma_decode(const Params& p, const Cta& c, unsigned char* smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const unsigned ring = smem_addr(smem);
    const unsigned stage_bytes = 2 * DEC_TILE * HEAD_DIM * 2, v_at = DEC_TILE * HEAD_DIM * 2;
    const Row ra(p, c, g), rb(p, c, g + 8);
    unsigned qf[8][4];
    load_q_frag(p, ra, rb, tq, qf);
    float o[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
    const bool aligned = kv_aligned16(p);
    const float scale2 = p.scale * LOG2E;
    const i64 kt0 = c.lo / DEC_TILE * DEC_TILE;
    const int nt = c.hi > c.lo ? (int)cdiv(c.hi - kt0, DEC_TILE) : 0;
    const int k_row = (lane & 7) + ((lane >> 4) << 3), k_ch = (lane >> 3) & 1;
    const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_ch = lane >> 4;

#pragma unroll
    for (int st = 0; st < DEC_STAGES - 1; ++st) {
        if (st < nt) {
            const i64 j0 = kt0 + (i64)st * DEC_TILE;
            const unsigned at = ring + st * stage_bytes;
            load_tiles<DEC_TILE, true, true>(p, c, j0, at, at + v_at, aligned);
        }
        cp_async_commit();
    }
    for (int it = 0; it < nt; ++it) {
        const int ahead = it + DEC_STAGES - 1;
        if (ahead < nt) {
            // The stage of tile it - 1, released by the barrier that ended the last iteration.
            const i64 j0 = kt0 + (i64)ahead * DEC_TILE;
            const unsigned at = ring + (ahead % DEC_STAGES) * stage_bytes;
            load_tiles<DEC_TILE, true, true>(p, c, j0, at, at + v_at, aligned);
        }
        cp_async_commit();
        const i64 kt = kt0 + (i64)it * DEC_TILE;
        float s[4][4];
        if (far_tile(p, c, kt, DEC_TILE)) {
#pragma unroll
            for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        } else {
#pragma unroll
            for (int n = 0; n < 4; ++n) {
                const int j = (int)kt + 8 * n + 2 * tq;
                bias_cells(p, c, ra, j, s[n][0], s[n][1]);
                bias_cells(p, c, rb, j, s[n][2], s[n][3]);
            }
        }
        cp_async_wait<DEC_STAGES - 1>();  // tile it has landed
        __syncthreads();
        const unsigned sk = ring + (it % DEC_STAGES) * stage_bytes, sv = sk + v_at;
        float acc[4][4];
#pragma unroll
        for (int n = 0; n < 4; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
            for (int np = 0; np < 2; ++np) {
                unsigned b0, b1, b2, b3;
                ldsm_x4(sk + swz(16 * np + k_row, 2 * ks + k_ch), b0, b1, b2, b3);
                Tc<T>::mma(acc[2 * np], qf[ks], b0, b1);
                Tc<T>::mma(acc[2 * np + 1], qf[ks], b2, b3);
            }
        }
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = fmaf(acc[n][e], scale2, s[n][e]);
        unsigned pa[2][4];
        float alpha[2];
        softmax_tile<T, 4>(s, m, l, alpha, pa);
#pragma unroll
        for (int n = 0; n < 4; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
            for (int dp = 0; dp < 2; ++dp) {
                unsigned b0, b1, b2, b3;
                ldsm_x4_trans(sv + swz(16 * kk + v_row, 4 * warp + 2 * dp + v_ch), b0, b1, b2, b3);
                Tc<T>::mma(o[2 * dp], pa[kk], b0, b1);
                Tc<T>::mma(o[2 * dp + 1], pa[kk], b2, b3);
            }
        }
        __syncthreads();  // the stage of tile it may be refilled
    }
    cp_async_wait<0>();
    const float la = quad_sum(l[0]), lb = quad_sum(l[1]);
    const bool lse = warp == 0 && tq == 0;
    store_row<T>(p, c, ra, m[0], la, o, 0, 32 * warp, tq, lse);
    store_row<T>(p, c, rb, m[1], lb, o, 1, 32 * warp, tq, lse);
}

// fp32: the FMA loop, ROWS virtual rows per pass (as many passes as the CTA has live rows).
template <class T, class Row>
__device__ void fma_cta(const Params& p, const Cta& c, unsigned char* smem) {
    float(*sk)[HEAD_DIM] = reinterpret_cast<float(*)[HEAD_DIM]>(smem);
    float(*sv)[HEAD_DIM] = sk + KCHUNK;
    const int live = (int)(imin(c.i0 + c.rows_q, c.r.q_len) - c.i0) * (int)p.G;
    const Slot sl = thread_slot();
    for (int first = 0; first < live; first += ROWS) {  // uniform over the CTA
        const Row row(p, c, first + sl.vr);
        float q[DIMS_PER_LANE];
        load_q_row<T>(p, row.valid, row.t, row.h, sl.lane, q);
        Softmax sm;
        sm.init();
        for (i64 j0 = c.lo; j0 < c.hi; j0 += KCHUNK) {
            __syncthreads();
            load_kv_chunk<T>(p, c.b, c.kvh, j0, c.lo, c.hi, sk, sv);
            __syncthreads();
            float s[KCHUNK];
            chunk_dots(q, sk, sl.lane, s);
#pragma unroll
            for (int jj = 0; jj < KCHUNK; ++jj) {
                const i64 j = j0 + jj;
                s[jj] = j < c.hi ? s[jj] * p.scale + row.bias(p, (int)j) : neg_inf();
            }
            sm.update(s, sv, sl.lane);
        }
        if (row.valid) {
            if (c.partial) sm.store_partial(p, c.split, row.t, row.h, sl.lane);
            else sm.store_out<T>(p, row.t, row.h, sl.lane);
        }
    }
}

// Run one CTA with the path's row type.
template <class T, class Row>
__device__ __forceinline__ void run_cta(const Params& p, const Cta& c) {
    __shared__ __align__(128) unsigned char smem[SMEM_BYTES];
    if constexpr (IsF32<T>::value) {
        fma_cta<T, Row>(p, c, smem);
    } else {
        if (c.r.q_len == 1 && p.G <= 16) mma_decode<T, Row>(p, c, smem);
        else mma_main<T, Row>(p, c, smem);
    }
}
