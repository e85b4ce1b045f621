"""Shared library of relattn's Python workers (protocol v1, see PROTOCOL.md beside this file).

A worker is a subclass of `Worker` whose `run` returns the operator's output for a case and
whose `route` (optional) answers a routing question; `serve(worker)` speaks the protocol on
stdin/stdout. This module also reads and writes the safetensors case files (format v1) with the
standard library and numpy only, and holds the numpy reference `attention_numpy`.

  Unsupported             raise it in run/route: the answer is status "unsupported"
  Case, read_case(path)   a case file: float32 arrays of the stored values, int32 indices
  write_case(path, case)  the inverse (tests and tools/capture.py build case files with it; extra
                          metadata and tensors beside the case's own, which readers ignore)
  write_out(path, array)  the output file: one F32 tensor `out` [T, H, D], atomically replaced
  Worker                  name, version, paths, split_paths, device, capability; run, route;
                          set_unavailable(why, log_as) at start with @unsupported_when_unavailable
                          on run: every run answers unsupported with why
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
import math
import os
import struct
import sys
import tempfile
import time
import traceback

import numpy as np

PROTOCOL_VERSION = 1
FORMAT_VERSION = "1"
CACHE_LAYOUTS = ("contiguous", "nhd_packed", "hnd_packed")
# How an op is handed q, rel_logits and out (the case metadata `row_layout`; PROTOCOL.md).
ROW_LAYOUTS = ("padded", "strided", "exact")
FLOAT_DTYPES = ("BF16", "F16", "F32")


class Unsupported(Exception):
    """Raised by a worker's run or route: the answer is status "unsupported" with this text."""


class NoAnswer(Exception):
    """Raised by a (test-only) worker that has already written whatever it wanted on the
    protocol stream: serve sends no answer to this request."""


def log(*parts):
    """Free text for relattn's stderr tail (stdout is the protocol's)."""
    print(*parts, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# safetensors, standard library + numpy
# ---------------------------------------------------------------------------------------------

_INT_DTYPES = {"I32": np.int32, "I64": np.int64, "U8": np.uint8, "I8": np.int8,
               "I16": np.int16, "U16": np.uint16, "U32": np.uint32, "F64": np.float64}
_ITEM_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I32": 4, "I64": 8, "U8": 1, "I8": 1,
              "I16": 2, "U16": 2, "U32": 4, "BOOL": 1}


def bf16_bits_to_f32(bits):
    """uint16 bf16 bit patterns -> float32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(values):
    """float32 values -> uint16 bf16 bit patterns, rounded to nearest even (NaN stays NaN)."""
    x = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (x + np.uint32(0x7FFF) + ((x >> 16) & np.uint32(1))) >> 16
    nan = np.isnan(values)
    rounded = np.where(nan, (x >> 16) | np.uint32(0x0040), rounded)
    return rounded.astype(np.uint16)


def round_to_dtype(values, dtype):
    """float32 array of the values `dtype` can hold nearest to `values` (as a kernel would store)."""
    values = np.asarray(values, dtype=np.float32)
    if dtype == "BF16":
        return bf16_bits_to_f32(f32_to_bf16_bits(values))
    if dtype == "F16":
        return values.astype(np.float16).astype(np.float32)
    if dtype == "F32":
        return values.copy()
    raise ValueError(f"unknown dtype {dtype!r}, expected one of {FLOAT_DTYPES}")


def read_safetensors(path):
    """Parse a safetensors file: returns ({name: (dtype, shape, raw bytes)}, metadata dict)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: not a safetensors file: {len(blob)} bytes, shorter than its header length")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > len(blob) - 8:
        raise ValueError(f"{path}: not a safetensors file: header length {header_len} past the end of the file ({len(blob)} bytes)")
    try:
        header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a safetensors file: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file: header is not a JSON object")
    data = memoryview(blob)[8 + header_len:]
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{path}: __metadata__ must map names to strings")
    tensors = {}
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: tensor `{name}`: entry needs dtype, shape and data_offsets") from None
        if dtype not in _ITEM_SIZE:
            raise ValueError(f"{path}: tensor `{name}` has unknown dtype {dtype}")
        count = math.prod(shape)
        if not (0 <= begin <= end <= len(data)) or end - begin != count * _ITEM_SIZE[dtype]:
            raise ValueError(f"{path}: tensor `{name}`: data_offsets [{begin}, {end}] do not hold "
                             f"{dtype} {shape} inside the {len(data)} data bytes")
        tensors[name] = (dtype, shape, data[begin:end])
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None):
    """Write {name: (dtype, numpy array already of that dtype's storage type)} atomically."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, (dtype, array) in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(head)))
            f.write(head)
            for raw in chunks:
                f.write(raw)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def tensor_floats(path, name, entry):
    """A tensor of `read_safetensors` (BF16, F16 or F32) as a new float32 array, values exact."""
    dtype, shape, raw = entry
    if dtype == "BF16":
        return bf16_bits_to_f32(np.frombuffer(raw, dtype="<u2")).reshape(shape)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(shape)
    raise ValueError(f"{path}: tensor `{name}` has dtype {dtype}, expected BF16, F16 or F32")


def _encode_floats(values, dtype):
    if dtype == "BF16":
        return f32_to_bf16_bits(values).astype("<u2")
    if dtype == "F16":
        return np.asarray(values, dtype=np.float32).astype("<f2")
    if dtype == "F32":
        return np.asarray(values, dtype="<f4")
    raise ValueError(f"unknown dtype {dtype!r}, expected one of {FLOAT_DTYPES}")


# ---------------------------------------------------------------------------------------------
# Case
# ---------------------------------------------------------------------------------------------

class Case:
    """One operator input (PROTOCOL.md, case files format v1).

    The float tensors are float32 arrays holding the stored values exactly (`dtype` says what
    was stored); the integer ones are int32. The caches are `[num_blocks, page_size, Hkv, D]`.
    """

    def __init__(self, q, key_cache, value_cache, rel_logits, block_table, seqused_k,
                 cu_seqlens_q, softmax_scale, rel_extent=None, window_left=-1, dtype="BF16",
                 cache_layout="contiguous", case_id=None, seed=None, row_layout="padded"):
        self.q = np.asarray(q, dtype=np.float32)
        self.key_cache = np.asarray(key_cache, dtype=np.float32)
        self.value_cache = np.asarray(value_cache, dtype=np.float32)
        self.rel_logits = np.asarray(rel_logits, dtype=np.float32)
        self.block_table = np.asarray(block_table, dtype=np.int32)
        self.seqused_k = np.asarray(seqused_k, dtype=np.int32)
        self.cu_seqlens_q = np.asarray(cu_seqlens_q, dtype=np.int32)
        self.softmax_scale = float(softmax_scale)
        self.rel_extent = int(self.rel_logits.shape[2] if rel_extent is None else rel_extent)
        self.window_left = int(window_left)
        self.dtype = dtype
        self.cache_layout = cache_layout
        # How the ops get q, rel_logits and out (PROTOCOL.md, `row_layout`): torch_common.row_inputs.
        self.row_layout = row_layout
        self.case_id = case_id
        self.seed = seed

    # Sizes -----------------------------------------------------------------------------------
    T = property(lambda self: self.q.shape[0])
    H = property(lambda self: self.q.shape[1])
    D = property(lambda self: self.q.shape[2])
    E = property(lambda self: self.rel_extent)
    Hkv = property(lambda self: self.key_cache.shape[2])
    B = property(lambda self: self.seqused_k.shape[0])
    num_blocks = property(lambda self: self.key_cache.shape[0])
    page_size = property(lambda self: self.key_cache.shape[1])
    real_rows = property(lambda self: int(self.cu_seqlens_q[self.B]))
    is_local = property(lambda self: self.window_left >= 0)

    @property
    def query_lens(self):
        """Lq_b per request (int64 array)."""
        return np.diff(self.cu_seqlens_q.astype(np.int64))

    @property
    def max_query_len(self):
        return int(self.query_lens.max()) if self.B else 0

    @property
    def max_kv_len(self):
        return int(self.seqused_k.max()) if self.B else 0

    def validate(self, where="case"):
        """Raise ValueError naming what is inconsistent (the checks relattn's reader makes)."""
        if self.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{where}: dtype {self.dtype!r} is not one of {FLOAT_DTYPES}")
        if self.cache_layout not in CACHE_LAYOUTS:
            raise ValueError(f"{where}: cache_layout {self.cache_layout!r} is not one of {CACHE_LAYOUTS}")
        if self.row_layout not in ROW_LAYOUTS:
            raise ValueError(f"{where}: row_layout {self.row_layout!r} is not one of {ROW_LAYOUTS}")
        shapes = {"q": (self.q, 3, "[T, H, D]"), "key_cache": (self.key_cache, 4, "[num_blocks, page_size, Hkv, D]"),
                  "value_cache": (self.value_cache, 4, "[num_blocks, page_size, Hkv, D]"),
                  "rel_logits": (self.rel_logits, 3, "[T, H, E]"), "block_table": (self.block_table, 2, "[B, max_pages]"),
                  "seqused_k": (self.seqused_k, 1, "[B]"), "cu_seqlens_q": (self.cu_seqlens_q, 1, "[B + 1]")}
        for name, (array, rank, dims) in shapes.items():
            if array.ndim != rank:
                raise ValueError(f"{where}: `{name}` has shape {list(array.shape)}, expected rank {rank} {dims}")
        T, H, D = self.q.shape
        nb, page, hkv, kd = self.key_cache.shape
        if self.value_cache.shape != self.key_cache.shape:
            raise ValueError(f"{where}: `value_cache` has shape {list(self.value_cache.shape)}, expected that of `key_cache` {list(self.key_cache.shape)}")
        if kd != D:
            raise ValueError(f"{where}: cache head dim {kd} differs from q's {D}")
        if hkv < 1 or H % hkv:
            raise ValueError(f"{where}: {H} query heads are not a multiple of {hkv} KV heads")
        if page < 1 or nb < 1:
            raise ValueError(f"{where}: the cache needs at least one block of at least one slot")
        if self.rel_logits.shape != (T, H, self.rel_extent):
            raise ValueError(f"{where}: `rel_logits` has shape {list(self.rel_logits.shape)}, expected [T, H, E] = {[T, H, self.rel_extent]}")
        if self.rel_extent < 1:
            raise ValueError(f"{where}: rel_extent must be at least 1")
        if self.window_left < -1:
            raise ValueError(f"{where}: window_left {self.window_left} must be -1 (none) or >= 0")
        B = self.seqused_k.shape[0]
        cu = self.cu_seqlens_q.astype(np.int64)
        if cu.shape[0] != B + 1:
            raise ValueError(f"{where}: `cu_seqlens_q` has {cu.shape[0]} entries, expected B + 1 = {B + 1}")
        if self.block_table.shape[0] != B:
            raise ValueError(f"{where}: `block_table` has {self.block_table.shape[0]} rows, expected B = {B}")
        if cu[0] != 0 or np.any(np.diff(cu) < 0) or cu[-1] > T:
            raise ValueError(f"{where}: `cu_seqlens_q` {cu.tolist()} must start at 0, not decrease and end <= T = {T}")
        max_pages = self.block_table.shape[1]
        for b in range(B):
            lq, lk = int(cu[b + 1] - cu[b]), int(self.seqused_k[b])
            if lk < lq:
                raise ValueError(f"{where}: request {b}: seqused_k {lk} < its {lq} new queries")
            pages = -(-lk // page)
            if pages > max_pages:
                raise ValueError(f"{where}: request {b}: {lk} keys need {pages} pages, block_table has {max_pages}")
            used = self.block_table[b, :pages]
            if pages and (used.min() < 0 or used.max() >= nb):
                raise ValueError(f"{where}: request {b}: block_table entries {used.tolist()} outside [0, {nb})")

    def request_keys(self, b, first=0):
        """(K, V) of request b for keys [first, Lk): float32 [n, Hkv, D], gathered through the table."""
        lk, page = int(self.seqused_k[b]), self.page_size
        if first >= lk:
            empty = np.zeros((0, self.Hkv, self.D), np.float32)
            return empty, empty
        p0, p1 = first // page, -(-lk // page)
        blocks = self.block_table[b, p0:p1]
        lo, hi = first - p0 * page, lk - p0 * page
        k = self.key_cache[blocks].reshape(-1, self.Hkv, self.D)[lo:hi]
        v = self.value_cache[blocks].reshape(-1, self.Hkv, self.D)[lo:hi]
        return k, v


def read_case(path):
    """Read and validate a case file (format v1). Raises ValueError with what is wrong."""
    tensors, meta = read_safetensors(path)
    version = meta.get("format_version", FORMAT_VERSION)
    if version.strip() != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {version!r} is not supported (this worker reads {FORMAT_VERSION})")

    def need_meta(key):
        if key not in meta:
            raise ValueError(f"{path}: metadata key `{key}` is missing")
        return meta[key].strip()

    def parse(key, convert, expected):
        value = need_meta(key)
        try:
            return convert(value)
        except ValueError:
            raise ValueError(f"{path}: metadata `{key}` = {value!r} is invalid, expected {expected}") from None

    if need_meta("causal") != "true":
        raise ValueError(f"{path}: metadata `causal` = {meta['causal']!r}, expected \"true\" (the operator is causal only)")
    scale = parse("softmax_scale", float, "a decimal number")
    extent = parse("rel_extent", int, "a non-negative integer")
    window = parse("window_left", int, "an integer (-1 = no window)")
    layout = meta.get("cache_layout", "contiguous").strip()
    row_layout = meta.get("row_layout", "padded").strip()
    seed = meta.get("seed")
    if seed is not None:
        try:
            seed = int(seed)
        except ValueError:
            raise ValueError(f"{path}: metadata `seed` = {seed!r} is invalid, expected an unsigned integer") from None

    for name in ("q", "key_cache", "value_cache", "rel_logits", "block_table", "seqused_k", "cu_seqlens_q"):
        if name not in tensors:
            raise ValueError(f"{path}: missing tensor `{name}`")
    dtype = tensors["q"][0]
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{path}: tensor `q` has dtype {dtype}, expected BF16, F16 or F32")
    for name in ("key_cache", "value_cache", "rel_logits"):
        if tensors[name][0] != dtype:
            raise ValueError(f"{path}: tensor `{name}` has dtype {tensors[name][0]}, expected {dtype} (that of `q`)")
    ints = {}
    for name in ("block_table", "seqused_k", "cu_seqlens_q"):
        kind, shape, raw = tensors[name]
        if kind != "I32":
            raise ValueError(f"{path}: tensor `{name}` has dtype {kind}, expected I32")
        ints[name] = np.frombuffer(raw, dtype="<i4").astype(np.int32).reshape(shape)
    case = Case(q=tensor_floats(path, "q", tensors["q"]),
                key_cache=tensor_floats(path, "key_cache", tensors["key_cache"]),
                value_cache=tensor_floats(path, "value_cache", tensors["value_cache"]),
                rel_logits=tensor_floats(path, "rel_logits", tensors["rel_logits"]),
                softmax_scale=scale, rel_extent=extent, window_left=window, dtype=dtype,
                cache_layout=layout, case_id=meta.get("case_id"), seed=seed,
                row_layout=row_layout, **ints)
    case.validate(where=str(path))
    return case


def write_case(path, case, extra_metadata=None, extra_tensors=None):
    """Write `case` as a case file (format v1); the float tensors are stored in `case.dtype`.
    `extra_metadata` ({name: text}) and `extra_tensors` ({name: float array}, stored in the case
    dtype) are written beside the case's own; readers of the format ignore them."""
    case.validate(where=str(path))
    named = {name: getattr(case, name) for name in ("q", "key_cache", "value_cache", "rel_logits")}
    for name, array in (extra_tensors or {}).items():
        if name in named or name in ("block_table", "seqused_k", "cu_seqlens_q"):
            raise ValueError(f"extra tensor `{name}` would replace the case's own")
        named[name] = array
    floats = {name: (case.dtype, _encode_floats(array, case.dtype)) for name, array in named.items()}
    ints = {name: ("I32", np.asarray(getattr(case, name), dtype="<i4"))
            for name in ("block_table", "seqused_k", "cu_seqlens_q")}
    meta = {"format_version": FORMAT_VERSION, "softmax_scale": repr(float(case.softmax_scale)),
            "rel_extent": str(case.rel_extent), "window_left": str(case.window_left),
            "causal": "true", "cache_layout": case.cache_layout}
    if case.row_layout != "padded":
        meta["row_layout"] = case.row_layout
    if case.case_id is not None:
        meta["case_id"] = str(case.case_id)
    if case.seed is not None:
        meta["seed"] = str(case.seed)
    for key, value in (extra_metadata or {}).items():
        if key in meta:
            raise ValueError(f"extra metadata `{key}` would replace the case's own")
        meta[key] = str(value)
    write_safetensors(path, {**floats, **ints}, meta)


def write_out(path, array):
    """Write the output file: one F32 tensor `out` with the shape of `array` ([T, H, D])."""
    write_safetensors(path, {"out": ("F32", np.asarray(array, dtype="<f4"))})


def read_out(path):
    """Read an output file back (float32 array of `out`)."""
    tensors, _ = read_safetensors(path)
    if "out" not in tensors:
        raise ValueError(f"{path}: missing tensor `out`")
    return tensor_floats(path, "out", tensors["out"])


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

    def run(self, case, path, num_splits, timing):
        """Return (out float32 [T, H, D], num_splits used, ms list or None).

        `num_splits` is None (the implementation's policy) or a forced count; `timing` is None or
        {"warmup": W, "reps": R}. Raise Unsupported when this case or path cannot be run here.
        """
        raise NotImplementedError

    def route(self, cc, shape):
        """Return {"path", "rejected", "reason", "num_splits"} for capability `cc` ("9.0")."""
        raise Unsupported("this worker has no routing")

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
    if ms is not None:
        ms = [float(x) for x in ms]
    answer = {"ok": True, "id": rid, "num_splits": int(used), "ms": ms}
    if compiled > 0:
        answer["jit"] = {"compiled": compiled, "seconds": round(time.monotonic() - started, 3)}
    return answer


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
        if isinstance(line, bytes):
            line = line.decode("utf-8", errors="replace")
        if not line.strip():
            continue
        request = None
        try:
            request = json.loads(line)
            answer = handle(worker, request)
            if answer is None:      # bye
                break
        except NoAnswer:
            continue
        except Unsupported as e:
            answer = {"ok": False, "status": "unsupported", "message": str(e) or type(e).__name__}
        except (json.JSONDecodeError, BadRequest) as e:
            answer = {"ok": False, "status": "error", "message": f"bad request: {e}"}
        except Exception as e:  # the implementation raised: the trial is an error
            traceback.print_exc(file=sys.stderr)
            answer = {"ok": False, "status": "error", "message": f"{type(e).__name__}: {e}"}
        if isinstance(request, dict) and "id" in request:
            answer.setdefault("id", request["id"])
            # keep "ok" first for readers of the raw lines
            answer = {"ok": answer.pop("ok"), **answer}
        _answer(out, answer)
    sys.stderr.flush()
    out.flush()
    sys.exit(0)
