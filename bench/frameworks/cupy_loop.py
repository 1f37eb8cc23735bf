#!/usr/bin/env python3
"""A CuPy numerical loop with temporaries of changing shapes: a three-layer MLP trained by hand
(forward, backward, update) on batches of 256, 512, 1024 and 768 rows in turn, plus an FFT of the
output, one mode per process (see common.py). Planned mode has one plan key per batch size.
Usage: cupy_loop.py --mode MODE --out RESULT.json"""
import contextlib

from common import Loop, import_refpool, parse_args, refpool_driver_calls, refpool_figures, skip

BENCHMARK = "cupy_loop"
BATCHES = (256, 512, 1024, 768)
WIDTHS = (1024, 2048, 2048, 1024)


class CupyFramework:
    def __init__(self, cp, mode):
        self.cp = cp
        self.mode = mode
        self.pool_driver_calls = 0
        self.peak_pool_held = self.peak_pool_used = 0
        if mode == "own":
            # CuPy's default pool, with a counter on the driver allocations it makes (its misses only).
            def counting_malloc(size):
                self.pool_driver_calls += 1
                return cp.cuda.memory.MemoryPointer(cp.cuda.memory.Memory(size), 0)
            self.pool = cp.cuda.MemoryPool(counting_malloc)
            cp.cuda.set_allocator(self.pool.malloc)
        else:
            import_refpool()
            import refpool.cupy
            self.refpool_cupy = refpool.cupy
            refpool.cupy.install()

    def step_context(self, key):
        if self.mode == "own":
            return contextlib.nullcontext()
        return self.refpool_cupy.step(plan=key if self.mode == "refpool-planned" else None)

    def synchronize(self):
        self.cp.cuda.Device().synchronize()

    def used_bytes(self):
        if self.mode == "own":  # the pool has no peak counters: sampled with the driver's figure
            self.peak_pool_held = max(self.peak_pool_held, self.pool.total_bytes())
            self.peak_pool_used = max(self.peak_pool_used, self.pool.used_bytes())
        free, total = self.cp.cuda.runtime.memGetInfo()
        return total - free

    def driver_calls(self):
        return self.pool_driver_calls if self.mode == "own" else refpool_driver_calls()

    def allocator_figures(self):
        if self.mode == "own":
            return {"peak_held_bytes": self.peak_pool_held, "held_bytes": self.pool.total_bytes(),
                    "peak_live_bytes_at_step_ends": self.peak_pool_used}
        return refpool_figures()


def mlp_weights(cp, rng):
    return [rng.standard_normal((a, b), dtype=cp.float32) * (1.0 / a ** 0.5) for a, b in zip(WIDTHS, WIDTHS[1:])]


def mlp_step(cp, rng, weights, rows):
    """One training step of the MLP on `rows` random rows (forward, backward, update in place), and
    an FFT of its output: the loss and the spectrum's sum, as device scalars."""
    x = rng.standard_normal((rows, WIDTHS[0]), dtype=cp.float32)
    target = rng.standard_normal((rows, WIDTHS[-1]), dtype=cp.float32)
    activations, pre = [x], []
    for w in weights:  # forward
        pre.append(activations[-1] @ w)
        activations.append(cp.maximum(pre[-1], 0) if len(pre) < len(weights) else pre[-1])
    error = activations[-1] - target
    loss = (error * error).mean()
    grad = error * (2.0 / error.size)
    for layer in reversed(range(len(weights))):  # backward and update
        if layer < len(weights) - 1:
            grad = grad * (pre[layer] > 0)
        weight_grad = activations[layer].T @ grad
        grad = grad @ weights[layer].T
        weights[layer] -= 0.01 * weight_grad
    return loss, cp.abs(cp.fft.rfft(activations[-1], axis=1)).sum()


def main():
    args = parse_args(__doc__.split("\n")[0], default_warmup=8, default_steps=48)
    try:
        import cupy as cp
        if cp.cuda.runtime.getDeviceCount() == 0:
            raise RuntimeError("no device")
    except Exception as e:  # noqa: BLE001 (ImportError, or CUDA not usable)
        skip(args, BENCHMARK, f"needs CuPy with a CUDA device ({e})")

    framework = CupyFramework(cp, args.mode)
    loop = Loop(args, BENCHMARK, framework)
    rng = cp.random.RandomState(args.seed)
    weights = mlp_weights(cp, rng)

    def iteration(i):
        loss, spectrum = mlp_step(cp, rng, weights, BATCHES[i % len(BATCHES)])
        return float(loss).hex() + " " + float(spectrum).hex()

    loop.run(iteration, key=lambda i: f"rows-{BATCHES[i % len(BATCHES)]}")
    loop.finish(versions={"cupy": cp.__version__, "cuda_runtime": cp.cuda.runtime.runtimeGetVersion()})


if __name__ == "__main__":
    main()
