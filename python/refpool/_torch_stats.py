"""refpool's figures under PyTorch's names (torch.cuda.memory_stats() and the functions built on it),
and what PyTorch users lose with refpool, with what to use instead. No PyTorch import here.

Per-allocation keys (allocation, active, allocated_bytes, active_bytes, requested_bytes, num_ooms)
are counted per device by refpool's PyTorch hooks exactly as PyTorch counts them; reserved memory,
segments, non-releasable memory and the driver-call counts come from refpool's cache and private
pools, which span devices. docs/frameworks.md, "Memory statistics", maps every key."""
import collections
import threading

from . import allocator

CLASSES = ("all", "small_pool", "large_pool")
FIELDS = ("current", "peak", "allocated", "freed")
# What refpool's hooks count ([kind][class][field], then num_ooms: _torch_hooks_counters.hpp's layout).
# active differs from allocation while record_stream defers a free: the block is active until its
# streams' events complete, as in PyTorch.
HOOK_KINDS = ("allocation", "allocated_bytes", "requested_bytes", "active", "active_bytes")
HOOK_STAT_COUNT = len(HOOK_KINDS) * len(CLASSES) * len(FIELDS) + 1
# refpool counters that are totals since the start (reset_accumulated_memory_stats keeps a baseline).
ACCUMULATED = ("oom_retries", "backend_allocations", "segment_grows", "uncached_allocations", "backend_frees",
               "segment_trims", "reserved_allocated_bytes", "reserved_freed_bytes")
# Counters that add up over the allocator's cache and its private pools (CUDA graph pools).
SUMMED = ("allocated_bytes", "reserved_bytes", "peak_reserved_bytes", "live_blocks", "live_bytes", "held_bytes",
          "backend_allocations", "backend_frees", "segment_grows", "segment_trims", "uncached_allocations", "ooms",
          "oom_retries", "segments", "segment_free_bytes", "segment_free_ranges", "reserved_allocated_bytes",
          "reserved_freed_bytes")

_lock = threading.Lock()
_baselines = {}  # counter -> its value at the last reset_accumulated_memory_stats
_hooks = None  # the hooks' CDLL once install() gave PyTorch refpool's hooks (else refpool's counters only)


def use_hooks(hooks):
    """install() with the hooks: PyTorch's per-allocation keys come from their counters from now on."""
    global _hooks
    _hooks = hooks


def summed_counters(cache_stats, pool_stats):
    """The cache's counters with the private pools' added where they add up."""
    summed = dict(cache_stats)
    for pool in pool_stats:
        for name in SUMMED:
            if name in pool:
                summed[name] = summed.get(name, 0) + pool[name]
    return summed


def hook_values_to_keys(values):
    """PyTorch's per-allocation keys from the hooks' counters of one device (HOOK_STAT_COUNT values)."""
    if len(values) != HOOK_STAT_COUNT:
        raise ValueError(f"refpool.torch: the hooks gave {len(values)} counters; this package reads "
                         f"{HOOK_STAT_COUNT}")
    result, i = {}, 0
    for kind in HOOK_KINDS:
        for cls in CLASSES:
            for field in FIELDS:
                result[f"{kind}.{cls}.{field}"] = int(values[i])
                i += 1
    result["num_ooms"] = int(values[i])
    return result


def counters_to_allocation_keys(summed):
    """The per-allocation keys from refpool's counters alone (refpool's hooks not loaded): the
    figures for all sizes, under `all` and `large_pool`; no totals. Without the hooks no free is
    deferred: active is allocated."""
    blocks = (summed.get("live_blocks", 0), summed.get("live_blocks", 0))
    block_bytes = (summed.get("allocated_bytes", 0), summed.get("peak_allocated_bytes", 0))
    per_kind = {"allocation": blocks, "allocated_bytes": block_bytes, "requested_bytes": block_bytes,
                "active": blocks, "active_bytes": block_bytes}
    result = {}
    for kind, (current, peak) in per_kind.items():
        for cls, (now, top) in (("all", (current, peak)), ("large_pool", (current, peak)), ("small_pool", (0, 0))):
            result.update({f"{kind}.{cls}.current": now, f"{kind}.{cls}.peak": max(top, now),
                           f"{kind}.{cls}.allocated": 0, f"{kind}.{cls}.freed": 0})
    result["num_ooms"] = summed.get("ooms", 0)
    return result


def torch_memory_stats(allocation_keys, summed, baselines=None):
    """torch.cuda.memory_stats()'s dict: the per-allocation keys, plus reserved memory, segments,
    non-releasable memory and event counts from refpool's counters (`summed`: cache + pools), with
    `baselines` taken off the totals; every counter of refpool as "refpool.<name>" too."""
    baselines = baselines or {}

    def total(name):
        return max(summed.get(name, 0) - baselines.get(name, 0), 0)

    plain_blocks = max(summed.get("backend_allocations", 0) - summed.get("backend_frees", 0), 0)
    # name: (current, peak, allocated, freed) for all sizes. refpool's segment heaps serve both of
    # PyTorch's size classes, so `large_pool` repeats `all` and `small_pool` is 0.
    per_class = {
        "reserved_bytes": (summed.get("reserved_bytes", 0), summed.get("peak_reserved_bytes", 0),
                           total("reserved_allocated_bytes"), total("reserved_freed_bytes")),
        "segment": (summed.get("segments", 0) + plain_blocks, None,
                    total("segment_grows") + total("backend_allocations"),
                    total("segment_trims") + total("backend_frees")),
        "inactive_split_bytes": (summed.get("segment_free_bytes", 0), None, 0, 0),
        "inactive_split": (summed.get("segment_free_ranges", 0), None, 0, 0),
    }
    result = dict(allocation_keys)
    for name, (current, peak, allocated, freed) in per_class.items():
        peak = max(current, peak or 0)
        for cls, scale in (("all", 1), ("large_pool", 1), ("small_pool", 0)):
            result.update({f"{name}.{cls}.current": current * scale, f"{name}.{cls}.peak": peak * scale,
                           f"{name}.{cls}.allocated": allocated * scale, f"{name}.{cls}.freed": freed * scale})
    for name in ("oversize_allocations", "oversize_segments"):  # none: refpool has no max_split_size
        result.update({f"{name}.{field}": 0 for field in FIELDS})
    result["max_split_size"] = -1
    result["num_alloc_retries"] = total("oom_retries")
    result["num_sync_all_streams"] = 0  # refpool never synchronises every stream
    result["num_device_alloc"] = total("backend_allocations") + total("segment_grows") + total("uncached_allocations")
    result["num_device_free"] = total("backend_frees") + total("segment_trims")
    return result


def nested(flat):
    """The nested form of a flat stats dict ("a.b.c" -> {"a": {"b": {"c": ...}}}), as
    torch._C._cuda_memoryStats returns it."""
    root = {}
    for key, value in flat.items():
        node = root
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return root


def _refpool_counters():
    stats = allocator.stats()
    pools = [allocator.pool_stats(pool) for pool in allocator.pool_ids()]
    return stats, pools


def memory_stats(device=None):
    """Shaped like torch.cuda.memory_stats(device): every key PyTorch's caching allocator reports,
    with PyTorch's meaning (docs/frameworks.md maps them), and every counter of refpool's cache as
    "refpool.<name>", "refpool.private_pools" and their "refpool.private_pool_reserved_bytes"."""
    stats, pools = _refpool_counters()
    summed = summed_counters(stats, pools)
    if _hooks is not None:
        allocation_keys = hook_values_to_keys(device_stat_values(_hooks, _device_index(device)))
    else:
        allocation_keys = counters_to_allocation_keys(summed)
    with _lock:
        result = torch_memory_stats(allocation_keys, summed, dict(_baselines))
    result.update({f"refpool.{name}": value for name, value in stats.items()})
    result["refpool.private_pools"] = len(pools)
    result["refpool.private_pool_reserved_bytes"] = sum(pool.get("reserved_bytes", 0) for pool in pools)
    return collections.OrderedDict(sorted(result.items()))


def device_stat_values(hooks, device):
    import ctypes
    values = (ctypes.c_int64 * HOOK_STAT_COUNT)()
    if hooks.refpool_torch_hooks_stat_count() != HOOK_STAT_COUNT:
        raise ValueError("refpool.torch: the hooks library counts other statistics than this package reads; "
                         "remove REFPOOL_TORCH_HOOKS_DIR or ~/.cache/refpool and retry")
    written = hooks.refpool_torch_hooks_device_stats(device, values, HOOK_STAT_COUNT)
    if written < 0:
        raise ValueError(f"refpool.torch: device {device} is out of range")
    return list(values)


def _device_index(device):
    """An int from PyTorch's device arguments (None: the current device)."""
    if device is None:
        try:
            import torch
            return torch.cuda.current_device()
        except Exception:  # noqa: BLE001 (no CUDA: device 0's counters)
            return 0
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if isinstance(device, str):
        index = int(device.split(":")[1]) if ":" in device else None
    return _device_index(None) if index is None else index


def memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    """Restarts the peaks: the hooks' per-device ones and refpool's (live and held bytes, reserved
    bytes) of the allocator's cache and of each private pool."""
    if _hooks is not None:
        _hooks.refpool_torch_hooks_reset_peak_stats(_device_index(device))
    allocator.reset_peaks()
    from . import _types as t
    from ._library import lib
    from .cache import Cache
    from .errors import InvalidArgumentError
    for first, second in allocator.pool_ids():
        try:
            with Cache(_handle=lib().new_handle("refpool_allocator_pool_cache", t.PoolId(first, second))) as pool:
                pool.reset_peaks()
        except InvalidArgumentError:  # the pool went meanwhile
            pass


def reset_accumulated_memory_stats(device=None):
    """Restarts the totals (allocated, freed) and event counts (num_ooms, num_alloc_retries,
    num_device_alloc, num_device_free) from 0."""
    if _hooks is not None:
        _hooks.refpool_torch_hooks_reset_accumulated_stats(_device_index(device))
    stats, pools = _refpool_counters()
    summed = summed_counters(stats, pools)
    with _lock:
        _baselines.update({name: summed.get(name, 0) for name in ACCUMULATED})


def empty_cache():
    """Gives every idle block of refpool's cache back to the driver; CUDA graph pools keep theirs."""
    allocator.empty_cache()


# What PyTorch loses with refpool as its allocator, and what refpool offers instead. With the
# hooks (install()'s default) only the first entries apply; without them, all.
_LOG = ("REFPOOL_CONF=log:PATH writes every allocation and free as CSV; refpool.torch.snapshot() turns it "
        "into PyTorch's snapshot format (torch.cuda._memory_viz), and `python3 -m refpool.plot PATH OUT.png` "
        "draws memory over time")
LOST_FEATURES = {
    "history": "memory history with stack frames needs refpool's history library, built with PyTorch's "
               "headers at the first torch.cuda.memory._record_memory_history(); it could not be built here. "
               "Instead: " + _LOG,
    "cudnn.benchmark": "torch.backends.cudnn.benchmark needs the allocator's cacheInfo, which PyTorch's hook "
                       "does not forward (it fails inside the first convolution). Set it to False with refpool",
    "ipc": "CUDA tensors shared between processes (torch.multiprocessing, IPC handles) need PyTorch's own "
           "allocator: the hook does not forward shareIpcHandle / getIpcDevPtr",
    # Lost only without the hooks (install(hooks=False)):
    "set_per_process_memory_fraction": "without refpool's PyTorch hooks the fraction does not reach refpool. "
                                       "refpool.allocator.set_device_limit(device, bytes) caps it directly",
    "record_stream": "without refpool's PyTorch hooks Tensor.record_stream would be ignored. Make the allocating "
                     "stream wait for the other one (torch.cuda.current_stream().wait_stream(side)) before the "
                     "tensor's last reference goes",
    "cuda_graphs": "without refpool's PyTorch hooks a captured graph's memory could be reused after capture: "
                   "do not capture graphs",
    "out_of_memory": "without refpool's PyTorch hooks out of memory raises RuntimeError with refpool's message, "
                     "not torch.OutOfMemoryError, and no out-of-memory observer is called",
}
