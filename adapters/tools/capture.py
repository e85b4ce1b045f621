"""Capture the inputs of vLLM's Inkling op as relattn case files.

Installed in a Python process that runs vLLM's Inkling attention, it wraps the op
(`InklingFA4RelAttentionKernel.kernel` in `vllm/models/inkling/nvidia/ops/fa4_rel_attention.py`,
which the attention layer reaches through `_INKLING_FA4_REL_ATTENTION_KERNEL(...)`) and writes
the inputs of selected calls as case files (docs/reference.md, "Case files"), which
`relattn run --cases DIR`, `relattn reference` and `relattn judge` read:

    RELATTN_CAPTURE_DIR=/tmp/captured python3 -c 'import capture; capture.install(); ...'
    RELATTN_CAPTURE_DIR=/tmp/captured relattn run --matrix ci --impl vllm   # the vllm worker
    relattn run --cases /tmp/captured --impl vllm                         # run what was captured

With `adapters/tools/` on `PYTHONPATH`, `import capture; capture.install()` before the model
runs (after vLLM is imported; `install(module)` takes the op module when it was loaded another
way). The vllm worker installs it as it loads the op whenever RELATTN_CAPTURE_DIR is set.

The wrapper calls the original op first and returns its result untouched; only then, for a
selected call, it copies the inputs to the CPU and writes the file. Any error of its own is
logged to stderr (`capture: ...`) and swallowed: capture never changes what the op returns or
raises. Calls it cannot copy are passed through: tensors without storage (FakeTensorMode, as
in vLLM's kernel compilation) and calls made while a CUDA graph is being captured. Calls
replayed from a CUDA graph never reach Python: run vLLM with `--enforce-eager` to capture
decode calls.

Selection (environment, read by `install`; a call can be selected for several reasons):

  RELATTN_CAPTURE_DIR        the folder to write (created); capture is off without it
  RELATTN_CAPTURE_EVERY      N: every Nth call of the process (default 0: off)
  RELATTN_CAPTURE_FIRST      N: the first N calls of each input shape (default 1; 0: off). The
                             shape: dtype, q's [T, H, D], the page size, KV heads, rel_extent,
                             the block table's [B, max_pages], the window, max_seqlen_q
  RELATTN_CAPTURE_NONFINITE  1 (default): calls whose output has a NaN or infinity in a real
                             row (checking costs a device synchronisation per call); 0: off
  RELATTN_CAPTURE_MAX_FILES  at most this many files per process (default 100)
  RELATTN_CAPTURE_MAX_BYTES  at most this many bytes of files per process, e.g. 512M, 4G
                             (default 4G); a call whose file would pass it is skipped, logged
  RELATTN_CAPTURE_OUTPUT     1 (default): also keep the op's output as tensor `captured_out`
                             [T, H, D] (relattn's reader ignores it); 0: off

What a file holds: `q`, `rel_logits`, `block_table`, `seqused_k` (the op's `cache_seqlens`) and
`cu_seqlens_q` as the op was given them, and `key_cache` / `value_cache` with only the pages
some request reads (from the first page of each request's window to its last page), renumbered
1..n in order of their physical block ids, block 0 a page of NaN that every other table entry
points to (those entries are don't-care: an implementation that reads them shows NaN). Metadata:
`format_version`, `softmax_scale` (repr: round-trips the float), `rel_extent`, `window_left`
(`window_size[0]`, -1 for no window), `causal`, `cache_layout` (the layout the op's K/V views
had: `hnd_packed` in vLLM), and the call's own: `vllm_version`, `capture_reason`,
`capture_call` (the call's number in the process), `capture_pid`, `op_window_size`,
`op_max_seqlen_q`, `op_num_splits`, `op_page_size`, `op_num_blocks` (of the live cache).
File names: `<pid>-<call>_<reasons>_b<B>_t<T>_h<H>kv<Hkv>_page<P>_<dtype>.safetensors`.

    python3 adapters/tools/capture.py output FILE --output OUT.safetensors

writes a captured file's `captured_out` as an output file (tensor `out`, F32, the values exact;
rows past cu_seqlens_q[B], padding, as NaN), so that
`relattn judge --input FILE --output OUT.safetensors` tells whether the op's output at capture
time was within the tolerance of relattn's reference, and

    python3 adapters/tools/capture.py compare FILE OUT.safetensors

whether an output written since (`relattn exec --impl vllm --path vllm_op --input FILE --output
OUT.safetensors`: the op run again on the captured inputs), rounded to the dtype the op
returned, has the same bits as `captured_out` in every real row, NaN wherever it had NaN (exit
0; 1 with the count of differing elements, the largest difference and the NaN counts when not).

Everything but `install` and the torch half of `Capture.after_call` runs with numpy alone.
"""

import adapters_path  # noqa: F401  (first: adapters/ on sys.path for the imports below)

import argparse
import inspect
import os
import re
import sys
import threading

import numpy as np

from relattn_worker import (
    Case, log, read_out, read_safetensors, round_to_dtype, tensor_floats, write_case,
    write_out)
from vllm_loader import OP_MODULE

OP_CLASS = "InklingFA4RelAttentionKernel"
# torch dtype name -> case-file dtype.
DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
ITEM_SIZE = {"BF16": 2, "F16": 2, "F32": 4}


def _log(message):
    log(f"capture: {message}")


# ---------------------------------------------------------------------------------------------
# Settings and selection (numpy-free)
# ---------------------------------------------------------------------------------------------

def parse_bytes(text):
    """"4G", "512M", "1000" -> bytes; ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a size such as 512M or 4G")
    return int(match.group(1)) << (10 * " KMGT".index(match.group(2).upper() or " "))


class Settings:
    """What to capture and the bounds (see the module's documentation)."""

    def __init__(self, directory, every=0, first=1, nonfinite=True, max_files=100,
                 max_bytes=4 << 30, keep_output=True):
        self.directory = str(directory)
        self.every, self.first = int(every), int(first)
        self.nonfinite, self.keep_output = bool(nonfinite), bool(keep_output)
        self.max_files, self.max_bytes = int(max_files), int(max_bytes)
        for name in ("every", "first", "max_files", "max_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0, not {getattr(self, name)}")

    @classmethod
    def from_env(cls, environ=None):
        """The settings of RELATTN_CAPTURE_*, or None when RELATTN_CAPTURE_DIR is not set.
        A malformed value raises ValueError naming the variable."""
        env = os.environ if environ is None else environ
        directory = env.get("RELATTN_CAPTURE_DIR", "").strip()
        if not directory:
            return None

        def read(name, convert, default):
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = convert(raw)
            except ValueError as e:
                raise ValueError(f"{name}={raw!r}: {e}") from None
            if isinstance(value, int) and value < 0:
                raise ValueError(f"{name}={raw!r}: must be at least 0")
            return value

        def flag(raw):
            if raw not in ("0", "1"):
                raise ValueError("expected 0 or 1")
            return raw == "1"

        return cls(directory,
                   every=read("RELATTN_CAPTURE_EVERY", int, 0),
                   first=read("RELATTN_CAPTURE_FIRST", int, 1),
                   nonfinite=read("RELATTN_CAPTURE_NONFINITE", flag, True),
                   max_files=read("RELATTN_CAPTURE_MAX_FILES", int, 100),
                   max_bytes=read("RELATTN_CAPTURE_MAX_BYTES", parse_bytes, 4 << 30),
                   keep_output=read("RELATTN_CAPTURE_OUTPUT", flag, True))


class Selector:
    """Counts calls (per process and per shape) and says which selection rules a call meets."""

    def __init__(self, settings):
        self.settings = settings
        self.calls = 0
        self.per_shape = {}

    def next_call(self, shape):
        """Count one call of `shape`; returns (call number from 1, reasons known before the
        output is seen)."""
        self.calls += 1
        seen = self.per_shape.get(shape, 0) + 1
        self.per_shape[shape] = seen
        reasons = []
        if self.settings.every and self.calls % self.settings.every == 0:
            reasons.append("every_nth")
        if seen <= self.settings.first:
            reasons.append("first_per_shape")
        return self.calls, reasons


# ---------------------------------------------------------------------------------------------
# From the op's arguments to a case (numpy arrays; torch tensors converted on the way)
# ---------------------------------------------------------------------------------------------

def is_torch(x):
    return hasattr(x, "detach") and hasattr(x, "device")


def to_numpy(x, floats=True):
    """A copy on the CPU: float32 for float tensors (bf16 and fp16 values are exact in f32),
    int64 for integer ones."""
    if is_torch(x):
        x = x.detach()
        x = x.float() if floats else x.long()
        return x.cpu().numpy()
    return np.asarray(x).astype(np.float32 if floats else np.int64)


def dtype_name(x):
    """BF16, F16 or F32 of a tensor or an array (numpy float16, float32, or ml_dtypes'
    bfloat16); ValueError for any other."""
    name = str(x.dtype).replace("torch.", "") if is_torch(x) else str(np.asarray(x).dtype)
    if name not in DTYPES:
        raise ValueError(f"dtype {name} is not bf16, fp16 or fp32")
    return DTYPES[name]


def window_left_of(window_size):
    """The op's `window_size` (left, right) as a case file's `window_left` (-1: none)."""
    left = -1 if window_size is None else int(window_size[0])
    return left if left >= 0 else -1


def plan_blocks(block_table, seqused_k, cu_seqlens_q, page_size, window_left):
    """The physical blocks some request reads (sorted, unique) and the case's block table:
    each read entry renumbered to 1 + its block's place in that list, every other entry 0
    (past a request's last page, or before its window's first page: don't-care)."""
    table = np.asarray(block_table, dtype=np.int64)
    seqused = np.asarray(seqused_k, dtype=np.int64)
    cu = np.asarray(cu_seqlens_q, dtype=np.int64)
    B, width = table.shape
    reads = np.zeros(table.shape, dtype=bool)
    for b in range(B):
        lk, lq = int(seqused[b]), int(cu[b + 1] - cu[b])
        if lk <= 0 or lq <= 0:
            continue
        first = max(0, lk - lq - window_left) if window_left >= 0 else 0
        reads[b, first // page_size:min(width, -(-lk // page_size))] = True
    used = np.unique(table[reads])
    new = np.zeros(table.shape, dtype=np.int32)
    new[reads] = 1 + np.searchsorted(used, table[reads])
    return used, new


def detect_layout(shape, key_strides, value_strides, value_offset):
    """How the op's K and V views sit in memory (element strides, V's offset from K): vLLM's
    one buffer per layer [blocks, Hkv, page, 2D] is `hnd_packed`, [blocks, page, Hkv, 2D]
    `nhd_packed`, anything else `contiguous` (the case file stores the caches contiguous
    whatever this says; it tells GPU runs how to place them). Strides of size-1 dimensions
    are not compared (vLLM canonicalises them)."""
    nb, page, hkv, d = shape
    expected = {
        "hnd_packed": (hkv * page * 2 * d, 2 * d, page * 2 * d, 1),
        "nhd_packed": (page * hkv * 2 * d, hkv * 2 * d, 2 * d, 1),
    }

    def same(a, b):
        return all(x == y for x, y, n in zip(a, b, shape) if n != 1)

    for layout, strides in expected.items():
        if same(key_strides, strides) and same(value_strides, strides) and value_offset == d:
            return layout
    return "contiguous"


def strides_of(x):
    """(element strides, element offset) of a tensor (in its storage) or an array (its address
    in elements): two views of one buffer differ in offset by their distance."""
    if is_torch(x):
        return tuple(x.stride()), x.storage_offset()
    a = np.asarray(x)
    return tuple(s // a.itemsize for s in a.strides), a.__array_interface__["data"][0] // a.itemsize


def file_bytes(T, H, D, E, blocks, page, hkv, B, max_pages, dtype, with_output):
    """Bytes of the case file's tensors (the header adds under 2 KiB)."""
    floats = T * H * D + T * H * E + 2 * blocks * page * hkv * D + (T * H * D if with_output else 0)
    return floats * ITEM_SIZE[dtype] + 4 * (B * max_pages + 2 * B + 1)


def shape_key(args):
    """The shape RELATTN_CAPTURE_FIRST counts calls per."""
    q, key = args["q"], args["key_cache"]
    return (dtype_name(q), tuple(q.shape), tuple(key.shape[1:]), int(args["rel_extent"]),
            tuple(args["block_table"].shape), tuple(args["window_size"] or ()),
            int(args["max_seqlen_q"]))


# ---------------------------------------------------------------------------------------------
# Capture
# ---------------------------------------------------------------------------------------------

class Capture:
    """Selection, bounds and writing for one process."""

    def __init__(self, settings, vllm_version=None):
        self.settings = settings
        self.vllm_version = vllm_version or "unknown"
        self.selector = Selector(settings)
        self.files, self.bytes = 0, 0
        self.written = []
        self.lock = threading.Lock()
        self.warned = set()
        os.makedirs(settings.directory, exist_ok=True)

    def _warn_once(self, key, message):
        if key not in self.warned:
            self.warned.add(key)
            _log(message)

    def after_call(self, args, result):
        """One finished call of the op (`args`: its arguments by name, `result`: what it
        returned): write its case when a rule selects it. Returns the file written, or None."""
        if not _copyable(args):
            return None
        with self.lock:
            call, reasons = self.selector.next_call(shape_key(args))
            out = args.get("out")
            out = result if out is None else out
            if self.settings.nonfinite and out is not None and _nonfinite_rows(out, args["cu_seqlens_q"]):
                reasons.append("nonfinite_output")
            if not reasons:
                return None
            return self._write(call, reasons, args, out)

    def _write(self, call, reasons, args, out):
        if self.files >= self.settings.max_files:
            self._warn_once("files", f"{self.settings.max_files} files written: no more captures "
                            "(RELATTN_CAPTURE_MAX_FILES)")
            return None
        q, key, value = args["q"], args["key_cache"], args["value_cache"]
        dtype = dtype_name(q)
        T, H, D = (int(n) for n in q.shape)
        nb, page, hkv, _ = (int(n) for n in key.shape)
        E = int(args["rel_extent"])
        window_left = window_left_of(args["window_size"])
        seqused = to_numpy(args["cache_seqlens"], floats=False)
        cu = to_numpy(args["cu_seqlens_q"], floats=False)
        used, table = plan_blocks(to_numpy(args["block_table"], floats=False), seqused, cu, page,
                                  window_left)
        keep_output = self.settings.keep_output and out is not None
        size = file_bytes(T, H, D, E, 1 + len(used), page, hkv, len(seqused), table.shape[1],
                          dtype, keep_output)
        if self.bytes + size > self.settings.max_bytes:
            _log(f"call {call} not captured: its file takes {size} bytes, {self.bytes} of "
                 f"{self.settings.max_bytes} are written (RELATTN_CAPTURE_MAX_BYTES)")
            return None
        (ks, ko), (vs, vo) = strides_of(key), strides_of(value)
        layout = detect_layout((nb, page, hkv, D), ks, vs, vo - ko)
        arrays = {
            "q": to_numpy(q), "rel_logits": to_numpy(args["rel_logits"]),
            "key_cache": _with_filler(_take_blocks(key, used)),
            "value_cache": _with_filler(_take_blocks(value, used)),
            "block_table": table, "seqused_k": seqused, "cu_seqlens_q": cu,
        }
        params = {
            "softmax_scale": float(args["softmax_scale"]), "rel_extent": E,
            "window_left": window_left, "dtype": dtype, "cache_layout": layout,
            "causal": bool(args["causal"]),
        }
        meta = {
            "vllm_version": self.vllm_version, "capture_reason": "+".join(reasons),
            "capture_call": str(call), "capture_pid": str(os.getpid()),
            "op_window_size": str(tuple(args["window_size"] or ())),
            "op_max_seqlen_q": str(args["max_seqlen_q"]), "op_num_splits": str(args["num_splits"]),
            "op_page_size": str(page), "op_num_blocks": str(nb),
        }
        name = (f"{os.getpid()}-{call:06d}_{'+'.join(reasons)}_b{len(seqused)}_t{T}_h{H}kv{hkv}"
                f"_page{page}_{dtype.lower()}.safetensors")
        path = write_captured(os.path.join(self.settings.directory, name), arrays, params, meta,
                              to_numpy(out) if keep_output else None)
        self.files += 1
        self.bytes += os.path.getsize(path)
        self.written.append(path)
        return path


def _copyable(args):
    """Whether the call's tensors have data to copy: not fake (vLLM compiles kernels under
    FakeTensorMode), no CUDA graph being captured (a copy would break the capture) and no
    torch.compile tracing the call."""
    q = args.get("q")
    if not is_torch(q):
        return True
    try:
        import torch
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return False
        if getattr(torch, "compiler", None) is not None and torch.compiler.is_compiling():
            return False
        from torch._subclasses.fake_tensor import is_fake
        return not any(is_fake(args[k]) for k in ("q", "key_cache", "value_cache", "rel_logits"))
    except Exception:
        return True


def _nonfinite_rows(out, cu_seqlens_q):
    """Whether a real row (below cu_seqlens_q[B]) of the output holds a NaN or infinity."""
    rows = int(to_numpy(cu_seqlens_q, floats=False)[-1])
    if is_torch(out):
        import torch
        return not bool(torch.isfinite(out[:rows]).all())
    return not bool(np.isfinite(np.asarray(out, dtype=np.float32)[:rows]).all())


def _take_blocks(cache, used):
    """The cache's blocks `used` [n, page, Hkv, D], float32 on the CPU (gathered on the device
    first: only the pages read are copied)."""
    if is_torch(cache):
        import torch
        index = torch.as_tensor(np.asarray(used, dtype=np.int64), device=cache.device)
        return to_numpy(cache.index_select(0, index))
    return np.asarray(cache, dtype=np.float32)[np.asarray(used, dtype=np.int64)]


def _with_filler(blocks):
    """Block 0, all NaN, then `blocks`."""
    filler = np.full((1,) + blocks.shape[1:], np.nan, dtype=np.float32)
    return np.concatenate([filler, blocks.astype(np.float32)])


def write_captured(path, arrays, params, meta, out=None):
    """Write a case file from numpy arrays (q [T, H, D], key_cache / value_cache [blocks, page,
    Hkv, D], rel_logits [T, H, E] as float32 holding values of params["dtype"]; block_table,
    seqused_k, cu_seqlens_q as integers), the scalars of `params` (softmax_scale, rel_extent,
    window_left, dtype, cache_layout, causal) and extra string metadata `meta`; with `out`
    ([T, H, D]) also the tensor `captured_out`. Refuses (ValueError) what relattn's reader
    would: a non-causal call, or inputs it finds inconsistent."""
    if not params.get("causal", True):
        raise ValueError("the call was not causal: the operator (and a case file) is causal only")
    case = Case(q=arrays["q"], key_cache=arrays["key_cache"], value_cache=arrays["value_cache"],
                rel_logits=arrays["rel_logits"], block_table=arrays["block_table"],
                seqused_k=arrays["seqused_k"], cu_seqlens_q=arrays["cu_seqlens_q"],
                softmax_scale=params["softmax_scale"], rel_extent=params["rel_extent"],
                window_left=params["window_left"], dtype=params["dtype"],
                cache_layout=params.get("cache_layout", "contiguous"))
    extra = None if out is None else {"captured_out": np.asarray(out, dtype=np.float32)}
    write_case(path, case, extra_metadata=meta, extra_tensors=extra)
    return path


# ---------------------------------------------------------------------------------------------
# Installing the wrapper
# ---------------------------------------------------------------------------------------------

def wrap(function, capture):
    """`function` (the op) with capture after each call; its result is returned untouched and
    an exception of the op is raised as it is."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        signature = None

    def captured(*args, **kwargs):
        result = function(*args, **kwargs)
        try:
            if signature is None:
                raise TypeError("the op's signature cannot be read")
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            capture.after_call(dict(bound.arguments), result)
        except Exception as e:
            capture._warn_once(("error", type(e).__name__, str(e)),
                               f"a call was not captured: {type(e).__name__}: {e}")
        return result

    captured.__wrapped__ = function
    captured._relattn_capture = capture
    captured.__doc__ = function.__doc__
    return captured


def install(module=None, capture=None, vllm_version=None):
    """Wrap the op's `kernel` (on its class, so every caller sees the wrapper) and return the
    `Capture`; None, doing nothing, when RELATTN_CAPTURE_DIR is not set and no `capture` is
    given, or when the settings are malformed (logged). `module`: the op module (default:
    imported). Installing twice replaces the first wrapper."""
    if capture is None:
        try:
            settings = Settings.from_env()
        except ValueError as e:
            _log(f"not installed: {e}")
            return None
        if settings is None:
            return None
        capture = Capture(settings, vllm_version or _installed_vllm_version())
    if module is None:
        import importlib
        module = importlib.import_module(OP_MODULE)
    cls = getattr(module, OP_CLASS)
    current = inspect.getattr_static(cls, "kernel")
    descriptor = type(current) if isinstance(current, (staticmethod, classmethod)) else None
    function = current.__func__ if descriptor else current
    function = getattr(function, "__wrapped__", function) if hasattr(function, "_relattn_capture") else function
    wrapped = wrap(function, capture)
    setattr(cls, "kernel", descriptor(wrapped) if descriptor else wrapped)
    _log(f"installed on {cls.__module__}.{OP_CLASS}.kernel: writing to {capture.settings.directory}")
    return capture


def uninstall(module):
    """Put the op's own `kernel` back."""
    cls = getattr(module, OP_CLASS)
    current = inspect.getattr_static(cls, "kernel")
    descriptor = type(current) if isinstance(current, (staticmethod, classmethod)) else None
    function = current.__func__ if descriptor else current
    original = getattr(function, "__wrapped__", None)
    if original is not None and hasattr(function, "_relattn_capture"):
        setattr(cls, "kernel", descriptor(original) if descriptor else original)


def _installed_vllm_version():
    try:
        import importlib.metadata
        return importlib.metadata.version("vllm")
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def captured_output(path):
    """A captured file's `captured_out` as float32 [T, H, D] (the values exact), rows past
    cu_seqlens_q[B] (padding: what the op's buffer held there is not known) NaN; the number of
    real rows; and the dtype the op returned it in."""
    tensors, _ = read_safetensors(path)
    if "captured_out" not in tensors:
        raise ValueError(f"{path} has no tensor `captured_out` (captured with "
                         "RELATTN_CAPTURE_OUTPUT=0?)")
    out = tensor_floats(path, "captured_out", tensors["captured_out"])
    dtype = tensors["captured_out"][0]
    real = int(np.frombuffer(tensors["cu_seqlens_q"][2], dtype="<i4")[-1])
    if not 0 <= real <= out.shape[0]:
        raise ValueError(f"{path}: cu_seqlens_q ends at {real}, outside `captured_out`'s "
                         f"{out.shape[0]} rows")
    out[real:] = np.nan
    return out, real, dtype


def compare_outputs(captured, rerun, real):
    """How a rerun's output differs from the captured one over the real rows: None when every
    element has the same bits (or is NaN where the capture had NaN), else a sentence."""
    if rerun.shape != captured.shape:
        return f"shape {list(rerun.shape)}, captured {list(captured.shape)}"
    a = np.ascontiguousarray(captured[:real], dtype=np.float32)
    b = np.ascontiguousarray(rerun[:real], dtype=np.float32)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    # The same bits (so -0.0 is not 0.0), or NaN in both (whatever its payload).
    same = (a.view(np.uint32) == b.view(np.uint32)) | (nan_a & nan_b)
    if same.all():
        return None
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - b)[~same & ~nan_a & ~nan_b]
    worst = f", largest difference {float(diff.max()):.6g}" if diff.size else ""
    rows = int((~same).reshape(real, -1).any(axis=1).sum())
    return (f"{int((~same).sum())} of {same.size} elements differ in {rows} of {real} real rows"
            f"{worst}; NaN: {int(nan_a.sum())} captured, {int(nan_b.sum())} now")


def main(argv=None):
    parser = argparse.ArgumentParser(description="Captured case files: tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    output = sub.add_parser("output", help="write a captured file's `captured_out` as an output "
                            "file (tensor `out`) for `relattn judge`")
    output.add_argument("file")
    output.add_argument("--output", required=True)
    compare = sub.add_parser("compare", help="whether an output file (`relattn exec --output`) "
                             "is, over the real rows, the output the op gave at capture time "
                             "(exit 0: the same bits; 1: differs; 2: unreadable)")
    compare.add_argument("file")
    compare.add_argument("output")
    args = parser.parse_args(argv)
    try:
        out, real, dtype = captured_output(args.file)
        if args.command == "output":
            write_out(args.output, out)
            return 0
        # The op returns `dtype`: an output written in F32 is compared as the op would store it.
        rerun = round_to_dtype(read_out(args.output), dtype)
    except (OSError, ValueError, KeyError) as e:
        print(f"capture.py: {e}", file=sys.stderr)
        return 2
    why = compare_outputs(out, rerun, real)
    name = os.path.basename(args.file)
    if why is None:
        print(f"{name}: REPRODUCED: the same bits in all {real} real rows")
        return 0
    print(f"{name}: DIFFERS: {why}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
