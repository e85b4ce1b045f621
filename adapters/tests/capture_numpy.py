#!/usr/bin/env python3
"""A numpy stand-in of vLLM's Inkling op module, called as vLLM's attention layer calls the op,
under capture.py: the CPU half of the capture flow, for tests.

    RELATTN_CAPTURE_DIR=DEST [RELATTN_CAPTURE_*=...] python3 capture_numpy.py [--count N]

calls the stand-in op once on each of N small cases (fp16 and fp32: numpy has no bf16; global
and local layers, padding-free batches of prefills, chunks and decodes) with capture installed
from the environment, and prints the files written.
"""

import argparse
import os
import sys
import types

# Run as a script, sys.path[0] is adapters/tests: the worker library and the tests (adapters/)
# and capture.py (adapters/tools/) are imported by name.
ADAPTERS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ADAPTERS, os.path.join(ADAPTERS, "tools")]

import numpy as np  # noqa: E402

import capture  # noqa: E402
import torch_common  # noqa: E402
from relattn_worker import attention_numpy  # noqa: E402

NUMPY_DTYPES = {"F16": np.float16, "F32": np.float32}


def op_arguments(case, layout="hnd_packed"):
    """The op's arguments for `case` as vLLM's attention layer passes them (numpy arrays of the
    case dtype): q and rel_logits of the real rows, K and V as views of one packed buffer, the
    serving table."""
    rows = case.real_rows
    floats = NUMPY_DTYPES[case.dtype]
    buf = np.empty(torch_common.packed_shape(layout, case.key_cache.shape), floats)
    key, value = torch_common.kv_views(buf, layout, case.D)
    key[...] = case.key_cache
    value[...] = case.value_cache
    return dict(q=case.q[:rows].astype(floats), key_cache=key, value_cache=value,
                block_table=torch_common.serving_block_table(case), cache_seqlens=case.seqused_k,
                cu_seqlens_q=case.cu_seqlens_q, max_seqlen_q=8,
                softmax_scale=case.softmax_scale, causal=True,
                window_size=(case.window_left, 0) if case.is_local else (-1, -1),
                rel_extent=case.rel_extent, rel_logits=case.rel_logits[:rows].astype(floats),
                num_splits=3)


def numpy_op(dtype, fail=None, nan_row=None):
    """A module standing in for vLLM's op module: `InklingFA4RelAttentionKernel.kernel` (a
    staticmethod with the op's signature) computes the operator in numpy into `out`."""

    class InklingFA4RelAttentionKernel:
        calls = 0

        @staticmethod
        def kernel(q, key_cache, value_cache, *, block_table, cache_seqlens, cu_seqlens_q,
                   max_seqlen_q, softmax_scale, causal, window_size, rel_extent, rel_logits,
                   num_splits=32, out=None):
            InklingFA4RelAttentionKernel.calls += 1
            if fail:
                raise fail
            case = capture.Case(q=q, key_cache=np.asarray(key_cache), value_cache=np.asarray(value_cache),
                                rel_logits=rel_logits, block_table=block_table, seqused_k=cache_seqlens,
                                cu_seqlens_q=cu_seqlens_q, softmax_scale=softmax_scale,
                                rel_extent=rel_extent, window_left=capture.window_left_of(window_size),
                                dtype=dtype)
            out[...] = attention_numpy(case).astype(out.dtype)
            if nan_row is not None:
                out[nan_row, 0, 0] = np.nan
            return out

    return types.SimpleNamespace(InklingFA4RelAttentionKernel=InklingFA4RelAttentionKernel,
                                 __name__="fake_op")


def call_op(module, case, **over):
    """One call of the op on `case` (`over` replaces arguments); returns (result, out)."""
    args = op_arguments(case)
    args.update(over)
    out = np.full(args["q"].shape, np.nan, args["q"].dtype)
    kwargs = {k: v for k, v in args.items() if k not in ("q", "key_cache", "value_cache")}
    result = module.InklingFA4RelAttentionKernel.kernel(
        args["q"], args["key_cache"], args["value_cache"], out=out, **kwargs)
    return result, out


def main(argv=None):
    from tests.casegen import random_case
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4)
    args = parser.parse_args(argv)
    settings = capture.Settings.from_env()
    if settings is None:
        sys.exit("capture_numpy.py: set RELATTN_CAPTURE_DIR")
    c = capture.Capture(settings, vllm_version="numpy stand-in")
    for i in range(args.count):
        dtype = ("F16", "F32")[i % 2]
        case = random_case(seed=100 + i, dtype=dtype, heads=4, kv_heads=(1, 2, 4)[i % 3],
                           head_dim=32, extent=(64, 16)[i % 2], page=(4, 8, 16)[i % 3],
                           window_left=(-1, 12)[(i // 2) % 2], pad_rows=0,
                           query_lens=(3, 0, 5, 1), kv_lens=(7, 4, 40 + i, 60))
        module = numpy_op(dtype)
        capture.install(module, capture=c)
        call_op(module, case)
    for path in c.written:
        print(path)


if __name__ == "__main__":
    main()
