#!/usr/bin/env python3
"""relattn worker: the operator in numpy (protocol v1, PROTOCOL.md).

Path `numpy`. By default scores, bias, softmax and P*V are float32 from the stored values, as a
flash kernel computes them; `--f64` computes everything in float64 (an independent second
reference). It needs no GPU: it is the worker CI drives the protocol with.

    relattn run --worker "python3 adapters/numpy_worker.py" ...
    relattn run --worker "python3 adapters/numpy_worker.py --f64" ...
"""

import argparse

import numpy as np

from relattn_worker import Worker, attention_numpy, cpu_timed, serve


class NumpyWorker(Worker):
    name = "numpy"
    paths = ["numpy"]

    def __init__(self, precision="f32"):
        self.precision = precision
        self.version = f"1.0 ({precision}, numpy {np.__version__})"

    def run(self, case, path, num_splits, timing):
        # One pass over all keys: the split count used is always 1, whatever was asked.
        out, ms = cpu_timed(lambda: attention_numpy(case, self.precision), timing)
        return out, 1, ms


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--f64", action="store_true", help="compute everything in float64")
    args = parser.parse_args(argv)
    serve(NumpyWorker("f64" if args.f64 else "f32"))


if __name__ == "__main__":
    main()
