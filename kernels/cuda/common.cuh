#pragma once
// Device code shared by every relattn program (the first header: cta.cuh includes it). NVRTC gets
// the project's headers in memory (`gpu::source`); it has no toolkit headers on the target
// machines, so nothing else is included. bf16 and fp16 travel as 16-bit patterns and are
// converted by bit operations and inline PTX.
//
// Compile-time switches:
//   RELATTN_BOUNDS_CHECK  every global index is checked against its tensor's size; __trap() on
//                         violation (the CUDA context is dead afterwards).
//
// Organisation shared by the three paths' attention kernels. A CTA (THREADS = 4 warps) owns
// MMA_ROWS "virtual rows" of one request and one KV head: virtual row vr is query row
// i0 + vr / G of the request and the query head of group member vr % G, so the G query heads
// that read one KV head share every K/V tile the CTA loads. The CTA walks its keys [lo, hi) in
// tiles; each path supplies a row type (its bias and masks) and the kernel entry that picks
// the CTA's rows and keys. bf16/fp16 run on tensor cores (mma.sync m16n8k16, ldmatrix,
// cp.async; wgmma on sm_90a): `query_block` for query blocks, `mma_decode` for single-query
// CTAs (q_len 1, G <= 16) where bandwidth is all that matters; decode groups of G > 16 keep an
// FMA loop (`fma_cta`).

typedef long long i64;

// The sizes the launch planning shares (HEAD_DIM, THREADS, MMA_ROWS, KEY_TILE, SHEAR_TILE,
// KV_TMA_MIN_PAGE, the decode ring's and the shared-memory sizes) come from the Rust side.
#include "constants.cuh"
// A CTA of the FMA loop and the prologue computes ROWS "virtual rows" (a query row and a head)
// with LANES threads each.
#define ROWS 32
#define LANES 4
#define DIMS_PER_LANE (HEAD_DIM / LANES)
// Keys staged through shared memory at a time.
#define KCHUNK 32
// Single-query CTAs: tiles of DEC_TILE keys (K and V) in the ring of DEC_STAGE_BYTES stages.
#define DEC_TILE 64
// The rel_logits chunks each ring stage's tile reads, when the decode entry stages them: 48
// bytes per warp and row (`issue_decode_bias`), after the ring's K/V stages.
#define DEC_BIAS_ROW 48
static_assert(DEC_BIAS_BYTES == 4 * 16 * DEC_BIAS_ROW, "a bias region: 4 warps x 16 rows");
static_assert(DEC_STAGE_BYTES == 2 * DEC_TILE * HEAD_DIM * 2, "a ring stage holds K and V of DEC_TILE keys");
static_assert(DEC_TILE == 4 * 16, "each of the 4 warps of a decode CTA takes 16 keys of a tile");
static_assert(QUERY_SMEM_BYTES >= 3 * KEY_TILE * HEAD_DIM * 2, "Q, K and V tiles of a query block fit");
static_assert(QUERY_SMEM_BYTES >= 2 * KCHUNK * HEAD_DIM * 4, "the FMA loop's fp32 K and V chunks fit");
static_assert(ATTN_SMEM_BYTES >= QUERY_SMEM_BYTES && ATTN_SMEM_BYTES >= QUERY_SMEM_BYTES_WG &&
                  ATTN_SMEM_BYTES >= QUERY_SMEM_BYTES_WG_WINDOW,
              "a launch with single-query CTAs runs query blocks too");
static_assert(ATTN_SMEM_BYTES >= DEC_Q_BYTES + DEC_MIN_STAGES * (DEC_STAGE_BYTES + DEC_BIAS_BYTES),
              "the minimal decode ring and its bias regions fit");
static_assert(DEC_Q_BYTES == 16 * HEAD_DIM * 2, "Q of a single-query CTA: 16 rows");
static_assert(MMA_ROWS == KEY_TILE, "the wgmma kernel lays Q out like a key tile");
static_assert(ATTN_SMEM_BYTES >= (4 * 16 * HEAD_DIM + 2 * 4 * 16) * 4, "the decode merge fits");
static_assert(ATTN_SMEM_BYTES >= 2 * KCHUNK * HEAD_DIM * 4, "the FMA loop's fp32 K and V chunks fit");
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

struct bf16 {
    unsigned short bits;
};
struct fp16 {
    unsigned short bits;
};

__device__ __forceinline__ float to_f32(bf16 x) { return __uint_as_float(((unsigned int)x.bits) << 16); }
__device__ __forceinline__ float to_f32(fp16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float to_f32(float x) { return x; }

template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) {
    bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}
template <> __device__ __forceinline__ fp16 from_f32<fp16>(float x) {
    fp16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ i64 imin(i64 a, i64 b) { return a < b ? a : b; }
__device__ __forceinline__ i64 imax(i64 a, i64 b) { return a > b ? a : b; }
__device__ __forceinline__ i64 cdiv(i64 a, i64 b) { return (a + b - 1) / b; }
// A window or extent for 32-bit comparisons with distances d <= INT32_MAX (positions are int32):
// values past that compare the same as INT32_MAX.
__device__ __forceinline__ int clamp_i32(i64 x) { return (int)imin(x, 0x7fffffff); }

// A CUtensorMap (opaque, 128 bytes, 64-byte aligned) encoded by the launcher.
struct __align__(64) TensorMap {
    unsigned long long w[16];
};

// Kernel parameters, passed by value (a __grid_constant__ argument, so the tensor maps have a
// parameter-space address). The Rust mirror is `gpu::params::Params`: every field is 8 bytes
// except a float + int pair and the two 64-byte aligned tensor maps at the end, so both sides lay
// it out identically.
struct Params {
    const void* q;            // [T, H, D]
    const void* kv;           // the cache buffer holding K and V
    const void* rel;          // [T, H, E]
    void* out;                // [T, H, D]
    const int* block_table;   // [B, bt_stride]
    const int* seqused_k;     // [B]
    const int* cu_seqlens_q;  // [B + 1]
    float* ws_o;              // [slots, T, H, D] partial outputs (normalised): a slot per split or decode piece
    float* ws_lse;            // [slots, T, H] partial log-sum-exp
    void* shear;              // [T, H, shear_width] sheared bias (dtype)
    unsigned* ws_count;       // finished decode splits [B, Hkv], then pieces [B, Hkv, num_splits] (zero at allocation, reset by the merging CTAs)
    i64 T, H, Hkv, G, D, E, B;
    i64 bt_stride, page_size;
    i64 k_off, k_block, k_slot, k_head;
    i64 v_off, v_block, v_slot, v_head;
    i64 window_left, num_splits, shear_width, real_rows;
    i64 piece_keys;           // most keys of one piece of a fallback decode split
    // Sizes in elements, for RELATTN_BOUNDS_CHECK.
    i64 q_size, kv_size, rel_size, out_size, bt_size, ws_o_size, ws_lse_size, shear_size, ws_count_size;
    float scale;
    int ring_stages;  // stages of the single-query CTAs' K/V ring (DEC_MIN_STAGES..DEC_MAX_STAGES)
    i64 tma;          // 1: tmap_k and tmap_v describe K and V ([blocks][page][Hkv][D] as the strides say)
    TensorMap tmap_k, tmap_v;
};

#ifdef RELATTN_BOUNDS_CHECK
__device__ __forceinline__ void check_index(i64 i, i64 size) {
    if (i < 0 || i >= size) __trap();
}
#else
__device__ __forceinline__ void check_index(i64, i64) {}
#endif

template <class T> __device__ __forceinline__ float ld_q(const Params& p, i64 i) {
    check_index(i, p.q_size);
    return to_f32(((const T*)p.q)[i]);
}
template <class T> __device__ __forceinline__ float ld_kv(const Params& p, i64 i) {
    check_index(i, p.kv_size);
    return to_f32(((const T*)p.kv)[i]);
}
template <class T> __device__ __forceinline__ float ld_rel(const Params& p, i64 i) {
    check_index(i, p.rel_size);
    return to_f32(((const T*)p.rel)[i]);
}
template <class T> __device__ __forceinline__ void st_out(const Params& p, i64 i, float x) {
    check_index(i, p.out_size);
    ((T*)p.out)[i] = from_f32<T>(x);
}
template <class T> __device__ __forceinline__ float ld_shear(const Params& p, i64 i) {
    check_index(i, p.shear_size);
    return to_f32(((const T*)p.shear)[i]);
}
template <class T> __device__ __forceinline__ void st_shear(const Params& p, i64 i, float x) {
    check_index(i, p.shear_size);
    ((T*)p.shear)[i] = from_f32<T>(x);
}
__device__ __forceinline__ i64 ld_block(const Params& p, i64 i) {
    check_index(i, p.bt_size);
    return p.block_table[i];
}
__device__ __forceinline__ i64 ld_cu(const Params& p, i64 b) {
    check_index(b, p.B + 1);
    return p.cu_seqlens_q[b];
}
__device__ __forceinline__ i64 ld_seqk(const Params& p, i64 b) {
    check_index(b, p.B);
    return p.seqused_k[b];
}
__device__ __forceinline__ float ld_ws_o(const Params& p, i64 i) {
    check_index(i, p.ws_o_size);
    return p.ws_o[i];
}
__device__ __forceinline__ void st_ws_o(const Params& p, i64 i, float x) {
    check_index(i, p.ws_o_size);
    p.ws_o[i] = x;
}
__device__ __forceinline__ float ld_ws_lse(const Params& p, i64 i) {
    check_index(i, p.ws_lse_size);
    return p.ws_lse[i];
}
__device__ __forceinline__ void st_ws_lse(const Params& p, i64 i, float x) {
    check_index(i, p.ws_lse_size);
    p.ws_lse[i] = x;
}
// Loads of partials that other CTAs of the same launch wrote: from L2 (`.cg`), never from a
// line this SM's L1 may hold.
__device__ __forceinline__ float ld_ws_lse_cg(const Params& p, i64 i) {
    check_index(i, p.ws_lse_size);
    float x;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(x) : "l"(p.ws_lse + i) : "memory");
    return x;
}
// Eight partial-output elements from i (a multiple of 8: 32-byte aligned), two 16-byte loads.
__device__ __forceinline__ void ld_ws_o8_cg(const Params& p, i64 i, float (&v)[8]) {
    check_index(i, p.ws_o_size);
    check_index(i + 7, p.ws_o_size);
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
                 : "l"(p.ws_o + i)
                 : "memory");
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v[4]), "=f"(v[5]), "=f"(v[6]), "=f"(v[7])
                 : "l"(p.ws_o + i + 4)
                 : "memory");
}

// One request as the kernels see it.
struct Req {
    i64 q_start, q_len, kv_len;
    __device__ __forceinline__ i64 prefix() const { return kv_len - q_len; }
};
__device__ __forceinline__ Req load_req(const Params& p, i64 b) {
    Req r;
    r.q_start = ld_cu(p, b);
    r.q_len = ld_cu(p, b + 1) - r.q_start;
    r.kv_len = ld_seqk(p, b);
    return r;
}

// First key a query at absolute position `pos` may see (window), for CTA key ranges.
__device__ __forceinline__ i64 first_visible(const Params& p, i64 pos) {
    return p.window_left >= 0 ? imax(0, pos - p.window_left) : 0;
}

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

// The request owning real row t: the largest b with cu[b] <= t (zero-length requests before it
// share its cu value and are skipped by taking the largest).
__device__ __forceinline__ i64 request_of_row(const Params& p, i64 t) {
    i64 lo = 0, hi = p.B - 1;
    while (lo < hi) {
        const i64 mid = (lo + hi + 1) / 2;
        if (ld_cu(p, mid) <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

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

// Attention CTAs an SM should hold: 3 on sm_90a (the wgmma kernels fit 168 registers), else
// what the registers and shared memory give (the mma.sync kernels use up to 255 registers).
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
#define ATTN_CTAS_PER_SM 3
#else
#define ATTN_CTAS_PER_SM 1
#endif
// A program holds the entries of one storage dtype when built with -DRELATTN_ONLY_<dtype> (the
// compile plan builds each path as one program per dtype, so a build's programs compile in
// parallel), else those of both.
#if defined(RELATTN_ONLY_bf16)
#define RELATTN_KEEP_bf16(...) __VA_ARGS__
#define RELATTN_KEEP_fp16(...)
#elif defined(RELATTN_ONLY_fp16)
#define RELATTN_KEEP_bf16(...)
#define RELATTN_KEEP_fp16(...) __VA_ARGS__
#else
#define RELATTN_KEEP_bf16(...) __VA_ARGS__
#define RELATTN_KEEP_fp16(...) __VA_ARGS__
#endif
#define RELATTN_ENTRY(name, fn, T) RELATTN_KEEP_##T( \
    extern "C" __global__ void __launch_bounds__(THREADS, ATTN_CTAS_PER_SM) name(const __grid_constant__ Params p) { fn<T>(p); })
// An entry whose CTAs should fit DECODE_CTAS_PER_SM to an SM (at most 65536 / (THREADS x that)
// registers per thread): the decode-only kernels, bound by the bytes in flight; 3 on sm_90a (where
// shared memory holds that many), else as many as the registers give.
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
#define DECODE_CTAS_PER_SM 3
#else
#define DECODE_CTAS_PER_SM 1
#endif
#define RELATTN_DECODE_ENTRY(name, fn, T) RELATTN_KEEP_##T( \
    extern "C" __global__ void __launch_bounds__(THREADS, DECODE_CTAS_PER_SM) name(const __grid_constant__ Params p) { fn<T>(p); })

