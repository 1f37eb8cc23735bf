"""Backends: where memory comes from (host, CUDA, HIP), as refpool_backend handles."""
from . import _types as t
from ._handles import Owned
from ._library import lib
from .stats import backend_stats
from .streams import stream_pointer


class Backend(Owned):
    """A refpool_backend handle. Make one with the class methods; `close()` releases the handle
    (buffers and caches keep the backend itself alive as long as they need it)."""

    _release_function = "refpool_backend_release"

    def __init__(self, handle, description, runtime="host", device=-1, kind="host"):
        super().__init__(handle)
        self.description = description
        self.runtime = runtime  # "host", "cuda" or "hip"
        self.device = device    # -1 for host memory
        self.kind = kind        # "host", "device", "device_async" or "pinned_host"

    def __repr__(self):
        return f"<refpool.Backend {self.description}{' (closed)' if self.closed else ''}>"

    @classmethod
    def host(cls):
        """The process-wide host backend (every handle names the same backend, so caches share keys)."""
        return cls(lib().new_handle("refpool_backend_host"), "host")

    @classmethod
    def new_host(cls):
        """A host backend of its own, with counters starting at 0."""
        return cls(lib().new_handle("refpool_backend_new_host"), "host (own)")

    @classmethod
    def host_limited(cls, capacity_bytes):
        """A host backend that runs out of memory past `capacity_bytes` outstanding."""
        return cls(lib().new_handle("refpool_backend_new_host_limited", capacity_bytes),
                   f"host limited to {capacity_bytes} bytes")

    @classmethod
    def cuda(cls, device=0, kind="device"):
        """The process-wide CUDA backend of `device` and memory `kind` (device, device_async, pinned_host).
        Raises BackendUnavailableError, with the reason, where CUDA cannot be used."""
        kind_value = t.enum_value(t.MEMORY_KINDS, kind, "memory kind")
        return cls(lib().new_handle("refpool_backend_cuda", device, kind_value), f"cuda:{device} {kind}", "cuda",
                   device, kind)

    @classmethod
    def hip(cls, device=0, kind="device"):
        """As cuda(), for HIP."""
        kind_value = t.enum_value(t.MEMORY_KINDS, kind, "memory kind")
        return cls(lib().new_handle("refpool_backend_hip", device, kind_value), f"hip:{device} {kind}", "hip",
                   device, kind)

    def stats(self):
        """outstanding_bytes, allocation_count, deallocation_count."""
        return backend_stats(self.handle)

    def retire_stream(self, stream):
        """Tells refpool that `stream` (synchronised by the caller) is about to be destroyed."""
        lib().call("refpool_retire_stream", self.handle, stream_pointer(stream))
