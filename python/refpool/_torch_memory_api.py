"""torch.cuda's memory functions once refpool is PyTorch's allocator: those with a refpool meaning
report refpool's figures, the others fail with a message saying what is lost and what to use instead.

Without this, PyTorch's hook fails in memory_stats() with "CUDAPluggableAllocator does not yet support
getDeviceStats", and silently does nothing in empty_cache(), set_per_process_memory_fraction() and
Tensor.record_stream(). Both torch.cuda and torch.cuda.memory are patched, since torch's own functions
call each other through torch.cuda.memory."""
from . import torch as adapter
from .errors import FrameworkError

_REPLACED = {
    "memory_stats": adapter.memory_stats,
    "memory_allocated": adapter.memory_allocated,
    "max_memory_allocated": adapter.max_memory_allocated,
    "memory_reserved": adapter.memory_reserved,
    "max_memory_reserved": adapter.max_memory_reserved,
    "memory_cached": adapter.memory_reserved,
    "max_memory_cached": adapter.max_memory_reserved,
    "reset_peak_memory_stats": adapter.reset_peak_memory_stats,
    "reset_max_memory_allocated": adapter.reset_peak_memory_stats,
    "reset_max_memory_cached": adapter.reset_peak_memory_stats,
    "empty_cache": adapter.empty_cache,
}

# function name -> key of refpool.torch.LOST_FEATURES
_REFUSED = {
    "memory_snapshot": "snapshots",
    "_snapshot": "snapshots",
    "_dump_snapshot": "snapshots",
    "_record_memory_history": "snapshots",
    "memory_summary": "memory_summary",
    "set_per_process_memory_fraction": "set_per_process_memory_fraction",
}


def _refusal(name, feature):
    def refused(*args, **kwargs):
        raise FrameworkError(f"torch.cuda.{name}() is not available with refpool as PyTorch's allocator: "
                             f"{adapter.LOST_FEATURES[feature]}")
    refused.__name__ = name
    return refused


def _record_stream_refused(tensor, stream):
    raise FrameworkError(f"Tensor.record_stream() is not available with refpool as PyTorch's allocator: "
                         f"{adapter.LOST_FEATURES['record_stream']}")


def patch(torch):
    """Installs the replacements and refusals into torch.cuda and torch.cuda.memory."""
    functions = dict(_REPLACED)
    functions.update({name: _refusal(name, feature) for name, feature in _REFUSED.items()})
    for module in (torch.cuda, torch.cuda.memory):
        for name, function in functions.items():
            if hasattr(module, name):
                setattr(module, name, function)
    torch.Tensor.record_stream = _record_stream_refused
