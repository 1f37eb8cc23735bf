"""Streams as the C API takes them: an opaque CUstream / hipStream_t address, None for the default."""
import operator

from ._checked import is_bool

_NOT_ADDRESSES = (float, complex, str, bytes, bytearray)


def stream_pointer(stream, what="stream"):
    """The address of `stream`: None or 0 (the default stream), an int (or an int-like such as
    numpy.int64), or a framework's stream object (torch.cuda.Stream's cuda_stream, CuPy's ptr,
    Numba's handle: a ctypes c_void_p, NULL for the default stream, or cuda-python's CUstream)."""
    if stream is None:
        return None
    if isinstance(stream, int):  # bool too: the C call's check refuses it, naming the argument
        return stream or None
    if not is_bool(stream) and hasattr(type(stream), "__index__"):
        return operator.index(stream) or None
    for attribute in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attribute, None)
        if value is not None:
            return _handle_address(value, stream, what)
    raise TypeError(f"refpool: {what}: cannot take a stream address from {stream!r} (give an int, None, or a "
                    "torch/CuPy/Numba stream)")


def _handle_address(value, stream, what):
    if hasattr(value, "value") and not isinstance(value, int):
        value = value.value  # a ctypes pointer (Numba without NVIDIA bindings): None is NULL
        if value is None:
            return None
    if is_bool(value) or isinstance(value, _NOT_ADDRESSES):  # int() would truncate or parse these
        raise TypeError(f"refpool: {what}: the address of stream {stream!r} is {value!r}, not an int")
    try:
        return int(value) or None  # an int, or a handle object with __int__ (cuda-python's CUstream)
    except (TypeError, ValueError):
        raise TypeError(f"refpool: {what}: cannot take an address from stream {stream!r}'s {value!r}") from None
