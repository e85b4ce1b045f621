"""vllm_worker.py without a GPU: vllm_loader.py's stand-ins, vLLM's routing under mocked
capabilities (with RELATTN_VLLM_ROOT = an unpacked vLLM 0.33.0 wheel, from
adapters/tools/fetch_vllm.sh), the cache layout and arguments it builds for the op, and its answers
where nothing can run."""

import functools
import os
import shutil
import subprocess
import sys
import types
import unittest
import unittest.mock

import numpy as np

import torch_common
import vllm_loader
import vllm_worker
from relattn_worker import write_case
from tests import spec_routing
from tests.casegen import random_case
from tests.test_casefile import TempDir
from tests.workerproc import WorkerProcess, run_request

ROOT = os.environ.get("RELATTN_VLLM_ROOT")
NO_ROOT = ("RELATTN_VLLM_ROOT is not set (adapters/tools/fetch_vllm.sh DEST, then "
           "RELATTN_VLLM_ROOT=DEST)")
try:
    import torch
except Exception as e:  # absent, or a CUDA build that cannot load its libraries
    torch, TORCH_ERROR = None, f"{type(e).__name__}: {str(e)[:120]}"
else:
    TORCH_ERROR = None
NO_TORCH = f"torch does not import here ({TORCH_ERROR}); the layout is also checked with numpy"
SHAPE = {"is_local": False, "batch": 1, "max_query_len": 1, "heads": 8, "kv_heads": 1,
         "max_kv_len": 1048576, "page_size": 16, "window_left": -1}


@functools.lru_cache(maxsize=None)
def loaded_op():
    op = vllm_loader.load_op(ROOT)
    if op.error:
        raise AssertionError(op.error)
    return op


def fake_op_module(num_splits):
    """A module with the op's routing names, for route_answer without a wheel."""
    module = types.SimpleNamespace(current_platform=None)

    @functools.cache
    def _use_sheared_bias():
        cap = module.current_platform.get_device_capability()
        return cap.major == 10

    module._use_sheared_bias = _use_sheared_bias
    module.inkling_fa4_num_splits = num_splits
    return module


class RouteAnswer(unittest.TestCase):
    def test_mapping_and_bucketing(self):
        seen = []

        def policy(**kwargs):
            seen.append(kwargs)
            return 5

        module = fake_op_module(policy)
        self.assertEqual(vllm_worker.route_answer(module, "10.0", dict(SHAPE, max_query_len=9)),
                         {"path": "sheared_bias", "rejected": False, "reason": None, "num_splits": 5})
        self.assertEqual(seen[-1], {"is_local": False, "batch_size": 1, "max_query_len": 16,
                                    "num_heads": 8, "num_kv_heads": 1, "max_kv_len": 1048576})
        # The cache is cleared between capabilities: 9.0 after 10.0 is not sheared.
        self.assertEqual(vllm_worker.route_answer(module, "9.0", SHAPE)["path"], "score_mod")
        local = dict(SHAPE, is_local=True, window_left=511)
        vllm_worker.route_answer(module, "9.0", local)
        self.assertEqual(seen[-1]["max_kv_len"], 512)  # the layer passes local_extent

    def test_a_capability_check_that_raises_is_a_rejection(self):
        def policy(**kwargs):
            raise RuntimeError("Inkling is not supported on SM 12.0 (no paged-KV forward)")

        answer = vllm_worker.route_answer(fake_op_module(policy), "12.0", SHAPE)
        self.assertEqual(answer, {"path": None, "rejected": True, "num_splits": None,
                                  "reason": "RuntimeError: Inkling is not supported on SM 12.0 (no paged-KV forward)"})

    def test_bad_capability(self):
        with self.assertRaises(ValueError):
            vllm_worker.route_answer(fake_op_module(lambda **k: 1), "sm90", SHAPE)


@unittest.skipUnless(ROOT, NO_ROOT)
class VllmRouting(unittest.TestCase):
    def test_stand_ins(self):
        op = loaded_op()
        self.assertEqual(op.version, "0.33.0")
        module = op.module
        self.assertTrue(module.__file__.startswith(os.path.abspath(ROOT)))
        for name in ("vllm", "vllm.platforms", "vllm.distributed", "vllm.config",
                     "vllm.model_executor.warmup.jit_warmup", "vllm.utils.torch_utils",
                     "vllm.vllm_flash_attn", "vllm.third_party"):
            self.assertTrue(getattr(sys.modules[name], "_relattn_stand_in", False), name)
        self.assertEqual(sys.modules["vllm.vllm_flash_attn"].__path__,
                         [os.path.join(os.path.abspath(ROOT), "vllm", "vllm_flash_attn")])
        # No stand-in torch is left behind.
        self.assertFalse(getattr(sys.modules.get("torch"), "_relattn_stand_in", False))
        self.assertTrue(hasattr(module, "InklingFA4RelAttentionKernel"))

    def test_a_few_capabilities(self):
        module = loaded_op().module
        route = lambda cc, **s: vllm_worker.route_answer(module, cc, dict(SHAPE, **s))
        self.assertEqual(route("9.0"), {"path": "score_mod", "rejected": False, "reason": None, "num_splits": 1})
        self.assertEqual(route("10.0")["path"], "sheared_bias")
        self.assertEqual(route("10.0")["num_splits"], 128)
        self.assertEqual(route("10.0", is_local=True, window_left=511)["num_splits"], 1)
        self.assertEqual(route("11.0", kv_heads=8, heads=64)["num_splits"], 16)
        self.assertEqual(route("9.0")["num_splits"], 1)   # after 10.0 and 11.0: cache cleared
        # The released defect: SM8x and SM12x take the FA4 score_mod entry with Blackwell splits,
        # and nothing rejects SM12x.
        self.assertEqual(route("8.9"), {"path": "score_mod", "rejected": False, "reason": None, "num_splits": 128})
        self.assertEqual(route("12.1"), {"path": "score_mod", "rejected": False, "reason": None, "num_splits": 128})

    def test_the_routing_trials_against_relattns_model(self):
        module = loaded_op().module
        table = spec_routing.compare(lambda cc, s: vllm_worker.route_answer(module, cc, s))
        for cc in ("9.0", "10.0", "10.3", "11.0"):
            self.assertEqual(table[cc][:3], (2160, 2160, 0), cc)
        for cc in ("8.0", "8.6", "8.7", "8.9"):
            self.assertEqual(table[cc][:4], (2160, 0, 2160, {"family misclassified": 2160}), cc)
        for cc in ("12.0", "12.1"):
            self.assertEqual(table[cc][:4], (2160, 0, 2160, {"unsupported architecture not rejected": 2160}), cc)

    def test_route_through_the_protocol(self):
        w = WorkerProcess("vllm_worker.py", env={"RELATTN_VLLM_ROOT": ROOT})
        try:
            hello = w.ask({"op": "hello", "protocol": 1})
            self.assertEqual((hello["name"], hello["paths"], hello["split_paths"]),
                             ("vllm", ["vllm_op", "vllm_op_sheared", "vllm_op_splits"], ["vllm_op_splits"]))
            self.assertIn("0.33.0", hello["version"])
            # The answer echoes the request's id (the protocol's rule).
            answer = w.ask({"op": "route", "id": 5, "cc": "10.3", "shape": SHAPE})
            self.assertEqual(answer, {"ok": True, "id": 5, "path": "sheared_bias", "rejected": False,
                                      "reason": None, "num_splits": 128})
            self.assertEqual(w.ask({"op": "route", "cc": "x", "shape": SHAPE})["status"], "error")
        finally:
            w.close()


@unittest.skipUnless(ROOT, NO_ROOT)
@unittest.skipUnless(shutil.which("git"), "git is not installed")
class SourceCheckout(TempDir):
    """A clone of vLLM's repository as RELATTN_VLLM_ROOT: the op's file is where the wheel has
    it, there is no _version.py (a build writes it) and no dist-info; the version is git's."""

    def make_checkout(self):
        checkout = self.path("vllm-checkout")
        shutil.copytree(os.path.join(ROOT, "vllm"), os.path.join(checkout, "vllm"),
                        ignore=shutil.ignore_patterns("_version.py", "__pycache__"))
        with open(os.path.join(checkout, "pyproject.toml"), "w") as f:
            f.write("[project]\nname = \"vllm\"\n")
        git = lambda *a: subprocess.run(["git", "-C", checkout, *a], check=True, capture_output=True,
                                        env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
                                                 GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"))
        git("init", "-q")
        git("add", "-A")
        git("commit", "-q", "-m", "a pull request's head")
        git("tag", "v0.34.1.dev1")
        return checkout

    def test_the_worker_loads_the_op_from_a_checkout(self):
        checkout = self.make_checkout()
        w = WorkerProcess("vllm_worker.py", env={"RELATTN_VLLM_ROOT": checkout})
        try:
            hello = w.ask({"op": "hello", "protocol": 1})
            self.assertIn("vllm git v0.34.1.dev1 (source checkout at", hello["version"])
            answer = w.ask({"op": "route", "id": 1, "cc": "10.3", "shape": SHAPE})
            self.assertEqual(answer, {"ok": True, "id": 1, "path": "sheared_bias", "rejected": False,
                                      "reason": None, "num_splits": 128})
        finally:
            w.close()


class WithoutVllm(TempDir):
    def test_hello_then_unsupported(self):
        case_path = self.path("case.safetensors")
        write_case(case_path, random_case())
        env = {k: v for k, v in os.environ.items() if k != "RELATTN_VLLM_ROOT"}
        env["RELATTN_VLLM_ROOT"] = self.path("empty")
        w = WorkerProcess("vllm_worker.py", env=env)
        try:
            hello = w.ask({"op": "hello", "protocol": 1})
            self.assertEqual(hello["ok"], True)
            self.assertIn("not loaded", hello["version"])
            self.assertIs(hello["maps_case_files"], True)
            for request in (run_request(case_path, self.path("o"), "vllm_op", trial_id="a"),
                            {"op": "route", "cc": "9.0", "shape": SHAPE}):
                answer = w.ask(request)
                self.assertEqual((answer["ok"], answer["status"]), (False, "unsupported"))
                self.assertIn("fa4_rel_attention.py does not exist", answer["message"])
        finally:
            w.close()

    @unittest.skipUnless(ROOT, NO_ROOT)
    def test_run_without_a_gpu_is_unsupported(self):
        case_path = self.path("case.safetensors")
        write_case(case_path, random_case())
        # No device visible, whatever the machine has.
        w = WorkerProcess("vllm_worker.py", env={"RELATTN_VLLM_ROOT": ROOT, "CUDA_VISIBLE_DEVICES": ""})
        try:
            w.ask({"op": "hello", "protocol": 1})
            answer = w.ask(run_request(case_path, self.path("o"), "vllm_op_splits", trial_id="a", num_splits=4))
            self.assertEqual((answer["ok"], answer["status"]), (False, "unsupported"))
            self.assertIn("no GPU run here", answer["message"])
        finally:
            w.close()


def hnd_buffer(key_cache, value_cache):
    """numpy: one buffer of vLLM's layout (HND [num_blocks, Hkv, page, 2D], rows K(D) | V(D))
    from caches [num_blocks, page, Hkv, D], filled through `torch_common.kv_views` as
    `torch_common.paged_cache` fills the worker's torch buffer."""
    buf = np.empty(torch_common.packed_shape(torch_common.VLLM_LAYOUT, key_cache.shape),
                   dtype=key_cache.dtype)
    key, value = torch_common.kv_views(buf, torch_common.VLLM_LAYOUT, key_cache.shape[-1])
    key[...] = key_cache
    value[...] = value_cache
    return buf


class WarmUp(unittest.TestCase):
    """The worker's warm-up (relattn_worker.Worker.warm_up): the device's context, then both
    entries imported, their errors kept for the runs; nothing without a usable GPU."""

    def worker(self, torch_module):
        w = vllm_worker.VllmWorker.__new__(vllm_worker.VllmWorker)
        w.torch, w.kernel_errors = torch_module, {}
        return w

    def test_the_context_then_both_entries(self):
        calls = []
        fake_torch = types.SimpleNamespace(empty=lambda n, device: calls.append(("empty", device)))
        w = self.worker(fake_torch)
        imported = []

        def import_module(name):
            imported.append(name)
            if "tml_fa4" in name:
                raise ImportError("no tml_fa4 here")

        with unittest.mock.patch.object(vllm_worker.importlib, "import_module", import_module):
            w.warm_up()
            # A run asks again: the import is not tried twice, its error is kept.
            self.assertIn("no tml_fa4 here", w._entry_error(True))
        self.assertEqual(calls, [("empty", "cuda")])
        self.assertEqual(imported, ["vllm.vllm_flash_attn.cute", "vllm.third_party.tml_fa4"])
        self.assertIsNone(w._entry_error(False))

    def test_nothing_without_a_gpu(self):
        w = self.worker(None)
        with unittest.mock.patch.object(vllm_worker.importlib, "import_module") as imp:
            w.warm_up()
        imp.assert_not_called()


class CacheLayout(unittest.TestCase):
    def setUp(self):
        self.case = random_case(seed=31, heads=8, kv_heads=2, head_dim=16, page=4, window_left=5)

    def check_views(self, key, value, case):
        """The views index like the case's caches: [num_blocks, page, Hkv, D]."""
        np.testing.assert_array_equal(np.asarray(key), case.key_cache)
        np.testing.assert_array_equal(np.asarray(value), case.value_cache)

    def test_hnd_buffer_numpy(self):
        case = self.case
        buf = hnd_buffer(case.key_cache, case.value_cache)
        nb, page, hkv, d = case.key_cache.shape
        self.assertEqual(buf.shape, (nb, hkv, page, 2 * d))
        # Row (block, head, slot) is K | V of that slot.
        np.testing.assert_array_equal(buf[3, 1, 2, :d], case.key_cache[3, 2, 1])
        np.testing.assert_array_equal(buf[3, 1, 2, d:], case.value_cache[3, 2, 1])
        key, value = torch_common.kv_views(buf, "hnd_packed", d)
        self.check_views(key, value, case)
        self.assertTrue(np.shares_memory(key, buf) and np.shares_memory(value, buf))
        # Strided: slot stride 2D, head stride page * 2D, block stride Hkv * page * 2D.
        item = buf.itemsize
        self.assertEqual(key.strides, (hkv * page * 2 * d * item, 2 * d * item, page * 2 * d * item, item))

    def test_keys_gathered_through_vllms_table(self):
        case = self.case
        buf = hnd_buffer(case.key_cache, case.value_cache)
        key, _ = torch_common.kv_views(buf, "hnd_packed", case.D)
        table = torch_common.serving_block_table(case)
        for b in range(case.B):
            lk = int(case.seqused_k[b])
            pages = -(-lk // case.page_size)
            self.assertTrue((table[b, pages:] == 0).all())
            np.testing.assert_array_equal(table[b, :pages], case.block_table[b, :pages])
            gathered = np.asarray(key)[table[b, :pages]].reshape(-1, case.Hkv, case.D)[:lk]
            np.testing.assert_array_equal(gathered, case.request_keys(b)[0])

    def test_kernel_arguments(self):
        args = vllm_worker.kernel_arguments(self.case)
        self.assertEqual(args["rows"], 8)
        self.assertEqual(args["max_seqlen_q"], 8)  # max query length 5, bucketed
        self.assertEqual((args["window_size"], args["causal"], args["rel_extent"]), ((5, 0), True, 8))
        self.assertEqual(args["policy"], {"is_local": True, "batch_size": 3, "max_query_len": 8,
                                          "num_heads": 8, "num_kv_heads": 2, "max_kv_len": 6})
        glob = vllm_worker.kernel_arguments(random_case(seed=32))
        self.assertEqual(glob["window_size"], (-1, -1))
        self.assertEqual(glob["policy"]["max_kv_len"], 21)
        self.assertFalse(glob["policy"]["is_local"])

    @unittest.skipUnless(torch, NO_TORCH)
    def test_torch_cpu_views(self):
        for kv_heads in (2, 1):
            case = random_case(seed=33, heads=4, kv_heads=kv_heads, head_dim=16, page=4)
            inputs = vllm_worker.torch_inputs(torch, case, torch.device("cpu"))
            buf = inputs["kv_buffer"]
            self.assertEqual(tuple(buf.shape), (case.num_blocks, kv_heads, case.page_size, 32))
            key, value = inputs["key_cache"], inputs["value_cache"]
            self.assertEqual(key.dtype, torch.bfloat16)
            self.assertEqual(key.data_ptr(), buf.data_ptr())
            self.assertEqual(value.data_ptr(), buf.data_ptr() + 16 * buf.element_size())
            self.check_views(key.float().numpy(), value.float().numpy(), case)
            if kv_heads == 1:  # vLLM canonicalises the stride of the size-1 head dimension
                self.assertEqual(key.stride(2), 16)
            np.testing.assert_array_equal(inputs["block_table"].numpy(), torch_common.serving_block_table(case))


if __name__ == "__main__":
    unittest.main()
