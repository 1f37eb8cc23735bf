"""A memory snapshot in PyTorch's format (torch.cuda.memory._snapshot()) from refpool's allocation
log, so torch.cuda._memory_viz and the memory_viz page render a refpool run.

What it holds: `device_traces` has every allocation and free users made ("alloc", then
"free_requested" and "free_completed" together: refpool makes a freed block reusable at once, stream
order permitting), with times; `segments` has the allocations live now, one segment of one
"active_allocated" block each (the log does not see idle or segment-free bytes, so reserved memory
is not drawn). Needs the log on from the process's start: REFPOOL_CONF=log:PATH."""
import os

from .alloc_log import read_log
from .errors import FrameworkError

LARGE = 1 << 20  # PyTorch's small/large segment boundary, for segment_type


def log_path(conf=None):
    """The allocation log REFPOOL_CONF names, or None."""
    conf = os.environ.get("REFPOOL_CONF", "") if conf is None else conf
    for item in conf.split(","):
        key, _, value = item.partition(":")
        if key.strip() == "log" and value:
            return value
    return None


def snapshot(path=None, device=0):
    """The snapshot dict ("segments", "device_traces") of the log at `path` (default: REFPOOL_CONF's).
    The log has no device column: every entry is put under `device`."""
    path = path or log_path()
    if path is None:
        raise FrameworkError("refpool.torch.snapshot() reads refpool's allocation log, which is off: set "
                             "REFPOOL_CONF=log:PATH before the process's first allocation")
    live, trace = {}, []
    for event in read_log(path):
        entry = {"addr": event.pointer, "size": event.size, "stream": event.stream, "frames": [],
                 "time_us": int(event.time * 1e6), "device": device}
        if event.allocate:
            live[event.pointer] = event
            trace.append(dict(entry, action="alloc"))
        else:
            live.pop(event.pointer, None)
            trace.append(dict(entry, action="free_requested"))
            trace.append(dict(entry, action="free_completed"))
    segments = [_segment(event, device) for _, event in sorted(live.items())]
    traces = [[] for _ in range(device + 1)]
    traces[device] = trace
    return {"segments": segments, "device_traces": traces, "allocator_settings": {"allocator": "refpool"}}


def _segment(event, device):
    block = {"address": event.pointer, "size": event.size, "requested_size": event.size, "state": "active_allocated",
             "frames": []}
    return {"device": device, "address": event.pointer, "total_size": event.size, "allocated_size": event.size,
            "active_size": event.size, "requested_size": event.size, "stream": event.stream,
            "segment_type": "large" if event.size > LARGE else "small", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": [block]}
