#!/usr/bin/env python3
"""CuPy's MemoryPool anchor for gpu_bench's hit path: alloc + free of one size, from Python,
so the figures include interpreter overhead. Writes JSON rows like gpu_bench's.
Usage: cupy_pool.py OUT.json"""
import json
import statistics
import sys
import time

try:
    import cupy
except ImportError as missing:  # an anchor that is not installed is skipped, never faked
    print(f"CuPy anchor skipped: {missing}")
    sys.exit(0)

pool = cupy.cuda.MemoryPool()
rows = []
print("CuPy MemoryPool hit path (ns per alloc + free pair, median of 11, from Python)")
for size in (256, 64 << 10, 1 << 20, 64 << 20):
    pairs = 20000
    for _ in range(1000):  # warm the pool
        pool.malloc(size)
    samples = []
    for _ in range(11):
        start = time.perf_counter_ns()
        for _ in range(pairs):
            block = pool.malloc(size)
            del block
        samples.append((time.perf_counter_ns() - start) / pairs)
    ns = statistics.median(samples)
    print(f"{size:>10} B {ns:10.0f} ns")
    rows.append({"workload": "hit_path", "allocator": "CuPy MemoryPool (Python)", "bytes": size,
                 "ns_per_pair": round(ns, 1), "driver_allocations": None, "hits": None})
with open(sys.argv[1] if len(sys.argv) > 1 else "cupy_pool.json", "w") as out:
    json.dump(rows, out, indent=1)
