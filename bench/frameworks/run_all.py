#!/usr/bin/env python3
"""Runs the framework benchmarks, one process per mode, in interleaved rounds (the order of the modes
rotates each round), and prints a markdown table; writes every result to --out (JSON).

    python3 bench/frameworks/run_all.py --library build/python/librefpool.so [--quick] [--only gpt2_train]
    python3 bench/frameworks/run_all.py ... --picture docs/img/frameworks_gpt2_train.png

Step time is the median over all measured steps of all rounds, and the mean (the training time
over the steps; where steps differ, as with variable sequence lengths, the median of step times
falls between clusters of lengths and a 1% change can move it by 5%). Paired: the median, over
the step positions, of the ratio of this mode's to own's time at that position (the median over
rounds at each): the same step compared with itself. Peak memory: the driver's used
memory (total - free) above the process's baseline (its CUDA context), sampled after every step;
and the allocator's own peak held (PyTorch: reserved) and peak live (PyTorch: allocated) bytes.
Driver calls: allocations the allocator made after warm-up. Identical: every round of every mode gave
the same outputs (losses as float.hex, or digests) as the framework's own allocator, whose rounds
must also agree with each other (else the benchmark itself is not deterministic)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import MODES, REPO, environment_library  # noqa: E402

BENCHMARKS = {
    "resnet18_train": "resnet18_train.py",
    "gpt2_train": "gpt2_train.py",
    "gpt2_infer": "gpt2_infer.py",
    "gpt2_train_varlen": "gpt2_train_varlen.py",
    "gpt2_generate": "gpt2_generate.py",
    "cupy_loop": "cupy_loop.py",
    "numba_loop": "numba_loop.py",
}
QUICK = {"rounds": 1, "warmup": 3, "steps": 6}
_MIB = 2 ** 20


def child_environment(library):
    env = dict(os.environ)
    env["REFPOOL_LIBRARY"] = str(Path(library).resolve())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"), env.get("PYTHONPATH")]))
    return env


def run_one(name, mode, round_number, args, out_dir, env, extra=()):
    out = out_dir / f"{name}-{mode}-round{round_number}.json"
    command = [sys.executable, str(HERE / BENCHMARKS[name]), "--mode", mode, "--round", str(round_number),
               "--out", str(out), *extra]
    if args.warmup is not None:
        command += ["--warmup", str(args.warmup)]
    if args.steps is not None:
        command += ["--steps", str(args.steps)]
    started = time.monotonic()
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    print(f"  {name} {mode} round {round_number}: {time.monotonic() - started:.0f} s, exit {completed.returncode}",
          flush=True)
    if completed.returncode != 0 or not out.exists():
        tail = (completed.stdout + completed.stderr)[-3000:]
        return {"benchmark": name, "mode": mode, "round": round_number, "failed": tail}
    return json.loads(out.read_text())


def summarise(name, runs, modes=MODES):
    """One table row per mode of one benchmark."""
    by_mode = {mode: [r for r in runs if r["mode"] == mode] for mode in modes}
    skipped = next((r["skipped"] for r in runs if "skipped" in r), None)
    if skipped:
        return [{"benchmark": name, "mode": "all", "note": f"skipped: {skipped}"}]
    own_digests = {r["outputs_digest"] for r in by_mode["own"] if "outputs_digest" in r}
    rows = []
    own_median = own_mean = own_by_position = None
    for mode in modes:
        good = [r for r in by_mode[mode] if "failed" not in r]
        if not good:
            failure = next((r["failed"] for r in by_mode[mode] if "failed" in r), "no run")
            rows.append({"benchmark": name, "mode": mode, "note": "failed: " + failure.strip().splitlines()[-1]})
            continue
        median = statistics.median(s for r in good for s in r["step_seconds"])
        mean = statistics.fmean(s for r in good for s in r["step_seconds"])
        positions = min(len(r["step_seconds"]) for r in good)
        by_position = [statistics.median(r["step_seconds"][i] for r in good) for i in range(positions)]
        if mode == "own":
            own_median, own_mean, own_by_position = median, mean, by_position
        paired = (statistics.median(m / o for m, o in zip(by_position, own_by_position))
                  if own_by_position else None)
        digests = {r["outputs_digest"] for r in good}
        allocator = [r.get("allocator", {}) for r in good]
        rows.append({
            "benchmark": name, "mode": mode, "rounds": len(good),
            "median_step_ms": median * 1e3,
            "vs_own": median / own_median if own_median else None,
            "mean_step_ms": mean * 1e3,
            "vs_own_mean": mean / own_mean if own_mean else None,
            "vs_own_paired": paired,
            "peak_used_mib": max(r["driver_used_bytes"]["peak_over_baseline"] for r in good) / _MIB,
            "peak_held_mib": max(a.get("peak_held_bytes", 0) for a in allocator) / _MIB or None,
            "peak_live_mib": max(a.get("peak_live_bytes", 0) for a in allocator) / _MIB or None,
            "arena_mib": max(a.get("arena_bytes", 0) for a in allocator) / _MIB or None,
            "driver_calls_after_warmup": max(r["driver_calls_after_warmup"] for r in good),
            "identical": (len(own_digests) == 1 and digests == own_digests) if own_digests else None,
            "own_deterministic": len(own_digests) == 1 if own_digests else None,
        })
    return rows


def markdown(rows):
    def cell(value, digits=1):
        if value is None:
            return "—"
        if isinstance(value, bool):
            return "yes" if value else "**no**"
        if isinstance(value, float):
            return f"{value:,.{digits}f}"
        return str(value)

    lines = ["| benchmark | mode | step (ms, median) | vs own | step (ms, mean) | vs own (mean) | vs own (paired) | "
             "peak used over context (MiB) | allocator peak held / reserved (MiB) | peak live / allocated (MiB) | "
             "held ÷ live | plan arenas (MiB) | driver allocations after warm-up | outputs identical to own |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "note" in row:
            lines.append(f"| {row['benchmark']} | {row['mode']} | {row['note']} ||||||||||||")
            continue
        identical = cell(row["identical"])
        ratio = row["peak_held_mib"] / row["peak_live_mib"] if row["peak_held_mib"] and row["peak_live_mib"] else None
        if row["mode"] == "own":
            identical = "(reference)" if row["own_deterministic"] else "**own runs differ**"
        lines.append(f"| {row['benchmark']} | {row['mode']} | {cell(row['median_step_ms'], 2)} | "
                     f"{cell(row['vs_own'], 3)} | {cell(row['mean_step_ms'], 2)} | {cell(row['vs_own_mean'], 3)} | "
                     f"{cell(row['vs_own_paired'], 3)} | {cell(row['peak_used_mib'], 0)} | {cell(row['peak_held_mib'], 0)} | "
                     f"{cell(row['peak_live_mib'], 0)} | {cell(ratio, 3)} | {cell(row['arena_mib'], 0)} | "
                     f"{row['driver_calls_after_warmup']} | {identical} |")
    return "\n".join(lines)


def picture(args, env, out_dir):
    """One logged run of GPT-2 training, planned, then refpool.plot of it."""
    log = out_dir / "picture-gpt2_train.csv"
    stats = out_dir / "picture-gpt2_train-stats.json"
    picture_env = dict(env, REFPOOL_CONF=f"log:{log}")
    command = [sys.executable, str(HERE / "gpt2_train.py"), "--mode", "refpool-planned", "--warmup", "2",
               "--steps", "4", "--out", str(out_dir / "picture-gpt2_train.json"), "--stats-out", str(stats)]
    subprocess.run(command, env=picture_env, check=True, timeout=args.timeout)
    subprocess.run([sys.executable, "-m", "refpool.plot", str(log), args.picture, "--stats", str(stats),
                    "--title", "GPT-2 small training (batch 8 x 256), refpool planned steps, H200"],
                   env=env, check=True, timeout=args.timeout)
    print(f"picture: {args.picture}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", default=environment_library(), help="librefpool to load (REFPOOL_LIBRARY)")
    parser.add_argument("--only", action="append", choices=sorted(BENCHMARKS), help="run only these (repeatable)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, help="warm-up iterations (default: each script's)")
    parser.add_argument("--steps", type=int, help="measured iterations per process (default: each script's)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, 3 warm-up, 6 measured steps")
    parser.add_argument("--timeout", type=int, default=300, help="seconds allowed to one process")
    parser.add_argument("--out", default="bench-frameworks.json", help="all results, JSON")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated subset of {','.join(MODES)} (own first: ratios are to it)")
    parser.add_argument("--picture", help="also draw a memory picture of GPT-2 training here (PNG)")
    args = parser.parse_args()
    modes = tuple(args.modes.split(","))
    if not set(modes) <= set(MODES) or modes[0] != "own":
        sys.exit(f"run_all.py: --modes must start with own and name only {','.join(MODES)}")
    if args.quick:
        args.rounds = QUICK["rounds"]
        args.warmup = args.warmup if args.warmup is not None else QUICK["warmup"]
        args.steps = args.steps if args.steps is not None else QUICK["steps"]
    if not Path(args.library).is_file():
        sys.exit(f"run_all.py: no librefpool at {args.library} (build it: meson compile -C build, or --library)")
    env = child_environment(args.library)
    out_dir = Path(args.out).with_suffix("")
    out_dir.mkdir(parents=True, exist_ok=True)

    runs, rows = [], []
    for name in args.only or list(BENCHMARKS):
        print(f"{name}:", flush=True)
        these = []
        for round_number in range(args.rounds):
            shift = round_number % len(modes)
            for mode in modes[shift:] + modes[:shift]:
                result = run_one(name, mode, round_number, args, out_dir, env)
                these.append(result)
                if "skipped" in result:
                    break
            if any("skipped" in r for r in these):
                break
        runs += these
        rows += summarise(name, these, modes)
    table = markdown(rows)
    Path(args.out).write_text(json.dumps({"rows": rows, "runs": runs}, indent=1))
    print()
    print(table, flush=True)
    if args.picture:  # last, so that a failure here loses no measurement
        picture(args, env, out_dir)


if __name__ == "__main__":
    main()
