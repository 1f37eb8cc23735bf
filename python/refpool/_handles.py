"""Ownership of C handles by Python objects: released once, by close() or when garbage-collected."""
import weakref

from . import _types as t
from ._library import lib


def _release(function_name, handle_id):
    # Runs from close() or from the garbage collector: a failure here has nowhere to go, and the
    # library itself reports double releases, so the status is ignored.
    try:
        lib().fn(function_name)(t.Handle(handle_id))
    except Exception:  # noqa: BLE001 (interpreter shutdown: the library may be gone)
        pass


def handle_of(value, cls, what):
    """The handle of `value`, an open `cls`: TypeError for another type, ValueError once closed."""
    if not isinstance(value, cls):
        raise TypeError(f"refpool: {what} must be a refpool.{cls.__name__}, not {type(value).__name__}")
    if value.closed:
        raise ValueError(f"refpool: {what} is a closed refpool.{cls.__name__}")
    return value.handle


class Owned:
    """A Python object owning one C handle: `handle` while open, released by `close()` (idempotent)
    or at garbage collection. Subclasses name the release function."""

    _release_function = None

    def __init__(self, handle, owns=True):
        if not isinstance(handle, t.Handle):
            raise TypeError(f"refpool: refpool.{type(self).__name__}: handle must be a refpool handle (from "
                            f"refpool.malloc, refpool.Backend.host()...), not {type(handle).__name__}")
        self._handle = handle
        self._finalizer = weakref.finalize(self, _release, self._release_function, handle.id) if owns else None

    @property
    def handle(self):
        return self._handle

    def close(self):
        if self._finalizer is not None:
            self._finalizer()

    def keep_past_exit(self):
        """Leaves the handle to close() and garbage collection only: weakref.finalize's exit hook
        releases every handle still alive, while a view holding this one may still be read after
        it (an atexit function registered earlier, a daemon thread). Returns self."""
        if self._finalizer is not None:
            self._finalizer.atexit = False
        return self

    @property
    def closed(self):
        return self._finalizer is not None and not self._finalizer.alive

    def __reduce_ex__(self, protocol):
        # A copy would share (copy) or lose (deepcopy) the finalizer while naming the same handle,
        # and a pickle would carry a handle id that means nothing in another process.
        raise TypeError(f"refpool: a refpool.{type(self).__name__} owns a handle of this process and cannot be "
                        "copied or pickled (a Buffer is shared with retain())")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
