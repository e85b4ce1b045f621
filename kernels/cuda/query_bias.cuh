#pragma once
#include "cta.cuh"
#include "ptx.cuh"
#include "softmax.cuh"
// A query block's biases, scores and output: the bias of a key tile (gathered, or staged from
// rel_logits in shared memory), scores into the log2 domain, the softmax's rescale, the
// accumulators and the key tiles of a block. Used by the query blocks and the decode CTAs.

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
// The mask and extent are `CellRule`'s.
template <class T> __device__ __forceinline__ unsigned rel_cell(const Params& p, int d, unsigned raw) {
    const CellRule rule(p);
    return rule.visible(d) ? (rule.in_extent(d) ? raw : 0u) : Tc<T>::NEG_INF_BITS;
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
