"""refpool.torch's PyTorch-facing side on the host, without PyTorch or a GPU: what install() puts into
torch (memory_stats and the functions on it, the resets, the memory fraction, out-of-memory
observers, snapshots, CUDA graph trees' pool calls), run against a fake `torch` namespace and a fake
of the compiled hooks' counters, over the real framework allocator on the host runtime. The same
behaviours run against real PyTorch on a GPU in test_torch.py."""
import contextlib
import ctypes
import types

import pytest

import refpool
import refpool._library
import refpool._types
from refpool import (_torch_checkpoint, _torch_history, _torch_hooks, _torch_memory_api, _torch_snapshot, _torch_stats,
                     allocator)
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
             "_set_memory_metadata", "empty_cache", "set_per_process_memory_fraction", "caching_allocator_enable")
    cuda_memory = module(**{n: placeholder for n in names})
    def device_index(device, optional=False):  # as torch.cuda._utils: an int as it is, "cuda:N" as N
        return device if isinstance(device, int) else int(str(device).partition(":")[2] or 0)

    utils = module(_get_device_index=device_index)
    cuda = module(memory=cuda_memory, _utils=utils, current_device=lambda: 0, device_count=lambda: 1,
                  mem_get_info=lambda device=None: (1 << 30, 1 << 34), **{n: placeholder for n in names})
    accelerator_memory = module(memory_stats=placeholder, reset_peak_memory_stats=placeholder,
                                reset_accumulated_memory_stats=placeholder, get_memory_info=placeholder,
                                empty_cache=placeholder)
    accelerator = module(memory=accelerator_memory, **vars(accelerator_memory))
    c = module(_cuda_attach_out_of_memory_observer=placeholder, _cuda_checkPoolLiveAllocations=placeholder,
               _cuda_getCheckpointState=placeholder, _cuda_setCheckpointPoolState=placeholder,
               _cuda_memoryStats=placeholder, _cuda_isHistoryEnabled=placeholder,
               _cuda_cudaCachingAllocator_enable=placeholder,
               _free_And_Remove_DeleterFn=(freed.append if freed is not None else placeholder))
    return module(cuda=cuda, accelerator=accelerator, _C=c, Tensor=module(record_stream=placeholder))


def hook_values(allocations, block_bytes, requested_bytes, ooms=0, active=None, active_bytes=None):
    """The hooks' counters for `allocations` live small allocations (totals equal to the current values),
    and `active` blocks of `active_bytes` (as many as allocated unless given: no free deferred)."""
    values = []
    active = allocations if active is None else active
    active_bytes = block_bytes if active_bytes is None else active_bytes
    for current in (allocations, block_bytes, requested_bytes, active, active_bytes):
        for cls in ("all", "small_pool", "large_pool"):
            now = current if cls != "large_pool" else 0
            values += [now, now, now, 0]  # current, peak, allocated, freed
    return values + [ooms]


def test_hook_counters_become_pytorchs_keys_active_its_own():
    keys = _torch_stats.hook_values_to_keys(hook_values(3, 1536, 1000, ooms=2))
    assert keys["allocation.all.current"] == keys["active.all.current"] == 3
    assert keys["allocated_bytes.small_pool.peak"] == keys["active_bytes.small_pool.peak"] == 1536
    assert keys["requested_bytes.all.allocated"] == 1000 and keys["allocated_bytes.large_pool.current"] == 0
    assert keys["num_ooms"] == 2
    keys = _torch_stats.hook_values_to_keys(hook_values(3, 1536, 1000, active=4, active_bytes=2048))
    assert keys["allocation.all.current"] == 3 and keys["active.all.current"] == 4  # a free deferred
    assert keys["allocated_bytes.all.peak"] == 1536 and keys["active_bytes.all.peak"] == 2048
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


# Every key torch.cuda.memory_stats() has with PyTorch's caching allocator (torch/csrc/cuda/Module.cpp's
# memoryStats, flattened by torch.cuda.memory_stats).
PYTORCH_KEYS = ([f"{m}.{c}.{f}" for m in ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
                                          "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
                 for c in ("all", "small_pool", "large_pool") for f in ("current", "peak", "allocated", "freed")]
                + [f"{m}.{f}" for m in ("oversize_allocations", "oversize_segments")
                   for f in ("current", "peak", "allocated", "freed")]
                + ["num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams", "num_device_alloc",
                   "num_device_free"])


def test_every_pytorch_key_has_a_value_with_and_without_the_hooks_and_active_is_allocated_without():
    held = [allocator.malloc(n, 0) for n in (1000, 3 << 20)]
    try:
        _torch_stats.use_hooks(None)  # no hooks: no free is deferred, so active is allocated
        without = _torch_stats.memory_stats(0)
        missing = [k for k in PYTORCH_KEYS if not isinstance(without.get(k), int)]
        assert not missing, missing
        assert without["active.all.current"] >= 2
        for cls in ("all", "small_pool", "large_pool"):
            for field in ("current", "peak", "allocated", "freed"):
                assert without[f"active.{cls}.{field}"] == without[f"allocation.{cls}.{field}"]
                assert without[f"active_bytes.{cls}.{field}"] == without[f"allocated_bytes.{cls}.{field}"]
        _torch_stats.use_hooks(FakeHooks(hook_values(2, 1024, 1000, active=3, active_bytes=1536)))
        with_hooks = _torch_stats.memory_stats(0)
        missing = [k for k in PYTORCH_KEYS if not isinstance(with_hooks.get(k), int)]
        assert not missing, missing
        assert with_hooks["active.all.current"] == 3 and with_hooks["allocation.all.current"] == 2
    finally:
        _torch_stats.use_hooks(None)
        for p in held:
            allocator.free(p)


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


def test_accelerator_empty_cache_goes_where_torch_cuda_empty_cache_goes():
    # torch.accelerator.empty_cache() reaches the allocator PyTorch registered for CUDA at start-up,
    # not the pluggable one install() made current; PyTorch's test_memory_stats calls it and found
    # refpool's idle segment still reserved. Under install() it is torch.cuda.empty_cache().
    torch = fake_torch()
    emptied = []
    torch.cuda.empty_cache = lambda: emptied.append("cuda")
    _torch_memory_api.patch(torch, FakeHooks())
    torch.accelerator.empty_cache()
    torch.accelerator.memory.empty_cache()
    assert emptied == ["cuda", "cuda"]
    without_hooks = fake_torch()
    _torch_memory_api.patch(without_hooks, None)  # torch.cuda.empty_cache is refpool's own then
    p = allocator.malloc(8 << 20, 0)
    allocator.free(p)
    assert allocator.stats()["idle_bytes"] > 0
    without_hooks.accelerator.empty_cache()
    assert allocator.stats()["idle_bytes"] == 0


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


def blocks_by_address(segments):
    return {b["address"]: b for s in segments for b in s["blocks"]}


def check_segment_sums(segments):
    """Each segment's blocks tile it, in address order, and its sizes are its blocks' (memory_viz's segsum
    checks the same)."""
    for s in segments:
        blocks = s["blocks"]
        assert sum(b["size"] for b in blocks) == s["total_size"]
        assert [b["address"] for b in blocks] == sorted(b["address"] for b in blocks)
        allocated = [b for b in blocks if b["state"] == "active_allocated"]
        active = [b for b in blocks if b["state"] in ("active_allocated", "active_pending_free")]
        assert s["allocated_size"] == sum(b["size"] for b in allocated)
        assert s["active_size"] == sum(b["size"] for b in active)
        assert s["requested_size"] == sum(b["requested_size"] for b in active)
        # PyTorch's free blocks coalesce: its snapshots never show two inactive blocks side by side,
        # and tests compare block counts across a checkpoint restore (TestBlockStateAbsorption).
        states = [b["state"] for b in blocks]
        assert all(not (a == b == "inactive") for a, b in zip(states, states[1:])), states


def test_snapshot_shows_refpools_segments_with_live_and_idle_blocks():
    # The framework allocator's real cache (host runtime, segments on): its map, not one segment per
    # allocation. History (faked: what the history library dumps) gives a live block its frames.
    frames = [{"filename": "train.py", "name": "step", "line": 3}]
    replacements = _torch_memory_api.patch(fake_torch(), FakeHooks())
    kept, freed, large = allocator.malloc(1000), allocator.malloc(5000), allocator.malloc(3 << 20)
    try:
        allocator.free(freed)
        history = {"trace": [], "live": [{"addr": kept, "size": 1000, "device": 0, "stream": 0, "pool": [0, 0],
                                          "frames": frames}]}
        snap = _torch_snapshot.build(history, devices=1, maps=replacements.memory_maps())
        check_segment_sums(snap["segments"])
        blocks = blocks_by_address(snap["segments"])
        assert blocks[kept]["state"] == "active_allocated" and blocks[kept]["frames"] == frames
        assert blocks[kept]["requested_size"] == 1000 and blocks[kept]["size"] >= 1000
        assert blocks[large]["state"] == "active_allocated" and blocks[large]["requested_size"] == blocks[large]["size"]
        assert blocks[freed]["state"] == "inactive" and blocks[freed]["requested_size"] == 0
        holding = [s for s in snap["segments"] if kept in {b["address"] for b in s["blocks"]}]
        assert len(holding) == 1 and holding[0]["segment_pool_id"] == (0, 0) and holding[0]["is_expandable"]
        assert holding[0]["segment_type"] == "small"
        assert blocks[freed]["size"] > 5000  # the idle piece and the segment's free bytes after it: one block
        # install()'s _snapshot without history: the same segments, from the map alone.
        assert [s["address"] for s in replacements.snapshot()["segments"]] == [s["address"] for s in snap["segments"]]
    finally:
        allocator.free(kept)
        allocator.free(large)
        allocator.empty_cache()
    after = blocks_by_address(replacements.memory_snapshot(mempool_id=(0, 0)))
    assert all(after[a]["state"] == "inactive" for a in (kept, large) if a in after)


def test_a_free_record_stream_deferred_is_active_pending_free_until_its_streams_are_done():
    # The history library marks a freed block whose free waits for record_stream's streams; refpool
    # still holds it (live in its map). PyTorch shows it active, not allocated.
    frames = [{"filename": "serve.py", "name": "decode", "line": 9}]
    replacements = _torch_memory_api.patch(fake_torch(), FakeHooks())
    kept, pending = allocator.malloc(1000), allocator.malloc(3000)
    try:
        live = [{"addr": kept, "size": 1000, "device": 0, "stream": 0, "pool": [0, 0], "frames": frames},
                {"addr": pending, "size": 3000, "device": 0, "stream": 0, "pool": [0, 0], "frames": frames,
                 "pending_free": True}]
        snap = _torch_snapshot.build({"trace": [], "live": live}, devices=1, maps=replacements.memory_maps())
        check_segment_sums(snap["segments"])
        blocks = blocks_by_address(snap["segments"])
        assert blocks[kept]["state"] == "active_allocated"
        assert blocks[pending]["state"] == "active_pending_free" and blocks[pending]["requested_size"] == 3000
        holding = [s for s in snap["segments"] if pending in {b["address"] for b in s["blocks"]}][0]
        assert holding["active_size"] - holding["allocated_size"] == blocks[pending]["size"]
        # Without a map (one segment per allocation): the same state, allocated 0.
        alone = [s for s in _torch_snapshot.build({"trace": [], "live": live}, devices=1)["segments"]
                 if s["address"] == pending][0]
        assert alone["blocks"][0]["state"] == "active_pending_free"
        assert (alone["allocated_size"], alone["active_size"]) == (0, alone["total_size"])
    finally:
        allocator.free(kept)
        allocator.free(pending)
        allocator.empty_cache()


@contextlib.contextmanager
def private_pool(pool):
    """The allocator routes requests on a stream it yields (a fake capturing stream) to private pool
    `pool` (as a CUDA graph capture does); ended and released after, and the cache emptied."""
    lib = refpool._library.lib()
    capturing = 0x4000
    accepts = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
        lambda context, stream: int(stream == capturing))
    lib.call("refpool_allocator_begin_pool", 0, refpool._types.PoolId(*pool), ctypes.cast(accepts, ctypes.c_void_p),
             None, None)
    try:
        yield capturing
    finally:
        lib.call("refpool_allocator_end_pool", 0, refpool._types.PoolId(*pool))
        lib.call("refpool_allocator_release_pool", 0, refpool._types.PoolId(*pool))
        allocator.empty_cache()


def test_a_pools_snapshot_keeps_its_segment_through_empty_cache():
    # PyTorch's test_mempool_emptycache_multithread in this project's words, on the host: a request
    # routed to a private pool, freed, then empty_cache while the pool is in use: the pool keeps its
    # memory, so its snapshot (memory_snapshot(mempool_id)) has one segment, and its blocks are idle.
    pool = (0, 737)
    with private_pool(pool) as capturing:
        replacements = _torch_memory_api.patch(fake_torch(), FakeHooks())
        address = allocator.malloc(4 * 4, stream=capturing)
        replacements.hooks.pool_rows = [(address, 16, 0, capturing, *pool)]  # what the hooks' table would say
        live = replacements.memory_snapshot(mempool_id=pool)
        assert len(live) == 1 and live[0]["segment_pool_id"] == pool
        assert blocks_by_address(live)[address]["requested_size"] == 16
        assert blocks_by_address(live)[address]["state"] == "active_allocated"
        assert address not in blocks_by_address(replacements.memory_snapshot(mempool_id=(0, 0)))
        allocator.free(address)
        replacements.hooks.pool_rows = []
        allocator.empty_cache()
        after = replacements.memory_snapshot(mempool_id=pool)
        assert len(after) == 1, after  # "Expected to have a single segment"
        check_segment_sums(after)
        assert blocks_by_address(after)[address]["state"] == "inactive"
        assert all(b["state"] == "inactive" for b in after[0]["blocks"])
    assert replacements.memory_snapshot(mempool_id=pool) == []


def test_a_pools_block_whose_free_waits_for_record_stream_stays_in_its_pools_snapshot():
    # A hostile review of active_pending_free in a private pool: the free hook untracks the pool's
    # allocation at the free, before it is deferred, so only the history (its pool recorded at the
    # allocation) and the pool's map (refpool still holds it) know it: the pool's snapshot shows it
    # active_pending_free, and the allocator cache's does not show it.
    pool = (0, 738)
    with private_pool(pool) as capturing:
        replacements = _torch_memory_api.patch(fake_torch(), FakeHooks())
        kept, pending = allocator.malloc(1000, stream=capturing), allocator.malloc(3000, stream=capturing)
        try:
            replacements.hooks.pool_rows = [(kept, 1000, 0, capturing, *pool)]  # pending: untracked at its free
            live = [{"addr": kept, "size": 1000, "device": 0, "stream": capturing, "pool": list(pool), "frames": []},
                    {"addr": pending, "size": 3000, "device": 0, "stream": capturing, "pool": list(pool), "frames": [],
                     "pending_free": True}]
            replacements.history = types.SimpleNamespace(recording=True, dump=lambda: {"trace": [], "live": live})
            segments = replacements.memory_snapshot(mempool_id=pool)
            check_segment_sums(segments)
            blocks = blocks_by_address(segments)
            assert blocks[kept]["state"] == "active_allocated" and blocks[kept]["requested_size"] == 1000
            assert blocks[pending]["state"] == "active_pending_free" and blocks[pending]["requested_size"] == 3000
            assert all(s["segment_pool_id"] == pool for s in segments)
            assert pending not in blocks_by_address(replacements.memory_snapshot(mempool_id=(0, 0)))
        finally:
            replacements.history = None
            allocator.free(kept)
            allocator.free(pending)


def test_snapshot_from_maps_keeps_unlisted_allocations_and_folds_arenas():
    # A map with a plan's arena holding two allocations, and a live allocation no map lists (a plain
    # buffer of a cache without segments): the arena is one block, the plain buffer a segment of its own.
    # Maps written out here: build() is plain Python, and an arena and a hole are quick to state.
    from refpool.memory_map import Range, Segment
    arena = Segment(1 << 20, 1 << 21, 1 << 21, 0, "device", "large", True,
                    [Range(1 << 20, 1 << 20, "span_held"), Range(2 << 20, 1 << 20, "free")])
    history = {"trace": [], "live": [{"addr": a, "size": 100, "device": 0, "stream": 0, "pool": [0, 0], "frames": []}
                                     for a in ((1 << 20) + 512, (1 << 20) + 4096, 1 << 30)]}
    # A segment with an uncommitted hole (trim gave a commit back): one PyTorch segment per run.
    holed = Segment(1 << 24, 1 << 23, 1 << 21, 0, "device", "small", True,
                    [Range(1 << 24, 1 << 20, "idle"), Range((1 << 24) + (3 << 20), 1 << 20, "free")])
    snap = _torch_snapshot.build(history, maps=[((0, 0), [arena]), ((0, 4), [holed])])
    assert [s["address"] for s in snap["segments"]] == [1 << 20, 1 << 24, (1 << 24) + (3 << 20), 1 << 30]
    assert [b["state"] for b in snap["segments"][0]["blocks"]] == ["active_allocated", "inactive"]
    assert [s["total_size"] for s in snap["segments"][1:3]] == [1 << 20, 1 << 20]
    assert [s["segment_pool_id"] for s in snap["segments"]] == [(0, 0), (0, 4), (0, 4), (0, 0)]
    assert snap["segments"][3]["blocks"][0]["requested_size"] == 100  # the per-allocation form
    check_segment_sums(snap["segments"][:3])


def test_an_arena_whose_first_allocation_waits_for_record_stream_is_still_allocated():
    # A hostile review of active_pending_free: a plan's arena (span_held) is one block for all the
    # allocations inside it. The one at its start freed, its free deferred by record_stream, while
    # another inside is live: the arena is still allocated, not pending as that first allocation is.
    from refpool.memory_map import Range, Segment
    arena = Segment(1 << 20, 1 << 21, 1 << 21, 0, "device", "large", True,
                    [Range(1 << 20, 1 << 20, "span_held"), Range(2 << 20, 1 << 20, "free")])
    live = [{"addr": 1 << 20, "size": 100, "device": 0, "stream": 0, "pool": [0, 0], "frames": [],
             "pending_free": True},
            {"addr": (1 << 20) + 4096, "size": 100, "device": 0, "stream": 0, "pool": [0, 0], "frames": []}]
    snap = _torch_snapshot.build({"trace": [], "live": live}, maps=[((0, 0), [arena])])
    check_segment_sums(snap["segments"])
    (held,) = snap["segments"]
    assert [b["state"] for b in held["blocks"]] == ["active_allocated", "inactive"]
    assert held["allocated_size"] == held["active_size"] == 1 << 20


def test_snapshot_drops_allocations_a_map_shows_freed_since_the_history():
    # The history is dumped (or the log read) before the maps are taken: an allocation freed in
    # between is live in the history and an idle piece or free bytes in the map. The map is newer:
    # no second segment over the map's bytes (memory_viz would draw both). Odd shapes beside it: a
    # segment with no committed bytes (no runs), a hole at its start, another device at the same
    # addresses (kept: not covered on its own device).
    from refpool.memory_map import Range, Segment
    base = 1 << 24
    mapped = Segment(base, 1 << 22, 3 << 20, 0, "device", "large", True,
                     [Range(base + (1 << 20), 1 << 20, "idle"), Range(base + (2 << 20), 1 << 20, "free"),
                      Range(base + (3 << 20), 1 << 20, "live")])
    empty = Segment(1 << 26, 1 << 21, 0, 0, "device", "small", True, [])
    freed_since = [base + (1 << 20), base + (2 << 20) + 4096]  # in the idle piece, in the free bytes
    other_device = base + (1 << 20)
    history = {"trace": [], "live": [{"addr": a, "size": 100, "device": 0, "stream": 0, "pool": [0, 0], "frames": []}
                                     for a in freed_since + [base + (3 << 20)]] +
               [{"addr": other_device, "size": 100, "device": 1, "stream": 0, "pool": [0, 0], "frames": []}]}
    snap = _torch_snapshot.build(history, devices=2, maps=[((0, 0), [mapped, empty])])
    on_device_0 = sorted((s["address"], s["address"] + s["total_size"]) for s in snap["segments"] if s["device"] == 0)
    assert on_device_0 == [(base + (1 << 20), base + (4 << 20))]  # one run, from the first committed byte
    assert all(a[1] <= b[0] for a, b in zip(on_device_0, on_device_0[1:]))  # no overlap
    assert [b["state"] for b in snap["segments"][0]["blocks"]] == ["inactive", "active_allocated"]  # idle + free
    assert snap["segments"][0]["blocks"][0]["size"] == 2 << 20
    assert snap["segments"][0]["blocks"][1]["requested_size"] == 100
    assert [(s["device"], s["address"]) for s in snap["segments"] if s["device"] == 1] == [(1, other_device)]
    check_segment_sums(snap["segments"])


def test_graph_tree_pool_calls_check_liveness_and_restore_a_checkpoint():
    rows = [(100, 512, 0, 1, 0, 5), (200, 512, 0, 7, 0, 5), (300, 512, 0, 1, 0, 6)]
    freed, restored, adopted = [], [], []
    storages = {11: 100, 22: 200, 33: 999}  # storage _cdata -> the address it refers to

    def free_storage(cdata):  # what torch._C._free_And_Remove_DeleterFn does: the storage's block goes
        freed.append(cdata)
        rows[:] = [r for r in rows if r[0] != cdata]

    def restore(device, pool, address, size, stream):  # the hooks: the pool allocates those bytes again
        if any(r[0] == address for r in rows):
            raise FrameworkError(f"{address} is live")
        restored.append((device, tuple(pool), address, size, stream))
        rows.append((address, size, device, stream, *pool))

    torch = fake_torch()
    replacements = _torch_memory_api.patch(torch, FakeHooks())
    replacements.pools = _torch_checkpoint.PoolCalls(lambda: list(rows), free_storage, restore, storages.get,
                                                     lambda cdata, device: adopted.append((cdata, device)))
    assert torch._C._cuda_checkPoolLiveAllocations(0, (0, 5), {100, 200})
    assert not torch._C._cuda_checkPoolLiveAllocations(0, (0, 5), {100})
    assert not torch._C._cuda_checkPoolLiveAllocations(0, (0, 5), {100, 200, 0})
    state = torch._C._cuda_getCheckpointState(0, (0, 5))
    torch._C._cuda_setCheckpointPoolState(0, state, [], [])  # nothing changed: nothing to do
    assert restored == [] and adopted == []
    rows.append((400, 1024, 0, 1, 0, 5))  # allocated after the checkpoint
    with pytest.raises(RuntimeError, match="must be passed to set checkpoint"):
        torch._C._cuda_setCheckpointPoolState(0, state, [], [])
    torch._C._cuda_setCheckpointPoolState(0, state, [400], [])
    assert freed == [400] and torch._C._cuda_checkPoolLiveAllocations(0, (0, 5), {100, 200})
    rows[:] = [r for r in rows if r[0] != 200]  # a block of the checkpoint freed since: allocated again there
    torch._C._cuda_setCheckpointPoolState(0, state, [], [22, 33, 22])
    assert restored == [(0, (0, 5), 200, 512, 7)]  # at its address, size and stream; pool (0, 6) untouched
    assert torch._C._cuda_checkPoolLiveAllocations(0, (0, 5), {100, 200})
    assert adopted == [(22, 0)]  # storage 33 refers to no allocation of the checkpoint; 22 once
    rows[:] = [r for r in rows if r[0] != 100]
    rows.append((100, 256, 0, 1, 0, 5))  # another size at a checkpoint address, not passed as stale
    with pytest.raises(FrameworkError, match="holds 256 B at 0x64, the checkpoint 512 B"):
        torch._C._cuda_setCheckpointPoolState(0, state, [], [])
    with pytest.raises(TypeError, match="not a checkpoint"):
        torch._C._cuda_setCheckpointPoolState(0, object(), [], [])


@pytest.mark.parametrize("hooks", [FakeHooks, None])
def test_caching_allocator_enable_reaches_the_allocator(hooks):
    # PyTorch's pluggable interface forwards no enable(): install() patches torch.cuda's function and
    # the torch._C one it calls, which set librefpool's one setting (the hooks read it per request;
    # their bookkeeping of uncounted requests is tested below, on the host).
    torch = fake_torch()
    _torch_memory_api.patch(torch, hooks() if hooks else None)
    seen = []
    try:
        for enable, value in ((torch.cuda.caching_allocator_enable, False), (torch.cuda.memory.caching_allocator_enable, True),
                              (torch._C._cuda_cudaCachingAllocator_enable, 0), (torch._C._cuda_cudaCachingAllocator_enable, 1)):
            enable(value)
            seen.append(refpool.allocator.caching())
        torch.cuda.caching_allocator_enable(False)
        torch.cuda.caching_allocator_enable()  # PyTorch's default: on
        seen.append(refpool.allocator.caching())
    finally:
        refpool.allocator.set_caching(True)
    assert seen == [False, True, False, True, True]


def test_without_hooks_install_replaces_empty_cache_and_refuses_what_is_lost():
    torch = fake_torch()
    _torch_memory_api.patch(torch, None)
    assert torch.cuda.empty_cache is _torch_stats.empty_cache
    with pytest.raises(FrameworkError, match="set_device_limit"):
        torch.cuda.set_per_process_memory_fraction(0.5)
    with pytest.raises(FrameworkError, match="wait_stream"):
        torch.Tensor.record_stream(None, None)
    assert "OutOfMemoryError" in _torch_stats.LOST_FEATURES["out_of_memory"]


# ---- the hooks' real counters, built on the host (they are torch-free) ----------------------------

# Test-only entry points over the counters: count requests, and a thread race with a known peak.
COUNTER_DRIVER = r"""
#include "_torch_hooks_counters.cpp"  // the hooks' own file: one compiler run builds both

#include <thread>
#include <vector>

enum { freed, served, deferred, back };  // a deferred free: freed, still active, until back (inactive)
extern "C" long long count_request(int device, unsigned long long size, int what) {
  refpool_torch::device_counters* c = refpool_torch::counters_of(device);
  if (c == nullptr) return -1;
  switch (what) {
    case served: return c->on_alloc(size);
    case deferred: return c->on_free(size, true);
    case back: c->on_inactive(size); return 0;
    default: return c->on_free(size);
  }
}
extern "C" void count_oom(int device) { refpool_torch::counters_of(device)->on_oom(); }

// Requests served while caching is off (caching_allocator_enable(False)): `threads` threads each
// note `each` addresses of their own and forget them, twice each (the second must find none).
// Returns the forgets that answered wrongly.
extern "C" int uncounted_race(int threads, int each) {
  std::atomic<int> wrong{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      auto address = [t](int i) { return reinterpret_cast<void*>((std::uintptr_t(t + 1) << 32) | (std::uintptr_t(i + 1) << 4)); };
      for (int i = 0; i < each; ++i) refpool_torch::note_uncounted(address(i));
      for (int i = 0; i < each; ++i) wrong += refpool_torch::forget_uncounted(address(i)) ? 0 : 1;
      for (int i = 0; i < each; ++i) wrong += refpool_torch::forget_uncounted(address(i)) ? 1 : 0;
    });
  for (auto& t : pool) t.join();
  return wrong.load();
}
extern "C" int note_and_forget(unsigned long long note, unsigned long long forget) {
  refpool_torch::note_uncounted(reinterpret_cast<void*>(note));
  return refpool_torch::forget_uncounted(reinterpret_cast<void*>(forget)) ? 1 : 0;
}
extern "C" void set_fraction(int device, double f) { refpool_torch::remember_memory_fraction(device, f); }

// `threads` threads, `rounds` times: each makes `burst` requests of its own size (thread t: t+1
// small blocks, or t+1 MiB and a byte, large, on odd rounds), all wait until every one has, then
// free them (every other one deferred), wait, take the deferred ones back, and wait again.
extern "C" void race(int device, int threads, int rounds, int burst) {
  std::atomic<int> arrived{0};
  auto wait_for = [&](int target) { arrived.fetch_add(1); while (arrived.load() < target) std::this_thread::yield(); };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([=, &wait_for] {
      for (int r = 0; r < rounds; ++r) {
        const unsigned long long size = r % 2 == 0 ? 512ULL * (t + 1) : (1ULL << 20) * (t + 1) + 1;
        for (int i = 0; i < burst; ++i) count_request(device, size, served);
        wait_for((3 * r + 1) * threads);
        for (int i = 0; i < burst; ++i) count_request(device, size, i % 2 == 0 ? freed : deferred);
        wait_for((3 * r + 2) * threads);
        for (int i = 1; i < burst; i += 2) count_request(device, size, back);
        wait_for((3 * r + 3) * threads);
      }
    });
  for (auto& t : pool) t.join();
}
"""


@pytest.fixture(scope="module")
def counters(tmp_path_factory):
    """_torch_hooks_counters.cpp with COUNTER_DRIVER built into a library, with the sanitizer this
    process runs under (CI's ASan pass preloads it)."""
    import os
    import shutil
    import subprocess
    from pathlib import Path
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the hooks' counters with")
    source_dir = Path(refpool.__file__).parent
    folder = tmp_path_factory.mktemp("counters")
    (folder / "driver.cpp").write_text(COUNTER_DRIVER)
    preload = os.environ.get("LD_PRELOAD", "")
    sanitize = (["-fsanitize=address,undefined"] if "libasan" in preload else
                ["-fsanitize=thread"] if "libtsan" in preload else [])
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # the compiler runs plain
    subprocess.run([compiler, "-std=c++17", "-O1", "-shared", "-fPIC", "-pthread", *sanitize, f"-I{source_dir}",
                    str(folder / "driver.cpp"), "-o", str(folder / "counters.so")], check=True, env=env,
                   capture_output=True)
    from refpool import _torch_hooks
    library = _torch_hooks._declare(ctypes.CDLL(str(folder / "counters.so")),
                                    {name: _torch_hooks.HOOK_SIGNATURES[name] for name in (
                                        "refpool_torch_hooks_stat_count", "refpool_torch_hooks_device_stats",
                                        "refpool_torch_hooks_reset_peak_stats",
                                        "refpool_torch_hooks_reset_accumulated_stats",
                                        "refpool_torch_hooks_memory_fraction")})
    library.count_request.restype, library.count_request.argtypes = ctypes.c_longlong, [
        ctypes.c_int, ctypes.c_ulonglong, ctypes.c_int]
    library.count_oom.argtypes = [ctypes.c_int]
    library.uncounted_race.argtypes = [ctypes.c_int, ctypes.c_int]
    library.note_and_forget.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong]
    library.set_fraction.argtypes = [ctypes.c_int, ctypes.c_double]
    library.race.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return library


def counted(library, device):
    return _torch_stats.hook_values_to_keys(_torch_stats.device_stat_values(library, device))


def test_hook_counters_count_each_request_as_pytorchs_allocator_does(counters):
    # PyTorch's rules: up to 1 MiB is the small pool, allocated bytes are 512-byte blocks.
    small, large = 100, 3 * (1 << 20) + 1
    assert counters.count_request(0, small, 1) == 512
    assert counters.count_request(0, large, 1) == 512 + 3 * (1 << 20) + 512
    assert counters.count_request(0, small, 0) == 3 * (1 << 20) + 512
    keys = counted(counters, 0)
    assert [keys[f"allocation.all.{f}"] for f in ("current", "peak", "allocated", "freed")] == [1, 2, 2, 1]
    assert [keys[f"allocation.small_pool.{f}"] for f in ("current", "peak", "allocated", "freed")] == [0, 1, 1, 1]
    assert [keys[f"allocation.large_pool.{f}"] for f in ("current", "peak", "allocated", "freed")] == [1, 1, 1, 0]
    assert keys["allocated_bytes.all.peak"] == 512 + 3 * (1 << 20) + 512
    assert keys["allocated_bytes.small_pool.freed"] == 512
    assert [keys[f"requested_bytes.all.{f}"] for f in ("current", "peak", "allocated", "freed")] == [
        large, small + large, small + large, small]
    assert keys["active_bytes.large_pool.current"] == 3 * (1 << 20) + 512 and keys["num_ooms"] == 0

    counters.count_oom(0)
    counters.refpool_torch_hooks_reset_peak_stats(0)
    keys = counted(counters, 0)
    assert keys["num_ooms"] == 1 and keys["allocation.all.peak"] == 1
    assert keys["allocated_bytes.small_pool.peak"] == 0
    assert keys["allocated_bytes.all.allocated"] == 512 + 3 * (1 << 20) + 512

    counters.refpool_torch_hooks_reset_accumulated_stats(0)
    counters.count_request(0, large, 0)
    keys = counted(counters, 0)
    assert keys["num_ooms"] == 0 and keys["allocation.all.current"] == 0
    assert keys["allocation.all.allocated"] == 0 and keys["allocation.all.freed"] == 1
    assert keys["requested_bytes.large_pool.freed"] == large and keys["requested_bytes.large_pool.peak"] == large


def test_hook_counters_are_exact_with_threads_racing(counters):
    threads, rounds, burst = 4, 200, 64
    counters.race(1, threads, rounds, burst)
    keys = counted(counters, 1)
    assert keys["allocation.all.current"] == 0 and keys["allocated_bytes.all.current"] == 0
    assert keys["allocation.all.allocated"] == keys["allocation.all.freed"] == threads * rounds * burst
    # All threads' requests are live together at each round's barrier, and never more.
    assert keys["allocation.all.peak"] == keys["allocation.small_pool.peak"] == threads * burst
    small = burst * sum(512 * (t + 1) for t in range(threads))
    large_blocks = burst * sum((1 << 20) * (t + 1) + 512 for t in range(threads))
    assert keys["allocated_bytes.small_pool.peak"] == small
    assert keys["allocated_bytes.large_pool.peak"] == keys["allocated_bytes.all.peak"] == large_blocks
    assert keys["requested_bytes.large_pool.peak"] == burst * sum((1 << 20) * (t + 1) + 1 for t in range(threads))
    assert keys["requested_bytes.all.allocated"] == keys["requested_bytes.all.freed"]
    # Deferred frees leave blocks active between the barriers: active peaks as allocation, and ends at 0.
    assert keys["active.all.current"] == keys["active_bytes.all.current"] == 0
    assert keys["active.all.peak"] == threads * burst and keys["active_bytes.all.peak"] == large_blocks
    assert keys["active.all.allocated"] == keys["active.all.freed"] == threads * rounds * burst
    assert keys["active_bytes.small_pool.freed"] == keys["allocated_bytes.small_pool.freed"]


def test_hook_counters_keep_a_deferred_free_active_until_it_is_back(counters):
    # PyTorch's meaning: a block whose recorded streams are busy at its free is no longer allocated,
    # but active until their events complete and it goes back to the allocator.
    freed, served, deferred, back = range(4)
    small, large = 100, 3 * (1 << 20) + 1
    large_block = 3 * (1 << 20) + 512
    counters.count_request(3, small, served)
    counters.count_request(3, large, served)
    assert counters.count_request(3, large, deferred) == 512  # allocated_bytes.all.current
    keys = counted(counters, 3)
    assert keys["allocation.all.current"] == 1 and keys["active.all.current"] == 2
    assert keys["allocated_bytes.all.current"] == 512 and keys["active_bytes.all.current"] == 512 + large_block
    assert keys["allocation.large_pool.freed"] == 1 and keys["active.large_pool.freed"] == 0
    assert keys["requested_bytes.all.current"] == small
    counters.count_request(3, small, served)  # while the large block is pending
    keys = counted(counters, 3)
    assert keys["allocation.all.peak"] == 2 and keys["active.all.peak"] == 3
    assert keys["allocated_bytes.all.peak"] == 512 + large_block
    assert keys["active_bytes.all.peak"] == 1024 + large_block and keys["active_bytes.small_pool.peak"] == 1024

    counters.refpool_torch_hooks_reset_accumulated_stats(3)
    keys = counted(counters, 3)
    assert all(keys[f"{kind}.{cls}.{field}"] == 0 for kind in ("active", "active_bytes")
               for cls in ("all", "small_pool", "large_pool") for field in ("allocated", "freed"))
    counters.count_request(3, large, back)  # its events completed: back to refpool
    keys = counted(counters, 3)
    assert keys["allocation.all.current"] == keys["active.all.current"] == 2
    assert keys["allocated_bytes.all.current"] == keys["active_bytes.all.current"] == 1024
    assert keys["active.large_pool.freed"] == 1 and keys["active_bytes.large_pool.freed"] == large_block
    assert keys["allocation.large_pool.freed"] == 0  # its free was counted before the reset
    assert keys["active.all.peak"] == 3  # peaks stay until reset_peak_memory_stats
    counters.refpool_torch_hooks_reset_peak_stats(3)
    keys = counted(counters, 3)
    assert keys["active.all.peak"] == 2 and keys["active_bytes.all.peak"] == 1024
    counters.count_request(3, small, freed)  # not deferred: inactive at once
    keys = counted(counters, 3)
    assert keys["allocation.all.current"] == keys["active.all.current"] == 1
    assert keys["active_bytes.small_pool.freed"] == keys["allocated_bytes.small_pool.freed"] == 512


def test_hook_counters_memory_fraction_and_devices_out_of_range(counters):
    assert counters.refpool_torch_hooks_memory_fraction(2) == 1.0
    counters.set_fraction(2, 0.25)
    assert counters.refpool_torch_hooks_memory_fraction(2) == 0.25
    assert counters.refpool_torch_hooks_memory_fraction(64) == 1.0
    assert counters.count_request(64, 512, 1) == -1 and counters.count_request(-1, 512, 1) == -1
    with pytest.raises(ValueError, match="out of range"):
        _torch_stats.device_stat_values(counters, 64)


# ---- building the hooks: what a failed build says, and what is tried ------------------------------

GCC_FAILURE = """Error building extension 'refpool_torch_hooks': [1/5] c++ -MMD -MF _torch_hooks.o.d \
-DTORCH_EXTENSION_NAME=refpool_torch_hooks -isystem /site/torch/include -c /pkg/_torch_hooks.cpp -o _torch_hooks.o
FAILED: _torch_hooks.o
c++ -MMD -MF _torch_hooks.o.d -DTORCH_EXTENSION_NAME=refpool_torch_hooks -c /pkg/_torch_hooks.cpp -o _torch_hooks.o
/pkg/_torch_hooks.cpp: In function 'void {anonymous}::fail(int, const char*)':
/pkg/_torch_hooks.cpp:71:3: error: 'OutOfMemoryErrorX' is not a member of 'c10'
   71 |   TORCH_CHECK_WITH(OutOfMemoryErrorX, status != refpool_error_out_of_memory, api.last_error());
      |   ^~~~~~~~~~~~~~~~
ninja: build stopped: subcommand failed.
"""


def test_compiler_errors_show_the_errors_not_the_command_lines():
    from refpool._torch_hooks import compiler_errors
    shown = compiler_errors(GCC_FAILURE)
    assert "FAILED: _torch_hooks.o" in shown and "71:3: error: 'OutOfMemoryErrorX'" in shown
    assert "TORCH_CHECK_WITH(OutOfMemoryErrorX" in shown and "-isystem" not in shown
    assert compiler_errors("Ninja is required to load C++ extensions") == "Ninja is required to load C++ extensions"
    assert len(compiler_errors("\n".join(f"x.cpp:{i}:1: error: e{i}" for i in range(40))).splitlines()) == 12


class FailingCppExtension:
    """torch.utils.cpp_extension's load, failing as a compiler would for the first `failures` calls,
    then 'building' by writing the file it names (renamed as cpp_extension renames a rebuild)."""

    def __init__(self, failures):
        self.failures = failures
        self.calls = []

    def load(self, name, sources, build_directory, extra_cflags, **options):
        import os
        self.calls.append((name, list(extra_cflags), os.environ.get("TORCH_CUDA_ARCH_LIST")))
        if len(self.calls) <= self.failures:
            raise RuntimeError(GCC_FAILURE)
        path = f"{build_directory}/{name}_v1.so"
        open(path, "w").close()
        return path


@pytest.fixture
def fake_cpp_extension(monkeypatch, tmp_path):
    import sys
    monkeypatch.setenv("REFPOOL_TORCH_HOOKS_DIR", str(tmp_path))
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)

    def install(failures):
        extension = FailingCppExtension(failures)
        torch = types.ModuleType("torch")
        torch.__version__, torch.version = "2.11.0+test", types.SimpleNamespace(cuda="13.0")
        torch.utils = types.ModuleType("torch.utils")
        torch.utils.cpp_extension = extension
        for name, module in (("torch", torch), ("torch.utils", torch.utils),
                             ("torch.utils.cpp_extension", extension)):
            monkeypatch.setitem(sys.modules, name, module)
        return torch, extension
    return install


def test_a_failed_build_says_what_the_compiler_said_and_is_not_compiled_again(fake_cpp_extension):
    import os
    from refpool import _torch_hooks
    torch, extension = fake_cpp_extension(failures=2)
    with pytest.warns(UserWarning, match="retrying with -DREFPOOL_NO_PLUGGABLE_HEADER"):
        with pytest.raises(FrameworkError, match="(?s)cannot be built.*71:3: error: 'OutOfMemoryErrorX'") as first:
            _torch_hooks.build(torch)
    assert [(name, flags) for name, flags, _ in extension.calls] == [
        ("refpool_torch_hooks", ["-O2"]),
        ("refpool_torch_hooks_portable", ["-O2", "-DREFPOOL_NO_PLUGGABLE_HEADER"])]
    # cpp_extension must not ask the GPU its architecture (that initialises CUDA): one is named.
    assert {arch for _, _, arch in extension.calls} == {"9.0"} and "TORCH_CUDA_ARCH_LIST" not in os.environ
    assert "build-failed.log" in str(first.value) and "-isystem" not in str(first.value)
    with pytest.raises(FrameworkError, match="(?s)could not be built earlier.*OutOfMemoryErrorX"):
        _torch_hooks.build(torch)
    assert len(extension.calls) == 2


def test_the_fallback_build_is_found_under_the_name_cpp_extension_gave_it(fake_cpp_extension, monkeypatch):
    from refpool import _torch_hooks
    torch, extension = fake_cpp_extension(failures=1)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    with pytest.warns(UserWarning, match="OutOfMemoryErrorX"):
        path = _torch_hooks.build(torch)
    assert path.name == "refpool_torch_hooks_portable_v1.so" and path.is_file()
    assert extension.calls[-1][2] == "9.0"
    import os
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "8.0"  # the user's, back


def test_every_function_the_hooks_import_is_declared_and_exported():
    # refpool_torch_hooks_bind takes librefpool's functions by name (IMPORTS): each must be a declared,
    # exported function of the loaded library, or the hooks cannot load on the GPU machine.
    library = refpool._library.lib()
    for name in _torch_hooks.IMPORTS:
        assert library.address(name), name


def test_requests_served_while_caching_is_off_are_forgotten_once(counters):
    # The hooks remember the requests they served uncounted (caching_allocator_enable(False)) until
    # their frees: only those, each once, with threads racing.
    assert counters.note_and_forget(0x10000, 0x20000) == 0  # another address: not one of them
    assert counters.note_and_forget(0x20000, 0x10000) == 1
    assert counters.note_and_forget(0x30000, 0x20000) == 1
    assert counters.note_and_forget(0x40000, 0x30000) == 1
    assert counters.note_and_forget(0x50000, 0x40000) == 1
    assert counters.note_and_forget(0x50000, 0x50000) == 1  # noted twice, remembered once
    assert counters.note_and_forget(0x60000, 0x50000) == 0
    assert counters.note_and_forget(0x60000, 0x60000) == 1
    assert counters.uncounted_race(4, 5000) == 0
