#pragma once
#include "params.cuh"
// The kernel entries: `RELATTN_ENTRY` and `RELATTN_DECODE_ENTRY` define an extern "C" kernel of
// one storage dtype with this architecture's launch bounds.

// Attention CTAs an SM should hold: 3 on sm_90a (the wgmma kernels fit 168 registers), else
// what the registers and shared memory give (the mma.sync kernels use up to 255 registers).
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
#define ATTN_CTAS_PER_SM 3
#else
#define ATTN_CTAS_PER_SM 1
#endif
// A program holds the entries of one storage dtype when built with -DRELATTN_ONLY_<dtype>, and
// those of one stage when built with -DRELATTN_ONLY_STAGE_<stage> (the compile plan builds every
// entry as a program of its own, so a build's programs compile in parallel); else all of them.
#if defined(RELATTN_ONLY_bf16)
#define RELATTN_KEEP_bf16(...) __VA_ARGS__
#define RELATTN_KEEP_fp16(...)
#elif defined(RELATTN_ONLY_fp16)
#define RELATTN_KEEP_bf16(...)
#define RELATTN_KEEP_fp16(...) __VA_ARGS__
#else
#define RELATTN_KEEP_bf16(...) __VA_ARGS__
#define RELATTN_KEEP_fp16(...) __VA_ARGS__
#endif
#define RELATTN_KEEP(...) __VA_ARGS__
#define RELATTN_DROP(...)
#if defined(RELATTN_ONLY_STAGE_prologue) || defined(RELATTN_ONLY_STAGE_main) || \
    defined(RELATTN_ONLY_STAGE_windowed) || defined(RELATTN_ONLY_STAGE_combine) || \
    defined(RELATTN_ONLY_STAGE_decode)
#define RELATTN_ONE_STAGE
#endif
#if !defined(RELATTN_ONE_STAGE) || defined(RELATTN_ONLY_STAGE_prologue)
#define RELATTN_KEEP_prologue RELATTN_KEEP
#else
#define RELATTN_KEEP_prologue RELATTN_DROP
#endif
#if !defined(RELATTN_ONE_STAGE) || defined(RELATTN_ONLY_STAGE_main)
#define RELATTN_KEEP_main RELATTN_KEEP
#else
#define RELATTN_KEEP_main RELATTN_DROP
#endif
#if !defined(RELATTN_ONE_STAGE) || defined(RELATTN_ONLY_STAGE_windowed)
#define RELATTN_KEEP_windowed RELATTN_KEEP
#else
#define RELATTN_KEEP_windowed RELATTN_DROP
#endif
#if !defined(RELATTN_ONE_STAGE) || defined(RELATTN_ONLY_STAGE_combine)
#define RELATTN_KEEP_combine RELATTN_KEEP
#else
#define RELATTN_KEEP_combine RELATTN_DROP
#endif
#if !defined(RELATTN_ONE_STAGE) || defined(RELATTN_ONLY_STAGE_decode)
#define RELATTN_KEEP_decode RELATTN_KEEP
#else
#define RELATTN_KEEP_decode RELATTN_DROP
#endif
// An entry is named `{path}_{stage}_{dtype}` (`entry_name` of kernels/src/gpu/source.rs).
#define RELATTN_ENTRY(path, stage, fn, T) RELATTN_KEEP_##T(RELATTN_KEEP_##stage( \
    extern "C" __global__ void __launch_bounds__(THREADS, ATTN_CTAS_PER_SM) path##_##stage##_##T(const __grid_constant__ Params p) { fn<T>(p); }))
// An entry whose CTAs should fit DECODE_CTAS_PER_SM to an SM (at most 65536 / (THREADS x that)
// registers per thread): the decode-only kernels, bound by the bytes in flight; 3 on sm_90a (where
// shared memory holds that many), else as many as the registers give.
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
#define DECODE_CTAS_PER_SM 3
#else
#define DECODE_CTAS_PER_SM 1
#endif
#define RELATTN_DECODE_ENTRY(path, stage, fn, T) RELATTN_KEEP_##T(RELATTN_KEEP_##stage( \
    extern "C" __global__ void __launch_bounds__(THREADS, DECODE_CTAS_PER_SM) path##_##stage##_##T(const __grid_constant__ Params p) { fn<T>(p); }))
