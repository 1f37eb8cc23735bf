"""PyTorch's TestCuda::test_memory_stats in refpool's mode, step by step with refpool's memory map
(issue 37: it failed with 2 MiB more reserved after a 1 KiB tensor was freed and empty_cache ran).
Prints the reserved bytes and the small pool's segments at each step, after a warm-up that leaves
small tensors alive as a test process does, and whether a route to a private pool is in force.

    python3 bench/h200/memory_stats_probe.py      (PYTHONPATH=python, REFPOOL_LIBRARY set)"""
import gc
import json
import os

import torch

import refpool._library
import refpool.allocator
import refpool.torch

refpool.torch.install()


FIELDS = ("reserved_bytes", "held_bytes", "idle_bytes", "segment_bytes", "segment_free_bytes", "arena_bytes",
          "uncached_live_bytes", "segments", "segment_trims", "segment_grows")


def segments():
    return [(s.pool, hex(s.address), s.committed_bytes, [(r.state, r.bytes) for r in s.ranges])
            for s in refpool.allocator.memory_map()]


def step(name):
    stats = refpool.allocator.stats()
    return {"step": name, "reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated(),
            "accelerator_reserved": torch.accelerator.memory_reserved(),
            "routing": refpool._library.lib().fn("refpool_allocator_routing_to_pools")(),
            "stats": {k: stats.get(k) for k in FIELDS}, "segments": segments()}


# FRESH=1: nothing allocated before (PyTorch's test alone in its process); else small tensors stay
# alive, as in a process that ran other tests first.
if os.environ.get("FRESH") != "1":
    keep = [torch.randn(n, device="cuda") for n in (64, 300, 1000, 5000, 20000, 60000) for _ in range(7)]
    del keep[::2]
out = []
gc.collect()
torch.cuda.empty_cache()
out.append(step("after empty_cache"))
tmp = torch.randn(256, device="cuda")
out.append(step("1 KiB live"))
del tmp
gc.collect()
torch.cuda.empty_cache()
out.append(step("freed, empty_cache"))
print(json.dumps(out, indent=1))
print("reserved back:", out[0]["reserved"] == out[2]["reserved"])
