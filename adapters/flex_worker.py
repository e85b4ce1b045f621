#!/usr/bin/env python3
"""relattn worker: PyTorch FlexAttention with the relative bias as a score_mod and the causal
and window masks as a block mask (protocol v1, PROTOCOL.md).

Name `flex`, path `flex`. FlexAttention has no paged-KV input, so each run first gathers the
keys some query can see out of the paged cache (placed as vLLM places it: one HND buffer
[num_blocks, Hkv, page, 2D], K and V its strided views), request after request, into one
packed K and V [1, Hkv, N, D]; only keys [max(0, P - window_left), Lk) of each request on local
layers. The queries q[:R] (R = cu_seqlens_q[B]) are packed the same way, [1, H, R, D], so one
flex_attention call with batch 1 serves the whole varlen batch:

    flex_attention(q, k, v, score_mod=rel_bias, block_mask=mask, scale=softmax_scale,
                   enable_gqa=True)                          # query head h reads KV head h / G

with, for packed query row t and packed key n, request ids req_q[t], req_k[n] and absolute
positions pos_q[t] = P_b + i, pos_k[n] = j, d = pos_q[t] - pos_k[n]:

    mask_mod:  req_q[t] == req_k[n] and d >= 0 (and d <= window_left on local layers)
    score_mod: score + (rel_logits[t, h, clamp(d, 0, E - 1)] if 0 <= d < E else 0)

The block mask is built directly from each row's visible key range (a contiguous range of
packed keys), not by evaluating the mask densely: which 128 x 128 blocks some pair of is visible
(partial: mask_mod applies) and which are visible for every pair (full: mask_mod skipped).

On a CUDA device flex_attention runs compiled (torch.compile, Triton kernels); on the CPU it runs
eagerly (an unfused implementation, for tests on small cases). Without torch, or with a torch
that has no FlexAttention, the worker still answers hello, and every run answers "unsupported"
with the reason.

    relattn run --impl flex ...                         # relattn starts this file
    python3 adapters/flex_worker.py [--device auto|cpu|cuda:0] [--compile auto|on|off]
                                    [--layout vllm|case]
"""

import argparse

import numpy as np

import torch_common
from relattn_worker import (
    Unsupported, Worker, cpu_timed, serve, unsupported_when_unavailable)

PATH = "flex"
WORKER_VERSION = "1.0"
# Side of the block mask's blocks (query rows x keys): FlexAttention's default sparse block size.
BLOCK = 128
# Every case is a new shape and a new score_mod closure: let dynamo recompile that often.
RECOMPILE_LIMIT = 4096


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto",
                        help="torch device: auto (cuda when available, else cpu), cpu, cuda, cuda:N")
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                        help="torch.compile flex_attention (auto: on CUDA only)")
    parser.add_argument("--layout", choices=("vllm", "case"), default="vllm",
                        help="place the caches as vLLM does (HND buffer, default) or as the "
                             "case's cache_layout says")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# The packed layout and the block mask (numpy, no torch)
# ---------------------------------------------------------------------------------------------

class Packing:
    """Where each packed query row and packed key comes from (host arrays, int64).

    Rows: the real rows t < R in order. Keys: per request with Lq > 0, keys first_b .. Lk - 1
    (first_b = max(0, P - window_left) on local layers, else 0), requests in order.
    req_q, pos_q, lo, hi: [R]; req_k, pos_k, block, slot: [N]. lo and hi are the packed indices
    of the first and last key row t can see (inclusive).
    """

    def __init__(self, case):
        cu = case.cu_seqlens_q.astype(np.int64)
        window = case.window_left
        req_q, pos_q, lo, hi = [], [], [], []
        req_k, pos_k, block, slot = [], [], [], []
        offset = 0                                   # packed index of the request's first key
        for b in range(case.B):
            lq, lk = int(cu[b + 1] - cu[b]), int(case.seqused_k[b])
            if lq == 0:
                continue
            prefix = lk - lq
            first = max(0, prefix - window) if window >= 0 else 0
            keys = np.arange(first, lk, dtype=np.int64)
            pos = prefix + np.arange(lq, dtype=np.int64)
            req_q.append(np.full(lq, b, np.int64))
            pos_q.append(pos)
            left = np.maximum(pos - window, 0) if window >= 0 else np.zeros(lq, np.int64)
            lo.append(offset + left - first)
            hi.append(offset + pos - first)
            req_k.append(np.full(len(keys), b, np.int64))
            pos_k.append(keys)
            block.append(case.block_table[b, keys // case.page_size].astype(np.int64))
            slot.append(keys % case.page_size)
            offset += len(keys)

        def cat(parts):
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)

        self.req_q, self.pos_q, self.lo, self.hi = cat(req_q), cat(pos_q), cat(lo), cat(hi)
        self.req_k, self.pos_k, self.block, self.slot = cat(req_k), cat(pos_k), cat(block), cat(slot)
        self.rows, self.keys = len(self.req_q), len(self.req_k)


def block_mask_arrays(lo, hi, keys, block=BLOCK):
    """The block mask of rows whose visible keys are [lo[t], hi[t]] (each row sees at least one).

    Returns (kv_num_blocks [nq], kv_indices [nq, nk], full_kv_num_blocks, full_kv_indices) int32,
    in FlexAttention's BlockMask.from_kv_blocks form: per query block the count and then the
    ascending indices of its partial key blocks (some pair visible, mask_mod applies), and of its
    full ones (every pair visible). A block cut by the end of the rows or of the keys is never
    full, as in create_block_mask. Key blocks between the ranges of two requests sharing a query
    block may be listed as partial with no visible pair: extra work, masked by mask_mod, never a
    wrong result.
    """
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    nk = -(-keys // block)
    starts = np.arange(0, len(lo), block)
    lo_min, lo_max = np.minimum.reduceat(lo, starts), np.maximum.reduceat(lo, starts)
    hi_min, hi_max = np.minimum.reduceat(hi, starts), np.maximum.reduceat(hi, starts)
    first, last = lo_min // block, hi_max // block                  # touched: [first, last]
    full_first = -(-lo_max // block)                                 # full: [full_first, full_end)
    full_end = np.minimum((hi_min + 1) // block, keys // block)
    # Blocks cut by the end of the rows or of the keys are never full (as create_block_mask).
    cut = np.diff(np.append(starts, len(lo))) < block
    full_end = np.where(cut, 0, full_end)
    kb = np.arange(nk)[None, :]
    touched = (kb >= first[:, None]) & (kb <= last[:, None])
    full = touched & (kb >= full_first[:, None]) & (kb < full_end[:, None])
    partial = touched & ~full

    def ordered(mask):
        # Stable sort of "not in the set" puts the set's indices first, ascending.
        return (mask.sum(axis=1).astype(np.int32),
                np.argsort(~mask, axis=1, kind="stable").astype(np.int32))

    return ordered(partial) + ordered(full)


# ---------------------------------------------------------------------------------------------
# The torch side
# ---------------------------------------------------------------------------------------------

def gather_kv(key_cache, value_cache, block, slot):
    """K, V [1, Hkv, N, D] contiguous: packed key n is cache[block[n], slot[n]] of the logical
    [num_blocks, page, Hkv, D] views (strided views of the paged buffer are fine)."""
    # Heads first, then one advanced-index gather over (block, slot): [Hkv, N, D].
    k = key_cache.permute(2, 0, 1, 3)[:, block, slot]
    v = value_cache.permute(2, 0, 1, 3)[:, block, slot]
    return k.unsqueeze(0), v.unsqueeze(0)


class FlexInputs:
    """The per-case device tensors of one flex call: packing, block mask, score_mod, mask_mod."""

    def __init__(self, torch, case, packing, device):
        from torch.nn.attention.flex_attention import BlockMask

        def tensor(array, dtype=torch.int64):
            return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=dtype)

        self.rows, self.keys = packing.rows, packing.keys
        self.block, self.slot = tensor(packing.block), tensor(packing.slot)
        req_q, pos_q = tensor(packing.req_q), tensor(packing.pos_q)
        req_k, pos_k = tensor(packing.req_k), tensor(packing.pos_k)
        extent, window = case.E, case.window_left

        if window >= 0:
            def mask_mod(b, h, t, n):
                d = pos_q[t] - pos_k[n]
                return (req_q[t] == req_k[n]) & (d >= 0) & (d <= window)
        else:
            def mask_mod(b, h, t, n):
                return (req_q[t] == req_k[n]) & (pos_q[t] >= pos_k[n])
        self.mask_mod = mask_mod
        self.req_q, self.pos_q, self.req_k, self.pos_k = req_q, pos_q, req_k, pos_k
        self.extent = extent

        counts, index, full_counts, full_index = block_mask_arrays(packing.lo, packing.hi, packing.keys)
        self.block_mask = BlockMask.from_kv_blocks(
            tensor(counts, torch.int32)[None, None], tensor(index, torch.int32)[None, None],
            tensor(full_counts, torch.int32)[None, None], tensor(full_index, torch.int32)[None, None],
            BLOCK_SIZE=(BLOCK, BLOCK), mask_mod=mask_mod, seq_lengths=(packing.rows, packing.keys))

    def score_mod_for(self, torch, rel_logits):
        """score_mod adding rel_logits[t, h, d] for 0 <= d < E, else exactly 0; `rel_logits`
        holds the R real rows only (FlexAttention bounds t to the query length)."""
        pos_q, pos_k, extent = self.pos_q, self.pos_k, self.extent

        def rel_bias(score, b, h, t, n):
            d = pos_q[t] - pos_k[n]
            bias = rel_logits[t, h, torch.clamp(d, 0, extent - 1)]
            return score + torch.where((d >= 0) & (d < extent), bias, 0.0).to(score.dtype)
        return rel_bias


def flex_call(flex, torch, dc, inputs, case):
    """Gather the keys out of DeviceCase `dc`'s cache and run flex_attention: [R, H, D]."""
    q = dc.q.transpose(0, 1).unsqueeze(0)                              # [1, H, R, D]
    k, v = gather_kv(dc.key_cache, dc.value_cache, inputs.block, inputs.slot)
    score_mod = inputs.score_mod_for(torch, dc.rel_logits)
    out = flex(q, k, v, score_mod=score_mod, block_mask=inputs.block_mask,
               scale=case.softmax_scale, enable_gqa=True)
    return out[0].transpose(0, 1)


class FlexWorker(Worker):
    name = "flex"
    maps_case_files = torch_common.MAPS_CASE_FILES
    paths = [PATH]

    def __init__(self, device="auto", compile="auto", layout="vllm"):
        self.layout = layout
        self.torch, self.flex = None, None
        torch, why = torch_common.load_torch()
        versions = []
        if torch is not None:
            versions.append(f"torch {torch.__version__}")
            if device == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            self.device_name = device
            on_cuda = torch.device(device).type == "cuda"
            if on_cuda:
                self.device, self.capability = torch_common.cuda_device_info(torch, device)
                if self.device is None:
                    why = f"no usable CUDA device ({device}) for torch {torch.__version__}"
            if not why:
                try:
                    from torch.nn.attention.flex_attention import flex_attention
                except Exception as e:
                    why = f"torch {torch.__version__} has no FlexAttention: {type(e).__name__}: {e}"
                else:
                    self.torch = torch
                    use_compile = compile == "on" or (compile == "auto" and on_cuda)
                    self.flex = compiled(torch, flex_attention) if use_compile else flex_attention
                    versions.append(f"{'compiled' if use_compile else 'eager'} on {device}")
        self.set_unavailable(why, "flex worker")
        self.version = f"{WORKER_VERSION} ({', '.join(versions) or why})"

    @unsupported_when_unavailable
    def run(self, case, path, num_splits, timing):
        if num_splits is not None and num_splits != 1:
            raise Unsupported(f"FlexAttention has no split-KV (num_splits {num_splits} asked)")
        torch, device = self.torch, self.device_name
        on_cuda = torch.device(device).type == "cuda"
        layout = torch_common.VLLM_LAYOUT if self.layout == "vllm" else case.cache_layout
        out = torch_common.nan_out(torch, case, device)
        packing = Packing(case)
        if packing.rows == 0:
            return torch_common.out_to_numpy(out), 1, None
        sets = [torch_common.DeviceCase(torch, case, device, layout)]
        inputs = FlexInputs(torch, case, packing, device)

        def call(s):
            return flex_call(self.flex, torch, sets[s], inputs, case)

        # The first call (which compiles, on CUDA) gives the output; timed calls come after it.
        with torch.no_grad():
            result = call(0)
            out[:packing.rows].copy_(result)
            ms = None
            if timing is not None and on_cuda:
                count = torch_common.input_sets(torch, sets[0].nbytes(), device)
                sets += [torch_common.DeviceCase(torch, case, device, layout) for _ in range(count - 1)]
                _, ms = torch_common.cuda_timed(torch, call, len(sets), timing["warmup"], timing["reps"])
            elif timing is not None:
                _, ms = cpu_timed(lambda: call(0), timing)
        if on_cuda:
            torch.cuda.synchronize()
        return torch_common.out_to_numpy(out), 1, ms


def compiled(torch, flex_attention):
    """torch.compile(flex_attention), allowed to recompile for every case."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    return torch.compile(flex_attention)


def main(argv=None):
    args = parse_args(argv)
    serve(FlexWorker(device=args.device, compile=args.compile, layout=args.layout))


if __name__ == "__main__":
    main()
