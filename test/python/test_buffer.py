"""refpool.malloc and what a Buffer shows other libraries, on the host backend: ptr, shape, typestr,
nbytes; __array_interface__ (and __cuda_array_interface__ refused for host memory, its contents
checked on a stand-in CUDA place); DLPack through ctypes, consumed here as a consumer would. CuPy,
Numba and PyTorch consuming the interfaces of device buffers run on a GPU (test_cupy, test_numba,
test_torch)."""
import ast
import ctypes
import gc
import pathlib
import sys

import pytest

import refpool
from refpool import _interfaces
from refpool.buffer import Buffer, _Place


@pytest.fixture
def backend():
    with refpool.Backend.new_host() as be:
        yield be


def test_malloc_defaults_to_bytes(backend):
    with refpool.malloc(backend, 1000) as b:
        assert (b.shape, b.typestr, b.itemsize, b.nbytes) == ((1000,), "|u1", 1, 1000)
        assert b.ptr % 256 == 0 and b.ptr != 0


@pytest.mark.parametrize("dtype,typestr,itemsize", [
    ("<f4", "<f4", 4), ("f8", "<f8" if sys.byteorder == "little" else ">f8", 8), ("|b1", "|b1", 1),
    ("i2", "<i2" if sys.byteorder == "little" else ">i2", 2), (16, "|V16", 16), (1, "|u1", 1)])
def test_dtypes(backend, dtype, typestr, itemsize):
    with refpool.malloc(backend, (3, 5), dtype) as b:
        assert (b.shape, b.typestr, b.nbytes) == ((3, 5), typestr, 15 * itemsize)


@pytest.mark.parametrize("dtype,typestr", [("float32", "=f4"), ("uint8", "|u1"), ("bool", "|b1"),
                                           ("int64", "=i8"), ("complex128", "=c16"), ("<U3", "<U3")])
def test_dtypes_by_name_need_no_numpy(backend, dtype, typestr):
    # The names NumPy gives its fixed-size types, and a NumPy-style typestr for text ("U" counts
    # 4-byte characters: NumPy reads '<U3' as 12 bytes an element).
    native = "<" if sys.byteorder == "little" else ">"
    expected = typestr.replace("=", native)
    with refpool.malloc(backend, 2, dtype) as b:
        assert b.typestr == expected and b.nbytes == 2 * (12 if dtype == "<U3" else int(expected[2:]))


def test_numpy_dtypes_are_dtypes(backend):
    numpy = pytest.importorskip("numpy")
    for dtype in (numpy.float32, numpy.dtype("float32"), numpy.dtype("<f4"), "single", numpy.single):
        with refpool.malloc(backend, (2, 3), dtype) as b:
            assert b.typestr == numpy.dtype(numpy.float32).str and b.nbytes == 24
            assert numpy.asarray(b).dtype == numpy.float32
    for dtype in (numpy.dtype("U3"), numpy.dtype("M8[ns]"), numpy.dtype([("a", "<f4"), ("b", "u1")]), numpy.int16):
        with refpool.malloc(backend, 4, dtype) as b:
            array = numpy.asarray(b)
            assert array.itemsize == numpy.dtype(dtype).itemsize and array.nbytes == b.nbytes
    with pytest.raises(ValueError, match="Python objects"):
        refpool.malloc(backend, 4, numpy.dtype(object))  # NumPy would read raw bytes as object references


def test_a_dtype_object_with_a_str_is_a_dtype(backend):
    class FakeDtype:
        str = "<c8"
    with refpool.malloc(backend, 2, FakeDtype()) as b:
        assert b.typestr == "<c8" and b.nbytes == 16


@pytest.mark.parametrize("dtype,error", [("f", ValueError), ("<x4", ValueError), ("<f0", ValueError), (0, ValueError),
                                         (-4, ValueError), (2**64, OverflowError), (4.0, TypeError),
                                         (True, TypeError), (None, TypeError), ("<f3", ValueError),
                                         ("<i16", ValueError), ("|b2", ValueError), ("|O8", ValueError),
                                         ("float96", ValueError), ("f4[ns]", ValueError),
                                         ("|V18446744073709551616", OverflowError)])
def test_bad_dtypes_are_refused_before_c(backend, dtype, error):
    with pytest.raises(error, match="^refpool: "):
        refpool.malloc(backend, 4, dtype)
    assert backend.stats()["allocation_count"] == 0


def test_scalars_and_zero_elements(backend):
    with refpool.malloc(backend, (), "<f8") as scalar:
        assert scalar.shape == () and scalar.nbytes == 8 and scalar.ptr != 0
    with refpool.malloc(backend, (4, 0), "<f4") as empty:
        assert empty.shape == (4, 0) and empty.nbytes == 0 and empty.ptr == 0
        assert memoryview(empty.__array_interface__["data"]).nbytes == 0


def test_array_interface_of_host_memory(backend):
    with refpool.malloc(backend, (2, 3), "<i4") as b:
        interface = b.__array_interface__
        data = interface.pop("data")  # a writable bytes object over the buffer (NumPy keeps it as the base)
        assert interface == {"shape": (2, 3), "typestr": "<i4", "strides": None, "version": 3}
        assert ctypes.addressof(data) == b.ptr and memoryview(data).nbytes == 24 and not memoryview(data).readonly
        # a ctypes consumer sees the right memory: write through the interface, read through view()
        ints = (ctypes.c_int32 * 6).from_buffer(data)
        ints[:] = range(6)
        assert bytes(b.view()[4:8]) == (1).to_bytes(4, sys.byteorder)
        assert not hasattr(b, "__cuda_array_interface__")  # host memory: not a CUDA array


def test_reshape_and_retain_keep_the_type(backend):
    with refpool.malloc(backend, 12, "<f4") as b, b.reshape((3, 4)) as r, b.retain() as k:
        assert (r.shape, r.typestr, r.ptr) == ((3, 4), "<f4", b.ptr)
        assert (k.shape, k.typestr) == ((12,), "<f4")


def placed(buffer, place):
    """A new handle to `buffer` that says its memory is at `place`."""
    handle = buffer.retain()
    handle._place = place
    return handle


def test_cuda_array_interface_contents():
    # What a CUDA device buffer shows (its place as a cuda backend would set it), over host memory.
    with refpool.Backend.new_host() as be, refpool.malloc(be, (4, 4), "<f2") as host:
        device = placed(host, _Place("cuda", 0, "device", 0))
        on_stream = placed(host, _Place("cuda", 1, "device_async", 0x1234))
        assert device.__cuda_array_interface__ == {"shape": (4, 4), "typestr": "<f2", "data": (host.ptr, False),
                                                   "strides": None, "version": 3, "stream": 1}
        assert on_stream.__cuda_array_interface__["stream"] == 0x1234
        assert not hasattr(device, "__array_interface__")  # device memory: not readable by the host
        assert device.__dlpack_device__() == (_interfaces.DL_CUDA, 0)
        assert on_stream.__dlpack_device__() == (_interfaces.DL_CUDA, 1)
        hip = placed(host, _Place("hip", 0, "device", 0))
        assert not hasattr(hip, "__cuda_array_interface__") and hip.__dlpack_device__() == (_interfaces.DL_ROCM, 0)
        for b in (device, on_stream, hip):
            b.close()


def _consume(capsule):
    """What a DLPack consumer does: take the tensor, rename the capsule, later call the deleter."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    rename = ctypes.pythonapi.PyCapsule_SetName
    rename.restype, rename.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
    managed = ctypes.cast(get(capsule, b"dltensor"), ctypes.POINTER(_interfaces.DLManagedTensor))
    assert rename(capsule, b"used_dltensor") == 0
    return managed


def test_dlpack_export_holds_the_buffer_until_deleted(backend):
    b = refpool.malloc(backend, (2, 8), "<f4")
    assert b.__dlpack_device__() == (_interfaces.DL_CPU, 0)
    capsule = b.__dlpack__()
    managed = _consume(capsule)
    tensor = managed.contents.dl_tensor
    assert tensor.data == b.ptr and tensor.ndim == 2 and list(tensor.shape[:2]) == [2, 8]
    assert (tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes) == (2, 32, 1)
    assert (tensor.device.device_type, tensor.device.device_id) == (_interfaces.DL_CPU, 0)
    assert not tensor.strides and tensor.byte_offset == 0
    assert b.use_count == 2  # the export's reference
    b.close()
    del capsule  # renamed: the capsule leaves the tensor to the consumer
    assert backend.stats()["outstanding_bytes"] == 64  # still held by the export
    managed.contents.deleter(managed)
    assert backend.stats()["outstanding_bytes"] == 0


def test_an_unconsumed_dlpack_capsule_gives_the_buffer_back(backend):
    with refpool.malloc(backend, 16, "<i8") as b:
        capsule = b.__dlpack__()
        assert b.use_count == 2
        del capsule
        assert b.use_count == 1


def test_dlpack_refuses_what_it_cannot_export(backend):
    with refpool.malloc(backend, 4, 3) as opaque:  # |V3: DLPack has no such type
        with pytest.raises(BufferError):
            opaque.__dlpack__()
    with refpool.malloc(backend, 4, "<f4") as b:
        with pytest.raises(BufferError):
            b.__dlpack__(copy=True)
        with pytest.raises(BufferError):
            b.__dlpack__(dl_device=(_interfaces.DL_CUDA, 0))


def test_freed_buffers_have_no_pointer(backend):
    with refpool.malloc(backend, 64) as b:
        b.unsafe_free()
        with pytest.raises(refpool.UseAfterFreeError):
            b.ptr
        with pytest.raises(refpool.UseAfterFreeError):
            b.__array_interface__
        assert b.shape == (64,)  # a freed view keeps its shape


def test_malloc_is_the_one_allocation_call():
    assert not hasattr(refpool, "alloc") and not hasattr(refpool, "free")
    assert not hasattr(refpool.Cache, "malloc")
    assert not hasattr(Buffer, "dims") and not hasattr(Buffer, "address")


def test_no_module_imports_refpool_torch():
    # refpool.torch imports its helpers; none of them imports it back (no import cycle).
    package = pathlib.Path(refpool.__file__).parent
    for path in package.glob("*.py"):
        if path.name == "torch.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [alias.name for alias in node.names]
                assert not (node.level == 1 and (node.module == "torch" or (node.module is None and "torch" in names))), path
                assert node.module != "refpool.torch", path
            if isinstance(node, ast.Import):
                assert all(alias.name != "refpool.torch" for alias in node.names), path


# ---- what the exports promise (issue 35 rows 9 and 10) ---------------------------------------------
INT64_MAX = 2**63 - 1


@pytest.mark.parametrize("shape", [(0, 2**64 - 1), (0, 2**63), (2**63, 0), (0, 2**62, 2)],
                         ids=["issue", "2**63", "2**63-first", "stride-2**63"])
def test_exports_refuse_shapes_and_strides_beyond_int64(backend, shape):
    # A zero-element buffer takes any dims (it owns no memory), but DLPack's shape and strides are
    # int64 and the array interfaces' consumers index with a signed 64-bit intp: (0, 2**64-1) was
    # exported to DLPack as [0, -1].
    with refpool.malloc(backend, shape) as b:
        assert b.shape == shape and b.nbytes == 0
        with pytest.raises(BufferError, match=r"int64|2\*\*63"):
            b.__dlpack__()
        with pytest.raises(BufferError, match=r"int64|2\*\*63"):
            b.__array_interface__
        device = placed(b, _Place("cuda", 0, "device", 0))
        with pytest.raises(BufferError, match=r"int64|2\*\*63"):
            device.__cuda_array_interface__
        device.close()


def test_exports_at_the_int64_edge(backend):
    with refpool.malloc(backend, (0, INT64_MAX)) as b:
        managed = _consume(b.__dlpack__())
        assert list(managed.contents.dl_tensor.shape[:2]) == [0, INT64_MAX]
        managed.contents.deleter(managed)
        assert b.__array_interface__["shape"] == (0, INT64_MAX)


@pytest.mark.parametrize("typestr", ["<f\u0664", "<f\uff14", "<i\u00b2", "<f4\u0660", "<f 4", "<f+4", "<f4\n"])
def test_typestr_sizes_are_ascii_digits(backend, typestr):
    # str.isdigit() took any Unicode digit: '<f\u0664' (ARABIC-INDIC DIGIT FOUR) was stored and exported.
    with pytest.raises(ValueError, match=r"^refpool: dtype"):
        refpool.malloc(backend, 4, typestr)
    assert backend.stats()["allocation_count"] == 0


def test_dlpack_refuses_types_wider_than_its_bits_field(backend):
    # DLDataType.bits is a uint8: 256 bits would wrap to 0.
    with refpool.malloc(backend, 2, "<c32") as b:  # complex256: NumPy's clongdouble here
        with pytest.raises(BufferError, match="DLPack"):
            b.__dlpack__()
        assert b.use_count == 1


# ---- a view outlives close(), never the memory (issue 38) ----------------------------------------
def reused_by_the_next_request(backend, cache, address, nbytes):
    """Whether the cache hands the block at `address` to the next request of its size."""
    with refpool.malloc(backend, nbytes, cache=cache) as other:
        return other.ptr == address


def test_a_numpy_array_keeps_the_memory_it_views_after_close(backend, cache):
    # Before: NumPy kept the Buffer object, close() gave the block back, and the array read the next
    # request's data.
    numpy = pytest.importorskip("numpy")
    b = refpool.malloc(backend, 64, "<f4", cache=cache)
    array = numpy.asarray(b)
    array[:] = 7
    address = b.ptr
    b.close()
    assert not reused_by_the_next_request(backend, cache, address, 256)
    with refpool.malloc(backend, 64, "<f4", cache=cache) as other:
        numpy.asarray(other)[:] = 1
    assert (array == 7).all()
    part = array[8:16]  # a view of the view holds it too
    del array
    assert cache.stats()["live_blocks"] == 1 and (part == 7).all()
    del part
    gc.collect()
    assert cache.stats()["live_blocks"] == 0  # nothing leaks: the last view gave the block back
    assert reused_by_the_next_request(backend, cache, address, 256)


def test_a_memoryview_keeps_the_memory_it_views_after_close(backend, cache):
    b = refpool.malloc(backend, 256, cache=cache)
    view = b.view()
    view[:] = b"\x05" * 256
    address = b.ptr
    b.close()
    assert not reused_by_the_next_request(backend, cache, address, 256)
    assert bytes(view) == b"\x05" * 256
    view.release()
    gc.collect()
    assert cache.stats()["live_blocks"] == 0


def test_a_cuda_array_interface_consumer_keeps_the_buffer_object(backend):
    # CuPy, Numba and PyTorch keep the object whose __cuda_array_interface__ they read: once it is
    # exported, close() leaves a reference to the object, dropped when it is collected.
    with refpool.malloc(backend, (4, 4), "<f2") as host:
        device = placed(host, _Place("cuda", 0, "device", 0))
        plain = placed(host, _Place("cuda", 0, "device", 0))
        assert host.use_count == 3
        device.__cuda_array_interface__
        device.close()
        plain.close()
        assert device.closed and host.use_count == 2  # plain's went; device's stays with the object
        with pytest.raises(refpool.InvalidHandleError):
            device.ptr  # closed is closed for its owner
        del device
        gc.collect()
        assert host.use_count == 1
    assert backend.stats()["outstanding_bytes"] == 0


def test_exports_leak_nothing(backend):
    numpy = pytest.importorskip("numpy")
    for _ in range(3):
        b = refpool.malloc(backend, (8, 8), "float64")
        views = [numpy.asarray(b), b.view(), numpy.from_dlpack(b) if hasattr(numpy, "from_dlpack") else None]
        b.close()
        assert backend.stats()["outstanding_bytes"] == 512
        del views
        gc.collect()
        assert backend.stats()["outstanding_bytes"] == 0


def test_an_export_checks_the_typestr_against_the_buffer_s_item_size(backend):
    # A Buffer made over a handle with another typestr (Buffer's constructor is public) exports
    # nothing that would make a consumer read past the block.
    with refpool.malloc(backend, 4, "<f4") as b:
        wide = Buffer(lib_retain(b), "<f8")
        for export in (lambda: wide.__array_interface__, wide.__dlpack__):
            with pytest.raises(BufferError, match="8-byte elements, the buffer's are 4 bytes"):
                export()
        wide.close()
        assert b.use_count == 1


def lib_retain(buffer):
    return refpool._library.lib().new_handle("refpool_retain", buffer.handle)
