#!/usr/bin/env python3
"""CuPy's pool against refpool in one process, modes alternating many times (issue 26: separate
processes differed by more than the few percent in question). cupy_loop.py's 3-layer MLP step at
each batch; modes: own (CuPy's MemoryPool), refpool without steps, refpool with a plain step per
iteration. Each block runs ITERATIONS iterations of one mode and synchronises once; the mode's
figure is the median of its blocks' time per iteration, and its ratio to own's median. Prints a
table and writes JSON. Usage: cupy_interleaved.py --out RESULT.json [--blocks N] [--batches ...]"""
import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cupy_loop import mlp_step, mlp_weights  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--blocks", type=int, default=15, help="blocks per mode and batch")
    parser.add_argument("--iterations", type=int, default=30, help="iterations per block")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256])
    args = parser.parse_args()
    from common import import_refpool
    import cupy as cp
    import_refpool()
    import refpool.cupy
    own_pool = cp.cuda.MemoryPool()
    refpool_malloc = refpool.cupy.allocator_object().malloc
    modes = {  # name: (allocator, context per iteration)
        "own": (own_pool.malloc, contextlib.nullcontext),
        "refpool": (refpool_malloc, contextlib.nullcontext),
        "refpool+step": (refpool_malloc, refpool.cupy.step),
    }
    device = cp.cuda.Device()
    result = {"blocks": args.blocks, "iterations": args.iterations, "batches": {}}
    for rows in args.batches:
        rng = cp.random.RandomState(0)
        weights = mlp_weights(cp, rng)
        times = {mode: [] for mode in modes}
        for block in range(args.blocks + 1):  # block 0 warms every mode up, untimed
            order = list(modes) if block % 2 == 0 else list(reversed(modes))
            for mode in order:
                allocator, context = modes[mode]
                cp.cuda.set_allocator(allocator)
                device.synchronize()
                start = time.perf_counter()
                for _ in range(args.iterations):
                    with context():
                        mlp_step(cp, rng, weights, rows)
                device.synchronize()
                if block > 0:
                    times[mode].append((time.perf_counter() - start) / args.iterations)
        medians = {mode: statistics.median(t) for mode, t in times.items()}
        result["batches"][rows] = {mode: {"median_us": medians[mode] * 1e6,
                                          "ratio_to_own": medians[mode] / medians["own"],
                                          "blocks_us": [t * 1e6 for t in times[mode]]} for mode in modes}
    cp.cuda.set_allocator(own_pool.malloc)
    print(f"{'batch':>6} " + " ".join(f"{m + ' us':>16} {'/ own':>7}" for m in modes))
    for rows, figures in result["batches"].items():
        print(f"{rows:>6} " + " ".join(f"{figures[m]['median_us']:>16.1f} {figures[m]['ratio_to_own']:>7.3f}"
                                       for m in modes))
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
