"""Issue 15's C API through the package, on the host backend: steps that span threads (plain and
planned), cache-level and scoped requests (refpool_alloc with and without a cache), zero bytes,
release misuse, stats by name and peak resets."""
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


def write_and_check(buffer, nbytes, stamp):
    """Fills a host buffer with `stamp` and reads it back (the memory is really there and ours)."""
    address = buffer.ptr
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
        first = refpool.malloc(backend, 1024, cache=cache)
        write_and_check(first, 1024, 0xA5)
        address = first.ptr
        first.close()
        second = refpool.malloc(backend, 1024, cache=cache)
        assert second.ptr == address  # the released block, served again
        stats = cache.stats()
        assert (stats["live_bytes"], stats["live_blocks"]) == (1024, 1)
        second.close()
    stats = cache.stats()
    assert (stats["misses"], stats["hits"], stats["backend_allocations"], stats["steps"]) == (1, 1, 1, 1)
    assert (stats["live_bytes"], stats["idle_bytes"], stats["held_bytes"]) == (0, 1024, 1024)
    assert stats["peak_live_bytes"] == 1024 and stats["escapes"] == 0


def test_cache_malloc_without_a_step_is_cached(backend, cache):
    # Like PyTorch's allocator: a cache serves pointer requests outside any step too.
    for _ in range(3):
        refpool.malloc(backend, 4096, cache=cache).close()
    stats = cache.stats()
    assert (stats["backend_allocations"], stats["hits"]) == (1, 2)
    assert backend.stats()["outstanding_bytes"] == 4096


def test_zero_bytes(backend, cache):
    with cache.step():
        assert refpool.malloc(backend, 0, cache=cache).ptr == 0
    assert refpool.malloc(backend, 0).ptr == 0  # a buffer of no bytes owns nothing
    assert cache.stats()["live_blocks"] == 0
    assert backend.stats()["allocation_count"] == 0


def test_second_release_is_an_error(backend, cache):
    buffer = refpool.malloc(backend, 256, cache=cache)
    handle = buffer.handle
    refpool._library.lib().call("refpool_release", handle)
    with pytest.raises(refpool.InvalidHandleError, match="already released"):
        refpool._library.lib().call("refpool_release", handle)
    stats = cache.stats()
    assert (stats["idle_blocks"], stats["live_blocks"]) == (1, 0)  # the second release changed nothing
    buffer.close()  # the finalizer's release is ignored: the handle is dead


def test_free_by_address_of_a_buffer_is_an_error(backend, cache):
    # refpool_free takes what the framework allocator hands out by address; a buffer belongs to its
    # handle, so its address is refused and the buffer stays live.
    kept = refpool.malloc(backend, 256, cache=cache)
    foreign = ctypes.create_string_buffer(256)
    for address in (ctypes.addressof(foreign), kept.ptr, kept.ptr + 16):
        with pytest.raises(refpool.InvalidArgumentError):
            refpool._library.lib().call("refpool_free", address)
    assert cache.stats()["live_blocks"] == 1
    kept.close()


def test_malloc_follows_the_threads_scope(backend, cache):
    with cache.scope():
        first = refpool.malloc(backend, 512)
        address = first.ptr
        first.close()
        second = refpool.malloc(backend, 512)
        assert second.ptr == address
        second.close()
    assert cache.stats()["hits"] == 1
    before = backend.stats()["allocation_count"]
    refpool.malloc(backend, 512).close()  # no scope: straight from the backend
    assert backend.stats()["allocation_count"] == before + 1


def test_buffer_on_a_stream(backend, cache):
    with cache.scope():
        buffer = refpool.malloc(backend, (8, 8), "<f4", stream=0)  # the default stream
        assert buffer.shape == (8, 8) and buffer.nbytes == 256
        buffer.record_stream(None)
        buffer.release()
    assert cache.stats()["misses"] == 1


def test_escape_from_a_step(backend, cache):
    with cache.step():
        kept = refpool.malloc(backend, 2048, cache=cache)
        refpool.malloc(backend, 64, cache=cache).close()
    stats = cache.stats()
    assert (stats["escapes"], stats["live_bytes"]) == (1, 2048)
    write_and_check(kept, 2048, 0x3C)  # an escaped block stays valid
    kept.close()
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
    first = refpool.malloc(backend, 128, cache=cache)
    address = first.ptr
    first.close()
    ender = threading.Thread(target=step.end)
    ender.start()
    ender.join()
    assert cache.stats()["steps"] == 1
    with cache.step():
        again = refpool.malloc(backend, 128, cache=cache)
        assert again.ptr == address
        again.close()


def run_two_thread_step(cache, backend, plan, sizes):
    """One step whose requests come from two threads in a fixed order, as PyTorch's forward (main
    thread) and backward (autograd thread): 'forward' allocates, 'backward' frees those and allocates
    its own. Returns the addresses in request order."""
    handoff = queue.Queue()
    addresses = []
    buffers = []

    def forward():
        for n in sizes:
            buffer = refpool.malloc(backend, n, cache=cache)
            write_and_check(buffer, n, 0x11)
            addresses.append(buffer.ptr)
            buffers.append(buffer)
        handoff.put(list(buffers))

    def backward():
        forward_buffers = handoff.get()
        gradients = []
        for n in reversed(sizes):
            buffer = refpool.malloc(backend, n, cache=cache)
            write_and_check(buffer, n, 0x22)
            addresses.append(buffer.ptr)
            gradients.append(buffer)
        for buffer in forward_buffers + gradients:
            buffer.close()

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
    big = refpool.malloc(backend, 1 << 20, cache=cache)
    big.close()
    small = refpool.malloc(backend, 4096, cache=cache)
    assert cache.stats()["peak_live_bytes"] == 1 << 20
    cache.reset_peaks()
    stats = cache.stats()
    assert stats["peak_live_bytes"] == 4096 and stats["peak_held_bytes"] == stats["held_bytes"]
    small.close()


def test_planned_regions_count_as_live_and_held(backend, cache):
    # The contract: allocated_bytes = bytes handed out and still referenced (PyTorch's
    # "allocated"), reserved_bytes = idle + live + arenas (PyTorch's "reserved"), whatever served them.
    for run in range(3):
        with cache.step(plan="p"):
            first, second = refpool.malloc(backend, 1000, cache=cache), refpool.malloc(backend, 3000, cache=cache)
            stats = cache.stats()
            first.close()
            second.close()
    assert stats["plan_hits"] >= 2  # the last run was a replay
    assert stats["plan_live_bytes"] >= 4000, stats
    assert stats["allocated_bytes"] >= 4000, stats
    assert stats["reserved_bytes"] >= stats["arena_bytes"] >= 4000, stats
    assert cache.stats()["peak_allocated_bytes"] >= 4000
