"""refpool as CuPy's allocator, through cupy.cuda.memory.CFunctionAllocator: CuPy calls librefpool's
refpool_cupy_malloc / refpool_cupy_free itself, behind one Python check per allocation: a request
refpool cannot serve comes back as NULL, which CuPy's CFunctionAllocator would hand out as memory,
so the hook raises refpool's error (OutOfMemoryError, a MemoryError, with the library's message).

    import refpool.cupy
    refpool.cupy.install()                        # cupy.cuda.set_allocator, for the process
                                                  # (cache options: install(segments="off"), conf=...)
    with refpool.cupy.step(plan="iteration"):     # optional: a (planned) step per iteration
        ...

CuPy's hook passes no stream: refpool orders the memory on the default stream (the legacy stream,
which synchronises with CuPy's blocking streams). Work on a non-blocking stream, or with
CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1, is not ordered with it: synchronise such a stream before the
last reference to an array it used goes. CuPy is imported on first use, never by `import refpool.cupy`."""
import contextlib

from . import allocator
from ._library import lib
from .errors import FrameworkError, error_for_message


def _cupy():
    try:
        import cupy
    except ImportError as e:
        raise FrameworkError(f"refpool.cupy needs CuPy, which cannot be imported here: {e}") from None
    return cupy


def allocator_object():
    """A cupy.cuda.memory.CFunctionAllocator over refpool's entry points (its `malloc` is what
    set_allocator / using_allocator take). It keeps librefpool loaded."""
    cupy = _cupy()
    library = lib()
    return cupy.cuda.memory.CFunctionAllocator(0, library.address("refpool_cupy_malloc"),
                                               library.address("refpool_cupy_free"), library)


def checked_malloc(malloc):
    """CuPy's allocator hook over `malloc` (CFunctionAllocator.malloc): raises the library's error
    where refpool_cupy_malloc failed, instead of giving CuPy a null pointer."""
    library = lib()

    def refpool_malloc(size):
        memory = malloc(size)
        if not memory.ptr and size:
            raise error_for_message(library.last_error())
        return memory
    return refpool_malloc


def install(conf=None, **options):
    """Makes refpool CuPy's device allocator for the process (cupy.cuda.set_allocator). Cache options
    (`conf` and keywords such as segments="off") as in refpool.Cache configure refpool's allocator
    first (default: REFPOOL_CONF); they must come before its first allocation. Arrays that CuPy's
    pool allocated before stay valid and go back to that pool."""
    cupy = _cupy()
    runtime = "hip" if getattr(cupy.cuda.runtime, "is_hip", False) else "cuda"
    allocator.configure_if_given(runtime, "device", conf, options, "refpool.cupy.install")
    cupy.cuda.set_allocator(checked_malloc(allocator_object().malloc))


@contextlib.contextmanager
def using():
    """refpool as CuPy's allocator on this thread, inside the `with` (cupy.cuda.using_allocator)."""
    cupy = _cupy()
    with cupy.cuda.using_allocator(checked_malloc(allocator_object().malloc)):
        yield


def step(plan=None, uncached_warmup_entries=0):
    """A step on refpool's allocator cache (a context manager) around one iteration; with `plan`, a
    planned step."""
    return allocator.step(plan, uncached_warmup_entries)


def stats():
    """refpool's allocator counters (live_bytes, held_bytes, backend_allocations...)."""
    return allocator.stats()


def free_all_blocks():
    """Gives refpool's idle blocks back to the driver (as MemoryPool.free_all_blocks)."""
    return allocator.reclaim(0)
