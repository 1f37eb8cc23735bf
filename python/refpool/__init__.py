"""refpool for Python: caches, scopes, steps and plans over librefpool's C API, and adapters that make
refpool the GPU allocator of PyTorch (refpool.torch), CuPy (refpool.cupy) and Numba (refpool.numba).

Importing refpool loads no framework and not even the library: librefpool is loaded on first use,
from $REFPOOL_LIBRARY or the copy installed with this package. Control calls (caches, steps, stats)
go through ctypes; allocations made by a framework never run Python code (except Numba's plugin,
whose interface is Python).

    import refpool
    backend = refpool.Backend.host()
    cache = refpool.Cache()
    with cache.scope(plan="step"):
        buf = refpool.malloc(backend, (4, 4), "<f4")
"""
from . import allocator
from .backend import Backend
from .buffer import Buffer, malloc
from .cache import Cache, Scope, Step
from .errors import (BackendError, BackendUnavailableError, ConfigError, FrameworkError, InternalError,
                     InvalidArgumentError, InvalidHandleError, LibraryError, OutOfMemoryError, RefpoolError,
                     ScopeError, ShapeError, SizeError, UseAfterFreeError)
from .stats import StatsRecorder, stat_descriptions, stat_names
from ._library import library_path
from ._options import descriptions as cache_option_descriptions


def library_version():
    """The loaded librefpool's version string."""
    from ._library import lib
    return lib().version()


__all__ = [
    "Backend", "Buffer", "Cache", "Scope", "Step", "StatsRecorder", "allocator", "malloc",
    "cache_option_descriptions", "library_path", "library_version", "stat_descriptions", "stat_names",
    "RefpoolError", "BackendError", "BackendUnavailableError", "ConfigError", "FrameworkError", "InternalError",
    "InvalidArgumentError", "InvalidHandleError", "LibraryError", "OutOfMemoryError", "ScopeError", "ShapeError",
    "SizeError", "UseAfterFreeError",
]
