#pragma once
#include "params.cuh"
// The FMA loop's pieces (fp32 cases and decode groups of G > 16, `fma_cta` in decode.cuh): a
// thread's (virtual row, lane), the loads of a query row and of a K/V chunk, the chunk's dot
// products and the row's online softmax.

// Thread -> (virtual row, lane). A lane owns dims lane, lane + LANES, ...: the LANES threads of
// a row read consecutive shared-memory words (no bank conflict) and rows broadcast.
struct Slot {
    int vr, lane;
};
__device__ __forceinline__ Slot thread_slot() {
    Slot s;
    s.vr = threadIdx.x / LANES;
    s.lane = threadIdx.x % LANES;
    return s;
}

template <class T>
__device__ __forceinline__ void load_q_row(const Params& p, bool valid, i64 t, i64 h, int lane, float (&q)[DIMS_PER_LANE]) {
    const i64 base = (t * p.H + h) * HEAD_DIM;
#pragma unroll
    for (int k = 0; k < DIMS_PER_LANE; ++k) q[k] = valid ? ld_q<T>(p, base + k * LANES + lane) : 0.f;
}

// Stage keys [j0, j0 + KCHUNK) of request b, KV head kvh into shared memory as fp32. Keys outside
// [lo, hi) are neither read nor used: they become zeros, so garbage (NaN) in pages nobody may read
// never reaches the arithmetic. Every thread of the CTA must call this (THREADS == HEAD_DIM).
template <class T>
__device__ __forceinline__ void load_kv_chunk(const Params& p, i64 b, i64 kvh, i64 j0, i64 lo, i64 hi,
                                              float (*sk)[HEAD_DIM], float (*sv)[HEAD_DIM]) {
    const int c = threadIdx.x;
    for (int jj = 0; jj < KCHUNK; ++jj) {
        const i64 j = j0 + jj;
        float kx = 0.f, vx = 0.f;
        if (j >= lo && j < hi) {
            const i64 block = ld_block(p, b * p.bt_stride + j / p.page_size);
            const i64 slot = j % p.page_size;
            kx = ld_kv<T>(p, p.k_off + block * p.k_block + slot * p.k_slot + kvh * p.k_head + c);
            vx = ld_kv<T>(p, p.v_off + block * p.v_block + slot * p.v_slot + kvh * p.v_head + c);
        }
        sk[jj][c] = kx;
        sv[jj][c] = vx;
    }
}

// s[jj] = dot(q, K[jj]) for the chunk, reduced over the LANES threads of a row (all lanes end
// with the same bits). Every thread must call this (warp shuffles).
__device__ __forceinline__ void chunk_dots(const float (&q)[DIMS_PER_LANE], const float (*sk)[HEAD_DIM], int lane,
                                           float (&s)[KCHUNK]) {
#pragma unroll
    for (int jj = 0; jj < KCHUNK; ++jj) {
        float acc = 0.f;
#pragma unroll
        for (int k = 0; k < DIMS_PER_LANE; ++k) acc = fmaf(q[k], sk[jj][k * LANES + lane], acc);
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        s[jj] = acc;
    }
}

// Online softmax state of one virtual row (fp32): running max m, running sum l, unnormalised o.
struct Softmax {
    float m, l;
    float o[DIMS_PER_LANE];
    __device__ __forceinline__ void init() {
        m = neg_inf();
        l = 0.f;
#pragma unroll
        for (int k = 0; k < DIMS_PER_LANE; ++k) o[k] = 0.f;
    }
    // Fold in one chunk of final scores (-inf = not visible).
    __device__ __forceinline__ void update(const float (&s)[KCHUNK], const float (*sv)[HEAD_DIM], int lane) {
        float mx = neg_inf();
#pragma unroll
        for (int jj = 0; jj < KCHUNK; ++jj) mx = fmaxf(mx, s[jj]);
        if (mx == neg_inf()) return;  // nothing visible here: exp(-inf - -inf) would be NaN
        const float m_new = fmaxf(m, mx);
        const float alpha = expf(m - m_new);
        l *= alpha;
#pragma unroll
        for (int k = 0; k < DIMS_PER_LANE; ++k) o[k] *= alpha;
#pragma unroll
        for (int jj = 0; jj < KCHUNK; ++jj) {
            const float pj = expf(s[jj] - m_new);
            l += pj;
#pragma unroll
            for (int k = 0; k < DIMS_PER_LANE; ++k) o[k] = fmaf(pj, sv[jj][k * LANES + lane], o[k]);
        }
        m = m_new;
    }
    // Final output of a row; l == 0 (a real row that saw nothing) gives NaN on purpose.
    template <class T> __device__ __forceinline__ void store_out(const Params& p, i64 t, i64 h, int lane) const {
        const i64 base = (t * p.H + h) * HEAD_DIM;
#pragma unroll
        for (int k = 0; k < DIMS_PER_LANE; ++k) st_out<T>(p, base + k * LANES + lane, o[k] / l);
    }
    // Partial of split s: normalised output and log-sum-exp (-inf and zeros if the row saw nothing).
    __device__ __forceinline__ void store_partial(const Params& p, i64 s, i64 t, i64 h, int lane) const {
        const i64 row = (s * p.T + t) * p.H + h;
        const bool any = l > 0.f;
#pragma unroll
        for (int k = 0; k < DIMS_PER_LANE; ++k) st_ws_o(p, row * HEAD_DIM + k * LANES + lane, any ? o[k] / l : 0.f);
        if (lane == 0) st_ws_lse(p, row, any ? m + logf(l) : neg_inf());
    }
};
