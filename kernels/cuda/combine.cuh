#pragma once
#include "params.cuh"
// The split combine of sheared_bias: a (row, head)'s partials merged by their LSEs (the fallback
// decode kernel merges its own, in fallback.cu).

// Merge the partials of one (row, head) over the splits `nonempty(s)` says were written, by LSE.
// One thread per output dim; every thread of the CTA must call this. Splits that are empty were
// never written and are never read. The loads go wide so their latencies overlap: the LSEs are
// spread over the CTA (thread x reads split x of each chunk of THREADS splits, once for the max
// and once for its weight, which goes to shared memory), and each thread reads its partial
// outputs eight splits at a time; the sums run in split order as a plain loop would.
template <class T, class NonEmpty>
__device__ __forceinline__ void combine_row(const Params& p, i64 t, i64 h, NonEmpty nonempty) {
    static_assert(THREADS == HEAD_DIM, "one thread per output dim");
    __shared__ float red[THREADS / 32];
    __shared__ float wgt[THREADS];  // a chunk's weights; -1 for empty splits
    const int c = threadIdx.x;
    float m = neg_inf();
    for (i64 s = c; s < p.num_splits; s += THREADS)
        if (nonempty(s)) m = fmaxf(m, ld_ws_lse(p, (s * p.T + t) * p.H + h));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((c & 31) == 0) red[c >> 5] = m;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < THREADS / 32; ++w) m = fmaxf(m, red[w]);
    float acc = 0.f, wsum = 0.f;
    for (i64 s0 = 0; s0 < p.num_splits; s0 += THREADS) {
        const i64 s = s0 + c;
        float w = -1.f;
        if (s < p.num_splits && nonempty(s)) {
            const float e = ld_ws_lse(p, (s * p.T + t) * p.H + h) - m;
            w = expf(e);
        }
        __syncthreads();  // the previous chunk's weights are read
        wgt[c] = w;
        __syncthreads();
        const int n = (int)imin(THREADS, p.num_splits - s0);
#pragma unroll 8
        for (int k = 0; k < n; ++k) {
            const float wk = wgt[k];
            if (wk < 0.f) continue;
            const i64 row = ((s0 + k) * p.T + t) * p.H + h;
            acc = fmaf(wk, ld_ws_o(p, row * HEAD_DIM + c), acc);
            wsum += wk;
        }
    }
    st_out<T>(p, (t * p.H + h) * HEAD_DIM + c, acc / wsum);
}
