"""refpool.cupy on a real CuPy with a CUDA device (skipped elsewhere), each case in a child process."""
import pytest

from conftest import child_json

cupy = pytest.importorskip("cupy")
try:
    devices = cupy.cuda.runtime.getDeviceCount()
except cupy.cuda.runtime.CUDARuntimeError:
    devices = 0
if devices == 0:
    pytest.skip("CuPy sees no CUDA device", allow_module_level=True)

LOOP = """
    import contextlib, json
    import cupy as cp
    import refpool.cupy
    mode = MODE
    if mode != "cupy":
        refpool.cupy.install()
    rng = cp.random.RandomState(0)
    w1 = rng.standard_normal((256, 512), dtype=cp.float32)
    w2 = rng.standard_normal((512, 64), dtype=cp.float32)
    results, driver = [], []
    for i in range(12):
        step = {"cupy": contextlib.nullcontext, "plain": refpool.cupy.step,
                "planned": lambda: refpool.cupy.step(plan=f"rows {i % 3}")}[mode]()
        with step:
            rows = 64 + 32 * (i % 3)  # temporaries of three shapes, in turn
            x = rng.standard_normal((rows, 256), dtype=cp.float32)
            h = cp.maximum(x @ w1, 0)
            spectrum = cp.fft.rfft(h @ w2, axis=1)
            results.append(float(cp.abs(spectrum).sum()).hex())
        if mode != "cupy":
            stats = refpool.cupy.stats()
            driver.append(stats["backend_allocations"] + stats["segment_grows"] + stats["uncached_allocations"])
    print(json.dumps({"results": results, "driver": driver}))
"""


def run(mode):
    return child_json(LOOP.replace("MODE", repr(mode)))


def test_results_are_identical_and_no_driver_calls_after_warmup():
    own, plain, planned = run("cupy"), run("plain"), run("planned")
    assert plain["results"] == own["results"] and planned["results"] == own["results"]
    # A step without a key plans too (auto_plans), so both modes warm up alike. A sequence may be
    # recorded twice: its first run also makes cuFFT's plan (and workspace), later ones do not.
    for result in (plain, planned):
        assert result["driver"][6:] == [result["driver"][6]] * 6, result["driver"]


def test_using_is_scoped_to_the_with_block():
    result = child_json("""
        import json
        import cupy as cp
        import refpool.cupy
        with refpool.cupy.using():
            inside = cp.empty(1 << 20, dtype=cp.uint8)
            live_inside = refpool.cupy.stats()["live_bytes"]
        outside = cp.empty(1 << 20, dtype=cp.uint8)
        live_after = refpool.cupy.stats()["live_bytes"]
        del inside
        print(json.dumps([live_inside, live_after, refpool.cupy.stats()["live_bytes"]]))
    """)
    assert result[0] >= 1 << 20 and result[1] == result[0] and result[2] == result[0] - (1 << 20)


def test_cupy_reads_a_buffer_through_the_cuda_array_interface():
    # A refpool.Buffer of CUDA device memory is a CuPy array without a copy (__cuda_array_interface__
    # version 3, its stream), and through DLPack. (Added after the 2026-12-04 H200 runs: not run there yet.)
    result = child_json("""
        import json
        import cupy as cp
        import refpool
        backend = refpool.Backend.cuda(0)
        with refpool.Cache().scope():
            b = refpool.malloc(backend, (4, 8), "<f4")
            a = cp.asarray(b)
            a[...] = cp.arange(32, dtype=cp.float32).reshape(4, 8)
            same = a.data.ptr == b.ptr and a.shape == b.shape and a.dtype == cp.float32
            d = cp.from_dlpack(b)
            print(json.dumps({"same": same, "sum": float(d.sum()), "dlpack_ptr": d.data.ptr == b.ptr}))
    """)
    assert result == {"same": True, "sum": 496.0, "dlpack_ptr": True}


def test_a_cupy_array_keeps_a_closed_buffer_alive():
    # CuPy holds the Buffer whose __cuda_array_interface__ it read: after close() the block stays
    # with that object until the array goes, then returns to the cache (nothing leaks).
    result = child_json("""
        import gc, json
        import cupy as cp
        import refpool
        backend = refpool.Backend.cuda(0)
        cache = refpool.Cache(from_environment=False)
        b = refpool.malloc(backend, 256, "<f4", cache=cache)
        a = cp.asarray(b)
        a[...] = 7
        address = b.ptr
        b.close()
        other = refpool.malloc(backend, 256, "<f4", cache=cache)
        cp.asarray(other)[...] = 1
        reused, total = other.ptr == address, float(a.sum())
        other.close()
        del a, b, other  # other's __cuda_array_interface__ reference goes with the object
        gc.collect()
        print(json.dumps({"reused": reused, "sum": total, "live": cache.stats()["live_blocks"]}))
    """)
    assert result == {"reused": False, "sum": 7.0 * 256, "live": 0}


def test_a_graph_captured_while_the_cache_is_emptied_when_the_capture_is_announced():
    # CuPy's hook has no graph pools, so refpool sees no capture unless it is announced; emptying
    # the cache during it would wait for the device and break the capture (docs/design.md, "Stream
    # safety"). Not yet run on a GPU.
    result = child_json("""
        import json
        import cupy as cp
        import refpool.allocator, refpool.cupy
        refpool.cupy.install()
        x = cp.arange(1 << 20, dtype=cp.float32)
        y = cp.empty_like(x)  # the graph's output, allocated before the capture
        cp.multiply(x, 2, out=y)  # compiles the kernel outside the capture
        idle = cp.empty(8 << 20, dtype=cp.uint8)
        del idle  # idle memory that emptying the cache gives back
        stream = cp.cuda.Stream(non_blocking=True)
        with refpool.allocator.announced_capture(0):
            with stream:
                stream.begin_capture()
                cp.multiply(x, 3, out=y)
                refpool.cupy.free_all_blocks()
                graph = stream.end_capture()
            kept = cp.cuda.runtime.memGetInfo()[0]  # the device's free bytes
        after = cp.cuda.runtime.memGetInfo()[0]
        graph.launch(stream)
        stream.synchronize()
        print(json.dumps({"ok": bool((y == x * 3).all()), "kept": kept, "after": after}))
    """)
    assert result["ok"], result
    assert result["after"] - result["kept"] >= 8 << 20, result  # mapped until the announcement ends
