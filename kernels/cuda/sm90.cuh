#pragma once
#include "params.cuh"
// The sm_90a instructions (wgmma and the tensor-memory copies), as inline PTX: this file is empty
// on every other architecture; products.cuh and query_block.cuh use it in their sm_90a code.
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
// ---- sm_90a: warpgroup MMA (wgmma) ------------------------------------------------------------
// The CTA's 4 warps are one warpgroup. Operands in shared memory are described by 64-bit matrix
// descriptors (PTX ISA, "Matrix Descriptor Format"): start address, leading and stride byte
// offsets (all >> 4) and the swizzle mode (1 = 128-byte). Tiles use the canonical 128-byte
// swizzled layout of `tile_at<N, true>`: for a K-major operand (Q, K) 8-row groups lie 1024
// bytes apart (stride offset) and a k-step of 16 elements advances the start by 32 bytes inside
// the swizzle atom; for V (B of P V, MN-major, transposed) the k-step of 16 keys advances the
// start by 2048 bytes and the second 64-column half lies NKEYS * 128 bytes on (leading offset).
// Accumulators are in the mma.sync C-fragment layout per warp (warp w holds rows 16 w ..), so
// the softmax code is shared with the ldmatrix kernels.
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Make this thread's generic-proxy shared-memory writes (st.shared, completed cp.async) visible
// to wgmma's asynchronous proxy; a barrier must follow before any wgmma reads them.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keep the compiler from moving reads of accumulator registers above the wait.
template <int N> __device__ __forceinline__ void wg_hold(float (&x)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(x[n][e])::"memory");
}

// S (64 x 64) = Q K^T, one k-step of 16 (SS: both operands in shared memory, K-major); `acc` 0
// overwrites S. O (64 x 128) += P V, one k-step of 16 keys (RS: P in registers, V transposed).
template <class T> struct Wg;
#define RELATTN_WG_OPS(T, TY) \
template <> struct Wg<T> { \
    static __device__ __forceinline__ void qk(float (&s)[8][4], unsigned long long da, unsigned long long db, int acc) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
            "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
            : "+f"(s[0][0]), "+f"(s[0][1]), "+f"(s[0][2]), "+f"(s[0][3]), "+f"(s[1][0]), "+f"(s[1][1]), "+f"(s[1][2]), "+f"(s[1][3]), "+f"(s[2][0]), "+f"(s[2][1]), "+f"(s[2][2]), "+f"(s[2][3]), "+f"(s[3][0]), "+f"(s[3][1]), "+f"(s[3][2]), "+f"(s[3][3]), "+f"(s[4][0]), "+f"(s[4][1]), "+f"(s[4][2]), "+f"(s[4][3]), "+f"(s[5][0]), "+f"(s[5][1]), "+f"(s[5][2]), "+f"(s[5][3]), "+f"(s[6][0]), "+f"(s[6][1]), "+f"(s[6][2]), "+f"(s[6][3]), "+f"(s[7][0]), "+f"(s[7][1]), "+f"(s[7][2]), "+f"(s[7][3]) \
            : "l"(da), "l"(db), "r"(acc)); \
    } \
    static __device__ __forceinline__ void pv(float (&o)[16][4], const unsigned (&a)[4], unsigned long long db) { \
        asm volatile( \
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" \
            "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
            "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n" \
            : "+f"(o[0][0]), "+f"(o[0][1]), "+f"(o[0][2]), "+f"(o[0][3]), "+f"(o[1][0]), "+f"(o[1][1]), "+f"(o[1][2]), "+f"(o[1][3]), "+f"(o[2][0]), "+f"(o[2][1]), "+f"(o[2][2]), "+f"(o[2][3]), "+f"(o[3][0]), "+f"(o[3][1]), "+f"(o[3][2]), "+f"(o[3][3]), "+f"(o[4][0]), "+f"(o[4][1]), "+f"(o[4][2]), "+f"(o[4][3]), "+f"(o[5][0]), "+f"(o[5][1]), "+f"(o[5][2]), "+f"(o[5][3]), "+f"(o[6][0]), "+f"(o[6][1]), "+f"(o[6][2]), "+f"(o[6][3]), "+f"(o[7][0]), "+f"(o[7][1]), "+f"(o[7][2]), "+f"(o[7][3]), "+f"(o[8][0]), "+f"(o[8][1]), "+f"(o[8][2]), "+f"(o[8][3]), "+f"(o[9][0]), "+f"(o[9][1]), "+f"(o[9][2]), "+f"(o[9][3]), "+f"(o[10][0]), "+f"(o[10][1]), "+f"(o[10][2]), "+f"(o[10][3]), "+f"(o[11][0]), "+f"(o[11][1]), "+f"(o[11][2]), "+f"(o[11][3]), "+f"(o[12][0]), "+f"(o[12][1]), "+f"(o[12][2]), "+f"(o[12][3]), "+f"(o[13][0]), "+f"(o[13][1]), "+f"(o[13][2]), "+f"(o[13][3]), "+f"(o[14][0]), "+f"(o[14][1]), "+f"(o[14][2]), "+f"(o[14][3]), "+f"(o[15][0]), "+f"(o[15][1]), "+f"(o[15][2]), "+f"(o[15][3]) \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)); \
    } \
};
RELATTN_WG_OPS(bf16, "bf16")
RELATTN_WG_OPS(fp16, "f16")

// Tensor-memory copies (TMA): one instruction copies a box of a tensor the launcher described
// (`TensorMap`, in parameter space) into shared memory, in the 128-byte swizzle of
// `tile_at<N, true>`, and counts its bytes on an mbarrier (arrival count 1: the issuing thread's
// arrive.expect_tx). Waiters test the barrier's phase parity.
__device__ __forceinline__ void mbar_init(unsigned bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    }
}
// Box (d0 .. d0 + 63, head, slot .. slot + R - 1, block) of a 4-d [blocks][page][heads][D] map
// whose boxes are R keys deep.
__device__ __forceinline__ void tma_box(unsigned dst, const TensorMap& map, unsigned bar, int d0, int head, int slot,
                                        int block) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
        "[%6];\n" ::"r"(dst),
        "l"(&map), "r"(d0), "r"(head), "r"(slot), "r"(block), "r"(bar)
        : "memory");
}
#endif
