#pragma once
#include "basics.cuh"
// The kernel parameters and every global access through them: the loads and stores of each
// tensor (checked against its size under RELATTN_BOUNDS_CHECK: __trap() on violation, and the
// CUDA context is dead afterwards), a request's lengths, the first key a window lets a position
// see, and the request owning a packed row.

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

// The rule of one score cell at distance d = pos - j (docs/operator.md section 3 and 4), in one place for every
// path: the key is visible iff 0 <= d <= window_left (causal; no upper bound without a window),
// and its bias is rel_logits[t, h, d] iff 0 <= d < E (0 past E). Each test is one unsigned
// compare (d < 0 wraps past both bounds). Key positions fit int32; the i64 forms are for code
// that keeps distances in 64 bits.
struct CellRule {
    unsigned last;    // the largest visible d
    unsigned extent;  // E
    __device__ __forceinline__ explicit CellRule(const Params& p)
        : last(p.window_left < 0 ? 0x7fffffffu : (unsigned)clamp_i32(p.window_left)), extent((unsigned)clamp_i32(p.E)) {}
    __device__ __forceinline__ bool visible(int d) const { return (unsigned)d <= last; }
    __device__ __forceinline__ bool in_extent(int d) const { return (unsigned)d < extent; }
    __device__ __forceinline__ bool visible(i64 d) const { return (unsigned long long)d <= last; }
    __device__ __forceinline__ bool in_extent(i64 d) const { return (unsigned long long)d < extent; }
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
