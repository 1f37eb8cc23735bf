"""A cache's memory map (refpool_cache_memory_map in refpool.h): the segments it holds from its
backends, each with its ranges in address order, and each idle buffer of a backend it keeps plain
buffers for as a segment of its own ("block"). Live plain buffers are not listed (the cache keeps
no list of them). Range states: "live" (held by buffers), "idle" (cached: handed out again only by
this cache), "free" (free bytes of the segment), "span_held" and "span_idle" (plans' arenas).
What refpool.torch's snapshots are made of."""
import ctypes
from collections import namedtuple

from . import _types as t
from ._library import lib

STATES = ("live", "idle", "free", "span_held", "span_idle")  # refpool_range_state, in order
POOLS = ("small", "large", "block")  # refpool_segment_pool, in order
MEMORY_KINDS = {value: name for name, value in t.MEMORY_KINDS.items()}

Segment = namedtuple("Segment", "address reserved_bytes committed_bytes device memory_kind pool expandable ranges")
Segment.__doc__ = "One segment: its ranges are Range tuples; pool is one of POOLS, memory_kind refpool.h's name."
Range = namedtuple("Range", "address bytes state")


def memory_map(cache):
    """The memory map of `cache` (a refpool.Cache) as a list of Segment, sorted by device, then
    address. Taken in one call; while other threads use the cache, a buffer handed out or given back
    meanwhile may show in either state."""
    segment_room, range_room = 16, 64
    while True:
        segments = (t.MemorySegment * segment_room)()
        ranges = (t.MemoryRange * range_room)()
        segment_count, range_count = ctypes.c_size_t(), ctypes.c_size_t()
        lib().call("refpool_cache_memory_map", cache.handle, segments, segment_room, ctypes.sizeof(t.MemorySegment),
                   ctypes.byref(segment_count), ranges, range_room, ctypes.sizeof(t.MemoryRange),
                   ctypes.byref(range_count))
        if segment_count.value <= segment_room and range_count.value <= range_room:
            break
        segment_room, range_room = segment_count.value + 16, range_count.value + 64  # it grew: again, all of it
    out = []
    for s in segments[:segment_count.value]:
        held = [Range(r.address, r.bytes, STATES[r.state])
                for r in ranges[s.first_range:s.first_range + s.range_count]]
        out.append(Segment(s.address, s.reserved_bytes, s.committed_bytes, s.device,
                           MEMORY_KINDS.get(s.memory_kind, s.memory_kind), POOLS[s.pool], bool(s.expandable), held))
    return out


__all__ = ["memory_map", "Segment", "Range", "STATES", "POOLS"]
