#pragma once
#include "query_bias.cuh"
#include "fma_loop.cuh"
#include "paged_kv.cuh"
#include "softmax.cuh"
// Single-query CTAs (q_len 1): the streaming mma.sync decode loop with its staged bias, and the
// fp32 FMA loop for groups of more than 16 heads.

// Bias staging of the decode entry (rows whose bias is rel_logits[t, h, d]). A tile's bias
// gathers, issued in its own iteration, wait behind the ring's K/V copies of the tiles ahead
// (about two tiles of streaming under load): the split holding the diagonal, whose last E keys
// need bias, was the decode launch's slowest CTA by 20 us. Instead each warp copies the
// rel_logits chunks of its 16 keys of a tile that needs bias, for every row of the group, in the
// tile's cp.async group, so they land with the tile. Row r's cells for keys kt + 16 w + [0, 16)
// have d = D - [0, 16), D = pos - kt - 16 w: three 8-element chunks from c0 = floor((D - 15) /
// 8) hold them, copied to DEC_BIAS_ROW bytes at slot 16 w + r of the stage's bias region; chunks
// outside [0, E) are not copied (no cell in them reads rel_logits). Needs E % 8 == 0 and a
// 16-byte aligned rel_logits (uniform; else the gathers stay).
__device__ __forceinline__ bool decode_bias_staged(const Params& p) {
    return p.E > 0 && p.E % 8 == 0 && ((unsigned long long)p.rel & 15ull) == 0;
}

template <class T, class Row>
__device__ __forceinline__ void issue_decode_bias(const Params& p, const Cta& c, i64 kt, unsigned at) {
    if (far_tile(p, c, kt, DEC_TILE)) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, chunks = clamp_i32(p.E >> 3);
    for (int k = lane; k < 3 * (int)p.G; k += 32) {
        const int r = k / 3, q = k - 3 * r;
        const Row row(p, c, r);
        const int ch = ((row.pos - (int)kt - 16 * warp - 15) >> 3) + q;
        if (!row.rel_ok || ch < 0 || ch >= chunks) continue;
        const i64 e = row.rel_row + 8 * (i64)ch;
        check_index(e, p.rel_size);
        check_index(e + 7, p.rel_size);
        cp_async16(at + (unsigned)((16 * warp + r) * DEC_BIAS_ROW + 16 * q), (const T*)p.rel + e);
    }
}

// The log2-domain bias of row `row` (fragment row r) for keys j = kt + 16 w + 8 n + 2 tq and
// j + 1 from the staged chunks at bs: -inf outside the CTA's keys [lo, hi), for padding rows and
// where the row's mask hides the key.
template <class T, class Row>
__device__ __forceinline__ void staged_decode_cells(const Params& p, const Cta& c, const Row& row, int r, i64 kt, int n,
                                                    unsigned bs, float& x0, float& x1) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tq = lane & 3;
    const int D = row.pos - (int)kt - 16 * warp, d = D - 8 * n - 2 * tq, j = (int)kt + 16 * warp + 8 * n + 2 * tq;
    // The cell's element.
    const unsigned at =
        bs + (unsigned)((16 * warp + r) * DEC_BIAS_ROW + 2 * (d - 8 * ((D - 15) >> 3)));
    const unsigned b0 = rel_cell<T>(p, d, ld_shared_u16(at));
    const unsigned b1 = rel_cell<T>(p, d - 1, ld_shared_u16(at - 2));
    T v0, v1;
    v0.bits = (unsigned short)b0;
    v1.bits = (unsigned short)b1;
    x0 = row.valid && j >= c.lo && j < c.hi ? to_f32(v0) * LOG2E : neg_inf();
    x1 = row.valid && j + 1 >= c.lo && j + 1 < c.hi ? to_f32(v1) * LOG2E : neg_inf();
}

// A single-query CTA (q_len 1, G <= 16: one 16-row fragment holds every head of the group) that
// streams K/V at bandwidth: `p.ring_stages - 1` tiles of DEC_TILE keys in flight while one is
// computed (the launcher picks the depth for the CTAs an SM holds), the block-table entries of
// the next tile to copy read one iteration ahead. Warp w takes keys [16 w, 16 w + 16) of every
// tile with its own online softmax over the whole head dim (no work is repeated across warps)
// and copies those rows itself, so the warps run the loop without CTA barriers, each waiting
// only for its own copies; at the end the four warps' states merge through shared memory by
// their maxima and each warp stores a quarter of the head dim.
template <class T, class Row, bool DECODE_ENTRY = false>
__device__ void mma_decode(const Params& p, const Cta& c, unsigned char* smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    // Q (16 rows) sits in shared memory ahead of the ring and is read by ldmatrix per tile,
    // which keeps the loop's registers below what the query-block kernels are built for.
    const unsigned sq = smem_addr(smem), ring = sq + DEC_Q_BYTES;
    const unsigned stage_bytes = DEC_STAGE_BYTES, v_at = DEC_TILE * HEAD_DIM * 2;
    const int stages = (int)imin(imax(p.ring_stages, DEC_MIN_STAGES), DEC_MAX_STAGES);
    const Row ra(p, c, g), rb(p, c, g + 8);
    {
        unsigned qf[8][4];
        load_q_frag(p, ra, rb, tq, qf);
        if (warp == 0) {  // every warp holds the same fragments
#pragma unroll
            for (int ks = 0; ks < 8; ++ks) {
                const unsigned lo = (unsigned)(2 * tq) * 2u;  // bytes into the 16-byte chunk
                asm volatile("st.shared.u32 [%0], %1;" ::"r"(sq + swz(g, 2 * ks) + lo), "r"(qf[ks][0]) : "memory");
                asm volatile("st.shared.u32 [%0], %1;" ::"r"(sq + swz(g + 8, 2 * ks) + lo), "r"(qf[ks][1]) : "memory");
                asm volatile("st.shared.u32 [%0], %1;" ::"r"(sq + swz(g, 2 * ks + 1) + lo), "r"(qf[ks][2]) : "memory");
                asm volatile("st.shared.u32 [%0], %1;" ::"r"(sq + swz(g + 8, 2 * ks + 1) + lo), "r"(qf[ks][3]) : "memory");
            }
        }
    }
    const int q_row = lane & 15, q_ch = lane >> 4;
    float o[16][4];
#pragma unroll
    for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
    const bool aligned = kv_aligned16(p);
    const float scale2 = p.scale * LOG2E;
    const i64 kt0 = c.lo / DEC_TILE * DEC_TILE;
    const int nt = c.hi > c.lo ? (int)cdiv(c.hi - kt0, DEC_TILE) : 0;
    const int k_row = 16 * warp + (lane & 7) + ((lane >> 4) << 3), k_ch = (lane >> 3) & 1;
    const int v_row = 16 * warp + (lane & 7) + (((lane >> 3) & 1) << 3), v_ch = lane >> 4;

    // The decode entry's staged bias chunks (`issue_decode_bias`), one region per ring stage.
    constexpr bool STAGES_BIAS = DECODE_ENTRY && Row::REL_ROWS;
    const unsigned bias_ring = ring + stages * stage_bytes;
    bool stage_bias = false;
    if constexpr (STAGES_BIAS) stage_bias = decode_bias_staged(p);
    for (int st = 0; st < stages - 1; ++st) {
        if (st < nt) {
            const unsigned at = ring + st * stage_bytes;
            load_tiles<DEC_TILE, true, true, false, true>(p, c, kt0 + (i64)st * DEC_TILE, at, at + v_at, aligned);
            if constexpr (STAGES_BIAS) {
                if (stage_bias) issue_decode_bias<T, Row>(p, c, kt0 + (i64)st * DEC_TILE, bias_ring + st * DEC_BIAS_BYTES);
            }
        }
        cp_async_commit();
    }
    __syncthreads();  // Q is in shared memory
    TileRows<DEC_TILE, true> next = fetch_rows<DEC_TILE, true>(p, c, kt0 + (i64)(stages - 1) * DEC_TILE);
    int fill = stages - 1, use = 0;  // ring stages of tiles it + stages - 1 and it
    for (int it = 0; it < nt; ++it) {
        if (it + stages - 1 < nt) {
            // The stage of tile it - 1: this warp's rows of it, released by the warp barrier that
            // ended the last iteration.
            const unsigned at = ring + fill * stage_bytes;
            issue_tiles<DEC_TILE, true, true>(p, c, next, at, at + v_at, aligned);
            if constexpr (STAGES_BIAS) {
                if (stage_bias)
                    issue_decode_bias<T, Row>(p, c, kt0 + (i64)(it + stages - 1) * DEC_TILE, bias_ring + fill * DEC_BIAS_BYTES);
            }
        }
        cp_async_commit();
        next = fetch_rows<DEC_TILE, true>(p, c, kt0 + (i64)(it + stages) * DEC_TILE);
        fill = fill + 1 == stages ? 0 : fill + 1;
        const i64 kt = kt0 + (i64)it * DEC_TILE;
        float s[2][4];
        const bool far = far_tile(p, c, kt, DEC_TILE);
        bool staged = false;  // this tile's bias is read from its stage after the wait
        if constexpr (STAGES_BIAS) staged = stage_bias && !far;
        if (far || staged) {
#pragma unroll
            for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        } else {
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const int j = (int)kt + 16 * warp + 8 * n + 2 * tq;
                bias_cells(p, c, ra, j, s[n][0], s[n][1]);
                bias_cells(p, c, rb, j, s[n][2], s[n][3]);
            }
        }
        cp_async_wait_dyn(stages - 1);  // this thread's copies of tile it have landed
        __syncwarp();                    // and those of the whole warp (its rows of the tile)
        const unsigned sk = ring + use * stage_bytes, sv = sk + v_at;
        if constexpr (STAGES_BIAS) {
            if (staged) {
                const unsigned bs = bias_ring + use * DEC_BIAS_BYTES;
#pragma unroll
                for (int n = 0; n < 2; ++n) {
                    staged_decode_cells<T, Row>(p, c, ra, g, kt, n, bs, s[n][0], s[n][1]);
                    staged_decode_cells<T, Row>(p, c, rb, g + 8, kt, n, bs, s[n][2], s[n][3]);
                }
            }
        }
        use = use + 1 == stages ? 0 : use + 1;
        float acc[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
            unsigned a[4], b0, b1, b2, b3;
            ldsm_x4(sq + swz(q_row, 2 * ks + q_ch), a[0], a[1], a[2], a[3]);
            ldsm_x4(sk + swz(k_row, 2 * ks + k_ch), b0, b1, b2, b3);
            Tc<T>::mma(acc[0], a, b0, b1);
            Tc<T>::mma(acc[1], a, b2, b3);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = fmaf(acc[n][e], scale2, s[n][e]);
        unsigned pa[1][4];
        float alpha[2];
        softmax_tile<T, 2>(s, 1.f, m, l, alpha, pa);
        rescale(o, alpha);
#pragma unroll
        for (int dp = 0; dp < 8; ++dp) {
            unsigned b0, b1, b2, b3;
            ldsm_x4_trans(sv + swz(v_row, 2 * dp + v_ch), b0, b1, b2, b3);
            Tc<T>::mma(o[2 * dp], pa[0], b0, b1);
            Tc<T>::mma(o[2 * dp + 1], pa[0], b2, b3);
        }
        __syncwarp();  // the warp's rows of tile it's stage may be refilled
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring is free: it holds the warps' states now
    // Warp w's state: po[w][row][dim] (fp32), pm[w][row] (log2-domain max), pl[w][row] (sum).
    float* po = reinterpret_cast<float*>(smem);
    float* pm = po + 4 * 16 * HEAD_DIM;
    float* pl = pm + 4 * 16;
    const float la = quad_sum(l[0]), lb = quad_sum(l[1]);
#pragma unroll
    for (int n = 0; n < 16; ++n) {
        const int d = 8 * n + 2 * tq;
        po[(warp * 16 + g) * HEAD_DIM + d] = o[n][0];
        po[(warp * 16 + g) * HEAD_DIM + d + 1] = o[n][1];
        po[(warp * 16 + g + 8) * HEAD_DIM + d] = o[n][2];
        po[(warp * 16 + g + 8) * HEAD_DIM + d + 1] = o[n][3];
    }
    if (tq == 0) {
        pm[warp * 16 + g] = m[0];
        pm[warp * 16 + g + 8] = m[1];
        pl[warp * 16 + g] = la;
        pl[warp * 16 + g + 8] = lb;
    }
    __syncthreads();
    // Merge for rows g and g + 8, dims [32 w, 32 w + 32) of this thread's fragment positions.
    float mm[2], ll[2], sc[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = g + 8 * r;
        float mx = neg_inf();
#pragma unroll
        for (int w = 0; w < 4; ++w) mx = fmaxf(mx, pm[w * 16 + row]);
        const float base = mx == neg_inf() ? 0.f : mx;  // exp2(-inf - -inf) would be NaN
        ll[r] = 0.f;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            sc[r][w] = fast_exp2(pm[w * 16 + row] - base);
            ll[r] += sc[r][w] * pl[w * 16 + row];
        }
        mm[r] = mx;
    }
    float oq[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) {
        const int d = 32 * warp + 8 * n + 2 * tq;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = e >> 1, row = g + 8 * r, dd = d + (e & 1);
            float x = 0.f;
#pragma unroll
            for (int w = 0; w < 4; ++w) x += sc[r][w] * po[(w * 16 + row) * HEAD_DIM + dd];
            oq[n][e] = x;
        }
    }
    const bool lse = warp == 0 && tq == 0;
    store_row<T>(p, c, ra, mm[0], ll[0], oq, 0, 32 * warp, tq, lse);
    store_row<T>(p, c, rb, mm[1], ll[1], oq, 1, 32 * warp, tq, lse);
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
