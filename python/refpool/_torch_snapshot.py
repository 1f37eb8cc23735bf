"""A memory snapshot in PyTorch's format (torch.cuda.memory._snapshot()) for refpool as PyTorch's
allocator, so torch.cuda._memory_viz and the memory_viz page render a refpool run.

Where it comes from: the memory history (torch.cuda.memory._record_memory_history(), recorded by
refpool's history library with PyTorch's stack frames), the allocations refpool's private pools
hold (CUDA graph pools, use_mem_pool: always known to the hooks), and, without history, refpool's
allocation log (REFPOOL_CONF=log:PATH). With refpool's memory maps (refpool.memory_map: the framework
allocator's cache and each private pool's), `segments` are refpool's segments: live pieces are
"active_allocated" blocks (with the history's requested size and frames where it has them), idle
pieces and free bytes "inactive" blocks, each idle buffer of a cache without segments a segment of
its own; a live allocation no map lists (a plain buffer: no segments) is a segment of its own, one
"active_allocated" block, as is every allocation where there is no map (the allocation log alone).
A freed block whose free record_stream deferred (history only) is "active_pending_free" until its
streams are done. `device_traces` has the recorded actions per device."""
import bisect
import os

from .alloc_log import read_log
from .errors import FrameworkError

LARGE = 1 << 20  # PyTorch's small/large boundary (kSmallSize), for segment_type
GRANULE = 512  # PyTorch's block granule and refpool's piece unit


def log_path(conf=None):
    """The allocation log REFPOOL_CONF names, or None."""
    conf = os.environ.get("REFPOOL_CONF", "") if conf is None else conf
    for item in conf.split(","):
        key, _, value = item.partition(":")
        if key.strip() == "log" and value:
            return value
    return None


def segment(address, size, device, stream, pool=(0, 0), frames=(), pending_free=False):
    """PyTorch's segment dict for one live allocation of `size` requested bytes (`pending_free`: freed,
    its free deferred by record_stream: active, not allocated)."""
    block_size = -(-size // GRANULE) * GRANULE
    block = {"address": address, "size": block_size, "requested_size": size, "frames": list(frames),
             "state": "active_pending_free" if pending_free else "active_allocated"}
    return {"device": device, "address": address, "total_size": block_size,
            "allocated_size": 0 if pending_free else block_size, "active_size": block_size,
            "requested_size": size, "stream": stream,
            "segment_type": "large" if size > LARGE else "small", "segment_pool_id": tuple(pool),
            "is_expandable": False, "frames": [], "blocks": [block]}


def trace_entry(recorded):
    """PyTorch's trace entry dict from one the history library recorded."""
    entry = {key: recorded[key] for key in ("action", "size", "stream", "time_us", "frames", "user_metadata")}
    entry["addr" if "addr" in recorded else "device_free"] = recorded.get("addr", recorded.get("device_free"))
    entry["compile_context"] = "N/A"  # refpool does not see torch.compile's regions
    return entry


def from_map(mapped, pool, known):
    """PyTorch's segment dicts for `mapped`, a refpool.memory_map.Segment of private pool `pool`
    ((0, 0): the allocator's cache): one per run of contiguous committed bytes (a segment that grows
    through virtual memory may have uncommitted holes where trim gave commits back; PyTorch's
    segments are contiguous). `known`: address -> the per-allocation segment of a live allocation
    (its requested size, frames and stream); those matched are taken out of it."""
    runs = []
    for r in mapped.ranges:
        if not runs or runs[-1][-1].address + runs[-1][-1].bytes != r.address:
            runs.append([])
        runs[-1].append(r)
    large = mapped.pool == "large" or (mapped.pool == "block" and mapped.committed_bytes > LARGE)
    return [_segment_of_run(run, mapped, pool, "large" if large else "small", known) for run in runs]


def _segment_of_run(run, mapped, pool, segment_type, known):
    blocks = []
    allocated = active = requested = 0
    stream = None
    for r in run:
        if r.state not in ("live", "span_held"):  # idle, free, an idle arena: cached bytes
            if blocks and blocks[-1]["state"] == "inactive":  # one block, as PyTorch's free blocks coalesce
                blocks[-1]["size"] += r.bytes
            else:
                blocks.append({"address": r.address, "size": r.bytes, "requested_size": 0, "state": "inactive",
                               "frames": []})
            continue
        record = known.pop(r.address, None)
        inside = [record] if record else []
        if r.state == "span_held":  # a plan's arena: the allocations inside it are its block's
            for address in [a for a in known if r.address <= a < r.address + r.bytes]:
                inside.append(known.pop(address))
        asked = record["requested_size"] if record else r.bytes
        if record and stream is None:
            stream = record["stream"]
        # Pending only where every allocation it holds waits for record_stream's streams.
        pending = inside and all(i["blocks"][0]["state"] == "active_pending_free" for i in inside)
        state = "active_pending_free" if pending else "active_allocated"
        blocks.append({"address": r.address, "size": r.bytes, "requested_size": asked, "state": state,
                       "frames": record["blocks"][0]["frames"] if record else []})
        allocated += r.bytes if state == "active_allocated" else 0
        active += r.bytes
        requested += asked
    return {"device": mapped.device, "address": run[0].address, "total_size": sum(r.bytes for r in run),
            "allocated_size": allocated, "active_size": active, "requested_size": requested,
            "stream": stream or 0, "segment_type": segment_type, "segment_pool_id": tuple(pool),
            "is_expandable": mapped.expandable, "frames": [], "blocks": blocks}


def build(history=None, pool_allocations=(), log_events=None, devices=1, pool=None, log_device=0, maps=None):
    """The snapshot dict. `history`: the history library's dump ({"trace", "live"}) or None;
    `pool_allocations`: (address, size, device, stream, pool first, pool second) of private pools'
    live allocations; `log_events`: refpool's allocation log (alloc_log.read_log), used for what
    history does not cover (it has no device column: put under `log_device`); `pool`: only this
    pool's segments ((first, second)), else all; `maps`: (pool id, [refpool.memory_map.Segment])
    pairs, the allocator cache's under (0, 0), or None: one segment per live allocation."""
    live = {}
    traces = [[] for _ in range(max(devices, 1))]
    for address, size, device, stream, first, second in pool_allocations:
        live[address] = segment(address, size, device, stream, (first, second))
    if history is not None:
        for block in history["live"]:
            known = live.get(block["addr"], {}).get("segment_pool_id", tuple(block["pool"]))
            live[block["addr"]] = segment(block["addr"], block["size"], block["device"], block["stream"], known,
                                          block["frames"], block.get("pending_free", False))
        for recorded in history["trace"]:
            _trace_of(traces, recorded["device"]).append(trace_entry(recorded))
    elif log_events is not None:
        log_live = {}
        log_trace = _trace_of(traces, log_device)
        for event in log_events:
            entry = {"addr": event.pointer, "size": event.size, "stream": event.stream, "frames": [],
                     "time_us": int(event.time * 1e6), "user_metadata": "", "compile_context": "N/A"}
            if event.allocate:
                log_live[event.pointer] = event
                log_trace.append(dict(entry, action="alloc"))
            else:
                log_live.pop(event.pointer, None)
                log_trace.append(dict(entry, action="free_requested"))
                log_trace.append(dict(entry, action="free_completed"))
        for address, event in log_live.items():
            live.setdefault(address, segment(address, event.size, log_device, event.stream))
    mapped = [run for pool_id, segments in (maps or ()) for m in segments for run in from_map(m, pool_id, live)]
    _drop_covered(live, mapped)
    segments = sorted(mapped + list(live.values()), key=lambda s: (s["device"], s["address"]))
    segments = [s for s in segments if pool is None or s["segment_pool_id"] == tuple(pool)]
    return {"segments": segments, "device_traces": traces, "external_annotations": [],
            "allocator_settings": {"allocator": "refpool"}}


def _drop_covered(live, mapped):
    """Takes out of `live` the allocations inside a mapped segment that the map does not list as live:
    freed after the history's dump or the log's last line (the maps are read last), so the map says
    what their bytes are now; kept, each would be a segment overlapping the map's."""
    starts = {}
    for s in mapped:
        starts.setdefault(s["device"], []).append((s["address"], s["address"] + s["total_size"]))
    for runs in starts.values():
        runs.sort()
    for address in list(live):
        runs = starts.get(live[address]["device"], ())
        at = bisect.bisect_right(runs, (address, float("inf"))) - 1
        if at >= 0 and address < runs[at][1]:
            del live[address]


def _trace_of(traces, device):
    while len(traces) <= device:
        traces.append([])
    return traces[device]


def snapshot(path=None, device=0):
    """The snapshot of refpool's allocation log at `path` (default: REFPOOL_CONF's), for use without
    install(): refpool.torch.snapshot()."""
    path = path or log_path()
    if path is None:
        raise FrameworkError("refpool.torch.snapshot() reads refpool's allocation log, which is off: set "
                             "REFPOOL_CONF=log:PATH before the process's first allocation, or install() refpool "
                             "and use torch.cuda.memory._record_memory_history()")
    return build(log_events=read_log(path), devices=device + 1, log_device=device)
