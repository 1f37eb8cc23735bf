"""What every framework benchmark shares: arguments, the measured loop, the JSON it writes.

Each benchmark script runs one mode in one process:
  own              the framework's own allocator
  refpool          refpool as the framework's allocator, a plain step around each iteration
  refpool-planned  the same, each step planned under a key (one per shape the iteration takes)
and writes one JSON file: step times of the measured steps, device memory (driver level, total minus
free, sampled after every step, and the allocator's own figures), driver allocations after warm-up,
and the iteration outputs (losses as float.hex, or digests) so run_all.py can compare modes bitwise."""
import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

MODES = ("own", "refpool", "refpool-planned")
REPO = Path(__file__).resolve().parents[2]


def import_refpool():
    """refpool, from an installed package or else this checkout's python/ (with $REFPOOL_LIBRARY)."""
    try:
        import refpool
    except ImportError:
        sys.path.insert(0, str(REPO / "python"))
        import refpool
    return refpool


def parse_args(description, default_warmup=5, default_steps=30):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--warmup", type=int, default=default_warmup, help="iterations before measuring")
    parser.add_argument("--steps", type=int, default=default_steps, help="measured iterations")
    parser.add_argument("--round", type=int, default=0, help="round number (recorded only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--stats-out", help="refpool modes: write refpool.StatsRecorder samples (one per step) here")
    return parser.parse_args()


def torch_setup(args, benchmark, *extra):
    """Imports torch and the modules named in `extra` ("transformers"), writing a skipped result
    and exiting when one is missing or PyTorch sees no CUDA device, then sets the mode up (refpool
    installs itself before CUDA starts). Returns (torch, *extra modules, framework, loop)."""
    import importlib
    names = ("torch", *extra)
    try:
        modules = [importlib.import_module(name) for name in names]
    except ImportError as e:
        skip(args, benchmark, f"needs {' and '.join(names)} ({e})")
    if not modules[0].cuda.is_available():
        skip(args, benchmark, "PyTorch sees no CUDA device")
    from torch_harness import TorchFramework
    framework = TorchFramework(args.mode, args.seed)
    return (*modules, framework, Loop(args, benchmark, framework))


def skip(args, benchmark, reason):
    """Writes a result that says why this benchmark cannot run here, and exits successfully."""
    write(args, {"benchmark": benchmark, "mode": args.mode, "skipped": reason})
    print(f"{benchmark} {args.mode}: skipped: {reason}")
    sys.exit(0)


def digest(data):
    """A short hex digest of bytes (outputs compared across modes)."""
    return hashlib.sha256(data).hexdigest()[:16]


class Loop:
    """The measured loop. `framework` supplies:
        step_context(key)   a context manager around one iteration (the mode's step)
        synchronize()       waits for the device
        used_bytes()        driver-level used device memory (total - free)
        driver_calls()      driver allocations so far (the allocator's counter)
        allocator_figures() the allocator's own peak figures (dict)"""

    def __init__(self, args, benchmark, framework):
        self.args = args
        self.benchmark = benchmark
        self.framework = framework
        self.baseline_used = framework.used_bytes()  # the context, before the model
        self.step_seconds = []
        self.outputs = []
        self.used_samples = []
        self.recorder = None
        if args.stats_out and args.mode != "own":
            refpool = import_refpool()
            self.recorder = refpool.StatsRecorder(refpool.allocator.cache())

    def run(self, iteration, key=lambda i: "step"):
        """Runs warm-up then measured iterations; `iteration(i)` returns the iteration's output (a str)."""
        framework = self.framework
        calls_after_warmup = None
        for i in range(self.args.warmup + self.args.steps):
            if i == self.args.warmup:
                framework.synchronize()
                calls_after_warmup = framework.driver_calls()
            start = time.perf_counter()
            with framework.step_context(key(i)):
                output = iteration(i)
            framework.synchronize()
            seconds = time.perf_counter() - start
            if i >= self.args.warmup:
                self.step_seconds.append(seconds)
            self.outputs.append(output)
            self.used_samples.append(framework.used_bytes())
            if self.recorder is not None:
                self.recorder.sample(label=f"step {i}")
        self.driver_calls_after_warmup = framework.driver_calls() - calls_after_warmup

    def finish(self, **extra):
        if self.recorder is not None:
            self.recorder.write(self.args.stats_out)
        result = {
            "benchmark": self.benchmark,
            "mode": self.args.mode,
            "round": self.args.round,
            "warmup": self.args.warmup,
            "steps": self.args.steps,
            "step_seconds": self.step_seconds,
            "median_step_seconds": statistics.median(self.step_seconds),
            "driver_used_bytes": {"baseline": self.baseline_used, "peak": max(self.used_samples),
                                  "peak_over_baseline": max(self.used_samples) - self.baseline_used},
            "allocator": self.framework.allocator_figures(),
            "driver_calls_after_warmup": self.driver_calls_after_warmup,
            "outputs": self.outputs,
            "outputs_digest": digest("\n".join(self.outputs).encode()),
            "host": platform.node(),
            "python": platform.python_version(),
        }
        result.update(extra)
        write(self.args, result)
        print(f"{self.benchmark} {self.args.mode} round {self.args.round}: median "
              f"{result['median_step_seconds'] * 1e3:.2f} ms, driver calls after warm-up "
              f"{self.driver_calls_after_warmup}, peak used {result['driver_used_bytes']['peak_over_baseline'] / 2**20:.0f} "
              f"MiB over baseline")


def refpool_figures():
    """refpool's allocator figures, named as in the results table."""
    refpool = import_refpool()
    stats = refpool.allocator.stats()
    # PyTorch's "allocated" and "reserved": every path (cached blocks, plan regions and arenas,
    # uncached recordings) counted.
    figures = {"peak_live_bytes": stats["peak_allocated_bytes"], "peak_held_bytes": stats["peak_reserved_bytes"],
               "held_bytes": stats["reserved_bytes"]}
    for name in ("arena_bytes", "planned_peak_live_bytes", "plan_hits", "plan_misses", "plan_recordings",
                 "escapes", "backend_allocations", "segment_grows", "uncached_allocations", "hits", "misses"):
        figures[name] = stats[name]
    return figures


def refpool_driver_calls():
    stats = import_refpool().allocator.stats()
    # Driver calls that obtained memory: block allocations, segment growth (commits), uncached ones.
    return stats["backend_allocations"] + stats["segment_grows"] + stats["uncached_allocations"]


def write(args, result):
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)


def environment_library():
    """The librefpool the children load: $REFPOOL_LIBRARY, else this checkout's build/python one."""
    return os.environ.get("REFPOOL_LIBRARY") or str(REPO / "build" / "python" / "librefpool.so")
