// fallback path (the Ampere/Ada route): the generic tiled kernel, where one program is a block of
// query rows x all G query heads of one KV head (K/V staged once for the whole group), plus the
// two-stage split-KV decode kernel of SPEC section 4.3 (its merge done by each group's last CTA).
//
// Bias per score: rel_logits[t, h, d] when 0 <= d < E, else 0, computed by a branch (no clamp);
// causal and window masks are explicit.

// A virtual row: query row i0 + vr / G with the query head of group member vr % G.
template <class T>
struct FallbackRow : RowBase {
    i64 rel_row;
    static constexpr bool REL_ROWS = true;  // the bias is rel_logits[t, h, d] (`RelStage`)
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

// Keys a decode request attends to (SPEC 4.3): min(Lk, window_left + 1) when windowed, else Lk
// (compared before adding 1, so the largest windows cannot overflow).
__device__ __forceinline__ i64 decode_eff(const Params& p, i64 kv_len) {
    return p.window_left >= 0 && p.window_left < kv_len ? p.window_left + 1 : kv_len;
}

// Keys per decode split (SPEC 4.3): ceil(ceil(eff / S) / 32) * 32.
__device__ __forceinline__ i64 decode_split_len(const Params& p, i64 eff) { return cdiv(cdiv(eff, p.num_splits), 32) * 32; }

// Keys of decode split s of a request (SPEC 4.3): [kv_offset + s * split_len, ...), clipped to the
// effective range; empty (returns false) iff s * split_len >= eff.
__device__ __forceinline__ bool decode_split(const Params& p, i64 kv_len, i64 s, i64& lo, i64& hi) {
    const i64 eff = decode_eff(p, kv_len);
    const i64 kv_offset = kv_len - eff;
    const i64 split_len = decode_split_len(p, eff);
    lo = kv_offset + s * split_len;
    hi = kv_offset + imin((s + 1) * split_len, eff);
    return s * split_len < eff;
}

// Non-empty decode splits of a request: the first ceil(eff / split_len) (0 when eff is 0).
__device__ __forceinline__ i64 decode_nonempty(const Params& p, i64 kv_len) {
    const i64 eff = decode_eff(p, kv_len);
    return eff > 0 ? cdiv(eff, decode_split_len(p, eff)) : 0;
}

// Whether this CTA is the last of the n non-empty splits of (request c.b, KV head c.kvh) to
// finish. Every thread fences its partial stores before thread 0 counts the CTA in; the last CTA
// resets the counter (zero at allocation) for the next launch and fences before it reads the
// other CTAs' partials.
__device__ __forceinline__ bool last_to_finish(const Params& p, const Cta& c, i64 n) {
    __threadfence();
    __syncthreads();
    bool last = false;
    if (threadIdx.x == 0) {
        const i64 i = c.b * p.Hkv + c.kvh;
        check_index(i, p.ws_count_size);
        last = atomicAdd(p.ws_count + i, 1u) + 1 == (unsigned)n;
        if (last) p.ws_count[i] = 0u;
    }
    last = __syncthreads_or(last);
    if (last) __threadfence();
    return last;
}

// Stage 2 (the merge of SPEC 4.3) for the request's row and the group's heads, over the first n
// splits (exactly the non-empty ones). Each thread merges 8 dims of one head: the maximum of the
// LSEs, then the partials read eight splits at a time (from L2: other CTAs wrote them during
// this launch), summed in split order as `combine_row` does, so the result is the same bits.
template <class T>
__device__ void merge_group(const Params& p, const Cta& c, i64 n) {
    constexpr int CHUNKS = HEAD_DIM / 8;
    const i64 split_rows = p.T * p.H;
    for (int item = threadIdx.x; item < (int)p.G * CHUNKS; item += THREADS) {
        const FallbackRow<T> row(p, c, item / CHUNKS);
        if (!row.valid) continue;
        const i64 r0 = row.t * p.H + row.h;
        const int d0 = (item % CHUNKS) * 8;
        // The LSEs' maximum, sixteen loads in flight at a time (a load per iteration would wait
        // out the L2 latency once per split).
        float m = neg_inf();
        for (i64 s0 = 0; s0 < n; s0 += 16) {
            float lse[16];
#pragma unroll
            for (int k = 0; k < 16; ++k) lse[k] = s0 + k < n ? ld_ws_lse_cg(p, (s0 + k) * split_rows + r0) : neg_inf();
#pragma unroll
            for (int k = 0; k < 16; ++k) m = fmaxf(m, lse[k]);
        }
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, wsum = 0.f;
        for (i64 s0 = 0; s0 < n; s0 += 8) {
            // Every load of the chunk is issued before any is used.
            float lse[8], v[8][8];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const i64 r = (s0 + k) * split_rows + r0;
                if (s0 + k < n) {
                    lse[k] = ld_ws_lse_cg(p, r);
                    ld_ws_o8_cg(p, r * HEAD_DIM + d0, v[k]);
                }
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                if (s0 + k < n) {
                    const float w = MUTANT(5) ? 1.f : expf(lse[k] - m);
#pragma unroll
                    for (int j = 0; j < 8; ++j) acc[j] = fmaf(w, v[k][j], acc[j]);
                    wsum += w;
                }
            }
        }
        const i64 e = r0 * HEAD_DIM + d0;
#pragma unroll
        for (int j = 0; j < 8; ++j) st_out<T>(p, e + j, acc[j] / wsum);
    }
}

// The split-KV decode kernel (SPEC 4.3), both stages in one launch. Grid: (num_splits, Hkv, B).
// Every request has q_len <= 1 (decode-only batch). Stage 1: a CTA covers the request's query x
// the G heads of one KV head over its split's keys (bf16/fp16: the streaming single-query CTA of
// attention.cuh) and writes that split's partial; empty splits write nothing. Stage 2: the last
// CTA of the request's non-empty splits on that KV head merges their partials into `out`, so the
// merge needs no launch of its own and runs while other heads still stream. A request with no
// key (eff == 0) has no partial: split 0 writes its rows from none (NaN, nothing was attended).
template <class T>
__device__ void fallback_decode(const Params& p) {
    Cta c;
    c.b = blockIdx.z;
    c.kvh = blockIdx.y;
    c.split = blockIdx.x;
    c.r = load_req(p, c.b);
    if (c.r.q_len != 1) return;
    c.rows_q = cta_query_rows(p);
    c.i0 = 0;
    c.partial = true;
    const i64 n = decode_nonempty(p, c.r.kv_len);
    if (decode_split(p, c.r.kv_len, c.split, c.lo, c.hi)) {
        run_decode_cta<T, FallbackRow<T>>(p, c);
        if (!last_to_finish(p, c, n)) return;
    } else if (n > 0 || c.split != 0) {
        return;  // empty: nothing written
    }
    merge_group<T>(p, c, n);
}

RELATTN_ENTRY(fallback_main_bf16, fallback_main, bf16)
RELATTN_ENTRY(fallback_main_fp16, fallback_main, fp16)
RELATTN_ENTRY(fallback_main_fp32, fallback_main, float)
RELATTN_DECODE_ENTRY(fallback_decode_bf16, fallback_decode, bf16)
RELATTN_DECODE_ENTRY(fallback_decode_fp16, fallback_decode, fp16)
RELATTN_DECODE_ENTRY(fallback_decode_fp32, fallback_decode, float)
