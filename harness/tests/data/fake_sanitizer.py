#!/usr/bin/env python3
"""A stand-in for compute-sanitizer in relattn's tests, on machines without a GPU.

    fake_sanitizer.py --tool TOOL --log-file LOG [--OPTION VALUE ...] COMMAND [ARGS ...]

Runs COMMAND with its stdin and stdout passed through line by line (a worker speaking the
protocol), writes the sanitizer's header into LOG, and, for every `run` request whose id
contains $FAKE_MEMCHECK_TRIAL, an error report of TOOL's kind (memcheck, initcheck, racecheck or
synccheck, as compute-sanitizer 2025.3 words them) into LOG before it forwards that request's
answer ($FAKE_MEMCHECK_DELAY_MS: that many milliseconds after forwarding it, as a log
flushed late). $FAKE_SANITIZER_ARGS: a file each start appends its arguments and the
PYTORCH_NO_CUDA_MEMORY_CACHING it was given to, one JSON line."""

import json
import os
import subprocess
import sys
import threading
import time

OPTIONS = {"--tool", "--log-file", "--print-limit", "--destroy-on-device-error",
           "--report-api-errors", "--show-backtrace", "--target-processes", "--padding"}
REPORTS = {
    "memcheck": """========= Invalid __global__ read of size 2 bytes
=========     at score_mod_rel_bias+0x1a30
=========     by thread (5,0,0) in block (0,3,1)
=========     Address 0x7f12c0000200 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f12c0000000 of size 511 bytes
=========
""",
    "initcheck": """========= Uninitialized __global__ memory read of size 4 bytes
=========     at combine+0x90
=========     by thread (3,0,0) in block (1,0,0)
=========
""",
    "racecheck": """========= Error: Race reported between Write access at combine+0x40
=========     and Read access at combine+0x80 [16 hazards]
=========
""",
    "synccheck": """========= Barrier error detected. Divergent thread(s) in block
=========     at decode+0x10
=========     by thread (0,0,0) in block (0,0,0)
=========
""",
}
SUMMARIES = {"racecheck": "RACECHECK SUMMARY: {} hazards displayed ({} errors, 0 warnings)"}


def main():
    args, options = sys.argv[1:], {}
    while args and args[0] in OPTIONS:
        options[args[0]], args = args[1], args[2:]
    log = options["--log-file"]
    record = os.environ.get("FAKE_SANITIZER_ARGS")
    if record:
        with open(record, "a") as f:
            f.write(json.dumps({"argv": sys.argv[1:], "caching": os.environ.get(
                "PYTORCH_NO_CUDA_MEMORY_CACHING")}) + "\n")
    with open(log, "a") as f:
        f.write("========= COMPUTE-SANITIZER\n")
    target, delay = os.environ.get("FAKE_MEMCHECK_TRIAL"), os.environ.get("FAKE_MEMCHECK_DELAY_MS")
    child = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    flagged, errors = set(), [0]

    def forward_requests():
        for line in iter(sys.stdin.buffer.readline, b""):
            try:
                request = json.loads(line)
            except ValueError:
                request = None
            if (isinstance(request, dict) and request.get("op") == "run" and target
                    and target in str(request.get("id"))):
                flagged.add(request["id"])
            child.stdin.write(line)
            child.stdin.flush()
        child.stdin.close()

    def report():
        errors[0] += 1
        with open(log, "a") as f:
            f.write(REPORTS[options["--tool"]])

    threading.Thread(target=forward_requests, daemon=True).start()
    for line in iter(child.stdout.readline, b""):
        try:
            answer_id = json.loads(line).get("id")
        except (ValueError, AttributeError):
            answer_id = None
        late = answer_id in flagged and delay
        if answer_id in flagged and not late:
            report()
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
        if late:
            time.sleep(int(delay) / 1000)
            report()
    code = child.wait()
    summary = SUMMARIES.get(options["--tool"], "ERROR SUMMARY: {} errors")
    with open(log, "a") as f:
        f.write(f"========= {summary.format(errors[0], errors[0])}\n")
    sys.exit(code)


if __name__ == "__main__":
    main()
