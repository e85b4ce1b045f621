#pragma once
#include "cta.cuh"
#include "ptx.cuh"
// ---------------------------------------------------------------------------------------------
// Paged K/V: the shared-memory layout of a key tile (`swz`, `tile_at`) and the asynchronous
// copies of K/V rows through the block table into it (`fetch_rows`, `issue_tiles`,
// `load_tiles`); the sm_90a tensor copies are in kv_tma.cuh.

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
