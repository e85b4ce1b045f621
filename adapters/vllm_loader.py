"""Loads a vLLM op module without the rest of vLLM: the library of the workers that run vLLM's
ops (vllm_worker.py, triton_worker.py); tools/capture.py takes the op's module name from here.

From where (`load_op(root, source)`):

  * a tree: `RELATTN_VLLM_ROOT=<folder holding vllm/>`, an unpacked vLLM wheel (see
    tools/fetch_vllm.sh) or a clone of vLLM's repository (any branch or pull request: the op
    files are at the same place in the repository as in the wheel; its version is then
    `git describe`). The module is imported from there with small stand-ins in `sys.modules`
    for the vLLM modules the ops import (`vllm.platforms`, `vllm.distributed`,
    `vllm.model_executor.warmup.jit_warmup`, `vllm.utils.torch_utils`, `vllm.config`), bare
    packages for `vllm` and the folders above the op (their `__init__`s import half of vLLM),
    and bare packages for `vllm.vllm_flash_attn` and `vllm.third_party` (the former's
    `__init__` imports compiled FA2/FA3 binaries built for another torch), so that the NVIDIA
    op's lazy imports of `vllm.vllm_flash_attn.cute` and `vllm.third_party.tml_fa4` (pure CuTe
    DSL Python) work on a GPU machine. Without torch (routing needs none) a stand-in `torch` is
    present while the module is imported.
  * an installed vLLM otherwise: imported as it is; if that import fails, from the installed
    package's folder with the stand-ins above.

Which op: an `OpSource` (module name, file under the root, bare packages, extra stand-ins);
`NVIDIA_OP` (vLLM's Inkling FA4 op, the default) is defined here, a worker running another op
(triton_worker.py) defines its own with `stand_in_module` for its extra stand-ins.

Everything here imports with the standard library alone (and relattn_worker's `log`).
"""

import collections
import importlib
import importlib.machinery
import importlib.util
import os
import re
import subprocess
import sys
import types
import typing

from relattn_worker import log

OP_MODULE = "vllm.models.inkling.nvidia.ops.fa4_rel_attention"
OP_FILE = os.path.join("vllm", "models", "inkling", "nvidia", "ops", "fa4_rel_attention.py")
# Packages registered bare (no __init__ run) over the wheel's folders.
BARE_PACKAGES = ("vllm", "vllm.models", "vllm.models.inkling", "vllm.models.inkling.nvidia",
                 "vllm.models.inkling.nvidia.ops", "vllm.vllm_flash_attn", "vllm.third_party")


# ---------------------------------------------------------------------------------------------
# Stand-ins for the vLLM modules the op imports
# ---------------------------------------------------------------------------------------------

class DeviceCapability(collections.namedtuple("DeviceCapability", "major minor")):
    """vllm.platforms.interface.DeviceCapability: (major, minor) with vLLM's helpers."""

    def as_version_str(self):
        return f"{self.major}.{self.minor}"

    def to_int(self):
        return self.major * 10 + self.minor


def parse_capability(cc):
    """"9.0" -> DeviceCapability(9, 0); ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(cc))
    if not match:
        raise ValueError(f"capability {cc!r} is not MAJOR.MINOR")
    return DeviceCapability(int(match.group(1)), int(match.group(2)))


class StandInPlatform:
    """The part of vllm.platforms.current_platform the op uses. `mocked` (a DeviceCapability)
    answers get_device_capability(); without it the real device's capability (or None)."""

    device_name = "cuda"
    device_type = "cuda"

    def __init__(self, mocked=None):
        self.mocked = mocked

    def get_device_capability(self, device_id=0):
        if self.mocked is not None:
            return self.mocked
        torch = sys.modules.get("torch")
        if torch is None or getattr(torch, "_relattn_stand_in", False):
            return None
        try:
            if not torch.cuda.is_available():
                return None
            return DeviceCapability(*torch.cuda.get_device_capability(device_id))
        except Exception:
            return None

    def has_device_capability(self, capability, device_id=0):
        current = self.get_device_capability(device_id)
        if current is None:
            return False
        if isinstance(capability, tuple):
            return tuple(current) >= tuple(capability)
        return current.to_int() >= capability

    def is_device_capability(self, capability, device_id=0):
        current = self.get_device_capability(device_id)
        if current is None:
            return False
        if isinstance(capability, tuple):
            return tuple(current) == tuple(capability)
        return current.to_int() == capability

    def is_cuda(self):
        return True

    def is_rocm(self):
        return False


def canonicalize_singleton_dim_strides(t):
    """vllm.utils.torch_utils.canonicalize_singleton_dim_strides (same logic): give size-1
    dimensions their canonical stride, as vLLM does to the K/V views before the op."""
    if 1 not in tuple(t.shape):
        return t
    strides, shape = list(t.stride()), tuple(t.shape)
    prev, changed = 1, False
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == 1 and strides[i] != prev:
            strides[i], changed = prev, True
        prev = strides[i] * shape[i]
    return t.as_strided(shape, strides) if changed else t


CompileKeyT = typing.TypeVar("CompileKeyT")


class VllmJitKernel(typing.Generic[CompileKeyT]):
    """Stand-in of vllm.model_executor.warmup.jit_warmup.VllmJitKernel: no warm-up registry."""

    bind_launch_inputs = True

    def __init__(self):
        self._compiled_cache = {}

    def register_warmup(self):
        pass

    def _trace_dispatch(self, dispatch):
        raise NotImplementedError("JIT warm-up is not part of relattn's stand-ins")


def stand_in_module(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    module._relattn_stand_in = True
    return module


def bare_package(name, path):
    """A package whose __init__ is not run; submodules are found under `path`."""
    module = types.ModuleType(name)
    module.__path__ = [path] if path else []
    module.__package__ = name
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = module.__path__
    module.__spec__ = spec
    module._relattn_stand_in = True
    return module


def stand_in_modules(root, platform, bare_packages=BARE_PACKAGES):
    """{module name: stand-in} for loading an op from `root` (the folder holding vllm/):
    `bare_packages` registered without their __init__, the vLLM modules the ops import as
    stand-ins."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class WarmupIntRange:
        start: int
        stop: int
        step: int = 1
        advance: typing.Any = None

    @dataclasses.dataclass(frozen=True)
    class WarmupChoices:
        values: tuple

    def kv_cache_dtype_str_to_dtype(kv_cache_dtype, model_config=None):
        raise NotImplementedError("kv_cache_dtype_str_to_dtype is a relattn stand-in")

    modules = {name: bare_package(name, os.path.join(root, *name.split(".")))
               for name in bare_packages}
    modules.update({
        "vllm.platforms": stand_in_module(
            "vllm.platforms", current_platform=platform, DeviceCapability=DeviceCapability),
        "vllm.distributed": stand_in_module(
            "vllm.distributed", get_tensor_model_parallel_world_size=lambda: 1,
            get_tensor_model_parallel_rank=lambda: 0),
        "vllm.model_executor": bare_package("vllm.model_executor", None),
        "vllm.model_executor.warmup": bare_package("vllm.model_executor.warmup", None),
        "vllm.model_executor.warmup.jit_warmup": stand_in_module(
            "vllm.model_executor.warmup.jit_warmup", VllmJitKernel=VllmJitKernel,
            WarmupIntRange=WarmupIntRange, WarmupChoices=WarmupChoices,
            zip_inputs=lambda *rows: rows, kernel_launcher=lambda fn: fn),
        "vllm.utils": bare_package("vllm.utils", None),
        "vllm.utils.torch_utils": stand_in_module(
            "vllm.utils.torch_utils", kv_cache_dtype_str_to_dtype=kv_cache_dtype_str_to_dtype,
            canonicalize_singleton_dim_strides=canonicalize_singleton_dim_strides),
        "vllm.config": stand_in_module(
            "vllm.config", VllmConfig=type("VllmConfig", (), {}),
            get_current_vllm_config=lambda: None),
    })
    return modules


def torch_available():
    """Whether a real torch imports here (an installed one can fail with any exception, e.g. a
    CUDA build without its CUDA libraries)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return not getattr(torch, "_relattn_stand_in", False)
    try:
        import torch  # noqa: F401
        return True
    except Exception as e:
        log(f"vllm_worker: torch does not import ({type(e).__name__}: {e}); routing uses a stand-in")
        return False


def forget_vllm():
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


class OpSource(typing.NamedTuple):
    """Which op module a worker loads: its module name, its file under the root, the packages
    registered bare above it, and `extra(root, torch_is_real)`, more stand-ins (or None)."""
    module: str
    file: str
    bare_packages: tuple
    extra: typing.Any = None


NVIDIA_OP = OpSource(OP_MODULE, OP_FILE, BARE_PACKAGES)


def stand_in_torch():
    """What the ops need of torch to be imported without it (routing needs no torch): names in
    annotations, and `torch.no_grad()` as a decorator."""
    return stand_in_module("torch", Tensor=object, dtype=object,
                            no_grad=lambda: (lambda function: function))


def load_from_root(root, source=NVIDIA_OP):
    """Import `source`'s op module from `root`/vllm/... with the stand-ins; returns the module."""
    root = os.path.abspath(root)
    if not os.path.isfile(os.path.join(root, source.file)):
        raise ImportError(f"{os.path.join(root, source.file)} does not exist: RELATTN_VLLM_ROOT must "
                          "be the folder holding an unpacked vLLM wheel's vllm/ (adapters/tools/fetch_vllm.sh makes one)")
    forget_vllm()
    torch_is_real = torch_available()
    sys.modules.update(stand_in_modules(root, StandInPlatform(), source.bare_packages))
    if source.extra is not None:
        sys.modules.update(source.extra(root, torch_is_real))
    fake_torch = None
    if not torch_is_real:
        fake_torch = stand_in_torch()
        sys.modules["torch"] = fake_torch
    try:
        return importlib.import_module(source.module)
    finally:
        if fake_torch is not None and sys.modules.get("torch") is fake_torch:
            del sys.modules["torch"]


def is_source_checkout(root):
    """Whether `root` is a clone of vLLM's repository (its `.git`) rather than an unpacked wheel.
    The op's file is at the same place in both: vllm/models/inkling/nvidia/ops/."""
    return os.path.exists(os.path.join(root, ".git"))


def git_describe(root):
    """`git describe --tags --always --dirty` of a source checkout at `root`, or None."""
    try:
        done = subprocess.run(["git", "-C", root, "describe", "--tags", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    described = done.stdout.strip()
    return f"git {described}" if done.returncode == 0 and described else None


def root_version(root):
    """The version of the vLLM under `root` (vllm/_version.py or its dist-info, which a build
    writes; in a source checkout that was never built, `git describe`), or None."""
    try:
        with open(os.path.join(root, "vllm", "_version.py"), encoding="utf-8") as f:
            match = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", f.read())
            if match:
                return match.group(1)
    except OSError:
        pass
    for entry in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        match = re.fullmatch(r"vllm-(.+)\.dist-info", entry)
        if match:
            return match.group(1)
    return git_describe(root) if is_source_checkout(root) else None


class OpModule:
    """The loaded op module and how it was loaded (`error` set when it could not be)."""

    def __init__(self, module=None, how="", version=None, error=None):
        self.module, self.how, self.version, self.error = module, how, version, error


def load_op(root=None, source=NVIDIA_OP):
    """Load `source`'s op: from `root` (or RELATTN_VLLM_ROOT) with stand-ins, else the installed
    vLLM."""
    root = root or os.environ.get("RELATTN_VLLM_ROOT")
    if root:
        try:
            kind = "source checkout" if is_source_checkout(root) else "unpacked wheel"
            return OpModule(load_from_root(root, source),
                            f"{kind} at {os.path.abspath(root)}, stand-ins", root_version(root))
        except Exception as e:
            return OpModule(error=f"cannot load {source.module} from {root}: {type(e).__name__}: {e}")
    try:
        spec = importlib.util.find_spec("vllm")
    except Exception as e:
        spec, find_error = None, e
    else:
        find_error = None
    if spec is None or not spec.submodule_search_locations:
        why = f" ({find_error})" if find_error else ""
        return OpModule(error=f"vLLM is not installed{why} and RELATTN_VLLM_ROOT is not set "
                        "(adapters/tools/fetch_vllm.sh DEST fetches the pinned wheel's op; then RELATTN_VLLM_ROOT=DEST)")
    installed_root = os.path.dirname(list(spec.submodule_search_locations)[0])
    try:
        import importlib.metadata as metadata
        version = metadata.version("vllm")
    except Exception:
        version = root_version(installed_root)
    try:
        return OpModule(importlib.import_module(source.module), "installed vLLM", version)
    except Exception as first:
        log(f"importing the installed vLLM's {source.module} failed ({type(first).__name__}: {first}); "
            "retrying from its files with stand-ins")
        try:
            return OpModule(load_from_root(installed_root, source),
                            f"installed vLLM files at {installed_root}, stand-ins", version)
        except Exception as e:
            return OpModule(error=f"cannot import {source.module}: {type(first).__name__}: {first}; "
                            f"with stand-ins: {type(e).__name__}: {e}")
