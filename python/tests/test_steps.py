"""Issue 15's C API through the package, on the host backend: steps that span threads (plain and
planned), raw pointers (refpool_cache_malloc / refpool_malloc / refpool_free), zero bytes, free-by-pointer
misuse, stats by name and peak resets."""
import ctypes
import queue
import threading

import pytest

import refpool

# The counters issue 15's contract promises (docs: c_api_spec), by name.
PROMISED_STATS = {
    "hits", "misses", "steals", "backend_allocations", "backend_frees", "unsafe_frees", "escapes", "evictions",
    "reclaimed_blocks", "oom_retries", "ooms", "cross_stream_reuses", "scope_entries", "steps", "live_blocks",
    "idle_blocks", "live_bytes", "peak_live_bytes", "idle_bytes", "held_bytes", "peak_held_bytes",
    "uncached_allocations", "uncached_live_bytes", "plan_hits", "plan_misses", "plan_recordings", "plans",
    "arena_bytes", "planned_peak_live_bytes",
}


def write_and_check(address, nbytes, stamp):
    """Fills host memory with `stamp` and reads it back (the memory is really there and ours)."""
    memory = (ctypes.c_ubyte * nbytes).from_address(address)
    ctypes.memset(address, stamp, nbytes)
    assert memory[0] == stamp and memory[nbytes - 1] == stamp


def test_stats_by_name(cache):
    names = refpool.stat_names()
    assert PROMISED_STATS <= set(names), sorted(PROMISED_STATS - set(names))
    assert len(names) == len(set(names))
    descriptions = refpool.stat_descriptions()
    assert list(descriptions) == names
    assert all(text.strip() for text in descriptions.values())
    stats = cache.stats()
    assert list(stats) == names
    assert all(value == 0 for value in stats.values())


def test_cache_malloc_in_a_step(backend, cache):
    with cache.step():
        first = cache.malloc(backend, 1024)
        write_and_check(first, 1024, 0xA5)
        refpool.free(first)
        second = cache.malloc(backend, 1024)
        assert second == first  # the released block, served again
        stats = cache.stats()
        assert (stats["live_bytes"], stats["live_blocks"]) == (1024, 1)
        refpool.free(second)
    stats = cache.stats()
    assert (stats["misses"], stats["hits"], stats["backend_allocations"], stats["steps"]) == (1, 1, 1, 1)
    assert (stats["live_bytes"], stats["idle_bytes"], stats["held_bytes"]) == (0, 1024, 1024)
    assert stats["peak_live_bytes"] == 1024 and stats["escapes"] == 0


def test_cache_malloc_without_a_step_is_cached(backend, cache):
    # Like PyTorch's allocator: a cache serves pointer requests outside any step too.
    for _ in range(3):
        refpool.free(cache.malloc(backend, 4096))
    stats = cache.stats()
    assert (stats["backend_allocations"], stats["hits"]) == (1, 2)
    assert backend.stats()["outstanding_bytes"] == 4096


def test_zero_bytes(backend, cache):
    with cache.step():
        assert cache.malloc(backend, 0) == 0
    assert refpool.malloc(backend, 0) == 0
    refpool.free(0)  # a no-op, like free(NULL)
    assert cache.stats()["live_blocks"] == 0
    assert backend.stats()["allocation_count"] == 0


def test_double_free_is_an_error(backend, cache):
    address = cache.malloc(backend, 256)
    refpool.free(address)
    with pytest.raises(refpool.InvalidArgumentError) as raised:
        refpool.free(address)
    assert f"{address:x}" in str(raised.value).lower()
    stats = cache.stats()
    assert (stats["idle_blocks"], stats["live_blocks"]) == (1, 0)  # the second free changed nothing


def test_free_of_an_unknown_pointer_is_an_error(backend, cache):
    kept = cache.malloc(backend, 256)
    foreign = ctypes.create_string_buffer(256)
    with pytest.raises(refpool.InvalidArgumentError):
        refpool.free(ctypes.addressof(foreign))
    with pytest.raises(refpool.InvalidArgumentError):
        refpool.free(kept + 16)  # inside a block, not its start
    assert cache.stats()["live_blocks"] == 1
    refpool.free(kept)


def test_malloc_follows_the_threads_scope(backend, cache):
    with cache.scope():
        first = refpool.malloc(backend, 512)
        refpool.free(first)
        assert refpool.malloc(backend, 512) == first
        refpool.free(first)
    assert cache.stats()["hits"] == 1
    before = backend.stats()["allocation_count"]
    refpool.free(refpool.malloc(backend, 512))  # no scope: straight from the backend
    assert backend.stats()["allocation_count"] == before + 1


def test_buffer_on_a_stream(backend, cache):
    with cache.scope():
        buffer = refpool.alloc(backend, (8, 8), 4, stream=0)  # refpool_alloc_on_stream, default stream
        assert buffer.dims == (8, 8) and buffer.nbytes == 256
        buffer.record_stream(None)
        buffer.release()
    assert cache.stats()["misses"] == 1


def test_escape_from_a_step(backend, cache):
    with cache.step():
        kept = cache.malloc(backend, 2048)
        refpool.free(cache.malloc(backend, 64))
    stats = cache.stats()
    assert (stats["escapes"], stats["live_bytes"]) == (1, 2048)
    write_and_check(kept, 2048, 0x3C)  # an escaped block stays valid
    refpool.free(kept)
    assert cache.stats()["live_bytes"] == 0


def test_steps_do_not_nest(cache):
    with cache.step():
        with pytest.raises(refpool.ScopeError):
            cache.step().begin()
    with cache.step():  # the failed begin left nothing open
        pass
    assert cache.stats()["steps"] == 2


def test_step_ends_on_another_thread(backend, cache):
    step = cache.step().begin()
    address = cache.malloc(backend, 128)
    refpool.free(address)
    ender = threading.Thread(target=step.end)
    ender.start()
    ender.join()
    assert cache.stats()["steps"] == 1
    with cache.step():
        assert cache.malloc(backend, 128) == address
        refpool.free(address)


def run_two_thread_step(cache, backend, plan, sizes):
    """One step whose requests come from two threads in a fixed order, as PyTorch's forward (main
    thread) and backward (autograd thread): 'forward' allocates, 'backward' frees those and allocates
    its own. Returns the addresses in request order."""
    handoff = queue.Queue()
    addresses = []

    def forward():
        for n in sizes:
            address = cache.malloc(backend, n)
            write_and_check(address, n, 0x11)
            addresses.append(address)
        handoff.put(list(addresses))

    def backward():
        forward_addresses = handoff.get()
        gradients = []
        for n in reversed(sizes):
            address = cache.malloc(backend, n)
            write_and_check(address, n, 0x22)
            addresses.append(address)
            gradients.append(address)
        for address in forward_addresses + gradients:
            refpool.free(address)

    with cache.step(plan=plan):
        first = threading.Thread(target=forward)
        second = threading.Thread(target=backward)
        first.start()
        first.join()  # fixed order: all of forward, then all of backward
        second.start()
        second.join()
    return addresses


def test_plain_step_spans_two_threads(backend, cache):
    sizes = [1024, 4096, 256]
    for _ in range(3):
        run_two_thread_step(cache, backend, None, sizes)
    stats = cache.stats()
    assert stats["backend_allocations"] == 2 * len(sizes)  # the first step's; later ones are all hits
    assert stats["escapes"] == 0 and stats["live_bytes"] == 0 and stats["steps"] == 3


def test_planned_step_spans_two_threads(backend, cache):
    sizes = [1024, 4096, 256, 8192]
    runs = [run_two_thread_step(cache, backend, "train", sizes) for _ in range(5)]  # pending, recorded, 3 replays
    stats = cache.stats()
    assert stats["plan_recordings"] == 1 and stats["plans"] == 1
    assert stats["plan_hits"] == 3 * 2 * len(sizes) and stats["plan_misses"] == 0
    assert runs[2] == runs[3] == runs[4]  # replays give the same addresses, request by request
    assert stats["planned_peak_live_bytes"] == 2 * sum(sizes)  # the whole step is live before backward frees
    allocations = backend.stats()["allocation_count"]
    run_two_thread_step(cache, backend, "train", sizes)
    assert backend.stats()["allocation_count"] == allocations


def test_reset_peaks(backend, cache):
    big = cache.malloc(backend, 1 << 20)
    refpool.free(big)
    small = cache.malloc(backend, 4096)
    assert cache.stats()["peak_live_bytes"] == 1 << 20
    cache.reset_peaks()
    stats = cache.stats()
    assert stats["peak_live_bytes"] == 4096 and stats["peak_held_bytes"] == stats["held_bytes"]
    refpool.free(small)


def test_planned_regions_count_as_live_and_held(backend, cache):
    # The contract: allocated_bytes = bytes handed out and still referenced (PyTorch's
    # "allocated"), reserved_bytes = idle + live + arenas (PyTorch's "reserved"), whatever served them.
    for run in range(3):
        with cache.step(plan="p"):
            first, second = cache.malloc(backend, 1000), cache.malloc(backend, 3000)
            stats = cache.stats()
            refpool.free(first)
            refpool.free(second)
    assert stats["plan_hits"] >= 2  # the last run was a replay
    assert stats["plan_live_bytes"] >= 4000, stats
    assert stats["allocated_bytes"] >= 4000, stats
    assert stats["reserved_bytes"] >= stats["arena_bytes"] >= 4000, stats
    assert cache.stats()["peak_allocated_bytes"] >= 4000
