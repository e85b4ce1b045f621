#include "rel_row.cuh"
#include "entry.cuh"
// fallback path (the Ampere/Ada route): the generic tiled kernel, where one program is a block of
// query rows x all G query heads of one KV head (K/V staged once for the whole group), plus the
// two-stage split-KV decode kernel of docs/operator.md section 4.3 (its merge done by each group's last CTA).
//
// Bias per score: rel_logits[t, h, d] when 0 <= d < E, else 0, computed by a branch (no clamp);
// causal and window masks are explicit.

// A virtual row (`RelRow`, rel_row.cuh) with the bias by a branch.
template <class T>
struct FallbackRow : RelRow<T, FallbackRow<T>> {
    static constexpr bool REL_ROWS = true;  // the bias is rel_logits[t, h, d] (`RelStage`)
    using RelRow<T, FallbackRow<T>>::RelRow;
    // Bias of key j0 + x: rel_logits[t, h, d] when 0 <= d < E, else 0, by a branch (no clamp);
    // -inf where the causal or window mask hides the key.
    __device__ __forceinline__ float bias_at(const Params& p, const RelCursor<T>& cu, int x) const {
        const CellRule rule(p);
        const int d = cu.d0 - x;
        const bool visible = this->valid && rule.visible(d);
        float b = 0.f;
        if (this->rel_ok && rule.in_extent(d)) {
            check_index(this->rel_row + d, p.rel_size);
            b = to_f32(cu.at[-x]);
        }
        return visible ? b : neg_inf();
    }
};

// Keys a decode request attends to (docs/operator.md section 4.3): min(Lk, window_left + 1) when windowed, else Lk
// (compared before adding 1, so the largest windows cannot overflow).
__device__ __forceinline__ i64 decode_eff(const Params& p, i64 kv_len) {
    return p.window_left >= 0 && p.window_left < kv_len ? p.window_left + 1 : kv_len;
}

// Keys per decode split (docs/operator.md section 4.3): ceil(ceil(eff / S) / 32) * 32.
__device__ __forceinline__ i64 decode_split_len(const Params& p, i64 eff) { return cdiv(cdiv(eff, p.num_splits), 32) * 32; }

// Decode pieces. A split of split_len keys is cut into m pieces of piece_len keys (the last may
// be shorter): k = ceil(split_len / piece_keys), piece_len = ceil(ceil(split_len / k) / 32) * 32,
// m = ceil(split_len / piece_len) <= k. Piece j of split s is CTA (and workspace slot)
// u = s * m + j and covers keys kv_offset + s * split_len + [j * piece_len, min((j + 1) *
// piece_len, split_len)), clipped to eff. Piece starts grow with u, so the non-empty pieces are
// the first ones. A split no longer than piece_keys is one piece (m = 1, u = s): the split itself.
// The launcher sets piece_keys so that a launch has enough CTAs to fill the GPU (a long decode of
// one request on one KV head has only num_splits of them otherwise).
struct DecodePieces {
    i64 kv_offset, eff, split_len, piece_len, m;
    __device__ __forceinline__ DecodePieces(const Params& p, i64 kv_len) {
        eff = decode_eff(p, kv_len);
        kv_offset = kv_len - eff;
        split_len = decode_split_len(p, eff);
        const i64 k = imax(cdiv(split_len, imax(p.piece_keys, 1)), 1);
        piece_len = imax(cdiv(cdiv(split_len, k), 32) * 32, 32);  // 32 when eff is 0
        m = imax(cdiv(split_len, piece_len), 1);
    }
    // Keys of piece u; false (empty) iff the piece starts at or past eff or its split is past
    // num_splits.
    __device__ __forceinline__ bool keys(const Params& p, i64 u, i64& lo, i64& hi) const {
        const i64 s = u / m, j = u % m;
        const i64 start = s * split_len + j * piece_len;
        lo = kv_offset + start;
        hi = kv_offset + imin(s * split_len + imin((j + 1) * piece_len, split_len), eff);
        return s < p.num_splits && start < eff;
    }
    // Non-empty splits: the first ceil(eff / split_len) (0 when eff is 0).
    __device__ __forceinline__ i64 splits() const { return eff > 0 ? cdiv(eff, split_len) : 0; }
    // Non-empty pieces of non-empty split s (the last split may be shorter).
    __device__ __forceinline__ i64 pieces_of(i64 s) const {
        return cdiv(imin(split_len, eff - s * split_len), piece_len);
    }
};

// Whether this CTA is the last of n to count itself in on counter i. Every thread fences its
// partial stores before thread 0 counts the CTA in; the last CTA resets the counter (zero at
// allocation) for the next launch and fences before it reads the other CTAs' partials.
__device__ __forceinline__ bool last_to_finish(const Params& p, i64 i, i64 n) {
    __threadfence();
    __syncthreads();
    bool last = false;
    if (threadIdx.x == 0) {
        check_index(i, p.ws_count_size);
        last = atomicAdd(p.ws_count + i, 1u) + 1 == (unsigned)n;
        if (last) p.ws_count[i] = 0u;
    }
    last = __syncthreads_or(last);
    if (last) __threadfence();
    return last;
}

// The merge of docs/operator.md section 4.3 for the request's row and the group's heads over the n partials in
// workspace slots [first, first + n), into `out` (to_slot < 0) or into slot to_slot as one
// partial (normalised output and LSE). Each thread merges 8 dims of one head: the maximum of the
// LSEs, then the partials read eight slots at a time (from L2: other CTAs wrote them during this
// launch), summed in slot order as `combine_row` does.
template <class T>
__device__ void merge_group(const Params& p, const Cta& c, i64 first, i64 n, i64 to_slot) {
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
            for (int k = 0; k < 16; ++k) lse[k] = s0 + k < n ? ld_ws_lse_cg(p, (first + s0 + k) * split_rows + r0) : neg_inf();
#pragma unroll
            for (int k = 0; k < 16; ++k) m = fmaxf(m, lse[k]);
        }
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, wsum = 0.f;
        for (i64 s0 = 0; s0 < n; s0 += 8) {
            // Every load of the chunk is issued before any is used.
            float lse[8], v[8][8];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const i64 r = (first + s0 + k) * split_rows + r0;
                if (s0 + k < n) {
                    lse[k] = ld_ws_lse_cg(p, r);
                    ld_ws_o8_cg(p, r * HEAD_DIM + d0, v[k]);
                }
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                if (s0 + k < n) {
                    const float e = lse[k] - m;
                    const float w = expf(e);
#pragma unroll
                    for (int j = 0; j < 8; ++j) acc[j] = fmaf(w, v[k][j], acc[j]);
                    wsum += w;
                }
            }
        }
        if (to_slot < 0) {
            const i64 e = r0 * HEAD_DIM + d0;
#pragma unroll
            for (int j = 0; j < 8; ++j) st_out<T>(p, e + j, acc[j] / wsum);
        } else {
            // As `store_partial`: zeros and -inf for a row that saw nothing.
            const i64 wr = to_slot * split_rows + r0;
            const bool any = wsum > 0.f && m > neg_inf();
#pragma unroll
            for (int j = 0; j < 8; ++j) st_ws_o(p, wr * HEAD_DIM + d0 + j, any ? acc[j] / wsum : 0.f);
            if (d0 == 0) st_ws_lse(p, wr, any ? m + logf(wsum) : neg_inf());
        }
    }
}

// The split-KV decode kernel (docs/operator.md section 4.3), both stages in one launch. Grid: (num_splits x the most
// pieces per split, Hkv, B). Every request has q_len <= 1 (decode-only batch). Stage 1: a CTA
// covers the request's query x the G heads of one KV head over one piece of a split (bf16/fp16:
// the streaming single-query CTA of attention.cuh) and writes that piece's partial to slot u;
// empty pieces write nothing. When a split has several pieces, the last of them to finish merges
// them into the split's partial (slot gridDim.x + s, counter B Hkv + (b Hkv + kvh) S + s): a
// split's partial is what docs/operator.md section 4.3 says, the same merge formula over a finer partition of its
// keys. Stage 2: the last split of the request on that KV head to finish (counter b Hkv + kvh)
// merges the splits' partials into `out`, so no merge needs a launch of its own and the merges run
// while other CTAs still stream. A request with no key (eff == 0) has no partial: CTA 0 writes its
// rows from none (NaN, nothing was attended).
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
    // What the merges need, as 32-bit counts (a grid dimension bounds them), so that little stays
    // live through the streaming loop.
    const DecodePieces pieces(p, c.r.kv_len);
    const int n = (int)pieces.splits(), m = (int)pieces.m;
    if (pieces.keys(p, c.split, c.lo, c.hi)) {
        const int s = (int)(c.split / m), np = (int)pieces.pieces_of(s);
        run_decode_cta<T, FallbackRow<T>>(p, c);
        const i64 group = c.b * p.Hkv + c.kvh;
        if (m > 1) {
            if (!last_to_finish(p, p.B * p.Hkv + group * p.num_splits + s, np)) return;
            merge_group<T>(p, c, (i64)s * m, np, gridDim.x + s);
        }
        if (!last_to_finish(p, group, n)) return;
    } else if (n > 0 || c.split != 0) {
        return;  // empty: nothing written
    }
    merge_group<T>(p, c, m > 1 ? gridDim.x : 0, n, -1);
}

RELATTN_ENTRY(fallback, main, RelRowEntries<FallbackRow>::main, bf16)
RELATTN_ENTRY(fallback, main, RelRowEntries<FallbackRow>::main, fp16)
RELATTN_ENTRY(fallback, windowed, RelRowEntries<FallbackRow>::windowed, bf16)
RELATTN_ENTRY(fallback, windowed, RelRowEntries<FallbackRow>::windowed, fp16)
RELATTN_DECODE_ENTRY(fallback, decode, fallback_decode, bf16)
RELATTN_DECODE_ENTRY(fallback, decode, fallback_decode, fp16)
