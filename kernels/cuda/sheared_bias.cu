#include "attention.cuh"
#include "combine.cuh"
#include "entry.cuh"
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

// Grid: (ceil(max_q_len / ROWS), H, B): ROWS query rows of one head; the threads walk a row's
// slots (consecutive slots read consecutive rel_logits and write consecutive buffer slots).
template <class T>
__device__ void sheared_bias_prologue(const Params& p) {
    const i64 b = blockIdx.z, h = blockIdx.y;
    const Req r = load_req(p, b);
    const i64 i0 = (i64)blockIdx.x * ROWS;
    if (i0 >= r.q_len) return;
    const int width = (int)p.shear_width;
    const CellRule rule(p);
    for (int rr = 0; rr < ROWS; ++rr) {
        const i64 i = i0 + rr;
        const bool valid = i < r.q_len;
        const bool rel_ok = valid;
        if (!valid && !rel_ok) break;  // uniform; later rows are past the request too
        const i64 t = r.q_start + i;
        const i64 pos = r.prefix() + i;
        const i64 base = shear_base(p, pos);
        const i64 rel_row = (t * p.H + h) * p.E;
        for (int k = threadIdx.x; k < width; k += THREADS) {
            const i64 d = pos - (base + k);
            const bool in_extent = rule.in_extent(d);
            const i64 di = imin(d, p.E - 1);
            const float rel = (rel_ok && in_extent) ? ld_rel<T>(p, rel_row + di) : 0.f;
            const float v = rule.visible(d) ? (in_extent ? rel : 0.f) : neg_inf();
            if (valid) st_shear<T>(p, (t * p.H + h) * width + k, v);
        }
    }
}

// Two adjacent slots (i even) of the sheared buffer.
template <class T>
__device__ __forceinline__ void ld_shear2(const Params& p, i64 i, float& x0, float& x1) {
    check_index(i, p.shear_size);
    check_index(i + 1, p.shear_size);
    const unsigned w = *(const unsigned*)((const unsigned short*)p.shear + i);
    T lo, hi;
    lo.bits = (unsigned short)(w & 0xffffu);
    hi.bits = (unsigned short)(w >> 16);
    x0 = to_f32(lo);
    x1 = to_f32(hi);
}

// A virtual row of the main kernel: its sheared row and where its slice starts.
template <class T>
struct ShearedRow : RowBase {
    i64 shear_row;
    int base;
    static constexpr bool REL_ROWS = false;  // the bias comes from the sheared buffer
    __device__ __forceinline__ ShearedRow(const Params& p, const Cta& c, int vr) {
        const i64 g = vr % (int)p.G;
        place(p, c, vr, c.kvh * p.G + g);
        base = (int)shear_base(p, pos);
        shear_row = (t * p.H + h) * p.shear_width;
    }
    // Keys of the 128-key tile kt: right of the row's diagonal (kt > pos) masked without reading
    // the buffer; entirely below the sheared range (d >= E for every key) 0 on global layers and
    // masked on local ones; else one contiguous slice of the sheared row, starting at slot
    // kt - base.
    __device__ __forceinline__ float bias(const Params& p, int j) const {
        const int kt = j / SHEAR_TILE * SHEAR_TILE;
        if (!valid || kt > pos) return neg_inf();
        if (kt < base) return p.window_left >= 0 ? neg_inf() : 0.f;
        const i64 slice = shear_row + (kt - base);
        return ld_shear<T>(p, slice + (j - kt));
    }
    // A tile's cells: keys j0 + x (the slices are looked up per pair).
    struct Cursor {
        int j0;
    };
    __device__ __forceinline__ Cursor cursor(const Params&, int j0) const { return {j0}; }
    __device__ __forceinline__ void bias_pair(const Params& p, const Cursor& cu, int x, float& b0, float& b1) const {
        bias2(p, cu.j0 + x, b0, b1);
    }
    // Keys j and j + 1 (j even: same tile, and an aligned pair of slots).
    __device__ __forceinline__ void bias2(const Params& p, int j, float& b0, float& b1) const {
        const int kt = j / SHEAR_TILE * SHEAR_TILE;
        if (!valid || kt > pos) {
            b0 = b1 = neg_inf();
        } else if (kt < base) {
            b0 = b1 = p.window_left >= 0 ? neg_inf() : 0.f;
        } else {
            const i64 slice = shear_row + (kt - base);
            ld_shear2<T>(p, slice + (j - kt), b0, b1);
        }
    }
};

// Grid: (ceil(max_q_len / (MMA_ROWS / G)), Hkv * num_splits, B); blockIdx.y = split * Hkv + kv
// head. The G query heads of a KV head share the CTA (and its K/V tiles).
template <class T>
__device__ void sheared_bias_main(const Params& p) {
    Cta c;
    if (!query_cta(p, blockIdx.z, blockIdx.y % p.Hkv, c)) return;
    c.split = blockIdx.y / p.Hkv;
    const i64 tiles = cdiv(c.r.kv_len, SHEAR_TILE);
    const i64 tps = shear_tiles_per_split(p, c.r.kv_len);
    if (c.split * tps >= tiles) return;  // empty split: nothing written, the combine skips it
    // Keys of this split that any row of the CTA may see: [lo, hi).
    c.lo = imax(c.lo, c.split * tps * SHEAR_TILE);
    c.hi = imin(c.hi, (c.split + 1) * tps * SHEAR_TILE);
    c.partial = p.num_splits > 1;
    run_cta<T, ShearedRow<T>>(p, c);
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

RELATTN_ENTRY(sheared_bias, prologue, sheared_bias_prologue, bf16)
RELATTN_ENTRY(sheared_bias, prologue, sheared_bias_prologue, fp16)
RELATTN_ENTRY(sheared_bias, main, sheared_bias_main, bf16)
RELATTN_ENTRY(sheared_bias, main, sheared_bias_main, fp16)
RELATTN_ENTRY(sheared_bias, combine, sheared_bias_combine, bf16)
RELATTN_ENTRY(sheared_bias, combine, sheared_bias_combine, fp16)
