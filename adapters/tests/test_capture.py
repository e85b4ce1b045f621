"""capture.py without torch or a GPU: the pages it keeps and how it renumbers them, the
selection rules, the bounds, the settings, the layout it records, that the wrapped op's result
and exceptions pass through untouched, and that a captured file is the same case (the numpy
operator gives the same output on it). With RELATTN_VLLM_ROOT, it also installs on vLLM's op
and through the vllm worker."""

import contextlib
import io
import os
import unittest

import numpy as np

import capture
from relattn_worker import attention_numpy, read_case, read_safetensors, write_out
from tests.capture_numpy import call_op, numpy_op, op_arguments
from tests.casegen import random_case
from tests.test_casefile import TempDir

ROOT = os.environ.get("RELATTN_VLLM_ROOT")
NO_ROOT = ("RELATTN_VLLM_ROOT is not set (adapters/tools/fetch_vllm.sh DEST, then "
           "RELATTN_VLLM_ROOT=DEST)")


def settings(directory, **kw):
    kw.setdefault("nonfinite", False)
    kw.setdefault("first", 0)
    return capture.Settings(directory, **kw)


class PlanBlocks(unittest.TestCase):
    def test_pages_read_are_kept_and_renumbered_in_block_order(self):
        table = np.array([[9, 4, 7, 100], [4, 2, 50, 60], [3, 3, 3, 3]])
        # request 0: Lk 9 over pages of 4 -> 3 pages; request 1: Lk 5 -> 2 pages;
        # request 2: no queries (a no-op: nothing read).
        used, new = capture.plan_blocks(table, [9, 5, 6], [0, 2, 3, 3], 4, -1)
        self.assertEqual(used.tolist(), [2, 4, 7, 9])
        self.assertEqual(new.tolist(), [[4, 2, 3, 0], [2, 1, 0, 0], [0, 0, 0, 0]])

    def test_pages_before_a_window_are_dont_care(self):
        # Lk 20, Lq 2, window 5: query 0 (position 18) sees keys 13..18: pages 3 and 4 of 4.
        used, new = capture.plan_blocks([[10, 11, 12, 13, 14]], [20], [0, 2], 4, 5)
        self.assertEqual(used.tolist(), [13, 14])
        self.assertEqual(new.tolist(), [[0, 0, 0, 1, 2]])

    def test_shared_and_aliased_blocks_stay_shared(self):
        used, new = capture.plan_blocks([[0, 0], [0, 5]], [8, 8], [0, 1, 2], 4, -1)
        self.assertEqual(used.tolist(), [0, 5])
        self.assertEqual(new.tolist(), [[1, 1], [1, 2]])


class Selection(unittest.TestCase):
    def test_every_nth_and_first_per_shape(self):
        s = capture.Selector(settings("/nonexistent", every=3, first=2))
        got = [s.next_call(shape) for shape in "aaaaba"]
        self.assertEqual(got, [(1, ["first_per_shape"]), (2, ["first_per_shape"]), (3, ["every_nth"]),
                               (4, []), (5, ["first_per_shape"]), (6, ["every_nth"])])

    def test_settings_from_the_environment(self):
        self.assertIsNone(capture.Settings.from_env({}))
        s = capture.Settings.from_env({"RELATTN_CAPTURE_DIR": "d"})
        self.assertEqual((s.every, s.first, s.nonfinite, s.max_files, s.max_bytes, s.keep_output),
                         (0, 1, True, 100, 4 << 30, True))
        s = capture.Settings.from_env({"RELATTN_CAPTURE_DIR": "d", "RELATTN_CAPTURE_EVERY": "5",
                                       "RELATTN_CAPTURE_MAX_BYTES": "512M",
                                       "RELATTN_CAPTURE_OUTPUT": "0"})
        self.assertEqual((s.every, s.max_bytes, s.keep_output), (5, 512 << 20, False))
        for name, value in (("RELATTN_CAPTURE_EVERY", "x"), ("RELATTN_CAPTURE_FIRST", "-1"),
                            ("RELATTN_CAPTURE_MAX_BYTES", "4Q"), ("RELATTN_CAPTURE_NONFINITE", "yes")):
            with self.assertRaises(ValueError) as e:
                capture.Settings.from_env({"RELATTN_CAPTURE_DIR": "d", name: value})
            self.assertIn(name, str(e.exception))

    def test_layouts(self):
        case = random_case(seed=3, dtype="F32", heads=4, kv_heads=2, head_dim=8, page=4)
        for layout in ("hnd_packed", "nhd_packed"):
            args = op_arguments(case, layout)
            (ks, ko), (vs, vo) = capture.strides_of(args["key_cache"]), capture.strides_of(args["value_cache"])
            self.assertEqual(capture.detect_layout(case.key_cache.shape, ks, vs, vo - ko), layout)
        ks, ko = capture.strides_of(case.key_cache)
        vs, vo = capture.strides_of(case.value_cache)
        self.assertEqual(capture.detect_layout(case.key_cache.shape, ks, vs, vo - ko), "contiguous")


class Capturing(TempDir):
    def install(self, module, **kw):
        c = capture.Capture(settings(self.path("captured"), **kw), vllm_version="0.0-test")
        return capture.install(module, capture=c)

    def call(self, module, case, **over):
        return call_op(module, case, **over)

    def test_a_captured_file_is_the_same_case(self):
        for dtype, window in (("F32", -1), ("F16", 9)):
            case = random_case(seed=5, dtype=dtype, heads=4, kv_heads=2, head_dim=16, page=4,
                               window_left=window, pad_rows=0, query_lens=(3, 0, 5, 1),
                               kv_lens=(7, 4, 21, 30))
            module = numpy_op(dtype)
            c = self.install(module, every=1)
            result, out = self.call(module, case)
            self.assertIs(result, out)
            [path] = c.written
            back = read_case(path)
            self.assertEqual((back.dtype, back.window_left, back.rel_extent, back.cache_layout),
                             (dtype, window, case.rel_extent, "hnd_packed"))
            self.assertEqual(repr(back.softmax_scale), repr(case.softmax_scale))
            # Only the pages read (and the NaN block 0) are kept.
            self.assertLess(back.num_blocks, case.num_blocks)
            self.assertTrue(np.isnan(back.key_cache[0]).all())
            np.testing.assert_array_equal(attention_numpy(back).astype(out.dtype), out)
            tensors, meta = read_safetensors(path)
            self.assertEqual(meta["capture_reason"], "every_nth")
            self.assertEqual(meta["vllm_version"], "0.0-test")
            self.assertEqual(meta["op_num_splits"], "3")
            self.assertEqual(meta["op_window_size"], str((window, 0) if window >= 0 else (-1, -1)))
            self.assertEqual(tensors["captured_out"][1], list(out.shape))
            self.assertEqual(tensors["captured_out"][0], dtype)

    def test_the_rules_select_calls_and_the_bounds_hold(self):
        case = random_case(seed=6, dtype="F32", heads=4, kv_heads=2, head_dim=16, page=4, pad_rows=0)
        other = random_case(seed=7, dtype="F32", heads=4, kv_heads=2, head_dim=16, page=4, pad_rows=0,
                            query_lens=(1, 1), kv_lens=(9, 3))
        module = numpy_op("F32")
        c = self.install(module, first=1, every=4, max_files=3)
        for k in range(6):
            self.call(module, case if k != 2 else other)
        reasons = [read_safetensors(p)[1]["capture_reason"] for p in c.written]
        self.assertEqual(reasons, ["first_per_shape", "first_per_shape", "every_nth"])
        calls = [read_safetensors(p)[1]["capture_call"] for p in c.written]
        self.assertEqual(calls, ["1", "3", "4"])
        self.call(module, other, max_seqlen_q=16)   # a new shape, but the file limit is reached
        self.assertEqual(len(c.written), 3)
        self.assertEqual(len(os.listdir(self.path("captured"))), 3)
        # The byte limit: nothing fits.
        module = numpy_op("F32")
        c = self.install(module, every=1, max_bytes=1000)
        self.call(module, case)
        self.assertEqual(c.written, [])

    def test_calls_with_a_nonfinite_real_row_are_captured(self):
        case = random_case(seed=8, dtype="F32", heads=4, kv_heads=2, head_dim=16, page=4, pad_rows=0)
        module = numpy_op("F32", nan_row=2)
        c = self.install(module, nonfinite=True)
        self.call(module, case)
        self.assertEqual(len(c.written), 1)
        self.assertEqual(read_safetensors(c.written[0])[1]["capture_reason"], "nonfinite_output")

    def test_the_op_is_unchanged_by_capture_errors_and_its_own_errors_pass_through(self):
        case = random_case(seed=9, dtype="F32", heads=4, kv_heads=2, head_dim=16, page=4, pad_rows=0)
        module = numpy_op("F32")
        c = self.install(module, every=1)
        # A non-causal call cannot be a case file: not captured, logged, the result returned.
        result, out = self.call(module, case, causal=False)
        self.assertIs(result, out)
        self.assertEqual(c.written, [])
        failing = numpy_op("F32", fail=RuntimeError("kernel assertion"))
        self.install(failing, every=1)
        with self.assertRaisesRegex(RuntimeError, "kernel assertion"):
            self.call(failing, case)
        # Installing again replaces the wrapper; uninstall restores the op's own function.
        original = module.InklingFA4RelAttentionKernel.__dict__["kernel"].__func__.__wrapped__
        self.install(module, every=1)
        capture.uninstall(module)
        self.assertIs(module.InklingFA4RelAttentionKernel.__dict__["kernel"].__func__, original)

    def test_the_output_tool_writes_what_judge_reads(self):
        case = random_case(seed=10, dtype="F16", heads=4, kv_heads=2, head_dim=16, page=4, pad_rows=0)
        module = numpy_op("F16")
        c = self.install(module, every=1)
        _, out = self.call(module, case)
        capture.main(["output", c.written[0], "--output", self.path("out.safetensors")])
        tensors, _ = read_safetensors(self.path("out.safetensors"))
        dtype, shape, raw = tensors["out"]
        self.assertEqual((dtype, shape), ("F32", list(out.shape)))
        np.testing.assert_array_equal(np.frombuffer(raw, "<f4").reshape(shape),
                                      out.astype(np.float32))

    def test_compare_tells_a_reproduced_output_from_a_changed_one(self):
        case = random_case(seed=11, dtype="F16", heads=4, kv_heads=2, head_dim=16, page=4,
                           pad_rows=3)
        module = numpy_op("F16")
        c = self.install(module, every=1)
        # Called with the padding rows, as vLLM's CUDA-graph padding does.
        _, out = self.call(module, case, q=case.q.astype(np.float16),
                           rel_logits=case.rel_logits.astype(np.float16))
        [path] = c.written
        real = int(case.cu_seqlens_q[-1])
        self.assertEqual((out.shape[0], real), (case.T, case.T - 3))
        rerun = out.astype(np.float32)
        rerun[real:] = 12345.0   # padding rows: not the op's to write, not compared
        write_out(self.path("same.safetensors"), rerun)
        self.assertEqual(capture.main(["compare", path, self.path("same.safetensors")]), 0)
        # Less than half an f16 step is the same f16 (the op returns f16); one element one f16
        # step off and one real row NaN are differences, both counted.
        near = rerun.copy()
        near[1, 2, 3] = np.nextafter(near[1, 2, 3], np.float32(np.inf), dtype=np.float32)
        write_out(self.path("near.safetensors"), near)
        self.assertEqual(capture.main(["compare", path, self.path("near.safetensors")]), 0)
        changed = rerun.copy()
        changed[1, 2, 3] = np.nextafter(np.float16(changed[1, 2, 3]), np.float16(np.inf))
        changed[0] = np.nan
        write_out(self.path("changed.safetensors"), changed)
        with contextlib.redirect_stdout(io.StringIO()) as said:
            self.assertEqual(capture.main(["compare", path, self.path("changed.safetensors")]), 1)
        heads, dim = out.shape[1:]
        self.assertIn(f"{heads * dim + 1} of {real * heads * dim} elements differ in 2 of "
                      f"{real} real rows", said.getvalue())
        self.assertIn(f"NaN: 0 captured, {heads * dim} now", said.getvalue())
        # Bits, not values: -0.0 is not 0.0; NaN payloads do not matter.
        zero, nan2 = np.zeros((1, 1, 2), np.float32), np.full((1, 1, 2), np.nan, np.float32)
        self.assertIn("1 of 2 elements differ", capture.compare_outputs(zero, zero * [1, -1], 1))
        other_nan = np.frombuffer(np.uint32([0x7FC00001, 0xFFC00000]).tobytes(), np.float32)
        self.assertIsNone(capture.compare_outputs(nan2, other_nan.reshape(1, 1, 2), 1))
        # Another shape differs (exit 1); a missing file, a file with no capture: exit 2.
        write_out(self.path("short.safetensors"), rerun[:-1])
        with contextlib.redirect_stdout(io.StringIO()) as said:
            self.assertEqual(capture.main(["compare", path, self.path("short.safetensors")]), 1)
        self.assertIn(f"DIFFERS: shape {[out.shape[0] - 1, heads, dim]}", said.getvalue())
        with contextlib.redirect_stderr(io.StringIO()) as err:
            self.assertEqual(capture.main(["compare", path, self.path("none.safetensors")]), 2)
            self.assertEqual(capture.main(["compare", self.path("same.safetensors"), path]), 2)
        self.assertIn("has no tensor `captured_out`", err.getvalue())


@unittest.skipUnless(ROOT, NO_ROOT)
class OnVllm(TempDir):
    def test_install_wraps_vllms_op_and_binds_its_arguments(self):
        import vllm_loader
        op = vllm_loader.load_op(ROOT)
        self.assertIsNone(op.error)
        c = capture.install(op.module, capture=capture.Capture(settings(self.path("c"), every=1)))
        try:
            cls = op.module.InklingFA4RelAttentionKernel
            wrapped = cls.__dict__["kernel"]
            self.assertIsInstance(wrapped, staticmethod)
            self.assertIs(wrapped.__func__._relattn_capture, c)
            # What the attention layer calls (`__call__` -> self.kernel) reaches the wrapper.
            self.assertIs(op.module._INKLING_FA4_REL_ATTENTION_KERNEL.kernel, wrapped.__func__)
            import inspect
            bound = inspect.signature(wrapped.__func__.__wrapped__).bind(
                *[None] * 3, **{k: None for k in ("block_table", "cache_seqlens", "cu_seqlens_q",
                                                  "max_seqlen_q", "softmax_scale", "causal",
                                                  "window_size", "rel_extent", "rel_logits")})
            bound.apply_defaults()
            self.assertEqual(bound.arguments["num_splits"], 32)
        finally:
            capture.uninstall(op.module)

    def test_the_vllm_worker_installs_capture_when_asked(self):
        from tests.workerproc import WorkerProcess
        w = WorkerProcess("vllm_worker.py", env={"RELATTN_VLLM_ROOT": ROOT,
                                                 "RELATTN_CAPTURE_DIR": self.path("captured")})
        try:
            hello = w.ask({"op": "hello", "protocol": 1})
            self.assertIn("capturing the op's inputs to " + self.path("captured"), hello["version"])
        finally:
            w.close()
        w = WorkerProcess("vllm_worker.py", env={"RELATTN_VLLM_ROOT": ROOT,
                                                 "RELATTN_CAPTURE_DIR": self.path("captured"),
                                                 "RELATTN_CAPTURE_EVERY": "x"})
        try:
            # A malformed setting: logged, and the worker runs on without capture.
            hello = w.ask({"op": "hello", "protocol": 1})
            self.assertNotIn("capturing", hello["version"])
            self.assertIn("RELATTN_CAPTURE_EVERY='x'", w.stderr_text())
        finally:
            w.close()


if __name__ == "__main__":
    unittest.main()
