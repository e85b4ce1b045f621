#pragma once
#include "params.cuh"
// ---------------------------------------------------------------------------------------------
// The attention CTA shared by the paths: CTA geometry, tensor-core fragments, asynchronous K/V
// tile copies, softmax tiles (the sm_90a instructions are in sm90.cuh).

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
__device__ __forceinline__ i64 first_query_row(int rows_q) { return (i64)(gridDim.x - 1 - blockIdx.x) * rows_q; }

// The CTA of a query-block grid `(ceil(max_q_len / (MMA_ROWS / G)), .., B)` for request b and KV
// head kvh: its query rows and every key [lo, hi) one of them may see (causal and window), one
// split writing `out`. False when the block lies past the request's rows (uniform over the CTA).
__device__ __forceinline__ bool query_cta(const Params& p, i64 b, i64 kvh, Cta& c) {
    c.b = b;
    c.kvh = kvh;
    c.split = 0;
    c.r = load_req(p, c.b);
    c.rows_q = cta_query_rows(p);
    c.i0 = first_query_row(c.rows_q);
    if (c.i0 >= c.r.q_len) return false;
    const i64 i_last = imin(c.i0 + c.rows_q, c.r.q_len) - 1;
    c.lo = first_visible(p, c.r.prefix() + c.i0);
    c.hi = c.r.prefix() + i_last + 1;
    c.partial = false;
    return true;
}

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

// Where a tile's cells read a row's rel_logits (row `rel_row`, position `pos`): keys j0 + x for
// small x known where the caller unrolls, so their elements sit at fixed offsets from one
// address (`at`, the element of key j0, d = d0). Forming it is free; only cells that pass the
// path's own extent test dereference it.
template <class T> struct RelCursor {
    const T* at;
    int d0;
};
template <class T>
__device__ __forceinline__ RelCursor<T> rel_cursor(const Params& p, i64 rel_row, int pos, int j0) {
    const int d0 = pos - j0;  // positions fit int32 (seqused_k is int32)
    return {(const T*)p.rel + (rel_row + d0), d0};
}

// Tensor-core operations per 16-bit dtype: D += A * B on m16n8k16 fragments (fp32 accumulate) and
// the packing of two fp32 values (rounded to nearest even) into one A-fragment register.
template <class T> struct Tc;
template <> struct Tc<bf16> {
    static constexpr unsigned NEG_INF_BITS = 0xff80u;
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
    static __device__ __forceinline__ float lo(unsigned w) { return __uint_as_float(w << 16); }
    static __device__ __forceinline__ float hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
};
template <> struct Tc<fp16> {
    static constexpr unsigned NEG_INF_BITS = 0xfc00u;
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
    static __device__ __forceinline__ float lo(unsigned w) {
        fp16 h;
        h.bits = (unsigned short)(w & 0xffffu);
        return to_f32(h);
    }
    static __device__ __forceinline__ float hi(unsigned w) {
        fp16 h;
        h.bits = (unsigned short)(w >> 16);
        return to_f32(h);
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
// cp.async.wait_group with a run-time count (uniform over the CTA), up to DEC_MAX_STAGES - 1
// (the ring's depth is clamped to DEC_MAX_STAGES); any other count waits for every copy.
__device__ __forceinline__ void cp_async_wait_dyn(int n) {
    static_assert(DEC_MAX_STAGES - 1 == 5, "one case per count up to DEC_MAX_STAGES - 1");
    switch (n) {
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    default: cp_async_wait<0>(); break;
    }
}
__device__ __forceinline__ void st_shared16(unsigned dst, unsigned a, unsigned b, unsigned c, unsigned d) {
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(dst), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ unsigned ld_shared_u16(unsigned addr) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr) : "memory");
    return v;
}
// Two 16-bit values as one register: lo in bits 0..15, hi in bits 16..31.
__device__ __forceinline__ unsigned pack_u16(unsigned lo, unsigned hi) { return __byte_perm(lo, hi, 0x5410); }
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

// A 16-byte chunk's first element index in the cache buffer, checked (with its last element)
// under RELATTN_BOUNDS_CHECK. A 128-key span crosses pages, so each key row is found through the
// block table on its own.
__device__ __forceinline__ i64 kv_elem(const Params& p, i64 e) {
    check_index(e, p.kv_size);
    check_index(e + 7, p.kv_size);
    return e;
}

// Copy one 16-byte chunk at element e to shared address `at` by eight 2-byte loads (views that
// are not 16-byte aligned; aligned ones take cp.async).
__device__ __forceinline__ void copy_chunk_u16(const Params& p, unsigned at, i64 e) {
    const unsigned short* kv = (const unsigned short*)p.kv;
    unsigned w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = (unsigned)kv[e + 2 * k] | ((unsigned)kv[e + 2 * k + 1] << 16);
    st_shared16(at, w[0], w[1], w[2], w[3]);
}

// Byte offset of (row r, 16-byte chunk ch) in a [NKEYS][HEAD_DIM] 16-bit tile: `swz` for the
// ldmatrix kernels; for wgmma (WG) the canonical 128-byte-swizzled layout: two column halves of
// 64 elements, each [NKEYS][64] with 128-byte rows and the chunk XOR-ed with r % 8 (the tile must
// start at a 1024-byte boundary).
template <int NKEYS, bool WG> __device__ __forceinline__ unsigned tile_at(int r, int ch) {
    if constexpr (WG) return (unsigned)((ch >> 3) * (NKEYS * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
    else return swz(r, ch);
}

// Where the rows of a key tile live. CTA-wide copies: thread x copies chunk x % 16 of rows
// x / 16 + 8 k. Warp-private copies (WARP): warp w copies its own quarter of the tile, rows
// w NKEYS / 4 + lane / 16 + 2 k, so the warp that reads those rows needs no barrier with the
// others. Fetched ahead of the copies so the block-table reads overlap other work. A tile inside
// one page (the usual case) reads the page's block once. A row's block is -1 for keys outside
// the CTA's [lo, hi) (validated block tables hold no negative entry for a key anyone may read).
template <int NKEYS, bool WARP = false> struct TileRows {
    static constexpr int PER = NKEYS / (THREADS / 16);
    static constexpr int STEP = WARP ? 2 : 8;  // rows between a thread's consecutive passes
    // One-page tiles fill block[] and slot[] only for CTA-wide copies. The decode loop (warp
    // copies) carries the next tile's rows through an iteration, so it keeps just the page's block
    // and first slot and derives a row's when a partial tile needs it; the query-block loops copy
    // right after fetching, where the filled arrays keep fewer values live (fewer spills).
    static constexpr bool LAZY = WARP;
    // Uniform: every row of the tile lies in one page (block `block0`, -1 when no key of the tile
    // is the CTA's; -1 on tiles across pages), the thread's first row in slot `slot0`, so its
    // rows step by STEP slots; `whole`: every key of the tile is the CTA's as well.
    bool one_page, whole;
    int first;  // the tile's first key
    int block0, slot0;
    int block[PER];  // tiles across pages: each row's block (int32 like the table) and slot
    int slot[PER];
    static __device__ __forceinline__ int row(int k) {
        if constexpr (WARP) return (int)(threadIdx.x >> 5) * (NKEYS / 4) + (int)((threadIdx.x >> 4) & 1) + 2 * k;
        else return (int)(threadIdx.x >> 4) + 8 * k;
    }
    // Block and slot of the thread's row k (block -1: outside [lo, hi)).
    __device__ __forceinline__ int row_block(const Cta& c, int k) const {
        if (!LAZY || !one_page) return block[k];
        const int j = first + row(k);
        return whole || (j >= (int)c.lo && j < (int)c.hi) ? block0 : -1;
    }
    __device__ __forceinline__ int row_slot(int k) const { return LAZY && one_page ? slot0 + STEP * k : slot[k]; }
};
static_assert(THREADS == 128, "warp-private copies split a tile over 4 warps of 2 rows per pass");

// Keys outside the CTA's [lo, hi) are neither read nor used (their block-table entries are not
// read either). Key arithmetic is 32-bit: key positions are int32 like `seqused_k`, and tiles
// (including those read ahead past hi) start below 2^31 - NKEYS; whether a tile meets [lo, hi)
// is decided in 64 bits. Power-of-two page sizes take shifts instead of a division, and a tile
// inside one page reads its block-table entry once. Every thread that copies rows of the tile
// must call this.
template <int NKEYS, bool WARP = false>
__device__ __forceinline__ TileRows<NKEYS, WARP> fetch_rows(const Params& p, const Cta& c, i64 j0) {
    using Rows = TileRows<NKEYS, WARP>;
    Rows t;
    const int first = (int)j0, lo = (int)c.lo, hi = (int)c.hi, ps = (int)p.page_size;
    const bool pow2 = (ps & (ps - 1)) == 0;
    const int sh = __ffs(ps) - 1;
    const i64 row0 = c.b * p.bt_stride;
    // Uniform over the CTA.
    const bool any = j0 + NKEYS > c.lo && j0 < c.hi;
    t.first = first;
    t.whole = j0 >= c.lo && j0 + NKEYS <= c.hi;
    t.one_page = pow2 && (first >> sh) == ((first + NKEYS - 1) >> sh);
    t.block0 = -1;
    t.slot0 = 0;
    if (t.one_page) {  // every row in the first key's page
        t.block0 = any ? (int)ld_block(p, row0 + (first >> sh)) : -1;
        t.slot0 = (first & (ps - 1)) + Rows::row(0);
        if constexpr (!Rows::LAZY) {
            // Key j is the CTA's iff lo <= j < hi: one unsigned compare of j - lo (modulo 2^32,
            // so row k's is off + STEP k) with the span (a whole tile passes every row).
            const unsigned off = (unsigned)(first + Rows::row(0) - lo), span = hi > lo ? (unsigned)(hi - lo) : 0u;
#pragma unroll
            for (int k = 0; k < Rows::PER; ++k) {
                t.slot[k] = t.slot0 + Rows::STEP * k;
                t.block[k] = (off + Rows::STEP * k < span) ? t.block0 : -1;
            }
        }
    } else {
#pragma unroll
        for (int k = 0; k < Rows::PER; ++k) {
            const int j = first + Rows::row(k);
            const bool in = j >= lo && j < hi;
            const int page = pow2 ? j >> sh : j / ps;
            t.slot[k] = j - page * ps;
            t.block[k] = in ? (int)ld_block(p, row0 + page) : -1;
        }
    }
    return t;
}

// The chunk copies of `issue_tiles` for views that are not 16-byte aligned: eight 2-byte loads
// per chunk. Kept out of the aligned loop (a branch per chunk there becomes predicated code
// that every aligned launch would issue).
template <int NKEYS, bool WITH_K, bool WITH_V, bool WG, bool WARP>
__device__ __forceinline__ void issue_tiles_unaligned(const Params& p, const Cta& c, const TileRows<NKEYS, WARP>& t,
                                                      unsigned k_dst, unsigned v_dst) {
    const int ch = threadIdx.x & 15;
    const i64 kb = p.k_off + c.kvh * p.k_head + ch * 8, vb = p.v_off + c.kvh * p.v_head + ch * 8;
#pragma unroll
    for (int k = 0; k < TileRows<NKEYS, WARP>::PER; ++k) {
        const unsigned at = tile_at<NKEYS, WG>(TileRows<NKEYS, WARP>::row(k), ch);
        const int block = t.row_block(c, k);
        if (block >= 0) {
            const i64 ko = (i64)block * p.k_block + (i64)t.row_slot(k) * p.k_slot;
            const i64 vo = (i64)block * p.v_block + (i64)t.row_slot(k) * p.v_slot;
            if (WITH_K) copy_chunk_u16(p, k_dst + at, kv_elem(p, kb + ko));
            if (WITH_V) copy_chunk_u16(p, v_dst + at, kv_elem(p, vb + vo));
        } else {
            if (WITH_K) st_shared16(k_dst + at, 0u, 0u, 0u, 0u);
            if (WITH_V) st_shared16(v_dst + at, 0u, 0u, 0u, 0u);
        }
    }
}

// Element offset of (block, slot) in the cache for these strides. Block and slot are
// non-negative where used: unsigned products are cheaper.
__device__ __forceinline__ i64 cache_offset(int block, int slot, i64 block_stride, i64 slot_stride) {
    return (i64)((unsigned long long)(unsigned)block * (unsigned long long)block_stride +
                 (unsigned long long)(unsigned)slot * (unsigned long long)slot_stride);
}

// One row's chunk of `issue_tiles`: K at kb + ko and V at vb + vo (element pointers into the
// cache) to shared addresses k_at and v_at by cp.async, or zeros for a row outside [lo, hi).
template <bool WITH_K, bool WITH_V>
__device__ __forceinline__ void copy_row(const Params& p, bool in, unsigned k_at, unsigned v_at,
                                         const unsigned short* kb, const unsigned short* vb, i64 ko, i64 vo) {
    const unsigned short* kv = (const unsigned short*)p.kv;
    if (in) {
        if (WITH_K) {
            kv_elem(p, (kb - kv) + ko);
            cp_async16(k_at, kb + ko);
        }
        if (WITH_V) {
            kv_elem(p, (vb - kv) + vo);
            cp_async16(v_at, vb + vo);
        }
    } else {
        if (WITH_K) st_shared16(k_at, 0u, 0u, 0u, 0u);
        if (WITH_V) st_shared16(v_at, 0u, 0u, 0u, 0u);
    }
}

// Copy the rows `t` of K (when WITH_K) and of V (when WITH_V) into [NKEYS][HEAD_DIM] tiles at
// those shared addresses (layout `tile_at<NKEYS, WG>`), asynchronously: one 16-byte chunk per
// thread and row. Keys outside [lo, hi) become zeros, so garbage (NaN) in pages nobody may read
// never reaches the arithmetic (0 * NaN would). Rows of a one-page tile step their K and V
// pointers by a constant; in a 16-byte-aligned view a whole one-page tile (the common case)
// copies with no per-row test and no zero stores at all. Every thread that copies rows of the tile (the CTA, or the warp for
// warp-private copies) must call this.
template <int NKEYS, bool WITH_K, bool WITH_V, bool WG = false, bool WARP = false>
__device__ __forceinline__ void issue_tiles(const Params& p, const Cta& c, const TileRows<NKEYS, WARP>& t,
                                            unsigned k_dst, unsigned v_dst, bool aligned) {
    if (!aligned) {
        issue_tiles_unaligned<NKEYS, WITH_K, WITH_V, WG, WARP>(p, c, t, k_dst, v_dst);
        return;
    }
    const int ch = threadIdx.x & 15;
    const unsigned short* kv = (const unsigned short*)p.kv;
    const unsigned short* kb = kv + (p.k_off + c.kvh * p.k_head + ch * 8);
    const unsigned short* vb = kv + (p.v_off + c.kvh * p.v_head + ch * 8);
    using Rows = TileRows<NKEYS, WARP>;
    if (t.one_page && t.whole && t.block0 >= 0) {
        const i64 k_step = (i64)Rows::STEP * p.k_slot, v_step = (i64)Rows::STEP * p.v_slot;
        const unsigned short* kr = kb + cache_offset(t.block0, t.slot0, p.k_block, p.k_slot);
        const unsigned short* vr = vb + cache_offset(t.block0, t.slot0, p.v_block, p.v_slot);
#pragma unroll
        for (int k = 0; k < Rows::PER; ++k) {
            const unsigned at = tile_at<NKEYS, WG>(Rows::row(k), ch);
            if (WITH_K) {
                kv_elem(p, kr - kv);
                cp_async16(k_dst + at, kr);
            }
            if (WITH_V) {
                kv_elem(p, vr - kv);
                cp_async16(v_dst + at, vr);
            }
            kr += k_step;
            vr += v_step;
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < Rows::PER; ++k) {
        const unsigned at = tile_at<NKEYS, WG>(Rows::row(k), ch);
        const int block = t.row_block(c, k), slot = t.row_slot(k);
        copy_row<WITH_K, WITH_V>(p, block >= 0, k_dst + at, v_dst + at, kb, vb,
                                 cache_offset(block, slot, p.k_block, p.k_slot),
                                 cache_offset(block, slot, p.v_block, p.v_slot));
    }
}

// Copy keys [j0, j0 + NKEYS): `fetch_rows` then `issue_tiles`.
template <int NKEYS, bool WITH_K, bool WITH_V, bool WG = false, bool WARP = false>
__device__ __forceinline__ void load_tiles(const Params& p, const Cta& c, i64 j0, unsigned k_dst, unsigned v_dst,
                                           bool aligned) {
    issue_tiles<NKEYS, WITH_K, WITH_V, WG, WARP>(p, c, fetch_rows<NKEYS, WARP>(p, c, j0), k_dst, v_dst, aligned);
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
