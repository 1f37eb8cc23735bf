"""Buffers (refpool_buffer): one reference to a block, with dims and an element size; and raw pointers."""
import ctypes

from . import _types as t
from ._checked import size_array
from ._handles import Owned
from ._library import lib
from .streams import stream_pointer


def _dims_array(dims):
    return size_array(dims, "dims")


def alloc(backend, dims, element_size, stream=None):
    """A new uninitialised buffer: through the innermost active scope of this thread, else straight
    from `backend`. With `stream` (a GPU backend), ordered on that stream."""
    array, rank = _dims_array(dims)
    if stream is None:
        handle = lib().new_handle("refpool_alloc", backend.handle, array, rank, element_size)
    else:
        handle = lib().new_handle("refpool_alloc_on_stream", backend.handle, array, rank, element_size,
                                  stream_pointer(stream))
    return Buffer(handle)


def malloc(backend, nbytes, stream=None):
    """`nbytes` through this thread's active scope, else straight from `backend`: the address (0 for
    0 bytes). Give it back with free()."""
    out = ctypes.c_void_p()
    lib().call("refpool_malloc", backend.handle, nbytes, stream_pointer(stream), ctypes.byref(out))
    return out.value or 0


def free(address):
    """Gives back an address from malloc (any thread). 0 is a no-op; an unknown address or a second
    free raises InvalidArgumentError and frees nothing."""
    lib().call("refpool_free", address)


class Buffer(Owned):
    """A refpool buffer handle. `close()` (or `release()`) drops the reference; the block goes back to
    its cache when the last one goes."""

    _release_function = "refpool_release"

    def __repr__(self):
        if self.closed:
            return "<refpool.Buffer (released)>"
        info = self.info()
        return f"<refpool.Buffer dims={self.dims} element_size={info.element_size}{' freed' if info.is_freed else ''}>"

    release = Owned.close

    @property
    def address(self):
        """The first element's address (0 for zero elements). Valid while a handle holds the buffer."""
        out = ctypes.c_void_p()
        lib().call("refpool_data", self.handle, ctypes.byref(out))
        return out.value or 0

    @property
    def dims(self):
        rank = ctypes.c_size_t()
        lib().call("refpool_dims", self.handle, None, 0, ctypes.byref(rank))
        dims = (ctypes.c_size_t * max(rank.value, 1))()
        lib().call("refpool_dims", self.handle, dims, rank.value, ctypes.byref(rank))
        return tuple(dims[:rank.value])

    def info(self):
        info = t.BufferInfo()
        lib().call("refpool_buffer_get_info", self.handle, ctypes.byref(info))
        return info

    @property
    def nbytes(self):
        return self.info().bytes

    @property
    def use_count(self):
        count = ctypes.c_long()
        lib().call("refpool_use_count", self.handle, ctypes.byref(count))
        return count.value

    def reshape(self, dims):
        """A new handle sharing the buffer with other dims (same element count)."""
        array, rank = _dims_array(dims)
        return Buffer(lib().new_handle("refpool_reshape", self.handle, array, rank))

    def retain(self):
        """A new handle sharing the buffer, same dims."""
        return Buffer(lib().new_handle("refpool_retain", self.handle))

    def unsafe_free(self):
        """Drops this handle's reference now: the buffer is reusable at once if no other handle shares
        it; this handle then fails with UseAfterFreeError on data access."""
        lib().call("refpool_unsafe_free", self.handle)

    def record_stream(self, stream):
        """Marks the buffer as used on `stream` too: not reused before that stream's work is done."""
        lib().call("refpool_record_stream", self.handle, stream_pointer(stream))

    def view(self):
        """A writable memoryview of a host buffer's bytes, holding the buffer while it lives."""
        nbytes = self.nbytes
        array = (ctypes.c_char * nbytes).from_address(self.address) if nbytes else (ctypes.c_char * 0)()
        array.owner = self.retain()  # the view keeps its own reference
        return memoryview(array).cast("B")
