#pragma once
#include "cta.cuh"
#include "ptx.cuh"
// ---------------------------------------------------------------------------------------------
// A tensor-core CTA's per-tile pieces: Q as A fragments, the bias cells of a key pair, the
// far-tile test, one tile of online softmax in the log2 domain, and the stores of a row's
// result (to `out`, or a split's partial and LSE).

// Two consecutive 16-bit q elements (i even) as one A-fragment register; 0 for rows not computed.
__device__ __forceinline__ unsigned ld_q2(const Params& p, bool ok, i64 i) {
    if (!ok) return 0u;
    check_index(i, p.q_size);
    check_index(i + 1, p.q_size);
    return *(const unsigned*)((const unsigned short*)p.q + i);
}

// Q of rows a (fragment rows 0..7) and b (8..15) as A fragments of the 8 k-steps over HEAD_DIM.
template <class Row>
__device__ __forceinline__ void load_q_frag(const Params& p, const Row& a, const Row& b, int tq, unsigned (&qf)[8][4]) {
    const i64 ea = (a.t * p.H + a.h) * HEAD_DIM + 2 * tq;
    const i64 eb = (b.t * p.H + b.h) * HEAD_DIM + 2 * tq;
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        qf[ks][0] = ld_q2(p, a.valid, ea + 16 * ks);
        qf[ks][1] = ld_q2(p, b.valid, eb + 16 * ks);
        qf[ks][2] = ld_q2(p, a.valid, ea + 16 * ks + 8);
        qf[ks][3] = ld_q2(p, b.valid, eb + 16 * ks + 8);
    }
}

// Bias of keys j and j + 1 of a row (natural domain), -inf outside the CTA's keys [lo, hi) (other
// splits' keys, tile padding) or where the row's own mask says so.
template <class Row>
__device__ __forceinline__ void bias_cells_raw(const Params& p, const Cta& c, const Row& row, int j, float& b0,
                                               float& b1) {
    const bool in0 = j >= c.lo && j < c.hi, in1 = j + 1 >= c.lo && j + 1 < c.hi;
    b0 = neg_inf();
    b1 = neg_inf();
    if (in0 && in1) row.bias2(p, j, b0, b1);
    else if (in0) b0 = row.bias(p, j);
    else if (in1) b1 = row.bias(p, j + 1);
}

// The same in the log2 domain.
template <class Row>
__device__ __forceinline__ void bias_cells(const Params& p, const Cta& c, const Row& row, int j, float& x0, float& x1) {
    float b0, b1;
    bias_cells_raw(p, c, row, j, b0, b1);
    x0 = b0 * LOG2E;
    x1 = b1 * LOG2E;
}

// A key tile [kt, kt + n) that every row of the CTA sees with bias 0 on every path: a global
// layer (no window), the whole tile inside [lo, hi), and d > E for the CTA's first (smallest)
// position, so d > E for every row and key (strictly: then even a bias wrongly applied at d == E
// would not be skipped here). Uniform over the CTA; skips the per-cell bias work of the far
// past, which is most of a long context. Rows past the request's end get finite scores here
// instead of -inf; they are never stored.
__device__ __forceinline__ bool far_tile(const Params& p, const Cta& c, i64 kt, int n) {
    return p.window_left < 0 && kt >= c.lo && kt + n <= c.hi && c.r.prefix() + c.i0 - (kt + n - 1) > p.E;
}

// One tile of online softmax (log2 domain) for the thread's rows a (cells 0, 1) and b (cells 2, 3)
// of NT score fragments s x sc (sc > 0: the log2-domain scale when the caller left it out of s,
// else 1): running max m and sum l in fp32 (the sum over the fp32 p, before rounding), alpha =
// the rescale of earlier tiles, and P rounded to the dtype as A fragments of NT / 2 k-steps. The
// maximum is taken before scaling (rounding is monotonic, so it is the maximum of the scaled
// scores) and each p is exp2(fma(s, sc, -max)), one instruction fewer per score than scaling
// first. A row that has seen nothing visible keeps m = -inf and gets p = 0.
template <class T, int NT>
__device__ __forceinline__ void softmax_tile(float (&s)[NT][4], float sc, float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], unsigned (&pa)[NT / 2][4]) {
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
    }
    float use[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        mx[r] = fmaxf(m[r], mx[r] * sc);
        use[r] = mx[r] == neg_inf() ? 0.f : mx[r];  // exp2(-inf - -inf) would be NaN
        const float drop = m[r] - use[r];  // <= 0: how far the running max rose
        alpha[r] = fast_exp2(drop);
        m[r] = mx[r];
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[n][e] = fast_exp2(fmaf(s[n][e], sc, -use[e >> 1]));
            sum[e >> 1] += s[n][e];
        }
    }
    l[0] = l[0] * alpha[0] + sum[0];
    l[1] = l[1] * alpha[1] + sum[1];
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
        pa[kk][0] = Tc<T>::pack(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = Tc<T>::pack(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = Tc<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = Tc<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}

template <class T> __device__ __forceinline__ void st_out2(const Params& p, i64 i, float x0, float x1) {
    check_index(i, p.out_size);
    check_index(i + 1, p.out_size);
    *(unsigned*)((unsigned short*)p.out + i) = Tc<T>::pack(x0, x1);
}

// Store one row's result held in C fragments: cells (2 half, 2 half + 1) of o[n] are dims
// dim0 + 8 n + 2 tq, + 1. `l` is the row's full sum (reduced over the quad), `m` its max (log2).
template <class T, int NO, class Row>
__device__ __forceinline__ void store_row(const Params& p, const Cta& c, const Row& row, float m, float l,
                                          const float (&o)[NO][4], int half, int dim0, int tq, bool with_lse) {
    if (!row.valid) return;
    if (c.partial) {
        const i64 wr = (c.split * p.T + row.t) * p.H + row.h;
        const bool any = l > 0.f;
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            const i64 e = wr * HEAD_DIM + dim0 + 8 * n + 2 * tq;
            st_ws_o(p, e, any ? o[n][2 * half] / l : 0.f);
            st_ws_o(p, e + 1, any ? o[n][2 * half + 1] / l : 0.f);
        }
        if (with_lse) st_ws_lse(p, wr, any ? m * LN2 + logf(l) : neg_inf());
    } else {
        // l == 0 (a real row that saw nothing) gives NaN on purpose.
        const i64 e = (row.t * p.H + row.h) * HEAD_DIM + dim0 + 2 * tq;
#pragma unroll
        for (int n = 0; n < NO; ++n) st_out2<T>(p, e + 8 * n, o[n][2 * half] / l, o[n][2 * half + 1] / l);
    }
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}
