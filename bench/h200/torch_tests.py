#!/usr/bin/env python3
"""PyTorch's own allocator tests, once with PyTorch's allocator and once with refpool installed, and
the tests whose results differ (bench/h200/torch_tests.sh runs this on the H200).

Each test file runs in each mode in pytest processes of its own (`-p ptests_plugin`, which installs
refpool before the file is imported, in refpool mode), one file and mode after the other so the
modes never share the GPU; with pytest-xdist every test file runs in a worker that is restarted if a
test crashes it. The time budget is shared out as the runs go; what a run could not reach is "not
run". Prints a table of the differences (test, PyTorch's result, refpool's, the first line of the
failure) and the counts, and writes <out>/torch_tests.json and <out>/torch_tests.md.

    python3 bench/h200/torch_tests.py --tests .ptests --out OUT [--budget 330] [-k FILTER] [--files F,...]
        [--modes torch,refpool] [--note TEXT]

With one mode only (refpool's could not run), the table lists that mode's results that are not
passes, and --note says why the other did not run."""
import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MODES = ("torch", "refpool")
FILES = (("test_cuda.py", 3), ("test_cudagraph_trees.py", 1))  # file, share of the budget
HERE = Path(__file__).resolve().parent


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=Path, default=Path(".ptests"), help="folder with PyTorch's test files")
    parser.add_argument("--out", type=Path, default=Path("h200-out"))
    parser.add_argument("--budget", type=float, default=330.0, help="seconds for all pytest runs together")
    parser.add_argument("--timeout", type=int, default=150, help="seconds one test may take")
    parser.add_argument("-k", dest="filter", default=None, help="pytest -k expression")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--files", default=",".join(name for name, _ in FILES), help="test files to run, in order")
    parser.add_argument("--note", default="", help="what the table's reader must know (a mode that could not run)")
    return parser.parse_args(argv)


def outcome(phases):
    """One result from a test's phases (setup, call, teardown as the plugin recorded them)."""
    by_when = {p["when"]: p for p in phases}
    if "collect" in by_when:
        return "error", "collection: " + by_when["collect"]["message"]
    for when in ("setup", "call"):
        p = by_when.get(when)
        if p is None:
            continue
        if p["outcome"] == "failed":
            return ("failed" if when == "call" else "error"), p["message"]
        if p["outcome"] == "skipped":
            return ("xfailed" if p["xfail"] else "skipped"), p["message"]
        if when == "call":
            if p["xfail"]:
                return "xpassed", p["message"]
            teardown = by_when.get("teardown")
            if teardown is not None and teardown["outcome"] == "failed":
                return "error", "teardown: " + teardown["message"]
            return "passed", ""
    if "setup" in by_when:
        return "crashed", "the test process ended during the test"
    return "error", "no setup or call phase recorded"


def read_results(path):
    phases = collections.defaultdict(list)
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                phases[record["nodeid"]].append(record)
    return {nodeid: dict(zip(("result", "message"), outcome(p)), seconds=round(sum(x["duration"] for x in p), 2))
            for nodeid, p in phases.items()}


def has_module(name):
    return subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True).returncode == 0


def run_pytest(test_file, mode, out, seconds, args, xdist, timeouts):
    """Runs one file in one mode for at most `seconds`; returns (results, seconds taken, log path)."""
    results = out / f"results-{mode}-{test_file.stem}.jsonl"
    log = out / f"pytest-{mode}-{test_file.stem}.txt"
    results.unlink(missing_ok=True)
    env = dict(os.environ, REFPOOL_PTESTS_MODE=mode, REFPOOL_PTESTS_RESULTS=str(results.resolve()))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", str(test_file), "-p", "ptests_plugin", "-p", "no:cacheprovider",
               "-q", "-rN"]
    if timeouts:
        command.append(f"--timeout={args.timeout}")
    if xdist:
        command += ["-n", "1", "--max-worker-restart=1000"]
    if args.filter:
        command += ["-k", args.filter]
    start = time.monotonic()
    with open(log, "w") as output:
        try:
            subprocess.run(command, env=env, stdout=output, stderr=subprocess.STDOUT, timeout=max(seconds, 1))
        except subprocess.TimeoutExpired:
            output.write(f"\n== stopped: the run's {seconds:.0f} s of the budget were spent\n")
    found = read_results(results)
    if not found:  # pytest did not start, or collected nothing: what it said
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-6:]
        print(f"{test_file.name} with {mode}: no test results; the log ends:\n    " + "\n    ".join(tail), flush=True)
    return found, time.monotonic() - start, log


def differences(by_mode):
    """Rows (test, PyTorch's result, refpool's, the first line of the failure) where they differ."""
    torch_results, refpool_results = by_mode.get("torch", {}), by_mode.get("refpool", {})
    rows = []
    for nodeid in sorted(set(torch_results) | set(refpool_results)):
        own = torch_results.get(nodeid, {"result": "not run", "message": ""})
        ours = refpool_results.get(nodeid, {"result": "not run", "message": ""})
        if own["result"] != ours["result"]:
            why = ours["message"] if ours["result"] not in ("passed", "not run") else own["message"]
            rows.append({"test": nodeid.split("::", 1)[-1], "file": nodeid.split("::", 1)[0], "torch": own["result"],
                         "refpool": ours["result"], "failure": why})
    return rows


def counts(results):
    return dict(collections.Counter(r["result"] for r in results.values()))


def markdown(rows, by_mode, seconds, note=""):
    lines = [f"**{note}**", ""] if note else []
    lines += ["| test | PyTorch's allocator | refpool | first line of the failure |", "|---|---|---|---|"]
    for row in rows:
        failure = row["failure"].replace("|", "\\|")
        lines.append(f"| `{row['test']}` | {row['torch']} | {row['refpool']} | {failure} |")
    lines.append("")
    for mode, results in by_mode.items():
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts(results).items()))
        lines.append(f"- {mode}: {len(results)} tests ({summary}) in {seconds.get(mode, 0):.0f} s")
    return "\n".join(lines) + "\n"


def not_passing(results, mode):
    """Rows for one mode's results that are not passes (the table when the other mode did not run)."""
    return [{"test": nodeid.split("::", 1)[-1], "file": nodeid.split("::", 1)[0],
             "torch": r["result"] if mode == "torch" else "not run",
             "refpool": r["result"] if mode == "refpool" else "not run", "failure": r["message"]}
            for nodeid, r in sorted(results.items()) if r["result"] not in ("passed", "skipped")]


def main(argv=None):
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    modes = [m for m in args.modes.split(",") if m in MODES]
    wanted = args.files.split(",")
    runs = [(args.tests / name, share, mode) for name, share in FILES for mode in modes
            if name in wanted and (args.tests / name).is_file()]
    if not runs:
        sys.exit(f"no test files in {args.tests}: carry .ptests (docs/frameworks.md, 'PyTorch's own tests')")
    xdist, timeouts = has_module("xdist"), has_module("pytest_timeout")
    by_mode = {mode: {} for mode in modes}
    seconds = collections.Counter()
    left = args.budget
    for i, (test_file, share, mode) in enumerate(runs):
        shares = sum(s for _, s, _ in runs[i:])
        allotted = left * share / shares
        results, took, log = run_pytest(test_file, mode, args.out, allotted, args, xdist, timeouts)
        left -= took
        seconds[mode] += took
        by_mode[mode].update(results)
        print(f"{test_file.name} with {mode}: {len(results)} tests in {took:.0f} s ({counts(results)}); log {log}",
              flush=True)
    silent = [mode for mode in modes if not by_mode[mode]]
    if silent:  # pytest could not start in that mode: every test of it reads "not run"
        args.note = "; ".join(filter(None, [args.note, f"{', '.join(silent)} mode gave no test results "
                                            "(its pytest log says why)"]))
    if len(modes) == 2:
        rows = differences(by_mode)
        print(f"\n{len(rows)} tests differ between PyTorch's allocator and refpool:\n")
    else:
        rows = not_passing(by_mode[modes[0]], modes[0])
        print(f"\nOnly {modes[0]}'s mode ran; its {len(rows)} tests that did not pass or skip:\n")
    table = markdown(rows, by_mode, seconds, args.note)
    print(table)
    report = {"modes": {m: {"seconds": round(seconds[m], 1), "counts": counts(r), "results": r}
                        for m, r in by_mode.items()},
              "differences": rows, "budget": args.budget, "xdist": xdist, "tests": str(args.tests),
              "note": args.note, "refpool_hooks": os.environ.get("REFPOOL_PTESTS_HOOKS", "1") != "0"}
    try:
        import torch
        report["torch"] = torch.__version__
    except ImportError:
        pass
    (args.out / "torch_tests.json").write_text(json.dumps(report, indent=1))
    (args.out / "torch_tests.md").write_text(table)


if __name__ == "__main__":
    main()
