#pragma once
#include "params.cuh"
// ---------------------------------------------------------------------------------------------
// The attention CTA's geometry, shared by the paths: what one CTA computes (`Cta`), the query
// rows of a block, where a virtual row lives (`RowBase`) and where its rel_logits are
// (`RelCursor`).

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
