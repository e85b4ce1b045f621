"""relattn's case files (format v1) and output files: safetensors read and written with the
standard library and numpy only (PROTOCOL.md, "Case files").

  Case, read_case(path)   a case file: float32 arrays of the stored values, int32 indices
  write_case(path, case)  the inverse (tests and tools/capture.py build case files with it; extra
                          metadata and tensors beside the case's own, which readers ignore)
  write_out(path, array), read_out(path)   the output file: one F32 tensor `out` [T, H, D]
  round_to_dtype(values, dtype), read_safetensors, write_safetensors, tensor_floats

relattn_worker.py, the workers' library, re-exports every name here: workers import them from it.
"""

import json
import math
import mmap
import os
import stat
import struct
import tempfile

import numpy as np

FORMAT_VERSION = "1"
CACHE_LAYOUTS = ("contiguous", "nhd_packed", "hnd_packed")
# How an op is handed q, rel_logits and out (the case metadata `row_layout`; PROTOCOL.md).
ROW_LAYOUTS = ("padded", "strided", "exact")
FLOAT_DTYPES = ("BF16", "F16", "F32")


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


# A file at least this large is mapped (copy on write) instead of read: its pages are read as the
# tensors are used, once (a torch worker copies them to the GPU), and shared with the page cache
# or the memory file system instead of copied (seconds, and gigabytes of memory, for the 2**31
# cases). Smaller files are read.
MMAP_BYTES = 64 << 20


def read_safetensors(path):
    """Parse a safetensors file: returns ({name: (dtype, shape, raw bytes)}, metadata dict)."""
    # A writable buffer: torch can build tensors on its bytes without a copy or a warning.
    with open(path, "rb") as f:
        info = os.fstat(f.fileno())
        size = info.st_size
        if size >= MMAP_BYTES and stat.S_ISREG(info.st_mode):
            # relattn's own case files, read-only and never truncated while read.
            blob = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        elif size:
            blob = bytearray(size)
            del blob[f.readinto(blob):]   # a file that shrank while read: its bytes, in place
        else:   # a pipe or a file of unknown size
            blob = bytearray(f.read())
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

class Stored:
    """A float tensor as a case file stores it (BF16, F16 or F32): its dtype, shape and raw
    little-endian bytes, converted to float32 only when asked (`floats`)."""

    __slots__ = ("dtype", "shape", "raw")

    def __init__(self, dtype, shape, raw):
        self.dtype, self.shape, self.raw = dtype, tuple(shape), raw

    def floats(self):
        return tensor_floats("case", "tensor", (self.dtype, list(self.shape), self.raw))


FLOAT_TENSORS = ("q", "key_cache", "value_cache", "rel_logits")


def _float_tensor(name):
    """A property: the float tensor `name` as float32, converted from its stored bytes on first
    use (then kept: changes made to the array are what later readers see)."""
    def get(self):
        array = self._floats.get(name)
        if array is None:
            array = self._floats[name] = self._stored[name].floats()
            del self._stored[name]
        return array
    return property(get)


class Case:
    """One operator input (PROTOCOL.md, case files format v1).

    The float tensors are float32 arrays holding the stored values exactly (`dtype` says what
    was stored); the integer ones are int32. The caches are `[num_blocks, page_size, Hkv, D]`.
    A float tensor may be given as `Stored` (read_case does): it is converted when first read,
    and until then `stored(name)` gives its bytes (torch workers build device tensors on them,
    without a float32 copy).
    """

    q = _float_tensor("q")
    key_cache = _float_tensor("key_cache")
    value_cache = _float_tensor("value_cache")
    rel_logits = _float_tensor("rel_logits")

    def __init__(self, q, key_cache, value_cache, rel_logits, block_table, seqused_k,
                 cu_seqlens_q, softmax_scale, rel_extent=None, window_left=-1, dtype="BF16",
                 cache_layout="contiguous", case_id=None, seed=None, row_layout="padded"):
        self._floats, self._stored = {}, {}
        for name, value in zip(FLOAT_TENSORS, (q, key_cache, value_cache, rel_logits)):
            if isinstance(value, Stored):
                self._stored[name] = value
            else:
                self._floats[name] = np.asarray(value, dtype=np.float32)
        self.block_table = np.asarray(block_table, dtype=np.int32)
        self.seqused_k = np.asarray(seqused_k, dtype=np.int32)
        self.cu_seqlens_q = np.asarray(cu_seqlens_q, dtype=np.int32)
        self.softmax_scale = float(softmax_scale)
        self.rel_extent = int(self.shape_of("rel_logits")[2] if rel_extent is None else rel_extent)
        self.window_left = int(window_left)
        self.dtype = dtype
        self.cache_layout = cache_layout
        # How the ops get q, rel_logits and out (PROTOCOL.md, `row_layout`): torch_common.row_inputs.
        self.row_layout = row_layout
        self.case_id = case_id
        self.seed = seed

    def shape_of(self, name):
        """The shape of float tensor `name`, without converting it."""
        stored = self._stored.get(name)
        return stored.shape if stored is not None else self._floats[name].shape

    def stored(self, name):
        """Float tensor `name` as the file stored it (a `Stored`), while no float32 copy of it
        was made; else None."""
        return self._stored.get(name)

    # Sizes -----------------------------------------------------------------------------------
    T = property(lambda self: self.shape_of("q")[0])
    H = property(lambda self: self.shape_of("q")[1])
    D = property(lambda self: self.shape_of("q")[2])
    E = property(lambda self: self.rel_extent)
    Hkv = property(lambda self: self.shape_of("key_cache")[2])
    B = property(lambda self: self.seqused_k.shape[0])
    num_blocks = property(lambda self: self.shape_of("key_cache")[0])
    page_size = property(lambda self: self.shape_of("key_cache")[1])
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
        shape = self.shape_of
        shapes = {"q": (shape("q"), 3, "[T, H, D]"), "key_cache": (shape("key_cache"), 4, "[num_blocks, page_size, Hkv, D]"),
                  "value_cache": (shape("value_cache"), 4, "[num_blocks, page_size, Hkv, D]"),
                  "rel_logits": (shape("rel_logits"), 3, "[T, H, E]"), "block_table": (self.block_table.shape, 2, "[B, max_pages]"),
                  "seqused_k": (self.seqused_k.shape, 1, "[B]"), "cu_seqlens_q": (self.cu_seqlens_q.shape, 1, "[B + 1]")}
        for name, (dims_of, rank, dims) in shapes.items():
            if len(dims_of) != rank:
                raise ValueError(f"{where}: `{name}` has shape {list(dims_of)}, expected rank {rank} {dims}")
        T, H, D = shape("q")
        nb, page, hkv, kd = shape("key_cache")
        if tuple(shape("value_cache")) != tuple(shape("key_cache")):
            raise ValueError(f"{where}: `value_cache` has shape {list(shape('value_cache'))}, expected that of `key_cache` {list(shape('key_cache'))}")
        if kd != D:
            raise ValueError(f"{where}: cache head dim {kd} differs from q's {D}")
        if hkv < 1 or H % hkv:
            raise ValueError(f"{where}: {H} query heads are not a multiple of {hkv} KV heads")
        if page < 1 or nb < 1:
            raise ValueError(f"{where}: the cache needs at least one block of at least one slot")
        if tuple(shape("rel_logits")) != (T, H, self.rel_extent):
            raise ValueError(f"{where}: `rel_logits` has shape {list(shape('rel_logits'))}, expected [T, H, E] = {[T, H, self.rel_extent]}")
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
    floats = {name: Stored(*tensors[name]) for name in FLOAT_TENSORS}
    case = Case(**floats,
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
