// Device code shared by every relattn program. The Rust side prepends this file to each path's
// source before NVRTC compiles it: NVRTC on the target machines has no toolkit headers, so no
// program includes anything. bf16 and fp16 travel as 16-bit patterns and are converted by bit
// operations and inline PTX.
//
// Compile-time switches:
//   RELATTN_BOUNDS_CHECK  every global index is checked against its tensor's size; __trap() on
//                         violation (the CUDA context is dead afterwards).
//   RELATTN_MUTANT=n      plants planted defect n (see gpu::Mutant on the Rust side); 0 = none.
//
// Organisation shared by the three paths' attention kernels. A CTA (THREADS = 4 warps) owns
// MMA_ROWS "virtual rows" of one request and one KV head: virtual row vr is query row
// i0 + vr / G of the request and the query head of group member vr % G, so the G query heads
// that read one KV head share every K/V tile the CTA loads. The CTA walks its keys [lo, hi) in
// tiles; each path supplies a row type (its bias and masks) and the kernel entry that picks
// the CTA's rows and keys. bf16/fp16 run on tensor cores (mma.sync m16n8k16, ldmatrix,
// cp.async): `mma_main` for query blocks, `mma_decode` for single-query CTAs (q_len 1, G <= 16)
// where bandwidth is all that matters; fp32 keeps the FMA loop (`fma_cta`).

#ifndef RELATTN_MUTANT
#define RELATTN_MUTANT 0
#endif
#define MUTANT(n) (RELATTN_MUTANT == (n))

typedef long long i64;

#define HEAD_DIM 128
#define THREADS 128
// A CTA computes ROWS "virtual rows" (a query row and a head) with LANES threads each.
#define ROWS 32
#define LANES 4
#define DIMS_PER_LANE (HEAD_DIM / LANES)
// Keys staged through shared memory at a time.
#define KCHUNK 32
// Key tile of the sheared bias buffer and of sheared_bias splits.
#define SHEAR_TILE 128
// Virtual rows of a tensor-core CTA (16 per warp) and its key tiles.
#define MMA_ROWS 64
#define KEY_TILE 64
// Single-query CTAs: 32-key tiles (K and V) in a ring of DEC_STAGES shared-memory stages.
#define DEC_TILE 32
#define DEC_STAGES 3
// Static shared memory of an attention CTA (the 48 KiB static limit; the decode ring fills it).
#define SMEM_BYTES (DEC_STAGES * 2 * DEC_TILE * HEAD_DIM * 2)
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
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ i64 imin(i64 a, i64 b) { return a < b ? a : b; }
__device__ __forceinline__ i64 imax(i64 a, i64 b) { return a > b ? a : b; }
__device__ __forceinline__ i64 cdiv(i64 a, i64 b) { return (a + b - 1) / b; }

// Kernel parameters, passed by value. The Rust mirror is `gpu::params::Params`: every field is
// 8 bytes except the trailing float + int pair, so both sides lay it out identically.
struct Params {
    const void* q;            // [T, H, D]
    const void* kv;           // the cache buffer holding K and V
    const void* rel;          // [T, H, E]
    void* out;                // [T, H, D]
    const int* block_table;   // [B, bt_stride]
    const int* seqused_k;     // [B]
    const int* cu_seqlens_q;  // [B + 1]
    float* ws_o;              // [num_splits, T, H, D] partial outputs (normalised)
    float* ws_lse;            // [num_splits, T, H] partial log-sum-exp
    void* shear;              // [T, H, shear_width] sheared bias (dtype)
    i64 T, H, Hkv, G, D, E, B;
    i64 bt_stride, page_size;
    i64 k_off, k_block, k_slot, k_head;
    i64 v_off, v_block, v_slot, v_head;
    i64 window_left, num_splits, shear_width, real_rows;
    // Sizes in elements, for RELATTN_BOUNDS_CHECK.
    i64 q_size, kv_size, rel_size, out_size, bt_size, ws_o_size, ws_lse_size, shear_size;
    float scale;
    int pad;
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
// One thread per output dim. Splits that are empty were never written and are never read.
template <class T, class NonEmpty>
__device__ __forceinline__ void combine_row(const Params& p, i64 t, i64 h, NonEmpty nonempty) {
    const int c = threadIdx.x;
    float m = neg_inf();
    for (i64 s = 0; s < p.num_splits; ++s)
        if (nonempty(s)) m = fmaxf(m, ld_ws_lse(p, (s * p.T + t) * p.H + h));
    float acc = 0.f, wsum = 0.f;
    for (i64 s = 0; s < p.num_splits; ++s) {
        if (!nonempty(s)) continue;
        const i64 row = (s * p.T + t) * p.H + h;
        const float w = MUTANT(5) ? 1.f : expf(ld_ws_lse(p, row) - m);
        acc = fmaf(w, ld_ws_o(p, row * HEAD_DIM + c), acc);
        wsum += w;
    }
    st_out<T>(p, (t * p.H + h) * HEAD_DIM + c, acc / wsum);
}

#define RELATTN_ENTRY(name, fn, T) \
    extern "C" __global__ void __launch_bounds__(THREADS) name(Params p) { fn<T>(p); }

// ---------------------------------------------------------------------------------------------
// The attention CTA shared by the paths.

// What one CTA computes: query rows [i0, i0 + rows_q) of request b (as MMA_ROWS virtual rows
// with the G heads of KV head kvh) over keys [lo, hi); `partial` writes split `split`'s fp32
// partial and LSE instead of `out`.
struct Cta {
    i64 b, kvh, split;
    Req r;
    i64 i0;
    int rows_q;
    i64 lo, hi;
    bool partial;
};

// Query rows per CTA: MMA_ROWS / G (the plan's grid uses the same number).
__device__ __forceinline__ int cta_query_rows(const Params& p) { return MMA_ROWS / (int)p.G; }

// First query row of this CTA's block. Blocks go in reverse: under the causal mask the last
// blocks of a request see the most keys, so they start first and the short ones fill the tail.
__device__ __forceinline__ i64 query_block(int rows_q) { return (i64)(gridDim.x - 1 - blockIdx.x) * rows_q; }

// The part of a path's row type every path shares: where virtual row vr of a CTA lives. The
// path computes the head (its GQA mapping) and its own `rel_ok`.
struct RowBase {
    i64 t, h;
    int i, pos;
    bool in_block, valid, rel_ok;
    __device__ __forceinline__ void place(const Params& p, const Cta& c, int vr, i64 head) {
        in_block = vr < c.rows_q * (int)p.G;
        i = (int)c.i0 + vr / (int)p.G;
        h = head;
        valid = in_block && i < c.r.q_len;
        rel_ok = valid;
        t = c.r.q_start + i;
        pos = (int)(c.r.prefix() + i);
    }
};

template <class T> struct IsF32 {
    static constexpr bool value = false;
};
template <> struct IsF32<float> {
    static constexpr bool value = true;
};

// Tensor-core operations per 16-bit dtype: D += A * B on m16n8k16 fragments (fp32 accumulate) and
// the packing of two fp32 values (rounded to nearest even) into one A-fragment register.
template <class T> struct Tc;
template <> struct Tc<bf16> {
    static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};
template <> struct Tc<fp16> {
    static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ unsigned smem_addr(const void* ptr) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(ptr));
    return r;
}
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void st_shared16(unsigned dst, unsigned a, unsigned b, unsigned c, unsigned d) {
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(dst), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}

// Byte offset of (row r, 16-byte chunk ch) in a [rows][HEAD_DIM] 16-bit tile. The chunk is
// XOR-swizzled with r % 8 so the 8 rows an ldmatrix reads (and the rows cp.async writes) fall
// in different banks although each row is 256 bytes.
__device__ __forceinline__ unsigned swz(int r, int ch) { return (unsigned)(r * HEAD_DIM + ((ch ^ (r & 7)) << 3)) * 2u; }

// K/V rows can be copied 16 bytes at a time when every stride and offset is a multiple of 8
// elements (always so for the packed and contiguous layouts; checked, not assumed).
__device__ __forceinline__ bool kv_aligned16(const Params& p) {
    const i64 heads = p.Hkv > 1 ? (p.k_head | p.v_head) : 0;
    const i64 all = p.k_off | p.k_block | p.k_slot | p.v_off | p.v_block | p.v_slot | heads;
    return ((unsigned long long)p.kv & 15ull) == 0 && (all & 7) == 0;
}

// Element index of the 16-byte chunk `ch` of key j's row in one view (K or V: offset, block,
// slot and head strides) of the CTA's request and KV head. A 128-key span crosses pages, so each
// row is found through the block table on its own.
__device__ __forceinline__ i64 kv_chunk(const Params& p, const Cta& c, i64 block, unsigned slot_in_page, i64 off,
                                        i64 blk, i64 slot, i64 head, int ch) {
    const i64 e = off + block * blk + (i64)slot_in_page * slot + c.kvh * head + ch * 8;
    check_index(e, p.kv_size);
    check_index(e + 7, p.kv_size);
    return e;
}

// Copy one 16-byte chunk to shared address `at`: cp.async when the view is 16-byte aligned,
// else eight 2-byte loads.
__device__ __forceinline__ void copy_chunk(const Params& p, unsigned at, i64 e, bool aligned) {
    const unsigned short* kv = (const unsigned short*)p.kv;
    if (aligned) {
        cp_async16(at, kv + e);
    } else {
        unsigned w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) w[k] = (unsigned)kv[e + 2 * k] | ((unsigned)kv[e + 2 * k + 1] << 16);
        st_shared16(at, w[0], w[1], w[2], w[3]);
    }
}

// Copy keys [j0, j0 + NKEYS) of K (when WITH_K) and of V (when WITH_V) into swizzled
// [NKEYS][HEAD_DIM] tiles at those shared addresses, asynchronously: one 16-byte chunk per thread
// and row. The block-table reads of all the thread's rows are issued first, so their latencies
// overlap instead of queueing behind each copy. Keys outside [lo, hi) are neither read nor used:
// they become zeros, so garbage (NaN) in pages nobody may read never reaches the arithmetic
// (0 * NaN would). Every thread of the CTA must call this.
template <int NKEYS, bool WITH_K, bool WITH_V>
__device__ __forceinline__ void load_tiles(const Params& p, const Cta& c, i64 j0, unsigned k_dst, unsigned v_dst,
                                           bool aligned) {
    constexpr int PER = NKEYS / (THREADS / 16);
    const int ch = threadIdx.x & 15, r0 = threadIdx.x >> 4;
    const unsigned ps = (unsigned)p.page_size;
    int block[PER];  // block-table entries are int32
    unsigned slot_in_page[PER];
    bool in[PER];
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const i64 j = j0 + r0 + 8 * k;
        in[k] = j >= c.lo && j < c.hi;
        const unsigned page = (unsigned)j / ps;
        slot_in_page[k] = (unsigned)j - page * ps;
        block[k] = in[k] ? (int)ld_block(p, c.b * p.bt_stride + page) : 0;
    }
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int r = r0 + 8 * k;
        if (in[k]) {
            if (WITH_K)
                copy_chunk(p, k_dst + swz(r, ch),
                           kv_chunk(p, c, block[k], slot_in_page[k], p.k_off, p.k_block, p.k_slot, p.k_head, ch), aligned);
            if (WITH_V)
                copy_chunk(p, v_dst + swz(r, ch),
                           kv_chunk(p, c, block[k], slot_in_page[k], p.v_off, p.v_block, p.v_slot, p.v_head, ch), aligned);
        } else {
            if (WITH_K) st_shared16(k_dst + swz(r, ch), 0u, 0u, 0u, 0u);
            if (WITH_V) st_shared16(v_dst + swz(r, ch), 0u, 0u, 0u, 0u);
        }
    }
}

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

// Bias of keys j and j + 1 of a row in the log2 domain, -inf outside the CTA's keys [lo, hi)
// (other splits' keys, tile padding) or where the row's own mask says so.
template <class Row>
__device__ __forceinline__ void bias_cells(const Params& p, const Cta& c, const Row& row, int j, float& x0, float& x1) {
    const bool in0 = j >= c.lo && j < c.hi, in1 = j + 1 >= c.lo && j + 1 < c.hi;
    float b0 = neg_inf(), b1 = neg_inf();
    if (in0 && in1) row.bias2(p, j, b0, b1);
    else if (in0) b0 = row.bias(p, j);
    else if (in1) b1 = row.bias(p, j + 1);
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
// of NT score fragments: running max m and sum l in fp32 (the sum over the fp32 p, before
// rounding), alpha = the rescale of earlier tiles, and P rounded to the dtype as A fragments of
// NT / 2 k-steps. A row that has seen nothing visible keeps m = -inf and gets p = 0.
template <class T, int NT>
__device__ __forceinline__ void softmax_tile(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                             unsigned (&pa)[NT / 2][4]) {
    float mx[2] = {m[0], m[1]};
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
        use[r] = mx[r] == neg_inf() ? 0.f : mx[r];  // exp2(-inf - -inf) would be NaN
        alpha[r] = fast_exp2(m[r] - use[r]);
        m[r] = mx[r];
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[n][e] = fast_exp2(s[n][e] - use[e >> 1]);
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
