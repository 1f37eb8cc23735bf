"""The few torch.cuda memory functions install() replaces: those PyTorch's pluggable-allocator hook
cannot serve. With refpool's hooks, empty_cache, set_per_process_memory_fraction and
Tensor.record_stream reach refpool through PyTorch itself and are left alone.

Replaced (in torch.cuda and torch.cuda.memory, since torch's functions call each other through
torch.cuda.memory): memory_stats (getDeviceStats is not forwarded; memory_allocated, memory_reserved
and their max_ versions call memory_stats and so report refpool's figures unpatched),
reset_peak_memory_stats (resetPeakStats is not forwarded), _snapshot and memory_snapshot (refpool's
log in PyTorch's format), _record_memory_history and memory_summary (fail saying what to use)."""
from . import _torch_snapshot, _torch_stats
from .errors import FrameworkError

# function name -> key of refpool.torch.LOST_FEATURES
_REFUSED = {"memory_summary": "memory_summary"}
# Refused only without the hooks.
_REFUSED_WITHOUT_HOOKS = {"set_per_process_memory_fraction": "set_per_process_memory_fraction"}


def _refusal(name, feature):
    def refused(*args, **kwargs):
        raise FrameworkError(f"torch.cuda.{name}() is not available with refpool as PyTorch's allocator: "
                             f"{_torch_stats.LOST_FEATURES[feature]}")
    refused.__name__ = name
    return refused


def _snapshot(device=None, *args, **kwargs):
    """refpool.torch.snapshot(), as torch.cuda.memory._snapshot()."""
    return _torch_snapshot.snapshot()


def _memory_snapshot(mempool_id=None):
    return _torch_snapshot.snapshot()["segments"]


def _record_memory_history(enabled="all", *args, **kwargs):
    """History is refpool's allocation log: on (REFPOOL_CONF=log) it is already recorded."""
    if enabled in (None, False) or _torch_snapshot.log_path() is not None:
        return
    raise FrameworkError("torch.cuda.memory._record_memory_history() with refpool as PyTorch's allocator: "
                         f"{_torch_stats.LOST_FEATURES['history']}")


def _record_stream_refused(tensor, stream):
    raise FrameworkError("Tensor.record_stream() is not available with refpool as PyTorch's allocator: "
                         f"{_torch_stats.LOST_FEATURES['record_stream']}")


def patch(torch, hooks):
    """Installs the replacements into torch.cuda and torch.cuda.memory; `hooks`: whether refpool's
    PyTorch hooks are installed (without them more must be replaced or refused)."""
    functions = {
        "memory_stats": _torch_stats.memory_stats,
        "reset_peak_memory_stats": _torch_stats.reset_peak_memory_stats,
        "_snapshot": _snapshot,
        "memory_snapshot": _memory_snapshot,
        "_record_memory_history": _record_memory_history,
    }
    functions.update({name: _refusal(name, feature) for name, feature in _REFUSED.items()})
    if not hooks:
        functions["empty_cache"] = _torch_stats.empty_cache
        functions.update({name: _refusal(name, feature) for name, feature in _REFUSED_WITHOUT_HOOKS.items()})
    for module in (torch.cuda, torch.cuda.memory):
        for name, function in functions.items():
            if hasattr(module, name):
                setattr(module, name, function)
    if not hooks:
        torch.Tensor.record_stream = _record_stream_refused
