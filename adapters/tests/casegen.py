"""Small random cases for the workers' tests: RMS-normed q and k (docs/operator.md section 1's producer facts),
shuffled pages with slack, and garbage (NaN) wherever no output may depend on it: padding rows of
q and rel_logits, cache slots past each request's keys, blocks no request uses, and block-table
entries past each request's pages; on local layers also the keys left of every window."""

import numpy as np

from relattn_worker import Case, round_to_dtype


def rms_normed(rng, shape):
    x = rng.standard_normal(shape)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True))


def random_case(seed=0, dtype="BF16", query_lens=(3, 0, 5), kv_lens=(7, 4, 21), heads=4,
                kv_heads=2, head_dim=16, extent=8, page=4, window_left=-1, pad_rows=3,
                spare_blocks=3, scale=None, garbage="nan"):
    """garbage: "nan" (the default), or "finite" for random finite values in the cache slots no
    output depends on (padding rows stay NaN)."""
    rng = np.random.default_rng(seed)
    B = len(query_lens)
    cu = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    T = int(cu[-1]) + pad_rows
    pages = [-(-lk // page) for lk in kv_lens]
    max_pages = max(pages) + 1
    num_blocks = sum(pages) + spare_blocks
    q = rms_normed(rng, (T, heads, head_dim))
    k = rms_normed(rng, (num_blocks, page, kv_heads, head_dim))
    v = rng.standard_normal((num_blocks, page, kv_heads, head_dim))
    rel = rng.standard_normal((T, heads, extent))
    q[cu[-1]:] = np.nan
    rel[cu[-1]:] = np.nan
    table = np.full((B, max_pages), 1 << 30, dtype=np.int32)   # don't-care entries
    free = list(rng.permutation(num_blocks))
    used = np.zeros((num_blocks, page), dtype=bool)
    for b, (n, lk) in enumerate(zip(pages, kv_lens)):
        # On local layers the keys left of every query's window are garbage too.
        first = max(0, lk - query_lens[b] - window_left) if window_left >= 0 else 0
        for p in range(n):
            block = free.pop()
            table[b, p] = block
            for j in range(p * page, min((p + 1) * page, lk)):
                used[block, j - p * page] = j >= first
    if garbage == "nan":
        k[~used] = np.nan
        v[~used] = np.nan
    else:
        k[~used] = 3 * rng.standard_normal(k[~used].shape)
        v[~used] = 3 * rng.standard_normal(v[~used].shape)
    case = Case(q=round_to_dtype(q, dtype), key_cache=round_to_dtype(k, dtype),
                value_cache=round_to_dtype(v, dtype), rel_logits=round_to_dtype(rel, dtype),
                block_table=table, seqused_k=np.array(kv_lens, np.int32), cu_seqlens_q=cu,
                softmax_scale=1.0 / head_dim if scale is None else scale, rel_extent=extent,
                window_left=window_left, dtype=dtype, case_id=f"test{seed}", seed=seed)
    case.validate()
    return case


def naive_attention(case):
    """docs/operator.md section 1 with plain Python loops in float64 (the tests' independent oracle)."""
    T, H, D = case.q.shape
    G = H // case.Hkv
    out = np.full((T, H, D), np.nan)
    cu = case.cu_seqlens_q
    for b in range(case.B):
        lq, lk = int(cu[b + 1] - cu[b]), int(case.seqused_k[b])
        for i in range(lq):
            t = int(cu[b]) + i
            for h in range(H):
                g = h // G
                scores, vals = [], []
                for j in range(lk):
                    d = (lk - lq + i) - j
                    if d < 0 or (case.window_left >= 0 and d > case.window_left):
                        continue
                    block = case.block_table[b, j // case.page_size]
                    key = case.key_cache[block, j % case.page_size, g].astype(np.float64)
                    s = case.softmax_scale * float(np.dot(case.q[t, h].astype(np.float64), key))
                    if d < case.rel_extent:
                        s += float(case.rel_logits[t, h, d])
                    scores.append(s)
                    vals.append(case.value_cache[block, j % case.page_size, g].astype(np.float64))
                m = max(scores)
                w = np.exp(np.array(scores) - m)
                out[t, h] = (w[:, None] * np.array(vals)).sum(axis=0) / w.sum()
    return out
