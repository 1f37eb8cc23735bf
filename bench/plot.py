#!/usr/bin/env python3
"""Turns gpu_bench (and cupy_pool) JSON into PNG plots: ns per pair by allocator and size,
device memory over training iterations, and thread scaling.
Usage: plot.py OUT_DIR gpu_bench.json [cupy_pool.json ...]"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            rows.extend(json.load(f))
    return rows


def hit_path(rows, out):
    rows = [r for r in rows if r["workload"] == "hit_path"]
    allocators = list(dict.fromkeys(r["allocator"] for r in rows))
    sizes = sorted({r["bytes"] for r in rows})
    width = 0.8 / len(allocators)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, name in enumerate(allocators):
        ns = {r["bytes"]: r["ns_per_pair"] for r in rows if r["allocator"] == name}
        xs = [j + i * width for j in range(len(sizes)) if sizes[j] in ns]
        ax.bar(xs, [ns[s] for s in sizes if s in ns], width, label=name)
    ax.set_xticks([j + width * (len(allocators) - 1) / 2 for j in range(len(sizes))])
    ax.set_xticklabels([f"{s:,} B" for s in sizes])
    ax.set_yscale("log")
    ax.set_ylabel("ns per alloc + free pair (log)")
    ax.set_title("Hit path, steady state, one thread")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "hit_path.png"), dpi=110)


def training(rows, out):
    rows = [r for r in rows if r["workload"] == "training"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for r in rows:
        used = [b / 2**20 for b in r["used_bytes_every_100"]]
        ax.plot([100 * (i + 1) for i in range(len(used))], used, label=r["allocator"])
    ax.set_xlabel("iteration")
    ax.set_ylabel("device memory in use above start (MiB)")
    ax.set_title("Training-step trace: device memory over iterations")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "training_memory.png"), dpi=110)


def threads(rows, out):
    rows = [r for r in rows if r["workload"] == "threads"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name in dict.fromkeys(r["allocator"] for r in rows):
        mine = [r for r in rows if r["allocator"] == name]
        ax.plot([r["threads"] for r in mine], [r["pairs_per_second"] / 1e6 for r in mine], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("host threads")
    ax.set_ylabel("million alloc + free pairs per second (log)")
    ax.set_title("Throughput with one scope and stream per thread")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "threads.png"), dpi=110)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rows = load(sys.argv[2:])
    hit_path(rows, out)
    training(rows, out)
    threads(rows, out)


if __name__ == "__main__":
    main()
