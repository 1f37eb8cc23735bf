"""Replays PyTorch's two CUDA-graph capture tests that failed with refpool installed (issue 37,
docs/frameworks.md "CUDA graphs"), each in one process, then checks that the process is still
usable (a stream left capturing makes every later CUDA call fail):
  error_options    during a capture on stream S (capture_error_mode thread_local, then relaxed),
                   another thread allocates 1 KiB on a fresh stream and frees it; the capture must
                   succeed (test_cuda_graph_error_options)
  reset_recapture  capture 10 additions on a side stream, replay, reset, capture again over the
                   same output, replay (test_graph_capture_reset_recapture)
argv: conf (REFPOOL_CONF for install, '-' for install with the defaults, 'torch' for PyTorch's own
allocator), then the cases to run (default: both, in this order, in this process).
Prints 'OK <case>' or 'FAIL <case>: <why>' per case, refpool's cross-stream reuses and uncached
allocations (a piece refused across a capture is served uncached), and at the end
'process usable' or 'process POISONED: <error>'."""
import sys
import threading

import torch

conf = sys.argv[1]
cases = sys.argv[2:] or ["error_options", "reset_recapture"]
if conf != "torch":
    import refpool.torch

    refpool.torch.install(conf=None if conf == "-" else conf)


def work():
    x = torch.zeros([2000], device="cuda")
    return x + x + x


def capture_with_foreign_alloc(mode):
    """None if the capture held, else the first line of its error."""
    outcome = {}

    def allocate_elsewhere():  # another thread, another stream, during the capture
        side = torch.cuda.Stream()
        try:
            with torch.cuda.stream(side):
                ptr = torch.cuda.caching_allocator_alloc(1024)
            torch.cuda.caching_allocator_delete(ptr)
        except BaseException as e:  # noqa: B036 - reported, as the test tolerates it
            outcome["thread"] = str(e).splitlines()[0]

    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        work()
    stream.synchronize()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    try:
        with torch.cuda.graph(graph, stream=stream, capture_error_mode=mode):
            work()
            t = threading.Thread(target=allocate_elsewhere)
            t.start()
            t.join()
    except Exception as e:  # noqa: BLE001 - the first line names the CUDA error
        return str(e).splitlines()[0]
    if "thread" in outcome:
        print(f"  ({mode}: the other thread's allocation raised: {outcome['thread']})")
    return None


def error_options():
    for mode in ("thread_local", "relaxed"):
        failed = capture_with_foreign_alloc(mode)
        if failed is not None:
            return f"capture_error_mode={mode}: the capture failed: {failed}"
    return None


def reset_recapture():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.full((1000,), 1, device="cuda")
        g = torch.cuda.CUDAGraph()
        torch.cuda.empty_cache()
        g.capture_begin()
        b = a
        for _ in range(10):
            b = b + 1
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    if b.sum().item() != 11000.0:
        return f"first replay: sum {b.sum().item()}, expected 11000"
    g.reset()
    with torch.cuda.stream(s):
        g.capture_begin()
        b.fill_(2.0)
        for _ in range(10):
            b = b + 2
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    if b.sum().item() != 22000.0:
        return f"second replay: sum {b.sum().item()}, expected 22000"
    g.reset()
    return None


for case in cases:
    try:
        why = {"error_options": error_options, "reset_recapture": reset_recapture}[case]()
    except Exception as e:  # noqa: BLE001
        why = "raised " + str(e).splitlines()[0]
    print(f"OK {case}" if why is None else f"FAIL {case}: {why}")
if conf != "torch":
    stats = torch.cuda.memory_stats()
    print("refpool cross-stream reuses:", stats.get("refpool.cross_stream_reuses", "n/a"),
          "uncached allocations:", stats.get("refpool.uncached_allocations", "n/a"))
try:
    torch.cuda.synchronize()
    torch.randn(7, 7, device="cuda").sum().item()
    print("process usable")
except Exception as e:  # noqa: BLE001
    print(f"process POISONED: {str(e).splitlines()[0]}")
