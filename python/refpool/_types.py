"""ctypes mirrors of refpool.h's structs and enums (include/refpool/refpool.h is the reference). The
cache option structs are laid out from the library's table instead (_options)."""
import ctypes
import functools
from ctypes import Structure, c_char_p, c_int, c_size_t, c_uint64

from . import _checked

# refpool_status values (stable, part of the ABI).
OK = 0
INVALID_ARGUMENT = 8

# refpool_summary_detail
SUMMARY_DETAILS = {"short": 0, "full": 1}

# refpool_memory_kind
MEMORY_KINDS = {"host": 0, "device": 1, "device_async": 2, "pinned_host": 3}
# refpool_runtime
RUNTIMES = {"cuda": 0, "hip": 1, "host": 2}

UNLIMITED = ctypes.c_size_t(-1).value  # REFPOOL_UNLIMITED (SIZE_MAX)


class Handle(Structure):
    """Every refpool handle (backend, cache, scope, step, buffer) is a struct holding one 64-bit id."""
    _fields_ = [("id", c_uint64)]


class Checked(Structure):
    """A struct the package fills from user values: each integer field is checked against its C type
    on assignment (a plain ctypes field would wrap 2**64 to 0), and each char* field holds text
    without a NUL (C would read only the text before it)."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        for (name, _), value in zip(self._fields_, args):
            setattr(self, name, value)
        for name, value in kwargs.items():
            setattr(self, name, value)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # field -> (its check, what to call it in messages), for the integer and char* fields
        cls._checked_fields = {}
        for name, ctype in cls.__dict__["_fields_"]:
            if ctype in _checked.INTEGER_RANGES:
                cls._checked_fields[name] = (functools.partial(_checked.integer, ctype), f"{cls.__name__}.{name}")
            elif ctype is c_char_p:
                cls._checked_fields[name] = (_checked.optional_text, f"{cls.__name__}.{name}")

    def __setattr__(self, name, value):
        checked = self._checked_fields.get(name)
        if checked is not None:
            value = checked[0](value, checked[1])
        super().__setattr__(name, value)


class ScopeOptions(Checked):
    """refpool_scope_options: also the options of a step."""
    _fields_ = [("uncached_warmup_entries", c_size_t), ("plan", c_char_p)]


class AllocOptions(Checked):
    """refpool_alloc_options: the stream, an alignment (0: the backend's) and a cache (id 0: the
    thread's scope)."""
    _fields_ = [("stream", ctypes.c_void_p), ("alignment", c_size_t), ("cache", Handle)]


class AllocatorOptions(Checked):
    """refpool_allocator_options: the framework allocator's runtime and memory kind (its cache's
    options are a refpool_cache_options of their own)."""
    _fields_ = [("runtime", c_int), ("kind", c_int)]


class OptionInfo(Structure):
    """refpool_option_info: one cache option (refpool_cache_option_info). refpool_cache_options is
    laid out from these at first use (_options)."""
    _fields_ = [("name", c_char_p), ("kind", c_char_p), ("offset", c_size_t), ("size", c_size_t),
                ("default_text", c_char_p), ("allowed", c_char_p), ("description", c_char_p)]


class PoolId(Checked):
    """refpool_pool_id: a private pool's name (PyTorch's MempoolId_t)."""
    _fields_ = [("first", c_uint64), ("second", c_uint64)]


class BufferInfo(Structure):
    _fields_ = [("rank", c_size_t), ("element_count", c_size_t), ("element_size", c_size_t), ("bytes", c_size_t),
                ("is_freed", c_int)]


class BackendStats(Structure):
    _fields_ = [("outstanding_bytes", c_size_t), ("allocation_count", c_uint64), ("deallocation_count", c_uint64)]


class MemorySegment(Structure):
    """refpool_memory_segment: one segment of a cache's memory map."""
    _fields_ = [("address", c_uint64), ("reserved_bytes", c_uint64), ("committed_bytes", c_uint64),
                ("first_range", c_uint64), ("range_count", c_uint64), ("device", ctypes.c_int32),
                ("memory_kind", ctypes.c_int32), ("pool", ctypes.c_int32), ("expandable", ctypes.c_int32)]


class MemoryRange(Structure):
    """refpool_memory_range: one range of a segment, in address order."""
    _fields_ = [("address", c_uint64), ("bytes", c_uint64), ("segment", c_uint64), ("state", ctypes.c_int32),
                ("unused", ctypes.c_int32)]


def enum_value(table, name, what):
    """The C value of `name` in `table`, or a ValueError listing the accepted names."""
    if not isinstance(name, str):
        raise TypeError(f"refpool: {what} must be a str (one of: {', '.join(table)}), not {type(name).__name__}")
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"refpool: unknown {what} {name!r} (one of: {', '.join(table)})") from None
