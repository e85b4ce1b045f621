// fallback path (the Ampere/Ada route): the generic tiled kernel, where one program is a block of
// query rows x all G query heads of one KV head (K/V staged once for the whole group), plus the
// two-stage split-KV decode kernel of SPEC section 4.3 and its merge.
//
// Bias per score: rel_logits[t, h, d] when 0 <= d < E, else 0, computed by a branch (no clamp);
// causal and window masks are explicit.

// A virtual row: query row i0 + vr / G with the query head of group member vr % G.
template <class T>
struct FallbackRow : RowBase {
    i64 rel_row;
    __device__ __forceinline__ FallbackRow(const Params& p, const Cta& c, int vr) {
        const i64 g = vr % (int)p.G;
        place(p, c, vr, MUTANT(4) ? g * p.Hkv + c.kvh : c.kvh * p.G + g);
        rel_ok = in_block && (MUTANT(7) ? i <= c.r.q_len : i < c.r.q_len);
        rel_row = ((MUTANT(3) ? (i64)i : t) * p.H + h) * p.E;
    }
    using Cursor = RelCursor<T>;
    __device__ __forceinline__ Cursor cursor(const Params& p, int j0) const { return rel_cursor<T>(p, rel_row, pos, j0); }
    // Bias of key j0 + x: rel_logits[t, h, d] when 0 <= d < E, else 0, by a branch (no clamp);
    // -inf where the causal or window mask hides the key.
    __device__ __forceinline__ float bias_at(const Params& p, const Cursor& cu, int x) const {
        const int d = cu.d0 - x, wl = clamp_i32(p.window_left), E = clamp_i32(p.E);
        const bool in_window = wl < 0 || (MUTANT(6) ? d < wl : d <= wl);
        const bool visible = valid && d >= 0 && in_window;
        float b = 0.f;
        if (rel_ok && d >= 0 && (MUTANT(2) ? d <= E : d < E)) {
            if (MUTANT(1) || MUTANT(2)) {
                b = ld_rel<T>(p, rel_row + min(MUTANT(1) ? max(d - 1, 0) : d, E - 1));
            } else {
                check_index(rel_row + d, p.rel_size);
                b = to_f32(cu.at[-x]);
            }
        }
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

// Grid: (ceil(max_q_len / (MMA_ROWS / G)), Hkv, B).
template <class T>
__device__ void fallback_main(const Params& p) {
    Cta c;
    if (!query_cta(p, blockIdx.z, blockIdx.y, c)) return;
    run_cta<T, FallbackRow<T>>(p, c);
}

// Keys of decode split s of a request (SPEC 4.3): [kv_offset + s * split_len, ...), clipped to the
// effective range; empty (returns false) iff s * split_len >= eff.
__device__ __forceinline__ bool decode_split(const Params& p, i64 kv_len, i64 s, i64& lo, i64& hi) {
    const i64 eff = p.window_left >= 0 ? imin(kv_len, p.window_left + 1) : kv_len;
    const i64 kv_offset = kv_len - eff;
    const i64 split_len = cdiv(cdiv(eff, p.num_splits), 32) * 32;
    lo = kv_offset + s * split_len;
    hi = kv_offset + imin((s + 1) * split_len, eff);
    return s * split_len < eff;
}

// Stage 1. Grid: (num_splits, Hkv, B). Every request has q_len <= 1 (decode-only batch); a CTA
// covers the request's query x the G heads of one KV head over its split's keys (bf16/fp16:
// the streaming single-query CTA of attention.cuh).
template <class T>
__device__ void fallback_decode(const Params& p) {
    Cta c;
    c.b = blockIdx.z;
    c.kvh = blockIdx.y;
    c.split = blockIdx.x;
    c.r = load_req(p, c.b);
    if (c.r.q_len != 1) return;
    if (!decode_split(p, c.r.kv_len, c.split, c.lo, c.hi)) return;  // empty: nothing written
    c.rows_q = cta_query_rows(p);
    c.i0 = 0;
    c.partial = true;
    run_decode_cta<T, FallbackRow<T>>(p, c);
}

// Stage 2. Grid: (real_rows, H); merges only the splits stage 1 wrote.
template <class T>
__device__ void fallback_merge(const Params& p) {
    const i64 t = blockIdx.x, h = blockIdx.y;
    if (t >= p.real_rows) return;
    const i64 kv_len = ld_seqk(p, request_of_row(p, t));
    combine_row<T>(p, t, h, [&](i64 s) {
        i64 lo, hi;
        return decode_split(p, kv_len, s, lo, hi);
    });
}

RELATTN_ENTRY(fallback_main_bf16, fallback_main, bf16)
RELATTN_ENTRY(fallback_main_fp16, fallback_main, fp16)
RELATTN_ENTRY(fallback_main_fp32, fallback_main, float)
RELATTN_DECODE_ENTRY(fallback_decode_bf16, fallback_decode, bf16)
RELATTN_DECODE_ENTRY(fallback_decode_fp16, fallback_decode, fp16)
RELATTN_DECODE_ENTRY(fallback_decode_fp32, fallback_decode, float)
RELATTN_ENTRY(fallback_merge_bf16, fallback_merge, bf16)
RELATTN_ENTRY(fallback_merge_fp16, fallback_merge, fp16)
RELATTN_ENTRY(fallback_merge_fp32, fallback_merge, float)
