#pragma once
#include "attention.cuh"
// The rows whose bias is rel_logits[t, h, d] itself (score_mod's and fallback's: `RelRow`) and
// their query-block kernels (`RelRowEntries`). A path's file adds only how one cell reads its
// bias (`bias_at`, with its own extent test) and which entries it builds.

// A virtual row of a CTA: query row i0 + vr / G with the query head of group member vr % G,
// reading rel_logits row (t, h). `Row`, the path's row type, derives from it, defines
// `bias_at(p, cursor, x)`, the bias of key j0 + x with the masks applied (-inf where the row may
// not see the key), and declares `REL_ROWS = true` as every row type declares its own (its bias is
// rel_logits[t, h, d], so the query blocks may stage it: `RelStage`; attention.cuh reads it).
template <class T, class Row>
struct RelRow : RowBase {
    i64 rel_row;
    __device__ __forceinline__ RelRow(const Params& p, const Cta& c, int vr) {
        const i64 g = vr % (int)p.G;
        place(p, c, vr, c.kvh * p.G + g);
        rel_ok = in_block && (i < c.r.q_len);
        rel_row = (t * p.H + h) * p.E;
    }
    using Cursor = RelCursor<T>;
    // The casts to `Row` are written out at each call: a helper that returns `*this` as a `Row`
    // is one more inline level, which changes the order in which NVRTC inlines and so the
    // machine code (the builds are checked to stay byte for byte as they were).
    __device__ __forceinline__ Cursor cursor(const Params& p, int j0) const { return rel_cursor<T>(p, rel_row, pos, j0); }
    __device__ __forceinline__ void bias_pair(const Params& p, const Cursor& cu, int x, float& b0, float& b1) const {
        b0 = static_cast<const Row*>(this)->bias_at(p, cu, x);
        b1 = static_cast<const Row*>(this)->bias_at(p, cu, x + 1);
    }
    __device__ __forceinline__ float bias(const Params& p, int j) const { return static_cast<const Row*>(this)->bias_at(p, cursor(p, j), 0); }
    __device__ __forceinline__ void bias2(const Params& p, int j, float& b0, float& b1) const {
        bias_pair(p, cursor(p, j), 0, b0, b1);
    }
};

// The query-block kernels of rows `Row`, which a path's entries name (`RelRowEntries<FallbackRow>
// ::main`). Grid: (ceil(max_q_len / (MMA_ROWS / G)), Hkv, B). A CTA computes MMA_ROWS / G query
// rows of one request with the G query heads of one KV head (see basics.cuh). Rows of the CTA
// past the request's last row are tile padding: q and rel_logits are never read for them and
// nothing is stored.
template <template <class> class Row>
struct RelRowEntries {
    template <class T>
    static __device__ void main(const Params& p) {
        Cta c;
        if (!query_cta(p, blockIdx.z, blockIdx.y, c)) return;
        run_cta<T, Row<T>>(p, c);
    }

    // The same kernel for windowed layers (window_left >= 0), whose query blocks also stage the
    // tiles that need masks. Grid as `main`.
    template <class T>
    static __device__ void windowed(const Params& p) {
        Cta c;
        if (!query_cta(p, blockIdx.z, blockIdx.y, c)) return;
        run_cta<T, Row<T>, true>(p, c);
    }
};
