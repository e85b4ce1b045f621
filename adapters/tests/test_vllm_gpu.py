"""vllm_worker.py on a GPU: vLLM's op through the worker, against the numpy reference.

Skipped with the reason unless torch sees a CUDA device, cutlass imports and the op loads
(RELATTN_VLLM_ROOT = fetch_vllm.sh DEST --kernels, or an installed vLLM). Each new kernel
variant compiles for 5 to 30 s the first time."""

import os
import unittest

import numpy as np

from relattn_worker import attention_numpy
from tests.casegen import random_case


def _worker_or_reason():
    try:
        import torch
        if not torch.cuda.is_available():
            return None, "no CUDA device"
    except Exception as e:
        return None, f"torch does not import ({type(e).__name__})"
    import vllm_worker
    worker = vllm_worker.VllmWorker(os.environ.get("RELATTN_VLLM_ROOT"))
    if worker.op.error or worker.gpu_error:
        return None, worker.op.error or worker.gpu_error
    return worker, None


WORKER, REASON = _worker_or_reason() if os.environ.get("RELATTN_GPU_TESTS") else (None, "set RELATTN_GPU_TESTS=1 on a GPU machine")


def global_case(seed=41):
    return random_case(seed=seed, query_lens=(1, 9, 37), kv_lens=(700, 1500, 37), heads=8,
                       kv_heads=1, head_dim=128, extent=1024, page=16, pad_rows=5)


def local_case(seed=42):
    # Finite garbage: vLLM 0.33.0's op turns NaN in the V slots left of the window into NaN
    # outputs (masked P = 0 times V = NaN; seen on an H200). That is a finding about the
    # kernel for relattn's judge (docs/operator.md section 5, class 7), not about this worker, so this test, which
    # checks the worker's call, keeps the garbage finite.
    return random_case(seed=seed, query_lens=(1, 70), kv_lens=(1200, 600), heads=8, kv_heads=2,
                       head_dim=128, extent=512, window_left=511, page=16, pad_rows=3,
                       garbage="finite")


@unittest.skipIf(WORKER is None, REASON)
class VllmOnGpu(unittest.TestCase):
    def check(self, case, path, num_splits=None):
        out, used, ms = WORKER.run(case, path, num_splits, {"warmup": 1, "reps": 2})
        real = case.real_rows
        self.assertEqual(out.shape, case.q.shape)
        self.assertTrue(np.isfinite(out[:real]).all(), "a real row is not finite")
        self.assertTrue(np.isnan(out[real:]).all(), "a padding row was written")
        ref = attention_numpy(case, "f64")[:real]
        err = np.abs(out[:real] - ref)
        self.assertTrue((err <= 2e-2 + 2e-2 * np.abs(ref)).all(), f"max abs error {err.max():.3g}")
        self.assertEqual(len(ms), 2)
        return used

    def test_global(self):
        self.check(global_case(), "vllm_op")

    def test_local(self):
        self.assertEqual(self.check(local_case(), "vllm_op"), 1)

    def test_forced_splits(self):
        self.assertEqual(self.check(global_case(), "vllm_op_splits", 1), 1)
        self.assertEqual(self.check(global_case(), "vllm_op_splits", 4), 4)


if __name__ == "__main__":
    unittest.main()
