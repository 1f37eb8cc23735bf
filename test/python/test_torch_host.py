"""refpool.torch's PyTorch-facing side on the host, without PyTorch or a GPU: what install() puts into
torch (memory_stats and the functions on it, the resets, the memory fraction, out-of-memory
observers, snapshots, CUDA graph trees' pool calls), run against a fake `torch` namespace and a fake
of the compiled hooks' counters, over the real framework allocator on the host runtime. The same
behaviours run against real PyTorch on a GPU in test_torch.py."""
import ctypes
import types

import pytest

import refpool
from refpool import _torch_checkpoint, _torch_history, _torch_memory_api, _torch_snapshot, _torch_stats, allocator
from refpool.alloc_log import Event
from refpool.errors import FrameworkError

# Every key torch.cuda.memory_summary() reads (torch/cuda/memory.py), so PyTorch's own summary
# formats refpool's figures.
SUMMARY_METRICS = ("allocated_bytes", "active_bytes", "requested_bytes", "reserved_bytes", "inactive_split_bytes",
                   "allocation", "active", "segment", "inactive_split")
SUMMARY_KEYS = ([f"{m}.{c}.{f}" for m in SUMMARY_METRICS for c in ("all", "large_pool", "small_pool")
                 for f in ("current", "peak", "allocated", "freed")]
                + [f"{m}.{f}" for m in ("oversize_allocations", "oversize_segments")
                   for f in ("current", "peak", "allocated", "freed")] + ["num_ooms", "num_alloc_retries"])


@pytest.fixture(scope="module", autouse=True)
def host_allocator():
    """The framework allocator on host memory with segments, configured once for this process."""
    allocator.configure(runtime="host", segments="on")


class FakeHooks:
    """What Python asks of the compiled hooks (_torch_hooks_stats.cpp, _torch_hooks_pools.cpp): given values."""

    def __init__(self, values=None, pool_rows=(), fraction=1.0):
        self.values = list(values or [0] * _torch_stats.HOOK_STAT_COUNT)
        self.pool_rows = list(pool_rows)
        self.fraction = fraction
        self.calls = []
        self.observer = None

    def refpool_torch_hooks_stat_count(self):
        return _torch_stats.HOOK_STAT_COUNT

    def refpool_torch_hooks_device_stats(self, device, out, capacity):
        if device != 0:
            return -1
        for i, v in enumerate(self.values[:capacity]):
            out[i] = v
        return min(capacity, len(self.values))

    def refpool_torch_hooks_reset_peak_stats(self, device):
        self.calls.append(("reset_peak", device))

    def refpool_torch_hooks_reset_accumulated_stats(self, device):
        self.calls.append(("reset_accumulated", device))

    def refpool_torch_hooks_memory_fraction(self, device):
        return self.fraction

    def refpool_torch_hooks_set_oom_observer(self, pointer):
        self.observer = pointer

    def refpool_torch_hooks_set_tracker(self, pointer):
        self.calls.append(("tracker", pointer))

    def refpool_torch_hooks_pool_allocations(self, out, capacity):
        for i, row in enumerate(self.pool_rows[:capacity]):
            out[6 * i:6 * i + 6] = list(row)
        return len(self.pool_rows)


def fake_torch(freed=None):
    """The modules install() patches, with placeholders where PyTorch's functions would be."""
    def placeholder(*args, **kwargs):
        raise AssertionError("PyTorch's own function was called: it should have been replaced")

    def module(**names):
        return types.SimpleNamespace(**names)

    names = ("memory_stats", "memory_stats_as_nested_dict", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
             "get_per_process_memory_fraction", "_record_memory_history", "_snapshot", "memory_snapshot",
             "_set_memory_metadata", "empty_cache", "set_per_process_memory_fraction")
    cuda_memory = module(**{n: placeholder for n in names})
    def device_index(device, optional=False):  # as torch.cuda._utils: an int as it is, "cuda:N" as N
        return device if isinstance(device, int) else int(str(device).partition(":")[2] or 0)

    utils = module(_get_device_index=device_index)
    cuda = module(memory=cuda_memory, _utils=utils, current_device=lambda: 0, device_count=lambda: 1,
                  mem_get_info=lambda device=None: (1 << 30, 1 << 34), **{n: placeholder for n in names})
    accelerator_memory = module(memory_stats=placeholder, reset_peak_memory_stats=placeholder,
                                reset_accumulated_memory_stats=placeholder, get_memory_info=placeholder)
    accelerator = module(memory=accelerator_memory, **vars(accelerator_memory))
    c = module(_cuda_attach_out_of_memory_observer=placeholder, _cuda_checkPoolLiveAllocations=placeholder,
               _cuda_getCheckpointState=placeholder, _cuda_setCheckpointPoolState=placeholder,
               _cuda_memoryStats=placeholder, _cuda_isHistoryEnabled=placeholder,
               _free_And_Remove_DeleterFn=(freed.append if freed is not None else placeholder))
    return module(cuda=cuda, accelerator=accelerator, _C=c, Tensor=module(record_stream=placeholder))


def hook_values(allocations, block_bytes, requested_bytes, ooms=0):
    """The hooks' counters for `allocations` live small allocations (totals equal to the current values)."""
    values = []
    for current in (allocations, block_bytes, requested_bytes):
        for cls in ("all", "small_pool", "large_pool"):
            now = current if cls != "large_pool" else 0
            values += [now, now, now, 0]  # current, peak, allocated, freed
    return values + [ooms]


def test_hook_counters_become_pytorchs_keys_with_active_as_allocated():
    keys = _torch_stats.hook_values_to_keys(hook_values(3, 1536, 1000, ooms=2))
    assert keys["allocation.all.current"] == keys["active.all.current"] == 3
    assert keys["allocated_bytes.small_pool.peak"] == keys["active_bytes.small_pool.peak"] == 1536
    assert keys["requested_bytes.all.allocated"] == 1000 and keys["allocated_bytes.large_pool.current"] == 0
    assert keys["num_ooms"] == 2
    with pytest.raises(ValueError, match="counters"):
        _torch_stats.hook_values_to_keys([0] * 5)


def test_memory_stats_has_every_key_pytorchs_summary_reads_with_refpools_figures():
    torch = fake_torch()
    hooks = FakeHooks(hook_values(2, 1024, 1000))
    _torch_stats.use_hooks(hooks)
    replacements = _torch_memory_api.patch(torch, hooks)
    held = [allocator.malloc(n, 0) for n in (1000, 3000, 2 << 20)]
    try:
        assert torch.cuda.memory_stats == replacements.memory_stats == torch.cuda.memory.memory_stats
        stats = torch.cuda.memory.memory_stats()
        missing = [k for k in SUMMARY_KEYS if k not in stats]
        assert not missing, missing
        refpool_figures = allocator.stats()
        assert stats["allocation.all.current"] == 2 and stats["allocated_bytes.all.current"] == 1024  # the hooks'
        assert stats["reserved_bytes.all.current"] == refpool_figures["reserved_bytes"] > 0
        assert stats["reserved_bytes.large_pool.current"] == stats["reserved_bytes.all.current"]
        assert stats["reserved_bytes.small_pool.current"] == 0
        assert stats["segment.all.current"] == refpool_figures["segments"] + (
            refpool_figures["backend_allocations"] - refpool_figures["backend_frees"])
        assert stats["segment.all.current"] >= 1
        assert stats["inactive_split_bytes.all.current"] == refpool_figures["segment_free_bytes"]
        assert stats["num_device_alloc"] == (refpool_figures["backend_allocations"] + refpool_figures["segment_grows"]
                                             + refpool_figures["uncached_allocations"]) > 0
        assert stats["refpool.reserved_bytes"] == refpool_figures["reserved_bytes"]
        nested = torch._C._cuda_memoryStats(0)
        assert nested["allocation"]["all"]["current"] == 2 and nested["num_ooms"] == 0
        assert torch.accelerator.memory.memory_stats() == stats  # torch.accelerator reads the same
    finally:
        for p in held:
            allocator.free(p)
        _torch_stats.use_hooks(None)


def test_reset_accumulated_restarts_totals_and_event_counts_from_zero():
    torch = fake_torch()
    hooks = FakeHooks()
    _torch_stats.use_hooks(hooks)
    replacements = _torch_memory_api.patch(torch, hooks)
    try:
        p = allocator.malloc(8 << 20, 0)
        allocator.free(p)
        allocator.empty_cache()
        before = torch.cuda.memory_stats()
        assert before["num_device_alloc"] > 0 and before["reserved_bytes.all.allocated"] > 0
        assert before["reserved_bytes.all.freed"] > 0  # empty_cache gave it back
        torch.cuda.reset_accumulated_memory_stats()
        after = torch.cuda.memory_stats()
        assert after["num_device_alloc"] == after["num_device_free"] == 0
        assert after["reserved_bytes.all.allocated"] == after["reserved_bytes.all.freed"] == 0
        assert ("reset_accumulated", 0) in hooks.calls
        torch._C._cuda_resetAccumulatedMemoryStats = replacements.reset_accumulated_memory_stats
        p = allocator.malloc(8 << 20, 0)
        assert torch.cuda.memory_stats()["num_device_alloc"] >= 1  # counted again from 0
        allocator.free(p)
        torch.accelerator.reset_peak_memory_stats()
        assert ("reset_peak", 0) in hooks.calls
    finally:
        _torch_stats.use_hooks(None)


def test_memory_fraction_and_device_arguments():
    torch = fake_torch()
    replacements = _torch_memory_api.patch(torch, FakeHooks(fraction=0.25))
    assert torch.cuda.get_per_process_memory_fraction() == 0.25
    assert torch.cuda.get_per_process_memory_fraction("cuda:0") == 0.25
    with pytest.raises(ValueError, match="out of range"):
        torch.cuda.get_per_process_memory_fraction(7)
    assert torch.accelerator.get_memory_info() == (1 << 30, 1 << 34)
    without_hooks = _torch_memory_api.patch(fake_torch(), None)
    with pytest.raises(FrameworkError, match="set_device_limit"):
        without_hooks.get_per_process_memory_fraction()
    assert replacements.hooks is not None


def test_out_of_memory_observers_run_in_order_and_an_observer_error_does_not_stop_the_others(capsys):
    torch = fake_torch()
    hooks = FakeHooks()
    _torch_memory_api.patch(torch, hooks)
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(("first", args)))
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: 1 / 0)
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(("third", args)))
    assert hooks.observer is not None
    # What the hooks do before raising torch.OutOfMemoryError: call the C function pointer.
    notify = ctypes.cast(hooks.observer, _torch_memory_api.OOM_OBSERVER)
    notify(0, 1 << 40, 1 << 34, 1 << 30)
    assert seen == [("first", (0, 1 << 40, 1 << 34, 1 << 30)), ("third", (0, 1 << 40, 1 << 34, 1 << 30))]
    assert "ZeroDivisionError" in capsys.readouterr().err
    with pytest.raises(TypeError, match="callable"):
        torch._C._cuda_attach_out_of_memory_observer(3)
    with pytest.raises(FrameworkError, match="torch.OutOfMemoryError"):
        _torch_memory_api.patch(fake_torch(), None).attach_out_of_memory_observer(print)


def test_history_settings_follow_pytorchs_arguments():
    s = _torch_history.Settings("all", "all", "all", 1000, skip_actions=["free_requested", "segment_alloc"])
    assert (s.when, s.cpp, s.max_entries, s.clear) == (3, True, 1000, False)
    assert s.skip == 1 << _torch_history.ACTIONS.index("free_requested")  # segment_alloc never recorded
    state = _torch_history.Settings("state", "alloc", "python")
    assert (state.when, state.cpp, state.max_entries) == (2, False, 1)  # "state": a trace of one entry
    assert _torch_history.Settings("all", None).when == 0  # no frames
    off = _torch_history.Settings(None)
    assert off.enabled is None and off.clear  # stopping forgets what was recorded
    legacy = _torch_history.Settings.legacy(True, trace_alloc_max_entries=50, trace_alloc_record_context=True,
                                            record_context_cpp=True)
    assert (legacy.enabled, legacy.when, legacy.cpp, legacy.max_entries) == ("all", 3, True, 50)
    for bad in ({"enabled": "yes"}, {"context": "sometimes"}, {"stacks": "cpp"}, {"skip_actions": ["allocate"]}):
        with pytest.raises(ValueError):
            _torch_history.Settings(**bad)


def test_history_needs_the_hooks_and_says_so():
    replacements = _torch_memory_api.patch(fake_torch(), None)
    replacements.record_memory_history(None)  # stopping what never started does nothing
    with pytest.raises(FrameworkError, match="REFPOOL_CONF=log"):
        replacements.record_memory_history("all")


def test_snapshot_in_pytorchs_format_from_history_pools_and_log():
    frames = [{"filename": "train.py", "name": "step", "line": 12}]
    history = {"trace": [{"action": "alloc", "addr": 4096, "size": 100, "device": 0, "stream": 7, "time_us": 5,
                          "user_metadata": "m", "frames": frames},
                         {"action": "oom", "device_free": 10, "size": 1 << 40, "device": 1, "stream": 0,
                          "time_us": 6, "user_metadata": "", "frames": []}],
               "live": [{"addr": 4096, "size": 100, "device": 0, "stream": 7, "pool": [0, 0], "frames": frames}]}
    pools = [(8192, 2 << 20, 0, 9, 0, 3)]
    snap = _torch_snapshot.build(history, pools, devices=1)
    first, second = snap["segments"]
    assert (first["address"], first["total_size"], first["requested_size"]) == (4096, 512, 100)
    assert first["blocks"] == [{"address": 4096, "size": 512, "requested_size": 100, "state": "active_allocated",
                                "frames": frames}]
    assert first["segment_pool_id"] == (0, 0) and first["segment_type"] == "small"
    assert second["segment_pool_id"] == (0, 3) and second["segment_type"] == "large"
    assert len(snap["device_traces"]) == 2  # the oom on device 1
    assert snap["device_traces"][0][0]["addr"] == 4096 and snap["device_traces"][0][0]["compile_context"] == "N/A"
    assert snap["device_traces"][1][0] == {"action": "oom", "size": 1 << 40, "stream": 0, "time_us": 6, "frames": [],
                                           "user_metadata": "", "device_free": 10, "compile_context": "N/A"}
    assert [s["address"] for s in _torch_snapshot.build(history, pools, pool=(0, 3))["segments"]] == [8192]
    log = [Event(1, 1.0, True, 16384, 300, 0), Event(1, 2.0, True, 32768, 10, 0), Event(1, 3.0, False, 16384, 300, 0)]
    from_log = _torch_snapshot.build(None, pools, log_events=log)
    assert [s["address"] for s in from_log["segments"]] == [8192, 32768]
    assert [e["action"] for e in from_log["device_traces"][0]] == ["alloc", "alloc", "free_requested", "free_completed"]


def test_graph_tree_pool_calls_check_liveness_and_restore_what_they_can():
    rows = [(100, 512, 0, 1, 0, 5), (200, 512, 0, 1, 0, 5), (300, 512, 0, 1, 0, 6)]
    freed = []

    def free_storage(cdata):  # what torch._C._free_And_Remove_DeleterFn does: the storage's block goes
        freed.append(cdata)
        rows[:] = [r for r in rows if r[0] != cdata]

    torch = fake_torch()
    replacements = _torch_memory_api.patch(torch, FakeHooks())
    replacements.pools = _torch_checkpoint.PoolCalls(lambda: list(rows), free_storage)
    assert torch._C._cuda_checkPoolLiveAllocations(0, (0, 5), {100, 200})
    assert not torch._C._cuda_checkPoolLiveAllocations(0, (0, 5), {100})
    assert not torch._C._cuda_checkPoolLiveAllocations(0, (0, 5), {100, 200, 0})
    state = torch._C._cuda_getCheckpointState(0, (0, 5))
    torch._C._cuda_setCheckpointPoolState(0, state, [], [])  # nothing changed: nothing to do
    rows.append((400, 1024, 0, 1, 0, 5))  # allocated after the checkpoint
    with pytest.raises(RuntimeError, match="must be passed to set checkpoint"):
        torch._C._cuda_setCheckpointPoolState(0, state, [], [])
    torch._C._cuda_setCheckpointPoolState(0, state, [400], [])
    assert freed == [400] and torch._C._cuda_checkPoolLiveAllocations(0, (0, 5), {100, 200})
    rows[:] = [r for r in rows if r[0] != 200]  # a block of the checkpoint freed since
    with pytest.raises(FrameworkError) as refused:
        torch._C._cuda_setCheckpointPoolState(0, state, [], [])
    message = str(refused.value)
    assert "refpool.torch.mem_pool()" in message and "CUDAPluggableAllocator::setCheckpointPoolState" in message
    assert "cudagraph_trees = False" in message


def test_without_hooks_install_replaces_empty_cache_and_refuses_what_is_lost():
    torch = fake_torch()
    _torch_memory_api.patch(torch, None)
    assert torch.cuda.empty_cache is _torch_stats.empty_cache
    with pytest.raises(FrameworkError, match="set_device_limit"):
        torch.cuda.set_per_process_memory_fraction(0.5)
    with pytest.raises(FrameworkError, match="wait_stream"):
        torch.Tensor.record_stream(None, None)
    assert "OutOfMemoryError" in _torch_stats.LOST_FEATURES["out_of_memory"]
