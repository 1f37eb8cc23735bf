#!/usr/bin/env python3
"""Where the time goes in a CuPy loop at small batches (issue 26: a 3-layer MLP at batches 64, 128
and 256 ran 1.03x-1.13x slower with refpool than with CuPy's pool). The loop is cupy_loop.py's MLP
step (cupy_loop.mlp_step: forward, backward, update, FFT), one batch size per process run, in four modes:

  own              CuPy's MemoryPool
  refpool-nostep   refpool as CuPy's allocator, no step around iterations (the allocation path alone)
  refpool          a plain refpool.cupy.step() around each iteration (what the issue ran)
  refpool-planned  a planned step per batch size

Per mode and batch: the median iteration time (wall clock, device synchronised after each), the
allocation requests per iteration, and the CPU cost of one cupy.empty + release pair. Modes run in
turn in separate processes, `rounds` times; a table and one JSON.
Usage: cupy_small_batches.py --out RESULT.json [--rounds 2] [--library build/python/librefpool.so]"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCHES = (64, 128, 256)
MODES = ("own", "refpool-nostep", "refpool", "refpool-planned")
HERE = Path(__file__).resolve().parent


def run_mode(mode, out, warmup=12, steps=60):
    sys.path.insert(0, str(HERE))
    import contextlib

    from cupy_loop import mlp_step, mlp_weights

    import cupy as cp
    step = None
    if mode != "own":
        from common import import_refpool
        import_refpool()
        import refpool.cupy
        refpool.cupy.install()
        if mode == "refpool":
            step = refpool.cupy.step
        elif mode == "refpool-planned":
            step = lambda key: refpool.cupy.step(plan=key)  # noqa: E731
    rng = cp.random.RandomState(0)
    weights = mlp_weights(cp, rng)

    def iteration(rows):
        return mlp_step(cp, rng, weights, rows)

    def requests():
        if mode == "own":
            return 0
        stats = refpool.cupy.stats()
        return stats["hits"] + stats["misses"]

    result = {"mode": mode, "step_seconds": {}, "requests_per_step": {}}
    device = cp.cuda.Device()
    for rows in BATCHES:
        times = []
        for i in range(warmup + steps):
            if mode == "refpool-planned":
                context = step(f"rows-{rows}")
            else:
                context = step() if step is not None else contextlib.nullcontext()
            before = requests()
            start = time.perf_counter()
            with context:
                iteration(rows)
            device.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - start)
        result["step_seconds"][str(rows)] = statistics.median(times)
        result["requests_per_step"][str(rows)] = requests() - before
    pairs = 20000
    start = time.perf_counter()
    for _ in range(pairs):
        cp.empty(1024, dtype=cp.float32)
    result["empty_pair_seconds"] = (time.perf_counter() - start) / pairs
    result["cupy"] = cp.__version__
    Path(out).write_text(json.dumps(result))
    print(json.dumps(result))


def compare(args):
    env = dict(os.environ)
    if args.library:
        env["REFPOOL_LIBRARY"] = str(Path(args.library).resolve())
    runs = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for mode in MODES:
                path = Path(scratch) / f"{mode}-{round_}.json"
                subprocess.run([sys.executable, __file__, "--mode", mode, "--out", str(path)], env=env, check=True)
                runs[mode].append(json.loads(path.read_text()))
    table = {mode: {"step_seconds": {str(b): statistics.median(r["step_seconds"][str(b)] for r in results)
                                     for b in BATCHES},
                    "empty_pair_seconds": statistics.median(r["empty_pair_seconds"] for r in results),
                    "requests_per_step": results[0]["requests_per_step"]}
             for mode, results in runs.items()}
    print(f"CuPy MLP step (median of {args.rounds} rounds), ratio to own; empty+release pair in us")
    print(f"{'mode':>16} " + " ".join(f"{f'b{b} ms':>9} {'ratio':>6}" for b in BATCHES) + f" {'pair us':>8}")
    for mode in MODES:
        cells = []
        for b in BATCHES:
            t, own = table[mode]["step_seconds"][str(b)], table["own"]["step_seconds"][str(b)]
            cells.append(f"{t * 1e3:>9.3f} {t / own:>6.3f}")
        print(f"{mode:>16} " + " ".join(cells) + f" {table[mode]['empty_pair_seconds'] * 1e6:>8.2f}")
    Path(args.out).write_text(json.dumps({"benchmark": "cupy_small_batches", "batches": BATCHES, "table": table,
                                          "runs": runs}, indent=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=MODES)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--library")
    args = parser.parse_args()
    if args.mode:
        run_mode(args.mode, args.out)
    else:
        compare(args)


if __name__ == "__main__":
    main()
