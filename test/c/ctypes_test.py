#!/usr/bin/env python3
"""The C API from Python ctypes: the seed case (16 floats, then 4x4 floats served by one buffer),
use after unsafe_free, double release, stats. Usage: ctypes_test.py PATH/TO/librefpool.so

Also the example of docs/embedding.md: `Refpool` below is a complete minimal binding."""
import ctypes
import sys
import unittest
from ctypes import POINTER, Structure, byref, c_char_p, c_int, c_long, c_size_t, c_uint64, c_void_p

OK = 0
ERROR_USE_AFTER_FREE = 1
ERROR_SHAPE = 2
ERROR_CONFIG = 7
ERROR_INVALID_ARGUMENT = 8
ERROR_INVALID_HANDLE = 9


class Handle(Structure):
    """Every refpool handle is a struct holding one 64-bit id, passed by value."""
    _fields_ = [("id", c_uint64)]


class OptionInfo(Structure):
    """refpool_option_info: one cache option, from refpool_cache_option_info."""
    _fields_ = [("name", c_char_p), ("kind", c_char_p), ("offset", c_size_t), ("size", c_size_t),
                ("default_text", c_char_p), ("allowed", c_char_p), ("description", c_char_p)]


class RoundingPolicy(Structure):
    _fields_ = [("mode", c_int), ("parameter", c_size_t)]


# The C type of each kind of option (refpool/cache_option_fields.h); C enums are ints.
OPTION_KINDS = {"rounding_policy": RoundingPolicy, "byte_limit": c_size_t, "segment_policy": c_int, "on_off": c_int}


def cache_options_type(lib):
    """refpool_cache_options, laid out from the library's own table of options, each field's place
    checked against it. Options are set by name, in REFPOOL_CONF's spelling
    (refpool_cache_options_set), so this binding needs no change when the library adds one."""
    lib.refpool_cache_option_count.restype = c_size_t
    lib.refpool_cache_option_info.restype = c_int
    lib.refpool_cache_option_info.argtypes = [c_size_t, POINTER(OptionInfo), c_size_t]
    infos = [OptionInfo() for _ in range(lib.refpool_cache_option_count())]
    for i, info in enumerate(infos):
        assert lib.refpool_cache_option_info(i, byref(info), ctypes.sizeof(info)) == OK, i
    struct = type("CacheOptions", (Structure,),
                  {"_fields_": [(info.name.decode(), OPTION_KINDS[info.kind.decode()]) for info in infos]})
    for info in infos:
        assert getattr(struct, info.name.decode()).offset == info.offset, info.name
    return struct


def cache_stats_type(lib):
    """refpool_cache_stats, laid out from the library's own list of counters (refpool_stat_name):
    every field is 64 bits on LP64 (uint64_t or size_t), in that order."""
    lib.refpool_stat_count.restype = c_size_t
    lib.refpool_stat_name.restype = c_char_p
    lib.refpool_stat_name.argtypes = [c_size_t]
    names = [lib.refpool_stat_name(i).decode() for i in range(lib.refpool_stat_count())]
    return type("CacheStats", (Structure,), {"_fields_": [(name, c_uint64) for name in names]})


class RefpoolError(Exception):
    def __init__(self, status, name, message):
        super().__init__(f"{name}: {message}")
        self.status = status


class Refpool:
    """The library, with argument types declared and each status checked."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        global CacheStats, CacheOptions
        CacheStats = cache_stats_type(lib)
        CacheOptions = cache_options_type(lib)
        size_p = POINTER(c_size_t)
        signatures = {
            "refpool_backend_new_host": [POINTER(Handle)],
            "refpool_backend_release": [Handle],
            "refpool_cache_options_init": [POINTER(CacheOptions), c_size_t],
            "refpool_cache_options_set": [POINTER(CacheOptions), c_size_t, c_char_p, c_char_p],
            "refpool_cache_create": [POINTER(CacheOptions), c_size_t, POINTER(Handle)],
            "refpool_cache_destroy": [Handle],
            "refpool_cache_get_stats": [Handle, POINTER(CacheStats), c_size_t],
            "refpool_scope_enter": [Handle, POINTER(Handle)],
            "refpool_scope_exit": [Handle],
            "refpool_alloc": [Handle, size_p, c_size_t, c_size_t, c_void_p, c_size_t, POINTER(Handle)],
            "refpool_reshape": [Handle, size_p, c_size_t, POINTER(Handle)],
            "refpool_retain": [Handle, POINTER(Handle)],
            "refpool_release": [Handle],
            "refpool_unsafe_free": [Handle],
            "refpool_use_count": [Handle, POINTER(c_long)],
            "refpool_data": [Handle, POINTER(c_void_p)],
            "refpool_dims": [Handle, size_p, c_size_t, size_p],
        }
        for name, argtypes in signatures.items():
            function = getattr(lib, name)
            function.argtypes = argtypes
            function.restype = c_int
        lib.refpool_last_error.restype = c_char_p
        lib.refpool_status_name.restype = c_char_p
        lib.refpool_status_name.argtypes = [c_int]
        self.lib = lib

    def call(self, name, *args):
        """Calls `name`; raises RefpoolError with the status and last-error message on failure."""
        status = getattr(self.lib, name)(*args)
        if status != OK:
            raise RefpoolError(status, self.lib.refpool_status_name(status).decode(),
                               self.lib.refpool_last_error().decode())

    def new(self, name, *args):
        """Calls a function whose last parameter is an output handle and returns the handle."""
        handle = Handle()
        self.call(name, *args, byref(handle))
        return handle

    def alloc(self, backend, dims, element_size):
        array = (c_size_t * len(dims))(*dims)
        return self.new("refpool_alloc", backend, array, len(dims), element_size, None, 0)

    def reshape(self, buffer, dims):
        return self.new("refpool_reshape", buffer, (c_size_t * len(dims))(*dims), len(dims))

    def data(self, buffer):
        pointer = c_void_p()
        self.call("refpool_data", buffer, byref(pointer))
        return pointer.value

    def dims(self, buffer):
        rank = c_size_t()
        self.call("refpool_dims", buffer, None, 0, byref(rank))
        dims = (c_size_t * rank.value)()
        self.call("refpool_dims", buffer, dims, rank.value, byref(rank))
        return tuple(dims)

    def use_count(self, buffer):
        count = c_long()
        self.call("refpool_use_count", buffer, byref(count))
        return count.value

    def stats(self, cache):
        stats = CacheStats()
        self.call("refpool_cache_get_stats", cache, byref(stats), ctypes.sizeof(stats))
        return {name: getattr(stats, name) for name, _ in CacheStats._fields_}

    def exact_cache(self, **options):
        """A cache with the defaults and `options` (name="text", as in REFPOOL_CONF)."""
        filled = CacheOptions()
        size = ctypes.sizeof(filled)
        self.call("refpool_cache_options_init", byref(filled), size)
        for name, text in options.items():
            self.call("refpool_cache_options_set", byref(filled), size, name.encode(), text.encode())
        return self.new("refpool_cache_create", byref(filled), size)


class CtypesTest(unittest.TestCase):
    def setUp(self):
        self.rp = rp
        self.backend = rp.new("refpool_backend_new_host")
        self.cache = rp.exact_cache()

    def tearDown(self):
        self.rp.call("refpool_cache_destroy", self.cache)
        self.rp.call("refpool_backend_release", self.backend)

    def assert_status(self, status, name, *args):
        with self.assertRaises(RefpoolError) as raised:
            self.rp.call(name, *args)
        self.assertEqual(raised.exception.status, status, str(raised.exception))
        return str(raised.exception)

    def test_seed_case(self):
        first = None
        for _ in range(3):
            scope = self.rp.new("refpool_scope_enter", self.cache)
            a = self.rp.alloc(self.backend, [16], 4)
            first = first or self.rp.data(a)
            self.assertEqual(self.rp.data(a), first)
            self.assertEqual(self.rp.dims(a), (16,))
            floats = (ctypes.c_float * 16).from_address(self.rp.data(a))
            floats[:] = [float(i) for i in range(16)]
            self.rp.call("refpool_release", a)
            b = self.rp.alloc(self.backend, [4, 4], 4)
            self.assertEqual(self.rp.data(b), first)
            self.assertEqual(self.rp.dims(b), (4, 4))
            self.rp.call("refpool_release", b)
            self.rp.call("refpool_scope_exit", scope)
        stats = self.rp.stats(self.cache)
        self.assertEqual((stats["misses"], stats["hits"], stats["backend_allocations"]), (1, 5, 1))
        self.assertEqual((stats["idle_blocks"], stats["idle_bytes"], stats["live_blocks"]), (1, 64, 0))

    def test_use_after_unsafe_free(self):
        scope = self.rp.new("refpool_scope_enter", self.cache)
        a = self.rp.alloc(self.backend, [16], 4)
        shared = self.rp.new("refpool_retain", a)
        self.assertEqual(self.rp.use_count(a), 2)
        self.rp.call("refpool_unsafe_free", a)
        self.assertEqual(self.rp.use_count(a), 0)
        self.assertEqual(self.rp.use_count(shared), 1)
        message = self.assert_status(ERROR_USE_AFTER_FREE, "refpool_data", a, byref(c_void_p()))
        self.assertIn("unsafe_free", message)
        self.assert_status(ERROR_USE_AFTER_FREE, "refpool_retain", a, byref(Handle()))
        self.assertEqual(self.rp.dims(a), (16,))  # a freed view keeps its dims
        self.rp.call("refpool_release", shared)

        b = self.rp.alloc(self.backend, [16], 4)
        b_data = self.rp.data(b)
        self.rp.call("refpool_unsafe_free", b)  # the only reference: reusable at once
        c = self.rp.alloc(self.backend, [4, 4], 4)
        self.assertEqual(self.rp.data(c), b_data)
        self.assert_status(ERROR_USE_AFTER_FREE, "refpool_data", b, byref(c_void_p()))
        for handle in (a, b, c):
            self.rp.call("refpool_release", handle)
        self.rp.call("refpool_scope_exit", scope)
        stats = self.rp.stats(self.cache)
        self.assertEqual((stats["unsafe_frees"], stats["backend_allocations"]), (1, 1))

    def test_double_release(self):
        a = self.rp.alloc(self.backend, [16], 4)
        self.rp.call("refpool_release", a)
        message = self.assert_status(ERROR_INVALID_HANDLE, "refpool_release", a)
        self.assertIn("already released", message)
        self.assert_status(ERROR_INVALID_HANDLE, "refpool_data", a, byref(c_void_p()))
        b = self.rp.alloc(self.backend, [16], 4)  # takes a's slot; a still cannot reach it
        self.assert_status(ERROR_INVALID_HANDLE, "refpool_release", a)
        self.assertEqual(self.rp.use_count(b), 1)
        self.rp.call("refpool_release", b)
        self.assert_status(ERROR_INVALID_ARGUMENT, "refpool_release", Handle(0))
        self.assert_status(ERROR_INVALID_HANDLE, "refpool_release", self.cache)  # a cache, not a buffer

    def test_stats_and_errors(self):
        scope = self.rp.new("refpool_scope_enter", self.cache)
        kept = self.rp.alloc(self.backend, [256], 4)
        view = self.rp.reshape(kept, [16, 16])
        self.assertEqual(self.rp.data(view), self.rp.data(kept))
        message = self.assert_status(ERROR_SHAPE, "refpool_reshape", kept, (c_size_t * 2)(5, 3), 2,
                                     byref(Handle()))
        self.assertIn("(5, 3)", message)
        self.rp.call("refpool_scope_exit", scope)  # kept (and its view) escape
        stats = self.rp.stats(self.cache)
        self.assertEqual((stats["escapes"], stats["live_blocks"], stats["live_bytes"]), (1, 1, 1024))
        self.rp.call("refpool_release", kept)
        self.rp.call("refpool_release", view)
        self.assertEqual(self.rp.stats(self.cache)["idle_bytes"], 1024)

    def test_options_by_name(self):
        cache = self.rp.exact_cache(rounding="step:256", max_idle_bytes="1K")
        scope = self.rp.new("refpool_scope_enter", cache)
        self.rp.call("refpool_release", self.rp.alloc(self.backend, [100], 1))  # rounded up to 256 bytes
        self.rp.call("refpool_scope_exit", scope)
        self.assertEqual(self.rp.stats(cache)["idle_bytes"], 256)
        self.rp.call("refpool_cache_destroy", cache)
        message = self.assert_status(ERROR_CONFIG, "refpool_cache_options_set", byref(CacheOptions()),
                                     ctypes.sizeof(CacheOptions), b"segments", b"sometimes")
        self.assertIn("off, on, auto", message)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: ctypes_test.py PATH/TO/librefpool.so [unittest args]")
    rp = Refpool(sys.argv.pop(1))
    unittest.main(verbosity=2)
