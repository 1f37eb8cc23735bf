"""refpool as PyTorch's CUDA allocator, through torch.cuda.memory.CUDAPluggableAllocator.

    import refpool.torch
    refpool.torch.install()            # right after `import torch`, before any CUDA tensor
    for batch in data:
        with refpool.torch.step(plan="train"):   # forward, backward (autograd's thread), optimizer
            ...

PyTorch calls librefpool's refpool_torch_malloc / refpool_torch_free directly: no Python runs per
allocation. install() also replaces torch.cuda's memory functions that PyTorch's hook cannot serve
(memory_stats, max_memory_allocated, empty_cache...) by refpool's figures, and makes the features
it loses fail with a message saying what refpool offers instead (LOST_FEATURES; docs/frameworks.md).
PyTorch is imported when a function here is first called, never by `import refpool.torch`."""
import collections
import threading

from . import allocator
from ._library import lib
from .errors import FrameworkError

_lock = threading.Lock()
_pluggable = None  # the installed torch.cuda.memory.CUDAPluggableAllocator (kept alive)


def _torch():
    try:
        import torch
    except ImportError as e:
        raise FrameworkError(f"refpool.torch needs PyTorch, which cannot be imported here: {e}") from None
    return torch


def installed():
    """True once install() made refpool PyTorch's CUDA allocator in this process."""
    return _pluggable is not None


def install(kind="device", rounding=None, rounding_parameter=None, max_idle_bytes=None, patch_memory_api=True,
            segments=None):
    """Makes refpool PyTorch's CUDA allocator for the rest of the process (PyTorch cannot switch back).

    Must run before PyTorch initialises CUDA (the first CUDA tensor, torch.cuda.init(), mem_get_info...):
    raises FrameworkError otherwise. `kind` "device_async" serves blocks from cuMemAllocAsync pools;
    rounding, max_idle_bytes and segments as in refpool.Cache (default: REFPOOL_CONF). With patch_memory_api,
    torch.cuda.memory_stats & co. report refpool's figures (see refpool.torch.LOST_FEATURES).
    Calling it again does nothing."""
    global _pluggable
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
        library = lib()
        library.fn("refpool_torch_malloc")  # a library without the entry points fails here, clearly
        library.fn("refpool_torch_free")
        runtime = "hip" if getattr(torch.version, "hip", None) else "cuda"
        if runtime != "cuda" or kind != "device" or rounding is not None or rounding_parameter is not None \
                or max_idle_bytes is not None or segments is not None:
            allocator.configure(runtime=runtime, kind=kind, rounding=rounding, rounding_parameter=rounding_parameter,
                                max_idle_bytes=max_idle_bytes, segments=segments)
        pluggable = torch.cuda.memory.CUDAPluggableAllocator(library.path, "refpool_torch_malloc",
                                                             "refpool_torch_free")
        try:
            torch.cuda.memory.change_current_allocator(pluggable)
        except RuntimeError as e:
            raise FrameworkError(f"refpool.torch.install(): PyTorch refused the allocator swap ({e}); it must "
                                 "happen before any CUDA allocation") from None
        _pluggable = pluggable
        if patch_memory_api:
            from . import _torch_memory_api
            _torch_memory_api.patch(torch)


def _allocated_by_torch(torch):
    try:
        return f"{torch.cuda.memory_allocated()} bytes allocated by its own allocator"
    except Exception:  # noqa: BLE001 (only for the message)
        return "CUDA is initialised"


def _require_installed(what):
    if _pluggable is None:
        raise FrameworkError(f"refpool.torch.{what}: refpool is not PyTorch's allocator in this process "
                             "(call refpool.torch.install() first, right after `import torch`)")


def step(plan=None, uncached_warmup_entries=0):
    """A step on the allocator's cache (a context manager) around one iteration: forward, backward
    (which PyTorch runs on its autograd thread) and the optimizer. With `plan` (a str), a planned
    step: the first iteration under the key records, the next ones are served from one arena."""
    _require_installed("step()")
    torch = _torch()
    if torch.backends.cudnn.benchmark:
        raise FrameworkError(_LOST["cudnn.benchmark"])
    return allocator.step(plan, uncached_warmup_entries)


# What PyTorch's keys mean in refpool's counters (those with the same meaning only).
_TORCH_KEYS = {
    "allocated_bytes.all.current": "allocated_bytes",
    "allocated_bytes.all.peak": "peak_allocated_bytes",
    "active_bytes.all.current": "allocated_bytes",
    "active_bytes.all.peak": "peak_allocated_bytes",
    "reserved_bytes.all.current": "reserved_bytes",
    "reserved_bytes.all.peak": "peak_reserved_bytes",
    "allocation.all.current": "live_blocks",
    "num_alloc_retries": "oom_retries",
    "num_ooms": "ooms",
    "num_device_free": "backend_frees",
}


def memory_stats(device=None):
    """Shaped like torch.cuda.memory_stats(): PyTorch's keys where refpool has a counter of the same
    meaning (allocated = allocated_bytes, reserved = reserved_bytes, num_device_alloc = backend allocations
    plus segment growth...)
    plus every refpool counter as "refpool.<name>". refpool's allocator has one cache for all devices:
    the figures cover every device, whatever `device` is."""
    del device  # accepted for torch.cuda.memory_stats compatibility
    stats = allocator.stats()
    result = {key: stats[name] for key, name in _TORCH_KEYS.items() if name in stats}
    # cudaMalloc calls in PyTorch: here block allocations plus the commits that grew segments.
    result["num_device_alloc"] = stats["backend_allocations"] + stats.get("segment_grows", 0)
    result.update({f"refpool.{name}": value for name, value in stats.items()})
    return collections.OrderedDict(sorted(result.items()))


def memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    """Restarts refpool's peaks (peak live and held bytes) from the current values."""
    del device
    allocator.reset_peaks()


def empty_cache():
    """Gives every idle block of refpool's cache back to the driver (PyTorch's hook alone cannot)."""
    return allocator.reclaim(0)


# What PyTorch loses with its pluggable-allocator hook, and what refpool offers instead.
_LOG = ("REFPOOL_CONF=log:PATH writes every allocation and free as CSV, and "
        "`python3 -m refpool.plot PATH OUT.png` draws memory over time with a stats table")
_LOST = {
    "snapshots": "PyTorch's memory snapshots and allocation history (memory_snapshot, _record_memory_history, "
                 "_dump_snapshot) live in its own caching allocator, which refpool replaces. Instead: " + _LOG,
    "memory_summary": "torch.cuda.memory_summary() formats its own allocator's state. Instead: "
                      "refpool.torch.memory_stats() (PyTorch's keys where they mean the same, and refpool's), or "
                      + _LOG,
    "set_per_process_memory_fraction": "PyTorch's hook ignores a memory fraction, and refpool does not cap live "
                                       "device memory. REFPOOL_CONF=max_idle_bytes:N caps the idle (cached) bytes",
    "record_stream": "PyTorch's hook has no record-stream function settable from Python, so Tensor.record_stream "
                     "would be ignored and the tensor's memory reused while the other stream may still use it. "
                     "Instead, make the allocating stream wait for the other one "
                     "(torch.cuda.current_stream().wait_stream(side)) before the tensor's last reference goes",
    "cudnn.benchmark": "torch.backends.cudnn.benchmark needs the allocator's cacheInfo, which PyTorch's hook "
                       "does not support (it fails inside the first convolution). Set it to False with refpool",
    "ipc": "CUDA tensors shared between processes (torch.multiprocessing, IPC handles) need PyTorch's own "
           "allocator: the receiving side's getIpcDevPtr is not supported by the hook",
    "cuda_graphs": "CUDA graph capture keeps private memory pools in PyTorch's allocator; the hook has none, so "
                   "memory a captured graph uses could be reused after capture. Do not capture graphs with refpool "
                   "as PyTorch's allocator",
    "out_of_memory": "A request refpool cannot serve (out of memory after reclaiming idle blocks and retrying) "
                     "raises refpool's error through PyTorch, with refpool's message, not torch.cuda.OutOfMemoryError: "
                     "code that catches that type (to retry with a smaller batch, say) must catch this one too",
}
LOST_FEATURES = dict(_LOST)
