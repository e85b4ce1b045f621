"""The protocol loop (relattn_worker.serve) driven through a subprocess, with numpy_worker.py."""

import contextlib
import io
import json
import os
import sys
import textwrap
import threading
import time
import unittest
from unittest import mock

import numpy as np

import relattn_worker
from relattn_worker import (
    Unsupported, Worker, attention_numpy, read_case, read_out, unsupported_when_unavailable,
    write_case)
from tests.casegen import random_case
from tests.test_casefile import TempDir
from tests.workerproc import WorkerProcess, run_request

HELLO = {"op": "hello", "protocol": 1}


class Protocol(TempDir):
    def setUp(self):
        super().setUp()
        self.case_path = self.path("case.safetensors")
        write_case(self.case_path, random_case(seed=11, window_left=6))
        self.workers = []

    def tearDown(self):
        for w in self.workers:
            w.close()
        super().tearDown()

    def start(self, script="numpy_worker.py", *args, env=None):
        worker = WorkerProcess(script, *args, env=env)
        self.workers.append(worker)
        return worker

    def test_a_whole_exchange(self):
        w = self.start()
        hello = w.ask(HELLO)
        self.assertEqual((hello["ok"], hello["protocol"], hello["name"]), (True, 1, "numpy"))
        self.assertEqual((hello["paths"], hello["split_paths"]), (["numpy"], []))
        self.assertIsNone(hello["device"])
        self.assertIsNone(hello["capability"])
        self.assertIn("numpy", hello["version"])
        # It loads the case's floats: relattn's memory ledger counts them (no maps_case_files).
        self.assertNotIn("maps_case_files", hello)
        self.assertIs(hello["stderr_marks"], True)

        out = self.path("out.safetensors")
        answer = w.ask(run_request(self.case_path, out, "numpy", trial_id="impl::numpy::numpy::a::1"))
        self.assertEqual(answer["ok"], True, answer)
        self.assertEqual((answer["id"], answer["num_splits"]), ("impl::numpy::numpy::a::1", 1))
        case = read_case(self.case_path)
        got = read_out(out)
        self.assertEqual(got.shape, case.q.shape)
        np.testing.assert_array_equal(got, attention_numpy(case, "f32"))  # NaN padding included
        self.assertTrue(np.isnan(got[case.real_rows:]).all())

        timed = w.ask(run_request(self.case_path, out, "numpy", trial_id="t2", timing={"warmup": 1, "reps": 3}))
        self.assertEqual(len(timed["ms"]), 3)
        self.assertTrue(all(isinstance(x, float) and x >= 0 for x in timed["ms"]))

        route = w.ask({"op": "route", "id": 41, "cc": "9.0", "shape": {"is_local": False}})
        self.assertEqual((route["ok"], route["status"], route["id"]), (False, "unsupported", 41))

        bad = w.ask("this is not json")
        self.assertEqual((bad["ok"], bad["status"]), (False, "error"))
        self.assertIn("bad request", bad["message"])
        for request in ([1, 2], {"op": "dance"}, {"no": "op"}, b"\xff\xfe not UTF-8"):
            answer = w.ask(request)
            self.assertEqual((answer["ok"], answer["status"]), (False, "error"), request)

        w.send({"op": "bye"})
        self.assertIsNone(w.line())
        self.assertEqual(w.wait(), 0)

    def test_run_errors_are_answered(self):
        w = self.start()
        w.ask(HELLO)
        out = self.path("out.safetensors")
        cases = {
            "missing case": run_request(self.path("nope.safetensors"), out, "numpy", trial_id="m"),
            "unknown path": run_request(self.case_path, out, "flex", trial_id="u"),
            "bad splits": run_request(self.case_path, out, "numpy", trial_id="s", num_splits=0),
            "bad timing": run_request(self.case_path, out, "numpy", trial_id="t", timing={"warmup": 1}),
        }
        for what, request in cases.items():
            with self.subTest(what):
                answer = w.ask(request)
                self.assertEqual((answer["ok"], answer["status"], answer["id"]),
                                 (False, "error", request["id"]))
                self.assertTrue(answer["message"])
        with open(self.path("junk.safetensors"), "wb") as f:
            f.write(b"\x02\0\0\0\0\0\0\0{}")
        answer = w.ask(run_request(self.path("junk.safetensors"), out, "numpy", trial_id="j"))
        self.assertEqual(answer["status"], "error")
        self.assertIn("missing", answer["message"])
        # Still serving after all of that.
        self.assertTrue(w.ask(run_request(self.case_path, out, "numpy", trial_id="ok"))["ok"])

    def test_end_of_input_exits_zero(self):
        w = self.start("numpy_worker.py", "--f64")
        self.assertIn("f64", w.ask(HELLO)["version"])
        w.proc.stdin.close()
        self.assertEqual(w.wait(), 0)

    def test_prints_and_exceptions_of_an_implementation(self):
        # A worker whose implementation prints to stdout (Python and C level) and raises.
        script = self.path("noisy_worker.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(f"""
                import ctypes, os, sys
                sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
                from relattn_worker import Worker, Unsupported, serve, attention_numpy
                class Noisy(Worker):
                    name, version, paths, split_paths = "noisy", "0", ["a", "b", "c"], ["a"]
                    def run(self, case, path, num_splits, timing):
                        print("library chatter")
                        os.write(1, b"C-level chatter\\n")
                        # Into C's stdio buffer (fd 1 is no terminal: kept until flushed).
                        ctypes.CDLL(None).printf(b"C stdio chatter %s\\n", path.encode())
                        if path == "b":
                            raise RuntimeError("kernel exploded")
                        if path == "c":
                            raise Unsupported("no such kernel here")
                        return attention_numpy(case), num_splits or 7, None
                serve(Noisy())
            """))
        w = self.start(script)
        self.assertEqual(w.ask(HELLO)["split_paths"], ["a"])
        out = self.path("out.safetensors")
        answer = w.ask(run_request(self.case_path, out, "a", trial_id="x", num_splits=3))
        self.assertEqual((answer["ok"], answer["num_splits"], answer["ms"]), (True, 3, None))
        answer = w.ask(run_request(self.case_path, out, "b", trial_id="y"))
        self.assertEqual((answer["status"], answer["message"]), ("error", "RuntimeError: kernel exploded"))
        answer = w.ask(run_request(self.case_path, out, "c", trial_id="z"))
        self.assertEqual((answer["status"], answer["message"]), ("unsupported", "no such kernel here"))
        w.send({"op": "bye"})
        self.assertEqual(w.wait(), 0)
        stderr = w.stderr_text()
        self.assertIn("library chatter", stderr)
        self.assertIn("C-level chatter", stderr)
        self.assertIn("Traceback", stderr)
        # Each run's lines between its marks (hello says so), the traceback before the end mark.
        lines = stderr.splitlines()
        for rid, path in zip("xyz", "abc"):
            begin, end = (lines.index(f'relattn-mark {which} "{rid}"') for which in ("begin", "end"))
            between = "\n".join(lines[begin + 1:end])
            self.assertIn("library chatter", between)
            self.assertIn(f"C stdio chatter {path}", between)
            self.assertEqual("Traceback" in between, rid == "y", between)
            self.assertEqual(between.endswith("RuntimeError: kernel exploded"), rid == "y", between)

    def test_route_answers_echo_the_request_id(self):
        # relattn matches route answers to requests by id: a routing worker echoes it, even when
        # its own answer carries another.
        script = self.path("routing_worker.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(f"""
                import sys
                sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
                from relattn_worker import Worker, serve
                class Routing(Worker):
                    name, version, paths = "routing", "0", ["a"]
                    def route(self, cc, shape):
                        if cc == "12.0":
                            raise ValueError("no SM12x")
                        return {{"id": "mine", "path": "score_mod", "num_splits": shape["batch"]}}
                serve(Routing())
            """))
        w = self.start(script)
        w.ask(HELLO)
        for rid, batch in ((1, 8), (2, 32)):
            answer = w.ask({"op": "route", "id": rid, "cc": "9.0", "shape": {"batch": batch}})
            self.assertEqual(answer, {"ok": True, "id": rid, "path": "score_mod", "num_splits": batch,
                                      "rejected": False, "reason": None})
        failed = w.ask({"op": "route", "id": 3, "cc": "12.0", "shape": {"batch": 1}})
        self.assertEqual((failed["ok"], failed["status"], failed["id"]), (False, "error", 3))


class UnavailableWorker(Worker):
    name, paths = "unavailable", ["a"]

    def __init__(self, why, log_as=None):
        self.set_unavailable(why, log_as)

    @unsupported_when_unavailable
    def run(self, case, path, num_splits, timing):
        return "ran"


class Unavailable(unittest.TestCase):
    def test_every_run_answers_the_reason_found_at_start(self):
        with mock.patch.object(relattn_worker, "log") as log:
            worker = UnavailableWorker("no device", "unavailable worker")
            log.assert_called_once_with("unavailable worker: every run will answer unsupported: no device")
            self.assertTrue(worker.hello()["ok"])
            for _ in range(2):
                with self.assertRaisesRegex(Unsupported, "^no device$"):
                    worker.run(None, "a", None, None)
            # Runs that can work run; nothing is logged for them or without log_as.
            self.assertEqual(UnavailableWorker(None, "unavailable worker").run(None, "a", None, None), "ran")
            self.assertIsNone(UnavailableWorker("").unavailable)
            UnavailableWorker("quiet")
            self.assertEqual(log.call_count, 1)


class WarmingWorker(Worker):
    name, paths = "warming", ["a"]

    def __init__(self, fail=False, unavailable=None, out=None):
        self.release, self.events, self.fail, self.out = threading.Event(), [], fail, out
        self.set_unavailable(unavailable)

    def warm_up(self):
        # What was answered when it began; then it waits for the test to release it.
        self.events.append(("began after", self.out.getvalue().count("\n") if self.out else None))
        self.events.append("warming" if self.release.wait(10) else "never released")
        if self.fail:
            raise RuntimeError("no context")
        self.events.append("warm")


def serve_lines(worker, out, *requests):
    """Serve `requests` one by one, answers on `out`; what the worker wrote to stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        for r in requests:
            relattn_worker.serve_line(worker, json.dumps(r), out)
    return err.getvalue()


class StderrMarks(unittest.TestCase):
    """Every request with an id has a begin and an end mark on stderr, also when it is answered
    by nobody (NoAnswer), fails to parse as a run, or has a null id."""

    def test_each_request_with_an_id_is_marked(self):
        class Silent(Worker):
            name, version, paths = "silent", "0", ["p"]

            def route(self, cc, shape):
                print("routing", file=sys.stderr)
                raise relattn_worker.NoAnswer()

        out = io.StringIO()
        err = serve_lines(Silent(), out, HELLO, {"op": "run", "id": "t"},
                          {"op": "route", "id": None, "cc": "9.0", "shape": {}},
                          {"op": "nonsense", "id": 3}, {"op": "bye"})
        self.assertEqual(err.splitlines(), [
            'relattn-mark begin "t"', 'relattn-mark end "t"',           # a bad run request
            "relattn-mark begin null", "routing", "relattn-mark end null",   # answered by nobody
            "relattn-mark begin 3", "relattn-mark end 3"])              # an unknown op
        self.assertEqual(len(out.getvalue().splitlines()), 3)           # hello, run, nonsense


class WarmUp(unittest.TestCase):
    """A worker's warm-up runs on its own thread once the hello answer is out, and the first run
    or route request waits for it."""

    def test_it_begins_after_the_hello_answer_and_the_first_run_waits(self):
        out = io.StringIO()
        w = WarmingWorker(out=out)
        serve_lines(w, out, HELLO)
        self.assertTrue(json.loads(out.getvalue())["ok"])
        deadline = time.monotonic() + 10
        while not w.events and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(w.events[:1], [("began after", 1)])
        w.release.set()
        # A run request (a bad one: it fails after the wait) joins the warm-up first.
        serve_lines(w, out, {"op": "run", "id": "t"})
        self.assertEqual(w.events, [("began after", 1), "warming", "warm"])
        self.assertIn("bad request", out.getvalue().splitlines()[-1])
        # Once: a second hello starts no second warm-up.
        serve_lines(w, out, HELLO)
        relattn_worker._warmed(w)
        self.assertEqual(len(w.events), 3)

    def test_a_route_request_waits_too(self):
        out = io.StringIO()
        w = WarmingWorker(out=out)
        serve_lines(w, out, HELLO)
        threading.Timer(0.3, w.release.set).start()
        serve_lines(w, out, {"op": "route", "id": 1, "cc": "9.0", "shape": {"batch": 1}})
        self.assertEqual(w.events[1:], ["warming", "warm"])
        self.assertIn("no routing", out.getvalue().splitlines()[-1])

    def test_a_failed_warm_up_is_logged_and_runs_go_on(self):
        out = io.StringIO()
        w = WarmingWorker(fail=True, out=out)
        w.release.set()
        with mock.patch.object(relattn_worker, "log") as log:
            serve_lines(w, out, HELLO)
            relattn_worker._warmed(w)
        self.assertEqual(w.events[1:], ["warming"])
        self.assertIn("warm-up failed (the first run will try again): RuntimeError: no context",
                      log.call_args[0][0])
        serve_lines(w, out, {"op": "run", "id": "t"})
        self.assertIn("bad request", out.getvalue().splitlines()[-1])

    def test_no_warm_up_without_one_or_when_nothing_can_run(self):
        for w in (UnavailableWorker(None), WarmingWorker(unavailable="no device")):
            serve_lines(w, io.StringIO(), HELLO)
            self.assertIsNone(getattr(w, "_warming", None))


class ReleaseDeviceMemory(unittest.TestCase):
    """After a run, the caching allocator's unused device memory goes back past a threshold."""

    def fake_torch(self, initialized, reserved, allocated):
        cuda = mock.Mock()
        cuda.is_initialized.return_value = initialized
        cuda.memory_reserved.return_value = reserved
        cuda.memory_allocated.return_value = allocated
        return mock.Mock(cuda=cuda)

    def test_large_unused_reserve_is_released(self):
        kept = relattn_worker.CACHED_DEVICE_BYTES_KEPT
        torch = self.fake_torch(True, 3 * kept, kept // 2)
        self.assertTrue(relattn_worker.release_device_memory(torch))
        torch.cuda.empty_cache.assert_called_once_with()

    def test_small_or_used_reserve_stays(self):
        kept = relattn_worker.CACHED_DEVICE_BYTES_KEPT
        for initialized, reserved, allocated in [(True, kept, 0), (True, 5 * kept, 4 * kept + 1),
                                                 (False, 5 * kept, 0)]:
            torch = self.fake_torch(initialized, reserved, allocated)
            self.assertFalse(relattn_worker.release_device_memory(torch))
            torch.cuda.empty_cache.assert_not_called()

    def test_a_cuda_error_afterwards_is_not_the_runs(self):
        torch = self.fake_torch(True, 0, 0)
        torch.cuda.memory_reserved.side_effect = RuntimeError("CUDA error: an illegal memory access")
        with mock.patch.object(relattn_worker, "log") as log:
            self.assertFalse(relattn_worker.release_device_memory(torch))
        self.assertIn("not given back", log.call_args[0][0])

    def test_a_worker_without_torch_does_nothing(self):
        with mock.patch.dict("sys.modules", {"torch": None}):
            self.assertFalse(relattn_worker.release_device_memory())
