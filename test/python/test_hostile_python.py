"""A hostile review of the Python package: values and orders of calls an outsider would try, each
checked for a clear error (TypeError, ValueError or BufferError naming the argument), for memory
that stays valid while anything views it, and for nothing leaked (the backend's outstanding bytes
back to 0). Run under ASan too (meson's build-asan: a read of freed memory aborts)."""
import copy
import ctypes
import gc
import pickle
import sys
import threading

import pytest

import refpool
import refpool._dtypes
import refpool._library
from conftest import run_python


# ---- views outlive the interpreter's exit hook and its module teardown ------------------------------
# weakref.finalize releases, at exit, every handle whose object is still alive, views' references
# included; an atexit function registered before refpool's (or a daemon thread) then read freed
# memory: a 1 MiB memoryview segfaulted (the host backend's block was unmapped), a NumPy array read
# the allocator's free-list pointers. Objects kept in builtins or sys die after every other module's
# globals were cleared: a from_dlpack array kept there called a deleter whose ctypes callback had
# been freed with refpool's module (SIGSEGV).
AT_EXIT = """
    import atexit, builtins, sys
    seen = {}

    def read_at_exit():  # registered before refpool's exit hook, so it runs after it
        for name, view in seen.items():
            data = bytes(memoryview(view).cast("B"))
            print(name, "intact" if data == b"\\x07" * len(data) else "changed", flush=True)

    atexit.register(read_at_exit)
    import refpool
    backend = refpool.Backend.new_host()
    cache = refpool.Cache(from_environment=False)
    big = refpool.malloc(backend, 1 << 20)
    seen["memoryview"] = big.view()
    seen["memoryview"][:] = b"\\x07" * (1 << 20)
    try:
        import numpy
    except ImportError:
        numpy = None
    if numpy is not None:
        small = refpool.malloc(backend, 4096, cache=cache)
        seen["numpy"] = numpy.asarray(small)
        seen["numpy"][:] = 7
        small.close()
    if numpy is not None and hasattr(numpy, "from_dlpack"):
        exported = refpool.malloc(backend, 4096, "<u1", cache=cache)
        with exported.view() as filler:
            filler[:] = b"\\x07" * 4096
        seen["dlpack"] = numpy.from_dlpack(exported)  # read-only in NumPy
        builtins._refpool_kept = numpy.from_dlpack(exported)  # deleted during module teardown
        sys._refpool_kept = numpy.from_dlpack(exported)
        builtins._refpool_capsule = exported.__dlpack__()  # never consumed
        exported.close()

    class Node:  # garbage at exit in every order: cycles, open steps and scopes, closed caches
        pass
    for i in range(4):
        node = Node()
        node.self = node
        node.backend = refpool.Backend.new_host() if i % 2 else refpool.Backend.host()
        node.cache = refpool.Cache(from_environment=False)
        node.buffer = refpool.malloc(node.backend, 4096, cache=node.cache)
        node.view = node.buffer.view()
        node.step = node.cache.step(plan=f"p{i}").begin()
        node.in_step = refpool.malloc(node.backend, 1024, cache=node.cache)
        (node.cache.close, node.backend.close, node.buffer.close, lambda: None)[i]()
    refpool.Cache(from_environment=False).scope(plan="open at exit").enter()
    refpool.malloc(backend, 64)
"""


def test_views_outlive_the_exit_hook_and_module_teardown():
    result = run_python(AT_EXIT, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "memoryview intact" in result.stdout.split("\n"), result.stdout
    assert "changed" not in result.stdout, result.stdout
    assert "Exception ignored" not in result.stderr, result.stderr


# ---- the array interface within NumPy's dims ------------------------------------------------------
# NumPy before 2.2.4 copies an __array_interface__ shape into a stack array of NPY_MAXDIMS (32, 64
# from NumPy 2) without checking its length (numpy#27949): numpy.asarray of a 100-dim host buffer
# ended in "*** stack smashing detected ***".
def test_the_array_interface_refuses_more_dims_than_numpy_holds(backend):
    for rank in (65, 100):  # beyond every NumPy's
        with refpool.malloc(backend, (1,) * rank, "<f4") as b:
            with pytest.raises(BufferError, match=f"{rank} dims"):
                b.__array_interface__
            assert b.use_count == 1
    numpy = pytest.importorskip("numpy")
    limit = 64 if int(numpy.__version__.split(".")[0]) >= 2 else 32
    with refpool.malloc(backend, (1,) * limit, "<f4") as b:
        assert numpy.asarray(b).shape == (1,) * limit
    with refpool.malloc(backend, (1,) * (limit + 1), "<f4") as b:
        with pytest.raises(BufferError, match=f"{limit + 1} dims"):
            numpy.asarray(b)
    assert backend.stats()["outstanding_bytes"] == 0


# ---- DLPack's floats are IEEE binary16/32/64 --------------------------------------------------------
# x86's long double (NumPy's float128, "<f16") is the 80-bit x87 format padded to 16 bytes: it was
# exported as a DLPack float of 128 bits, which a consumer reads as IEEE binary128. NumPy's own
# __dlpack__ refuses long doubles for that reason.
def test_dlpack_exports_no_long_double(backend):
    long_double = ctypes.sizeof(ctypes.c_longdouble)
    if long_double <= 8:
        pytest.skip("long double is double here")
    for typestr in (f"<f{long_double}", f"<c{2 * long_double}"):
        with refpool.malloc(backend, 2, typestr) as b:
            with pytest.raises(BufferError, match="DLPack"):
                b.__dlpack__()
            assert b.use_count == 1
    for typestr in ("<f2", "<f4", "<f8", "<c8", "<c16"):
        with refpool.malloc(backend, 2, typestr) as b:
            capsule = b.__dlpack__()
            del capsule
    assert backend.stats()["outstanding_bytes"] == 0


# ---- typestrs of types NumPy has here ---------------------------------------------------------------
# "<f12" and "<c24" (long doubles of 32-bit x86) and a datetime of any unit ("<M8[xyz]") were stored
# and exported; NumPy on x86-64 reads none of them ("data type '<f12' not understood").
LONG_DOUBLE = ctypes.sizeof(ctypes.c_longdouble)
UNITS = ["Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as", "generic", "25us", "0ns", "02ns",
         "xyz", "B", "H", "S", "Us", "ns2", "2147483648ns"]


def test_typestrs_are_types_numpy_has_here(backend):
    others = [size for size in (10, 12, 16) if size != LONG_DOUBLE]
    for typestr in [f"<f{n}" for n in others] + [f"<c{2 * n}" for n in others] + ["<M8[xyz]", "<m8[H]", "<M8[ns2]"]:
        with pytest.raises(ValueError, match=r"^refpool: dtype"):
            refpool.malloc(backend, 2, typestr)
    for typestr in (f"<f{LONG_DOUBLE}", f"<c{2 * LONG_DOUBLE}", "<M8[ns]", "<m8[25us]", "<M8[generic]"):
        refpool.malloc(backend, 2, typestr).close()
    assert backend.stats()["outstanding_bytes"] == 0


def test_typestrs_agree_with_numpy(backend):
    numpy = pytest.importorskip("numpy")

    def accepted(parse, typestr):
        try:
            parse(typestr)
            return True
        except (TypeError, ValueError):
            return False
    typestrs = [f"<{kind}{size}" for kind in "fciub" for size in range(1, 41)]
    typestrs += [f"<{kind}8[{unit}]" for kind in "mM" for unit in UNITS]
    differ = [s for s in typestrs if accepted(refpool._dtypes.parse, s) != accepted(numpy.dtype, s)]
    assert differ == []


def test_typestrs_of_thousands_of_digits_are_refused_naming_the_dtype(backend):
    # Python's int() refuses more than 4300 digits with a ValueError that names nothing.
    for typestr, error in (("<V" + "9" * 5000, OverflowError), ("|S" + "1" * 4301, OverflowError),
                           ("<M8[" + "9" * 5000 + "ns]", ValueError)):
        with pytest.raises(error, match=r"^refpool: dtype"):
            refpool.malloc(backend, 2, typestr)
    assert backend.stats()["allocation_count"] == 0


# ---- a bool is no count, whoever made it --------------------------------------------------------------
# True was refused as a size, but NumPy's True_ (what `array.any()` returns) passed as 1 with only a
# DeprecationWarning; a str where a switch is expected ("False") was true; dl_device=(True, 0) was
# the CPU.
def numpy_bool_calls():
    numpy = pytest.importorskip("numpy")
    yes = numpy.True_
    return {
        "malloc(nbytes)": lambda w: refpool.malloc(w.backend, yes),
        "malloc(shape[0])": lambda w: refpool.malloc(w.backend, (yes, 4)),
        "malloc(dtype)": lambda w: refpool.malloc(w.backend, 4, yes),
        "malloc(alignment)": lambda w: refpool.malloc(w.backend, 4, alignment=yes),
        "Buffer.reshape(dims)": lambda w: w.buffer.reshape((yes, 16)),
        "Cache.reclaim(keep_bytes)": lambda w: w.cache.reclaim(yes),
        "Cache(max_idle_bytes)": lambda w: refpool.Cache(max_idle_bytes=yes, from_environment=False),
        "Backend.host_limited(capacity_bytes)": lambda w: refpool.Backend.host_limited(yes),
    }


class World:
    def __init__(self, backend, cache):
        self.backend, self.cache = backend, cache
        self.buffer = refpool.malloc(backend, 16)


def test_a_numpy_bool_is_no_count(backend, cache):
    world = World(backend, cache)
    for name, call in numpy_bool_calls().items():
        with pytest.raises(TypeError, match=r"^refpool: .*bool"):
            call(world)
    world.buffer.close()
    assert backend.stats()["allocation_count"] == 1


def test_switches_take_bools_only(backend):
    numpy = pytest.importorskip("numpy")
    with refpool.Cache(segments=numpy.False_, auto_plans=numpy.True_, from_environment=False) as cache:
        assert cache.stats()["steps"] == 0
    with pytest.raises(TypeError, match="from_environment"):
        refpool.Cache(from_environment="False")
    with refpool.malloc(backend, 4) as b:
        with pytest.raises(TypeError, match="dl_device"):
            b.__dlpack__(dl_device=(True, 0))


# ---- stream objects ---------------------------------------------------------------------------------
# A framework's stream is read for its address (torch's cuda_stream, CuPy's ptr, Numba's handle):
# int() took a float (4096.9 became 4096) and a str, and Numba's default stream under its ctypes
# binding (a c_void_p holding NULL) was a bare TypeError from int(None).
class NumbaDefaultStream:
    handle = ctypes.c_void_p()


class NumbaStream:
    handle = ctypes.c_void_p(0x1000)


class Attribute:
    def __init__(self, **attributes):
        self.__dict__.update(attributes)


def test_stream_objects_are_read_for_an_address_or_refused(backend):
    numpy = pytest.importorskip("numpy")
    for stream in (NumbaDefaultStream(), NumbaStream(), Attribute(ptr=0), numpy.int64(0x1000), numpy.uint64(0)):
        with refpool.malloc(backend, 16, stream=stream) as b:
            b.record_stream(stream)
    for stream in (Attribute(ptr=4096.9), Attribute(cuda_stream="4096"), Attribute(handle="abc"),
                   Attribute(ptr=True), Attribute(ptr=b"\x00"), numpy.True_, 4096.0):
        with pytest.raises(TypeError, match=r"^refpool: .*stream"):
            refpool.malloc(backend, 16, stream=stream)
    assert backend.stats()["outstanding_bytes"] == 0 and backend.stats()["allocation_count"] == 5


# ---- a DLPack consumer that fails drops the capsule with its error pending --------------------------
# A consumer that refuses the tensor (NumPy: too many dims, a dtype it lacks) releases the capsule
# in its error path, with its exception set. The capsule's destructor was Python code run by
# ctypes: its first ctypes call failed on that exception (ArgumentError), so the export was never
# deleted and held its buffer for good, and ctypes then cleared the consumer's error: NumPy raised
# SystemError ("returned NULL without setting an exception"), and list(map(...)) ended silently.
def exports_of(buffer):
    """A generator yielding one DLPack capsule of `buffer`: its consumer holds the only reference."""
    yield buffer.__dlpack__()


def test_a_capsule_dropped_with_an_error_pending_keeps_the_error_and_leaks_nothing(backend, monkeypatch):
    ignored = []
    monkeypatch.setattr("sys.unraisablehook", lambda unraisable: ignored.append(unraisable))
    with refpool.malloc(backend, 16, "<f4") as b:
        # int(capsule) fails in C, and map drops the capsule with that TypeError set, as a
        # consumer's error path does.
        with pytest.raises(TypeError, match="PyCapsule"):
            list(map(int, exports_of(b)))
        assert b.use_count == 1  # the export's reference went with the capsule
    assert ignored == []
    assert backend.stats()["outstanding_bytes"] == 0


def test_numpy_refusing_a_capsule_raises_its_error_and_leaks_nothing(backend):
    numpy = pytest.importorskip("numpy")
    if not hasattr(numpy, "from_dlpack"):
        pytest.skip("NumPy without from_dlpack")
    with refpool.malloc(backend, (1,) * 100, "<f8") as b:  # more dims than any NumPy holds
        with pytest.raises((RuntimeError, ValueError, BufferError)) as raised:
            numpy.from_dlpack(b)
        assert not isinstance(raised.value, SystemError)
        assert b.use_count == 1
    assert backend.stats()["outstanding_bytes"] == 0


def test_a_consumer_deletes_the_tensor_from_another_thread_without_the_gil(backend):
    # The deleter is C: it takes the GIL itself (PyTorch frees tensors on its own threads).
    from test_buffer import _consume
    b = refpool.malloc(backend, 64, "<f4")
    managed = _consume(b.__dlpack__())
    b.close()
    worker = threading.Thread(target=managed.contents.deleter, args=(managed,))  # CFUNCTYPE: no GIL in the call
    worker.start()
    worker.join()
    assert backend.stats()["outstanding_bytes"] == 0


# ---- __cuda_array_interface__ and a close() on another thread ----------------------------------------
# The export read the pointer, then marked the object as held by consumers; a close() landing between
# the two (another thread's) saw no consumer, gave the block back, and the consumer got a pointer
# to freed memory. Reproduced here by a buffer that closes itself once its pointer is read.
class ClosedByAnotherThread(refpool.Buffer):
    @property
    def ptr(self):
        address = super().ptr
        self.close()
        return address


def test_a_close_during_the_cuda_array_interface_export_leaves_the_memory_held(backend):
    from refpool.buffer import _Place
    with refpool.malloc(backend, 64) as host:
        retained = refpool._library.lib().new_handle("refpool_retain", host.handle)
        device = ClosedByAnotherThread(retained, "|u1", _Place("cuda", 0, "device", 0))
    try:
        interface = device.__cuda_array_interface__
    except refpool.InvalidHandleError:
        interface = None  # refused: as good
    if interface is not None:
        assert backend.stats()["outstanding_bytes"] == 64  # what the consumer points at is held
    device.close()
    del device
    gc.collect()
    assert backend.stats()["outstanding_bytes"] == 0


# ---- a Buffer or Backend made over something that is no handle ---------------------------------------
def test_constructors_refuse_what_is_no_handle():
    from refpool.buffer import Buffer
    for make in (lambda: Buffer(None), lambda: Buffer(0x400000040000000), lambda: refpool.Backend(None, "host")):
        with pytest.raises(TypeError, match=r"^refpool: .*handle"):
            make()


# ---- a str subclass cannot pass for another plan key ---------------------------------------------------
# Scope options are cached by key: a str subclass equal to everything (and of the same hash) was
# given the options, so the plan, of another key.
class EqualToAll(str):
    def __eq__(self, other):
        return True

    def __hash__(self):
        return hash("first")


def test_a_plan_key_is_its_own_text(cache):
    assert cache.scope(plan="first")._options.plan == b"first"
    assert cache.scope(plan=EqualToAll("second"))._options.plan == b"second"
    assert cache.step(plan=EqualToAll("third"))._options.plan == b"third"


# ---- shapes are ordered ----------------------------------------------------------------------------------
# A set's order is arbitrary ({3, 1} may be (1, 3)) and a bytearray's items are its bytes: both were
# taken as dims.
@pytest.mark.parametrize("dims", [{3, 1}, frozenset({4, 2}), bytearray(b"\x04\x04"), memoryview(b"\x02")],
                         ids=["set", "frozenset", "bytearray", "memoryview"])
def test_shapes_from_unordered_or_byte_collections_are_refused(backend, dims):
    with pytest.raises(TypeError, match=r"^refpool: refpool.malloc: shape"):
        refpool.malloc(backend, dims)
    with refpool.malloc(backend, 16) as b:
        with pytest.raises(TypeError, match=r"^refpool: refpool.Buffer.reshape: dims"):
            b.reshape(dims)
    assert backend.stats()["allocation_count"] == 1


# ---- handles are not copied -----------------------------------------------------------------------------
# copy.copy(buffer) shared the original's finalizer (closing either closed both), copy.deepcopy gave a
# "(released)" Buffer still acting on the original's handle, and pickle wrote a bare handle id.
@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy, pickle.dumps], ids=["copy", "deepcopy", "pickle"])
def test_handles_cannot_be_copied_or_pickled(backend, cache, copier):
    with refpool.malloc(backend, 64) as b:
        for owner in (b, backend, cache):
            with pytest.raises(TypeError, match=rf"^refpool: .*refpool.{type(owner).__name__}.* copied"):
                copier(owner)
        assert b.use_count == 1


# ---- one Scope object entered by two threads at once ----------------------------------------------------
# enter() checked that the scope was not active, then entered it in C (the GIL released): two threads
# both passed the check, one handle was overwritten, and its thread stayed inside a scope nobody could
# exit.
def test_a_scope_object_is_entered_once_even_by_racing_threads(backend, cache):
    for _ in range(30):
        scope = cache.scope()
        barrier = threading.Barrier(2)
        entered, refused = [], []

        def enter():
            barrier.wait()
            try:
                scope.enter()
                entered.append(threading.get_ident())
            except RuntimeError:
                refused.append(threading.get_ident())
            barrier.wait()  # both tried before the one inside exits
            if entered and entered[0] == threading.get_ident():
                scope.exit()
        threads = [threading.Thread(target=enter) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert (len(entered), len(refused)) == (1, 1)


# ---- a NumPy value is no dtype ---------------------------------------------------------------------------
# numpy.dtype() reads a value's .dtype: malloc(..., numpy.float32(2.0)) made float32 elements and
# numpy.datetime64("2020") years, while numpy.float64(2.0) (a float) was refused and numpy.int8(3)
# is an item size of 3 (an int).
def test_a_numpy_value_is_no_dtype(backend):
    numpy = pytest.importorskip("numpy")
    for value in (numpy.float32(2.0), numpy.float64(2.0), numpy.complex64(1j), numpy.datetime64("2020"),
                  numpy.void(b"\x00")):
        with pytest.raises(TypeError, match=r"^refpool: dtype"):
            refpool.malloc(backend, 2, value)
    with refpool.malloc(backend, 2, numpy.int8(3)) as b:  # an int: the item size
        assert b.typestr == "|V3"
    assert backend.stats()["allocation_count"] == 1


# ---- the allocator's cache handle closed by its user -----------------------------------------------------
# refpool.allocator.cache() is a Cache, so a context manager: `with refpool.allocator.cache() as c:`
# closed the one handle the module kept, and every later allocator.stats(), step(), reclaim() (and
# the framework adapters' step()) failed for the rest of the process.
def test_closing_the_allocator_s_cache_handle_breaks_nothing():
    with refpool.allocator.cache() as handle:
        steps = handle.stats()["steps"]
    assert handle.closed
    assert refpool.allocator.stats()["steps"] == steps
    assert refpool.allocator.reclaim() == 0
    assert not refpool.allocator.cache().closed
    refpool.allocator.step(uncached_warmup_entries=0)  # a Step over an open handle


# ---- cases that held (kept as guards) -------------------------------------------------------------------
def test_every_method_of_a_closed_buffer_is_an_invalid_handle_error(backend):
    b = refpool.malloc(backend, 64, "<f4")
    b.close()
    b.close()  # again: nothing
    calls = [lambda: b.ptr, lambda: b.shape, lambda: b.nbytes, lambda: b.use_count, lambda: b.view(),
             lambda: b.__array_interface__, b.__dlpack__, b.retain, lambda: b.reshape((16,)), b.unsafe_free,
             lambda: b.record_stream(None)]
    for call in calls:
        with pytest.raises(refpool.InvalidHandleError, match="already released"):
            call()
    assert repr(b) == "<refpool.Buffer (released)>" and backend.stats()["outstanding_bytes"] == 0


def test_views_hold_their_memory_through_unsafe_free_and_closed_caches_and_backends():
    numpy = pytest.importorskip("numpy")
    backend = refpool.Backend.new_host()
    cache = refpool.Cache(from_environment=False)
    b = refpool.malloc(backend, 64, "<i8", cache=cache)
    array, view = numpy.asarray(b), b.view()
    array[:] = 3
    b.unsafe_free()
    cache.close()
    backend.close()
    with refpool.malloc(refpool.Backend.host(), 512) as other:  # would take the block if it were free
        other.view()[:] = b"\x09" * 512
    assert (array == 3).all() and bytes(view[:8]) == (3).to_bytes(8, sys.byteorder)
    view.release()
    del array
    gc.collect()


@pytest.mark.parametrize("bad", ["\x00", "device\x00", "\ud800"], ids=["NUL", "trailing-NUL", "lone-surrogate"])
def test_names_refuse_nul_and_surrogates(cache, bad):
    calls = {"memory kind": lambda: refpool.Backend.cuda(0, kind=bad), "runtime": lambda: refpool.allocator.configure(
        runtime=bad), "detail": lambda: cache.summary(bad), "unknown option": lambda: refpool.Cache(**{bad: "on"})}
    for name, call in calls.items():
        with pytest.raises((TypeError, ValueError), match=rf"^refpool: .*{name}"):
            call()


def test_threads_closing_buffers_while_others_export_them(backend):
    numpy = pytest.importorskip("numpy")
    cache = refpool.Cache(from_environment=False)
    shared, lock, stop, bad = [], threading.Lock(), threading.Event(), []

    def produce():
        while not stop.is_set():
            b = refpool.malloc(backend, 256, cache=cache)
            b.view()[:] = b"\x07" * 256
            with lock:
                shared.append(b)
                del shared[:-8]

    def close():
        while not stop.is_set():
            with lock:
                b = shared[len(shared) // 2] if shared else None
            if b is not None:
                b.unsafe_free() if len(shared) % 2 else b.close()

    def export():
        while not stop.is_set():
            with lock:
                b = shared[-1] if shared else None
            try:
                views = [b.view(), numpy.asarray(b), numpy.from_dlpack(b)] if b is not None else []
            except (refpool.InvalidHandleError, refpool.UseAfterFreeError):
                continue
            if any(bytes(memoryview(v).cast("B")) != b"\x07" * 256 for v in views):
                bad.append(views)
    threads = [threading.Thread(target=f) for f in (produce, close, close, export, export)]
    for t in threads:
        t.start()
    stop.wait(0.3)
    stop.set()
    for t in threads:
        t.join()
    del shared[:]
    gc.collect()
    assert bad == []
    cache.close()
    assert backend.stats()["outstanding_bytes"] == 0


def test_the_dlpack_glue_refuses_a_package_of_another_layout():
    # REFPOOL_LIBRARY may name a library built from other sources: its glue must not read the
    # package's struct with another layout (it called the wrong Python C API functions: SIGSEGV).
    from refpool import _interfaces
    setup = refpool._library.lib().fn("refpool_python_dlpack_setup").raw
    api = _interfaces._PythonApi()
    for size in (ctypes.sizeof(api) - 8, ctypes.sizeof(api) + 8):
        assert setup(ctypes.byref(api), size) == -1
