"""The private-pool calls CUDA graph trees (torch.compile(mode="reduce-overhead")) make of the
allocator, for refpool as PyTorch's allocator: torch._C._cuda_checkPoolLiveAllocations,
_cuda_getCheckpointState and _cuda_setCheckpointPoolState. PyTorch's pluggable-allocator interface
forwards none of them (torch/csrc/cuda/CUDAPluggableAllocator.cpp: getCheckpointState and
setCheckpointPoolState are TORCH_CHECK(false, ...), checkPoolLiveAllocations is the base class's
TORCH_CHECK(false, ...) in c10/cuda/CUDACachingAllocator.h), so install() puts these in torch._C.

refpool's hooks know every live allocation of each private pool (_torch_hooks_pools.cpp), so the
liveness check is exact and a checkpoint is the set of live allocations. A restore does what
PyTorch's does (torch/csrc/cuda/Module.cpp, _cuda_setCheckpointPoolState): the stale storages'
allocations are freed, the checkpoint's allocations freed since are allocated again at their
addresses (refpool_allocator_pool_take: the bytes are still the pool's, idle), and the storages to
add deleters to that refer to a checkpoint allocation own it from then on."""
import ctypes

from .errors import FrameworkError

MESSAGE_BYTES = 1024


class PoolCheckpoint:
    """What torch._C._cuda_getCheckpointState returns under refpool: the pool's live allocations."""

    def __init__(self, device, pool, live, streams=None):
        self.device = device
        self.pool = tuple(pool)
        self.live = dict(live)  # address -> bytes requested
        self.streams = dict(streams or {})  # address -> the stream it was allocated for

    def __repr__(self):
        return f"PoolCheckpoint(device={self.device}, pool={self.pool}, live allocations={len(self.live)})"


class PoolCalls:
    """The three calls, over `pool_allocations()` (rows of address, size, device, stream, pool first,
    pool second), `free_storage(cdata)` (torch._C._free_And_Remove_DeleterFn), and the hooks' calls
    `restore(device, pool, address, size, stream)` (allocates those bytes of the pool again; raises
    FrameworkError saying why it cannot), `storage_pointer(cdata)` and `adopt_storage(cdata, device)`
    (the storage owns its memory from then on)."""

    def __init__(self, pool_allocations, free_storage, restore=None, storage_pointer=None, adopt_storage=None):
        self.pool_allocations = pool_allocations
        self.free_storage = free_storage
        self.restore = restore
        self.storage_pointer = storage_pointer
        self.adopt_storage = adopt_storage

    def rows(self, device, pool):
        pool = tuple(pool)
        return [row for row in self.pool_allocations() if row[2] == device and tuple(row[4:6]) == pool]

    def live(self, device, pool):
        return {row[0]: row[1] for row in self.rows(device, pool)}

    def check_pool_live_allocations(self, device, pool, expected_live_allocations):
        """True when the pool's live allocations are exactly these addresses."""
        return set(self.live(device, pool)) == set(expected_live_allocations)

    def get_checkpoint_state(self, device, pool):
        rows = self.rows(device, pool)
        return PoolCheckpoint(device, pool, {r[0]: r[1] for r in rows}, {r[0]: r[3] for r in rows})

    def set_checkpoint_pool_state(self, device, state, stale_storages=(), storages_to_add_deleters_to=()):
        """Makes the pool's live allocations those of `state`: allocations made since are freed through
        their storages, which must be among `stale_storages` (storage _cdata values), as PyTorch
        requires; allocations of `state` freed since are allocated again at their addresses; each of
        `storages_to_add_deleters_to` that refers to an allocation of `state` owns it from then on."""
        if not isinstance(state, PoolCheckpoint):
            raise TypeError(f"refpool.torch: {state!r} is not a checkpoint of refpool's private pools")
        stale = list(dict.fromkeys(stale_storages))
        extra = set(self.live(device, state.pool)) - set(state.live)
        if len(extra) > len(stale):
            raise RuntimeError("Any stale tensors which are being manually freed must be passed to set checkpoint "
                               f"(refpool.torch: {len(extra)} allocation(s) of pool {state.pool} were made after "
                               f"the checkpoint, {len(stale)} stale storage(s) given)")
        for cdata in stale:
            self.free_storage(cdata)
        now = self.live(device, state.pool)
        if set(now) - set(state.live):
            raise FrameworkError(f"refpool.torch: after freeing the stale storages, pool {state.pool} still holds "
                                 f"{len(set(now) - set(state.live))} allocation(s) made after the checkpoint: a stale "
                                 "storage was not one of them")
        for address, size in sorted(state.live.items()):
            if address in now:
                if now[address] != size:
                    raise FrameworkError(f"refpool.torch: pool {state.pool} holds {now[address]} B at {address:#x}, "
                                         f"the checkpoint {size} B")
                continue
            if self.restore is None:
                raise FrameworkError("refpool.torch: restoring a checkpoint needs refpool's PyTorch hooks")
            self.restore(device, state.pool, address, size, state.streams.get(address, 0))
        for cdata in dict.fromkeys(storages_to_add_deleters_to):
            if self.storage_pointer(cdata) in state.live:
                self.adopt_storage(cdata, device)


def hook_calls(hooks):
    """restore, storage_pointer and adopt_storage over the hooks' CDLL, raising with their message."""
    def restore(device, pool, address, size, stream):
        message = ctypes.create_string_buffer(MESSAGE_BYTES)
        if hooks.refpool_torch_hooks_restore(device, pool[0], pool[1], address, size, stream or None, message,
                                             MESSAGE_BYTES) != 0:
            reason = message.value.decode(errors="replace")
            raise FrameworkError(f"refpool.torch: setCheckpointPoolState could not allocate again the {size} B at "
                                 f"{address:#x} of private pool {tuple(pool)}: {reason}")

    def storage_pointer(cdata):
        return hooks.refpool_torch_hooks_storage_pointer(cdata) or 0

    def adopt_storage(cdata, device):
        message = ctypes.create_string_buffer(MESSAGE_BYTES)
        if hooks.refpool_torch_hooks_adopt_storage(cdata, device, message, MESSAGE_BYTES) != 0:
            raise RuntimeError(message.value.decode(errors="replace"))

    return restore, storage_pointer, adopt_storage
