#!/usr/bin/env python3
"""Builds refpool's PyTorch hooks and memory-history library against the PyTorch here, without
librefpool (bench/h200/torch_tests.sh and torch_features.sh run it while librefpool builds), and
says what came of each: its path, or the compiler's first errors. Exit status 0 when the hooks
built (the history library's failure only loses history), 3 when they did not, 2 without PyTorch.

    python3 bench/h200/torch_build.py [--status FILE]   (FILE gets one line per library: NAME ok|failed)"""
import argparse
import sys
import time
import warnings


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--status", help="file for one line per library: its name, then ok or failed")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(f"no PyTorch here: {e}")
        return 2
    from refpool import _torch_hooks
    from refpool.errors import FrameworkError
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    status = {}
    for name, build in (("hooks", _torch_hooks.build), ("history", _torch_hooks.build_history)):
        start = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                path = build(torch)
                status[name] = "ok"
                print(f"{name}: built in {time.monotonic() - start:.0f} s: {path}", flush=True)
            except FrameworkError as e:
                status[name] = "failed"
                print(f"{name}: FAILED after {time.monotonic() - start:.0f} s\n{e}", flush=True)
        for w in caught:  # the first attempt's errors, when the fallback built
            print(f"{name}: warning: {w.message}", flush=True)
    if args.status:
        with open(args.status, "w") as out:
            out.writelines(f"{name} {state}\n" for name, state in status.items())
    return 0 if status.get("hooks") == "ok" else 3


if __name__ == "__main__":
    sys.exit(main())
