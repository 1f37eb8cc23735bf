"""torch.cuda.MemPool and torch.cuda.use_mem_pool under refpool.torch.install().

PyTorch's MemPool asks the current allocator to create the pool (createOrIncrefPool) and to count
its uses (getPoolUseCount), which PyTorch's pluggable-allocator interface does not forward (the
CUDAAllocator base class's TORCH_CHECK(false, ...) in c10/cuda/CUDACachingAllocator.h). Under
install() a MemPool is a refpool private pool instead: made, with one use held, by refpool's hooks
(refpool_torch_hooks_hold_pool), routed to by use_mem_pool through PyTorch's own
_cuda_beginAllocateCurrentThreadToPool (which reaches refpool's begin hook), and given back to
refpool when the MemPool goes; tensors made in it may outlive it. A MemPool over another allocator
(MemPool(allocator)) is refused: its requests would have to go to that allocator, which refpool's
pools cannot do."""
import contextlib
import threading

from .errors import FrameworkError

REFUSED_ALLOCATOR = (
    "torch.cuda.MemPool(allocator) with refpool as PyTorch's allocator: a pool's requests cannot go to another "
    "allocator through refpool, which serves every request itself. Use refpool.torch.mem_pool() and such pools "
    "together with PyTorch's own allocator (no install()), or a MemPool() without an allocator: a refpool private pool")


def make_classes(torch, hooks, last_error):
    """(MemPool, use_mem_pool) for this torch, over refpool's hooks (`last_error()`: refpool's message)."""

    class MemPool:
        """A refpool private pool named like a PyTorch MemPool (id (0, n), as graph_pool_handle())."""

        def __init__(self, allocator=None, use_on_oom=False, no_split=False, **options):
            if allocator is not None:
                raise FrameworkError(REFUSED_ALLOCATOR)
            if options.get("symmetric"):
                raise FrameworkError("torch.cuda.MemPool(symmetric=True) needs PyTorch's own allocator: refpool's "
                                     "pools are not registered for symmetric memory")
            self._id = tuple(torch.cuda.graph_pool_handle())
            self._device = torch.cuda.current_device()
            self._lock = threading.Lock()
            self._uses = 0
            if hooks.refpool_torch_hooks_hold_pool(self._device, self._id[0], self._id[1]) != 0:
                raise FrameworkError(f"refpool.torch: the private pool for a MemPool could not be made: {last_error()}")
            self._uses = 1

        @property
        def id(self):  # noqa: A003 (PyTorch's name)
            return self._id

        @property
        def allocator(self):
            return None

        def device(self):
            return self._device

        def use_count(self):
            return self._uses

        def snapshot(self):
            return torch.cuda.memory_snapshot(self._id)

        def _use(self, change):
            with self._lock:
                self._uses += change

        def __del__(self):
            if getattr(self, "_uses", 0) > 0:
                try:
                    torch._C._cuda_releasePool(self._device, self._id)
                except Exception:  # noqa: BLE001 (interpreter shutdown)
                    pass

        def __repr__(self):
            return f"refpool MemPool(id={self._id}, device={self._device}, uses={self._uses})"

    @contextlib.contextmanager
    def use_mem_pool(pool, device=None):
        """Routes this thread's requests on `device` to `pool` inside the with block."""
        index = torch.cuda.current_device() if device is None else torch.cuda._utils._get_device_index(device)
        torch._C._cuda_beginAllocateCurrentThreadToPool(index, pool.id)
        if isinstance(pool, MemPool):
            pool._use(1)
        try:
            yield
        finally:
            torch._C._cuda_endAllocateToPool(index, pool.id)
            torch._C._cuda_releasePool(index, pool.id)
            if isinstance(pool, MemPool):
                pool._use(-1)

    return MemPool, use_mem_pool
