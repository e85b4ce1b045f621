#pragma once
#include "paged_kv.cuh"
#include "softmax.cuh"
#include "sm90.cuh"
// How a query block multiplies: mma.sync on every SM80+ GPU, wgmma on sm_90a.

// How a query block multiplies (the policy of `query_block`). mma.sync (every SM80+ GPU): warp w
// owns virtual rows [16 w, 16 w + 16); m16n8k16 MMAs with Q in registers and K and V read from
// XOR-swizzled tiles by `ldmatrix` (`.trans` for V).
template <class T> struct SyncProducts {
    static constexpr bool WG = false;  // tile layout of `tile_at`
    unsigned sk, sv, sr;
    unsigned qf[8][4];
    int k_row, k_ch, v_row, v_ch;
    template <class Row>
    __device__ __forceinline__ SyncProducts(const Params& p, const Cta&, const Row& ra, const Row& rb, int tq,
                                            unsigned char* smem) {
        const int lane = threadIdx.x & 31;
        sk = smem_addr(smem);
        sv = sk + KEY_TILE * HEAD_DIM * 2;
        sr = sv + KEY_TILE * HEAD_DIM * 2;  // Q stays in registers: its tile holds the staged biases
        load_q_frag(p, ra, rb, tq, qf);
        // ldmatrix row/chunk of this lane: K (B of Q K^T, two n-tiles per x4) and V (B of P V).
        k_row = (lane & 7) + ((lane >> 4) << 3);
        k_ch = (lane >> 3) & 1;
        v_row = (lane & 7) + (((lane >> 3) & 1) << 3);
        v_ch = lane >> 4;
    }
    // The thread's copies have landed: nothing more before the barrier.
    __device__ __forceinline__ void landed() const {}
    // S = Q K^T, complete on return (`qk_wait` has nothing left to do).
    __device__ __forceinline__ void qk_issue(float (&s)[8][4]) const {
#pragma unroll
        for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                unsigned b0, b1, b2, b3;
                ldsm_x4(sk + swz(16 * np + k_row, 2 * ks + k_ch), b0, b1, b2, b3);
                Tc<T>::mma(s[2 * np], qf[ks], b0, b1);
                Tc<T>::mma(s[2 * np + 1], qf[ks], b2, b3);
            }
        }
    }
    __device__ __forceinline__ void qk_wait(float (&)[8][4]) const {}
    __device__ __forceinline__ void pv(float (&o)[16][4], const unsigned (&pa)[4][4]) const {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
            for (int dp = 0; dp < 8; ++dp) {
                unsigned b0, b1, b2, b3;
                ldsm_x4_trans(sv + swz(16 * kk + v_row, 2 * dp + v_ch), b0, b1, b2, b3);
                Tc<T>::mma(o[2 * dp], pa[kk], b0, b1);
                Tc<T>::mma(o[2 * dp + 1], pa[kk], b2, b3);
            }
        }
    }
};

#ifdef __CUDA_ARCH_FEAT_SM90_ALL
// wgmma (sm_90a): Q (64 virtual rows), K and V tiles in shared memory in the canonical
// 128-byte-swizzled layout (`tile_at<N, true>`, 1024-byte aligned): S = Q K^T is 8 m64n64k16
// steps with both operands in shared memory, O += P V 4 m64n128k16 steps with P in registers and
// V read transposed; scores and output stay in the mma.sync fragment layout. VT V tiles: the
// windowed blocks (`window_block`) alternate between two, `query_block` has one.
template <class T, int VT = 1> struct WgProducts {
    static constexpr bool WG = true;
    static constexpr unsigned TILE_BYTES = KEY_TILE * HEAD_DIM * 2, HALF = KEY_TILE * 128;
    unsigned sq, sk, sv, sr;
    // Q: virtual row r = 16 w + 8 h + g of the block; thread x copies chunk x % 16 of rows
    // x / 16 + 8 k (the rows of `issue_tiles`), zeros for rows not computed; the copies join the
    // first K tile's group.
    template <class Row>
    __device__ __forceinline__ WgProducts(const Params& p, const Cta& c, const Row&, const Row&, int,
                                          unsigned char* smem) {
        sq = smem_addr(smem);
        sk = sq + TILE_BYTES;
        sv = sk + TILE_BYTES;       // V tile b at sv + b * TILE_BYTES
        sr = sv + VT * TILE_BYTES;  // the staged biases, then the mbarriers (QUERY_SMEM_BYTES_WG[_WINDOW])
        const int ch = threadIdx.x & 15;
#pragma unroll
        for (int k = 0; k < MMA_ROWS / 8; ++k) {
            const int r = (threadIdx.x >> 4) + 8 * k;
            const Row row(p, c, r);
            const unsigned at = sq + tile_at<MMA_ROWS, true>(r, ch);
            if (row.valid) {
                const i64 e = (row.t * p.H + row.h) * HEAD_DIM + ch * 8;
                check_index(e, p.q_size);
                check_index(e + 7, p.q_size);
                cp_async16(at, (const unsigned short*)p.q + e);
            } else {
                st_shared16(at, 0u, 0u, 0u, 0u);
            }
        }
    }
    // The thread's copies have landed: make them visible to wgmma's proxy before the barrier.
    __device__ __forceinline__ void landed() const { fence_proxy_async(); }
    // S = Q K^T, issued: the tensor cores work on it until `qk_wait`, and s must not be touched
    // in between.
    __device__ __forceinline__ void qk_issue(float (&s)[8][4]) const {
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
            const unsigned off = (ks >> 2) * HALF + (ks & 3) * 32;
            Wg<T>::qk(s, wg_desc(sq + off, 16, 1024), wg_desc(sk + off, 16, 1024), ks > 0);
        }
        wg_commit();
    }
    __device__ __forceinline__ void qk_wait(float (&s)[8][4]) const {
        wg_wait0();
        wg_hold(s);
    }
    // O += P V with V tile b, issued: o and pa must not be touched until the next wait.
    __device__ __forceinline__ void pv_issue(float (&o)[16][4], const unsigned (&pa)[4][4], int b) const {
        wg_fence();
        const unsigned v = sv + (unsigned)b * TILE_BYTES;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) Wg<T>::pv(o, pa[kk], wg_desc(v + kk * 2048, HALF, 1024));
        wg_commit();
    }
    __device__ __forceinline__ void pv_wait(float (&o)[16][4]) const {
        wg_wait0();
        wg_hold(o);
    }
    // O += P V with the first V tile, complete on return (`query_block`).
    __device__ __forceinline__ void pv(float (&o)[16][4], const unsigned (&pa)[4][4]) const {
        pv_issue(o, pa, 0);
        pv_wait(o);
    }
    // The windowed blocks leave P V running: one wait covers it and the Q K^T issued after it.
    __device__ __forceinline__ void qk_pv_wait(float (&s)[8][4], float (&o)[16][4]) const {
        qk_wait(s);
        wg_hold(o);
    }
};
#endif

// The products of this architecture's query blocks: wgmma on sm_90a, else mma.sync.
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
template <class T> using ArchProducts = WgProducts<T>;
#else
template <class T> using ArchProducts = SyncProducts<T>;
#endif
