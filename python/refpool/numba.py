"""refpool as Numba's CUDA memory manager: an External Memory Management (EMM) plugin.

    import refpool.numba
    refpool.numba.install()      # before the first CUDA context; cache options: install(conf=...), as refpool.Cache
or, for a whole program: NUMBA_CUDA_MEMORY_MANAGER=refpool.numba python3 program.py (options: REFPOOL_CONF)

Device memory comes from refpool's process-wide allocator (the cache PyTorch and CuPy adapters use
too); host and pinned memory stay Numba's (HostOnlyCUDAMemoryManager). Numba's plugin interface is
Python, so each allocation runs a little Python here: memalloc calls refpool_allocator_alloc, the
finalizer refpool_free. `defer_cleanup()` changes nothing for device memory: freed blocks
return to refpool's cache at once, and refpool never frees to the driver on that path anyway.
Importing this module does not import Numba; the plugin class is made on first access."""
import ctypes

from . import allocator
from .errors import FrameworkError

_class = None


def _make_class():
    try:
        from numba import cuda
        from numba.cuda.cudadrv import driver
    except ImportError as e:
        raise FrameworkError(f"refpool.numba needs Numba with CUDA support, which cannot be imported here: {e}") \
            from None
    # Numba's driver layer takes cuda-python's CUdeviceptr when it runs on the NVIDIA binding (the
    # only binding of newer numba-cuda releases, which no longer define USE_NV_BINDING), else ctypes.
    nvidia_binding = getattr(driver, "USE_NV_BINDING", None)
    if nvidia_binding is None:
        nvidia_binding = hasattr(driver, "binding")

    def device_pointer(address):
        # The pointer type Numba's driver layer expects: cuda-python's CUdeviceptr, else ctypes.
        return driver.binding.CUdeviceptr(address) if nvidia_binding else ctypes.c_uint64(address)

    class RefpoolNumbaManager(cuda.HostOnlyCUDAMemoryManager):
        """Numba EMM plugin: device allocations through refpool's allocator (interface version 1)."""

        def initialize(self):
            # Nothing per context: refpool's allocator makes its backend for a device on first use.
            pass

        def memalloc(self, size):
            device = self.context.device.id
            address = allocator.malloc(size, device)
            return cuda.MemoryPointer(self.context, device_pointer(address), size,
                                      finalizer=_finalizer(address) if address else None)

        def get_memory_info(self):
            if nvidia_binding:
                free, total = driver.driver.cuMemGetInfo()
            else:
                free, total = ctypes.c_size_t(), ctypes.c_size_t()
                driver.driver.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total))
                free, total = free.value, total.value
            return driver.MemoryInfo(free=free, total=total)

        def get_ipc_handle(self, memory):
            raise FrameworkError("refpool.numba: IPC handles of refpool memory are not supported (a refpool block "
                                 "may be part of a larger driver allocation, or an arena); allocate memory to share "
                                 "between processes with Numba's own manager")

        def reset(self):
            # Numba resets a context: give refpool's idle blocks back to the driver, and Numba's host memory.
            super().reset()
            allocator.reclaim(0)

        @property
        def interface_version(self):
            return 1

    return RefpoolNumbaManager


def _finalizer(address):
    def finalize():
        allocator.free(address)
    return finalize


def install(conf=None, **options):
    """Makes refpool Numba's CUDA memory manager (cuda.set_memory_manager), before Numba makes its
    first CUDA context. Cache options (`conf` and keywords such as rounding="pow2:4") as in
    refpool.Cache configure refpool's allocator first (default: REFPOOL_CONF)."""
    manager = _manager_class()  # FrameworkError, saying why, without Numba's CUDA support
    allocator.configure_if_given("cuda", "device", conf, options, "refpool.numba.install")
    from numba import cuda
    cuda.set_memory_manager(manager)


def step(plan=None, uncached_warmup_entries=0):
    """A step on refpool's allocator cache (a context manager) around one iteration."""
    return allocator.step(plan, uncached_warmup_entries)


def _manager_class():
    global _class
    if _class is None:
        _class = _make_class()
    return _class


def __getattr__(name):
    # RefpoolNumbaManager, and _numba_memory_manager for NUMBA_CUDA_MEMORY_MANAGER=refpool.numba.
    if name in ("RefpoolNumbaManager", "_numba_memory_manager"):
        return _manager_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
