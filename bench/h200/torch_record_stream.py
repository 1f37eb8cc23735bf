"""Narrows an illegal address seen in PyTorch's test_caching_allocator_record_stream_oom with refpool
installed (bench/h200/torch_record_stream.sh runs it once per variant, each in a fresh process):
the test's loop (a 160 MiB tensor a round used on a side stream, record_stream, del), then
empty_cache, then a small randn, synchronising after each stage to name the stage that faults.
argv: conf (REFPOOL_CONF for install, '-' for none), then flags: sync_each, no_record, no_empty."""
import sys

import torch

import refpool.torch

conf = None if sys.argv[1] == "-" else sys.argv[1]
flags = set(sys.argv[2:])
refpool.torch.install(conf=conf)


def sync(stage):
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the first line names the CUDA error
        print(f"FAULT after {stage}: {str(e).splitlines()[0]}")
        sys.exit(1)


side = torch.cuda.Stream()
with torch.cuda.stream(side):
    y = torch.zeros(40 * 1024 * 1024, device="cuda")
sync("zeros on the side stream")
for i in range(100):
    x = torch.empty(40 * 1024 * 1024, device="cuda")
    with torch.cuda.stream(side):
        y += x
    if "no_record" not in flags:
        x.record_stream(side)
    del x
    if "sync_each" in flags:
        sync(f"round {i}")
sync("the loop")
if "no_empty" not in flags:
    torch.cuda.empty_cache()
    sync("empty_cache")
a = torch.randn(7, 7, device="cuda")
sync("randn(7, 7)")
b = torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")
sync("a matmul")
print("OK", {k: v for k, v in torch.cuda.memory_stats().items() if k in ("num_alloc_retries", "reserved_bytes.all.peak")})
