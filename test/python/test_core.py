"""The package over the C API that refpool has had since before issue 15: import, backends, caches,
scopes (plain and planned), buffers, stats, errors. Host backend only."""
import ctypes
import json
import os
import threading

import pytest

import refpool
import refpool._library
import refpool.memory_map
from conftest import run_python


def test_import_needs_no_framework():
    # A finder that refuses the frameworks, so even where they are installed this proves the package
    # never imports them by itself, and its adapters say what is missing when used.
    result = run_python("""
        import importlib.abc, sys
        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split('.')[0] in ('torch', 'cupy', 'numba'):
                    raise ImportError(f'{name} refused by the test')
        sys.meta_path.insert(0, Refuse())
        import refpool, refpool.torch, refpool.cupy, refpool.numba, refpool.plot
        assert not {'torch', 'cupy', 'numba', 'matplotlib'} & set(sys.modules), sorted(sys.modules)
        for use in (refpool.torch.install, refpool.cupy.install, lambda: refpool.numba.RefpoolNumbaManager):
            try:
                use()
            except refpool.FrameworkError as e:
                print(e)
            else:
                raise AssertionError('no error without the framework')
    """)
    lines = result.stdout.splitlines()
    assert "needs PyTorch" in lines[0] and "refused by the test" in lines[0]
    assert "needs CuPy" in lines[1]
    assert "needs Numba" in lines[2]


def test_library_location():
    # A build tree names its library; an installed package loads the copy beside its sources.
    expected = os.environ.get("REFPOOL_LIBRARY") or os.path.join(os.path.dirname(refpool.__file__), "librefpool.so")
    assert str(refpool.library_path()) == os.path.realpath(expected)
    version = refpool.library_version()
    assert version.count(".") == 2 and all(part.isdigit() for part in version.split("."))


def test_missing_library_is_a_clear_error(tmp_path):
    missing = tmp_path / "nowhere" / "librefpool.so"
    result = run_python("""
        import refpool
        try:
            refpool.Cache()
        except refpool.LibraryError as e:
            print(e)
    """, env={"REFPOOL_LIBRARY": str(missing)})
    assert f"REFPOOL_LIBRARY={missing} names no file" in result.stdout


def test_reshaped_reuse_in_a_scope(backend, cache):
    # The seed case: 16 floats released, then 4x4 floats get the same buffer.
    addresses = set()
    for _ in range(3):
        with cache.scope():
            a = refpool.malloc(backend, (16,), 4)
            addresses.add(a.ptr)
            a.view()[:4] = b"\x01\x02\x03\x04"
            a.release()
            b = refpool.malloc(backend, (4, 4), 4)
            assert b.shape == (4, 4) and b.nbytes == 64
            addresses.add(b.ptr)
            b.release()
    assert len(addresses) == 1
    stats = cache.stats()
    assert (stats["misses"], stats["hits"], stats["backend_allocations"]) == (1, 5, 1)
    assert (stats["idle_blocks"], stats["idle_bytes"], stats["live_blocks"]) == (1, 64, 0)
    assert backend.stats()["allocation_count"] == 1


def test_buffer_views_and_references(backend, cache):
    with cache.scope():
        a = refpool.malloc(backend, (2, 8), 4)
        view = a.view()
        view[:] = bytes(range(64))
        flat = a.reshape((16,))
        assert flat.ptr == a.ptr and flat.shape == (16,)
        assert a.use_count == 3  # a, flat, and the view's own reference
        del view
        assert a.use_count == 2
        shared = a.retain()
        assert bytes(shared.view()[:8]) == bytes(range(8))
        with pytest.raises(refpool.ShapeError, match=r"\(5, 3\)"):
            a.reshape((5, 3))
        for handle in (a, flat, shared):
            handle.release()
            handle.release()  # closing twice is a no-op for the Python object


def test_unsafe_free_and_use_after_free(backend, cache):
    with cache.scope():
        a = refpool.malloc(backend, (16,), 4)
        address = a.ptr
        a.unsafe_free()  # the only reference: reusable at once
        b = refpool.malloc(backend, (4, 4), 4)
        assert b.ptr == address
        with pytest.raises(refpool.UseAfterFreeError, match="unsafe_free"):
            a.ptr
        assert a.shape == (16,)  # a freed view keeps its dims
        a.release()
        b.release()
    assert cache.stats()["unsafe_frees"] == 1


def test_released_handles_are_detected(backend):
    lib = refpool._library.lib()
    a = refpool.malloc(backend, (8,), 8)
    handle = a.handle
    a.release()
    with pytest.raises(refpool.InvalidHandleError, match="already released"):
        lib.call("refpool_release", handle)
    with pytest.raises(refpool.InvalidHandleError):
        lib.call("refpool_data", handle, ctypes.byref(ctypes.c_void_p()))


def test_escapes_are_counted(backend, cache):
    with cache.scope():
        kept = refpool.malloc(backend, (256,), 4)
        refpool.malloc(backend, (8,), 4).release()
    stats = cache.stats()
    assert (stats["escapes"], stats["live_blocks"], stats["live_bytes"]) == (1, 1, 1024)
    kept.release()
    assert cache.stats()["idle_bytes"] == 1024 + 32


def test_scope_exits_on_its_own_thread_only(backend, cache):
    scope = cache.scope().enter()
    errors = []

    def exit_elsewhere():
        try:
            scope.exit()
        except refpool.ScopeError as e:
            errors.append(e)

    thread = threading.Thread(target=exit_elsewhere)
    thread.start()
    thread.join()
    assert len(errors) == 1 and errors[0].status_name == "REFPOOL_ERROR_SCOPE"
    buffer = refpool.malloc(backend, (4,), 4)  # still active here: served by the cache
    buffer.release()
    scope.exit()
    assert cache.stats()["misses"] == 1


def test_planned_scopes_replay(backend, cache):
    sizes = [4096, 1024, 8192, 512]
    runs = []
    for _ in range(5):  # the first is a new sequence (pending), the second is recorded
        with cache.scope(plan="step"):
            buffers = [refpool.malloc(backend, (n,), 1) for n in sizes]
            runs.append([b.ptr for b in buffers])
            for b in reversed(buffers):
                b.release()
    stats = cache.stats()
    assert stats["plan_recordings"] == 1 and stats["plans"] == 1
    assert stats["plan_hits"] == 3 * len(sizes) and stats["plan_misses"] == 0
    assert runs[2] == runs[3] == runs[4]  # stable addresses across replays
    assert stats["arena_bytes"] >= stats["planned_peak_live_bytes"] == sum(sizes)
    backend_allocations = backend.stats()["allocation_count"]
    with cache.scope(plan="step"):
        for b in [refpool.malloc(backend, (n,), 1) for n in sizes]:
            b.release()
    assert backend.stats()["allocation_count"] == backend_allocations


def test_rounding_options(backend):
    with refpool.Cache(rounding="step:256", from_environment=False) as cache:
        with cache.scope():
            refpool.malloc(backend, (100,), 1).release()
            refpool.malloc(backend, (200,), 1).release()  # both round to 256 bytes: a hit
        assert (cache.stats()["misses"], cache.stats()["hits"]) == (1, 1)
    with pytest.raises(refpool.ConfigError, match="cache option 'rounding' has value 'nearest'; allowed: exact"):
        refpool.Cache(rounding="nearest")
    with pytest.raises(refpool.ConfigError, match="pow2:<divisions"):
        refpool.Cache(rounding="pow2:3", from_environment=False)


def test_segment_options(backend):
    # Host memory: "auto" means no segments; "on" carves pieces (one 2 MiB segment for both requests,
    # no block allocation from the backend); "off" allocates each block.
    for segments, expected in (("auto", (0, 0, 2)), ("on", (1, 1, 0)), ("off", (0, 0, 2))):
        before = backend.stats()["allocation_count"]
        with refpool.Cache(segments=segments, from_environment=False) as cache:
            with cache.scope():
                a = refpool.malloc(backend, (1000,), 1)
                b = refpool.malloc(backend, (3000,), 1)
                a.release()
                b.release()
            stats = cache.stats()
            blocks = backend.stats()["allocation_count"] - before
            assert (stats["segments"], stats["segment_grows"], blocks) == expected, segments
    with pytest.raises(refpool.ConfigError, match="'segments' has value 'sometimes'; allowed: off, on, auto"):
        refpool.Cache(segments="sometimes")


def test_memory_map_lists_segments_and_idle_buffers(backend):
    # refpool_cache_memory_map through the package: a segment with a live, an idle and free bytes;
    # without segments, the idle buffer alone (live plain buffers are not listed).
    for segments in ("on", "off"):
        with refpool.Cache(segments=segments, from_environment=False) as cache, cache.scope():
            kept = refpool.malloc(backend, (1000,), 1)
            gone = refpool.malloc(backend, (3000,), 1)
            gone_at = gone.ptr
            gone.release()
            mapped = cache.memory_map()
            kept_at = kept.ptr
            kept.release()
        if segments == "off":
            host_device = -1  # the host backend's device number
            assert mapped == [refpool.memory_map.Segment(gone_at, 3000, 3000, host_device, "host", "block", False,
                                                         [refpool.memory_map.Range(gone_at, 3000, "idle")])]
            continue
        (segment,) = mapped
        states = {r.address: r.state for r in segment.ranges}
        assert states[kept_at] == "live" and states[gone_at] == "idle" and "free" in states.values()
        assert segment.pool == "small" and segment.memory_kind == "host"
        assert sum(r.bytes for r in segment.ranges) == segment.committed_bytes


def test_reclaim_and_idle_limit(backend, cache):
    with cache.scope():
        for n in (1000, 2000, 3000):
            refpool.malloc(backend, (n,), 1).release()
    assert cache.stats()["idle_bytes"] == 6000
    assert cache.reclaim(keep_bytes=3000) == 3000  # least recently released first: 1000 and 2000
    assert backend.stats()["outstanding_bytes"] == 3000
    cache.set_max_idle_bytes(0)
    assert cache.stats()["idle_bytes"] == 0 and backend.stats()["outstanding_bytes"] == 0
    cache.set_max_idle_bytes(None)
    with cache.scope():
        refpool.malloc(backend, (10,), 1).release()
    assert cache.stats()["idle_bytes"] == 10


def test_out_of_memory_is_a_memory_error(cache):
    with refpool.Backend.host_limited(4096) as small:
        with cache.scope():
            kept = refpool.malloc(small, (4096,), 1)
            with pytest.raises(refpool.OutOfMemoryError) as raised:
                refpool.malloc(small, (1,), 1)
            assert isinstance(raised.value, MemoryError)
            assert raised.value.status_name == "REFPOOL_ERROR_OUT_OF_MEMORY"
            kept.release()


def test_bad_environment_configuration():
    result = run_python("""
        import refpool
        try:
            refpool.Cache()
        except refpool.ConfigError as e:
            print(e)
    """, env={"REFPOOL_CONF": "rounding:sideways"})
    assert "REFPOOL_ERROR_CONFIG" in result.stdout and "rounding" in result.stdout


def test_stats_recorder(tmp_path, backend, cache):
    recorder = refpool.StatsRecorder(cache)
    for step in range(2):
        with cache.scope():
            refpool.malloc(backend, (64,), 1).release()
        recorder.sample(label=f"step {step}")
    recorder.write(tmp_path / "stats.json")
    data = json.loads((tmp_path / "stats.json").read_text())
    assert data["format"] == "refpool-stats"
    assert [s["label"] for s in data["samples"]] == ["step 0", "step 1"]
    assert [s["stats"]["hits"] for s in data["samples"]] == [0, 1]
    assert data["samples"][0]["time"] <= data["samples"][1]["time"]
