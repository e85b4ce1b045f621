#include "rel_row.cuh"
#include "entry.cuh"
// score_mod path (the Hopper route): a tiled flash forward where the bias is gathered per score
// element as rel_logits[t, h, clamp(d, 0, E - 1)] and selected to 0 outside [0, E).
// No split-KV: the whole key range of a CTA is one online softmax. Its rows and query-block
// kernels are rel_row.cuh's.

// A virtual row (`RelRow`, rel_row.cuh) with the bias by a clamped gather and a select.
template <class T>
struct ScoreModRow : RelRow<T, ScoreModRow<T>> {
    static constexpr bool REL_ROWS = true;  // the bias is rel_logits[t, h, d] (`RelStage`)
    using RelRow<T, ScoreModRow<T>>::RelRow;
    // The final bias of key j0 + x (natural domain), -inf where the row may not see it. The
    // gather happens only where the select keeps it (0 <= d < E), so masked cells cost no load;
    // there the clamped index is d itself.
    __device__ __forceinline__ float bias_at(const Params& p, const RelCursor<T>& cu, int x) const {
        const CellRule rule(p);
        const int d = cu.d0 - x, E = clamp_i32(p.E);
        const bool visible = this->valid && rule.visible(d);
        const bool in_extent = rule.in_extent(d);
        const int dc = min(max(d, 0), E - 1);
        float gathered = 0.f;
        if (this->rel_ok && in_extent) {
            check_index(this->rel_row + dc, p.rel_size);
            gathered = to_f32(cu.at[-x]);
        }
        const float b = in_extent ? gathered : 0.f;
        return visible ? b : neg_inf();
    }
};

RELATTN_ENTRY(score_mod, main, RelRowEntries<ScoreModRow>::main, bf16)
RELATTN_ENTRY(score_mod, main, RelRowEntries<ScoreModRow>::main, fp16)
RELATTN_ENTRY(score_mod, windowed, RelRowEntries<ScoreModRow>::windowed, bf16)
RELATTN_ENTRY(score_mod, windowed, RelRowEntries<ScoreModRow>::windowed, fp16)
