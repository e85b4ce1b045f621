// score_mod path (the Hopper route): a tiled flash forward where the bias is gathered per score
// element as rel_logits[t, h, clamp(d, 0, E - 1)] and selected to 0 outside [0, E).
// No split-KV: the whole key range of a CTA is one online softmax.
//
// Grid: (ceil(max_q_len / ROWS), H, B). A CTA computes ROWS query rows of one request and one
// head. Rows of the CTA past the request's last row are tile padding: q and rel_logits are never
// read for them and nothing is stored.

template <class T>
__device__ void score_mod_main(const Params& p) {
    __shared__ float sk[KCHUNK][HEAD_DIM];
    __shared__ float sv[KCHUNK][HEAD_DIM];
    const i64 b = blockIdx.z, h = blockIdx.y;
    const Req r = load_req(p, b);
    const i64 i0 = (i64)blockIdx.x * ROWS;
    if (i0 >= r.q_len) return;  // uniform over the CTA
    const Slot sl = thread_slot();
    const i64 i = i0 + sl.vr;
    const bool valid = i < r.q_len;
    const bool rel_ok = MUTANT(7) ? i <= r.q_len : valid;
    const i64 t = r.q_start + i;
    const i64 pos = r.prefix() + i;
    const i64 kvh = MUTANT(4) ? h % p.Hkv : h / p.G;
    const i64 rel_row = ((MUTANT(3) ? i : t) * p.H + h) * p.E;

    // Keys any row of this CTA may see: [lo, hi).
    const i64 i_last = imin(i0 + ROWS, r.q_len) - 1;
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
        for (int jj = 0; jj < KCHUNK; ++jj) {
            const i64 d = pos - (j0 + jj);
            const bool in_window = p.window_left < 0 || (MUTANT(6) ? d < p.window_left : d <= p.window_left);
            const bool visible = valid && d >= 0 && in_window;
            const i64 dc = imin(imax(MUTANT(1) ? d - 1 : d, 0), p.E - 1);
            const float gathered = rel_ok ? ld_rel<T>(p, rel_row + dc) : 0.f;
            const float bias = (d >= 0 && (MUTANT(2) ? d <= p.E : d < p.E)) ? gathered : 0.f;
            s[jj] = visible ? s[jj] * p.scale + bias : neg_inf();
        }
        sm.update(s, sv, sl.lane);
    }
    if (valid) sm.store_out<T>(p, t, h, sl.lane);
}

RELATTN_ENTRY(score_mod_main_bf16, score_mod_main, bf16)
RELATTN_ENTRY(score_mod_main_fp16, score_mod_main, fp16)
RELATTN_ENTRY(score_mod_main_fp32, score_mod_main, float)
