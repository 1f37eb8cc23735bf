"""The framework entry points of librefpool called through ctypes exactly as PyTorch's
CUDAPluggableAllocator and CuPy's CFunctionAllocator call them, and the process-wide allocator behind
them. Without a CUDA device they must fail cleanly (NULL and a reason); with one (the H200), serve
and reuse device memory."""
import ctypes

import pytest

import refpool
import refpool._library
from conftest import child_json, cuda_device_count, run_python

ENTRY_POINTS = ["refpool_torch_malloc", "refpool_torch_free", "refpool_cupy_malloc", "refpool_cupy_free"]


def lib():
    return refpool._library.lib()


def require_cuda():
    # Checked inside each test: a library without the CUDA entry point fails the test, never skips it.
    if cuda_device_count() == 0:
        pytest.skip("needs a CUDA device")


def test_entry_points_are_exported():
    for name in ENTRY_POINTS:
        assert lib().address(name), name


def test_zero_bytes_from_the_entry_points():
    # NULL is also what a failure returns: a failure would replace this thread's last error.
    with pytest.raises(refpool.InvalidArgumentError):
        refpool.allocator.free(ctypes.addressof(ctypes.c_int()))
    marker = lib().last_error()
    assert lib().fn("refpool_torch_malloc")(0, 0, None) is None
    lib().fn("refpool_torch_free")(None, 0, 0, None)
    assert lib().fn("refpool_cupy_malloc")(None, 0, 0) is None
    lib().fn("refpool_cupy_free")(None, None, 0)
    assert lib().last_error() == marker


def test_without_cuda_the_entry_points_fail_cleanly():
    # (Not refpool_torch_malloc: on failure it throws a C++ exception for PyTorch to report, which
    # must not cross ctypes.)
    if cuda_device_count() > 0:
        pytest.skip("checks the failure without CUDA")
    assert lib().fn("refpool_cupy_malloc")(None, 4096, 0) is None
    message = lib().last_error()
    assert "CUDA" in message or "cuda" in message, message
    with pytest.raises(refpool.BackendUnavailableError):
        refpool.allocator.malloc(4096, 0)
    assert refpool.allocator.stats()["live_bytes"] == 0


# Run in a child: refpool_torch_malloc throws on failure, which would abort a ctypes caller.
SHAPED_CALLS = """
    import ctypes, json
    import refpool, refpool._library
    refpool.allocator.configure(runtime=RUNTIME)
    lib = refpool._library.lib()
    torch_malloc, torch_free = lib.fn("refpool_torch_malloc"), lib.fn("refpool_torch_free")
    cupy_malloc, cupy_free = lib.fn("refpool_cupy_malloc"), lib.fn("refpool_cupy_free")
    size = 3 << 20
    result = {}
    with refpool.allocator.step():
        first = torch_malloc(size, 0, None)  # as PyTorch calls it: size, device, stream
        if RUNTIME == "host":
            ctypes.memset(first, 0x5A, size)  # host memory: really there
        result["live_in_step"] = refpool.allocator.stats()["live_bytes"]
        torch_free(first, size, 0, None)
        second = cupy_malloc(None, size, 0)  # as CuPy calls it: param, size, device
        result["same_block"] = second == first
        cupy_free(None, second, 0)
    result["after_first_step"] = refpool.allocator.stats()
    addresses = []
    for _ in range(5):
        with refpool.allocator.step(plan="loop"):
            sizes = (size, 1 << 16, 0, 4096)
            pointers = [torch_malloc(n, 0, None) for n in sizes]
            addresses.append(pointers)
            for pointer, n in zip(pointers, sizes):
                torch_free(pointer, n, 0, None)
    result["addresses"] = addresses
    result["after_loop"] = refpool.allocator.stats()
    print(json.dumps(result))
"""


@pytest.mark.parametrize("runtime", ["host", "cuda"])
def test_torch_and_cupy_shaped_calls_share_the_allocator_cache(runtime):
    if runtime == "cuda":
        require_cuda()
    result = child_json(SHAPED_CALLS.replace("RUNTIME", repr(runtime)))
    assert result["live_in_step"] == 3 << 20
    assert result["same_block"]  # the block torch's call released, to CuPy's call of the same size
    first = result["after_first_step"]
    # One driver call in the first step: a block of its own, or (CUDA, segments) one segment's growth.
    driver_calls = first["backend_allocations"] + first["segment_grows"]
    assert (driver_calls, first["hits"], first["steps"], first["escapes"]) == (1, 1, 1, 0)
    addresses = result["addresses"]
    assert all(run[2] is None for run in addresses)  # 0 bytes: NULL
    assert addresses[2] == addresses[3] == addresses[4]  # replays: the same regions
    loop = result["after_loop"]
    assert loop["live_bytes"] == 0 and loop["escapes"] == 0 and loop["steps"] == 6
    assert loop["plan_recordings"] >= 1 and loop["plan_hits"] >= 3 * 3 and loop["plan_misses"] == 0


def test_allocator_configuration_is_fixed_by_the_first_allocation():
    result = run_python("""
        import refpool
        refpool.allocator.configure(runtime="host", rounding="pow2:4")
        address = refpool.allocator.malloc(1000)
        refpool.allocator.free(address)
        try:
            refpool.allocator.configure(kind="device")
        except refpool.ConfigError as e:
            print("refused:", e)
    """)
    assert "refused: REFPOOL_ERROR_CONFIG" in result.stdout


def test_allocator_configuration_is_checked():
    result = run_python("""
        import refpool
        for kind in ("host", "pinned_host"):
            try:
                refpool.allocator.configure(kind=kind)
            except refpool.RefpoolError as e:
                print(e.status_name)
    """)
    assert result.stdout.split() == ["REFPOOL_ERROR_CONFIG"] * 2 or \
        result.stdout.split() == ["REFPOOL_ERROR_INVALID_ARGUMENT"] * 2, result.stdout


def test_a_rejected_configuration_changes_nothing():
    # Issue 23 row 5: a configure refused by the C side (a step of 0 bytes) named a runtime (HIP or
    # CUDA, neither usable on the CI machine) that stuck, and every later allocation failed with
    # BackendUnavailableError. The host configuration made before must stay in force.
    result = run_python("""
        import ctypes
        import refpool
        refpool.allocator.configure(runtime="host")
        for runtime, kind in (("hip", "device"), ("cuda", "device_async")):
            try:
                refpool.allocator.configure(runtime=runtime, kind=kind, rounding="step:0")
                print("accepted")
            except refpool.ConfigError as e:
                print("refused:", "'rounding' has value 'step:0'" in str(e))
        address = refpool.allocator.malloc(3000)
        ctypes.memset(address, 0x5A, 3000)  # host memory: the host runtime stayed
        print("allocated:", ctypes.string_at(address, 3) == b"ZZZ")
        refpool.allocator.free(address)
    """)
    assert result.stdout.splitlines() == ["refused: True", "refused: True", "allocated: True"], result.stdout


def test_pools_limit_and_empty_cache_from_python():
    # The allocator functions PyTorch's hooks reach, from the package (host runtime): a private pool
    # routed to through a C filter, its stats and ids; a device limit; empty_cache; record_stream.
    result = child_json("""
        import ctypes, json
        import refpool, refpool._library, refpool._types as t
        refpool.allocator.configure(runtime="host", conf="rounding:exact,max_idle_bytes:unlimited")
        lib = refpool._library.lib()
        capturing = 0x1000
        FILTER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
        accepts = FILTER(lambda context, stream: int(stream == capturing))
        lib.call("refpool_allocator_begin_pool", 0, t.PoolId(5, 0), ctypes.cast(accepts, ctypes.c_void_p), None, None)
        in_pool = refpool.allocator.malloc(4096, stream=capturing)
        outside = refpool.allocator.malloc(4096, stream=0x2000)
        result = {"ids": refpool.allocator.pool_ids(), "pool_live": refpool.allocator.pool_stats((5, 0))["live_bytes"],
                  "main_live": refpool.allocator.stats()["live_bytes"]}
        lib.call("refpool_allocator_end_pool", 0, t.PoolId(5, 0))
        refpool.allocator.record_stream(outside, 0x3000)
        for address in (in_pool, outside):
            refpool.allocator.free(address)
        refpool.allocator.empty_cache()
        result["main_idle"] = refpool.allocator.stats()["idle_bytes"]
        result["pool_idle"] = refpool.allocator.pool_stats((5, 0))["idle_bytes"]
        lib.call("refpool_allocator_release_pool", 0, t.PoolId(5, 0))
        result["ids_released"] = refpool.allocator.pool_ids()  # freeable, until empty_cache
        refpool.allocator.empty_cache()
        result["ids_after"] = refpool.allocator.pool_ids()
        refpool.allocator.set_device_limit(0, 8192)
        try:
            refpool.allocator.malloc(16384)
        except refpool.OutOfMemoryError as e:
            result["refused"] = "out of memory" in str(e)
        refpool.allocator.set_device_limit(0, None)
        refpool.allocator.free(refpool.allocator.malloc(16384))
        print(json.dumps(result))
    """)
    assert result == {"ids": [[5, 0]], "pool_live": 4096, "main_live": 4096, "main_idle": 0, "pool_idle": 4096,
                      "ids_released": [[5, 0]], "ids_after": [], "refused": True}, result


def test_caching_turned_off_and_on_from_python():
    # refpool.allocator.set_caching (PyTorch's caching_allocator_enable under install(hooks=False)):
    # off, requests bypass the cache and are freed to the runtime; its C half is c-framework-caching.
    result = child_json("""
        import json
        import refpool
        refpool.allocator.configure(runtime="host", conf="rounding:exact,max_idle_bytes:unlimited,segments:off")
        refpool.allocator.free(refpool.allocator.malloc(4096))  # idle in the cache
        result = {"default": refpool.allocator.caching()}
        refpool.allocator.set_caching(False)
        address = refpool.allocator.malloc(4096)
        stats = refpool.allocator.stats()
        result.update(off=refpool.allocator.caching(), hits=stats["hits"], live=stats["live_bytes"])
        refpool.allocator.free(address)
        result["held_after_free"] = refpool.allocator.stats()["held_bytes"]
        refpool.allocator.set_caching(True)
        refpool.allocator.free(refpool.allocator.malloc(4096))
        result.update(on=refpool.allocator.caching(), hits_on=refpool.allocator.stats()["hits"])
        try:
            refpool.allocator.set_caching(0)
        except TypeError as e:
            result["refused"] = "must be a bool" in str(e)
        print(json.dumps(result))
    """)
    assert result == {"default": True, "off": False, "hits": 0, "live": 0, "held_after_free": 4096, "on": True,
                      "hits_on": 1, "refused": True}, result


def test_captures_refpool_does_not_route_are_announced_and_counted():
    # refpool.allocator.announced_capture: what it waits for on a GPU is tested on the fake HIP
    # runtime (hip-fake-framework); here the counting and the errors of the C entry points.
    with refpool.allocator.announced_capture(0):
        with refpool.allocator.announced_capture(0):
            pass
    with pytest.raises(refpool.InvalidArgumentError, match="no capture of device 0 is announced"):
        lib().call("refpool_capture_end", 0)
    with pytest.raises(refpool.InvalidArgumentError, match="outside 0 to 63"):
        with refpool.allocator.announced_capture(64):
            pass
    with pytest.raises(ValueError):  # the block's own error goes through; the announcement ends
        with refpool.allocator.announced_capture(1):
            raise ValueError("capture failed")
    with pytest.raises(refpool.InvalidArgumentError):
        lib().call("refpool_capture_end", 1)


def test_cupy_s_hook_raises_the_library_s_error_for_a_failed_request():
    # CuPy's CFunctionAllocator takes refpool_cupy_malloc's NULL as memory; the hook refpool.cupy
    # installs raises the library's error instead. Here over the host runtime, with a stand-in for
    # CuPy's MemoryPointer (only its .ptr is read).
    result = run_python("""
        import refpool, refpool.cupy, refpool._library
        refpool.allocator.configure(runtime="host")
        raw = refpool._library.lib().fn("refpool_cupy_malloc")
        class MemoryPointer:
            def __init__(self, size):
                self.ptr = raw(None, size, 0) or 0
        malloc = refpool.cupy.checked_malloc(MemoryPointer)
        assert malloc(0).ptr == 0  # zero bytes are no failure
        kept = malloc(4096)
        refpool.allocator.set_device_limit(0, 8192)
        try:
            malloc(16384)
        except refpool.OutOfMemoryError as e:
            print(isinstance(e, MemoryError), e)
        refpool.allocator.free(kept.ptr)
    """)
    refused, message = result.stdout.strip().split(" ", 1)
    assert refused == "True" and message.startswith("refpool: out of memory"), result.stdout
