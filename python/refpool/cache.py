"""Caches, and the two ways to run work through one: scopes (this thread) and steps (every thread)."""
import ctypes
import functools
import threading

from . import _checked
from . import _types as t
from ._handles import Owned, handle_of
from ._options import cache_options
from ._library import lib
from .stats import cache_stats


def _scope_options(plan, uncached_warmup_entries, what):
    if plan is not None and not isinstance(plan, str):
        raise TypeError(f"refpool: {what}: plan must be a str (the plan's key), not {type(plan).__name__}")
    if plan is not None and type(plan) is not str:
        plan = str.__str__(plan)  # its text: a subclass may compare equal to another key, or be false
    if type(uncached_warmup_entries) is not int:  # checked (and refused) by ScopeOptions, uncached
        return t.ScopeOptions(uncached_warmup_entries, _key(plan, what))
    return _shared_scope_options(plan, uncached_warmup_entries, what)


def _key(plan, what):
    # "" is no key, as NULL is to C; a NUL inside a key would cut it short there.
    return _checked.text(plan, f"{what}: plan") if plan else None


@functools.lru_cache(maxsize=256)
def _shared_scope_options(plan, uncached_warmup_entries, what):
    # One struct per (plan, warm-up) for every step and scope that uses it: C copies what it reads
    # and never writes it, and a framework opens one step per iteration (a new struct cost a third
    # of a step's time in Python).
    return t.ScopeOptions(uncached_warmup_entries, _key(plan, what))


class Cache(Owned):
    """A refpool cache of idle blocks.

    Options are REFPOOL_CONF's cache options, with its spelling: `conf` takes a string of them
    ("rounding:pow2:4,max_idle_bytes:512M,segments:off") and each is also a keyword
    (rounding="pow2:4", max_idle_bytes="512M" or an int, segments="off"); keywords win over `conf`,
    and both over REFPOOL_CONF, whose values are the starting point unless `from_environment` is
    False. refpool.cache_option_descriptions() lists the options. A bad option raises ConfigError
    naming it and its allowed values. `close()` destroys the cache: idle blocks go back to their
    backends; buffers still referenced stay valid.

    Thread safety: every method may be called from any thread."""

    _release_function = "refpool_cache_destroy"

    def __init__(self, conf=None, from_environment=True, _handle=None, _owns=True, **options):
        if _handle is None:
            filled = cache_options(conf, options, from_environment, "refpool.Cache")
            _handle = lib().new_handle("refpool_cache_create", filled)
        super().__init__(_handle, _owns)

    def __repr__(self):
        return f"<refpool.Cache id={self.handle.id:#x}{' (closed)' if self.closed else ''}>"

    def scope(self, plan=None, uncached_warmup_entries=0):
        """A scope on this cache (a context manager): while active, refpool allocations of this
        thread (refpool.malloc) go through the cache; with `plan`, a planned scope."""
        return Scope(self, plan, uncached_warmup_entries)

    def step(self, plan=None, uncached_warmup_entries=0):
        """A step on this cache (a context manager): an iteration boundary covering every allocation
        made through the cache without a scope, on any thread (refpool.malloc(..., cache=),
        the framework entry points); with `plan`, a planned step. Steps on one cache do not nest."""
        return Step(self, plan, uncached_warmup_entries)

    def stats(self):
        """The cache's counters as a dict (names as in refpool_stat_name)."""
        return cache_stats(self.handle)

    def summary(self, detail="short"):
        """The counters as a table for people, bytes in KiB, MiB, GiB: "short" (requests and hit rate,
        allocated, reserved and idle bytes now and at their peaks, plans, backend calls, out of
        memory), or "full" (every counter). Like torch.cuda.memory_summary(); the layout may change
        between versions: programs read stats()."""
        return lib().text("refpool_cache_summary", self.handle, t.enum_value(t.SUMMARY_DETAILS, detail, "detail"))

    def reset_peaks(self):
        """Restarts the peak counters (peak_live_bytes, peak_held_bytes) from the current values."""
        lib().call("refpool_cache_reset_peaks", self.handle)

    def reclaim(self, keep_bytes=0):
        """Frees least recently released idle blocks until at most `keep_bytes` idle bytes remain;
        returns the bytes freed. Live buffers are never touched."""
        freed = ctypes.c_size_t()
        lib().call("refpool_cache_reclaim", self.handle, keep_bytes, ctypes.byref(freed))
        return freed.value

    def set_max_idle_bytes(self, max_idle_bytes):
        """The idle limit (None: no limit), evicting at once if needed."""
        limit = t.UNLIMITED if max_idle_bytes is None else max_idle_bytes
        lib().call("refpool_cache_set_max_idle_bytes", self.handle, limit)

    def memory_map(self):
        """What the cache holds, segment by segment, with live, idle and free ranges
        (refpool.memory_map.memory_map)."""
        from .memory_map import memory_map
        return memory_map(self)


class Scope:
    """An active scope (refpool_scope): entered by `enter()` or `with`, exited on the same thread."""

    def __init__(self, cache, plan=None, uncached_warmup_entries=0):
        handle_of(cache, Cache, "refpool.Scope: cache")
        self.cache = cache
        self.plan = plan
        self._options = _scope_options(plan, uncached_warmup_entries, "refpool.Cache.scope")
        self._handle = None
        self._lock = threading.Lock()  # one object entered from two threads: one enters, one is refused

    def enter(self):
        with self._lock:
            if self._handle is not None:
                raise RuntimeError("refpool: this scope is already active (make a new one with cache.scope())")
            self._handle = lib().new_handle("refpool_scope_enter_with_options", self.cache.handle, self._options)
        return self

    def exit(self):
        """Ends the scope: buffers it handed out that are still referenced count as escapes."""
        with self._lock:
            if self._handle is None:
                raise RuntimeError("refpool: this scope is not active")
            lib().call("refpool_scope_exit", self._handle)  # a ScopeError leaves it active: keep the handle
            self._handle = None

    def __enter__(self):
        return self.enter()

    def __exit__(self, *exc):
        self.exit()


class Step:
    """An open step on a cache (refpool_step): begun by `begin()` or `with`; may end on another thread."""

    def __init__(self, cache, plan=None, uncached_warmup_entries=0):
        handle_of(cache, Cache, "refpool.Step: cache")
        self.cache = cache
        self.plan = plan
        self._options = _scope_options(plan, uncached_warmup_entries, "refpool.Cache.step")
        self._handle = None
        self._lock = threading.Lock()

    def begin(self):
        with self._lock:
            if self._handle is not None:
                raise RuntimeError("refpool: this step is already open (make a new one with cache.step())")
            self._handle = lib().new_handle("refpool_step_begin", self.cache.handle, self._options)
        return self

    def end(self):
        """Ends the step: memory handed out during it and still referenced counts as escaped."""
        with self._lock:
            if self._handle is None:
                raise RuntimeError("refpool: this step is not open")
            lib().call("refpool_step_end", self._handle)
            self._handle = None

    def __enter__(self):
        return self.begin()

    def __exit__(self, *exc):
        self.end()
