"""faulty_worker.py: each planted fault, and normal answers on the other trials."""

import json
import os
import signal
import time

import numpy as np

from faulty_worker import fault_for
from relattn_worker import attention_numpy, read_case, read_out, write_case
from tests.casegen import random_case
from tests.test_casefile import TempDir
from tests.workerproc import WorkerProcess, run_request

HELLO = {"op": "hello", "protocol": 1}


class Faulty(TempDir):
    def setUp(self):
        super().setUp()
        self.case_path = self.path("case.safetensors")
        write_case(self.case_path, random_case(seed=21, pad_rows=2))
        self.case = read_case(self.case_path)
        self.out = self.path("out.safetensors")
        self.worker = None

    def tearDown(self):
        if self.worker:
            self.worker.close()
        super().tearDown()

    def start(self, **env):
        self.worker = WorkerProcess("faulty_worker.py", env={f"RELATTN_FAULTY_{k}": v for k, v in env.items()})
        hello = self.worker.ask(HELLO)
        self.assertEqual((hello["name"], hello["paths"]), ("faulty", ["faulty"]))
        return self.worker

    def run_trial(self, trial_id):
        return run_request(self.case_path, self.out, "faulty", trial_id=trial_id)

    def assert_good_trial(self, w, trial_id="impl::faulty::faulty::fine::policy::0000"):
        answer = w.ask(self.run_trial(trial_id))
        self.assertEqual((answer["ok"], answer["id"]), (True, trial_id), answer)
        np.testing.assert_array_equal(read_out(self.out), attention_numpy(self.case, "f32"))

    def test_fault_selection(self):
        env = {"RELATTN_FAULTY_CRASH": "aa,bb", "RELATTN_FAULTY_NAN": ",cc", "RELATTN_FAULTY_WRONG": ""}
        self.assertEqual(fault_for("x::bb::1", env), "CRASH")
        self.assertEqual(fault_for("x::cc::1", env), "NAN")
        self.assertIsNone(fault_for("x::dd::1", env))  # empty items match nothing

    def test_crash(self):
        w = self.start(CRASH="boom")
        self.assert_good_trial(w)
        w.send(self.run_trial("impl::faulty::faulty::boom::1"))
        self.assertIsNone(w.line())
        self.assertEqual(w.wait(), 3)

    def test_hang(self):
        w = self.start(HANG="slow")
        w.send(self.run_trial("impl::slow::1"))
        with self.assertRaises(TimeoutError):
            w.line(timeout=0.5)
        self.assertIsNone(w.proc.poll())

    def test_garbage(self):
        w = self.start(GARBAGE="junk")
        w.send(self.run_trial("impl::junk::1"))
        line = w.line()
        with self.assertRaises(ValueError):
            json.loads(line)

    def test_close(self):
        w = self.start(CLOSE="shut")
        w.send(self.run_trial("impl::shut::1"))
        self.assertIsNone(w.line())
        self.assertIsNone(w.proc.poll())  # alive, stdout closed

    def test_shape(self):
        w = self.start(SHAPE="narrow")
        self.assertTrue(w.ask(self.run_trial("impl::narrow::1"))["ok"])
        T, H, D = self.case.q.shape
        self.assertEqual(read_out(self.out).shape, (T, H, D - 1))

    def test_nan(self):
        w = self.start(NAN="nan")
        self.assertTrue(w.ask(self.run_trial("impl::nan::1"))["ok"])
        out, real = read_out(self.out), self.case.real_rows
        self.assertEqual(int(np.isnan(out[:real]).sum()), 1)
        self.assertTrue(np.isnan(out[real - 1]).any())

    def test_padding(self):
        w = self.start(PADDING="pad")
        self.assertTrue(w.ask(self.run_trial("impl::pad::1"))["ok"])
        out, real = read_out(self.out), self.case.real_rows
        self.assertTrue((out[real:] == 0).all())
        np.testing.assert_array_equal(out[:real], attention_numpy(self.case, "f32")[:real])

    def test_padding_without_padding_rows(self):
        write_case(self.case_path, random_case(seed=22, pad_rows=0))
        self.case = read_case(self.case_path)
        w = self.start(PADDING="pad")
        self.assertTrue(w.ask(self.run_trial("impl::pad::1"))["ok"])
        self.assertTrue((read_out(self.out)[self.case.T - 1] == 0).all())

    def test_wrong(self):
        w = self.start(WRONG="off")
        self.assertTrue(w.ask(self.run_trial("impl::off::1"))["ok"])
        diff = read_out(self.out) - attention_numpy(self.case, "f32")
        real = self.case.real_rows
        self.assertEqual(np.count_nonzero(diff[:real]), 1)
        self.assertAlmostEqual(float(np.nanmax(np.abs(diff[:real]))), 0.5, places=5)

    def test_protocol_version(self):
        self.worker = WorkerProcess("faulty_worker.py", env={"RELATTN_FAULTY_PROTOCOL": "2"})
        self.assertEqual(self.worker.ask(HELLO)["protocol"], 2)

    def test_lists_and_modes_together(self):
        w = self.start(NAN="n1,n2", WRONG="w1")
        self.assert_good_trial(w)
        for trial in ("x::n2::1", "x::w1::1", "x::n1::1"):
            self.assertTrue(w.ask(self.run_trial(trial))["ok"])
        self.assert_good_trial(w)

    def test_out_fifo_link_and_device(self):
        target = self.path("outside.txt")
        with open(target, "w") as f:
            f.write("not the worker's")
        w = self.start(FIFO="fifo", LINK="link", DEVZERO="zero", LINK_TARGET=target)
        for trial, check in (("x::fifo::1", lambda: self.assertTrue(os.path.exists(self.out))),
                             ("x::link::1", lambda: self.assertEqual(os.readlink(self.out), target)),
                             ("x::zero::1", lambda: self.assertEqual(os.readlink(self.out), "/dev/zero"))):
            if os.path.lexists(self.out):
                os.remove(self.out)
            self.assertTrue(w.ask(self.run_trial(trial))["ok"])
            check()
        os.remove(self.out)
        self.assert_good_trial(w)

    def test_overwrite_twice_and_bad_answers(self):
        w = self.start(OVERWRITE="over", TWICE="two", MS_NEG="neg", MS_HUGE="huge", SPLITS="splits")
        self.assertTrue(w.ask(self.run_trial("x::over::1"))["ok"])
        with open(self.case_path, "rb") as f:
            self.assertEqual(f.read(), b"overwritten by the faulty worker")
        write_case(self.case_path, self.case)
        first = w.ask(self.run_trial("x::two::1"))
        self.assertEqual(json.loads(w.line()), first)
        self.assertEqual(w.ask(self.run_trial("x::neg::1"))["ms"], -5)
        self.assertEqual(w.ask(self.run_trial("x::huge::1"))["ms"], [1.7e308, 1.7e308])
        self.assertEqual(w.ask(self.run_trial("x::splits::1"))["num_splits"], 2**64 - 1)
        self.assert_good_trial(w)

    def test_control_characters(self):
        w = self.start(CONTROL="ctl")
        answer = w.ask(self.run_trial("x::ctl::1"))
        self.assertEqual(answer["status"], "error")
        self.assertIn("\x1b[2J", answer["message"])
        self.assert_good_trial(w)

    def test_gpu_oob_is_an_error_answer_without_a_gpu(self):
        try:
            import torch
            if torch.cuda.is_available():
                self.skipTest("a GPU is present: the read past the end runs (ci/gpu-triton-sanitize.sh)")
        except ImportError:
            pass
        w = self.start(GPU_OOB="oob", GPU_NEIGHBOR="nb", GPU_ROW_GATHER="gather")
        for trial in ("x::oob::1", "x::nb::1", "x::gather::1"):
            answer = w.ask(self.run_trial(trial))
            self.assertEqual(answer["status"], "error", (trial, answer))
            self.assertRegex(answer["message"], "torch|triton|GPU")
        self.assert_good_trial(w)

    def test_hello_faults(self):
        for value, check in (("dup_paths", lambda h: self.assertEqual(h["paths"], ["faulty", "faulty"])),
                             ("many_paths", lambda h: self.assertEqual(len(h["paths"]), 100_000)),
                             ("control", lambda h: self.assertIn("\x1b", h["version"]))):
            worker = WorkerProcess("faulty_worker.py", env={"RELATTN_FAULTY_HELLO": value})
            try:
                check(worker.ask(HELLO))
            finally:
                worker.close()

    def test_kill0_and_fork(self):
        pidfile = self.path("pid")
        # In a group of its own, so that kill 0 reaches only the worker (and this test survives).
        self.worker = WorkerProcess("faulty_worker.py", env={"RELATTN_FAULTY_FORK": "fork",
                                                              "RELATTN_FAULTY_KILL0": "kill",
                                                              "RELATTN_FAULTY_PIDFILE": pidfile},
                                    new_group=True)
        w = self.worker
        w.ask(HELLO)
        self.assertTrue(w.ask(self.run_trial("x::fork::1"))["ok"])
        with open(pidfile) as f:
            child = int(f.read().split()[-1])
        os.kill(child, 0)  # alive
        w.send(self.run_trial("x::kill::1"))
        self.assertIsNone(w.line())
        self.assertEqual(w.wait(), -signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not gone(child):
            time.sleep(0.02)
        self.assertTrue(gone(child), "the forked child was in the worker's group")


def gone(pid):
    """Whether `pid` runs no more (absent, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
