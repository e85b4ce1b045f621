#!/usr/bin/env python3
"""Write a folder of relattn case files with numpy alone, independently of relattn's generator
and of the workers' own case code: the format is written here from docs/reference.md ("Case
files") and the inputs from the producer facts of docs/operator.md (RMS-1 q and k, rank-16 bias
rounded to the dtype, NaN wherever no output may depend on it).

    python3 make_case_folder.py DEST [--count N] [--size small|gpu] [--seed S]

Case i of N takes the i-th entry of each axis below, cycling, so any 20 consecutive cases cover
global and local layers (window E - 1, and a narrower one), page sizes 16 to 256 with 128 among
them, bf16 and fp16, G = 1 to 8, decodes, prefills, chunked prefills, prefill + decode mixes,
long decodes, padding rows and the three cache layouts. `--size small` (default) keeps every
case small enough for a CPU reference in well under a second; `--size gpu` uses the model's
head counts and longer contexts (long decodes of 32,768 to 131,072 keys).

File names are `NN_<what>.safetensors`; they say what a case is, relattn names it by its stem.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

# (name, rel_extent, window_left): global layers have no window, local ones E - 1 (the model's)
# or narrower.
LAYERS = [("global_e1024", 1024, -1), ("local_e512", 512, 511), ("global_e384", 384, -1),
          ("local_e512_w200", 512, 200)]
PAGES = [16, 128, 32, 64, 256, 48, 128]
DTYPES = ["BF16", "F16"]
LAYOUTS = ["nhd_packed", "hnd_packed", "contiguous"]
HEADS = {"small": [(8, 1), (8, 2), (4, 4), (16, 2), (8, 8)],
         "gpu": [(64, 8), (32, 4), (16, 2), (8, 1), (64, 16), (8, 2)]}


def mixes(size):
    """(name, [(Lq, Lk), ...], padding rows) per batch mix."""
    long = 2048 if size == "small" else 131072
    mid = 700 if size == "small" else 32768
    return [
        ("decode", [(1, 1), (1, 77), (1, 640), (1, 1500)], 0),
        ("prefill", [(37, 37), (200, 200)], 0),
        ("chunked", [(64, 700), (32, 1800)], 0),
        ("prefill_decode", [(1, 300), (1, 45), (120, 120), (1, 1030), (16, 530)], 0),
        ("long_decode", [(1, long), (1, 3)], 0),
        ("padded_decode", [(1, 129), (1, 257), (1, 1000)], 5),
        ("mixed_long", [(1, mid), (9, mid // 2 + 9), (1, 64)], 0),
        ("zero_len_middle", [(3, 50), (0, 20), (0, 0), (5, 900)], 2),
    ]


def f32_to_bf16_bits(x):
    """float32 -> bf16 bit patterns, round to nearest even; NaN kept NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    return np.where(np.isnan(x), np.uint32(0x7FC0), rounded).astype("<u2")


def stored(x, dtype):
    """The bytes of `x` as `dtype` (BF16 or F16), little-endian."""
    if dtype == "BF16":
        return f32_to_bf16_bits(x)
    return np.asarray(x, dtype=np.float32).astype("<f2")


def rounded(x, dtype):
    """`x` rounded to the dtype, back in float32 (to build values from rounded parts)."""
    raw = stored(x, dtype)
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def write_safetensors(path, tensors, metadata):
    """tensors: {name: (dtype string, numpy array in that storage type)}."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, (dtype, array) in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)


def rms_normed(rng, shape):
    x = rng.standard_normal(shape, dtype=np.float32)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True))


def make_case(rng, requests, padding, heads, kv_heads, page, extent, window_left, dtype,
              head_dim=128):
    """The case's tensors and metadata values (scale 1/D)."""
    B = len(requests)
    cu = np.zeros(B + 1, np.int32)
    cu[1:] = np.cumsum([lq for lq, _ in requests])
    T = int(cu[-1]) + padding
    pages = [-(-lk // page) for _, lk in requests]
    # Physical blocks shuffled; block 0 and two spare blocks never used by any request.
    num_blocks = 3 + sum(pages)
    order = 3 + rng.permutation(sum(pages))
    table = np.full((B, max(pages + [1]) + 1), 1 << 30, np.int32)  # past a request's pages: don't-care
    kv_shape = (num_blocks, page, kv_heads, head_dim)
    key = np.full(kv_shape, np.nan, np.float32)
    value = np.full(kv_shape, np.nan, np.float32)
    at = 0
    for b, (lq, lk) in enumerate(requests):
        first = max(0, lk - lq - window_left) if window_left >= 0 else 0  # window of query 0
        for p in range(pages[b]):
            block = int(order[at])
            at += 1
            table[b, p] = block
            lo, hi = max(first - p * page, 0), min(lk - p * page, page)
            if lo < hi:
                key[block, lo:hi] = rms_normed(rng, (hi - lo, kv_heads, head_dim))
                value[block, lo:hi] = rng.standard_normal((hi - lo, kv_heads, head_dim),
                                                          dtype=np.float32)
    q = np.full((T, heads, head_dim), np.nan, np.float32)
    q[:cu[-1]] = rms_normed(rng, (int(cu[-1]), heads, head_dim))
    # The model's producer: rank 16, rounded to the dtype.
    r = rng.standard_normal((T, heads, 16), dtype=np.float32)
    proj = rng.standard_normal((16, extent), dtype=np.float32) / 4
    rel = np.full((T, heads, extent), np.nan, np.float32)
    rel[:cu[-1]] = (r[:cu[-1]] @ proj)
    return {
        "q": q, "key_cache": key, "value_cache": value, "rel_logits": rel,
        "block_table": table, "seqused_k": np.array([lk for _, lk in requests], np.int32),
        "cu_seqlens_q": cu,
    }


def write_case(path, arrays, dtype, extent, window_left, layout, seed, head_dim=128):
    tensors = {name: (dtype, stored(arrays[name], dtype))
               for name in ("q", "key_cache", "value_cache", "rel_logits")}
    tensors.update({name: ("I32", arrays[name].astype("<i4"))
                    for name in ("block_table", "seqused_k", "cu_seqlens_q")})
    metadata = {"format_version": "1", "softmax_scale": repr(1.0 / head_dim),
                "rel_extent": str(extent), "window_left": str(window_left), "causal": "true",
                "cache_layout": layout, "seed": str(seed)}
    write_safetensors(path, tensors, metadata)


def write_folder(dest, count=20, size="small", seed=0):
    """Write `count` cases into `dest`; returns their paths."""
    os.makedirs(dest, exist_ok=True)
    paths = []
    all_mixes = mixes(size)
    heads = HEADS[size]
    for i in range(count):
        layer, extent, window_left = LAYERS[i % len(LAYERS)]
        page = PAGES[i % len(PAGES)]
        dtype = DTYPES[i % len(DTYPES)]
        layout = LAYOUTS[i % len(LAYOUTS)]
        h, hkv = heads[i % len(heads)]
        mix, requests, padding = all_mixes[i % len(all_mixes)]
        rng = np.random.default_rng([seed, i])
        arrays = make_case(rng, requests, padding, h, hkv, page, extent, window_left, dtype)
        name = f"{i:02d}_{mix}_{layer}_h{h}kv{hkv}_page{page}_{dtype.lower()}.safetensors"
        path = os.path.join(dest, name)
        write_case(path, arrays, dtype, extent, window_left, layout, seed * 1000 + i)
        paths.append(path)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest")
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--size", choices=("small", "gpu"), default="small")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    paths = write_folder(args.dest, args.count, args.size, args.seed)
    print(f"make_case_folder.py: {len(paths)} case files in {args.dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
