"""What install() puts into torch: the memory functions PyTorch's pluggable-allocator interface
cannot serve, served by refpool. With refpool's hooks, empty_cache, set_per_process_memory_fraction,
Tensor.record_stream and CUDA graph pools reach refpool through PyTorch itself and are left alone.

Replaced, in every module PyTorch defines or re-exports them from (torch.cuda, torch.cuda.memory,
torch.accelerator, torch.accelerator.memory, torch._C; functions there call each other through
their module, so memory_allocated, max_memory_reserved, memory_summary & co. need no patch):
memory_stats and its nested form, reset_peak_memory_stats, reset_accumulated_memory_stats,
get_per_process_memory_fraction, caching_allocator_enable, get_memory_info,
_record_memory_history, _snapshot, memory_snapshot, _set_memory_metadata, the out-of-memory
observer, CUDA graph trees' pool calls (_torch_checkpoint), and MemPool with use_mem_pool
(_torch_mempool). Each raises the error PyTorch's allocator would for bad arguments."""
import ctypes
import sys
import threading
import traceback

from . import _torch_hooks, _torch_mempool, _torch_snapshot, _torch_stats, allocator
from ._library import lib
from ._torch_checkpoint import PoolCalls, hook_calls
from ._torch_history import History, Settings
from .errors import ConfigError, FrameworkError, InvalidArgumentError, LibraryError

OOM_OBSERVER = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t)
# _record_memory_history's parameters after `enabled`, in PyTorch's order.
HISTORY_PARAMETERS = ("context", "stacks", "max_entries", "device", "clear_history", "compile_context",
                      "global_record_annotations", "skip_actions")


class Replacements:
    """The functions install() puts into torch, bound to refpool's hooks (`hooks`: their CDLL, or
    None for install(hooks=False))."""

    def __init__(self, torch, hooks):
        self.torch = torch
        self.hooks = hooks
        self.lock = threading.Lock()
        self.observers = []
        self.oom_callback = None  # kept alive while the hooks may call it
        self.history = None
        self.metadata = ""
        free_storage = getattr(torch._C, "_free_And_Remove_DeleterFn", None)
        self.pools = PoolCalls(self.pool_allocations, free_storage, *hook_calls(hooks)) if hooks is not None else None

    # ---- statistics ---------------------------------------------------------------------------

    def memory_stats(self, device=None):
        return _torch_stats.memory_stats(self.device_index(device))

    def memory_stats_as_nested_dict(self, device=None):
        return _torch_stats.nested(self.memory_stats(device))

    def reset_peak_memory_stats(self, device=None):
        _torch_stats.reset_peak_memory_stats(self.device_index(device))

    def reset_accumulated_memory_stats(self, device=None):
        _torch_stats.reset_accumulated_memory_stats(self.device_index(device))

    def get_per_process_memory_fraction(self, device=None):
        index = self.device_index(device)
        if self.hooks is None:
            raise FrameworkError("torch.cuda.get_per_process_memory_fraction() is not available with refpool as "
                                 "PyTorch's allocator: "
                                 + _torch_stats.LOST_FEATURES["set_per_process_memory_fraction"])
        return float(self.hooks.refpool_torch_hooks_memory_fraction(index))

    def empty_cache(self):
        # torch.accelerator's reaches the allocator PyTorch registered for CUDA at start-up, not the
        # pluggable one install() made current: torch.cuda's goes through the hooks.
        self.torch.cuda.empty_cache()

    def caching_allocator_enable(self, value=True):
        """torch.cuda.caching_allocator_enable (and torch._C._cuda_cudaCachingAllocator_enable): off,
        each request no private pool takes is the driver's own allocation, counted nowhere, as with
        PyTorch's allocator; the pluggable interface forwards no such call. One setting, librefpool's:
        refpool.allocator.set_caching changes the same, and the hooks read it for each request."""
        allocator.set_caching(bool(value))

    def get_memory_info(self, device=None):
        return self.torch.cuda.mem_get_info(self.device_index(device))

    def device_index(self, device):
        """PyTorch's device argument as an index, checked as torch.cuda checks it."""
        if device is None:
            return self.torch.cuda.current_device()
        index = self.torch.cuda._utils._get_device_index(device, optional=True)
        count = self.torch.cuda.device_count()
        if not 0 <= index < count:
            raise ValueError(f"Invalid device argument {device}: did you call init? (device index out of range: "
                             f"{index}, {count} CUDA device(s))")
        return index

    # ---- out of memory ------------------------------------------------------------------------

    def attach_out_of_memory_observer(self, observer):
        """torch._C._cuda_attach_out_of_memory_observer: `observer(device, bytes, device_total,
        device_free)` is called before torch.OutOfMemoryError is raised."""
        if not callable(observer):
            raise TypeError(f"an out-of-memory observer must be callable, not {type(observer).__name__}")
        if self.hooks is None:
            raise FrameworkError("out-of-memory observers need refpool's PyTorch hooks: "
                                 + _torch_stats.LOST_FEATURES["out_of_memory"])
        with self.lock:
            self.observers.append(observer)
            if self.oom_callback is None:
                self.oom_callback = OOM_OBSERVER(self.notify_out_of_memory)
                self.hooks.refpool_torch_hooks_set_oom_observer(ctypes.cast(self.oom_callback, ctypes.c_void_p))

    def notify_out_of_memory(self, device, size, total, free):
        for observer in list(self.observers):
            try:
                observer(device, size, total, free)
            except Exception:  # noqa: BLE001 (an observer's error must not replace the out-of-memory error)
                traceback.print_exc()

    # ---- history and snapshots ----------------------------------------------------------------

    def record_memory_history(self, enabled="all", *args, **kwargs):
        """torch.cuda.memory._record_memory_history, PyTorch's arguments (and its legacy boolean form)."""
        if isinstance(enabled, bool):
            settings = Settings.legacy(enabled, *args, **kwargs)
        else:
            given = dict(zip(HISTORY_PARAMETERS, args))
            given.update(kwargs)
            settings = Settings(enabled, given.get("context", "all"), given.get("stacks", "all"),
                                given.get("max_entries", sys.maxsize), given.get("clear_history", False),
                                given.get("skip_actions"))
        with self.lock:
            if self.history is None:
                if settings.enabled is None:
                    return  # nothing was recorded: nothing to stop
                self.history = self.make_history()
            self.history.apply(settings)
            if self.metadata:
                self.history.set_metadata(self.metadata)

    def make_history(self):
        library = _torch_hooks.load_history(self.torch) if self.hooks is not None else None
        if library is None:
            why = _torch_hooks.history_error() or "refpool's PyTorch hooks are not installed"
            raise FrameworkError("torch.cuda.memory._record_memory_history() with refpool as PyTorch's allocator: "
                                 f"{_torch_stats.LOST_FEATURES['history']} ({why})")
        return History(self.hooks, library)

    def set_memory_metadata(self, metadata):
        with self.lock:
            self.metadata = str(metadata)
            if self.history is not None:
                self.history.set_metadata(self.metadata)

    def get_memory_metadata(self):
        return self.metadata

    def is_history_enabled(self):
        return self.history is not None and self.history.recording

    def snapshot(self, device=None, *args, **kwargs):
        """torch.cuda.memory._snapshot(); also torch._C._cuda_memorySnapshot(mempool_id)."""
        pool = kwargs.get("mempool_id")
        if pool is None and isinstance(device, tuple):  # _cuda_memorySnapshot's positional pool id
            pool = device
        with self.lock:
            history = self.history.dump() if self.history is not None and self.history.recording else None
        log = _torch_snapshot.log_path()
        events = None
        if history is None and log is not None:
            from .alloc_log import read_log
            events = read_log(log)
        return _torch_snapshot.build(history, self.pool_allocations() if self.hooks is not None else (), events,
                                     self.torch.cuda.device_count(), pool=tuple(pool) if pool else None,
                                     maps=self.memory_maps())

    def memory_maps(self):
        """(pool id, refpool.memory_map segments) of the allocator's cache ((0, 0)) and of each private
        pool; None where the library cannot say (one without refpool_cache_memory_map)."""
        try:
            maps = [((0, 0), allocator.memory_map())]
            for pool in allocator.pool_ids():
                try:
                    maps.append((pool, allocator.memory_map(pool)))
                except InvalidArgumentError:  # the pool went since pool_ids()
                    pass
            return maps
        except (LibraryError, ConfigError):  # an older library, or an allocator that cannot be made
            return None

    def memory_snapshot(self, mempool_id=None):
        return self.snapshot(mempool_id=mempool_id)["segments"]

    def pool_allocations(self):
        """Rows (address, size, device, stream, pool first, pool second) of private pools' live allocations."""
        capacity = 64
        while True:
            rows = (ctypes.c_uint64 * (6 * capacity))()
            count = self.hooks.refpool_torch_hooks_pool_allocations(rows, capacity)
            if count <= capacity:
                return [tuple(rows[6 * i:6 * i + 6]) for i in range(count)]
            capacity = count + 64

    # ---- CUDA graph trees (_torch_checkpoint) -------------------------------------------------

    def check_pool_live_allocations(self, device, pool, live):
        return self.require_pools("_cuda_checkPoolLiveAllocations").check_pool_live_allocations(device, pool, live)

    def get_checkpoint_state(self, device, pool):
        return self.require_pools("_cuda_getCheckpointState").get_checkpoint_state(device, pool)

    def set_checkpoint_pool_state(self, device, state, stale_storages, storages_to_add_deleters_to=()):
        calls = self.require_pools("_cuda_setCheckpointPoolState")
        return calls.set_checkpoint_pool_state(device, state, stale_storages, storages_to_add_deleters_to)

    def require_pools(self, what):
        if self.pools is None or self.pools.free_storage is None:
            raise FrameworkError(f"torch._C.{what} needs refpool's PyTorch hooks (install(hooks=False) has none) "
                                 "and PyTorch's torch._C._free_And_Remove_DeleterFn")
        return self.pools

    # ---- what goes where ----------------------------------------------------------------------

    def table(self):
        """module attribute path -> replacement. A name a module lacks is skipped."""
        cuda = {"memory_stats": self.memory_stats, "memory_stats_as_nested_dict": self.memory_stats_as_nested_dict,
                "reset_peak_memory_stats": self.reset_peak_memory_stats,
                "reset_accumulated_memory_stats": self.reset_accumulated_memory_stats,
                "get_per_process_memory_fraction": self.get_per_process_memory_fraction,
                "_record_memory_history": self.record_memory_history, "_snapshot": self.snapshot,
                "memory_snapshot": self.memory_snapshot, "_set_memory_metadata": self.set_memory_metadata,
                "_get_memory_metadata": self.get_memory_metadata,
                "caching_allocator_enable": self.caching_allocator_enable}
        accelerator = {"memory_stats": self.memory_stats, "reset_peak_memory_stats": self.reset_peak_memory_stats,
                       "reset_accumulated_memory_stats": self.reset_accumulated_memory_stats,
                       "get_memory_info": self.get_memory_info, "empty_cache": self.empty_cache}
        c = {"_cuda_memoryStats": self.memory_stats_as_nested_dict,
             "_cuda_resetPeakMemoryStats": self.reset_peak_memory_stats,
             "_cuda_resetAccumulatedMemoryStats": self.reset_accumulated_memory_stats,
             "_cuda_getMemoryFraction": self.get_per_process_memory_fraction,
             "_cuda_cudaCachingAllocator_enable": self.caching_allocator_enable,
             "_cuda_memorySnapshot": self.snapshot, "_cuda_setMemoryMetadata": self.set_memory_metadata,
             "_cuda_getMemoryMetadata": self.get_memory_metadata,
             "_cuda_isHistoryEnabled": self.is_history_enabled,
             "_cuda_attach_out_of_memory_observer": self.attach_out_of_memory_observer,
             "_cuda_checkPoolLiveAllocations": self.check_pool_live_allocations,
             "_cuda_getCheckpointState": self.get_checkpoint_state,
             "_cuda_setCheckpointPoolState": self.set_checkpoint_pool_state,
             "_accelerator_getDeviceStats": self.memory_stats_as_nested_dict,
             "_accelerator_resetPeakStats": self.reset_peak_memory_stats,
             "_accelerator_resetAccumulatedStats": self.reset_accumulated_memory_stats,
             "_accelerator_emptyCache": self.empty_cache}
        return {"cuda": cuda, "cuda.memory": cuda, "accelerator": accelerator, "accelerator.memory": accelerator,
                "_C": c}


def _refusal(name, feature):
    def refused(*args, **kwargs):
        raise FrameworkError(f"torch.cuda.{name}() is not available with refpool as PyTorch's allocator: "
                             f"{_torch_stats.LOST_FEATURES[feature]}")
    refused.__name__ = name
    return refused


def _record_stream_refused(tensor, stream):
    raise FrameworkError("Tensor.record_stream() is not available with refpool as PyTorch's allocator: "
                         f"{_torch_stats.LOST_FEATURES['record_stream']}")


def patch(torch, hooks):
    """Installs the replacements into torch; `hooks`: refpool's hooks' CDLL, or None without them
    (then more must be replaced or refused). Returns the Replacements."""
    replacements = Replacements(torch, hooks)
    table = replacements.table()
    if hooks is None:
        table["cuda"] = dict(table["cuda"], empty_cache=_torch_stats.empty_cache,
                             set_per_process_memory_fraction=_refusal("set_per_process_memory_fraction",
                                                                      "set_per_process_memory_fraction"))
        table["cuda.memory"] = table["cuda"]
    for path, functions in table.items():
        module = torch
        for part in path.split("."):
            module = getattr(module, part, None)
        if module is None:
            continue
        for name, function in functions.items():
            if hasattr(module, name):
                setattr(module, name, function)
    if hooks is None:
        torch.Tensor.record_stream = _record_stream_refused
    else:
        mem_pool, use_mem_pool = _torch_mempool.make_classes(torch, hooks, _last_error)
        for module in (torch.cuda, getattr(torch.cuda, "memory", None)):
            for name, value in (("MemPool", mem_pool), ("use_mem_pool", use_mem_pool)):
                if module is not None and hasattr(module, name):
                    setattr(module, name, value)
    return replacements


def _last_error():
    return lib().last_error()
