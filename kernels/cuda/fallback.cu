// fallback path (the Ampere/Ada route): the generic tiled kernel, where one program is a block of
// query rows x all G query heads of one KV head (K/V staged once for the whole group), plus the
// two-stage split-KV decode kernel of SPEC section 4.3 and its merge.
//
// Bias per score: rel_logits[t, h, d] when 0 <= d < E, else 0, computed by a branch (no clamp);
// causal and window masks are explicit.

// Final score of row (t, h) at distance d, given the raw dot product.
template <class T>
__device__ __forceinline__ float fallback_score(const Params& p, bool valid, bool rel_ok, i64 rel_row, i64 d, float dot) {
    const bool in_window = p.window_left < 0 || (MUTANT(6) ? d < p.window_left : d <= p.window_left);
    const bool visible = valid && d >= 0 && in_window;
    float bias = 0.f;
    if (rel_ok && d >= 0 && (MUTANT(2) ? d <= p.E : d < p.E))
        bias = ld_rel<T>(p, rel_row + imin(MUTANT(1) ? imax(d - 1, 0) : d, p.E - 1));
    return visible ? dot * p.scale + bias : neg_inf();
}

// The query head of group member g of KV head kvh.
__device__ __forceinline__ i64 group_head(const Params& p, i64 kvh, i64 g) {
    return MUTANT(4) ? g * p.Hkv + kvh : kvh * p.G + g;
}

// Grid: (ceil(max_q_len / rows_q), Hkv, B) with rows_q = ROWS / G; virtual row vr is query row
// vr / G of the block and head kvh * G + vr % G.
template <class T>
__device__ void fallback_main(const Params& p) {
    __shared__ float sk[KCHUNK][HEAD_DIM];
    __shared__ float sv[KCHUNK][HEAD_DIM];
    const i64 b = blockIdx.z, kvh = blockIdx.y;
    const i64 rows_q = ROWS / p.G;
    const Req r = load_req(p, b);
    const i64 i0 = (i64)blockIdx.x * rows_q;
    if (i0 >= r.q_len) return;
    const Slot sl = thread_slot();
    const bool in_block = sl.vr < rows_q * p.G;
    const i64 i = i0 + sl.vr / p.G;
    const i64 h = group_head(p, kvh, sl.vr % p.G);
    const bool valid = in_block && i < r.q_len;
    const bool rel_ok = in_block && (MUTANT(7) ? i <= r.q_len : i < r.q_len);
    const i64 t = r.q_start + i;
    const i64 pos = r.prefix() + i;
    const i64 rel_row = ((MUTANT(3) ? i : t) * p.H + h) * p.E;

    const i64 i_last = imin(i0 + rows_q, r.q_len) - 1;
    const i64 lo = first_visible(p, r.prefix() + i0);
    const i64 hi = r.prefix() + i_last + 1;

    float q[DIMS_PER_LANE];
    load_q_row<T>(p, valid, t, h, sl.lane, q);
    Softmax sm;
    sm.init();
    for (i64 j0 = lo; j0 < hi; j0 += KCHUNK) {
        __syncthreads();
        load_kv_chunk<T>(p, b, kvh, j0, lo, hi, sk, sv);
        __syncthreads();
        float s[KCHUNK];
        chunk_dots(q, sk, sl.lane, s);
#pragma unroll
        for (int jj = 0; jj < KCHUNK; ++jj) s[jj] = fallback_score<T>(p, valid, rel_ok, rel_row, pos - (j0 + jj), s[jj]);
        sm.update(s, sv, sl.lane);
    }
    if (valid) sm.store_out<T>(p, t, h, sl.lane);
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
// covers the request's query x the G heads of one KV head over its split's keys.
template <class T>
__device__ void fallback_decode(const Params& p) {
    __shared__ float sk[KCHUNK][HEAD_DIM];
    __shared__ float sv[KCHUNK][HEAD_DIM];
    const i64 b = blockIdx.z, kvh = blockIdx.y, split = blockIdx.x;
    const Req r = load_req(p, b);
    if (r.q_len != 1) return;
    i64 lo, hi;
    if (!decode_split(p, r.kv_len, split, lo, hi)) return;  // empty: nothing written
    const Slot sl = thread_slot();
    const bool valid = sl.vr < p.G;
    const i64 h = group_head(p, kvh, sl.vr);
    const i64 t = r.q_start;
    const i64 pos = r.kv_len - 1;
    const i64 rel_row = ((MUTANT(3) ? 0 : t) * p.H + h) * p.E;

    float q[DIMS_PER_LANE];
    load_q_row<T>(p, valid, t, h, sl.lane, q);
    Softmax sm;
    sm.init();
    for (i64 j0 = lo; j0 < hi; j0 += KCHUNK) {
        __syncthreads();
        load_kv_chunk<T>(p, b, kvh, j0, lo, hi, sk, sv);
        __syncthreads();
        float s[KCHUNK];
        chunk_dots(q, sk, sl.lane, s);
#pragma unroll
        for (int jj = 0; jj < KCHUNK; ++jj) {
            const bool in_range = j0 + jj < hi;
            const float x = fallback_score<T>(p, valid, valid, rel_row, pos - (j0 + jj), s[jj]);
            s[jj] = in_range ? x : neg_inf();
        }
        sm.update(s, sv, sl.lane);
    }
    if (valid) sm.store_partial(p, split, t, h, sl.lane);
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
RELATTN_ENTRY(fallback_decode_bf16, fallback_decode, bf16)
RELATTN_ENTRY(fallback_decode_fp16, fallback_decode, fp16)
RELATTN_ENTRY(fallback_decode_fp32, fallback_decode, float)
RELATTN_ENTRY(fallback_merge_bf16, fallback_merge, bf16)
RELATTN_ENTRY(fallback_merge_fp16, fallback_merge, fp16)
RELATTN_ENTRY(fallback_merge_fp32, fallback_merge, float)
