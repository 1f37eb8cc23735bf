"""Narrows an illegal address seen in PyTorch's test_caching_allocator_record_stream_oom with refpool
installed (bench/h200/torch_record_stream.sh runs it once per variant, each in a fresh process):
the test's loop (a 160 MiB tensor a round used on a side stream, record_stream, del), then
empty_cache, then what the next test (test_cublas_workspace_explicit_allocation) does first.

argv: conf (REFPOOL_CONF for install, '-' for none; 'torch' for PyTorch's own allocator), then flags:
  sync_each   synchronise after every round (else only after each stage)
  no_record   no record_stream
  no_empty    no empty_cache
  harness     as PyTorch's TestCase runs it under pytest: the test on a fresh pool stream
              (CudaNonDefaultStream), no synchronisation anywhere (common_utils synchronises after a
              test only under unittest), the default stream back at the end, then the next test's
              setUp (manual_seed), a new pool stream, randn(7, 7) and a cuBLAS matmul
  sync_loop   with harness: synchronise after the loop, before empty_cache (a fault that then goes
              away needed the side stream's work in flight when empty_cache ran)
  sync_empty  with harness: synchronise right after empty_cache ("FAULT after empty_cache": it freed
              or unmapped memory under that work; no fault: the work was hit later, by the next
              test's requests; the fault still at randn: the next test's own memory is bad)
  probe       says, without waiting, whether the side stream still has work after the loop and
              after empty_cache, and what empty_cache gave back (refpool's segment_trims)
Two checks of the waits themselves, instead of the test:
  decommit_waits  the side stream sleeps ~0.5 s; empty_cache must decommit a freed 256 MiB tensor,
                  which waits for the device first: the side stream must be idle when it returns
  ctx_sync        the side stream sleeps ~0.5 s; cuCtxSynchronize (libcuda, the call refpool makes
                  before unmapping) must leave it idle
Prints one line per stage; 'FAULT after <stage>: <error>' names the first stage that faulted."""
import ctypes
import sys
import time

import torch

conf = sys.argv[1]
flags = set(sys.argv[2:])
if conf != "torch":
    import refpool.torch
    refpool.torch.install(conf=None if conf == "-" else conf)


def sync(stage):
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the first line names the CUDA error
        print(f"FAULT after {stage}: {str(e).splitlines()[0]}")
        sys.exit(1)


def trims():
    return torch.cuda.memory_stats().get("refpool.segment_trims", -1)


def sleep_ms(ms):
    torch.cuda._sleep(int(ms * 2_000_000))  # ~2 GHz SM clock on H100/H200: cycles per ms, roughly


def check_decommit_waits(side):
    big = torch.empty(64 * 1024 * 1024, device="cuda")  # 256 MiB, its own commit at the tail
    del big  # idle: empty_cache gives it back and decommits it
    sync("setup")
    with torch.cuda.stream(side):
        sleep_ms(500)
    before, start = trims(), time.monotonic()
    torch.cuda.empty_cache()
    took = time.monotonic() - start
    idle = side.query()
    print(f"decommit_waits: empty_cache took {took * 1000:.0f} ms, segment_trims +{trims() - before}, "
          f"side stream idle after it: {idle}")
    if trims() == before:
        print("decommit_waits: INCONCLUSIVE: empty_cache decommitted nothing")
    else:
        print("decommit_waits:", "OK (the decommit waited for the device)" if idle
              else "BROKEN: memory was unmapped while another stream's work was in flight")
    sync("decommit_waits")


def check_ctx_sync(side):
    libcuda = ctypes.CDLL("libcuda.so.1")
    with torch.cuda.stream(side):
        sleep_ms(500)
    start = time.monotonic()
    code = libcuda.cuCtxSynchronize()
    took = time.monotonic() - start
    idle = side.query()
    print(f"ctx_sync: cuCtxSynchronize returned {code} after {took * 1000:.0f} ms, side stream idle: {idle}")
    print("ctx_sync:", "OK" if idle else "BROKEN: cuCtxSynchronize does not wait for PyTorch's streams")
    sync("ctx_sync")


side = torch.cuda.Stream()
if "decommit_waits" in flags:
    check_decommit_waits(side)
    sys.exit(0)
if "ctx_sync" in flags:
    check_ctx_sync(side)
    sys.exit(0)

harness = "harness" in flags
default = torch.cuda.current_stream()
if harness:  # CudaNonDefaultStream.__enter__
    test_stream = torch.cuda.Stream()
    default.synchronize()
    torch.cuda.set_stream(test_stream)
    side = torch.cuda.Stream()
with torch.cuda.stream(side):
    y = torch.zeros(40 * 1024 * 1024, device="cuda")
if not harness:
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
if "probe" in flags:
    print(f"probe: after the loop, side stream idle: {side.query()}")
if not harness or "sync_loop" in flags:
    sync("the loop")
if "no_empty" not in flags:
    before, start = trims(), time.monotonic()
    torch.cuda.empty_cache()
    if "probe" in flags:
        print(f"probe: empty_cache took {(time.monotonic() - start) * 1000:.0f} ms, segment_trims "
              f"+{trims() - before}, side stream idle after it: {side.query()}")
    if not harness or "sync_empty" in flags:
        sync("empty_cache")
if harness:  # the test returns (y freed), CudaNonDefaultStream.__exit__, the next test's setUp
    del y
    torch.cuda.set_stream(default)
    torch.manual_seed(0)
    next_stream = torch.cuda.Stream()
    default.synchronize()
    torch.cuda.set_stream(next_stream)
    if "probe" in flags:
        print(f"probe: at the next test's start, side stream idle: {side.query()}")
a = torch.randn(7, 7, device="cuda")
if "probe" in flags:
    print(f"probe: randn(7, 7) at {a.data_ptr():#x}")
sync("randn(7, 7)")
b = torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")
sync("a matmul")
stats = torch.cuda.memory_stats()
print("OK", {k: v for k, v in stats.items() if k in ("num_alloc_retries", "reserved_bytes.all.peak",
                                                      "refpool.segment_trims", "refpool.cross_stream_reuses")})
