"""Finds and loads librefpool, declares the C signatures, and turns failed statuses into exceptions.

The library is looked up once, on first use (importing refpool loads nothing): $REFPOOL_LIBRARY if
set (a build tree: build/python/librefpool.so), else the copy installed inside this package. Each C
function is bound on its first call, so a library older than this package fails only the calls it
lacks, with a message naming the function."""
import ctypes
import os
import threading
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_uint64, c_void_p
from pathlib import Path

from . import _checked
from . import _types as t
from .errors import LibraryError, error_for_status

LIBRARY_ENV = "REFPOOL_LIBRARY"
_LIBRARY_NAME = "librefpool.so"

_size_p = POINTER(c_size_t)
_handle_p = POINTER(t.Handle)
_ssize_t = _checked.ssize_t

# name: (restype, [(parameter, C type)...]) as in refpool.h. restype c_int means a refpool_status,
# checked by call(). Every argument is checked against its C type before the call (_checked).
# A struct parameter is SIZED: callers pass the struct (None: NULL) and C gets its address, then
# its sizeof (refpool.h, "Structs that grow": every struct passed by address carries its size).
# _checked.BY_ADDRESS passes the address alone, for a struct that does not grow.
_SIZED = _checked.SIZED
SIGNATURES = {
    "refpool_last_error": (c_char_p, []),
    "refpool_status_name": (c_char_p, [("status", c_int)]),
    "refpool_version": (c_char_p, []),
    # backends
    "refpool_backend_host": (c_int, [("out", _handle_p)]),
    "refpool_backend_new_host": (c_int, [("out", _handle_p)]),
    "refpool_backend_new_host_limited": (c_int, [("capacity_bytes", c_size_t), ("out", _handle_p)]),
    "refpool_backend_cuda": (c_int, [("device", c_int), ("kind", c_int), ("out", _handle_p)]),
    "refpool_backend_hip": (c_int, [("device", c_int), ("kind", c_int), ("out", _handle_p)]),
    "refpool_backend_release": (c_int, [("backend", t.Handle)]),
    "refpool_backend_get_stats": (c_int, [("backend", t.Handle), ("out", _SIZED)]),
    "refpool_retire_stream": (c_int, [("backend", t.Handle), ("stream", c_void_p)]),
    # caches
    # cache options: the struct is laid out from the library's table (_options)
    "refpool_cache_options_init": (c_int, [("options", _SIZED)]),
    "refpool_cache_options_from_environment": (c_int, [("options", _SIZED)]),
    "refpool_cache_options_parse": (c_int, [("options", _SIZED), ("conf", c_char_p)]),
    "refpool_cache_options_set": (c_int, [("options", _SIZED), ("name", c_char_p), ("value", c_char_p)]),
    "refpool_cache_option_count": (c_size_t, []),
    "refpool_cache_option_info": (c_int, [("index", c_size_t), ("out", _SIZED)]),
    "refpool_cache_create": (c_int, [("options", _SIZED), ("out", _handle_p)]),
    "refpool_cache_destroy": (c_int, [("cache", t.Handle)]),
    "refpool_cache_get_stats": (c_int, [("cache", t.Handle), ("out", _SIZED)]),
    "refpool_cache_reclaim": (c_int, [("cache", t.Handle), ("keep_bytes", c_size_t), ("freed", _size_p)]),
    "refpool_cache_set_max_idle_bytes": (c_int, [("cache", t.Handle), ("max_idle_bytes", c_size_t)]),
    "refpool_cache_reset_peaks": (c_int, [("cache", t.Handle)]),
    "refpool_cache_summary": (c_int, [("cache", t.Handle), ("detail", c_int), ("text", POINTER(ctypes.c_char)),
                                      ("capacity", c_size_t), ("length", _size_p)]),
    "refpool_cache_memory_map": (c_int, [("cache", t.Handle), ("segments", POINTER(t.MemorySegment)),
                                         ("segment_capacity", c_size_t), ("segment_size", c_size_t),
                                         ("segment_count", _size_p), ("ranges", POINTER(t.MemoryRange)),
                                         ("range_capacity", c_size_t), ("range_size", c_size_t),
                                         ("range_count", _size_p)]),
    # scopes and steps
    "refpool_scope_enter": (c_int, [("cache", t.Handle), ("out", _handle_p)]),
    "refpool_scope_enter_with_options": (c_int, [("cache", t.Handle), ("options", _SIZED), ("out", _handle_p)]),
    "refpool_scope_exit": (c_int, [("scope", t.Handle)]),
    "refpool_step_begin": (c_int, [("cache", t.Handle), ("options", _SIZED), ("out", _handle_p)]),
    "refpool_step_end": (c_int, [("step", t.Handle)]),
    # buffers
    "refpool_alloc": (c_int, [("backend", t.Handle), ("dims", _size_p), ("rank", c_size_t),
                              ("element_size", c_size_t), ("options", _SIZED), ("out", _handle_p)]),
    "refpool_record_stream": (c_int, [("buffer", t.Handle), ("stream", c_void_p)]),
    "refpool_reshape": (c_int, [("buffer", t.Handle), ("dims", _size_p), ("rank", c_size_t), ("out", _handle_p)]),
    "refpool_retain": (c_int, [("buffer", t.Handle), ("out", _handle_p)]),
    "refpool_release": (c_int, [("buffer", t.Handle)]),
    "refpool_unsafe_free": (c_int, [("buffer", t.Handle)]),
    "refpool_use_count": (c_int, [("buffer", t.Handle), ("out", POINTER(ctypes.c_long))]),
    "refpool_data": (c_int, [("buffer", t.Handle), ("out", POINTER(c_void_p))]),
    "refpool_dims": (c_int, [("buffer", t.Handle), ("dims", _size_p), ("capacity", c_size_t), ("rank", _size_p)]),
    "refpool_buffer_get_info": (c_int, [("buffer", t.Handle), ("out", _SIZED)]),
    # free by address (what refpool_allocator_alloc handed out)
    "refpool_free": (c_int, [("address", c_void_p)]),
    # stats by name
    "refpool_stat_count": (c_size_t, []),
    "refpool_stat_name": (c_char_p, [("index", c_size_t)]),
    "refpool_stat_description": (c_char_p, [("index", c_size_t)]),
    "refpool_cache_get_stat_values": (c_int, [("cache", t.Handle), ("values", POINTER(c_uint64)),
                                              ("capacity", c_size_t), ("count", _size_p)]),
    # the process-wide framework allocator and its entry points
    "refpool_allocator_options_init": (c_int, [("options", _SIZED)]),
    # the framework allocator's options and its cache's options (NULL: REFPOOL_CONF), each with its size
    "refpool_allocator_configure": (c_int, [("options", _SIZED), ("cache", _SIZED)]),
    "refpool_allocator_cache": (c_int, [("out", _handle_p)]),
    "refpool_allocator_alloc": (c_int, [("bytes", c_size_t), ("device", c_int), ("stream", c_void_p),
                                        ("out", POINTER(c_void_p))]),
    "refpool_allocator_set_device_limit": (c_int, [("device", c_int), ("bytes", c_size_t)]),
    "refpool_allocator_empty_cache": (c_int, []),
    "refpool_allocator_record_stream": (c_int, [("address", c_void_p), ("stream", c_void_p)]),
    "refpool_allocator_begin_pool": (c_int, [("device", c_int), ("pool", t.PoolId), ("filter", c_void_p),
                                             ("context", c_void_p), ("drop_context", c_void_p)]),
    "refpool_allocator_end_pool": (c_int, [("device", c_int), ("pool", t.PoolId)]),
    "refpool_allocator_release_pool": (c_int, [("device", c_int), ("pool", t.PoolId)]),
    "refpool_allocator_routing_to_pools": (c_int, []),
    "refpool_allocator_set_caching": (None, [("on", c_int)]),
    "refpool_allocator_caching": (c_int, []),
    "refpool_allocator_pool_ids": (c_int, [("ids", POINTER(t.PoolId)), ("capacity", c_size_t), ("count", _size_p)]),
    "refpool_allocator_pool_cache": (c_int, [("pool", t.PoolId), ("out", _handle_p)]),
    "refpool_allocator_pool_take": (c_int, [("device", c_int), ("pool", t.PoolId), ("address", c_void_p),
                                            ("bytes", c_size_t), ("stream", c_void_p), ("out", POINTER(c_void_p))]),
    "refpool_capture_begin": (c_int, [("device", c_int)]),
    "refpool_capture_end": (c_int, [("device", c_int)]),
    "refpool_torch_malloc": (c_void_p, [("size", _ssize_t), ("device", c_int), ("stream", c_void_p)]),
    "refpool_torch_free": (None, [("address", c_void_p), ("size", _ssize_t), ("device", c_int), ("stream", c_void_p)]),
    "refpool_cupy_malloc": (c_void_p, [("param", c_void_p), ("size", c_size_t), ("device", c_int)]),
    "refpool_cupy_free": (None, [("param", c_void_p), ("address", c_void_p), ("device", c_int)]),
    # the package's DLPack capsule destructor and deleter (python/dlpack_glue.cpp: its library only)
    "refpool_python_dlpack_setup": (c_int, [("api", _checked.SIZED)]),
    "refpool_python_dlpack_deleter": (None, [("managed", c_void_p)]),
    "refpool_python_capsule_destructor": (None, [("capsule", c_void_p)]),
}


class Library:
    """librefpool, loaded once: `fn(name)` is the bound C function, `call(name, ...)` checks its status."""

    def __init__(self, path):
        self.path = str(path)
        try:
            self.cdll = ctypes.CDLL(self.path)
        except OSError as e:
            raise LibraryError(f"refpool: cannot load {self.path}: {e}") from None
        self._functions = {}

    def fn(self, name):
        """The C function `name`, whose arguments are checked against refpool.h's types before the call."""
        function = self._functions.get(name)
        if function is None:
            restype, parameters = SIGNATURES[name]
            try:
                raw = getattr(self.cdll, name)
            except AttributeError:
                raise LibraryError(
                    f"refpool: librefpool {self.version()} at {self.path} has no function {name}: it was built from "
                    "an older refpool than this package; rebuild it from the same source") from None
            raw.restype = restype
            raw.argtypes = _checked.c_types(parameters)
            function = _checked.checked_function(name, raw, parameters)
            self._functions[name] = function
        return function

    def has(self, name):
        return hasattr(self.cdll, name)

    def address(self, name):
        """The address of a C function, for frameworks that call it themselves."""
        self.fn(name)
        return ctypes.cast(getattr(self.cdll, name), c_void_p).value

    def call(self, name, *args):
        """Calls a status-returning function; raises the status's RefpoolError subclass on failure."""
        status = self.fn(name)(*args)
        if status != t.OK:
            raise self._error(status)

    def _error(self, status):
        return error_for_status(status, self.status_name(status), self.last_error())

    def text(self, name, *args):
        """Calls a function that writes text for people into the caller's buffer (its last parameters:
        char* text, size_t capacity, size_t* length); returns the text."""
        return read_text(self.fn(name), args, lambda status: self._error(status))

    def new_handle(self, name, *args):
        """Calls a function whose last parameter is an output handle; returns the handle."""
        handle = t.Handle()
        self.call(name, *args, ctypes.byref(handle))
        return handle

    def last_error(self):
        return self.fn("refpool_last_error")().decode(errors="replace")

    def status_name(self, status):
        return self.fn("refpool_status_name")(status).decode()

    def version(self):
        return self.fn("refpool_version")().decode()


def read_text(function, args, error):
    """The text `function(*args, text, capacity, length)` writes: asked for its length first (text
    NULL, capacity 0), then into a buffer one larger, again while another thread makes it grow
    between the calls (INVALID_ARGUMENT with *length at or past the capacity). `error(status)` is
    the exception for any other failure."""
    length = c_size_t()
    buffer, capacity = None, 0
    while True:
        status = function(*args, buffer, capacity, ctypes.byref(length))
        if status == t.OK and buffer is not None:
            return buffer.value.decode(errors="replace")
        if status not in (t.OK, t.INVALID_ARGUMENT) or length.value < capacity:
            raise error(status)
        capacity = length.value + 1
        buffer = ctypes.create_string_buffer(capacity)


_lock = threading.Lock()
_library = None


def library_path():
    """Where librefpool is taken from: $REFPOOL_LIBRARY, else the copy inside this package."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        path = Path(override).expanduser().resolve()
        if not path.is_file():
            raise LibraryError(f"refpool: {LIBRARY_ENV}={override} names no file")
        return path
    path = Path(__file__).resolve().parent / _LIBRARY_NAME
    if not path.is_file():
        raise LibraryError(
            f"refpool: {path} is missing: install the package with `pip install .` from the refpool source, or "
            f"point {LIBRARY_ENV} at a built librefpool (build/python/{_LIBRARY_NAME} of a meson build)")
    return path


def lib():
    """The loaded library (loaded on first call, thread-safe)."""
    global _library
    if _library is None:
        with _lock:
            if _library is None:
                _library = Library(library_path())
    return _library
