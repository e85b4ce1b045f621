"""attention_numpy against a naive loop over docs/operator.md section 1."""

import unittest

import numpy as np

from relattn_worker import attention_numpy, bucket_max_seqlen_q
from tests.casegen import naive_attention, random_case

# The output is float32 in both: f64 is exact up to that rounding.
PRECISIONS = {"f64": 2e-7, "f32": 2e-6}


class Reference(unittest.TestCase):
    def check(self, case):
        want = naive_attention(case)
        real = case.real_rows
        for precision, tol in PRECISIONS.items():
            with self.subTest(precision=precision):
                got = attention_numpy(case, precision)
                self.assertEqual(got.shape, case.q.shape)
                self.assertEqual(got.dtype, np.float32)
                self.assertTrue(np.isfinite(got[:real]).all(), "a real row is not finite")
                self.assertTrue(np.isnan(got[real:]).all(), "padding rows must stay NaN")
                np.testing.assert_allclose(got[:real], want[:real], rtol=tol, atol=tol)

    def test_global_gqa_padding_and_zero_bias_region(self):
        # H=4 over Hkv=2 (G=2), a zero-length request in the middle, 3 padding rows, keys up to
        # distance 20 with E=8: the bias is exactly 0 past E.
        self.check(random_case(seed=2))

    def test_window(self):
        # window_left=5: garbage (NaN) keys left of every window must not leak.
        self.check(random_case(seed=3, window_left=5, extent=6))

    def test_window_wider_than_extent_and_group_of_four(self):
        self.check(random_case(seed=4, heads=8, kv_heads=2, window_left=9, extent=4,
                               query_lens=(1, 6, 2), kv_lens=(13, 6, 30), page=8))

    def test_single_kv_head_decode_and_f16(self):
        self.check(random_case(seed=5, dtype="F16", heads=4, kv_heads=1,
                               query_lens=(1, 1, 1, 1), kv_lens=(1, 9, 33, 17), pad_rows=0))

    def test_row_blocking_matches(self):
        # Many rows and keys: the reference works in row blocks; the blocks must not matter.
        import relattn_worker
        case = random_case(seed=6, query_lens=(40,), kv_lens=(70,), extent=16, page=16)
        whole = attention_numpy(case, "f64")
        saved = relattn_worker._BLOCK_ELEMENTS
        relattn_worker._BLOCK_ELEMENTS = 64
        try:
            blocked = attention_numpy(case, "f64")
        finally:
            relattn_worker._BLOCK_ELEMENTS = saved
        np.testing.assert_array_equal(whole, blocked)

    def test_f32_is_close_to_f64(self):
        case = random_case(seed=7, query_lens=(5, 3), kv_lens=(40, 3), head_dim=64, extent=32, page=16)
        np.testing.assert_allclose(attention_numpy(case, "f32")[:8], attention_numpy(case, "f64")[:8],
                                   rtol=1e-5, atol=1e-5)

    def test_bad_precision(self):
        with self.assertRaises(ValueError):
            attention_numpy(random_case(), "f16")

    def test_bucket(self):
        self.assertEqual([bucket_max_seqlen_q(n) for n in (0, 1, 2, 3, 4, 5, 9, 17)],
                         [1, 1, 2, 4, 4, 8, 16, 32])


if __name__ == "__main__":
    unittest.main()
