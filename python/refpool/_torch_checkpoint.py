"""The private-pool calls CUDA graph trees (torch.compile(mode="reduce-overhead")) make of the
allocator, for refpool as PyTorch's allocator: torch._C._cuda_checkPoolLiveAllocations,
_cuda_getCheckpointState and _cuda_setCheckpointPoolState. PyTorch's pluggable-allocator interface
forwards none of them (torch/csrc/cuda/CUDAPluggableAllocator.cpp: getCheckpointState and
setCheckpointPoolState are TORCH_CHECK(false, ...), checkPoolLiveAllocations is the base class's
TORCH_CHECK(false, ...) in c10/cuda/CUDACachingAllocator.h), so install() puts these in torch._C.

refpool's hooks know every live allocation of each private pool (_torch_hooks_pools.cpp), so the
liveness check is exact and a checkpoint is the set of live allocations. Restoring one is done when
it only needs allocations made after the checkpoint freed (their storages passed as stale, as
PyTorch requires); one that needs freed blocks back at their old addresses cannot be done from
outside refpool's pools, and fails saying what works instead."""
from .errors import FrameworkError

REFUSED = (
    "refpool.torch: CUDA graph trees (torch.compile(mode='reduce-overhead')) asked to restore private pool {pool} "
    "to a checkpoint in which {count} allocation(s) freed since were live. PyTorch's caching allocator re-allocates "
    "those exact blocks there (CUDACachingAllocator::setCheckpointPoolState); PyTorch's pluggable-allocator "
    "interface does not forward that call (torch/csrc/cuda/CUDAPluggableAllocator.cpp, "
    "CUDAPluggableAllocator::setCheckpointPoolState: TORCH_CHECK(false, ...)) and refpool's pools cannot give a "
    "freed block back at its address. What works: refpool for chosen regions with refpool.torch.mem_pool() and "
    "PyTorch's own allocator (and graph trees) for the rest, or torch._inductor.config.triton.cudagraph_trees = "
    "False, which captures with torch.cuda.graph into refpool's private pools")


class PoolCheckpoint:
    """What torch._C._cuda_getCheckpointState returns under refpool: the pool's live allocations."""

    def __init__(self, device, pool, live):
        self.device = device
        self.pool = tuple(pool)
        self.live = dict(live)  # address -> bytes requested

    def __repr__(self):
        return f"PoolCheckpoint(device={self.device}, pool={self.pool}, live allocations={len(self.live)})"


class PoolCalls:
    """The three calls, over `pool_allocations()` (rows of address, size, device, stream, pool first,
    pool second) and `free_storage(cdata)` (torch._C._free_And_Remove_DeleterFn)."""

    def __init__(self, pool_allocations, free_storage):
        self.pool_allocations = pool_allocations
        self.free_storage = free_storage

    def live(self, device, pool):
        pool = tuple(pool)
        return {row[0]: row[1] for row in self.pool_allocations() if row[2] == device and tuple(row[4:6]) == pool}

    def check_pool_live_allocations(self, device, pool, expected_live_allocations):
        """True when the pool's live allocations are exactly these addresses."""
        return set(self.live(device, pool)) == set(expected_live_allocations)

    def get_checkpoint_state(self, device, pool):
        return PoolCheckpoint(device, pool, self.live(device, pool))

    def set_checkpoint_pool_state(self, device, state, stale_storages=(), storages_to_add_deleters_to=()):
        """Makes the pool's live allocations those of `state`: allocations made since are freed through
        their storages, which must be among `stale_storages` (storage _cdata values), as PyTorch
        requires; `storages_to_add_deleters_to` get nothing, since no block is re-allocated."""
        if not isinstance(state, PoolCheckpoint):
            raise TypeError(f"refpool.torch: {state!r} is not a checkpoint of refpool's private pools")
        now = self.live(device, state.pool)
        lost = [address for address, size in state.live.items() if now.get(address) != size]
        if lost:
            raise FrameworkError(REFUSED.format(pool=state.pool, count=len(lost)))
        extra = set(now) - set(state.live)
        if len(extra) > len(set(stale_storages)):
            raise RuntimeError("Any stale tensors which are being manually freed must be passed to set checkpoint "
                               f"(refpool.torch: {len(extra)} allocation(s) of pool {state.pool} were made after "
                               f"the checkpoint, {len(set(stale_storages))} stale storage(s) given)")
        for cdata in dict.fromkeys(stale_storages):
            self.free_storage(cdata)
        after = self.live(device, state.pool)
        if set(after) != set(state.live):
            raise FrameworkError(f"refpool.torch: after freeing the stale storages, pool {state.pool} holds "
                                 f"{len(after)} allocation(s), the checkpoint {len(state.live)}: a stale storage "
                                 "was not one of the allocations made after the checkpoint")
