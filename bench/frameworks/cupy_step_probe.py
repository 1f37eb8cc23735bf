#!/usr/bin/env python3
"""Where a refpool step's cost goes in cupy_loop.py's MLP step (batch 64), in one process: the
CPU cost of an empty step, then iterations without a step, with a plain step and with a planned step,
alternating, each timed twice (host time to enqueue the iteration, and to its end on the device) with
the change of every refpool counter per iteration. Usage: cupy_step_probe.py --out RESULT.json"""
import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cupy_loop import mlp_step, mlp_weights  # noqa: E402

ROWS, ITERATIONS = 64, 40


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from common import import_refpool
    import cupy as cp
    import_refpool()
    import refpool.cupy
    refpool.cupy.install()
    rng = cp.random.RandomState(0)
    weights = mlp_weights(cp, rng)

    def iteration():
        return mlp_step(cp, rng, weights, ROWS)

    device = cp.cuda.Device()
    result = {}
    start = time.perf_counter()
    for _ in range(2000):
        with refpool.cupy.step():
            pass
    result["empty_step_us"] = (time.perf_counter() - start) / 2000 * 1e6
    contexts = {"nostep": contextlib.nullcontext, "step": refpool.cupy.step,
                "planned": lambda: refpool.cupy.step(plan="probe")}
    for round_ in range(2):
        for mode, context in contexts.items():
            for _ in range(5):  # warm-up (and the planned step's recording)
                with context():
                    iteration()
            device.synchronize()
            before = refpool.cupy.stats()
            enqueue, total = [], []
            for _ in range(ITERATIONS):
                t0 = time.perf_counter()
                with context():
                    iteration()
                t1 = time.perf_counter()
                device.synchronize()
                enqueue.append(t1 - t0)
                total.append(time.perf_counter() - t0)
            after = refpool.cupy.stats()
            result[f"{mode}-{round_}"] = {
                "enqueue_us": statistics.median(enqueue) * 1e6, "total_us": statistics.median(total) * 1e6,
                "counters_per_iteration": {k: (after[k] - before[k]) / ITERATIONS for k in after
                                           if after[k] != before[k]}}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
