#pragma once
#include "paged_kv.cuh"
#include "sm90.cuh"
// Tensor copies of K and V tiles (ON: the sm_90a query blocks, when the launcher encoded the
// cache's tensor maps, the view is 16-byte aligned and pages are powers of two of at least
// KV_TMA_MIN_PAGE keys). Every tile inside the CTA's keys [lo, hi) comes as boxes of 64 dims and
// R = min(page, KEY_TILE) keys, two per page of the tile (dims 0..63, 64..127), that thread 0
// issues after an arrive.expect_tx of the tile's bytes on the tensor's mbarrier, reading each
// page's block-table entry as it goes; every thread then waits for the barrier's phase. The first
// tile (when lo is inside it) and the last (when hi is) take the cp.async copies, so the tiles
// that come by TMA are consecutive and the phase of tile n is the parity of n less the CTA's
// partial first tile. `on` and `takes` are uniform over the CTA; `on` is the only state.
template <bool ON> struct KvTma {
    bool on;

    // Whether the launch's tiles may come by TMA (uniform): the launcher encoded the maps, the
    // view is 16-byte aligned and pages are powers of two of at least KV_TMA_MIN_PAGE keys.
    static __device__ __forceinline__ bool usable(const Params& p, bool aligned) {
        const i64 ps = p.page_size;
        return p.tma != 0 && aligned && ps >= KV_TMA_MIN_PAGE && (ps & (ps - 1)) == 0;
    }
    // Every thread calls this when `usable`: thread 0 initialises the n mbarriers from `bar` on.
    static __device__ __forceinline__ void init_barriers(unsigned bar, int n) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
        if (threadIdx.x == 0) {
            for (int k = 0; k < n; ++k) mbar_init(bar + 8 * k);
            mbar_init_fence();
        }
        __syncthreads();
#endif
    }
    __device__ __forceinline__ KvTma(const Params& p, bool aligned, unsigned bar) : on(false) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
        if constexpr (ON) {
            on = usable(p, aligned);
            if (on) init_barriers(bar, 2);
        }
#endif
    }
    // Uniform: tile kt (64-aligned) comes by TMA.
    __device__ __forceinline__ bool takes(const Cta& c, i64 kt) const {
        if constexpr (!ON) return false;
        return on && kt >= c.lo && kt + KEY_TILE <= c.hi;
    }
    // The phase parity of tile `it` of a CTA whose first tile starts at kt0.
    static __device__ __forceinline__ unsigned parity(const Cta& c, i64 kt0, int it) {
        return (unsigned)(it - (kt0 < c.lo ? 1 : 0)) & 1u;
    }
    // Every thread calls this; thread 0 copies tile kt of one tensor (offset and strides in
    // elements) into `at`.
    static __device__ __forceinline__ void issue(const Params& p, const Cta& c, const TensorMap& map, unsigned at,
                                                 unsigned bar, i64 off, i64 block_stride, i64 slot_stride,
                                                 i64 head_stride, i64 kt) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
        if (threadIdx.x == 0) {
            const int r = (int)min(p.page_size, (i64)KEY_TILE), sh = __ffsll(p.page_size) - 1;
            mbar_expect(bar, KEY_TILE * HEAD_DIM * 2);
            for (int q = 0; q < KEY_TILE; q += r) {
                const int block = (int)ld_block(p, c.b * p.bt_stride + ((kt + q) >> sh));
                const int slot = (int)((kt + q) & (p.page_size - 1));
                const i64 first = off + (i64)block * block_stride + slot * slot_stride + c.kvh * head_stride;
                kv_elem(p, first);
                kv_elem(p, first + (r - 1) * slot_stride + HEAD_DIM - 8);
                tma_box(at + (unsigned)(q * 128), map, bar, 0, (int)c.kvh, slot, block);
                tma_box(at + (unsigned)(KEY_TILE * 128 + q * 128), map, bar, 64, (int)c.kvh, slot, block);
            }
        }
        __syncwarp();
#endif
    }
    // Tile kt of K or V into `at`, counted on the mbarrier `bar`.
    static __device__ __forceinline__ void issue_k(const Params& p, const Cta& c, i64 kt, unsigned at, unsigned bar) {
        issue(p, c, p.tmap_k, at, bar, p.k_off, p.k_block, p.k_slot, p.k_head, kt);
    }
    static __device__ __forceinline__ void issue_v(const Params& p, const Cta& c, i64 kt, unsigned at, unsigned bar) {
        issue(p, c, p.tmap_v, at, bar, p.v_off, p.v_block, p.v_slot, p.v_head, kt);
    }
    static __device__ __forceinline__ void wait(unsigned bar, unsigned parity) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
        mbar_wait(bar, parity);
#endif
    }
};
