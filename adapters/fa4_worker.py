#!/usr/bin/env python3
"""relattn worker: upstream FlashAttention-4 (flash-attn-4, CuTe DSL) with the relative bias as a
score_mod (protocol v1, PROTOCOL.md).

Name `fa4`, path `fa4_score_mod`. Each run calls FA4's varlen forward once, as a serving engine
would on a Hopper GPU (the form vLLM's Inkling op uses there):

    flash_attn_varlen_func(
        q[:R], key_cache, value_cache,              # R = cu_seqlens_q[B]; K, V views of one buffer
        cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k,
        max_seqlen_q=bucket_max_seqlen_q(max query length),
        page_table=block_table,                     # entries past a request's pages are 0
        softmax_scale=scale, causal=True,
        window_size=(window_left, 0) on local layers, (None, None) on global ones,
        num_splits=1 (or the forced count),
        score_mod=<adds rel_logits[t, h, d] for 0 <= d < E, else 0>,
        aux_tensors=[rel_logits[:R]])

The caches are vLLM's: one buffer [num_blocks, Hkv, page, 2D] (HND), K and V its views
`buf.transpose(1, 2).split(D, dim=-1)` (`--layout case` places them as the case file asks).
flash-attn-4 4.0.0b36's public function takes no `out`, so the worker calls the forward it runs,
`flash_attn.cute.interface._flash_attn_fwd`, with the same arguments and `out` = the real rows of
an output buffer poisoned with NaN (the public function and a copy when that one is missing): a
row FA4 never stores stays NaN, and the padding rows are never handed to it.

The package needs a CUDA GPU of compute capability 9.x, 10.x or 11.x for this call (FA4 has no
score_mod and no paged KV on SM8x, and no paged KV on SM12x), bf16 or fp16 inputs, and the
packages of adapters/tools/install_packages.sh on PYTHONPATH. When any of that is missing the worker
still answers hello, and every run answers "unsupported" with the reason.

    relattn run --impl fa4 ...                          # relattn starts this file
    python3 adapters/fa4_worker.py [--device cuda:0] [--layout vllm|case]
"""

import argparse
import functools
import os

import torch_common
from relattn_worker import (
    Unsupported, Worker, bucket_max_seqlen_q, serve, unsupported_when_unavailable)

PATH = "fa4_score_mod"
WORKER_VERSION = "1.0"

# What flash-attn-4 4.0.0b36's varlen forward takes, per compute-capability major (its own
# asserts in flash_attn/cute/interface.py): None = runs paged with a score_mod; else why not.
ARCH_LIMITS = {
    8: "FA4 has no paged KV and no user score_mod on SM8x",
    9: None,
    10: None,
    11: None,
    12: "FA4 has no paged-KV forward on SM12x",
}
# Majors whose FA4 forward can split the KV range (SM90 asserts "SplitKV not supported").
SPLIT_MAJORS = (10, 11)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="torch device to run on (default cuda)")
    parser.add_argument("--layout", choices=("vllm", "case"), default="vllm",
                        help="place the caches as vLLM does (HND buffer, default) or as the "
                             "case's cache_layout says")
    return parser.parse_args(argv)


@functools.cache
def rel_bias_score_mod(rel_extent):
    """The CuTe DSL score_mod adding the relative bias of docs/operator.md section 1 (one per rel_extent, so FA4's
    compile cache, keyed by source and closure values, keeps one kernel per E).

    FA4 calls it per score with the request's local query index q_idx = i (for GQA packing,
    already the logical row and query head), the key index kv_idx = j, and seqlen_info of the
    request (offset_q = cu_seqlens_q[b], seqlen_q = Lq, seqlen_k = seqused_k[b]); `scores`
    arrive already multiplied by softmax_scale. The bias is read at the packed row
    t = offset_q + i; tile padding rows (i >= Lq, the last q tile of a request) read the
    request's last row instead, and every row is clamped to rel_logits[:R] (R = cu_seqlens_q[B]),
    so no row past R - 1 is ever read; the clamped index is selected away (bias exactly 0)
    outside 0 <= d < E.
    """
    import cutlass.cute as cute
    from cutlass import Float32

    @cute.jit
    def score_mod_rel_bias(scores, b_idx, h_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        rel_logits = aux_tensors[0]
        i = q_idx[0]
        lq = seqlen_info.seqlen_q
        d = (seqlen_info.seqlen_k - lq + i) - kv_idx[0]
        # Clamp the row to the request's own rows (tile padding rows are never stored).
        last = lq - 1
        row_i = i if i < last else last
        row_i = row_i if row_i > 0 else 0
        row = seqlen_info.offset_q + row_i
        # And to the rows FA4 was handed (rel_logits[:R]), whatever the tile scheduler does.
        rows = rel_logits.shape[0]
        row = row if row < rows else rows - 1
        # Clamp the distance into [0, E - 1] for the read, then keep the bias only where the
        # clamp changed nothing (0 <= d < E); elsewhere it is exactly 0.
        e = d if d > 0 else 0
        e = e if e < rel_extent else rel_extent - 1
        bias = Float32(rel_logits[row, h_idx[0], e])
        bias = bias if d == e else Float32(0.0)
        return scores + bias

    return score_mod_rel_bias


def fa4_call(fa4, dc, case, num_splits, out=None):
    """One call of FA4's varlen forward on DeviceCase `dc`: the output [R, H, D] of the real
    rows (R = cu_seqlens_q[B]).

    With `out` (the real rows of the worker's NaN-poisoned output buffer) FA4 writes into it
    through `flash_attn.cute.interface._flash_attn_fwd`, the forward `flash_attn_varlen_func`
    runs and the one form that takes an output: a row FA4 never stores stays NaN, and the
    buffer was written (poisoned) by the worker before FA4 ran, so compute-sanitizer's
    initcheck, which does not see FA4's TMA stores, reads no "uninitialized" output. Without
    that function the public one runs and its result is copied into `out`."""
    window = (case.window_left, 0) if case.is_local else (None, None)
    args = dict(
        cu_seqlens_q=dc.cu_seqlens_q,
        seqused_k=dc.seqused_k,
        max_seqlen_q=bucket_max_seqlen_q(case.max_query_len),
        page_table=dc.block_table,
        softmax_scale=case.softmax_scale,
        causal=True,
        num_splits=num_splits,
        score_mod=rel_bias_score_mod(case.E),
        aux_tensors=[dc.rel_logits],
    )
    forward = fa4_forward(fa4)
    if out is not None and forward is not None:
        forward(dc.q, dc.key_cache, dc.value_cache, window_size_left=window[0],
                window_size_right=window[1], out=out, **args)
        return out
    result = fa4.flash_attn_varlen_func(dc.q, dc.key_cache, dc.value_cache, window_size=window, **args)
    result = result[0] if isinstance(result, tuple) else result
    if out is None:
        return result
    out.copy_(result)
    return out


def fa4_forward(fa4):
    """The forward `flash_attn_varlen_func` runs, which takes an output, or None."""
    return getattr(getattr(fa4, "interface", None), "_flash_attn_fwd", None)


def check_case(case, major):
    """Raise Unsupported for what this FA4 cannot take (before any device work)."""
    why = ARCH_LIMITS.get(major, f"FA4 does not support compute capability major {major}")
    if why:
        raise Unsupported(why)
    if case.dtype not in ("BF16", "F16"):
        raise Unsupported(f"FA4 takes bf16 or fp16 inputs, this case is {case.dtype}")
    limit = 256 if major == 9 else 128
    if not (8 <= case.D <= limit and case.D % 8 == 0):
        raise Unsupported(f"FA4 on SM{major}x takes head dims 8..{limit} divisible by 8, not {case.D}")


class Fa4Worker(Worker):
    name = "fa4"
    maps_case_files = torch_common.MAPS_CASE_FILES
    paths = [PATH]

    def __init__(self, device="cuda", layout="vllm"):
        self.layout = layout
        self.device_name = device
        self.torch, self.fa4 = None, None
        self.major = None
        torch, why = torch_common.load_torch()
        versions = []
        if torch is not None:
            versions.append(f"torch {torch.__version__}")
            self.device, self.capability = torch_common.cuda_device_info(torch, device)
            if self.device is None:
                why = f"no usable CUDA device ({device}) for torch {torch.__version__}"
            else:
                self.major = int(self.capability.split(".")[0])
                # Keep compiled kernels across worker restarts (each new variant takes 5-30 s).
                os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
                try:
                    import flash_attn.cute as fa4
                    import cutlass  # noqa: F401  (the DSL FA4 compiles with)
                except Exception as e:
                    why = f"flash_attn.cute cannot be imported: {type(e).__name__}: {e}"
                else:
                    self.torch, self.fa4 = torch, fa4
                    versions.append(f"flash-attn-4 {package_version('flash-attn-4')}")
                    versions.append(f"nvidia-cutlass-dsl {package_version('nvidia-cutlass-dsl')}")
        self.set_unavailable(why, "fa4 worker")
        self.version = f"{WORKER_VERSION} ({', '.join(versions) or why})"
        self.split_paths = [PATH] if self.major in SPLIT_MAJORS and not why else []

    @unsupported_when_unavailable
    def run(self, case, path, num_splits, timing):
        check_case(case, self.major)
        if num_splits is not None and num_splits > 1 and self.major not in SPLIT_MAJORS:
            raise Unsupported(f"FA4 has no split-KV on SM{self.major}x (num_splits {num_splits} asked)")
        splits = 1 if num_splits is None else num_splits
        torch = self.torch
        layout = torch_common.VLLM_LAYOUT if self.layout == "vllm" else case.cache_layout
        out = torch_common.nan_out(torch, case, self.device_name)
        if case.real_rows == 0:
            return torch_common.out_to_numpy(out), splits, None
        sets = [torch_common.DeviceCase(torch, case, self.device_name, layout)]

        # The first call (which compiles each new kernel variant) gives the output, written into
        # the real rows of `out`; timed calls come after it, rotating through copies of the inputs
        # and writing elsewhere (FA4's own output where its forward takes none).
        fa4_call(self.fa4, sets[0], case, splits, out[:case.real_rows])
        ms = None
        if timing is not None:
            count = torch_common.input_sets(torch, sets[0].nbytes(), self.device_name)
            sets += [torch_common.DeviceCase(torch, case, self.device_name, layout)
                     for _ in range(count - 1)]
            scratch = torch.empty_like(out[:case.real_rows]) if fa4_forward(self.fa4) else None

            def call(s):
                return fa4_call(self.fa4, sets[s], case, splits, scratch)

            _, ms = torch_common.cuda_timed(torch, call, len(sets), timing["warmup"], timing["reps"])
        torch.cuda.synchronize()
        return torch_common.out_to_numpy(out), splits, ms


def package_version(name):
    """Installed version of a distribution, or "?"."""
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return "?"


def main(argv=None):
    args = parse_args(argv)
    serve(Fa4Worker(device=args.device, layout=args.layout))


if __name__ == "__main__":
    main()
