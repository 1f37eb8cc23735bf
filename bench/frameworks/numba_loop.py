#!/usr/bin/env python3
"""A Numba CUDA kernel loop: per iteration, device temporaries of one of four sizes, filled, combined
(axpy, product) and reduced by @cuda.jit kernels, one mode per process (see common.py). Numba's own
memory manager is the baseline; refpool runs as its EMM plugin (Python per allocation, as Numba's
plugin interface is). Usage: numba_loop.py --mode MODE --out RESULT.json"""
import contextlib

from common import Loop, import_refpool, parse_args, refpool_driver_calls, refpool_figures, skip

BENCHMARK = "numba_loop"
SIZES = (1 << 18, 1 << 20, 3 << 18, 1 << 19)
THREADS = 256


class NumbaFramework:
    def __init__(self, cuda, mode):
        self.cuda = cuda
        self.mode = mode
        self.memallocs = 0
        if mode != "own":
            import_refpool()
            import refpool.numba
            self.refpool_numba = refpool.numba
            cuda.set_memory_manager(refpool.numba.RefpoolNumbaManager)  # before the context exists
        self.context = cuda.current_context()
        if mode == "own":
            # Numba's own manager calls cuMemAlloc for every memalloc: count them.
            manager = self.context.memory_manager
            original = manager.memalloc

            def counting_memalloc(size):
                self.memallocs += 1
                return original(size)
            manager.memalloc = counting_memalloc

    def step_context(self, key):
        if self.mode == "own":
            return contextlib.nullcontext()
        return self.refpool_numba.step(plan=key if self.mode == "refpool-planned" else None)

    def synchronize(self):
        self.cuda.synchronize()

    def used_bytes(self):
        info = self.context.get_memory_info()
        return info.total - info.free

    def driver_calls(self):
        return self.memallocs if self.mode == "own" else refpool_driver_calls()

    def allocator_figures(self):
        return {} if self.mode == "own" else refpool_figures()


def main():
    args = parse_args(__doc__.split("\n")[0], default_warmup=8, default_steps=48)
    try:
        import numpy as np
        if not hasattr(np, "row_stack"):
            # numba-cuda 0.68 overloads np.row_stack when it compiles a kernel; recent NumPy 2
            # releases removed that alias of np.vstack (both are on the H200 machine).
            np.row_stack = np.vstack
        from numba import cuda
        if not cuda.is_available():
            raise RuntimeError("numba.cuda.is_available() is False")
    except Exception as e:  # noqa: BLE001 (ImportError, or no CUDA)
        skip(args, BENCHMARK, f"needs Numba with a CUDA device ({e})")

    framework = NumbaFramework(cuda, args.mode)
    loop = Loop(args, BENCHMARK, framework)

    @cuda.jit
    def fill(out, seed):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = ((i * 2654435761 + seed) % 1000) * 0.001

    @cuda.jit
    def axpy(out, a, x, y):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

    @cuda.jit
    def multiply(out, x, y):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = x[i] * y[i]

    @cuda.jit
    def block_sums(partial, x):
        shared = cuda.shared.array(THREADS, dtype=np.float32)
        i = cuda.grid(1)
        t = cuda.threadIdx.x
        shared[t] = x[i] if i < x.size else 0.0
        cuda.syncthreads()
        stride = THREADS // 2
        while stride > 0:
            if t < stride:
                shared[t] += shared[t + stride]
            cuda.syncthreads()
            stride //= 2
        if t == 0:
            partial[cuda.blockIdx.x] = shared[0]

    def iteration(i):
        n = SIZES[i % len(SIZES)]
        blocks = (n + THREADS - 1) // THREADS
        x = cuda.device_array(n, dtype=np.float32)
        y = cuda.device_array(n, dtype=np.float32)
        fill[blocks, THREADS](x, i)
        fill[blocks, THREADS](y, 7 * i + 1)
        z = cuda.device_array(n, dtype=np.float32)
        axpy[blocks, THREADS](z, np.float32(0.5), x, y)
        w = cuda.device_array(n, dtype=np.float32)
        multiply[blocks, THREADS](w, z, x)
        partial = cuda.device_array(blocks, dtype=np.float32)
        block_sums[blocks, THREADS](partial, w)
        return float(partial.copy_to_host().astype(np.float64).sum()).hex()

    loop.run(iteration, key=lambda i: f"size-{SIZES[i % len(SIZES)]}")
    import numba
    loop.finish(versions={"numba": numba.__version__})


if __name__ == "__main__":
    main()
