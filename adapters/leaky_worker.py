#!/usr/bin/env python3
"""relattn worker for tests only: the operator as a kernel that leaks NaN (protocol v1).

Name `leaky`, path `leaky`. Like the flash kernels that fail docs/operator.md section 5's
class 7, it walks every key of a request from key 0, masks the keys a query must not see by a
zero weight, and multiplies that zero weight by the value anyway: NaN in a slot no row may read
(an unused or pre-window page) turns 0 * NaN into NaN in the output. With finite values there, its output is
right. The tests use it as a kernel living with a known bug.

  RELATTN_LEAKY_WINDOW_SHORT=1   also plant a second defect: local windows one key short (a
                                 query sees keys d <= window_left - 1), wrong with or without NaN

    relattn run --impl leaky ...
"""

import os

import numpy as np

from relattn_worker import Worker, attention_numpy, cpu_timed, serve


def attention_leaky(case, window_short=False):
    """[T, H, D] float32, NaN in the padding rows, from every key 0..Lk of each request."""
    window = case.window_left - (1 if window_short and case.window_left > 0 else 0)
    with np.errstate(invalid="ignore", over="ignore"):
        return attention_numpy(case, "f32", window_left=window, from_key_0=True)


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
