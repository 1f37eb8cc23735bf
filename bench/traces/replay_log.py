#!/usr/bin/env python3
"""Replays refpool's allocation log of a real framework run (REFPOOL_CONF=log:PATH, here GPT-2
training with 13 sequence lengths on the H200), kept as a step trace (gpt2_train_varlen_h200.csv.xz:
step,event,index,bytes; step 0 is what came before the first step, an index a buffer's slot), through
refpool's framework allocator on the host backend, one step per recorded step, every allocation and
free in the order the run made them, persistent state included (parameters, optimizer state,
gradients that outlive their step). The
request sequence does not depend on the allocator, so its memory figures are what the same
program holds; time is not measured (Python calls dominate). One process per row, side by side:

    default     what refpool.torch.install() gives: segments, steps that plan by themselves
    plain step  the same with auto_plans off (segments alone)
    planned     the default with every step under one plan key (run_all's refpool-planned)

and PyTorch's own allocator as measured on the H200 in the same benchmark (not replayed).

    PYTHONPATH=python REFPOOL_LIBRARY=build/python/librefpool.so \\
        python3 bench/traces/replay_log.py [--json replay_log.json]

--steps ROW prints one row step by step instead: what each step made the cache do (plan hits and
misses, recordings, arena growths and lendings, segment growths, backend calls) and its wall time,
on the host backend or, with --runtime cuda, on a GPU (driver calls included, no kernels run).
"""
import argparse
import csv
import lzma
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# xz: the trace is 3.1 MB of text, 135 KB compressed (gzip: 3x larger); Python reads it with lzma.
LOG = HERE / "gpt2_train_varlen_h200.csv.xz"
ABOUT = HERE / "gpt2_train_varlen_h200.json"  # what was run, and PyTorch's figures on the same run
# Row: (cache configuration, plan key of every step: None for a step without one).
ROWS = {"default": ("segments:on", None), "plain step": ("segments:on,auto_plans:off", None),
        "planned": ("segments:on", "gpt2 train")}
MIB = 2 ** 20


STEP_COUNTERS = ("plan_hits", "plan_misses", "plan_recordings", "arena_growths", "arena_lendings", "segment_grows",
                 "segment_trims", "backend_allocations", "backend_frees")


def replay(row, runtime="host", per_step=None):
    """Replays the log under `row` (an entry of ROWS); returns its figures. `per_step`: a list
    that gets each step's counter changes and wall time."""
    import time
    import refpool.allocator as allocator
    conf, plan = row
    allocator.configure(runtime=runtime, conf=conf)  # segments on: as a GPU gets them
    steps = []  # the events of each step: (event, slot, bytes)
    with lzma.open(LOG, "rt") as f:
        for step, event, slot, size in list(csv.reader(f))[1:]:  # step,event,index,bytes
            while len(steps) <= int(step):
                steps.append([])
            steps[int(step)].append((event, slot, size))
    held, live, peak_live = {}, 0, 0

    slow = []  # (seconds, step, action, bytes): the slowest calls, with per_step

    def run(events, step=-1):
        nonlocal live, peak_live
        for action, pointer, size in events:
            began = time.perf_counter() if per_step is not None else 0
            if action == "alloc":
                held[pointer] = (allocator.malloc(int(size)), int(size))
                live += int(size)
                peak_live = max(peak_live, live)
            else:
                address, size = held.pop(pointer)
                allocator.free(address)
                live -= size
            if per_step is not None:
                slow.append((time.perf_counter() - began, step, action, int(size)))
                if len(slow) > 4096:
                    slow.sort(reverse=True)
                    del slow[64:]

    run(steps[0])  # the model's parameters, before the first step
    before = allocator.stats()
    for events in steps[1:]:
        began = time.perf_counter()
        with allocator.step(plan):
            run(events, len(per_step) if per_step is not None else -1)
            closing = time.perf_counter()
        seconds = time.perf_counter() - began
        closing = time.perf_counter() - closing
        if per_step is not None:
            now = allocator.stats()
            per_step.append(dict({k: now.get(k, 0) - before.get(k, 0) for k in STEP_COUNTERS},
                                 ms=seconds * 1e3, close_ms=closing * 1e3, reserved_mib=now["reserved_bytes"] / MIB))
            before = now
    if per_step is not None:
        slow.sort(reverse=True)
        per_step.append({"slowest_calls": [{"us": s * 1e6, "step": i, "call": a, "bytes": b} for s, i, a, b in slow[:24]]})
    stats = allocator.stats()
    return {"conf": conf, "peak_reserved_bytes": stats["peak_reserved_bytes"],
            "reserved_bytes_at_end": stats["reserved_bytes"], "peak_live_bytes": peak_live,
            "arena_bytes": stats["arena_bytes"], "arena_lendings": stats.get("arena_lendings", 0),
            "plans": stats["plans"], "steps": len(steps) - 1}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default="replay_log.json", help="where to write the rows")
    parser.add_argument("--row", help=argparse.SUPPRESS)  # a child process: one row, as JSON
    parser.add_argument("--steps", choices=ROWS, help="print this row step by step")
    parser.add_argument("--runtime", default="host", choices=("host", "cuda"), help="with --steps")
    args = parser.parse_args()
    if args.steps:
        table = []
        replay(ROWS[args.steps], args.runtime, table)
        slowest = table.pop()["slowest_calls"]
        print("step " + " ".join(f"{k:>{max(8, len(k))}}" for k in STEP_COUNTERS) + "   reserved MiB       ms    close")
        for i, r in enumerate(table):
            print(f"{i:>4} " + " ".join(f"{r[k]:>{max(8, len(k))}}" for k in STEP_COUNTERS) +
                  f" {r['reserved_mib']:>14,.0f} {r['ms']:>8.1f} {r['close_ms']:>8.1f}")
        print("slowest calls: " + ", ".join(f"step {c['step']} {c['call']} {c['bytes']:,} B {c['us']:,.0f} us"
                                             for c in slowest))
        Path(args.json).write_text(json.dumps({"row": args.steps, "runtime": args.runtime, "steps": table,
                                               "slowest_calls": slowest}, indent=1))
        return
    if args.row:
        print(json.dumps(replay(ROWS[args.row])))
        return
    results = {}
    for label in ROWS:
        child = subprocess.run([sys.executable, __file__, "--row", label], capture_output=True, text=True,
                               env=dict(os.environ), check=True)
        results[label] = json.loads(child.stdout.strip().splitlines()[-1])
    torch = json.loads(ABOUT.read_text())["pytorch_on_h200"]
    print(f"{'allocator':<34} {'peak reserved':>14} {'peak live':>11} {'resvd/live':>10} {'vs PyTorch':>10}")
    for label, r in results.items():
        print(f"{'refpool ' + label + ' (host replay)':<34} {r['peak_reserved_bytes'] / MIB:>10,.0f} MiB "
              f"{r['peak_live_bytes'] / MIB:>7,.0f} MiB {r['peak_reserved_bytes'] / r['peak_live_bytes']:>9.3f}x "
              f"{r['peak_reserved_bytes'] / torch['peak_reserved_bytes']:>9.3f}x")
    print(f"{'PyTorch (measured on the H200)':<34} {torch['peak_reserved_bytes'] / MIB:>10,.0f} MiB "
          f"{torch['peak_allocated_bytes'] / MIB:>7,.0f} MiB "
          f"{torch['peak_reserved_bytes'] / torch['peak_allocated_bytes']:>9.3f}x {1:>9.3f}x")
    Path(args.json).write_text(json.dumps({"rows": results, "pytorch_on_h200": torch}, indent=1))


if __name__ == "__main__":
    main()
