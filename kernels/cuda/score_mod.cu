#include "attention.cuh"
#include "entry.cuh"
// score_mod path (the Hopper route): a tiled flash forward where the bias is gathered per score
// element as rel_logits[t, h, clamp(d, 0, E - 1)] and selected to 0 outside [0, E).
// No split-KV: the whole key range of a CTA is one online softmax.
//
// Grid: (ceil(max_q_len / (MMA_ROWS / G)), Hkv, B). A CTA computes MMA_ROWS / G query rows of one
// request with the G query heads of one KV head (see basics.cuh). Rows of the CTA past the
// request's last row are tile padding: q and rel_logits are never read for them and nothing is
// stored.

template <class T>
struct ScoreModRow : RowBase {
    i64 rel_row;
    static constexpr bool REL_ROWS = true;  // the bias is rel_logits[t, h, d] (`RelStage`)
    __device__ __forceinline__ ScoreModRow(const Params& p, const Cta& c, int vr) {
        const i64 g = vr % (int)p.G;
        place(p, c, vr, c.kvh * p.G + g);
        rel_ok = in_block && (i < c.r.q_len);
        rel_row = (t * p.H + h) * p.E;
    }
    using Cursor = RelCursor<T>;
    __device__ __forceinline__ Cursor cursor(const Params& p, int j0) const { return rel_cursor<T>(p, rel_row, pos, j0); }
    // The final bias of key j0 + x (natural domain), -inf where the row may not see it. The
    // gather happens only where the select keeps it (0 <= d < E), so masked cells cost no load;
    // there the clamped index is d itself.
    __device__ __forceinline__ float bias_at(const Params& p, const Cursor& cu, int x) const {
        const CellRule rule(p);
        const int d = cu.d0 - x, E = clamp_i32(p.E);
        const bool visible = valid && rule.visible(d);
        const bool in_extent = rule.in_extent(d);
        const int dc = min(max(d, 0), E - 1);
        float gathered = 0.f;
        if (rel_ok && in_extent) {
            check_index(rel_row + dc, p.rel_size);
            gathered = to_f32(cu.at[-x]);
        }
        const float b = in_extent ? gathered : 0.f;
        return visible ? b : neg_inf();
    }
    __device__ __forceinline__ void bias_pair(const Params& p, const Cursor& cu, int x, float& b0, float& b1) const {
        b0 = bias_at(p, cu, x);
        b1 = bias_at(p, cu, x + 1);
    }
    __device__ __forceinline__ float bias(const Params& p, int j) const { return bias_at(p, cursor(p, j), 0); }
    __device__ __forceinline__ void bias2(const Params& p, int j, float& b0, float& b1) const {
        bias_pair(p, cursor(p, j), 0, b0, b1);
    }
};

template <class T>
__device__ void score_mod_main(const Params& p) {
    Cta c;
    if (!query_cta(p, blockIdx.z, blockIdx.y, c)) return;
    run_cta<T, ScoreModRow<T>>(p, c);
}

// The same kernel for windowed layers (window_left >= 0), whose query blocks also stage the tiles
// that need masks. Grid as `score_mod_main`.
template <class T>
__device__ void score_mod_windowed(const Params& p) {
    Cta c;
    if (!query_cta(p, blockIdx.z, blockIdx.y, c)) return;
    run_cta<T, ScoreModRow<T>, true>(p, c);
}

RELATTN_ENTRY(score_mod_main_bf16, score_mod_main, bf16)
RELATTN_ENTRY(score_mod_main_fp16, score_mod_main, fp16)
RELATTN_ENTRY(score_mod_windowed_bf16, score_mod_windowed, bf16)
RELATTN_ENTRY(score_mod_windowed_fp16, score_mod_windowed, fp16)
