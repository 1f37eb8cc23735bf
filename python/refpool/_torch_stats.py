"""refpool's figures under PyTorch's names (torch.cuda.memory_stats() and the functions built on it),
and what PyTorch users lose with refpool, with what to use instead. No PyTorch import here."""
import collections

from . import allocator

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
# Counters that add up over the allocator's cache and its private pools (CUDA graph pools).
_SUMMED = ("allocated_bytes", "reserved_bytes", "live_blocks", "live_bytes", "held_bytes", "backend_allocations",
           "backend_frees", "segment_grows", "ooms", "oom_retries")


def memory_stats(device=None):
    """Shaped like torch.cuda.memory_stats(): PyTorch's keys where refpool has a counter of the same
    meaning (allocated = allocated_bytes, reserved = reserved_bytes, num_device_alloc = backend
    allocations plus segment growth...), over the allocator's cache and its private pools (CUDA graph
    pools); plus every counter of the cache as "refpool.<name>", and "refpool.private_pools" with
    the pools' "refpool.private_pool_reserved_bytes". Peaks are the cache's. refpool's allocator has
    one cache for all devices: the figures cover every device, whatever `device` is."""
    del device  # accepted for torch.cuda.memory_stats compatibility
    stats = allocator.stats()
    pools = [allocator.pool_stats(pool) for pool in allocator.pool_ids()]
    summed = dict(stats)
    for pool in pools:
        for name in _SUMMED:
            if name in pool:
                summed[name] = summed.get(name, 0) + pool[name]
    for name in ("allocated_bytes", "reserved_bytes"):  # a peak is never below the current value
        peak = "peak_" + name
        if peak in summed:
            summed[peak] = max(summed[peak], summed[name])
    result = {key: summed[name] for key, name in _TORCH_KEYS.items() if name in summed}
    # cudaMalloc calls in PyTorch: here block allocations plus the commits that grew segments.
    result["num_device_alloc"] = summed["backend_allocations"] + summed.get("segment_grows", 0)
    result.update({f"refpool.{name}": value for name, value in stats.items()})
    result["refpool.private_pools"] = len(pools)
    result["refpool.private_pool_reserved_bytes"] = sum(pool.get("reserved_bytes", 0) for pool in pools)
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
    """Gives every idle block of refpool's cache back to the driver; CUDA graph pools keep theirs."""
    allocator.empty_cache()


# What PyTorch loses with refpool as its allocator, and what refpool offers instead. With the
# hooks (install()'s default) only the first four apply; without them, all.
_LOG = ("REFPOOL_CONF=log:PATH writes every allocation and free as CSV; refpool.torch.snapshot() turns it "
        "into PyTorch's snapshot format (torch.cuda._memory_viz), and `python3 -m refpool.plot PATH OUT.png` "
        "draws memory over time")
LOST_FEATURES = {
    "memory_summary": "torch.cuda.memory_summary() formats PyTorch's own pools (large/small, split blocks), which "
                      "refpool does not have. Instead: refpool.torch.memory_stats(), or " + _LOG,
    "history": "torch.cuda.memory._record_memory_history() records inside PyTorch's caching allocator, which "
               "refpool replaces; PyTorch's hook has no history. Instead: " + _LOG,
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
                     "not torch.OutOfMemoryError",
}
