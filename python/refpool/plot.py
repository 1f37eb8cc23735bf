"""python3 -m refpool.plot LOG.csv OUT.png [--stats STATS.json] [--title TEXT]

Draws memory over time from refpool's allocation log (REFPOOL_CONF=log:LOG.csv): live bytes (the
bytes requested and not yet released), per stream where there are several, and the bytes held from
the driver (blocks, segments, plan arenas) at each sample of a stats file (refpool.StatsRecorder, or
one `cache.stats()` dict as JSON), above a table of the log's figures and the cache's counters. Needs matplotlib (Agg, no display)."""
import argparse
import importlib.util
import json
import sys

from .alloc_log import LogFormatError, live_bytes, read_log, summary

_MIB = 1024 * 1024
# Counters shown in the table when a stats file is given (those the library has).
_TABLE_COUNTERS = ["hits", "misses", "backend_allocations", "backend_frees", "uncached_allocations", "escapes",
                   "live_bytes", "peak_live_bytes", "held_bytes", "peak_held_bytes", "reserved_bytes",
                   "segment_bytes", "segment_free_bytes", "segment_grows", "plan_hits", "plan_misses",
                   "plan_recordings", "arena_bytes", "planned_peak_live_bytes", "oom_retries", "ooms"]


def read_stats(path):
    """The samples of a stats file: [{"time": t or None, "label": ..., "stats": {...}}, ...]."""
    with open(path) as file:
        data = json.load(file)
    if isinstance(data, dict) and data.get("format") == "refpool-stats":
        return data["samples"]
    if isinstance(data, dict) and all(isinstance(v, int) for v in data.values()):
        return [{"time": None, "label": None, "stats": data}]
    raise ValueError(f"{path} is neither refpool.StatsRecorder output nor a dict of counters")


def _bytes(value):
    return f"{value / _MIB:,.2f} MiB" if value >= _MIB else f"{value:,} B"


def _table_rows(log_summary, samples):
    rows = [
        ("log: requests / releases", f"{log_summary['allocations']:,} / {log_summary['frees']:,}"),
        ("log: bytes requested", _bytes(log_summary["requested_bytes"])),
        ("log: peak live", _bytes(log_summary["peak_live_bytes"])),
        ("log: live at end", _bytes(log_summary["live_bytes_at_end"])),
        ("log: threads / streams", f"{log_summary['threads']} / {log_summary['streams']}"),
        ("log: duration", f"{log_summary['seconds']:.3f} s"),
    ]
    if samples:
        stats = samples[-1]["stats"]
        for name in _TABLE_COUNTERS:
            if name in stats:
                value = stats[name]
                rows.append((f"cache: {name}", _bytes(value) if name.endswith("bytes") else f"{value:,}"))
        if stats.get("hits", 0) + stats.get("misses", 0):
            rows.append(("cache: hit rate", f"{stats['hits'] / (stats['hits'] + stats['misses']):.1%}"))
    return rows


def draw(log_path, out_path, stats_path=None, title=None):
    """Writes the picture of `log_path` (and `stats_path`) to `out_path`; returns the log's summary."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = read_log(log_path)
    log_summary = summary(events)
    samples = read_stats(stats_path) if stats_path else []
    start = events[0].time if events else 0.0
    times = [e.time - start for e in events]

    rows = _table_rows(log_summary, samples)
    figure, (memory, table) = plt.subplots(2, 1, figsize=(10, 5 + 0.22 * len(rows)),
                                           gridspec_kw={"height_ratios": [3, 0.35 * len(rows) / 3 + 0.6]})
    memory.step(times, [v / _MIB for v in live_bytes(events)], where="post", label="live (requested, not released)")
    streams = sorted({e.stream for e in events})
    if 1 < len(streams) <= 8:
        for stream in streams:
            memory.step(times, [v / _MIB for v in live_bytes(events, stream)], where="post", linewidth=0.8,
                        label=f"live on stream {stream:#x}")
    timed = [s for s in samples if s.get("time") is not None and "held_bytes" in s["stats"]]
    if timed:
        # Everything held from the driver (blocks, free bytes of segments, plan arenas, uncached
        # buffers) where the library reports it; older stats files have the cache's blocks only.
        held = "reserved_bytes" if all("reserved_bytes" in s["stats"] for s in timed) else "held_bytes"
        label = ("held from the driver: blocks, segments, plan arenas" if held == "reserved_bytes"
                 else "held by the cache")
        memory.step([s["time"] - start for s in timed], [s["stats"][held] / _MIB for s in timed],
                    where="post", marker=".", label=f"{label} (at stats samples)")
    peak = log_summary["peak_live_bytes"]
    memory.axhline(peak / _MIB, color="grey", linestyle=":", linewidth=0.8, label=f"peak live {_bytes(peak)}")
    memory.set_xlabel("seconds since the first request")
    memory.set_ylabel("MiB")
    memory.set_title(title or f"refpool memory over time: {log_path}")
    memory.grid(True, alpha=0.3)
    memory.legend(loc="upper left", fontsize="small")

    table.axis("off")
    cells = table.table(cellText=[[name, value] for name, value in rows], colLabels=["figure", "value"],
                        loc="center", cellLoc="left", colWidths=[0.45, 0.35])
    cells.auto_set_font_size(False)
    cells.set_fontsize(8)
    figure.tight_layout()
    figure.savefig(out_path, dpi=110)
    plt.close(figure)
    return log_summary


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m refpool.plot", description=__doc__.split("\n\n")[1])
    parser.add_argument("log", help="allocation log written with REFPOOL_CONF=log:PATH")
    parser.add_argument("out", help="picture to write (PNG, or any format matplotlib writes)")
    parser.add_argument("--stats", help="stats JSON: refpool.StatsRecorder.write(), or json of cache.stats()")
    parser.add_argument("--title", help="title of the memory plot")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:
        print("refpool.plot needs matplotlib (Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return 2
    try:
        figures = draw(args.log, args.out, args.stats, args.title)
    except (OSError, LogFormatError, ValueError) as e:
        print(f"refpool.plot: {e}", file=sys.stderr)
        return 1
    print(f"{args.out}: {figures['allocations']} requests, peak live {_bytes(figures['peak_live_bytes'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
