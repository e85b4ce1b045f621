#!/usr/bin/env python3
"""relattn worker for tests only: the numpy worker with faults planted on chosen trials.

Name `faulty`, path `faulty`. It answers like numpy_worker.py (float32 reference) except on a
run whose `id` contains one of the substrings in these environment variables (each may be a
comma-separated list of substrings; empty items are ignored):

  RELATTN_FAULTY_CRASH     exit the process with code 3 without answering
  RELATTN_FAULTY_HANG      sleep forever without answering
  RELATTN_FAULTY_GARBAGE   print a line that is not JSON on stdout instead of the answer
  RELATTN_FAULTY_CLOSE     close stdout, then sleep forever
  RELATTN_FAULTY_SHAPE     write `out` with a wrong shape, [T, H, D - 1]
  RELATTN_FAULTY_NAN       write NaN into one element of the last real row (cu_seqlens_q[B] - 1)
  RELATTN_FAULTY_PADDING   write zeros into the padding rows [cu_seqlens_q[B], T), or into row
                           T - 1 when the case has no padding rows
  RELATTN_FAULTY_WRONG     add 0.5 to one element of the first real row
  RELATTN_FAULTY_FIFO      make `out` a FIFO instead of a file (reading it would block)
  RELATTN_FAULTY_LINK      make `out` a symbolic link to $RELATTN_FAULTY_LINK_TARGET (default
                           /etc/passwd): a file outside the worker's folder
  RELATTN_FAULTY_DEVZERO   make `out` a symbolic link to /dev/zero (endless bytes)
  RELATTN_FAULTY_OVERWRITE overwrite the case file it was handed with garbage, then answer as
                           usual from the case it had read
  RELATTN_FAULTY_TWICE     answer the request twice
  RELATTN_FAULTY_MS_NEG    answer "ms": -5
  RELATTN_FAULTY_MS_HUGE   answer "ms": [1.7e308, 1.7e308] (finite; their sum is not)
  RELATTN_FAULTY_SPLITS    answer "num_splits": 2^64 - 1
  RELATTN_FAULTY_CONTROL   answer status error with terminal control sequences in the message,
                           and print some on stderr
  RELATTN_FAULTY_KILL0     `kill 0`: SIGTERM to the worker's whole process group
  RELATTN_FAULTY_FORK      start `sleep 1000` (its pid written to $RELATTN_FAULTY_PIDFILE when
                           set), then answer as usual
  RELATTN_FAULTY_GPU_OOB   on the GPU, a Triton kernel reads the 1024 floats past the end of
                           a 1024-float tensor (the read lands in mapped memory and changes
                           nothing: only `--sanitize memcheck` sees it), then answer as usual;
                           an error answer where torch, Triton or a GPU is missing
  RELATTN_FAULTY_GPU_NEIGHBOR  on the GPU, a Triton kernel reads the 1024 floats past the end
                           of a 1024-float tensor allocated just before another: without
                           memcheck's --padding the reads land in that neighbour, an allocation,
                           and memcheck sees nothing; then answer as usual
  RELATTN_FAULTY_GPU_ROW_GATHER  on the GPU, rel_logits laid out as the case's row layout says
                           (torch_common.row_inputs), a Triton kernel reads row cu_seqlens_q[B],
                           the row past the last real query (vLLM #49049's class): inside the
                           allocation when the case has padding rows, outside it with the exact
                           row layout; then answer as usual
  RELATTN_FAULTY_RAISE     raise an exception naming the trial (the answer is an error, the
                           traceback goes to stderr)
  RELATTN_FAULTY_NOISE     print a line naming the trial on stderr, then answer as usual

and, for the whole process:

  RELATTN_FAULTY_RECORD=FILE  append a line `pid start end case files id` (times in seconds
                              since the epoch; the case file, and how many case files its
                              folder held) to FILE for every run it answers: which process ran
                              which trial, when, and on which file (the tests of worker pools)
  RELATTN_FAULTY_SLOW_MS=N    take N milliseconds longer over every run
  RELATTN_FAULTY_UNAVAILABLE=WHY  say in hello that no run can work here, for WHY (every run
                              then answers unsupported with it)

  RELATTN_FAULTY_PROTOCOL=N   answer hello with protocol N (relattn must refuse N != 1)
  RELATTN_FAULTY_HELLO=dup_paths | many_paths | paths:N | control
                              hello lists path `faulty` twice; lists 100,000 paths; lists N
                              paths (p0, p1, ...); or has terminal control sequences in its
                              version

The modes are checked in the order above; the first that matches decides.

    RELATTN_FAULTY_CRASH=::ca1b2c3d4e relattn run --worker "python3 adapters/faulty_worker.py" ...
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

import relattn_worker
from relattn_worker import (NoAnswer, Worker, attention_numpy, cpu_timed, serve,
                            unsupported_when_unavailable)

MODES = ("CRASH", "HANG", "GARBAGE", "CLOSE", "SHAPE", "NAN", "PADDING", "WRONG", "FIFO", "LINK",
         "DEVZERO", "OVERWRITE", "TWICE", "MS_NEG", "MS_HUGE", "SPLITS", "CONTROL", "KILL0", "FORK",
         "GPU_OOB", "GPU_NEIGHBOR", "GPU_ROW_GATHER", "RAISE", "NOISE")
# Text that moves a terminal's cursor, recolours it and rings its bell.
CONTROL_TEXT = "\x1b[2J\x1b[31mred\x1b[0m\rover\x07written\x9b"


def fault_for(trial_id, environ=None):
    """The fault mode planted on `trial_id` (None: behave)."""
    environ = os.environ if environ is None else environ
    for mode in MODES:
        items = environ.get(f"RELATTN_FAULTY_{mode}", "").split(",")
        if any(item and item in trial_id for item in items):
            return mode
    return None


def read_past_end():
    """Launch a Triton kernel (`copy_past`) that copies the 1024 floats that follow a 1024-float
    CUDA tensor: every read is past the tensor's end. The tensor is the last allocation (PyTorch
    allocates it from the driver when memcheck is on: PYTORCH_NO_CUDA_MEMORY_CACHING=1), so the
    reads belong to no allocation, in a page the driver has mapped."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("GPU_OOB needs a CUDA GPU")
    dst = torch.empty(1024, device="cuda")
    src = torch.ones(1024, device="cuda")
    copy_past(src, 1024, 1024, dst)
    print("faulty: read 1024 floats past a tensor's end on the GPU", file=sys.stderr, flush=True)


def copy_past(src, start, count, dst=None):
    """Copy `count` elements of flat tensor `src` from element `start` on (which may lie past its
    end: nothing checks) with a Triton kernel, into `dst` (default: a new tensor allocated after
    `src`); returns the copy."""
    import torch
    import triton
    import triton.language as tl

    def copy(src, dst, start, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(dst + i, tl.load(src + start + i, mask=m), mask=m)

    if not torch.cuda.is_available():
        raise RuntimeError("the planted GPU reads need a CUDA GPU")
    if dst is None:
        dst = torch.empty(count, dtype=src.dtype, device=src.device)
    block = 1024
    triton.jit(copy)[(triton.cdiv(count, block),)](src, dst, start, count, BLOCK=block)
    torch.cuda.synchronize()
    return dst


def read_into_neighbour():
    """Read the 1024 floats past a 1024-float tensor that has another allocated after it."""
    import torch
    src = torch.ones(1024, device="cuda")
    neighbour = torch.zeros(1 << 20, device="cuda")
    copy_past(src, 1024, 1024)
    del neighbour
    print("faulty: read 1024 floats past a tensor, towards its neighbour", file=sys.stderr,
          flush=True)


def gather_row_past_end(case):
    """Read rel_logits row cu_seqlens_q[B] (one past the last real query) of the case's rel_logits
    as its row layout places them."""
    import torch
    import torch_common
    _, rel = torch_common.row_inputs(torch, case, "cuda", torch.float32)
    row = case.H * case.E
    copy_past(rel, case.real_rows * row, row)
    print(f"faulty: read rel_logits row {case.real_rows} ({case.row_layout} rows)",
          file=sys.stderr, flush=True)


def sleep_forever():
    while True:
        time.sleep(3600)


class FaultyWorker(Worker):
    name = "faulty"
    paths = ["faulty"]
    version = f"1.0 (test-only faults, numpy {np.__version__})"

    def __init__(self):
        value = os.environ.get("RELATTN_FAULTY_PROTOCOL")
        if value:
            self.protocol = int(value)
        hello = os.environ.get("RELATTN_FAULTY_HELLO", "")
        if hello == "dup_paths":
            self.paths = ["faulty", "faulty"]
        elif hello == "many_paths":
            self.paths = [f"p{i}" for i in range(100_000)]
        elif hello.startswith("paths:"):
            self.paths = [f"p{i}" for i in range(int(hello[len("paths:"):]))]
        elif hello == "control":
            self.version = "1.0" + CONTROL_TEXT
        self.out_fault = None
        self.set_unavailable(os.environ.get("RELATTN_FAULTY_UNAVAILABLE"))

    def write_output(self, path, out):
        if self.out_fault == "FIFO":
            os.mkfifo(path)
        elif self.out_fault == "LINK":
            os.symlink(os.environ.get("RELATTN_FAULTY_LINK_TARGET", "/etc/passwd"), path)
        elif self.out_fault == "DEVZERO":
            os.symlink("/dev/zero", path)
        else:
            super().write_output(path, out)

    @property
    def trial_id(self):
        return str((self.request or {}).get("id", ""))

    @unsupported_when_unavailable
    def run(self, case, path, num_splits, timing):
        started = time.time()
        slow_ms = int(os.environ.get("RELATTN_FAULTY_SLOW_MS") or 0)
        if slow_ms > 0:
            time.sleep(slow_ms / 1000)
        result = self.run_fault(case, path, num_splits, timing)
        record = os.environ.get("RELATTN_FAULTY_RECORD")
        if record:
            case_file = str((self.request or {}).get("case", ""))
            folder = os.path.dirname(case_file) or "."
            files = sum(n.startswith("case-") for n in os.listdir(folder))
            with open(record, "a") as f:
                f.write(f"{os.getpid()} {started:.6f} {time.time():.6f} {case_file} {files} {self.trial_id}\n")
        return result

    def run_fault(self, case, path, num_splits, timing):
        mode = fault_for(self.trial_id)
        stream = relattn_worker.protocol_stream()
        if mode == "CRASH":
            print(f"faulty: crashing on {self.trial_id}", file=sys.stderr, flush=True)
            os._exit(3)
        if mode == "HANG":
            print(f"faulty: hanging on {self.trial_id}", file=sys.stderr, flush=True)
            sleep_forever()
        if mode == "GARBAGE":
            stream.write("this is not a JSON answer\n")
            stream.flush()
            raise NoAnswer()
        if mode == "CLOSE":
            stream.close()
            sleep_forever()
        if mode == "KILL0":
            print(f"faulty: kill 0 on {self.trial_id}", file=sys.stderr, flush=True)
            os.kill(0, signal.SIGTERM)
            sleep_forever()
        if mode == "CONTROL":
            print(f"faulty: {CONTROL_TEXT}", file=sys.stderr, flush=True)
            raise RuntimeError(f"planted{CONTROL_TEXT}")
        if mode == "RAISE":
            raise RuntimeError(f"planted error in {self.trial_id}")
        if mode == "NOISE":
            print(f"faulty: noise of {self.trial_id}", file=sys.stderr, flush=True)
        if mode == "OVERWRITE":
            try:
                # Read-only is no obstacle to its owner (nor to root).
                os.chmod(self.request["case"], 0o644)
                with open(self.request["case"], "wb") as f:
                    f.write(b"overwritten by the faulty worker")
            except OSError as e:
                print(f"faulty: cannot overwrite the case file: {e}", file=sys.stderr, flush=True)
        if mode == "FORK":
            child = subprocess.Popen(["sleep", "1000"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            pidfile = os.environ.get("RELATTN_FAULTY_PIDFILE")
            if pidfile:
                with open(pidfile, "a") as f:
                    f.write(f"{child.pid}\n")
        if mode == "GPU_OOB":
            read_past_end()
        if mode == "GPU_NEIGHBOR":
            read_into_neighbour()
        if mode == "GPU_ROW_GATHER":
            gather_row_past_end(case)
        self.out_fault = mode if mode in ("FIFO", "LINK", "DEVZERO") else None

        out, ms = cpu_timed(lambda: attention_numpy(case, "f32"), timing)
        real = case.real_rows
        if mode == "SHAPE":
            out = out[:, :, :-1]
        elif mode == "NAN" and real > 0:
            out[real - 1, 0, 0] = np.nan
        elif mode == "PADDING":
            if real < case.T:
                out[real:] = 0.0
            else:
                out[case.T - 1] = 0.0
        elif mode == "WRONG" and real > 0:
            out[0, 0, 0] += 0.5
        answer = {"ok": True, "id": self.trial_id, "num_splits": 1, "ms": ms}
        if mode == "MS_NEG":
            answer["ms"] = -5
        elif mode == "MS_HUGE":
            answer["ms"] = [1.7e308, 1.7e308]
        elif mode == "SPLITS":
            answer["num_splits"] = 2**64 - 1
        if mode in ("TWICE", "MS_NEG", "MS_HUGE", "SPLITS"):
            self.write_output(self.request["out"], out)
            stream.write(json.dumps(answer) + "\n")
            if mode != "TWICE":
                stream.flush()
                raise NoAnswer()
            # TWICE: the protocol loop writes the same answer again.
        return out, 1, ms


def main():
    serve(FaultyWorker())


if __name__ == "__main__":
    main()
