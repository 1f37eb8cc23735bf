"""Buffers (refpool_buffer): one reference to a block, with a shape and an element type; malloc makes them."""
import ctypes
import operator

from . import _checked
from . import _dtypes
from . import _types as t
from ._checked import size_array
from ._handles import Owned, handle_of
from ._interfaces import (DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_ROCM, DL_ROCM_HOST, check_extents, check_numpy_dims,
                          dlpack_capsule, host_bytes)
from ._library import lib
from .backend import Backend
from .cache import Cache
from .streams import stream_pointer


def _device_pair(dl_device):
    try:
        device_type, device_id = (operator.index(part) for part in dl_device)
        if any(_checked.is_bool(part) for part in dl_device):
            raise TypeError
    except (TypeError, ValueError):
        raise TypeError(f"refpool: refpool.Buffer.__dlpack__: dl_device must be a (device type, device id) pair of "
                        f"ints, not {dl_device!r}") from None
    return device_type, device_id


class _Place:
    """Where a buffer's memory is: the backend's runtime, device and memory kind, and the stream it
    was requested for (0: the default stream)."""
    __slots__ = ("runtime", "device", "kind", "stream")

    def __init__(self, runtime="host", device=-1, kind="host", stream=0):
        self.runtime, self.device, self.kind, self.stream = runtime, device, kind, stream

    @property
    def on_device(self):
        return self.kind in ("device", "device_async")

    @property
    def host_accessible(self):
        return self.kind in ("host", "pinned_host")


def malloc(backend, shape, dtype="|u1", *, stream=None, cache=None, alignment=0):
    """A new uninitialised Buffer of `shape` (an int or a tuple of ints; () is one element) of `dtype`
    (a typestr such as "<f4", a NumPy name such as "float32", a NumPy dtype or np.float32, or an item
    size in bytes; default bytes, so malloc(backend, n) is n bytes). Served through this thread's innermost active
    scope, else straight from `backend`; with `cache`, through that cache from any thread without a
    scope (the request belongs to the cache's open step). `stream`: the stream it is used on (an int
    address or a torch/CuPy/Numba stream). `alignment`: 0, or a power of two up to the backend's (256).
    The buffer goes back when the Buffer is closed (or garbage-collected) and no other handle shares it."""
    backend_handle = handle_of(backend, Backend, "refpool.malloc: backend")
    if isinstance(shape, _checked.NOT_DIMS):
        raise TypeError(f"refpool: refpool.malloc: shape must be an int or a sequence of ints, not {shape!r}")
    try:
        dims = tuple(shape)
    except TypeError:  # one dim (size_array checks it is a size)
        dims = (shape,)
    typestr, itemsize = _dtypes.resolve(dtype)
    array, rank = size_array(dims, "refpool.malloc: shape")
    options = t.AllocOptions(stream=_checked.address(stream_pointer(stream), "refpool.malloc: stream"))
    options.alignment = _checked.integer(ctypes.c_size_t, alignment, "refpool.malloc: alignment")
    if cache is not None:
        options.cache = handle_of(cache, Cache, "refpool.malloc: cache")
    handle = lib().new_handle("refpool_alloc", backend_handle, array, rank, itemsize, options)
    return Buffer(handle, typestr, _Place(backend.runtime, backend.device, backend.kind, options.stream or 0))


class Buffer(Owned):
    """A refpool buffer handle: one reference to a block, seen as a C-contiguous array of `shape` and
    `typestr`. `close()` (or `with`) drops the reference; the block goes back to its cache when the
    last one goes. Other libraries read it without a copy: `__cuda_array_interface__` (CUDA device
    memory: CuPy, Numba, PyTorch), `__array_interface__` (host memory: NumPy), DLPack (`__dlpack__`,
    `__dlpack_device__`) and `view()` (a memoryview).

    A view outlives close(), never the memory: each export holds a reference of its own, so the
    block goes back only when the last view is gone (as a DLPack tensor holds its producer's memory).
    A NumPy array, a memoryview and a DLPack tensor hold their own reference to the buffer;
    consumers of `__cuda_array_interface__` (CuPy, Numba, PyTorch) hold this object instead, so the
    first such export takes a reference that goes with the object (close() leaves it), released when
    the object is garbage-collected. Nothing leaks: the last view's end gives the block back. The references views
    hold are left alone by the interpreter's exit hook, which releases every other handle: an atexit
    function or a daemon thread may still read a view after it.

    Every export checks what its format can say: dims and C-contiguous strides within int64 (DLPack's
    fields; what NumPy and the CUDA consumers index with), a typestr of the buffer's item size, for
    __array_interface__ no more dims than NumPy holds, and for DLPack a data type it has a code for.
    A BufferError says what does not fit."""

    _release_function = "refpool_release"

    def __init__(self, handle, typestr="|u1", place=None):
        super().__init__(handle)
        self._typestr = _dtypes.parse(typestr)[0]
        self._place = place or _Place()
        self._kept_for_consumers = None  # the reference __cuda_array_interface__ consumers hold

    def close(self):
        """Drops this handle's reference (again: nothing). Views made from the buffer keep their own."""
        super().close()

    def __repr__(self):
        if self.closed:
            return "<refpool.Buffer (released)>"
        freed = " freed" if self.info().is_freed else ""
        return f"<refpool.Buffer shape={self.shape} typestr={self._typestr!r} {self._place.kind}{freed}>"

    release = close

    @property
    def ptr(self):
        """The first element's address (0 for zero elements). Valid while a handle holds the buffer.
        Raises UseAfterFreeError after unsafe_free()."""
        out = ctypes.c_void_p()
        lib().call("refpool_data", self.handle, ctypes.byref(out))
        return out.value or 0

    @property
    def shape(self):
        """The dims, row-major, as a tuple of ints; () for one element."""
        rank = ctypes.c_size_t()
        lib().call("refpool_dims", self.handle, None, 0, ctypes.byref(rank))
        dims = (ctypes.c_size_t * max(rank.value, 1))()
        lib().call("refpool_dims", self.handle, dims, rank.value, ctypes.byref(rank))
        return tuple(dims[:rank.value])

    @property
    def typestr(self):
        """The element type as an array-interface typestr ("<f4"; "|u1" for bytes)."""
        return self._typestr

    @property
    def itemsize(self):
        return self.info().element_size

    @property
    def nbytes(self):
        return self.info().bytes

    def info(self):
        info = t.BufferInfo()
        lib().call("refpool_buffer_get_info", self.handle, info)
        return info

    @property
    def use_count(self):
        count = ctypes.c_long()
        lib().call("refpool_use_count", self.handle, ctypes.byref(count))
        return count.value

    def _checked_shape(self, what):
        """The shape, once it is checked to fit `what`'s fields and the typestr to match the buffer."""
        info = self.info()
        shape = self.shape
        itemsize = _dtypes.parse(self._typestr)[1]
        if itemsize != info.element_size:
            raise BufferError(f"refpool.Buffer.{what}: typestr {self._typestr!r} is {itemsize}-byte elements, the "
                              f"buffer's are {info.element_size} bytes")
        check_extents(shape, itemsize, f"refpool.Buffer.{what}")
        return shape, info

    @property
    def __cuda_array_interface__(self):
        """CUDA Array Interface version 3, for device memory of a CUDA backend. `stream` is the stream
        the buffer was requested for (1, CUDA's legacy default stream, when none was given): a
        consumer on another stream waits for it. Owners of host memory get AttributeError, so
        consumers fall back to other interfaces."""
        if not (self._place.runtime == "cuda" and self._place.on_device):
            raise AttributeError(f"refpool.Buffer of {self._place.runtime} {self._place.kind} memory has no "
                                 "__cuda_array_interface__ (CUDA device memory only)")
        shape, _ = self._checked_shape("__cuda_array_interface__")
        # The pointer is read through the consumers' own reference, taken first: a close() on another
        # thread comes before it (retain fails) or leaves the memory to it.
        kept = self._kept_for_consumers
        if kept is None:
            kept = self._kept_for_consumers = self.retain().keep_past_exit()
        return {"shape": shape, "typestr": self._typestr, "data": (kept.ptr, False), "strides": None,
                "version": 3, "stream": self._place.stream or 1}

    @property
    def __array_interface__(self):
        """NumPy's array interface (version 3), for memory the host can read: host and pinned host.
        Its `data` is a bytes object that holds its own reference to the buffer, and NumPy keeps it
        as the array's base."""
        if not self._place.host_accessible:
            raise AttributeError(f"refpool.Buffer of {self._place.runtime} {self._place.kind} memory has no "
                                 "__array_interface__ (host memory only)")
        shape, info = self._checked_shape("__array_interface__")
        check_numpy_dims(shape, "refpool.Buffer.__array_interface__")
        return {"shape": shape, "typestr": self._typestr, "data": self._host_bytes(info.bytes), "strides": None,
                "version": 3}

    def __dlpack_device__(self):
        """(DLDeviceType, device id): kDLCPU for host memory, kDLCUDA / kDLROCM for device memory,
        kDLCUDAHost / kDLROCMHost for pinned host memory."""
        place = self._place
        if place.kind == "host":
            return (DL_CPU, 0)
        gpu = place.runtime == "cuda"
        if place.kind == "pinned_host":
            return (DL_CUDA_HOST if gpu else DL_ROCM_HOST, 0)
        return (DL_CUDA if gpu else DL_ROCM, place.device)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule ("dltensor", the unversioned DLManagedTensor) viewing this buffer; it holds
        its own reference until the consumer deletes it. `stream`: the consumer's stream, per the
        protocol; refpool makes no stream wait here (call record_stream for cross-stream use).
        Refuses copy=True and another device (no copies are made)."""
        if copy:
            raise BufferError("refpool.Buffer.__dlpack__: copy=True is not supported (refpool exports views)")
        if dl_device is not None and _device_pair(dl_device) != self.__dlpack_device__():
            raise BufferError(f"refpool.Buffer.__dlpack__: the buffer is on {self.__dlpack_device__()}, not {dl_device}")
        shape, _ = self._checked_shape("__dlpack__")
        return dlpack_capsule(self.retain, self.ptr, shape, self._typestr, self.__dlpack_device__())

    def reshape(self, dims):
        """A new handle sharing the buffer with other dims (same element count)."""
        array, rank = size_array(dims, "refpool.Buffer.reshape: dims")
        return Buffer(lib().new_handle("refpool_reshape", self.handle, array, rank), self._typestr, self._place)

    def retain(self):
        """A new handle sharing the buffer, same shape."""
        return Buffer(lib().new_handle("refpool_retain", self.handle), self._typestr, self._place)

    def unsafe_free(self):
        """Drops this handle's reference now: the buffer is reusable at once if no other handle shares
        it; this handle then fails with UseAfterFreeError on data access."""
        lib().call("refpool_unsafe_free", self.handle)

    def record_stream(self, stream):
        """Marks the buffer as used on `stream` too: not reused before that stream's work is done."""
        lib().call("refpool_record_stream", self.handle, stream_pointer(stream))

    def view(self):
        """A writable memoryview of a host buffer's bytes, holding the buffer while it lives."""
        if not self._place.host_accessible:
            raise ValueError(f"refpool.Buffer.view(): {self._place.kind} memory is not readable from the host")
        return memoryview(self._host_bytes(self.nbytes)).cast("B")

    def _host_bytes(self, nbytes):
        return host_bytes(self.retain, self.ptr, nbytes, "refpool.Buffer")
