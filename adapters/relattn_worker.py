"""Shared library of relattn's Python workers (protocol v1, see PROTOCOL.md beside this file).

A worker is a subclass of `Worker` whose `run` returns the operator's output for a case and
whose `route` (optional) answers a routing question; `serve(worker)` speaks the protocol on
stdin/stdout. It re-exports the case file format of casefile.py (safetensors with the standard
library and numpy only) and holds the numpy reference `attention_numpy`.

  Unsupported             raise it in run/route: the answer is status "unsupported"
  Case, read_case(path)   a case file: float32 arrays of the stored values, int32 indices
  write_case(path, case)  the inverse (tests and tools/capture.py build case files with it; extra
                          metadata and tensors beside the case's own, which readers ignore)
  write_out(path, array)  the output file: one F32 tensor `out` [T, H, D], atomically replaced
  Worker                  name, version, paths, split_paths, device, capability; run, route;
                          set_unavailable(why, log_as) at start with @unsupported_when_unavailable
                          on run: every run answers unsupported with why; warm_up (optional):
                          work every run needs first, on a thread of its own once hello is
                          answered (the first run or route request waits for it)
  serve(worker)           the protocol loop: answers on the real stdout, everything printed
                          meanwhile (Python or C) goes to stderr; exits 0 on bye or end of input
  attention_numpy(case, "f32" | "f64")   the operator of docs/operator.md section 1 on the CPU
  bucket_max_seqlen_q(n), cpu_timed(call, timing), round_to_dtype(values, dtype), log(...)

    class MyWorker(Worker):
        name, version, paths = "mine", "1.0", ["mine"]
        def run(self, case, path, num_splits, timing):
            return out_array, 1, None         # [T, H, D] float32, splits used, ms or None
    if __name__ == "__main__":
        serve(MyWorker())

Everything here imports with numpy alone; torch is never imported by this module.

Workers run as scripts (`python3 adapters/NAME_worker.py`), so Python puts adapters/ first on
their sys.path and they import this library, torch_common.py and vllm_loader.py by name; the
Python tools of tools/ put adapters/ there with tools/adapters_path.py.
"""

import functools
import json
import os
import sys
import threading
import time
import traceback

import numpy as np

from casefile import (  # noqa: F401  (the workers' library re-exports the case file format)
    CACHE_LAYOUTS, FLOAT_DTYPES, FORMAT_VERSION, ROW_LAYOUTS, Case, bf16_bits_to_f32,
    f32_to_bf16_bits, read_case, read_out, read_safetensors, round_to_dtype, tensor_floats,
    write_case, write_out, write_safetensors)

PROTOCOL_VERSION = 1


class Unsupported(Exception):
    """Raised by a worker's run or route: the answer is status "unsupported" with this text."""


class NoAnswer(Exception):
    """Raised by a (test-only) worker that has already written whatever it wanted on the
    protocol stream: serve sends no answer to this request."""


def log(*parts):
    """Free text for relattn's stderr tail (stdout is the protocol's)."""
    print(*parts, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------

def bucket_max_seqlen_q(n):
    """docs/operator.md section 4.4: 1 << bit_length(max(0, n - 1)) (1,2,3,4,5,9,17 -> 1,2,4,4,8,16,32)."""
    return 1 << max(0, int(n) - 1).bit_length()


# Elements of one score block [G, rows, keys]; bounds the reference's memory per step.
_BLOCK_ELEMENTS = 1 << 22


def attention_numpy(case, precision="f32", window_left=None, from_key_0=False):
    """The operator of docs/operator.md section 1 on the CPU: [T, H, D] float32, NaN in the
    padding rows.

    precision "f32": scores, bias, softmax and P*V in float32 from the stored values (as a flash
    kernel computes them, without rounding P to the dtype); "f64": everything in float64.
    Work is vectorised per request and KV head: the request's keys are gathered through the block
    table once, and only the keys some query can see (the window's span on local layers).

    The test workers plant their defects through the last two: `window_left` in place of the
    case's, and `from_key_0` to walk every key from 0 as a leaking kernel does, multiplying the
    zero weights of the keys before the window by their values (NaN there gives NaN:
    docs/operator.md section 5, class 7).
    """
    if precision not in ("f32", "f64"):
        raise ValueError(f"precision must be 'f32' or 'f64', not {precision!r}")
    ft = np.float32 if precision == "f32" else np.float64
    T, H, D, E, Hkv = case.T, case.H, case.D, case.E, case.Hkv
    G = H // Hkv
    scale = ft(case.softmax_scale)
    window = case.window_left if window_left is None else window_left
    out = np.full((T, H, D), np.nan, np.float32)
    cu = case.cu_seqlens_q.astype(np.int64)
    for b in range(case.B):
        t0, t1, lk = int(cu[b]), int(cu[b + 1]), int(case.seqused_k[b])
        lq = t1 - t0
        if lq == 0:
            continue
        prefix = lk - lq
        # The first key any query of this request can see: the window's left end of query 0.
        first = max(0, prefix - window) if window >= 0 and not from_key_0 else 0
        keys, values = case.request_keys(b, first)
        # Per KV head, contiguous [keys, D]: plain 2-D products go to BLAS (stacked ones do not).
        keys = [np.ascontiguousarray(keys[:, g, :], dtype=ft) for g in range(Hkv)]
        values = [np.ascontiguousarray(values[:, g, :], dtype=ft) for g in range(Hkv)]
        j = np.arange(first, lk, dtype=np.int64)
        rows = max(1, _BLOCK_ELEMENTS // max(1, G * len(j)))
        for r0 in range(0, lq, rows):
            r1 = min(lq, r0 + rows)
            d = (prefix + np.arange(r0, r1, dtype=np.int64))[:, None] - j[None, :]  # [rows, keys]
            visible = d >= 0
            if window >= 0:
                visible &= d <= window
            in_extent = (d >= 0) & (d < E)
            index = np.clip(d, 0, E - 1)[None]                                    # [1, rows, keys]
            n = r1 - r0
            for g in range(Hkv):
                heads = slice(g * G, (g + 1) * G)
                q = case.q[t0 + r0:t0 + r1, heads].astype(ft).transpose(1, 0, 2)    # [G, rows, D]
                q = np.ascontiguousarray(q).reshape(G * n, D)
                rel = case.rel_logits[t0 + r0:t0 + r1, heads].astype(ft).transpose(1, 0, 2)
                s = (scale * (q @ keys[g].T)).reshape(G, n, -1)                     # [G, rows, keys]
                s += np.where(in_extent[None], np.take_along_axis(rel, index, axis=2), ft(0))
                s = np.where(visible[None], s, ft(-np.inf))
                m = s.max(axis=2, keepdims=True)
                p = np.exp(s - m)
                o = (p.reshape(G * n, -1) @ values[g]).reshape(G, n, D)              # [G, rows, D]
                o /= p.sum(axis=2, keepdims=True)
                out[t0 + r0:t0 + r1, heads] = o.transpose(1, 0, 2).astype(np.float32)
    return out


def cpu_timed(call, timing):
    """Run `call()` as the protocol's timing asks on a CPU: (last result, ms list or one time)."""
    if timing is None:
        start = time.perf_counter()
        result = call()
        return result, [(time.perf_counter() - start) * 1e3]
    result = None
    for _ in range(timing["warmup"]):
        result = call()
    times = []
    for _ in range(timing["reps"]):
        start = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - start) * 1e3)
    if result is None:  # reps = 0 is refused by serve; keep a result anyway
        result = call()
    return result, times


# ---------------------------------------------------------------------------------------------
# Worker and the protocol loop
# ---------------------------------------------------------------------------------------------

class Worker:
    """Base of every worker: set the class attributes, implement run (and route if it routes)."""

    name = "worker"
    version = "0"
    paths = []
    split_paths = []          # the subset of paths that take forced split counts
    device = None             # "NVIDIA H200" or None
    capability = None         # "9.0" or None
    protocol = PROTOCOL_VERSION
    request = None            # the run request being served (its "id" names the trial)
    unavailable = None        # why no run can work here, found at start (set_unavailable)
    maps_case_files = False   # True: tensors built on the mapped case file, no float32 copy

    def run(self, case, path, num_splits, timing):
        """Return (out float32 [T, H, D], num_splits used, ms list or None).

        `num_splits` is None (the implementation's policy) or a forced count; `timing` is None or
        {"warmup": W, "reps": R}. Raise Unsupported when this case or path cannot be run here.
        """
        raise NotImplementedError

    def route(self, cc, shape):
        """Return {"path", "rejected", "reason", "num_splits"} for capability `cc` ("9.0")."""
        raise Unsupported("this worker has no routing")

    def warm_up(self):
        """Work every run needs first and hello does not (imports, the device's context): done
        on a thread of its own once hello is answered, while relattn builds the first case, and
        the first run waits for it. A failure here is the first run's to meet again. Default:
        nothing."""

    def set_unavailable(self, why, log_as=None):
        """Record at start why no run can work here (`why` None or "" when runs can: a missing
        package, device or op). A worker that cannot run still answers hello; its `run`, under
        @unsupported_when_unavailable, answers unsupported with `why`. With `log_as` ("fa4
        worker") the reason is also logged once, for relattn's stderr tail."""
        self.unavailable = why or None
        if self.unavailable and log_as:
            log(f"{log_as}: every run will answer unsupported: {self.unavailable}")

    def write_output(self, path, out):
        """Write `out` to the request's `out` path (a test worker overrides this to plant faults)."""
        write_out(path, out)

    def hello(self):
        """The hello answer."""
        answer = {"ok": True, "protocol": self.protocol, "name": self.name, "version": self.version,
                  "device": self.device, "capability": self.capability, "paths": list(self.paths),
                  "split_paths": list(getattr(self, "split_paths", None) or [])}
        if self.unavailable:
            answer["unavailable"] = self.unavailable
        if self.maps_case_files:
            answer["maps_case_files"] = True
        answer["stderr_marks"] = True
        return answer


def unsupported_when_unavailable(run):
    """Decorator of a Worker's `run`: raise Unsupported(self.unavailable) before anything else
    when the worker found at start that nothing can run here (Worker.set_unavailable)."""
    @functools.wraps(run)
    def checked(self, case, path, num_splits, timing):
        if self.unavailable:
            raise Unsupported(self.unavailable)
        return run(self, case, path, num_splits, timing)
    return checked


class BadRequest(Exception):
    """A request line that does not follow the protocol."""


# The protocol's own stdout (set by serve); everything else printed goes to stderr.
_protocol_out = None


def protocol_stream():
    """The stream the answers go to while `serve` runs (None before)."""
    return _protocol_out


def _take_protocol_stdout():
    """Keep the real stdout for answers only; fd 1 and sys.stdout then go to stderr, so prints of
    libraries (Python or C) cannot corrupt the protocol."""
    global _protocol_out
    sys.stdout.flush()
    fd = os.dup(1)            # not inherited by child processes
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _protocol_out = os.fdopen(fd, "w", encoding="utf-8", buffering=1)
    return _protocol_out


# The first word of the lines that mark a request's stderr (PROTOCOL.md, hello's `stderr_marks`).
MARK = "relattn-mark"


@functools.lru_cache(maxsize=None)
def _c_library():
    """The C library of this process (None where ctypes cannot load it)."""
    try:
        import ctypes
        return ctypes.CDLL(None)
    except (ImportError, OSError):
        return None


def _mark(which, rid):
    """Mark on stderr where request `rid`'s lines begin or end: what the process printed before
    (C's stdio buffers, which fd 1 and 2 both reach here, then Python's, then the mark, in order
    on fd 2) is not this request's, nor what comes after."""
    try:
        libc = _c_library()
        if libc is not None:
            libc.fflush(None)
        sys.stderr.flush()
        sys.stderr.write(f"{MARK} {which} {json.dumps(rid)}\n")
        sys.stderr.flush()
    except (ValueError, OSError):
        pass


def _answer(stream, message):
    try:
        stream.write(json.dumps(message, separators=(",", ":")) + "\n")
        stream.flush()
    except (BrokenPipeError, ValueError, OSError):
        # relattn closed our stdout: nobody is listening any more.
        sys.exit(0)


def _positive_int(value, what, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        raise BadRequest(f"{what} must be an integer >= {0 if allow_zero else 1}, not {value!r}")
    return value


def _run_request(worker, request):
    rid = request.get("id")
    for key in ("id", "case", "path", "out"):
        if not isinstance(request.get(key), str):
            raise BadRequest(f"run needs a string `{key}`")
    if request["path"] not in worker.paths:
        raise BadRequest(f"path {request['path']!r} is not one of this worker's paths {list(worker.paths)}")
    num_splits = request.get("num_splits")
    if num_splits is not None:
        _positive_int(num_splits, "num_splits")
    timing = request.get("timing")
    if timing is not None:
        if not isinstance(timing, dict):
            raise BadRequest("timing must be null or {\"warmup\":W,\"reps\":R}")
        timing = {"warmup": _positive_int(timing.get("warmup", 0), "timing.warmup", allow_zero=True),
                  "reps": _positive_int(timing.get("reps"), "timing.reps")}
    case = read_case(request["case"])
    before, started = jit_entries(), time.monotonic()
    out, used, ms = worker.run(case, request["path"], num_splits, timing)
    compiled = jit_entries() - before
    worker.write_output(request["out"], out)
    release_device_memory()
    if ms is not None:
        ms = [float(x) for x in ms]
    answer = {"ok": True, "id": rid, "num_splits": int(used), "ms": ms}
    if compiled > 0:
        answer["jit"] = {"compiled": compiled, "seconds": round(time.monotonic() - started, 3)}
    return answer


# Device memory PyTorch's caching allocator may keep between runs. A process of a pool holds what
# its largest case took (gigabytes for the 2**31 cases) unless it gives it back: eight runs side
# by side on one 80 GB GPU ran out of device memory, most likely that way.
CACHED_DEVICE_BYTES_KEPT = 1 << 30


def release_device_memory(torch=None):
    """Give the caching allocator's unused device memory back when it holds more than
    CACHED_DEVICE_BYTES_KEPT (a worker that never imported torch, or never used CUDA: nothing)."""
    torch = torch or sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return False
        if cuda.memory_reserved() - cuda.memory_allocated() <= CACHED_DEVICE_BYTES_KEPT:
            return False
        cuda.empty_cache()
        return True
    except Exception as e:  # a CUDA error after the run: the run's answer stands
        log(f"relattn_worker: device memory not given back: {type(e).__name__}: {e}")
        return False


# A compiled kernel in a JIT cache: a Triton kernel's cubin, a CuTe DSL kernel exported by FA4's
# persistent cache (one object file each).
_KERNEL_SUFFIXES = (".cubin", ".o")


def jit_entries(dirs=None):
    """Compiled kernels in the JIT caches relattn names in RELATTN_JIT_DIRS (colon-separated;
    none: 0), so a run can say how many kernels it compiled."""
    dirs = os.environ.get("RELATTN_JIT_DIRS", "") if dirs is None else dirs
    count = 0
    for top in filter(None, dirs.split(os.pathsep)):
        for _, _, files in os.walk(top):
            count += sum(name.endswith(_KERNEL_SUFFIXES) for name in files)
    return count


def _route_request(worker, request):
    cc, shape = request.get("cc"), request.get("shape")
    if not isinstance(cc, str) or not isinstance(shape, dict):
        raise BadRequest("route needs a string `cc` and an object `shape`")
    answer = dict(worker.route(cc, shape))
    answer.setdefault("rejected", False)
    answer.setdefault("reason", None)
    answer.setdefault("path", None)
    answer.setdefault("num_splits", None)
    # relattn matches each answer to its request by this id (an answer given twice must not be
    # taken for the next request's).
    answer.pop("id", None)
    return {"ok": True, "id": request.get("id"), **answer}


def _start_warm_up(worker):
    """Start the worker's `warm_up` on a thread of its own, once, when it has one and runs can
    work here."""
    if getattr(worker, "_warming", None) is not None or getattr(worker, "unavailable", None):
        return
    if getattr(type(worker), "warm_up", Worker.warm_up) is Worker.warm_up:
        return

    def warm():
        try:
            worker.warm_up()
        except Exception as e:
            log(f"{worker.name} worker: warm-up failed (the first run will try again): "
                f"{type(e).__name__}: {e}")

    worker._warming = threading.Thread(target=warm, name="warm-up", daemon=True)
    worker._warming.start()


def _warmed(worker):
    """Wait for the worker's warm-up, if one runs."""
    warming = getattr(worker, "_warming", None)
    if warming is not None:
        warming.join()


def handle(worker, request):
    """The answer to one parsed request (None for bye)."""
    if not isinstance(request, dict):
        raise BadRequest("a request is one JSON object")
    op = request.get("op")
    if op == "hello":
        return worker.hello()
    if op == "run":
        worker.request = request
        return _run_request(worker, request)
    if op == "route":
        return _route_request(worker, request)
    if op == "bye":
        return None
    raise BadRequest(f"unknown op {op!r} (expected hello, run, route or bye)")


def serve(worker, stdin=None):
    """The protocol loop on stdin/stdout; returns never (exits 0 on bye or end of input)."""
    out = _take_protocol_stdout()
    # Bytes, one line at a time (answers go out before the next request arrives); a line that
    # is not UTF-8 is a bad request like any other, not a crash.
    lines = stdin if stdin is not None else iter(sys.stdin.buffer.readline, b"")
    for line in lines:
        if not serve_line(worker, line, out):
            break
    # A warm-up still importing or making the device's context ends before the interpreter.
    _warmed(worker)
    sys.stderr.flush()
    out.flush()
    sys.exit(0)


# A request answered by the worker itself, or by nobody (NoAnswer).
_NO_ANSWER = object()


def serve_line(worker, line, out):
    """Answer one request line on `out`; False after bye. Once the hello answer is out, the
    worker's warm-up starts (`Worker.warm_up`)."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    if not line.strip():
        return True
    request, marked, answer = None, False, _NO_ANSWER
    try:
        try:
            request = json.loads(line)
            if isinstance(request, dict) and request.get("op") in ("run", "route"):
                # A run needs what the warm-up does; routing may patch the op's module (a
                # stand-in platform), not while it is imported. Before the begin mark: what
                # the warm-up prints is not the first request's.
                _warmed(worker)
            if isinstance(request, dict) and "id" in request:
                _mark("begin", request["id"])
                marked = True
            answer = handle(worker, request)
        except NoAnswer:
            pass
        except Unsupported as e:
            answer = {"ok": False, "status": "unsupported", "message": str(e) or type(e).__name__}
        except (json.JSONDecodeError, BadRequest) as e:
            answer = {"ok": False, "status": "error", "message": f"bad request: {e}"}
        except Exception as e:  # the implementation raised: the trial is an error
            traceback.print_exc(file=sys.stderr)
            answer = {"ok": False, "status": "error", "message": f"{type(e).__name__}: {e}"}
    finally:
        # Every request with an id has its end mark, after all it printed, before its answer.
        if marked:
            _mark("end", request["id"])
    if answer is _NO_ANSWER:
        return True
    if answer is None:      # bye
        return False
    if isinstance(request, dict) and "id" in request:
        answer.setdefault("id", request["id"])
        # keep "ok" first for readers of the raw lines
        answer = {"ok": answer.pop("ok"), **answer}
    _answer(out, answer)
    if isinstance(request, dict) and request.get("op") == "hello" and answer.get("ok"):
        _start_warm_up(worker)
    return True
