#!/usr/bin/env python3
"""relattn worker: vLLM's Triton Inkling relative-attention op (protocol v1, PROTOCOL.md).

What it runs: `inkling_fa4_rel_attention` of `vllm/models/inkling/amd/ops/fa4_rel_attention.py`,
the op vLLM's ROCm Inkling layer calls and the one vLLM PR #55078 (open) routes SM8x GPUs to.
It ships in every vLLM wheel. Its Triton kernels run on NVIDIA GPUs as they are:

  * `_inkling_rel_attention_kernel`: one program = BLOCK_Q query rows (4, or 1 for decode) x the
    GQA group of one KV head, online softmax over every key from 0 to Lk in tiles of 64;
  * the two-stage split-KV decode of `rel_attention_decode.py`, taken when
    `use_split_kv_decode(max_query_len, max_kv_len, page_size, window_left)` says so, with
    `decode_split_count(max_kv_len, window_left)` splits;
  * the gluon kernels are gfx950-only (`on_gfx950()`, false on NVIDIA): never taken here.

Loaded as vllm_worker.py loads its op, by vllm_loader.py: from an unpacked wheel
(`RELATTN_VLLM_ROOT`, adapters/tools/fetch_vllm.sh) or an installed vLLM, with bare packages over
`vllm.models.inkling.amd(.ops)` and stand-ins for `vllm.platforms.rocm` (`on_gfx950` false) and
`vllm.triton_utils` (the real `triton` and `triton.language` when they import with a real
torch, else a stand-in that has what the modules use at import time, so that routing needs
neither torch nor Triton).

Path `triton_op`: the op as an Inkling attention layer calls it (the ROCm layer,
`vllm/models/inkling/amd/attention.py`, `InklingAttention._attention`): `q[:R]`,
`rel_logits[:R]`, `out=out[:R]` (R = cu_seqlens_q[B], out poisoned with NaN), the caches as one
HND buffer per layer `[num_blocks, Hkv, page, 2D]` with K and V its views, block-table entries
past a request's pages 0, `cache_seqlens = seqused_k`, `max_seqlen_q` bucketed,
`window_size = (window_left, 0)` or `(-1, -1)`, `num_splits = inkling_fa4_num_splits(...)` and
`max_kv_len = md.max_seq_len` (the batch's longest request). No `triton_splits` path: the op
deletes its `num_splits` argument, and the decode kernel's split count comes from
`decode_split_count(max_kv_len, window_left)`, which takes no count from its caller. The answer's
`num_splits` is the decode kernel's split count when it ran, else 1.

Routing (`route`, no GPU): the SM8x route PR #55078 defines, marked `proposed`: path `fallback`
(the Triton kernels), `num_splits` 1 (the op ignores the count it is handed), `decode_splits` from
the op's own `use_split_kv_decode` / `decode_split_count` on the route's shape. Other
capabilities keep their released route (the vllm worker answers it): `unsupported`.

    relattn run --impl triton ...                       # relattn starts this file
    python3 adapters/triton_worker.py [--vllm-root DIR] [--device cuda|cpu]

`--device cpu` runs the kernels in Triton's interpreter (`TRITON_INTERPRET=1`, torch for the
CPU): slow, for testing the worker without a GPU. Without torch, Triton, a device or the op,
`hello` still answers and every `run` answers `unsupported` with the reason.
"""

import argparse
import os
import sys
import types

import torch_common
from relattn_worker import (
    Unsupported, Worker, bucket_max_seqlen_q, cpu_timed, serve, unsupported_when_unavailable)
from vllm_loader import (
    OpSource, canonicalize_singleton_dim_strides, load_op, parse_capability, stand_in_module)

OP_MODULE = "vllm.models.inkling.amd.ops.fa4_rel_attention"
DECODE_MODULE = "vllm.models.inkling.amd.ops.rel_attention_decode"
OP_FILE = os.path.join("vllm", "models", "inkling", "amd", "ops", "fa4_rel_attention.py")
BARE_PACKAGES = ("vllm", "vllm.models", "vllm.models.inkling", "vllm.models.inkling.amd",
                 "vllm.models.inkling.amd.ops")
PATH = "triton_op"
PROPOSED = ("vLLM PR #55078 (open): SM8x runs the Triton kernels of "
            "vllm/models/inkling/amd/ops instead of FA4")
WORKER_VERSION = "1.0"


# ---------------------------------------------------------------------------------------------
# Stand-ins for Triton (routing without torch or Triton)
# ---------------------------------------------------------------------------------------------

def _jit(function=None, **_options):
    """triton.jit as a no-op decorator, bare (`@triton.jit`) or with options."""
    if function is None:
        return lambda f: f
    return function


def stand_in_triton():
    """(triton, triton.language) stand-ins with what the op modules use at import time and in
    their routing helpers: `jit`, `heuristics`, `cdiv`, `next_power_of_2`, `tl.constexpr`."""
    triton = types.ModuleType("triton")
    triton.jit = _jit
    triton.heuristics = lambda values: (lambda f: f)
    triton.cdiv = lambda a, b: -(-a // b)
    triton.next_power_of_2 = lambda n: 1 << max(0, int(n) - 1).bit_length()
    tl = types.ModuleType("triton.language")
    tl.constexpr = lambda value=None: value
    triton.language = tl
    triton._relattn_stand_in = True
    tl._relattn_stand_in = True
    return triton, tl


def real_triton():
    """(triton, triton.language, None), or (None, None, why not)."""
    try:
        import triton
        import triton.language as tl
    except Exception as e:
        return None, None, f"triton cannot be imported: {type(e).__name__}: {e}"
    return triton, tl, None


def triton_stand_ins(_root, torch_is_real):
    """The extra stand-ins of the Triton op: `vllm.platforms.rocm` and `vllm.triton_utils`
    (real Triton when it imports beside a real torch)."""
    triton, tl, _ = real_triton() if torch_is_real else (None, None, None)
    if triton is None:
        triton, tl = stand_in_triton()
    return {
        "vllm.platforms.rocm": stand_in_module("vllm.platforms.rocm", on_gfx950=lambda: False),
        "vllm.triton_utils": stand_in_module("vllm.triton_utils", triton=triton, tl=tl),
    }


TRITON_OP = OpSource(OP_MODULE, OP_FILE, BARE_PACKAGES, triton_stand_ins)


# ---------------------------------------------------------------------------------------------
# What the attention layer hands the op (plain functions, testable on a CPU)
# ---------------------------------------------------------------------------------------------

def decode_policy(decode, *, max_query_len, max_kv_len, page_size, window_left):
    """(whether the split-KV decode runs, its split count or 1), from the op's own functions.
    `max_query_len` is the bucketed max_seqlen_q the layer hands the op."""
    used = bool(decode.use_split_kv_decode(max_query_len=int(max_query_len),
                                           max_kv_len=int(max_kv_len), page_size=int(page_size),
                                           window_left=int(window_left)))
    return used, (int(decode.decode_split_count(int(max_kv_len), int(window_left))) if used else 1)


def route_answer(module, decode, cc, shape):
    """The route PR #55078 proposes for capability `cc` (protocol's route answer); Unsupported
    for the capabilities it leaves as they are."""
    capability = parse_capability(cc)
    if capability.major != 8:
        raise Unsupported(f"vLLM PR #55078 moves only SM8x to the Triton kernels; SM {cc} keeps "
                          "its released route (relattn route --check --impl vllm checks it)")
    need = ("is_local", "batch", "max_query_len", "heads", "kv_heads", "max_kv_len")
    missing = [k for k in need if k not in shape]
    if missing:
        raise ValueError(f"route shape lacks {missing}")
    bucket = getattr(module, "bucket_max_seqlen_q", bucket_max_seqlen_q)
    _, decode_splits = decode_policy(
        decode, max_query_len=bucket(int(shape["max_query_len"])),
        max_kv_len=int(shape["max_kv_len"]), page_size=int(shape.get("page_size", 16)),
        window_left=int(shape.get("window_left", -1)))
    return {"path": "fallback", "rejected": False, "reason": None, "num_splits": 1,
            "decode_splits": decode_splits, "proposed": PROPOSED}


def op_arguments(module, case):
    """The keyword arguments InklingAttention._attention passes to the op, but the tensors, and
    the number of real rows (`rows`)."""
    bucket = getattr(module, "bucket_max_seqlen_q", bucket_max_seqlen_q)
    max_seqlen_q = int(bucket(case.max_query_len))
    num_splits = int(module.inkling_fa4_num_splits(
        is_local=case.is_local, batch_size=case.B, max_query_len=max_seqlen_q,
        num_heads=case.H, num_kv_heads=case.Hkv, max_kv_len=case.max_kv_len))
    return {
        "rows": case.real_rows,
        "max_seqlen_q": max_seqlen_q,
        "softmax_scale": float(case.softmax_scale),
        "causal": True,
        "window_size": (case.window_left, 0) if case.is_local else (-1, -1),
        "rel_extent": case.rel_extent,
        "num_splits": num_splits,
        "max_kv_len": case.max_kv_len,
    }


def call_op(module, dc, args, out):
    """One call of the op on DeviceCase `dc` as the layer makes it (q, rel_logits and `out` hold
    the real rows, laid out as the case's row layout says)."""
    module.inkling_fa4_rel_attention(
        dc.q, dc.key_cache, dc.value_cache, block_table=dc.block_table,
        cache_seqlens=dc.seqused_k, cu_seqlens_q=dc.cu_seqlens_q,
        max_seqlen_q=args["max_seqlen_q"], softmax_scale=args["softmax_scale"],
        causal=args["causal"], window_size=args["window_size"], rel_extent=args["rel_extent"],
        rel_logits=dc.rel_logits, num_splits=args["num_splits"],
        max_kv_len=args["max_kv_len"], out=out)


class TritonWorker(Worker):
    name = "triton"
    maps_case_files = torch_common.MAPS_CASE_FILES
    paths = [PATH]
    split_paths = []

    def __init__(self, root=None, device="cuda"):
        self.device_name = device
        self.op = load_op(root, TRITON_OP)
        self.decode = sys.modules.get(DECODE_MODULE) if self.op.error is None else None
        self.torch = None
        versions = [f"vllm {self.op.version or 'unknown'} ({self.op.how})"] if not self.op.error else []
        # Without the op there is nothing to probe: its error is the reason.
        self.set_unavailable(self.op.error or self._probe(versions), "triton worker")
        runs = f"; runs unsupported: {self.unavailable}" if self.unavailable and versions else ""
        self.version = f"{WORKER_VERSION} ({', '.join(versions) or self.unavailable}{runs})"

    def _probe(self, versions):
        """torch, Triton (the real one, in the op's namespace) and a device, or why not."""
        torch, why = torch_common.load_torch()
        if torch is None:
            return why
        versions.append(f"torch {torch.__version__}")
        triton, _, why = real_triton()
        if triton is None:
            return why
        versions.append(f"triton {triton.__version__}")
        if getattr(sys.modules["vllm.triton_utils"].triton, "_relattn_stand_in", False):
            return "the op was loaded with the Triton stand-in"
        if self.device_name == "cpu":
            if os.environ.get("TRITON_INTERPRET") != "1":
                return ("--device cpu runs the Triton kernels in Triton's interpreter: set "
                        "TRITON_INTERPRET=1 (slow; for testing without a GPU)")
            self.device, self.capability = "cpu (Triton interpreter)", None
        else:
            self.device, self.capability = torch_common.cuda_device_info(torch, self.device_name)
            if self.device is None:
                return f"no usable CUDA device ({self.device_name}) for torch {torch.__version__}"
        self.torch = torch
        return None

    def route(self, cc, shape):
        if self.op.error:
            raise Unsupported(self.op.error)
        return route_answer(self.op.module, self.decode, cc, shape)

    @unsupported_when_unavailable
    def run(self, case, path, num_splits, timing):
        if num_splits is not None:
            raise Unsupported("the Triton op takes no split count (it deletes `num_splits`)")
        if case.dtype not in ("BF16", "F16"):
            raise Unsupported(f"the Triton op runs bf16 or fp16 caches, this case is {case.dtype}")
        torch, module = self.torch, self.op.module
        args = op_arguments(module, case)
        _, splits = decode_policy(self.decode, max_query_len=args["max_seqlen_q"],
                                  max_kv_len=args["max_kv_len"], page_size=case.page_size,
                                  window_left=args["window_size"][0])
        device = self.device_name
        sets = [self._device_case(case)]
        out, read = torch_common.row_out(torch, case, device, sets[0].dtype)
        call_op(module, sets[0], args, out)
        self._synchronize()
        result = read()
        ms = None
        if timing is not None:
            scratch = torch.empty_like(out)
            if device == "cpu":
                _, ms = cpu_timed(lambda: call_op(module, sets[0], args, scratch), timing)
            else:
                count = torch_common.input_sets(torch, sets[0].nbytes(), device)
                sets += [self._device_case(case) for _ in range(count - 1)]
                _, ms = torch_common.cuda_timed(
                    torch, lambda s: call_op(module, sets[s], args, scratch), len(sets),
                    timing["warmup"], timing["reps"])
        return result, splits, ms

    def _device_case(self, case):
        """The case on the device as vLLM holds it: one HND buffer, K and V its views with
        singleton strides canonicalised (`_split_kv_cache`)."""
        dc = torch_common.DeviceCase(self.torch, case, self.device_name, torch_common.VLLM_LAYOUT)
        dc.key_cache = canonicalize_singleton_dim_strides(dc.key_cache)
        dc.value_cache = canonicalize_singleton_dim_strides(dc.value_cache)
        return dc

    def _synchronize(self):
        if self.device_name != "cpu":
            self.torch.cuda.synchronize()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-root", help="folder holding an unpacked wheel's vllm/ "
                        "(default: RELATTN_VLLM_ROOT, else the installed vLLM)")
    parser.add_argument("--device", default="cuda", help="torch device (default cuda); cpu "
                        "needs TRITON_INTERPRET=1")
    args = parser.parse_args(argv)
    serve(TritonWorker(args.vllm_root, args.device))


if __name__ == "__main__":
    main()
