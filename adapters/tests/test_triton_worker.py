"""triton_worker.py: the route vLLM PR #55078 proposes for SM8x (with RELATTN_VLLM_ROOT = an
unpacked vLLM wheel, from adapters/tools/fetch_vllm.sh), the Triton stand-ins that let routing run
without torch or Triton, the arguments the worker hands the op, and its answers where nothing can
run. The op itself runs where torch and Triton import: on a GPU (RELATTN_GPU_TESTS=1), or on the
CPU in Triton's interpreter (RELATTN_TRITON_INTERPRET_TESTS=1; slow, not in CI)."""

import os
import sys
import types
import unittest

import triton_worker
import vllm_loader
from relattn_worker import Unsupported, read_out, write_case
from tests import spec_routing
from tests.casegen import random_case
from tests.test_casefile import TempDir
from tests.test_fa4_flex import CASES, judge
from tests.workerproc import WorkerProcess, run_request

ROOT = os.environ.get("RELATTN_VLLM_ROOT")
NO_ROOT = ("RELATTN_VLLM_ROOT is not set (adapters/tools/fetch_vllm.sh DEST, then "
           "RELATTN_VLLM_ROOT=DEST)")
SHAPE = {"is_local": False, "batch": 1, "max_query_len": 1, "heads": 8, "kv_heads": 1,
         "max_kv_len": 1048576, "page_size": 16, "window_left": -1}
try:
    import torch
    import triton  # noqa: F401
except Exception as e:  # absent (CI), or a build that cannot load its libraries
    torch, TRITON_ERROR = None, f"{type(e).__name__}: {str(e)[:120]}"
else:
    TRITON_ERROR = None
INTERPRET = os.environ.get("RELATTN_TRITON_INTERPRET_TESTS") == "1"
NO_INTERPRET = ("set RELATTN_TRITON_INTERPRET_TESTS=1 (torch and triton installed) to run the op "
                "in Triton's interpreter" if TRITON_ERROR is None
                else f"torch or triton does not import here ({TRITON_ERROR})")


def fake_modules(use_split):
    """The op's and the decode module's routing names, for route_answer without a wheel."""
    op = types.SimpleNamespace(bucket_max_seqlen_q=lambda n: 1 << max(0, n - 1).bit_length())
    seen = []

    def use_split_kv_decode(**kwargs):
        seen.append(kwargs)
        return use_split

    decode = types.SimpleNamespace(use_split_kv_decode=use_split_kv_decode,
                                   decode_split_count=lambda kv, wl: 7)
    return op, decode, seen


class RouteAnswer(unittest.TestCase):
    def test_sm8x_takes_the_triton_kernels_as_a_proposal(self):
        op, decode, seen = fake_modules(True)
        answer = triton_worker.route_answer(op, decode, "8.6", dict(SHAPE, max_query_len=1))
        self.assertEqual(answer["path"], "fallback")
        self.assertEqual((answer["rejected"], answer["num_splits"], answer["decode_splits"]),
                         (False, 1, 7))
        self.assertIn("#55078", answer["proposed"])
        self.assertEqual(seen[-1], {"max_query_len": 1, "max_kv_len": 1048576, "page_size": 16,
                                    "window_left": -1})
        # The layer hands the op the bucketed max_seqlen_q.
        op, decode, seen = fake_modules(False)
        answer = triton_worker.route_answer(op, decode, "8.0", dict(SHAPE, max_query_len=9))
        self.assertEqual((answer["decode_splits"], seen[-1]["max_query_len"]), (1, 16))

    def test_other_capabilities_are_not_routed(self):
        op, decode, _ = fake_modules(True)
        for cc in ("7.5", "9.0", "10.0", "12.1"):
            with self.assertRaises(Unsupported) as e:
                triton_worker.route_answer(op, decode, cc, SHAPE)
            self.assertIn("only SM8x", str(e.exception))
        with self.assertRaises(ValueError):
            triton_worker.route_answer(op, decode, "sm86", SHAPE)

    def test_the_stand_in_triton(self):
        triton, tl = triton_worker.stand_in_triton()
        self.assertEqual([triton.cdiv(a, 128) for a in (1, 128, 129, 0)], [1, 1, 2, 0])
        self.assertEqual([triton.next_power_of_2(n) for n in (1, 2, 3, 9, 64)], [1, 2, 4, 16, 64])
        f = lambda: 1
        self.assertIs(triton.jit(f), f)
        self.assertIs(triton.jit(do_not_specialize_on_alignment=["x"])(f), f)
        self.assertIs(triton.heuristics({"BLOCK": None})(f), f)
        self.assertEqual(tl.constexpr(32), 32)


@unittest.skipUnless(ROOT, NO_ROOT)
class TritonRouting(unittest.TestCase):
    def setUp(self):
        self.op = vllm_loader.load_op(ROOT, triton_worker.TRITON_OP)
        if self.op.error:
            raise AssertionError(self.op.error)
        self.decode = sys.modules[triton_worker.DECODE_MODULE]

    def route(self, cc, shape):
        try:
            return triton_worker.route_answer(self.op.module, self.decode, cc, shape)
        except Unsupported:
            return {"path": None, "rejected": False, "unanswered": True}

    def test_loaded_from_the_wheel(self):
        module = self.op.module
        self.assertTrue(module.__file__.startswith(os.path.abspath(ROOT)))
        self.assertTrue(hasattr(module, "inkling_fa4_rel_attention"))
        self.assertFalse(sys.modules["vllm.platforms.rocm"].on_gfx950())
        self.assertFalse(getattr(sys.modules.get("torch"), "_relattn_stand_in", False))

    def test_sm8x_against_spec_4_3(self):
        """PR #55078's route agrees with docs/operator.md section 3 and 4.1 everywhere on SM8x; its decode policy
        differs from docs/operator.md section 4.3 on exactly the local decodes at page 16 over 8192 or more keys,
        where vLLM checks the window before the KV length."""
        for cc in ("8.0", "8.6", "8.7", "8.9"):
            differ = []
            for shape in spec_routing.routing_shapes():
                got = self.route(cc, shape)
                want = spec_routing.spec_route(cc, shape)
                self.assertEqual((got["path"], got["num_splits"]), (want["path"], want["num_splits"]))
                if got["decode_splits"] != spec_routing.spec_decode_splits(shape):
                    differ.append(shape)
            self.assertEqual(len(differ), 72, cc)
            for s in differ:
                self.assertEqual((s["is_local"], s["page_size"], s["max_query_len"]), (True, 16, 1))
                self.assertGreaterEqual(s["max_kv_len"], 8192)
                self.assertEqual(self.route(cc, s)["decode_splits"], 1)

    def test_route_through_the_protocol(self):
        w = WorkerProcess("triton_worker.py", env={"RELATTN_VLLM_ROOT": ROOT})
        try:
            hello = w.ask({"op": "hello", "protocol": 1})
            self.assertEqual((hello["name"], hello["paths"], hello["split_paths"]),
                             ("triton", ["triton_op"], []))
            self.assertIn("0.33.0", hello["version"])
            answer = w.ask({"op": "route", "id": 1, "cc": "8.9", "shape": SHAPE})
            self.assertEqual((answer["ok"], answer["path"], answer["num_splits"], answer["decode_splits"]),
                             (True, "fallback", 1, 32))
            self.assertIn("#55078", answer["proposed"])
            answer = w.ask({"op": "route", "id": 2, "cc": "9.0", "shape": SHAPE})
            self.assertEqual((answer["ok"], answer["status"]), (False, "unsupported"))
        finally:
            w.close()


class WithoutTheOp(TempDir):
    def test_hello_then_unsupported(self):
        case_path = self.path("case.safetensors")
        write_case(case_path, random_case())
        env = {k: v for k, v in os.environ.items() if k != "RELATTN_VLLM_ROOT"}
        env["RELATTN_VLLM_ROOT"] = self.path("empty")
        w = WorkerProcess("triton_worker.py", env=env)
        try:
            hello = w.ask({"op": "hello", "protocol": 1})
            self.assertEqual((hello["ok"], hello["name"]), (True, "triton"))
            self.assertIs(hello["maps_case_files"], True)
            for request in (run_request(case_path, self.path("o"), "triton_op", trial_id="a"),
                            {"op": "route", "id": 1, "cc": "8.0", "shape": SHAPE}):
                answer = w.ask(request)
                self.assertEqual((answer["ok"], answer["status"]), (False, "unsupported"))
                self.assertIn("fa4_rel_attention.py does not exist", answer["message"])
        finally:
            w.close()

    @unittest.skipUnless(ROOT, NO_ROOT)
    def test_run_without_torch_triton_or_a_device_is_unsupported(self):
        case_path = self.path("case.safetensors")
        write_case(case_path, random_case())
        # No device visible, whatever the machine has.
        w = WorkerProcess("triton_worker.py", env={"RELATTN_VLLM_ROOT": ROOT, "CUDA_VISIBLE_DEVICES": ""})
        try:
            w.ask({"op": "hello", "protocol": 1})
            answer = w.ask(run_request(case_path, self.path("o"), "triton_op", trial_id="a"))
            self.assertEqual((answer["ok"], answer["status"]), (False, "unsupported"))
            self.assertRegex(answer["message"], "torch cannot be imported|triton cannot be imported|no usable CUDA device")
        finally:
            w.close()


class Arguments(unittest.TestCase):
    def test_op_arguments_are_the_layers(self):
        seen = []

        def num_splits(**kwargs):
            seen.append(kwargs)
            return 9

        op = types.SimpleNamespace(bucket_max_seqlen_q=lambda n: 1 << max(0, n - 1).bit_length(),
                                   inkling_fa4_num_splits=num_splits)
        case = random_case(seed=31, heads=8, kv_heads=2, head_dim=16, page=4, window_left=5)
        args = triton_worker.op_arguments(op, case)
        self.assertEqual(args, {"rows": 8, "max_seqlen_q": 8, "softmax_scale": case.softmax_scale,
                                "causal": True, "window_size": (5, 0), "rel_extent": 8,
                                "num_splits": 9, "max_kv_len": 21})
        self.assertEqual(seen[-1], {"is_local": True, "batch_size": 3, "max_query_len": 8,
                                    "num_heads": 8, "num_kv_heads": 2, "max_kv_len": 21})
        self.assertEqual(triton_worker.op_arguments(op, random_case(seed=32))["window_size"], (-1, -1))


@unittest.skipUnless(ROOT and INTERPRET and TRITON_ERROR is None, NO_INTERPRET if ROOT else NO_ROOT)
class InTritonsInterpreter(TempDir):
    """The op on the CPU in Triton's interpreter, through the protocol, against the numpy
    reference (docs/operator.md section 6), on the small cases the fa4 and flex workers are judged on, plus a
    split-KV decode (page 64, 3 splits) and a batch of only empty requests.

    In fp16: Triton 3.9's interpreter gives wrong bf16 outputs (about 8e8 in every element of
    every case, where fp16 is right), which says nothing about the kernels on a GPU."""

    def run_cases(self, cases):
        env = {"RELATTN_VLLM_ROOT": ROOT, "TRITON_INTERPRET": "1"}
        w = WorkerProcess("triton_worker.py", "--device", "cpu", env=env)
        outs = {}
        try:
            self.assertIn("Triton interpreter", w.ask({"op": "hello", "protocol": 1})["device"])
            for name, case in cases.items():
                path, out = self.path(f"{name}.safetensors"), self.path(f"{name}.out.safetensors")
                write_case(path, case)
                answer = w.ask(run_request(path, out, "triton_op", trial_id=name), timeout=600)
                outs[name] = (answer, read_out(out) if answer["ok"] else None)
        finally:
            w.close()
        return outs

    @staticmethod
    def fp16(**kwargs):
        return random_case(**dict(kwargs, dtype="F16" if kwargs.get("dtype", "BF16") == "BF16"
                                  else kwargs["dtype"]))

    def test_cases(self):
        # Finite garbage in the slots no output reads: NaN there is the next test's question.
        cases = {name: self.fp16(garbage="finite", **kwargs) for name, kwargs in CASES.items()}
        cases["decode_split_kv"] = self.fp16(seed=7, query_lens=(1, 1, 1), kv_lens=(5000, 5, 90),
                                             heads=4, kv_heads=2, page=64, extent=40)
        cases["empty_batch"] = self.fp16(seed=8, query_lens=(0, 0), kv_lens=(0, 0), pad_rows=4)
        for name, (answer, out) in self.run_cases(cases).items():
            with self.subTest(name):
                if cases[name].dtype == "F32":
                    self.assertEqual(answer["status"], "unsupported", answer)
                    continue
                self.assertTrue(answer["ok"], answer)
                judge(self, cases[name], out)
        self.assertEqual(self.run_cases({"d": cases["decode_split_kv"]})["d"][0]["num_splits"], 3)

    @unittest.expectedFailure
    def test_nan_before_the_window(self):
        """docs/operator.md section 5 class 7: the main kernel loads every key tile from 0 and masks the scores
        before the window, but multiplies their zero weights by the values it loaded there, so
        NaN in a page before the window reaches the output (0 x NaN). Expected to fail while the
        op does so; a pass means vLLM fixed it (update adapters/FINDINGS.md)."""
        case = self.fp16(**CASES["local_window"])
        answer, out = self.run_cases({"local": case})["local"]
        self.assertTrue(answer["ok"], answer)
        judge(self, case, out)


if __name__ == "__main__":
    unittest.main()
