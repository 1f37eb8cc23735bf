"""torch.cuda.memory._record_memory_history() for refpool as PyTorch's allocator: the arguments
PyTorch takes, checked as PyTorch checks them, turned into the history library's settings
(_torch_history.cpp). While recording, that library observes every request through the hooks;
when recording stops it is removed from them and forgets what it recorded, so nothing is paid."""
import json
import sys

from .errors import FrameworkError

# PyTorch's RecordContext, by _record_memory_history's `context` argument.
WHEN = {None: 0, "state": 1, "alloc": 2, "all": 3}
# The actions the history library records, in its bit order (_torch_history.cpp's `action`).
ACTIONS = ("alloc", "free_requested", "free_completed", "oom", "segment_free")
# Every action PyTorch names in skip_actions (those refpool never records are accepted and ignored).
TORCH_ACTIONS = set(ACTIONS) | {"segment_alloc", "segment_map", "segment_unmap", "snapshot", "user_defined"}


class Settings:
    """What _record_memory_history asks, checked: enabled (None, "state", "all"), when frames are
    gathered, C++ frames or not, the trace's length, the actions to skip (a bit set)."""

    def __init__(self, enabled="all", context="all", stacks="all", max_entries=sys.maxsize, clear_history=False,
                 skip_actions=None):
        _check("enabled", enabled, (None, "state", "all"))
        _check("context", context, (None, "state", "alloc", "all"))
        _check("stacks", stacks, ("python", "all"))
        unknown = sorted(set(skip_actions or ()) - TORCH_ACTIONS)
        if unknown:
            raise ValueError(f"skip_actions has {', '.join(unknown)}; allowed: {', '.join(sorted(TORCH_ACTIONS))}")
        self.enabled = enabled
        self.when = WHEN[context] if enabled is not None else 0
        self.cpp = enabled is not None and context is not None and stacks == "all"
        # As PyTorch: "state" keeps the live allocations' frames and a trace of one entry.
        self.max_entries = max(1, min(int(max_entries), 2**63 - 1)) if enabled == "all" else 1
        self.skip = sum(1 << ACTIONS.index(a) for a in set(skip_actions or ()) if a in ACTIONS)
        self.clear = bool(clear_history) or enabled is None

    @classmethod
    def legacy(cls, enabled, record_context=True, trace_alloc_max_entries=1, trace_alloc_record_context=False,
               device=None, record_context_cpp=False, clear_history=False, **_ignored):
        """The boolean form PyTorch still accepts (_record_memory_history_legacy)."""
        if not enabled:
            return cls(None)
        context = "all" if trace_alloc_record_context else ("state" if record_context else None)
        return cls("all" if trace_alloc_max_entries > 1 else "state", context,
                   "all" if record_context_cpp else "python", trace_alloc_max_entries, clear_history)


def _check(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name} has to be one of {', '.join(repr(a) for a in allowed)}, not {value!r}")


class History:
    """The history library and the hooks it observes: start, stop, read."""

    def __init__(self, hooks, library):
        self.hooks = hooks
        self.library = library
        self.recording = False

    def apply(self, settings):
        self.library.refpool_torch_history_configure(settings.when, int(settings.cpp), settings.max_entries,
                                                     settings.skip, int(settings.clear))
        tracker = self.library.refpool_torch_history_tracker() if settings.enabled is not None else None
        self.hooks.refpool_torch_hooks_set_tracker(tracker)
        self.recording = settings.enabled is not None

    def set_metadata(self, text):
        self.library.refpool_torch_history_set_metadata(str(text).encode())

    def dump(self):
        """{"trace": [...], "live": [...]} as recorded, frames symbolized."""
        import ctypes
        raw = self.library.refpool_torch_history_dump()
        if not raw:
            raise FrameworkError("refpool.torch: the memory history could not be read (see the message above)")
        try:
            return json.loads(ctypes.string_at(raw).decode("utf-8", "replace"))
        finally:
            self.library.refpool_torch_history_free(raw)
