"""Case files (format v1) and output files: round trips and clear errors."""

import json
import os
import struct
import tempfile
import unittest
from unittest import mock

import numpy as np

from relattn_worker import (bf16_bits_to_f32, f32_to_bf16_bits, read_case, read_out,
                            read_safetensors, round_to_dtype, write_case, write_out,
                            write_safetensors)
from tests.casegen import random_case


class TempDir(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)


def same_with_nan(a, b):
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


class RoundTrip(TempDir):
    def test_each_dtype_round_trips_exactly(self):
        for dtype in ("BF16", "F16", "F32"):
            with self.subTest(dtype=dtype):
                case = random_case(seed=1, dtype=dtype, window_left=5)
                write_case(self.path("c.safetensors"), case)
                back = read_case(self.path("c.safetensors"))
                self.assertEqual(back.dtype, dtype)
                for name in ("q", "key_cache", "value_cache", "rel_logits"):
                    self.assertTrue(same_with_nan(getattr(back, name), getattr(case, name)), name)
                    self.assertEqual(getattr(back, name).dtype, np.float32)
                for name in ("block_table", "seqused_k", "cu_seqlens_q"):
                    np.testing.assert_array_equal(getattr(back, name), getattr(case, name))
                    self.assertEqual(getattr(back, name).dtype, np.int32)
                self.assertEqual(back.softmax_scale, case.softmax_scale)
                self.assertEqual((back.rel_extent, back.window_left), (8, 5))
                self.assertEqual((back.case_id, back.seed, back.cache_layout), ("test1", 1, "contiguous"))
                self.assertEqual(back.row_layout, "padded")

    def test_a_mapped_file_reads_as_a_read_one_and_stays_writable(self):
        import casefile
        case = random_case(seed=3, dtype="BF16", window_left=5)
        write_case(self.path("c.safetensors"), case)
        os.chmod(self.path("c.safetensors"), 0o444)
        read = read_case(self.path("c.safetensors"))
        with mock.patch.object(casefile, "MMAP_BYTES", 1):
            mapped = read_case(self.path("c.safetensors"))
            tensors, _ = casefile.read_safetensors(self.path("c.safetensors"))
        # torch.frombuffer takes the bytes without a copy or a warning only when writable.
        self.assertFalse(memoryview(mapped.stored("key_cache").raw).readonly)
        for name in ("q", "key_cache", "value_cache", "rel_logits"):
            self.assertTrue(same_with_nan(getattr(mapped, name), getattr(read, name)), name)
        self.assertEqual(sorted(tensors), sorted(casefile.read_safetensors(self.path("c.safetensors"))[0]))
        # A change made through the buffer stays the reader's: the file is as written.
        with mock.patch.object(casefile, "MMAP_BYTES", 1):
            raw = casefile.read_safetensors(self.path("c.safetensors"))[0]["q"][2]
            raw[:2] = b"\xff\xff"
        self.assertTrue(same_with_nan(read_case(self.path("c.safetensors")).q, read.q))

    def test_row_layout_round_trips_and_is_written_only_away_from_padded(self):
        case = random_case(seed=2)
        write_case(self.path("padded.safetensors"), case)
        self.assertNotIn(b"row_layout", open(self.path("padded.safetensors"), "rb").read(4096))
        for layout in ("strided", "exact"):
            case.row_layout = layout
            write_case(self.path("c.safetensors"), case)
            self.assertEqual(read_case(self.path("c.safetensors")).row_layout, layout)

    def test_floats_are_converted_only_when_read(self):
        case = random_case(seed=5, heads=4, kv_heads=2, head_dim=8, page=4)
        write_case(self.path("c.safetensors"), case)
        back = read_case(self.path("c.safetensors"))
        # Sizes and validation come from the stored shapes; the bytes stay until a read.
        self.assertEqual((back.T, back.H, back.D, back.Hkv, back.page_size, back.E),
                         (case.T, case.H, case.D, case.Hkv, case.page_size, case.E))
        for name in ("q", "key_cache", "value_cache", "rel_logits"):
            stored = back.stored(name)
            self.assertEqual(stored.dtype, "BF16")
            self.assertEqual(stored.shape, getattr(case, name).shape)
            self.assertTrue(same_with_nan(stored.floats(), getattr(case, name)))
        self.assertTrue(same_with_nan(back.key_cache, case.key_cache))
        # Once read, the array is the tensor: a change to it is what later readers see.
        self.assertIsNone(back.stored("key_cache"))
        back.key_cache[0] = 7.0
        self.assertTrue((back.key_cache[0] == 7.0).all())
        self.assertIsNotNone(back.stored("value_cache"))

    def test_properties(self):
        case = random_case(query_lens=(3, 0, 5), kv_lens=(7, 4, 21), pad_rows=3)
        self.assertEqual((case.T, case.H, case.Hkv, case.D, case.E), (11, 4, 2, 16, 8))
        self.assertEqual((case.B, case.page_size, case.real_rows), (3, 4, 8))
        self.assertEqual((case.max_query_len, case.max_kv_len, case.is_local), (5, 21, False))
        self.assertEqual(case.num_blocks, 2 + 1 + 6 + 3)

    def test_stored_bytes_are_the_dtype(self):
        case = random_case(dtype="BF16")
        write_case(self.path("c.safetensors"), case)
        tensors, meta = read_safetensors(self.path("c.safetensors"))
        self.assertEqual(tensors["q"][0], "BF16")
        self.assertEqual(tensors["block_table"][0], "I32")
        self.assertEqual(meta["causal"], "true")
        self.assertEqual(meta["format_version"], "1")
        self.assertEqual(float(meta["softmax_scale"]), case.softmax_scale)

    def test_bf16_conversion(self):
        values = np.array([1.0, -2.5, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, np.inf, 0.0], np.float32)
        bits = f32_to_bf16_bits(values)
        # 1 + 2^-8 is a tie: rounds to even (1.0); 1 + 3 * 2^-8 rounds up to 1 + 2^-6.
        np.testing.assert_array_equal(bf16_bits_to_f32(bits), [1.0, -2.5, 1.0, 1.0 + 2 ** -6, np.inf, 0.0])
        self.assertTrue(np.isnan(bf16_bits_to_f32(f32_to_bf16_bits(np.array([np.nan], np.float32))))[0])
        self.assertEqual(round_to_dtype(np.array([1 + 2 ** -12], np.float32), "F16")[0], 1.0)

    def test_output_file(self):
        out = np.random.default_rng(0).standard_normal((5, 3, 4)).astype(np.float32)
        out[4] = np.nan
        write_out(self.path("o.safetensors"), out)
        self.assertTrue(same_with_nan(read_out(self.path("o.safetensors")), out))
        tensors, _ = read_safetensors(self.path("o.safetensors"))
        self.assertEqual(list(tensors), ["out"])
        self.assertEqual((tensors["out"][0], tensors["out"][1]), ("F32", [5, 3, 4]))
        self.assertEqual([n for n in os.listdir(self.dir)], ["o.safetensors"])  # no temp left


class BadFiles(TempDir):
    def write_header(self, header, data=b""):
        raw = json.dumps(header).encode()
        with open(self.path("bad.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw + data)
        return self.path("bad.safetensors")

    def assertBad(self, path, words):
        with self.assertRaises(ValueError) as e:
            read_case(path)
        for word in words.split("|"):
            self.assertIn(word, str(e.exception))

    def rewrite(self, case=None, drop=None, meta=None, **replace):
        """Write a valid case, then change its tensors or metadata."""
        write_case(self.path("good.safetensors"), case or random_case())
        tensors, metadata = read_safetensors(self.path("good.safetensors"))
        arrays = {}
        for name, (dtype, shape, raw) in tensors.items():
            kind = {"BF16": "<u2", "F16": "<f2", "F32": "<f4", "I32": "<i4"}[dtype]
            arrays[name] = (dtype, np.frombuffer(raw, kind).reshape(shape))
        arrays.update(replace)
        if drop:
            arrays.pop(drop)
        metadata.update(meta or {})
        metadata = {k: v for k, v in metadata.items() if v is not None}
        write_safetensors(self.path("bad.safetensors"), arrays, metadata)
        return self.path("bad.safetensors")

    def test_not_safetensors(self):
        with open(self.path("short"), "wb") as f:
            f.write(b"abc")
        self.assertBad(self.path("short"), "not a safetensors file")
        with open(self.path("long"), "wb") as f:
            f.write(struct.pack("<Q", 1 << 40) + b"{}")
        self.assertBad(self.path("long"), "header length")
        with open(self.path("json"), "wb") as f:
            f.write(struct.pack("<Q", 3) + b"{x}")
        self.assertBad(self.path("json"), "not JSON")

    def test_offsets_checked(self):
        path = self.write_header({"q": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 8)
        self.assertBad(path, "data_offsets")

    def test_missing_and_mistyped(self):
        self.assertBad(self.rewrite(drop="rel_logits"), "missing tensor `rel_logits`")
        self.assertBad(self.rewrite(seqused_k=("F32", np.zeros(3, "<f4"))), "`seqused_k`|expected I32")
        self.assertBad(self.rewrite(rel_logits=("F16", np.zeros((11, 4, 8), "<f2"))), "`rel_logits`|BF16")

    def test_metadata(self):
        self.assertBad(self.rewrite(meta={"causal": "false"}), "causal")
        self.assertBad(self.rewrite(meta={"softmax_scale": None}), "`softmax_scale` is missing")
        self.assertBad(self.rewrite(meta={"rel_extent": "x"}), "`rel_extent`|invalid")
        self.assertBad(self.rewrite(meta={"format_version": "2"}), "format_version")
        self.assertBad(self.rewrite(meta={"rel_extent": "9"}), "rel_logits")
        self.assertBad(self.rewrite(meta={"cache_layout": "weird"}), "cache_layout")
        self.assertBad(self.rewrite(meta={"row_layout": "weird"}), "row_layout")

    def test_inconsistent_sizes(self):
        self.assertBad(self.rewrite(cu_seqlens_q=("I32", np.array([0, 3, 3, 20], "<i4"))), "cu_seqlens_q")
        self.assertBad(self.rewrite(seqused_k=("I32", np.array([2, 4, 21], "<i4"))), "request 0")
        self.assertBad(self.rewrite(seqused_k=("I32", np.array([7, 4, 99], "<i4"))), "pages")
        table = np.zeros((3, 7), "<i4")
        table[0, 1] = 99
        self.assertBad(self.rewrite(block_table=("I32", table)), "block_table entries")

    def test_format_version_may_be_absent(self):
        case = read_case(self.rewrite(meta={"format_version": None}))
        self.assertEqual(case.B, 3)


if __name__ == "__main__":
    unittest.main()
