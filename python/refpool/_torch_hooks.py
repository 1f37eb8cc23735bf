"""Builds and loads refpool's hooks for PyTorch (_torch_hooks*.cpp) and its memory-history library
(_torch_history.cpp) against the PyTorch in use.

The hooks must be compiled against PyTorch's headers (the graph-pool hooks take C++ types, and
torch.OutOfMemoryError comes only from a thrown c10::OutOfMemoryError), and refpool never depends on
PyTorch to build. So they are compiled here, at first use, with torch.utils.cpp_extension (a C++
compiler and ninja needed), into a folder named after the sources' and PyTorch's versions: later
processes load the library without compiling. $REFPOOL_TORCH_HOOKS_DIR chooses the parent folder
(default ~/.cache/refpool). The history library is built the same way when memory history is first
recorded; where it cannot be built, only history is lost. A build that failed says why (the
compiler's first errors; all of them in the build folder's build-failed.log) and is not tried again
until that folder is removed. docs/frameworks.md, "How the hooks are built"."""
import ctypes
import hashlib
import os
import threading
import warnings
from ctypes import POINTER, c_char_p, c_double, c_int, c_int64, c_size_t, c_uint, c_uint64, c_void_p
from pathlib import Path

from ._library import lib
from .errors import FrameworkError

NAME = "refpool_torch_hooks"
HERE = Path(__file__).parent
SOURCES = [HERE / name for name in ("_torch_hooks.cpp", "_torch_hooks_stats.cpp", "_torch_hooks_counters.cpp",
                                    "_torch_hooks_pools.cpp", "_torch_hooks_deferred.cpp")]
HEADERS = [HERE / "_torch_hooks.hpp", HERE / "_torch_hooks_counters.hpp"]
HISTORY_NAME = "refpool_torch_history"
HISTORY_SOURCES = [HERE / "_torch_history.cpp"]
DIR_ENV = "REFPOOL_TORCH_HOOKS_DIR"
# Built without PyTorch's CUDAPluggableAllocator.h where that header does not compile outside
# PyTorch (only compile-time checks of the hook types use it): a library of its own name, since
# torch.utils.cpp_extension renames a library rebuilt in one process with other flags (name_v1.so).
FALLBACK = ("_portable", ["-DREFPOOL_NO_PLUGGABLE_HEADER"])
# The compiler's lines a build error shows; all of them go to FAILED_LOG in the build folder.
ERROR_LINES = 12
FAILED_LOG = "build-failed.log"

# librefpool's functions the hooks call, in the order of _torch_hooks.cpp's refpool_api struct.
IMPORTS = ("refpool_allocator_alloc", "refpool_free", "refpool_last_error",
           "refpool_allocator_record_stream", "refpool_allocator_empty_cache", "refpool_allocator_set_device_limit",
           "refpool_allocator_begin_pool", "refpool_allocator_end_pool", "refpool_allocator_release_pool",
           "refpool_allocator_routing_to_pools", "refpool_allocator_pool_take", "refpool_allocator_caching")

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

# The C signatures of what Python calls in the two libraries: name -> (restype, argtypes).
HOOK_SIGNATURES = {
    "refpool_torch_hooks_bind": (c_int, [c_void_p, c_int]),
    "refpool_torch_hooks_set_tracker": (None, [c_void_p]),
    "refpool_torch_hooks_stat_count": (c_int, []),
    "refpool_torch_hooks_device_stats": (c_int, [c_int, POINTER(c_int64), c_int]),
    "refpool_torch_hooks_reset_peak_stats": (None, [c_int]),
    "refpool_torch_hooks_reset_accumulated_stats": (None, [c_int]),
    "refpool_torch_hooks_memory_fraction": (c_double, [c_int]),
    "refpool_torch_hooks_set_oom_observer": (None, [c_void_p]),
    "refpool_torch_hooks_pool_allocations": (c_int64, [POINTER(c_uint64), c_int64]),
    "refpool_torch_hooks_hold_pool": (c_int, [c_int, c_uint64, c_uint64]),
    "refpool_torch_hooks_set_installed": (None, []),
    "refpool_torch_hooks_restore": (c_int, [c_int, c_uint64, c_uint64, c_void_p, c_size_t, c_void_p, c_char_p,
                                            c_size_t]),
    "refpool_torch_hooks_storage_pointer": (c_void_p, [c_size_t]),
    "refpool_torch_hooks_adopt_storage": (c_int, [c_size_t, c_int, c_char_p, c_size_t]),
}
HISTORY_SIGNATURES = {
    "refpool_torch_history_tracker": (c_void_p, []),
    "refpool_torch_history_configure": (None, [c_int, c_int, c_size_t, c_uint, c_int]),
    "refpool_torch_history_set_metadata": (None, [c_char_p]),
    "refpool_torch_history_dump": (c_void_p, []),
    "refpool_torch_history_free": (None, [c_void_p]),
}

_lock = threading.Lock()
_loaded = None  # (path, ctypes.CDLL) of the hooks
_history = None  # the history library's CDLL, once built
_history_error = None  # why it could not be built


def build_directory(torch, name=NAME, files=None):
    """Where the library `name` for this PyTorch and these sources lives."""
    key = hashlib.sha256()
    for path in files if files is not None else SOURCES + HEADERS:
        key.update(path.read_bytes())
    key.update(f"{torch.__version__} {torch.version.cuda} {name}".encode())
    parent = Path(os.environ.get(DIR_ENV) or Path.home() / ".cache" / "refpool").expanduser()
    return parent / f"{name.replace('refpool_', '').replace('_', '-')}-{key.hexdigest()[:16]}"


def load(torch):
    """(path, CDLL) of the hooks library, compiled if needed and bound to the loaded librefpool.
    Raises FrameworkError saying why when it cannot be built."""
    global _loaded
    with _lock:
        if _loaded is None:
            path = build(torch)
            hooks = _declare(ctypes.CDLL(str(path)), HOOK_SIGNATURES)
            _bind(hooks)
            _loaded = (path, hooks)
    return _loaded


def loaded():
    """The hooks' CDLL if this process loaded them, else None."""
    return _loaded[1] if _loaded is not None else None


def load_history(torch):
    """The history library's CDLL, built if needed; None (with a warning saying why, once) where
    it cannot be built: the hooks work without it."""
    global _history, _history_error
    with _lock:
        if _history is None and _history_error is None:
            try:
                path = build_history(torch)
                _history = _declare(ctypes.CDLL(str(path)), HISTORY_SIGNATURES)
            except (FrameworkError, OSError) as e:
                _history_error = str(e)
                warnings.warn(f"refpool.torch: memory history is not available: {e}")
    return _history


def history_error():
    return _history_error


def build(torch):
    """The hooks library's path, compiled if needed, neither loaded nor bound (librefpool is not
    needed: bench/h200 builds it while librefpool builds). Raises FrameworkError as load()."""
    return _built(torch, NAME, SOURCES, SOURCES + HEADERS, fallback=FALLBACK)


def build_history(torch):
    """The memory-history library's path, compiled if needed, not loaded. Raises FrameworkError."""
    return _built(torch, HISTORY_NAME, HISTORY_SOURCES, HISTORY_SOURCES + HEADERS)


def _built(torch, name, sources, keyed, fallback=None):
    """The library's path in its build folder, compiled there first if needed. A build that failed
    is not tried again by later processes (each would spend the compiler's time to fail the same
    way): its errors are raised again until the folder is removed."""
    folder = build_directory(torch, name, keyed)
    attempts = [(name, [])] + ([(name + fallback[0], fallback[1])] if fallback else [])
    for library, _ in attempts:
        if (folder / f"{library}.so").is_file():
            return folder / f"{library}.so"
    failed = folder / FAILED_LOG
    if failed.is_file():
        raise _build_error(torch, name, folder, failed.read_text(errors="replace"), earlier=True)
    folder.mkdir(parents=True, exist_ok=True)
    outputs = []
    for i, (library, flags) in enumerate(attempts):
        try:
            path = Path(_compile(library, sources, folder, flags))
        except Exception as e:  # noqa: BLE001 (compiler missing, ninja missing, headers missing: all said below)
            outputs.append(f"== {library} {' '.join(flags)}: {type(e).__name__}\n{e}")
            if i + 1 < len(attempts):
                warnings.warn(f"{_build_error(torch, library, folder, str(e))}; retrying with "
                              f"{' '.join(attempts[i + 1][1])}")
            continue
        if not path.is_file():
            raise FrameworkError(f"refpool.torch: building {library} left no {path}")
        return path
    text = "\n".join(outputs)
    try:
        failed.write_text(text)
    except OSError:
        pass
    raise _build_error(torch, name, folder, text) from None


def _compile(name, sources, folder, flags):
    """Builds library `name` in `folder`; returns its path. No device query: cpp_extension asks the
    GPU for its architecture (which initialises CUDA, after which PyTorch refuses to swap its
    allocator) unless TORCH_CUDA_ARCH_LIST names one; these sources have no CUDA kernels, so any
    architecture does."""
    from torch.utils import cpp_extension
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
    try:
        built = cpp_extension.load(name=name, sources=[str(s) for s in sources], build_directory=str(folder),
                                   with_cuda=True, is_python_module=False, extra_cflags=["-O2", *flags], verbose=False)
        return built if isinstance(built, str) else folder / f"{name}.so"  # the path it built, renamed or not
    finally:
        if arch is None:
            del os.environ["TORCH_CUDA_ARCH_LIST"]
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = arch


def compiler_errors(text, limit=ERROR_LINES):
    """The first `limit` lines of a failed build's output that say what went wrong: the compiler's
    errors with the source line and caret that follow each, undefined references, and ninja's
    FAILED lines (not the long command lines); the first lines of `text` if it has none."""
    lines = text.splitlines()
    picked = {}  # line number -> line, in order
    for i, line in enumerate(lines):
        if "error:" in line or "undefined reference" in line or line.startswith("FAILED:"):
            for j in range(i, min(i + 3, len(lines)) if "error:" in line else i + 1):
                picked.setdefault(j, lines[j][:300])
    shown = list(picked.values()) or [line[:300] for line in lines if line.strip()]
    return "\n".join(shown[:limit])


def _build_error(torch, name, folder, text, earlier=False):
    log = folder / FAILED_LOG
    when = "could not be built earlier" if earlier else "cannot be built"
    return FrameworkError(
        f"refpool.torch: {name} {when} against torch {torch.__version__} in {folder}; the compiler said:\n"
        f"{compiler_errors(text)}\n"
        + (f"(all of it: {log}; remove {folder} to build again) " if log.is_file() else "")
        + "It needs a C++ compiler, ninja and the CUDA headers; refpool.torch.install(hooks=False) runs without "
        "the hooks (docs/frameworks.md says what is lost)")


def _declare(library, signatures):
    for name, (restype, argtypes) in signatures.items():
        function = getattr(library, name)
        function.restype, function.argtypes = restype, argtypes
    return library


def _bind(hooks):
    library = lib()
    addresses = (c_void_p * len(IMPORTS))(*[library.address(name) for name in IMPORTS])
    if hooks.refpool_torch_hooks_bind(addresses, len(IMPORTS)) != 0:
        raise FrameworkError("refpool.torch: the PyTorch hooks library expects other refpool functions than this "
                             f"package gives ({len(IMPORTS)}); remove {DIR_ENV} or ~/.cache/refpool and retry")


def address(hooks, name):
    return ctypes.cast(getattr(hooks, name), c_void_p).value


def set_hooks(pluggable, hooks):
    """Gives every hook to PyTorch's CUDAPluggableAllocator object (its `_allocator`)."""
    target = pluggable.allocator()
    missing = [setter for setter in SETTERS if not hasattr(target, setter)]
    if missing:
        raise FrameworkError(f"refpool.torch: this PyTorch's CUDAPluggableAllocator has no {', '.join(missing)} "
                             "(PyTorch 2.3 or newer has them all)")
    for setter, hook in SETTERS.items():
        getattr(target, setter)(address(hooks, hook))
