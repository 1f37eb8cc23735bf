"""Builds and loads refpool's hooks for PyTorch (_torch_hooks.cpp) against the PyTorch in use.

The hooks must be compiled against PyTorch's headers (the graph-pool hooks take C++ types, and
torch.OutOfMemoryError comes only from a thrown c10::OutOfMemoryError), and refpool never depends on
PyTorch to build. So they are compiled here, at first use, with torch.utils.cpp_extension (a C++
compiler and ninja needed), into a folder named after the source's and PyTorch's versions: later
processes load the library without compiling. $REFPOOL_TORCH_HOOKS_DIR chooses the parent folder
(default ~/.cache/refpool). docs/frameworks.md, "How the hooks are built"."""
import ctypes
import hashlib
import os
import threading
import warnings
from pathlib import Path

from ._library import lib
from .errors import FrameworkError

NAME = "refpool_torch_hooks"
SOURCE = Path(__file__).with_name("_torch_hooks.cpp")
DIR_ENV = "REFPOOL_TORCH_HOOKS_DIR"

# librefpool's functions the hooks call, in the order of _torch_hooks.cpp's refpool_api struct.
IMPORTS = ("refpool_allocator_alloc", "refpool_free", "refpool_last_error",
           "refpool_allocator_record_stream", "refpool_allocator_empty_cache", "refpool_allocator_set_device_limit",
           "refpool_allocator_begin_pool", "refpool_allocator_end_pool", "refpool_allocator_release_pool",
           "refpool_allocator_routing_to_pools")

MALLOC, FREE = "refpool_torch_hooks_malloc", "refpool_torch_hooks_free"
# CUDAPluggableAllocator._allocator setter -> the hook it is given.
SETTERS = {
    "set_record_stream_fn": "refpool_torch_hooks_record_stream",
    "set_reset_fn": "refpool_torch_hooks_empty_cache",
    "set_memory_fraction_fn": "refpool_torch_hooks_set_memory_fraction",
    "set_begin_allocate_to_pool": "refpool_torch_hooks_begin_allocate_to_pool",
    "set_end_allocate_to_pool_fn": "refpool_torch_hooks_end_allocate_to_pool",
    "set_release_pool": "refpool_torch_hooks_release_pool",
}

_lock = threading.Lock()
_loaded = None  # (path, ctypes.CDLL)


def build_directory(torch):
    """Where the hooks for this PyTorch and this source live."""
    key = hashlib.sha256(SOURCE.read_bytes())
    key.update(f"{torch.__version__} {torch.version.cuda} {NAME}".encode())
    parent = Path(os.environ.get(DIR_ENV) or Path.home() / ".cache" / "refpool").expanduser()
    return parent / f"torch-hooks-{key.hexdigest()[:16]}"


def load(torch):
    """(path, CDLL) of the hooks library, compiled if needed and bound to the loaded librefpool.
    Raises FrameworkError saying why when it cannot be built."""
    global _loaded
    with _lock:
        if _loaded is None:
            path = _built(torch)
            hooks = ctypes.CDLL(str(path))
            _bind(hooks)
            _loaded = (path, hooks)
    return _loaded


def _built(torch):
    folder = build_directory(torch)
    path = folder / f"{NAME}.so"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    try:
        _compile(folder, [])
    except Exception as first:  # noqa: BLE001 (compiler missing, ninja missing, headers missing: all said below)
        # Without PyTorch's CUDAPluggableAllocator.h (only compile-time checks of the hook types use it).
        warnings.warn(f"refpool.torch: building the PyTorch hooks with CUDAPluggableAllocator.h failed ({first}); "
                      "retrying without it")
        try:
            _compile(folder, ["-DREFPOOL_NO_PLUGGABLE_HEADER"])
        except Exception as e:  # noqa: BLE001
            raise _build_error(torch, folder, e) from None
    if not path.is_file():
        raise FrameworkError(f"refpool.torch: building the PyTorch hooks left no {path}")
    return path


def _compile(folder, flags):
    from torch.utils import cpp_extension
    cpp_extension.load(name=NAME, sources=[str(SOURCE)], build_directory=str(folder), with_cuda=True,
                       is_python_module=False, extra_cflags=["-O2", *flags], verbose=False)


def _build_error(torch, folder, e):
    return FrameworkError(
        f"refpool.torch: cannot build refpool's PyTorch hooks ({SOURCE.name}) against torch {torch.__version__} "
        f"in {folder}: {e}. They need a C++ compiler, ninja and the CUDA headers; "
        "refpool.torch.install(hooks=False) runs without them (docs/frameworks.md says what is lost)")


def _bind(hooks):
    library = lib()
    addresses = (ctypes.c_void_p * len(IMPORTS))(*[library.address(name) for name in IMPORTS])
    hooks.refpool_torch_hooks_bind.argtypes = [ctypes.c_void_p, ctypes.c_int]
    hooks.refpool_torch_hooks_bind.restype = ctypes.c_int
    if hooks.refpool_torch_hooks_bind(addresses, len(IMPORTS)) != 0:
        raise FrameworkError("refpool.torch: the PyTorch hooks library expects other refpool functions than this "
                             f"package gives ({len(IMPORTS)}); remove {DIR_ENV} or ~/.cache/refpool and retry")


def address(hooks, name):
    return ctypes.cast(getattr(hooks, name), ctypes.c_void_p).value


def set_hooks(pluggable, hooks):
    """Gives every hook to PyTorch's CUDAPluggableAllocator object (its `_allocator`)."""
    target = pluggable.allocator()
    missing = [setter for setter in SETTERS if not hasattr(target, setter)]
    if missing:
        raise FrameworkError(f"refpool.torch: this PyTorch's CUDAPluggableAllocator has no {', '.join(missing)} "
                             "(PyTorch 2.3 or newer has them all)")
    for setter, hook in SETTERS.items():
        getattr(target, setter)(address(hooks, hook))
