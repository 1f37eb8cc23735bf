"""Exceptions: one class per refpool_status, each carrying the status and the library's message."""


class RefpoolError(RuntimeError):
    """A refpool C call failed. `status` is the refpool_status value, `status_name` its name
    ("REFPOOL_ERROR_SHAPE"), and the message is the library's complete sentence (refpool_last_error)."""

    def __init__(self, message, status=None, status_name=None):
        super().__init__(message)
        self.status = status
        self.status_name = status_name


class UseAfterFreeError(RefpoolError):
    """A buffer was used after unsafe_free released it."""


class ShapeError(RefpoolError, ValueError):
    """A reshape that changes the element count."""


class SizeError(RefpoolError, ValueError):
    """A size that overflows size_t."""


class OutOfMemoryError(RefpoolError, MemoryError):
    """The backend is out of memory even after the cache reclaimed its idle blocks and retried."""


class BackendError(RefpoolError):
    """A backend call failed for a reason other than out-of-memory."""


class ScopeError(RefpoolError):
    """A scope or step used out of order (exited on another thread, steps nested on one cache...)."""


class ConfigError(RefpoolError, ValueError):
    """A bad value in REFPOOL_CONF or in the options, or configuration after it was fixed."""


class InvalidArgumentError(RefpoolError, ValueError):
    """A null handle or pointer, an unknown pointer given to free, a second free..."""


class InvalidHandleError(RefpoolError):
    """A handle used after it was released or destroyed."""


class BackendUnavailableError(RefpoolError):
    """A backend cannot be used here (library missing, no device, built without it)."""


class InternalError(RefpoolError):
    """A bug inside refpool: please report it with the message."""


class LibraryError(RefpoolError, OSError):
    """librefpool cannot be found or loaded, or lacks a function this package needs."""


class FrameworkError(RefpoolError):
    """A framework adapter cannot do what was asked (the framework is missing, or its hook cannot)."""


# Index = refpool_status value (refpool.h).
_BY_STATUS = [None, UseAfterFreeError, ShapeError, SizeError, OutOfMemoryError, BackendError, ScopeError,
              ConfigError, InvalidArgumentError, InvalidHandleError, BackendUnavailableError, InternalError]


def error_for_message(message):
    """The exception for an entry point that failed with NULL and no status (refpool_cupy_malloc):
    OutOfMemoryError when the library's message says so, else RefpoolError; the message is the
    library's."""
    cls = OutOfMemoryError if "out of memory" in message else RefpoolError
    return cls(message)


def error_for_status(status, status_name, message):
    """The exception for a failed call: its class follows the status."""
    cls = _BY_STATUS[status] if 0 < status < len(_BY_STATUS) else RefpoolError
    return cls(f"{status_name}: {message}", status, status_name)
