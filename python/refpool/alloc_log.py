"""Reads refpool's allocation log (REFPOOL_CONF=log:PATH, lib/alloc_log.cpp): one CSV row per request
and per release, `Thread,Time,Action,Pointer,Size,Stream` (RMM's replay format), in the order refpool
wrote them; Time is seconds since the epoch, Size the requested bytes."""
import csv
from dataclasses import dataclass

HEADER = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]
_ACTIONS = {"allocate": True, "free": False}


class LogFormatError(ValueError):
    """The file is not a refpool allocation log; the message names the line."""


@dataclass(frozen=True)
class Event:
    thread: int
    time: float
    allocate: bool
    pointer: int
    size: int
    stream: int


def read_log(path):
    """The events of the log at `path`, in file order."""
    events = []
    with open(path, newline="") as file:
        rows = csv.reader(file)
        header = next(rows, None)
        if header != HEADER:
            raise LogFormatError(f"{path}: line 1 is {header!r}, not refpool's log header {','.join(HEADER)}")
        for line, row in enumerate(rows, start=2):
            if not row:
                continue
            try:
                thread, time, action, pointer, size, stream = row
                events.append(Event(int(thread), float(time), _ACTIONS[action], int(pointer, 0), int(size),
                                    int(stream, 0)))
            except (ValueError, KeyError) as e:
                raise LogFormatError(f"{path}:{line}: cannot read {row!r} ({e!r})") from None
    return events


def live_bytes(events, stream=None):
    """Bytes requested and not yet released after each event (of one stream, if given)."""
    live, series = 0, []
    for event in events:
        if stream is None or event.stream == stream:
            live += event.size if event.allocate else -event.size
        series.append(live)
    return series


def summary(events):
    """Figures of the whole log: counts, bytes, peak live bytes, live bytes at its end."""
    series = live_bytes(events)
    allocations = [e for e in events if e.allocate]
    return {
        "events": len(events),
        "allocations": len(allocations),
        "frees": len(events) - len(allocations),
        "requested_bytes": sum(e.size for e in allocations),
        "peak_live_bytes": max(series, default=0),
        "live_bytes_at_end": series[-1] if series else 0,
        "threads": len({e.thread for e in events}),
        "streams": len({e.stream for e in events}),
        "seconds": events[-1].time - events[0].time if events else 0.0,
    }
