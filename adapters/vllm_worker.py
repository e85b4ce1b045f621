#!/usr/bin/env python3
"""relattn worker: vLLM's Inkling relative-attention op (protocol v1, PROTOCOL.md).

What it loads: `vllm/models/inkling/nvidia/ops/fa4_rel_attention.py`, the op module that vLLM's
Inkling attention layer (`vllm/models/inkling/nvidia/attention.py`, `InklingAttention._attention`)
calls, through vllm_loader.py: from `RELATTN_VLLM_ROOT` (an unpacked vLLM wheel, see
tools/fetch_vllm.sh, or a clone of vLLM's repository; its version is then `git describe`) with
stand-ins for the rest of vLLM, else from the installed vLLM.

Routing (`route`, no GPU needed): the capability is mocked as the stand-in platform's
`get_device_capability()` (the op module's `current_platform` is replaced while answering, and
`_use_sheared_bias`'s cache is cleared around it). The answer's path is `sheared_bias` when the
op would take tml-fa4 (`_use_sheared_bias()`), else `score_mod` (the FA4 score_mod entry: the op
has no third entry); `num_splits` is `inkling_fa4_num_splits(...)` called as the attention layer
calls it: `max_query_len = bucket_max_seqlen_q(max query length)`, `batch_size` = number of
requests, `max_kv_len` = the layer's static bound (`local_extent` = window_left + 1 on local
layers, the route's `max_kv_len` on global ones). An exception raised while the op decides is a
rejection with its text.

Running (`run`, GPU): paths

  vllm_op          the op as vLLM calls it (its own routing and split policy)
  vllm_op_sheared  the tml-fa4 sheared-bias entry forced (`_use_sheared_bias` -> True), to show
                   what happens where vLLM would not route it; splits from vLLM's policy on
                   this device
  vllm_op_splits   vllm_op with the trial's forced split count (the only split path)

The arguments are those of `InklingAttention._attention`: `q[:cu[B]]`, `rel_logits[:cu[B]]`,
`out=out[:cu[B]]` (out pre-filled with NaN), the caches as one HND buffer per layer
`[num_blocks, Hkv, page, 2D]` with K and V its views `buf.transpose(1, 2).split(D, dim=-1)`
(canonicalised singleton strides, as `_split_kv_cache` does), block-table entries past a
request's pages set to 0, `window_size = (window_left, 0)` on local layers and `(-1, -1)` on
global ones, `causal=True`. Without torch, CUDA, cutlass or the op, `hello` still answers and
every `run` answers `unsupported` with the import error.

Capture: with RELATTN_CAPTURE_DIR set, the op is wrapped by tools/capture.py as it is loaded,
and the inputs of the calls its rules select (RELATTN_CAPTURE_*) are written there as case
files, which `relattn run --cases DIR` runs; `hello`'s version says so.

Environment: RELATTN_VLLM_ROOT as above (an unpacked wheel or a source checkout: the op file is
at the same place in both); RELATTN_CAPTURE_* as above; FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED
defaults to 1.
"""

import argparse
import contextlib
import importlib
import os
import sys

import numpy as np

import torch_common
from relattn_worker import (
    Unsupported, Worker, bucket_max_seqlen_q, log, serve, unsupported_when_unavailable)
from vllm_loader import (
    StandInPlatform, canonicalize_singleton_dim_strides, load_op, parse_capability)

# capture.py is a tool (run as a script too) that this worker imports when asked to capture.
TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools")
PATHS = ["vllm_op", "vllm_op_sheared", "vllm_op_splits"]
SPLIT_PATHS = ["vllm_op_splits"]


@contextlib.contextmanager
def mocked_capability(module, capability):
    """Make the op see `capability` (a DeviceCapability) as the device's."""
    saved = module.current_platform
    module.current_platform = StandInPlatform(mocked=capability)
    module._use_sheared_bias.cache_clear()
    try:
        yield
    finally:
        module.current_platform = saved
        module._use_sheared_bias.cache_clear()


# ---------------------------------------------------------------------------------------------
# What the attention layer hands the op (plain functions, testable on a CPU)
# ---------------------------------------------------------------------------------------------

def layer_max_kv_len(is_local, window_left, max_kv_len):
    """The static KV bound InklingAttention passes to the split policy: local_extent on local
    layers (window_left + 1, since window_size = (local_extent - 1, 0)), max_model_len on global
    ones (relattn passes its largest KV length)."""
    return window_left + 1 if is_local else max_kv_len


def split_policy_arguments(bucket, *, is_local, batch, max_query_len, heads, kv_heads,
                           max_kv_len, window_left):
    """Keyword arguments of inkling_fa4_num_splits exactly as InklingAttention._attention builds
    them: max_query_len is the bucketed max_seqlen_q."""
    return dict(is_local=bool(is_local), batch_size=int(batch),
                max_query_len=int(bucket(int(max_query_len))), num_heads=int(heads),
                num_kv_heads=int(kv_heads),
                max_kv_len=int(layer_max_kv_len(is_local, int(window_left), int(max_kv_len))))


def route_answer(module, cc, shape):
    """The op's routing under capability `cc`, on relattn's path ids (protocol's route answer)."""
    capability = parse_capability(cc)
    need = ("is_local", "batch", "max_query_len", "heads", "kv_heads", "max_kv_len")
    missing = [k for k in need if k not in shape]
    if missing:
        raise ValueError(f"route shape lacks {missing}")
    bucket = getattr(module, "bucket_max_seqlen_q", bucket_max_seqlen_q)
    window_left = int(shape.get("window_left", -1))
    kwargs = split_policy_arguments(bucket, window_left=window_left, batch=shape["batch"],
                                    is_local=shape["is_local"], max_query_len=shape["max_query_len"],
                                    heads=shape["heads"], kv_heads=shape["kv_heads"],
                                    max_kv_len=shape["max_kv_len"])
    with mocked_capability(module, capability):
        try:
            sheared = bool(module._use_sheared_bias())
            num_splits = int(module.inkling_fa4_num_splits(**kwargs))
        except Exception as e:  # the op refused this capability
            return {"path": None, "rejected": True, "reason": f"{type(e).__name__}: {e}",
                    "num_splits": None}
    return {"path": "sheared_bias" if sheared else "score_mod", "rejected": False,
            "reason": None, "num_splits": num_splits}


def kernel_arguments(case, bucket=bucket_max_seqlen_q):
    """The scalar arguments InklingAttention._attention passes to the op for this case, plus the
    split policy's arguments and the number of real rows (cu_seqlens_q[B])."""
    return {
        "rows": case.real_rows,
        "max_seqlen_q": int(bucket(case.max_query_len)),
        "softmax_scale": float(case.softmax_scale),
        "causal": True,
        "window_size": (case.window_left, 0) if case.is_local else (-1, -1),
        "rel_extent": case.rel_extent,
        "policy": split_policy_arguments(bucket, is_local=case.is_local, batch=case.B,
                                         max_query_len=case.max_query_len, heads=case.H,
                                         kv_heads=case.Hkv, max_kv_len=case.max_kv_len,
                                         window_left=case.window_left),
    }


# ---------------------------------------------------------------------------------------------
# The GPU half
# ---------------------------------------------------------------------------------------------

TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16"}


def torch_inputs(torch, case, device):
    """The op's tensors for `case` on `device`: dict of q and rel_logits (the real rows, as the
    case's row layout hands them: `torch_common.row_inputs`), kv buffer, key_cache,
    value_cache (views of it), block_table, seqused_k, cu_seqlens_q."""
    dtype = getattr(torch, TORCH_DTYPES[case.dtype])
    as_int = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device)
    buf, key_cache, value_cache = torch_common.paged_cache(
        torch, lambda: torch_common.case_tensor(torch, case, "key_cache", device, dtype),
        lambda: torch_common.case_tensor(torch, case, "value_cache", device, dtype),
        torch_common.VLLM_LAYOUT)
    # As vLLM's _split_kv_cache hands them to the op.
    key_cache, value_cache = (canonicalize_singleton_dim_strides(x)
                              for x in torch_common.kv_views(buf, torch_common.VLLM_LAYOUT, case.D))
    q, rel_logits = torch_common.row_inputs(torch, case, device, dtype)
    return {"q": q, "rel_logits": rel_logits, "kv_buffer": buf,
            "key_cache": key_cache, "value_cache": value_cache,
            "block_table": as_int(torch_common.serving_block_table(case)),
            "seqused_k": as_int(case.seqused_k),
            "cu_seqlens_q": as_int(case.cu_seqlens_q)}


def call_op(module, inputs, args, num_splits, out):
    """One call of the op as InklingAttention._attention makes it (q, rel_logits and `out` hold
    the real rows, laid out as the case's row layout says)."""
    module.InklingFA4RelAttentionKernel.kernel(
        inputs["q"], inputs["key_cache"], inputs["value_cache"],
        block_table=inputs["block_table"], cache_seqlens=inputs["seqused_k"],
        cu_seqlens_q=inputs["cu_seqlens_q"], max_seqlen_q=args["max_seqlen_q"],
        softmax_scale=args["softmax_scale"], causal=args["causal"],
        window_size=args["window_size"], rel_extent=args["rel_extent"],
        rel_logits=inputs["rel_logits"], num_splits=num_splits, out=out)


class VllmWorker(Worker):
    name = "vllm"
    maps_case_files = torch_common.MAPS_CASE_FILES
    paths = PATHS
    split_paths = SPLIT_PATHS

    def __init__(self, root=None):
        self.op = load_op(root)
        self.version = (f"vllm {self.op.version or 'unknown'} ({self.op.how})" if self.op.error is None
                        else f"vllm not loaded ({self.op.error})")
        if self.op.error:
            log(f"vllm_worker: {self.op.error}")
        self.capture = self._install_capture()
        if self.capture is not None:
            self.version += f"; capturing the op's inputs to {self.capture.settings.directory}"
        self.torch, self.gpu_error = None, None
        self.kernel_errors = {}
        self._probe_gpu()
        # Not logged again: the op's error is logged above, and hello's version says it.
        self.set_unavailable(self.op.error or (self.gpu_error and f"no GPU run here: {self.gpu_error}"))

    def _install_capture(self):
        """With RELATTN_CAPTURE_DIR set, wrap the loaded op with tools/capture.py (every call
        this worker makes goes through `InklingFA4RelAttentionKernel.kernel`); None otherwise,
        or when capture cannot be installed (logged: the worker runs on without it)."""
        if self.op.error or not os.environ.get("RELATTN_CAPTURE_DIR", "").strip():
            return None
        try:
            if TOOLS not in sys.path:
                sys.path.append(TOOLS)
            import capture
            return capture.install(self.op.module, vllm_version=self.op.version)
        except Exception as e:
            log(f"vllm_worker: capture not installed: {type(e).__name__}: {e}")
            return None

    def _probe_gpu(self):
        """torch, a CUDA device and cutlass, or the reason why runs are unsupported."""
        try:
            import torch
            if not torch.cuda.is_available():
                raise RuntimeError("torch sees no CUDA device")
            self.device = torch.cuda.get_device_name(0)
            self.capability = "%d.%d" % torch.cuda.get_device_capability(0)
            import cutlass  # noqa: F401  (the CuTe DSL both entries are written in)
            self.torch = torch
        except Exception as e:
            self.gpu_error = f"{type(e).__name__}: {e}"

    def warm_up(self):
        """The device's context and both entries' imports (the CuTe DSL kernels' modules),
        ahead of the first run."""
        if self.torch is None:
            return
        self.torch.empty(1, device="cuda")
        for sheared in (False, True):
            self._entry_error(sheared)

    def route(self, cc, shape):
        if self.op.error:
            raise Unsupported(self.op.error)
        return route_answer(self.op.module, cc, shape)

    def _entry_error(self, sheared):
        """Import the entry the call will take (cute or tml-fa4); None or the import error."""
        name = "vllm.third_party.tml_fa4" if sheared else "vllm.vllm_flash_attn.cute"
        if name not in self.kernel_errors:
            try:
                importlib.import_module(name)
                self.kernel_errors[name] = None
            except Exception as e:
                self.kernel_errors[name] = f"cannot import {name}: {type(e).__name__}: {e}"
        return self.kernel_errors[name]

    @unsupported_when_unavailable
    def run(self, case, path, num_splits, timing):
        if case.dtype not in TORCH_DTYPES:
            raise Unsupported(f"vLLM's op takes bf16 or fp16 inputs, not {case.dtype}")
        torch, module = self.torch, self.op.module
        args = kernel_arguments(case, getattr(module, "bucket_max_seqlen_q", bucket_max_seqlen_q))
        force_sheared = path == "vllm_op_sheared"
        error = self._entry_error(force_sheared or bool(module._use_sheared_bias()))
        if error:
            raise Unsupported(error)
        # The split count: forced by the trial, else vLLM's policy on this device.
        splits = num_splits if num_splits is not None else int(module.inkling_fa4_num_splits(**args["policy"]))
        with self._sheared_entry(module, force_sheared):
            out, ms = self._run_on_gpu(torch, module, case, args, splits, timing)
        return out, splits, ms

    @contextlib.contextmanager
    def _sheared_entry(self, module, force):
        """With `force`, the op takes its tml-fa4 entry whatever the device; else its own choice."""
        if not force:
            yield
            return
        saved = module._use_sheared_bias
        module._use_sheared_bias = lambda: True
        try:
            yield
        finally:
            module._use_sheared_bias = saved

    def _run_on_gpu(self, torch, module, case, args, splits, timing):
        device = torch.device("cuda", 0)
        inputs = torch_inputs(torch, case, device)
        out, read = torch_common.row_out(torch, case, device, inputs["q"].dtype)
        call_op(module, inputs, args, splits, out)
        torch.cuda.synchronize()
        result = read()
        ms = None
        if timing is not None:
            # Rotate a few input sets so that timed calls do not all hit warm caches.
            copies = max(1, min(3, (1 << 28) // max(1, inputs["kv_buffer"].numel() * 2)))
            sets = [inputs] + [torch_inputs(torch, case, device) for _ in range(copies - 1)]
            outs = [torch.empty_like(out) for _ in sets]
            for i in range(timing["warmup"]):
                call_op(module, sets[i % len(sets)], args, splits, outs[i % len(sets)])
            ms = []
            for i in range(timing["reps"]):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                call_op(module, sets[i % len(sets)], args, splits, outs[i % len(sets)])
                end.record()
                end.synchronize()
                ms.append(start.elapsed_time(end))
        return result, ms


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-root", help="folder holding an unpacked wheel's vllm/ "
                        "(default: RELATTN_VLLM_ROOT, else the installed vLLM)")
    args = parser.parse_args(argv)
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    serve(VllmWorker(args.vllm_root))


if __name__ == "__main__":
    main()
