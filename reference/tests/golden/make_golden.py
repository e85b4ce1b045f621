#!/usr/bin/env python3
"""Golden cases for relattn-reference, from an independent NumPy implementation of docs/operator.md section 1.

Each case is one safetensors file in the case-file format (format_version 1): tensors q,
key_cache, value_cache ([num_blocks, page, Hkv, D], contiguous), rel_logits, block_table,
seqused_k, cu_seqlens_q, plus the expected results `expected_out` (F64 [T, H, D], padding rows 0)
and `expected_lse` (F64 [T, H], natural log, padding rows 0).

Slots no query may read (unused pages, slots past Lk, slots before a window) and padding rows
hold NaN, so a reader that touches them cannot match.

Usage:  python3 make_golden.py [OUT_DIR]      (default: the folder of this script)
Needs:  numpy. numpy has no bfloat16, so the files are written directly: an 8-byte
little-endian header length, a JSON header, then the raw little-endian tensor bytes.
"""

import json
import math
import pathlib
import struct
import sys

import numpy as np


def to_bf16(x):
    """Round float32 values to the nearest bfloat16 (ties to even); returned as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).reshape(np.shape(x))


def rms_one(rng, shape):
    """Standard normal vectors rescaled to RMS 1 along the last axis (L2 norm sqrt(D))."""
    x = rng.standard_normal(shape)
    return x * (math.sqrt(shape[-1]) / np.linalg.norm(x, axis=-1, keepdims=True))


def attention(q, key_cache, value_cache, rel_logits, block_table, seqused_k, cu_seqlens_q,
              scale, rel_extent, window_left):
    """docs/operator.md section 1 in f64, one (row, head) at a time, reading only visible keys."""
    n_rows, heads, dim = q.shape
    page, kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = heads // kv_heads
    out = np.zeros((n_rows, heads, dim))
    lse = np.zeros((n_rows, heads))
    for b, kv_len in enumerate(seqused_k):
        q_start, q_end = cu_seqlens_q[b], cu_seqlens_q[b + 1]
        prefix = kv_len - (q_end - q_start)
        for t in range(q_start, q_end):
            dist = (prefix + t - q_start) - np.arange(kv_len)
            visible = dist >= 0
            if window_left >= 0:
                visible &= dist <= window_left
            keys = np.nonzero(visible)[0]
            dist = dist[visible]
            blocks = block_table[b, keys // page]
            slots = keys % page
            for h in range(heads):
                k = key_cache[blocks, slots, h // group, :].astype(np.float64)
                v = value_cache[blocks, slots, h // group, :].astype(np.float64)
                in_range = dist < rel_extent
                bias = np.zeros(len(keys))
                bias[in_range] = rel_logits[t, h, dist[in_range]]
                s = scale * (k @ q[t, h].astype(np.float64)) + bias
                top = s.max()
                w = np.exp(s - top)
                out[t, h] = (w @ v) / w.sum()
                lse[t, h] = top + math.log(w.sum())
    return out, lse


def make_case(case_id, seed, dtype, heads, kv_heads, dim, extent, window_left, page, requests,
              padding):
    rng = np.random.default_rng(seed)
    store = to_bf16 if dtype == "BF16" else (lambda a: np.asarray(a, dtype=np.float32))
    batch = len(requests)
    cu = np.zeros(batch + 1, dtype=np.int32)
    cu[1:] = np.cumsum([lq for lq, _ in requests])
    real = int(cu[-1])
    n_rows = real + padding

    q = np.full((n_rows, heads, dim), np.nan, dtype=np.float32)
    q[:real] = store(rms_one(rng, (real, heads, dim)))
    rel = np.full((n_rows, heads, extent), np.nan, dtype=np.float32)
    rel[:real] = store(rng.standard_normal((real, heads, extent)))

    # Shuffled physical pages; two spare blocks, the last of which fills the table's slack.
    needed = [-(-lk // page) for _, lk in requests]
    num_blocks = sum(needed) + 2
    ids = rng.permutation(num_blocks).astype(np.int32)
    table = np.full((batch, max(needed) + 1), ids[-1], dtype=np.int32)
    key_cache = np.full((num_blocks, page, kv_heads, dim), np.nan, dtype=np.float32)
    value_cache = np.full_like(key_cache, np.nan)
    used = 0
    for b, (lq, lk) in enumerate(requests):
        table[b, : needed[b]] = ids[used: used + needed[b]]
        used += needed[b]
        if lq == 0:
            continue  # a no-op request reads nothing: its pages stay NaN
        first = 0 if window_left < 0 else max(0, lk - lq - window_left)
        for j in range(first, lk):
            block, slot = table[b, j // page], j % page
            key_cache[block, slot] = store(rms_one(rng, (kv_heads, dim)))
            value_cache[block, slot] = store(rng.standard_normal((kv_heads, dim)))

    seqused = np.array([lk for _, lk in requests], dtype=np.int32)
    scale = 1.0 / dim
    out, lse = attention(q, key_cache, value_cache, rel, table, seqused, cu, scale, extent,
                         window_left)
    tensors = {
        "q": (dtype, q),
        "key_cache": (dtype, key_cache),
        "value_cache": (dtype, value_cache),
        "rel_logits": (dtype, rel),
        "block_table": ("I32", table),
        "seqused_k": ("I32", seqused),
        "cu_seqlens_q": ("I32", cu),
        "expected_out": ("F64", out),
        "expected_lse": ("F64", lse),
    }
    metadata = {
        "format_version": "1",
        "softmax_scale": repr(scale),
        "rel_extent": str(extent),
        "window_left": str(window_left),
        "causal": "true",
        "case_id": case_id,
        "seed": str(seed),
        "cache_layout": "contiguous",
    }
    return tensors, metadata


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, (dtype, array) in tensors.items():
        if dtype == "BF16":
            bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
            raw = (bits >> 16).astype("<u2").tobytes()
        else:
            raw = np.ascontiguousarray(array, dtype={"F32": "<f4", "F64": "<f8", "I32": "<i4"}[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# (case_id, seed, dtype, H, Hkv, D, E, window_left, page, [(Lq, Lk)], padding rows)
CASES = [
    # GQA, global with keys past E (zero bias), chunked prefill, zero-length request in the middle.
    ("gqa_global_chunked", 101, "BF16", 4, 2, 16, 8, -1, 4, [(3, 10), (0, 5), (4, 4), (2, 21)], 2),
    # Local layer (window_left = E - 1), windows starting mid-page, a decode row.
    ("local_window", 102, "BF16", 2, 1, 8, 6, 5, 4, [(5, 20), (1, 13), (0, 7), (3, 3)], 1),
    # Decode rows next to a prefill, an empty request (Lq = Lk = 0), G = 4.
    ("decode_mixed", 103, "BF16", 8, 2, 32, 16, -1, 8, [(1, 40), (1, 3), (0, 0), (6, 30)], 3),
    # fp32 storage, keys spanning several 128- and 256-key tiles.
    ("long_fp32", 104, "F32", 2, 1, 8, 64, -1, 16, [(4, 300), (2, 2)], 1),
    # Local window crossing key index 256, G = 3.
    ("local_across_tiles", 105, "BF16", 3, 1, 8, 40, 39, 16, [(30, 290)], 1),
]


def main():
    out_dir = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).parent
    for case in CASES:
        tensors, metadata = make_case(*case)
        path = out_dir / f"{case[0]}.safetensors"
        write_safetensors(path, tensors, metadata)
        print(f"{path}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
