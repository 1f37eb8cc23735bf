"""Buffers (refpool_buffer): one reference to a block, with a shape and an element type; malloc makes them."""
import ctypes
import operator
import sys

from . import _checked
from . import _types as t
from ._checked import size_array
from ._handles import Owned
from ._interfaces import DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_ROCM, DL_ROCM_HOST, dlpack_capsule
from ._library import lib
from .streams import stream_pointer


_TYPE_KINDS = "biufcmMOSUV"


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


def _dims_array(dims):
    return size_array(dims, "dims")


def _typestr(dtype):
    """(typestr, itemsize) of an element type: an array-interface typestr ("<f4", "|u1"; a missing
    byte order means this machine's), anything with one in `.str` (a NumPy dtype), or an int item
    size in bytes for opaque elements ("|V<n>"; 1 is "|u1")."""
    if isinstance(dtype, bool):
        raise TypeError("refpool: dtype must be a typestr such as '<f4', a NumPy dtype or an item size")
    if isinstance(dtype, int):
        size = _checked.integer(ctypes.c_size_t, dtype, "dtype (item size)")
        if size == 0:
            raise ValueError("refpool: dtype (item size) is 0; an element has at least one byte")
        return ("|u1" if size == 1 else f"|V{size}"), size
    text = getattr(dtype, "str", dtype)
    if not isinstance(text, str) and hasattr(dtype, "__index__"):
        return _typestr(operator.index(dtype))  # an int-like item size (numpy.int64)
    if not isinstance(text, str):
        raise TypeError(f"refpool: dtype must be a typestr such as '<f4', a NumPy dtype or an item size, not {dtype!r}")
    order, rest = (text[0], text[1:]) if text[:1] in "<>|=" else ("", text)
    if len(rest) < 2 or rest[0] not in _TYPE_KINDS or not rest[1:].isdigit() or int(rest[1:]) == 0:
        raise ValueError(f"refpool: dtype {text!r} is not an array-interface typestr (like '<f4', '|u1', '<i8')")
    size = int(rest[1:])
    if order in ("", "="):
        order = "|" if size == 1 or rest[0] in "bSV" else ("<" if sys.byteorder == "little" else ">")
    return order + rest, size


def malloc(backend, shape, dtype="|u1", *, stream=None, cache=None, alignment=0):
    """A new uninitialised Buffer of `shape` (an int or a tuple of ints; () is one element) of `dtype`
    (default bytes, so malloc(backend, n) is n bytes). Served through this thread's innermost active
    scope, else straight from `backend`; with `cache`, through that cache from any thread without a
    scope (the request belongs to the cache's open step). `stream`: the stream it is used on (an int
    address or a torch/CuPy/Numba stream). `alignment`: 0, or a power of two up to the backend's (256).
    The buffer goes back when the Buffer is closed (or garbage-collected) and no other handle shares it."""
    try:
        dims = tuple(shape)
    except TypeError:  # one dim (size_array checks it is a size)
        dims = (shape,)
    typestr, itemsize = _typestr(dtype)
    array, rank = _dims_array(dims)
    options = t.AllocOptions(stream=_checked.address(stream_pointer(stream), "stream"), alignment=alignment)
    if cache is not None:
        options.cache = cache.handle
    handle = lib().new_handle("refpool_alloc", backend.handle, array, rank, itemsize, ctypes.byref(options),
                              ctypes.sizeof(options))
    return Buffer(handle, typestr, _Place(backend.runtime, backend.device, backend.kind, options.stream or 0))


class Buffer(Owned):
    """A refpool buffer handle: one reference to a block, seen as a C-contiguous array of `shape` and
    `typestr`. `close()` (or `with`) drops the reference; the block goes back to its cache when the
    last one goes. Other libraries read it without a copy: `__cuda_array_interface__` (CUDA device
    memory: CuPy, Numba, PyTorch), `__array_interface__` (host memory: NumPy), and DLPack
    (`__dlpack__`, `__dlpack_device__`: the export keeps its own reference to the buffer). Consumers of
    the array interfaces keep this object alive: do not close() it while an array still views it."""

    _release_function = "refpool_release"

    def __init__(self, handle, typestr="|u1", place=None):
        super().__init__(handle)
        self._typestr = typestr
        self._place = place or _Place()

    def __repr__(self):
        if self.closed:
            return "<refpool.Buffer (released)>"
        freed = " freed" if self.info().is_freed else ""
        return f"<refpool.Buffer shape={self.shape} typestr={self._typestr!r} {self._place.kind}{freed}>"

    release = Owned.close

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
        lib().call("refpool_buffer_get_info", self.handle, ctypes.byref(info), ctypes.sizeof(info))
        return info

    @property
    def use_count(self):
        count = ctypes.c_long()
        lib().call("refpool_use_count", self.handle, ctypes.byref(count))
        return count.value

    def _interface(self):
        return {"shape": self.shape, "typestr": self._typestr, "data": (self.ptr, False), "strides": None,
                "version": 3}

    @property
    def __cuda_array_interface__(self):
        """CUDA Array Interface version 3, for device memory of a CUDA backend. `stream` is the stream
        the buffer was requested for (1, CUDA's legacy default stream, when none was given): a
        consumer on another stream waits for it. Owners of host memory get AttributeError, so
        consumers fall back to other interfaces."""
        if not (self._place.runtime == "cuda" and self._place.on_device):
            raise AttributeError(f"refpool.Buffer of {self._place.runtime} {self._place.kind} memory has no "
                                 "__cuda_array_interface__ (CUDA device memory only)")
        interface = self._interface()
        interface["stream"] = self._place.stream or 1
        return interface

    @property
    def __array_interface__(self):
        """NumPy's array interface (version 3), for memory the host can read: host and pinned host."""
        if not self._place.host_accessible:
            raise AttributeError(f"refpool.Buffer of {self._place.runtime} {self._place.kind} memory has no "
                                 "__array_interface__ (host memory only)")
        return self._interface()

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
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"refpool.Buffer.__dlpack__: the buffer is on {self.__dlpack_device__()}, not {dl_device}")
        return dlpack_capsule(self.retain(), self.ptr, self.shape, self._typestr, self.__dlpack_device__())

    def reshape(self, dims):
        """A new handle sharing the buffer with other dims (same element count)."""
        array, rank = _dims_array(dims)
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
        nbytes = self.nbytes
        array = (ctypes.c_char * nbytes).from_address(self.ptr) if nbytes else (ctypes.c_char * 0)()
        array.owner = self.retain()  # the view keeps its own reference
        return memoryview(array).cast("B")
