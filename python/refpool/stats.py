"""Cache counters as a dict of name -> int, and a recorder of snapshots over time (for refpool.plot).

The names come from the library (refpool_stat_name), so counters a newer library adds appear here
without a change to this package."""
import ctypes
import json
import time
from ctypes import c_size_t, c_uint64

from . import _types as t
from ._handles import handle_of
from ._library import lib


def stat_names():
    """The counter names, in the library's order (stable: new ones are appended)."""
    library = lib()
    count = library.fn("refpool_stat_count")()
    return [library.fn("refpool_stat_name")(i).decode() for i in range(count)]


def stat_descriptions():
    """name -> one-line description, from the library."""
    library = lib()
    count = library.fn("refpool_stat_count")()
    return {library.fn("refpool_stat_name")(i).decode(): library.fn("refpool_stat_description")(i).decode()
            for i in range(count)}


def _by_name(handle):
    library = lib()
    names = stat_names()
    values = (c_uint64 * len(names))()
    count = c_size_t()
    library.call("refpool_cache_get_stat_values", handle, values, len(names), ctypes.byref(count))
    return dict(zip(names, values[:count.value]))


def _by_struct(handle, struct_type, function):
    snapshot = struct_type()  # the library writes only sizeof(snapshot) bytes (refpool.h, "Structs that grow")
    lib().call(function, handle, snapshot)
    return {name: getattr(snapshot, name) for name, _ in struct_type._fields_}


def cache_stats(handle):
    """The counters of the cache behind `handle`."""
    return _by_name(handle)


def backend_stats(handle):
    """A backend's own accounting: outstanding_bytes, allocation_count, deallocation_count."""
    return _by_struct(handle, t.BackendStats, "refpool_backend_get_stats")


class StatsRecorder:
    """Snapshots of a cache's counters over time, written as JSON for `python3 -m refpool.plot --stats`.

    `sample()` after each step gives the plot the held bytes at step boundaries (the allocation log
    has only requests). Times are seconds since the epoch, the clock of refpool's log."""

    def __init__(self, cache):
        from .cache import Cache
        handle_of(cache, Cache, "refpool.StatsRecorder: cache")
        self.cache = cache
        self.samples = []

    def sample(self, label=None):
        self.samples.append({"time": time.time(), "label": label, "stats": self.cache.stats()})

    def write(self, path):
        with open(path, "w") as out:
            json.dump({"format": "refpool-stats", "version": 1, "samples": self.samples}, out, indent=1)
