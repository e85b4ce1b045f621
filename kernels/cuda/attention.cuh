#pragma once
#include "cta.cuh"
// The attention loops (part 3 of the shared device code, after cta.cuh): tensor-core query
// blocks, single-query decode CTAs, the fp32 FMA loop, and the dispatch between them.

// Biases of a query block's key tile [kt, kt + 8 NT) (-inf where masked) for the thread's rows ra
// (cells 0, 1) and rb (cells 2, 3), for a tile that is not `far_tile`, packed two to a register
// in the dtype: every bias is a dtype value, 0 or -inf, so the packing is exact, and it keeps
// the registers low enough to compute them while the tensor cores form Q K^T (sm_90a).
template <class T, int NT, class Row>
__device__ __forceinline__ void tile_bias(const Params& p, const Cta& c, const Row& ra, const Row& rb, i64 kt, int tq,
                                          unsigned (&x)[NT][2]) {
    float b[4];
    if (kt >= c.lo && kt + 8 * NT <= c.hi) {  // every key of the tile is the CTA's
        const int j0 = (int)kt + 2 * tq;
        const auto ca = ra.cursor(p, j0);
        const auto cb = rb.cursor(p, j0);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            ra.bias_pair(p, ca, 8 * n, b[0], b[1]);
            rb.bias_pair(p, cb, 8 * n, b[2], b[3]);
            x[n][0] = Tc<T>::pack(b[0], b[1]);
            x[n][1] = Tc<T>::pack(b[2], b[3]);
        }
    } else {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const int j = (int)kt + 8 * n + 2 * tq;
            bias_cells_raw(p, c, ra, j, b[0], b[1]);
            bias_cells_raw(p, c, rb, j, b[2], b[3]);
            x[n][0] = Tc<T>::pack(b[0], b[1]);
            x[n][1] = Tc<T>::pack(b[2], b[3]);
        }
    }
}

// Scores into the log2 domain, s * scale2 + bias * log2(e), on tiles that are not far; far tiles
// (no bias) keep the raw products and the softmax applies scale2 when it is positive (its
// maximum over raw scores is then the maximum of the scaled ones), else they are scaled here.
// Returns the scale the softmax is to apply.
template <class T, int NT>
__device__ __forceinline__ float scale_scores(bool far, float scale2, const unsigned (&x)[NT][2], float (&s)[NT][4]) {
    if (far) {
        if (scale2 > 0.f) return scale2;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] *= scale2;
        return 1.f;
    }
    const float to_log2 = LOG2E;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        s[n][0] = fmaf(s[n][0], scale2, Tc<T>::lo(x[n][0]) * to_log2);
        s[n][1] = fmaf(s[n][1], scale2, Tc<T>::hi(x[n][0]) * to_log2);
        s[n][2] = fmaf(s[n][2], scale2, Tc<T>::lo(x[n][1]) * to_log2);
        s[n][3] = fmaf(s[n][3], scale2, Tc<T>::hi(x[n][1]) * to_log2);
    }
    return 1.f;
}

// Rescale the output rows of the thread (cells 0, 1: row a; 2, 3: row b) by the softmax's alpha.
// Once the rows' maxima settle most tiles leave every alpha of the warp at exactly 1 (exp2(0)):
// the multiplies are skipped then (x * 1 == x, so the result is the same). Every thread of the
// warp must call this.
template <int NO> __device__ __forceinline__ void rescale(float (&o)[NO][4], const float (&alpha)[2]) {
    if (__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) return;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
    }
}

// rel_logits rows of a query block staged in shared memory one key tile ahead, for paths whose
// bias is rel_logits[t, h, d] when 0 <= d < E, else 0 (`Row::REL_ROWS`), in CTAs whose rows are
// all real, with rel_logits 16-byte aligned and E a multiple of 8. A row's cells of key tile kt
// are d in [pos - kt - 63, pos - kt]: 64 contiguous elements, copied as the 16-byte chunks that
// hold them (rows start on a chunk and E is a multiple of 8, so a chunk is wholly inside or
// outside the row). Virtual row r takes REL_STAGE_ROW bytes at r * REL_STAGE_ROW; its first
// chunk is element (pos - kt - 63) & ~7 (floor), so key kt + x sits at element
// 63 + ((pos + 1) & 7) - x of the row (kt is a multiple of 8), the same for every tile. The
// copies join K's group of the same tile, so the wait and barrier for K cover them; the stage is
// rewritten only after the barrier that ends the tile's bias reads.
// Interior tiles (every key the CTA's, every cell 0 <= d < E and d < window_left: strictly, so
// the window's edge needs a mask) read the elements with no mask. With MASKED (the blocks of
// windowed layers, where every tile is near the diagonal) the other tiles within E are staged
// too, only their chunks inside [0, E), and each cell's bias is selected from its d; without it
// (global layers) they keep `tile_bias`, which keeps the global blocks' registers as they were.
// CTAs with padding rows, E not a multiple of 8 or rel_logits not 16-byte aligned keep
// `tile_bias` for every tile.
#define REL_STAGE_ROW 144
#define REL_STAGE_BYTES (MMA_ROWS * REL_STAGE_ROW)
static_assert(REL_STAGE_ROW >= 9 * 16 && REL_STAGE_ROW % 16 == 0, "a staged row holds 9 chunks");
static_assert(QUERY_SMEM_BYTES >= 2 * KEY_TILE * HEAD_DIM * 2 + REL_STAGE_BYTES, "mma.sync: K, V and the stage fit");
static_assert(QUERY_SMEM_BYTES_WG >= 3 * KEY_TILE * HEAD_DIM * 2 + REL_STAGE_BYTES + 16,
              "wgmma: Q, K, V, the stage and two mbarriers fit");
static_assert(QUERY_SMEM_BYTES_WG_WINDOW >= 4 * KEY_TILE * HEAD_DIM * 2 + REL_STAGE_BYTES + 24,
              "wgmma, windowed: Q, K, two V tiles, the stage and three mbarriers fit");

// The bias bits of a cell at distance d whose rel_logits element, staged in shared memory, is
// `raw` (used only where 0 <= d < E, so only staged elements count): rel_logits there, 0 past E,
// -inf where the causal or window mask hides the key (in a query block, keys outside [lo, hi)
// are hidden by one or the other; a decode split masks them itself).
// Visible is 0 <= d <= window_left (no upper bound without a window): one unsigned compare.
template <class T> __device__ __forceinline__ unsigned rel_cell(const Params& p, int d, unsigned raw) {
    const int wl = clamp_i32(p.window_left), E = clamp_i32(p.E);
    const unsigned last = wl < 0 ? 0x7fffffffu : (unsigned)wl;  // the largest visible d
    const bool visible = (unsigned)d <= last;
    const bool in_extent = d < E;
    return visible ? (in_extent ? raw : 0u) : Tc<T>::NEG_INF_BITS;
}

template <class T, class Row, bool MASKED> struct RelStage {
    bool on;  // uniform: this CTA stages (path, alignment, E, every row real)
    unsigned stage;

    __device__ __forceinline__ RelStage(const Params& p, const Cta& c, unsigned at) : stage(at) {
        const bool rows_real = c.rows_q * (int)p.G == MMA_ROWS && c.i0 + c.rows_q <= c.r.q_len;
        on = Row::REL_ROWS && rows_real && p.E > 0 && p.E % 8 == 0 && ((unsigned long long)p.rel & 15ull) == 0;
    }
    // Uniform over the CTA: tile kt is interior (the CTA's first row has the smallest d, its last
    // row the largest).
    __device__ __forceinline__ bool interior(const Params& p, const Cta& c, i64 kt) const {
        const i64 d_min = c.r.prefix() + c.i0 - (kt + KEY_TILE - 1), d_max = c.hi - 1 - kt;
        return on && kt >= c.lo && kt + KEY_TILE <= c.hi && d_min >= 0 && d_max < p.E &&
               (p.window_left < 0 || d_max < p.window_left);
    }
    // Uniform over the CTA: tile kt is staged (interior; with MASKED, any tile that is not far).
    __device__ __forceinline__ bool staged(const Params& p, const Cta& c, i64 kt) const {
        if constexpr (MASKED) return on && !far_tile(p, c, kt, KEY_TILE);
        else return interior(p, c, kt);
    }
    // Copy virtual row vr's chunks of tile kt (with MASKED, those inside [0, E)): the quad of the
    // row's owners takes chunks tq, tq + 4 and tq + 8 of the row's 8 or 9.
    __device__ __forceinline__ void issue_row(const Params& p, const Row& row, int vr, int tq, i64 kt) const {
        if constexpr (Row::REL_ROWS) {
            const int a = row.pos - (int)kt - (KEY_TILE - 1);  // the row's smallest d (>= 0 when interior)
            const unsigned to = stage + (unsigned)(vr * REL_STAGE_ROW + 16 * tq);
            // Two loops rather than one with a MASKED test: the shared form made the main
            // entries spill more on sm_90a (102 bytes instead of 90 for fallback_main).
            if constexpr (MASKED) {
                const int c0 = a >> 3, c1 = min((a + KEY_TILE - 1) >> 3, clamp_i32(p.E >> 3) - 1);
                const i64 e = row.rel_row + 8 * ((i64)c0 + tq);
                const T* from = (const T*)p.rel + e;
#pragma unroll
                for (int k = 0; k < 3; ++k) {
                    const int ch = c0 + tq + 4 * k;
                    if (ch >= 0 && ch <= c1) {
                        check_index(e + 32 * k, p.rel_size);
                        check_index(e + 32 * k + 7, p.rel_size);
                        cp_async16(to + 64 * k, from + 32 * k);
                    }
                }
            } else {
                const int chunks = ((a + KEY_TILE - 1) >> 3) - (a >> 3) + 1;
                const i64 e = row.rel_row + (a & ~7) + 8 * tq;
                const T* from = (const T*)p.rel + e;
#pragma unroll
                for (int k = 0; k < 3; ++k) {
                    if (tq + 4 * k < chunks) {
                        check_index(e + 32 * k, p.rel_size);
                        check_index(e + 32 * k + 7, p.rel_size);
                        cp_async16(to + 64 * k, from + 32 * k);
                    }
                }
            }
        }
    }
    // Copy tile kt's rows when it is staged: the thread copies for its rows a and b.
    __device__ __forceinline__ void issue(const Params& p, const Cta& c, const Row& ra, const Row& rb, int warp, int g,
                                          int tq, i64 kt) const {
        if (!staged(p, c, kt)) return;
        issue_row(p, ra, warp * 16 + g, tq, kt);
        issue_row(p, rb, warp * 16 + g + 8, tq, kt);
    }
    // Biases of an interior tile, packed as `tile_bias` packs them (key j in the low half).
    template <int NT>
    __device__ __forceinline__ void read(const Row& ra, const Row& rb, int warp, int g, int tq,
                                         unsigned (&x)[NT][2]) const {
        const unsigned at_a = stage + (unsigned)((warp * 16 + g) * REL_STAGE_ROW + 2 * (63 + ((ra.pos + 1) & 7) - 2 * tq));
        const unsigned at_b =
            stage + (unsigned)((warp * 16 + g + 8) * REL_STAGE_ROW + 2 * (63 + ((rb.pos + 1) & 7) - 2 * tq));
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            x[n][0] = pack_u16(ld_shared_u16(at_a - 16 * n), ld_shared_u16(at_a - 16 * n - 2));
            x[n][1] = pack_u16(ld_shared_u16(at_b - 16 * n), ld_shared_u16(at_b - 16 * n - 2));
        }
    }
    // Biases of a staged tile that is not interior (MASKED only), packed as `read` packs them.
    template <int NT>
    __device__ __forceinline__ void read_masked(const Params& p, const Row& ra, const Row& rb, int warp, int g, int tq,
                                                i64 kt, unsigned (&x)[NT][2]) const {
        const int at = 2 * (63 - 2 * tq);
        const unsigned at_a = stage + (unsigned)((warp * 16 + g) * REL_STAGE_ROW + 2 * ((ra.pos + 1) & 7) + at);
        const unsigned at_b = stage + (unsigned)((warp * 16 + g + 8) * REL_STAGE_ROW + 2 * ((rb.pos + 1) & 7) + at);
        const int da = ra.pos - (int)kt - 2 * tq, db = rb.pos - (int)kt - 2 * tq;  // d of the thread's first cell
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const unsigned a0 = rel_cell<T>(p, da - 8 * n, ld_shared_u16(at_a - 16 * n));
            const unsigned a1 = rel_cell<T>(p, da - 8 * n - 1, ld_shared_u16(at_a - 16 * n - 2));
            const unsigned b0 = rel_cell<T>(p, db - 8 * n, ld_shared_u16(at_b - 16 * n));
            const unsigned b1 = rel_cell<T>(p, db - 8 * n - 1, ld_shared_u16(at_b - 16 * n - 2));
            x[n][0] = pack_u16(a0, a1);
            x[n][1] = pack_u16(b0, b1);
        }
    }
};

// A query block thread's output accumulators (rows a and b, the mma.sync C-fragment layout) and
// its online softmax's running maxima and sums, zeroed (maxima -inf); `store` writes its rows.
struct BlockAcc {
    float o[16][4];
    float m[2], l[2];
    __device__ __forceinline__ BlockAcc() {
#pragma unroll
        for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
        m[0] = m[1] = neg_inf();
        l[0] = l[1] = 0.f;
    }
    template <class T, class Row>
    __device__ __forceinline__ void store(const Params& p, const Cta& c, const Row& ra, const Row& rb, int tq) {
        const float la = quad_sum(l[0]), lb = quad_sum(l[1]);
        store_row<T>(p, c, ra, m[0], la, o, 0, 0, tq, tq == 0);
        store_row<T>(p, c, rb, m[1], lb, o, 1, 0, tq, tq == 0);
    }
};

// The key tiles of a query block: 64-aligned, from the one holding lo (kt0) to the one holding
// hi - 1; returns their number.
__device__ __forceinline__ int key_tiles(const Cta& c, i64& kt0) {
    kt0 = c.lo / KEY_TILE * KEY_TILE;
    return c.hi > c.lo ? (int)cdiv(c.hi - kt0, KEY_TILE) : 0;
}

// The biases of key tile kt for the thread's rows: read from the stage (interior tiles, `plain`;
// with MASKED, any staged tile), else gathered, none for far tiles.
template <class T, class Row, bool MASKED>
__device__ __forceinline__ void block_biases(const Params& p, const Cta& c, const RelStage<T, Row, MASKED>& rs,
                                             const Row& ra, const Row& rb, int warp, int g, int tq, i64 kt, bool far,
                                             bool plain, unsigned (&x)[8][2]) {
    if (plain) rs.read(ra, rb, warp, g, tq, x);
    else if (MASKED && rs.on && !far) rs.read_masked(p, ra, rb, warp, g, tq, kt, x);
    else if (!far) tile_bias<T>(p, c, ra, rb, kt, tq, x);
}

// How a query block multiplies (the policy of `query_block`). mma.sync (every SM80+ GPU): warp w
// owns virtual rows [16 w, 16 w + 16); m16n8k16 MMAs with Q in registers and K and V read from
// XOR-swizzled tiles by `ldmatrix` (`.trans` for V).
template <class T> struct SyncProducts {
    static constexpr bool WG = false;  // tile layout of `tile_at`
    unsigned sk, sv, sr;
    unsigned qf[8][4];
    int k_row, k_ch, v_row, v_ch;
    template <class Row>
    __device__ __forceinline__ SyncProducts(const Params& p, const Cta&, const Row& ra, const Row& rb, int tq,
                                            unsigned char* smem) {
        const int lane = threadIdx.x & 31;
        sk = smem_addr(smem);
        sv = sk + KEY_TILE * HEAD_DIM * 2;
        sr = sv + KEY_TILE * HEAD_DIM * 2;  // Q stays in registers: its tile holds the staged biases
        load_q_frag(p, ra, rb, tq, qf);
        // ldmatrix row/chunk of this lane: K (B of Q K^T, two n-tiles per x4) and V (B of P V).
        k_row = (lane & 7) + ((lane >> 4) << 3);
        k_ch = (lane >> 3) & 1;
        v_row = (lane & 7) + (((lane >> 3) & 1) << 3);
        v_ch = lane >> 4;
    }
    // The thread's copies have landed: nothing more before the barrier.
    __device__ __forceinline__ void landed() const {}
    // S = Q K^T, complete on return (`qk_wait` has nothing left to do).
    __device__ __forceinline__ void qk_issue(float (&s)[8][4]) const {
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
    }
    __device__ __forceinline__ void qk_wait(float (&)[8][4]) const {}
    __device__ __forceinline__ void pv(float (&o)[16][4], const unsigned (&pa)[4][4]) const {
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
};

#ifdef __CUDA_ARCH_FEAT_SM90_ALL
// wgmma (sm_90a): Q (64 virtual rows), K and V tiles in shared memory in the canonical
// 128-byte-swizzled layout (`tile_at<N, true>`, 1024-byte aligned): S = Q K^T is 8 m64n64k16
// steps with both operands in shared memory, O += P V 4 m64n128k16 steps with P in registers and
// V read transposed; scores and output stay in the mma.sync fragment layout. VT V tiles: the
// windowed blocks (`window_block`) alternate between two, `query_block` has one.
template <class T, int VT = 1> struct WgProducts {
    static constexpr bool WG = true;
    static constexpr unsigned TILE_BYTES = KEY_TILE * HEAD_DIM * 2, HALF = KEY_TILE * 128;
    unsigned sq, sk, sv, sr;
    // Q: virtual row r = 16 w + 8 h + g of the block; thread x copies chunk x % 16 of rows
    // x / 16 + 8 k (the rows of `issue_tiles`), zeros for rows not computed; the copies join the
    // first K tile's group.
    template <class Row>
    __device__ __forceinline__ WgProducts(const Params& p, const Cta& c, const Row&, const Row&, int,
                                          unsigned char* smem) {
        sq = smem_addr(smem);
        sk = sq + TILE_BYTES;
        sv = sk + TILE_BYTES;       // V tile b at sv + b * TILE_BYTES
        sr = sv + VT * TILE_BYTES;  // the staged biases, then the mbarriers (QUERY_SMEM_BYTES_WG[_WINDOW])
        const int ch = threadIdx.x & 15;
#pragma unroll
        for (int k = 0; k < MMA_ROWS / 8; ++k) {
            const int r = (threadIdx.x >> 4) + 8 * k;
            const Row row(p, c, r);
            const unsigned at = sq + tile_at<MMA_ROWS, true>(r, ch);
            if (row.valid) {
                const i64 e = (row.t * p.H + row.h) * HEAD_DIM + ch * 8;
                check_index(e, p.q_size);
                check_index(e + 7, p.q_size);
                cp_async16(at, (const unsigned short*)p.q + e);
            } else {
                st_shared16(at, 0u, 0u, 0u, 0u);
            }
        }
    }
    // The thread's copies have landed: make them visible to wgmma's proxy before the barrier.
    __device__ __forceinline__ void landed() const { fence_proxy_async(); }
    // S = Q K^T, issued: the tensor cores work on it until `qk_wait`, and s must not be touched
    // in between.
    __device__ __forceinline__ void qk_issue(float (&s)[8][4]) const {
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
            const unsigned off = (ks >> 2) * HALF + (ks & 3) * 32;
            Wg<T>::qk(s, wg_desc(sq + off, 16, 1024), wg_desc(sk + off, 16, 1024), ks > 0);
        }
        wg_commit();
    }
    __device__ __forceinline__ void qk_wait(float (&s)[8][4]) const {
        wg_wait0();
        wg_hold(s);
    }
    // O += P V with V tile b, issued: o and pa must not be touched until the next wait.
    __device__ __forceinline__ void pv_issue(float (&o)[16][4], const unsigned (&pa)[4][4], int b) const {
        wg_fence();
        const unsigned v = sv + (unsigned)b * TILE_BYTES;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) Wg<T>::pv(o, pa[kk], wg_desc(v + kk * 2048, HALF, 1024));
        wg_commit();
    }
    __device__ __forceinline__ void pv_wait(float (&o)[16][4]) const {
        wg_wait0();
        wg_hold(o);
    }
    // O += P V with the first V tile, complete on return (`query_block`).
    __device__ __forceinline__ void pv(float (&o)[16][4], const unsigned (&pa)[4][4]) const {
        pv_issue(o, pa, 0);
        pv_wait(o);
    }
    // The windowed blocks leave P V running: one wait covers it and the Q K^T issued after it.
    __device__ __forceinline__ void qk_pv_wait(float (&s)[8][4], float (&o)[16][4]) const {
        qk_wait(s);
        wg_hold(o);
    }
};
#endif

// Tensor copies of K and V tiles (ON: the sm_90a query blocks, when the launcher encoded the
// cache's tensor maps, the view is 16-byte aligned and pages are powers of two of at least
// KV_TMA_MIN_PAGE keys). Every tile inside the CTA's keys [lo, hi) comes as boxes of 64 dims and
// R = min(page, KEY_TILE) keys, two per page of the tile (dims 0..63, 64..127), that thread 0
// issues after an arrive.expect_tx of the tile's bytes on the tensor's mbarrier, reading each
// page's block-table entry as it goes; every thread then waits for the barrier's phase. The first
// tile (when lo is inside it) and the last (when hi is) take the cp.async copies, so the tiles
// that come by TMA are consecutive and the phase of tile n is the parity of n less the CTA's
// partial first tile. `on` and `takes` are uniform over the CTA; `on` is the only state.
template <bool ON> struct KvTma {
    bool on;

    // Whether the launch's tiles may come by TMA (uniform): the launcher encoded the maps, the
    // view is 16-byte aligned and pages are powers of two of at least KV_TMA_MIN_PAGE keys.
    static __device__ __forceinline__ bool usable(const Params& p, bool aligned) {
        const i64 ps = p.page_size;
        return p.tma != 0 && aligned && ps >= KV_TMA_MIN_PAGE && (ps & (ps - 1)) == 0;
    }
    // Every thread calls this when `usable`: thread 0 initialises the n mbarriers from `bar` on.
    static __device__ __forceinline__ void init_barriers(unsigned bar, int n) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
        if (threadIdx.x == 0) {
            for (int k = 0; k < n; ++k) mbar_init(bar + 8 * k);
            mbar_init_fence();
        }
        __syncthreads();
#endif
    }
    __device__ __forceinline__ KvTma(const Params& p, bool aligned, unsigned bar) : on(false) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
        if constexpr (ON) {
            on = usable(p, aligned);
            if (on) init_barriers(bar, 2);
        }
#endif
    }
    // Uniform: tile kt (64-aligned) comes by TMA.
    __device__ __forceinline__ bool takes(const Cta& c, i64 kt) const {
        if constexpr (!ON) return false;
        return on && kt >= c.lo && kt + KEY_TILE <= c.hi;
    }
    // The phase parity of tile `it` of a CTA whose first tile starts at kt0.
    static __device__ __forceinline__ unsigned parity(const Cta& c, i64 kt0, int it) {
        return (unsigned)(it - (kt0 < c.lo ? 1 : 0)) & 1u;
    }
    // Every thread calls this; thread 0 copies tile kt of one tensor (offset and strides in
    // elements) into `at`.
    static __device__ __forceinline__ void issue(const Params& p, const Cta& c, const TensorMap& map, unsigned at,
                                                 unsigned bar, i64 off, i64 block_stride, i64 slot_stride,
                                                 i64 head_stride, i64 kt) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
        if (threadIdx.x == 0) {
            const int r = (int)min(p.page_size, (i64)KEY_TILE), sh = __ffsll(p.page_size) - 1;
            mbar_expect(bar, KEY_TILE * HEAD_DIM * 2);
            for (int q = 0; q < KEY_TILE; q += r) {
                const int block = (int)ld_block(p, c.b * p.bt_stride + ((kt + q) >> sh));
                const int slot = (int)((kt + q) & (p.page_size - 1));
                const i64 first = off + (i64)block * block_stride + slot * slot_stride + c.kvh * head_stride;
                kv_elem(p, first);
                kv_elem(p, first + (r - 1) * slot_stride + HEAD_DIM - 8);
                tma_box(at + (unsigned)(q * 128), map, bar, 0, (int)c.kvh, slot, block);
                tma_box(at + (unsigned)(KEY_TILE * 128 + q * 128), map, bar, 64, (int)c.kvh, slot, block);
            }
        }
        __syncwarp();
#endif
    }
    // Tile kt of K or V into `at`, counted on the mbarrier `bar`.
    static __device__ __forceinline__ void issue_k(const Params& p, const Cta& c, i64 kt, unsigned at, unsigned bar) {
        issue(p, c, p.tmap_k, at, bar, p.k_off, p.k_block, p.k_slot, p.k_head, kt);
    }
    static __device__ __forceinline__ void issue_v(const Params& p, const Cta& c, i64 kt, unsigned at, unsigned bar) {
        issue(p, c, p.tmap_v, at, bar, p.v_off, p.v_block, p.v_slot, p.v_head, kt);
    }
    static __device__ __forceinline__ void wait(unsigned bar, unsigned parity) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
        mbar_wait(bar, parity);
#endif
    }
};

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
    const int E = clamp_i32(p.E);
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
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    using Products = WgProducts<T>;
#else
    using Products = SyncProducts<T>;
#endif
    const int q_len = c.r.q_len;
    if (q_len == 1 && p.G <= 16) mma_decode<T, Row>(p, c, smem);
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    else if constexpr (WINDOWED && Row::REL_ROWS) window_block<T, Row>(p, c, smem);
#endif
    else query_block<T, Row, Products, WINDOWED && Row::REL_ROWS>(p, c, smem);
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
