"""Drive a worker process over the protocol in tests: JSON lines in, lines out with a timeout."""

import json
import os
import select
import subprocess
import sys
import tempfile
import time

ADAPTERS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class WorkerProcess:
    def __init__(self, script, *args, env=None, new_group=False):
        self.stderr = tempfile.TemporaryFile()
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen([sys.executable, os.path.join(ADAPTERS, script), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, env=full_env, start_new_session=new_group)
        self.buffer = b""
        self.closed = False

    def send(self, message):
        if isinstance(message, bytes):
            line = message
        else:
            line = (message if isinstance(message, str) else json.dumps(message)).encode()
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def line(self, timeout=20.0):
        """The next stdout line (str), None on end of file, or TimeoutError."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            if self.closed:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no line from the worker")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    self.closed = True
                    if not self.buffer:
                        return None
                    self.buffer += b"\n"
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def ask(self, message, timeout=20.0):
        self.send(message)
        line = self.line(timeout)
        if line is None:
            raise EOFError(f"worker closed stdout; stderr: {self.stderr_text()[-2000:]}")
        return json.loads(line)

    def stderr_text(self):
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def wait(self, timeout=20.0):
        return self.proc.wait(timeout)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.stderr.close()


def run_request(case_path, out_path, path, trial_id="impl::t::p::case::policy::0001", num_splits=None,
                timing=None):
    return {"op": "run", "id": trial_id, "case": case_path, "path": path, "num_splits": num_splits,
            "out": out_path, "timing": timing}
