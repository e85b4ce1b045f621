"""What the torch-based workers (fa4_worker.py, flex_worker.py) share.

- `load_torch()`: import torch without letting a missing or broken install crash the worker.
- `DeviceCase`: a case's tensors on a device in the case dtype, with the K/V caches placed as a
  serving engine places them: by default vLLM's layout, one buffer `[num_blocks, Hkv, page, 2D]`
  per layer (HND) whose rows are K | V, with K and V its strided views
  `buf.transpose(1, 2).split(D, dim=-1)` of logical shape `[num_blocks, page, Hkv, D]`.
- `serving_block_table(case)`: the block table as vLLM fills it (entries past a request's pages 0).
- `kv_views(buf, layout, D)`: K and V as strided views of one packed buffer, numpy or torch: the
  one place the serving layouts are written down (the vllm worker uses them too).
- `case_tensor(...)`: a float tensor of the case on a device, from the bytes the case file
  stored when the case still has them (no float32 copy on the host: a 1M-key case's caches are
  gigabytes).
- `row_inputs(...)`, `row_out(...)`: q, rel_logits and out as the case's `row_layout` hands
  them to an op (padded: views of `[T]` buffers, as vLLM's Inkling layer passes them; strided: q
  a view of a fused q | k | v buffer, out a row slice of a longer buffer; exact: each its own
  allocation of exactly the real rows).
- `nan_out(...)`: the output buffer, poisoned with NaN before the call (the protocol's rule).
- `input_sets(...)` and `cuda_timed(...)`: timing with CUDA events, rotating a few copies of the
  inputs so the L2 cache never holds the inputs a timed call starts on (the rule of relattn's
  native bench: enough copies to exceed 4x the L2 together, 2 to 4, within half the free memory).

torch is imported lazily (`load_torch`), so this module imports with numpy alone.
"""

import sys

import numpy as np

# The layouts a case may ask for (PROTOCOL.md, `cache_layout`) and the one used when the worker
# is told to place the caches as vLLM does.
LAYOUTS = ("contiguous", "nhd_packed", "hnd_packed")
VLLM_LAYOUT = "hnd_packed"

# The strided row layout's out is a row slice of a buffer with this many rows past the case's T.
STRIDED_OUT_EXTRA_ROWS = 8

# Timing: rotate enough input copies to exceed L2_MULTIPLE x the L2 size, MIN_SETS to MAX_SETS.
L2_MULTIPLE, MIN_SETS, MAX_SETS = 4, 2, 4


def load_torch():
    """(torch module, None), or (None, "why not") when torch cannot be imported."""
    try:
        import torch
    except Exception as e:  # ImportError, or OSError from a broken CUDA library
        return None, f"torch cannot be imported: {type(e).__name__}: {e}"
    return torch, None


def torch_dtype(torch, name):
    """The torch dtype of a case dtype name ("BF16", "F16", "F32")."""
    return {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[name]


def cuda_device_info(torch, device="cuda"):
    """("NVIDIA H200", "9.0") for a usable CUDA device, else (None, None)."""
    try:
        if not torch.cuda.is_available():
            return None, None
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        major, minor = torch.cuda.get_device_capability(index)
        return torch.cuda.get_device_name(index), f"{major}.{minor}"
    except Exception:
        return None, None


def serving_block_table(case):
    """int32 [B, max_pages]: the case's table with entries past each request's pages set to 0,
    as vLLM's tables are (docs/operator.md section 2: those entries are don't-care, so the operator must not read
    them; a serving engine still keeps them valid block ids)."""
    table = np.array(case.block_table, dtype=np.int32, copy=True)
    pages = -(-case.seqused_k.astype(np.int64) // case.page_size)
    columns = np.arange(table.shape[1])[None, :]
    table[columns >= pages[:, None]] = 0
    return table


def packed_shape(layout, cache_shape):
    """The shape of one packed buffer of `layout` for caches of shape [num_blocks, page, Hkv, D]:
    hnd_packed [num_blocks, Hkv, page, 2D] (vLLM's), nhd_packed [num_blocks, page, Hkv, 2D]."""
    nb, page, hkv, d = cache_shape
    return (nb, hkv, page, 2 * d) if layout == "hnd_packed" else (nb, page, hkv, 2 * d)


def kv_views(buf, layout, head_dim):
    """K and V, each of logical shape [num_blocks, page, Hkv, D], as strided views of one packed
    buffer of `layout` whose rows are K(D) | V(D): for hnd_packed, vLLM's
    `buf.transpose(1, 2).split(D, dim=-1)`. numpy arrays and torch tensors alike."""
    t = buf.swapaxes(1, 2) if layout == "hnd_packed" else buf
    return t[..., :head_dim], t[..., head_dim:]


def paged_cache(torch, make_key, make_value, layout):
    """(buffer or None, K view, V view) with K, V of logical shape [num_blocks, page, Hkv, D].

    hnd_packed: one buffer [num_blocks, Hkv, page, 2D]; nhd_packed: [num_blocks, page, Hkv, 2D];
    contiguous: K and V are separate contiguous tensors (no shared buffer).
    `make_key`, `make_value`: each returns its tensor [num_blocks, page, Hkv, D] on the device.
    A packed buffer is filled one of them at a time, so the device holds the buffer and at most
    one of K and V beside it, never both.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"cache layout {layout!r} is not one of {LAYOUTS}")
    if layout == "contiguous":
        return None, make_key().contiguous(), make_value().contiguous()
    key = make_key()
    shape = packed_shape(layout, tuple(key.shape))
    buf = torch.empty(shape, dtype=key.dtype, device=key.device)
    k, v = kv_views(buf, layout, key.shape[-1])
    k.copy_(key)
    del key
    v.copy_(make_value())
    return buf, k, v


def device_floats(torch, array, device, dtype):
    """A float32 numpy array on `device` in `dtype`, in an allocation of its own."""
    host = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    return host.to(device=device, dtype=dtype)


# The torch workers build every float tensor with `case_tensor`: on the stored bytes of the case
# file, which `casefile.read_safetensors` maps when it is large, without a float32 copy. Their
# hello says so (`maps_case_files`), and relattn's memory ledger counts, for each of their
# processes that runs a case, the stored bytes rather than the floats.
MAPS_CASE_FILES = True


def case_tensor(torch, case, name, device, dtype, rows=None):
    """Float tensor `name` of `case` (its first `rows` rows when given) on `device` in `dtype`,
    in an allocation of its own: built on the bytes the case file stored while the case still
    holds them (`Case.stored`), else from the float32 array. The values are the same either
    way (stored values are exact in the case dtype)."""
    stored = case.stored(name)
    if stored is not None and len(stored.raw) and sys.byteorder == "little":
        host = torch.frombuffer(stored.raw, dtype=torch_dtype(torch, stored.dtype))
        host = host.reshape(stored.shape)
        if rows is not None:
            host = host[:rows]
        return host.to(device=device, dtype=dtype, copy=True)
    array = getattr(case, name)
    return device_floats(torch, array if rows is None else array[:rows], device, dtype)


def fused_rows(torch, q, fused_width):
    """q [T, H, D] copied into the first H*D columns of a NaN-filled [T, fused_width] buffer (a
    fused projection's rows): returns that view, of q's shape, with row stride fused_width."""
    t, h, d = q.shape
    buf = torch.full((t, fused_width), float("nan"), dtype=q.dtype, device=q.device)
    view = buf[:, :h * d].unflatten(1, (h, d))
    view.copy_(q)
    return view


def row_inputs(torch, case, device, dtype):
    """(q, rel_logits): their first R = cu_seqlens_q[B] rows, [R, H, D] and [R, H, E], as the
    case's row layout hands them to an op:

    padded   views of [T] buffers whose padding rows follow (vLLM's Inkling layer passes
             `q[:num_actual_tokens]` of `fused_qkvr_prep`'s own q buffer, and so rel_logits)
    strided  q a view of a fused q | k | v buffer [T, (H + 2 Hkv) D] (row stride (H + 2 Hkv) D,
             what splitting a fused projection gives); rel_logits as padded
    exact    each its own allocation of exactly R rows: a row read past the last real query is
             outside every allocation (compute-sanitizer's memcheck sees it)
    """
    rows = case.real_rows
    if case.row_layout == "exact":
        return (case_tensor(torch, case, "q", device, dtype, rows),
                case_tensor(torch, case, "rel_logits", device, dtype, rows))
    q = case_tensor(torch, case, "q", device, dtype)
    if case.row_layout == "strided":
        q = fused_rows(torch, q, (case.H + 2 * case.Hkv) * case.D)
    return q[:rows], case_tensor(torch, case, "rel_logits", device, dtype)[:rows]


def row_out(torch, case, device, dtype):
    """(out, read): the output an op writes, its first R rows [R, H, D], NaN before the call,
    laid out as the case's row layout says (padded: a view of a [T] buffer; strided: of a
    buffer with `STRIDED_OUT_EXTRA_ROWS` more; exact: R rows alone), and `read()`, which gives
    [T, H, D] float32 numpy: rows R.. as the op left the buffer, NaN where there is none."""
    t, rows = case.T, case.real_rows
    shape = (case.H, case.D)
    if case.row_layout == "exact":
        buf = torch.full((rows,) + shape, float("nan"), dtype=dtype, device=device)

        def read():
            host = np.full((t,) + shape, np.nan, dtype=np.float32)
            host[:rows] = out_to_numpy(buf)
            return host
        return buf, read
    extra = STRIDED_OUT_EXTRA_ROWS if case.row_layout == "strided" else 0
    buf = torch.full((t + extra,) + shape, float("nan"), dtype=dtype, device=device)
    return buf[:rows], lambda: out_to_numpy(buf[:t])


class DeviceCase:
    """A case's tensors on `device`, floats in the case dtype (exactly the stored values).

    q [R, H, D] and rel_logits [R, H, E], the real rows as the case's row layout gives them
    (`row_inputs`), key_cache / value_cache [num_blocks, page, Hkv, D] (views of `cache_buffer`
    unless the layout is contiguous), block_table (as `serving_block_table`), seqused_k [B] and
    cu_seqlens_q [B + 1] int32. Padding rows of q and rel_logits (in the padded and strided
    layouts) are copied as they are (NaN in tests): what the implementation is handed must not
    need them.
    """

    def __init__(self, torch, case, device, layout=VLLM_LAYOUT):
        dtype = torch_dtype(torch, case.dtype)

        def floats(name):
            return case_tensor(torch, case, name, device, dtype)

        def ints(array):
            return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int32)).to(device)

        self.layout = layout
        self.dtype = dtype
        self.device = torch.device(device)
        self.q, self.rel_logits = row_inputs(torch, case, device, dtype)
        self.cache_buffer, self.key_cache, self.value_cache = paged_cache(
            torch, lambda: floats("key_cache"), lambda: floats("value_cache"), layout)
        self.block_table = ints(serving_block_table(case))
        self.seqused_k = ints(case.seqused_k)
        self.cu_seqlens_q = ints(case.cu_seqlens_q)

    def nbytes(self):
        """Device bytes of the inputs a timed call reads (q, the cache, rel_logits)."""
        cache = (self.cache_buffer.numel() if self.cache_buffer is not None
                 else self.key_cache.numel() + self.value_cache.numel())
        return (self.q.numel() + cache + self.rel_logits.numel()) * self.q.element_size()


def nan_out(torch, case, device):
    """The output buffer [T, H, D] in the case dtype, every element NaN."""
    return torch.full((case.T, case.H, case.D), float("nan"), dtype=torch_dtype(torch, case.dtype),
                      device=device)


def out_to_numpy(out):
    """float32 numpy copy of a device output buffer."""
    return out.float().cpu().numpy()


def input_sets(torch, set_bytes, device):
    """How many copies of the inputs the timed calls rotate through (relattn's bench rule)."""
    props = torch.cuda.get_device_properties(device)
    l2 = int(getattr(props, "L2_cache_size", 50 << 20))
    free, _ = torch.cuda.mem_get_info(device)
    set_bytes = max(1, int(set_bytes))
    want = min(MAX_SETS, max(MIN_SETS, -(-L2_MULTIPLE * l2 // set_bytes)))
    return max(1, min(want, free // 2 // set_bytes))


def cuda_timed(torch, call, sets, warmup, reps):
    """Run call(s) for s = 0, 1, ... (mod sets): `warmup` untimed, then `reps` each between two
    CUDA events. Returns (the last call's result, [reps times in ms])."""
    result = None
    for n in range(warmup):
        result = call(n % sets)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for n in range(reps):
        starts[n].record()
        result = call((warmup + n) % sets)
        ends[n].record()
    torch.cuda.synchronize()
    return result, [s.elapsed_time(e) for s, e in zip(starts, ends)]
