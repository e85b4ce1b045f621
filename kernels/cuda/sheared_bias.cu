// sheared_bias path (the Blackwell datacenter route).
//
// Prologue: for each real query row t and head h, the sheared bias row holds, for the 128-key
// tiles that overlap the row's bias window, the bias in key order: slot k is key
// j = shear_base(pos) + k, holding rel_logits[t, h, d] for 0 <= d < E, -inf right of the
// diagonal (d < 0), and past E 0 on global layers or -inf on local ones (where E == window + 1,
// so the buffer carries the window). shear_width = E + SHEAR_TILE slots cover every tile a row
// can touch.
//
// Main: for each 128-key tile a row adds ONE contiguous slice of its sheared row. Tiles entirely
// below the sheared range (d >= E for every key) add 0 on global layers and are masked on local
// ones; tiles right of the row's diagonal are masked without reading the buffer.
// Split-KV: split s of request b covers key tiles [s * tps, (s + 1) * tps), tps =
// ceil(ceil(Lk / 128) / S); it is empty iff s * tps >= ceil(Lk / 128). With S == 1 the main
// kernel writes `out` directly; otherwise non-empty splits write fp32 partials + LSE and the
// combine kernel merges them, reading only the splits the same formula calls non-empty.

__device__ __forceinline__ i64 shear_base(const Params& p, i64 pos) {
    return imax(pos - p.E + 1, 0) / SHEAR_TILE * SHEAR_TILE;
}

__device__ __forceinline__ i64 shear_tiles_per_split(const Params& p, i64 kv_len) {
    return cdiv(cdiv(kv_len, SHEAR_TILE), p.num_splits);
}

// Grid: (ceil(max_q_len / ROWS), H, B).
template <class T>
__device__ void sheared_bias_prologue(const Params& p) {
    const i64 b = blockIdx.z, h = blockIdx.y;
    const Req r = load_req(p, b);
    const i64 i0 = (i64)blockIdx.x * ROWS;
    if (i0 >= r.q_len) return;
    const i64 width = p.shear_width;
    const bool local = p.window_left >= 0;
    for (i64 idx = threadIdx.x; idx < ROWS * width; idx += THREADS) {
        const i64 i = i0 + idx / width, k = idx % width;
        const bool valid = i < r.q_len;
        const bool rel_ok = MUTANT(7) ? i <= r.q_len : valid;
        const i64 t = r.q_start + i;
        const i64 pos = r.prefix() + i;
        const i64 d = pos - (shear_base(p, pos) + k);
        const bool in_window = !local || (MUTANT(6) ? d < p.window_left : d <= p.window_left);
        const bool in_extent = d >= 0 && (MUTANT(2) ? d <= p.E : d < p.E);
        const i64 rel_row = ((MUTANT(3) ? i : t) * p.H + h) * p.E;
        const i64 di = imin(MUTANT(1) ? imax(d - 1, 0) : d, p.E - 1);
        const float rel = (rel_ok && in_extent) ? ld_rel<T>(p, rel_row + di) : 0.f;
        const float v = (d < 0 || !in_window) ? neg_inf() : (in_extent ? rel : 0.f);
        if (valid) st_shear<T>(p, (t * p.H + h) * width + k, v);
    }
}

// Grid: (ceil(max_q_len / ROWS), H * num_splits, B); blockIdx.y = split * H + head.
template <class T>
__device__ void sheared_bias_main(const Params& p) {
    __shared__ float sk[KCHUNK][HEAD_DIM];
    __shared__ float sv[KCHUNK][HEAD_DIM];
    const i64 b = blockIdx.z, h = blockIdx.y % p.H, split = blockIdx.y / p.H;
    const Req r = load_req(p, b);
    const i64 i0 = (i64)blockIdx.x * ROWS;
    if (i0 >= r.q_len) return;
    const i64 tiles = cdiv(r.kv_len, SHEAR_TILE);
    const i64 tps = shear_tiles_per_split(p, r.kv_len);
    if (split * tps >= tiles) return;  // empty split: nothing written, the combine skips it
    const Slot sl = thread_slot();
    const i64 i = i0 + sl.vr;
    const bool valid = i < r.q_len;
    const i64 t = r.q_start + i;
    const i64 pos = r.prefix() + i;
    const i64 kvh = MUTANT(4) ? h % p.Hkv : h / p.G;
    const bool local = p.window_left >= 0;
    const i64 base = shear_base(p, pos);
    const i64 shear_row = (t * p.H + h) * p.shear_width;

    // Keys of this split that any row of the CTA may see: [lo, hi).
    const i64 i_last = imin(i0 + ROWS, r.q_len) - 1;
    const i64 lo = imax(first_visible(p, r.prefix() + i0), split * tps * SHEAR_TILE);
    const i64 hi = imin(r.prefix() + i_last + 1, (split + 1) * tps * SHEAR_TILE);

    float q[DIMS_PER_LANE];
    load_q_row<T>(p, valid, t, h, sl.lane, q);
    Softmax sm;
    sm.init();
    for (i64 kt = lo / SHEAR_TILE * SHEAR_TILE; kt < hi; kt += SHEAR_TILE) {
        // 0: right of the diagonal (masked), 1: below the sheared range, 2: one slice.
        const int mode = (!valid || kt > pos) ? 0 : (kt < base ? 1 : 2);
        const i64 slice = shear_row + (kt - base);
        const float below = local ? neg_inf() : 0.f;
        for (i64 j0 = kt; j0 < kt + SHEAR_TILE; j0 += KCHUNK) {
            if (j0 + KCHUNK <= lo || j0 >= hi) continue;  // uniform over the CTA
            __syncthreads();
            load_kv_chunk<T>(p, b, kvh, j0, lo, hi, sk, sv);
            __syncthreads();
            float s[KCHUNK];
            chunk_dots(q, sk, sl.lane, s);
#pragma unroll
            for (int jj = 0; jj < KCHUNK; ++jj) {
                const i64 j = j0 + jj;
                const bool in_range = j >= lo && j < hi;
                float bias = neg_inf();
                if (mode == 1) bias = below;
                if (mode == 2) bias = ld_shear<T>(p, slice + (j - kt));
                s[jj] = in_range ? s[jj] * p.scale + bias : neg_inf();
            }
            sm.update(s, sv, sl.lane);
        }
    }
    if (!valid) return;
    if (p.num_splits == 1) sm.store_out<T>(p, t, h, sl.lane);
    else sm.store_partial(p, split, t, h, sl.lane);
}

// Grid: (real_rows, H); one thread per output dim.
template <class T>
__device__ void sheared_bias_combine(const Params& p) {
    const i64 t = blockIdx.x, h = blockIdx.y;
    if (t >= p.real_rows) return;
    const i64 kv_len = ld_seqk(p, request_of_row(p, t));
    const i64 tiles = cdiv(kv_len, SHEAR_TILE);
    const i64 tps = shear_tiles_per_split(p, kv_len);
    combine_row<T>(p, t, h, [&](i64 s) { return s * tps < tiles; });
}

RELATTN_ENTRY(sheared_bias_prologue_bf16, sheared_bias_prologue, bf16)
RELATTN_ENTRY(sheared_bias_prologue_fp16, sheared_bias_prologue, fp16)
RELATTN_ENTRY(sheared_bias_prologue_fp32, sheared_bias_prologue, float)
RELATTN_ENTRY(sheared_bias_main_bf16, sheared_bias_main, bf16)
RELATTN_ENTRY(sheared_bias_main_fp16, sheared_bias_main, fp16)
RELATTN_ENTRY(sheared_bias_main_fp32, sheared_bias_main, float)
RELATTN_ENTRY(sheared_bias_combine_bf16, sheared_bias_combine, bf16)
RELATTN_ENTRY(sheared_bias_combine_fp16, sheared_bias_combine, fp16)
RELATTN_ENTRY(sheared_bias_combine_fp32, sheared_bias_combine, float)
