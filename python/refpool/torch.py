"""refpool as PyTorch's CUDA allocator, through torch.cuda.memory.CUDAPluggableAllocator.

    import refpool.torch
    refpool.torch.install()            # right after `import torch`, before any CUDA tensor
    for batch in data:
        with refpool.torch.step(plan="train"):   # forward, backward (autograd's thread), optimizer
            ...

PyTorch calls refpool's hooks directly: no Python runs per allocation. The hooks (_torch_hooks*.cpp,
built against the PyTorch in use at first install) also give PyTorch what its hook interface can
carry: CUDA graph private pools (torch.cuda.graph, make_graphed_callables), Tensor.record_stream,
torch.OutOfMemoryError, empty_cache and set_per_process_memory_fraction, and they count what
PyTorch's allocator reports. install() serves the memory functions the interface cannot
(memory_stats, memory history and snapshots, out-of-memory observers, CUDA graph trees' pool calls:
see _torch_memory_api). Without install(), mem_pool() gives refpool to chosen regions through
torch.cuda.MemPool. PyTorch is imported when a function here is first called, never by
`import refpool.torch`."""
import threading

from . import _torch_hooks, _torch_snapshot, _torch_stats, allocator
from ._library import lib
from ._torch_stats import (LOST_FEATURES, empty_cache, max_memory_allocated, max_memory_reserved, memory_allocated,
                           memory_reserved, memory_stats, reset_accumulated_memory_stats, reset_peak_memory_stats)
from .errors import FrameworkError

_lock = threading.Lock()
_pluggable = None  # the installed torch.cuda.memory.CUDAPluggableAllocator (kept alive)
_hooked = False  # whether install() gave PyTorch refpool's hooks
_replacements = None  # what install() put into torch (_torch_memory_api.Replacements)
_pool_allocator = None  # the CUDAPluggableAllocator behind mem_pool()'s pools (kept alive)


def _torch():
    try:
        import torch
    except ImportError as e:
        raise FrameworkError(f"refpool.torch needs PyTorch, which cannot be imported here: {e}") from None
    return torch


def installed():
    """True once install() made refpool PyTorch's CUDA allocator in this process."""
    return _pluggable is not None


def hooked():
    """True once install() gave PyTorch refpool's hooks (graph pools, record_stream, OutOfMemoryError...)."""
    return _hooked


def install(kind="device", conf=None, patch_torch_cuda=True, hooks=True, **options):
    """Makes refpool PyTorch's CUDA allocator for the rest of the process (PyTorch cannot switch back).

    Must run before PyTorch initialises CUDA (the first CUDA tensor, torch.cuda.init(), mem_get_info...):
    raises FrameworkError otherwise. `kind` "device_async" serves blocks from cuMemAllocAsync pools;
    cache options (`conf` and keywords such as rounding="pow2:4") as in refpool.Cache (default:
    REFPOOL_CONF). With `hooks`
    (the default), refpool's PyTorch hooks are built if needed and installed: FrameworkError, saying
    why, if they cannot be built; hooks=False installs refpool without them (LOST_FEATURES says what
    is lost). With patch_torch_cuda (the default), the torch functions PyTorch cannot serve under any
    pluggable allocator (memory_stats and the functions reading it, in torch.cuda and
    torch.accelerator; the resets; get_per_process_memory_fraction; memory history and snapshots;
    out-of-memory observers; CUDA graph trees' pool calls in torch._C: they would raise) are
    served by refpool; nothing PyTorch serves through the hooks is replaced, and no Tensor method
    is (only hooks=False, which loses record_stream, replaces Tensor.record_stream with an error
    saying what to use). patch_torch_cuda=False leaves torch untouched: use
    refpool.torch.memory_stats() & co. instead. Calling it again does nothing."""
    global _pluggable, _hooked, _replacements
    torch = _torch()
    with _lock:
        if _pluggable is not None:
            return
        if not torch.cuda.is_available():
            raise FrameworkError("refpool.torch.install(): PyTorch sees no CUDA device here "
                                 f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
        if torch.cuda.is_initialized():
            raise FrameworkError(
                "refpool.torch.install() must run before PyTorch initialises CUDA, and it already has "
                f"({_allocated_by_torch(torch)}): PyTorch's own allocator is in use and cannot be swapped. "
                "Call it right after `import torch`, before creating any CUDA tensor or model.to('cuda')")
        runtime = "hip" if getattr(torch.version, "hip", None) else "cuda"
        allocator.configure_if_given(runtime, kind, conf, options, "refpool.torch.install")
        pluggable, hooks_library = _pluggable_allocator(torch, hooks)
        if hooks_library is not None:
            _torch_hooks.set_hooks(pluggable, hooks_library)
        try:
            torch.cuda.memory.change_current_allocator(pluggable)
        except RuntimeError as e:
            raise FrameworkError(f"refpool.torch.install(): PyTorch refused the allocator swap ({e}); it must "
                                 "happen before any CUDA allocation") from None
        _pluggable, _hooked = pluggable, hooks_library is not None
        if hooks_library is not None:
            hooks_library.refpool_torch_hooks_set_installed()
        _torch_stats.use_hooks(hooks_library)
        if patch_torch_cuda:
            from . import _torch_memory_api
            _replacements = _torch_memory_api.patch(torch, hooks_library)


def _pluggable_allocator(torch, hooks):
    """A CUDAPluggableAllocator over refpool's hooks (built if needed), or with hooks=False over
    librefpool's plain entry points; and the hooks library (None without)."""
    if hooks:
        path, library = _torch_hooks.load(torch)
        return torch.cuda.memory.CUDAPluggableAllocator(str(path), _torch_hooks.MALLOC, _torch_hooks.FREE), library
    library = lib()
    library.fn("refpool_torch_malloc")  # a library without the entry points fails here, clearly
    library.fn("refpool_torch_free")
    return torch.cuda.memory.CUDAPluggableAllocator(library.path, "refpool_torch_malloc", "refpool_torch_free"), None


def _allocated_by_torch(torch):
    try:
        return f"{torch.cuda.memory_allocated()} bytes allocated by its own allocator"
    except Exception:  # noqa: BLE001 (only for the message)
        return "CUDA is initialised"


def _require_installed(what):
    if _pluggable is None:
        raise FrameworkError(f"refpool.torch.{what}: refpool is not PyTorch's allocator in this process "
                             "(call refpool.torch.install() first, right after `import torch`)")


def mem_pool(use_on_oom=False, hooks=True):
    """A torch.cuda.MemPool whose memory comes from refpool, for refpool in chosen regions only (a KV
    cache, activations) while PyTorch keeps its own allocator, or after CUDA is initialised:

        pool = refpool.torch.mem_pool()
        with torch.cuda.use_mem_pool(pool):
            kv_cache = torch.empty(...)

    PyTorch's caching allocator manages the pool and asks refpool for its segments; tensors of the
    pool may be freed anywhere. Not with install(): then refpool serves every allocation already."""
    torch = _torch()
    global _pool_allocator
    if _pluggable is not None:
        raise FrameworkError("refpool.torch.mem_pool(): refpool is already PyTorch's allocator in this process "
                             "(install()): every allocation, a MemPool's included, comes from refpool")
    with _lock:
        if _pool_allocator is None:
            _pool_allocator, _ = _pluggable_allocator(torch, hooks)
    return torch.cuda.MemPool(_pool_allocator.allocator(), use_on_oom=use_on_oom)


def step(plan=None, uncached_warmup_entries=0):
    """A step on the allocator's cache (a context manager) around one iteration: forward, backward
    (which PyTorch runs on its autograd thread) and the optimizer. Planned by default (auto_plans):
    an iteration whose requests repeat an earlier one's is served from one arena; `plan` (a str)
    keeps the plans of one kind of iteration apart from the others'."""
    _require_installed("step()")
    torch = _torch()
    if torch.backends.cudnn.benchmark:
        raise FrameworkError(LOST_FEATURES["cudnn.benchmark"])
    return allocator.step(plan, uncached_warmup_entries)


def snapshot(path=None):
    """A memory snapshot in PyTorch's format (what torch.cuda.memory._snapshot() returns once
    install() patched it), from refpool's allocation log (REFPOOL_CONF=log:PATH, or `path`)."""
    return _torch_snapshot.snapshot(path)


__all__ = ["install", "installed", "hooked", "mem_pool", "step", "snapshot", "memory_stats", "memory_allocated",
           "max_memory_allocated", "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
           "reset_accumulated_memory_stats", "empty_cache", "LOST_FEATURES"]
