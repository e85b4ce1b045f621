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

and, for the whole process:

  RELATTN_FAULTY_PROTOCOL=N   answer hello with protocol N (relattn must refuse N != 1)

The modes are checked in the order above; the first that matches decides.

    RELATTN_FAULTY_CRASH=::ca1b2c3d4e relattn run --worker "python3 adapters/faulty_worker.py" ...
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import relattn_worker  # noqa: E402
from relattn_worker import NoAnswer, Worker, attention_numpy, cpu_timed, serve  # noqa: E402

MODES = ("CRASH", "HANG", "GARBAGE", "CLOSE", "SHAPE", "NAN", "PADDING", "WRONG")


def fault_for(trial_id, environ=None):
    """The fault mode planted on `trial_id` (None: behave)."""
    environ = os.environ if environ is None else environ
    for mode in MODES:
        items = environ.get(f"RELATTN_FAULTY_{mode}", "").split(",")
        if any(item and item in trial_id for item in items):
            return mode
    return None


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

    @property
    def trial_id(self):
        return str((self.request or {}).get("id", ""))

    def run(self, case, path, num_splits, timing):
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
        return out, 1, ms


def main():
    serve(FaultyWorker())


if __name__ == "__main__":
    main()
