#!/usr/bin/env python3
"""relattn worker for tests only: the operator as a kernel that leaks NaN (protocol v1).

Name `leaky`, path `leaky`. Like the flash kernels that fail docs/operator.md section 5's class 7, it walks
every key of a request from key 0, masks the keys a query must not see by a zero weight, and
multiplies that zero weight by the value anyway: NaN in a slot no row may read (an unused or
pre-window page) turns 0 * NaN into NaN in the output. With finite values there, its output is
right. The tests use it as a kernel living with a known bug.

  RELATTN_LEAKY_WINDOW_SHORT=1   also plant a second defect: local windows one key short (a
                                 query sees keys d <= window_left - 1), wrong with or without NaN

    relattn run --impl leaky ...
"""

import os

import numpy as np

from relattn_worker import Worker, cpu_timed, serve


def attention_leaky(case, window_short=False):
    """[T, H, D] float32, NaN in the padding rows, from every key 0..Lk of each request."""
    T, H, D, E, Hkv = case.T, case.H, case.D, case.E, case.Hkv
    G = H // Hkv
    scale = np.float32(case.softmax_scale)
    window = case.window_left - (1 if window_short and case.window_left > 0 else 0)
    out = np.full((T, H, D), np.nan, np.float32)
    cu = case.cu_seqlens_q.astype(np.int64)
    for b in range(case.B):
        t0, t1, lk = int(cu[b]), int(cu[b + 1]), int(case.seqused_k[b])
        lq = t1 - t0
        if lq == 0:
            continue
        keys, values = case.request_keys(b, 0)
        d = (lk - lq + np.arange(lq))[:, None] - np.arange(lk)[None, :]           # [rows, keys]
        visible = (d >= 0) & ((d <= window) if window >= 0 else True)
        in_extent = (d >= 0) & (d < E)
        index = np.clip(d, 0, E - 1)
        with np.errstate(invalid="ignore", over="ignore"):
            for h in range(H):
                k, v = keys[:, h // G].astype(np.float32), values[:, h // G].astype(np.float32)
                q = case.q[t0:t1, h].astype(np.float32)
                rel = np.take_along_axis(case.rel_logits[t0:t1, h].astype(np.float32), index, axis=1)
                s = scale * (q @ k.T) + np.where(in_extent, rel, np.float32(0))
                s = np.where(visible, s, np.float32(-np.inf))
                p = np.exp(s - s.max(axis=1, keepdims=True))
                # The zero weights of invisible keys still multiply their values.
                out[t0:t1, h] = (p @ v) / p.sum(axis=1, keepdims=True)
    return out


class LeakyWorker(Worker):
    name = "leaky"
    paths = ["leaky"]
    version = f"1.0 (test-only NaN leak, numpy {np.__version__})"

    def __init__(self):
        self.window_short = os.environ.get("RELATTN_LEAKY_WINDOW_SHORT", "") not in ("", "0")

    def run(self, case, path, num_splits, timing):
        out, ms = cpu_timed(lambda: attention_leaky(case, self.window_short), timing)
        return out, 1, ms


def main():
    serve(LeakyWorker())


if __name__ == "__main__":
    main()
