"""Streams as the C API takes them: an opaque CUstream / hipStream_t address, None for the default."""


def stream_pointer(stream, what="stream"):
    """The address of `stream`: None or 0 (the default stream), an int, or a framework's stream object
    (torch.cuda.Stream's cuda_stream, CuPy's ptr, Numba's handle)."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream or None
    for attribute in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attribute, None)
        if value is not None:
            value = getattr(value, "value", value)  # a ctypes pointer (Numba without NVIDIA bindings)
            return int(value) or None
    raise TypeError(f"refpool: {what}: cannot take a stream address from {stream!r} (give an int, None, or a "
                    "torch/CuPy/Numba stream)")
