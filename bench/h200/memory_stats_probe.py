"""PyTorch's TestCuda::test_memory_stats in refpool's mode, step by step with refpool's memory map
(issue 37: it failed with 2 MiB more reserved after a 1 KiB tensor was freed and empty_cache ran).
Prints the reserved bytes and the small pool's segments at each step, after a warm-up that leaves
small tensors alive as a test process does, and whether a route to a private pool is in force.

    python3 bench/h200/memory_stats_probe.py      (PYTHONPATH=python, REFPOOL_LIBRARY set)"""
import gc
import json

import torch

import refpool._library
import refpool.allocator
import refpool.torch

refpool.torch.install()


def small_segments():
    return [(hex(s.address), s.committed_bytes, [(r.state, r.bytes) for r in s.ranges])
            for s in refpool.allocator.memory_map() if s.pool == "small"]


def step(name):
    return {"step": name, "reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated(),
            "routing": refpool._library.lib().fn("refpool_allocator_routing_to_pools")(),
            "small": small_segments()}


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
