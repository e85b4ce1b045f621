// ---------------------------------------------------------------------------------------------
// The attention CTA shared by the paths (the second file of the shared device code, after
// common.cuh): CTA geometry, tensor-core fragments, asynchronous K/V tile copies, softmax tiles.

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

