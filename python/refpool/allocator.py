"""The process-wide framework allocator: one cache with GPU backends per device, behind the C entry
points that PyTorch and CuPy call (refpool_torch_malloc, refpool_cupy_malloc) and the Numba plugin.

Configure it before its first allocation (`configure()`); `cache()` is a handle to its cache, for
steps, stats and reclaim. Every adapter of this package uses this one allocator, so a process that
mixes PyTorch, CuPy and Numba has one cache and one set of counters."""
import contextlib
import ctypes
import threading

from . import _options
from . import _types as t
from ._options import cache_options
from .cache import Cache
from ._library import lib
from .streams import stream_pointer

_lock = threading.Lock()
_cache = None


def configure(runtime="cuda", kind="device", conf=None, **options):
    """Sets the allocator's runtime ("cuda", "hip", "host"), memory kind ("device", "device_async")
    and cache options, as refpool.Cache takes them (`conf` and keywords, REFPOOL_CONF's spelling;
    those not given come from REFPOOL_CONF). Only before the allocator's first allocation:
    ConfigError after. A rejected call changes nothing."""
    cache_part = cache_options(conf, options, what="refpool.allocator.configure")
    filled = t.AllocatorOptions()
    lib().call("refpool_allocator_options_init", filled)
    filled.runtime = t.enum_value(t.RUNTIMES, runtime, "runtime")
    filled.kind = t.enum_value(t.MEMORY_KINDS, kind, "memory kind")
    lib().call("refpool_allocator_configure", filled, cache_part)


def configure_if_given(runtime, kind, conf, options, what):
    """configure() when anything differs from the allocator's defaults (an adapter's install()).
    The options are checked first either way, so a bad one fails the install."""
    given = _options.texts(options, what)
    if runtime != "cuda" or kind != "device" or conf is not None or given:
        configure(runtime=runtime, kind=kind, conf=conf, **options)


def cache():
    """The allocator's cache: a handle kept by this module, and a new one once a caller closed it
    (`with refpool.allocator.cache() as c:` closes it; the cache itself lives on)."""
    global _cache
    kept = _cache
    if kept is None or kept.closed:
        with _lock:
            if _cache is None or _cache.closed:
                _cache = Cache(_handle=lib().new_handle("refpool_allocator_cache"))
            kept = _cache
    return kept


def step(plan=None, uncached_warmup_entries=0):
    """A step on the allocator's cache (a context manager). It covers every allocation the framework
    makes through refpool while it is open, on any thread (PyTorch's backward runs on its autograd
    thread). It is planned: under `plan` when given, else under the cache's own key unless the cache
    was configured with auto_plans="off". A sequence of requests that comes again replays from one
    arena; the others are served by the cache."""
    return cache().step(plan, uncached_warmup_entries)


def stats():
    """The allocator cache's counters (see refpool.stats)."""
    return cache().stats()


def summary(detail="short"):
    """The allocator cache's counters as a table for people (see refpool.Cache.summary)."""
    return cache().summary(detail)


def reset_peaks():
    cache().reset_peaks()


def reclaim(keep_bytes=0):
    """Frees idle blocks back to the driver until at most `keep_bytes` idle bytes remain."""
    return cache().reclaim(keep_bytes)


def malloc(nbytes, device=0, stream=None):
    """`nbytes` on `device` from the allocator (any thread): the address, 0 for 0 bytes."""
    out = ctypes.c_void_p()
    lib().call("refpool_allocator_alloc", nbytes, device, stream_pointer(stream), ctypes.byref(out))
    return out.value or 0


def free(address):
    """Gives back an address from malloc(), from any thread."""
    lib().call("refpool_free", address)

def set_device_limit(device, limit_bytes):
    """Caps the bytes the allocator holds from `device` (its cache and private pools); None: no cap.
    A request past the cap raises OutOfMemoryError once idle blocks are reclaimed."""
    lib().call("refpool_allocator_set_device_limit", device, t.UNLIMITED if limit_bytes is None else limit_bytes)


def empty_cache():
    """Frees the allocator cache's idle blocks to the driver; private pools keep theirs."""
    lib().call("refpool_allocator_empty_cache")


def set_caching(on):
    """Turns the allocator's caching off (False) or back on (True, the default), as PyTorch's
    torch.cuda.caching_allocator_enable does for its own: while off, each request no private pool
    takes is the driver's own allocation, freed to the driver when given back, and the cache
    neither serves nor counts it (for tools that check each allocation, such as compute-sanitizer).
    A buffer keeps the way it was served."""
    if type(on) is not bool:
        raise TypeError(f"refpool: refpool.allocator.set_caching: on must be a bool, not {type(on).__name__}")
    lib().fn("refpool_allocator_set_caching")(1 if on else 0)


def caching():
    """True while the allocator caches (the default), False after set_caching(False)."""
    return lib().fn("refpool_allocator_caching")() != 0


def record_stream(address, stream):
    """Marks the buffer at `address` (from this allocator) as used on `stream` too."""
    lib().call("refpool_allocator_record_stream", address, stream_pointer(stream))


def pool_ids():
    """The live private pools (CUDA graph pools), as (first, second) tuples."""
    count = ctypes.c_size_t()
    lib().call("refpool_allocator_pool_ids", None, 0, ctypes.byref(count))
    ids = (t.PoolId * max(count.value, 1))()
    lib().call("refpool_allocator_pool_ids", ids, count.value, ctypes.byref(count))
    return [(ids[i].first, ids[i].second) for i in range(min(count.value, len(ids)))]


def memory_map(pool=None):
    """The memory map of the allocator's cache, or of private pool `pool` ((first, second)): a list of
    refpool.memory_map.Segment (see Cache.memory_map)."""
    if pool is None:
        return cache().memory_map()
    with _pool_cache(pool, "memory_map") as pool_cache:
        return pool_cache.memory_map()


def _pool_cache(pool, function):
    """A Cache handle on private pool `pool`'s cache; TypeError unless `pool` is a (first, second) pair."""
    try:
        first, second = pool
    except (TypeError, ValueError):
        raise TypeError(f"refpool: refpool.allocator.{function}: pool must be a (first, second) pair of ints, "
                        f"not {pool!r}") from None
    return Cache(_handle=lib().new_handle("refpool_allocator_pool_cache", t.PoolId(first, second)))


def pool_stats(pool):
    """The counters of private pool `pool` ((first, second)), as Cache.stats()."""
    with _pool_cache(pool, "pool_stats") as pool_cache:
        return pool_cache.stats()


@contextlib.contextmanager
def announced_capture(device=0):
    """A graph capture of `device` that refpool does not route (one a program or library makes on
    its own stream, e.g. CuPy's Stream.begin_capture) may run inside the with block: refpool makes
    no device-wide wait on the device meanwhile (it would break the capture), and gives back what it
    kept once the device's last announced capture ends (refpool_capture_begin / refpool_capture_end).
    Begin the capture inside the block and end it before the block ends. Nests."""
    lib().call("refpool_capture_begin", device)
    try:
        yield
    finally:
        lib().call("refpool_capture_end", device)


__all__ = ["configure", "cache", "step", "stats", "summary", "reset_peaks", "reclaim", "malloc", "free",
           "set_device_limit", "empty_cache", "set_caching", "caching", "record_stream", "pool_ids", "pool_stats",
           "memory_map", "announced_capture"]
