// What the files of refpool's PyTorch hooks library share (_torch_hooks.cpp, _torch_hooks_stats.cpp,
// _torch_hooks_counters.cpp, _torch_hooks_pools.cpp). Compiled at run time against the PyTorch in
// use, like them; never part of refpool's build (refpool/_torch_hooks.py, docs/frameworks.md "How
// the hooks are built"). Torch-free: it includes no PyTorch header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace refpool_torch {

// A private pool's name (PyTorch's MempoolId_t, refpool's refpool_pool_id); {0, 0} names none.
struct pool_name {
  std::uint64_t first = 0;
  std::uint64_t second = 0;
  bool none() const { return first == 0 && second == 0; }
};

// Observers of every request, installed by the history library (_torch_history.cpp) while memory
// history is recorded, and null otherwise: the hooks then pay one atomic load per request.
struct tracker {
  void (*alloc)(void* ptr, std::size_t size, int device, void* stream, pool_name pool);
  // A free, then its block back to refpool: at once, or when a free that record_stream deferred
  // completes (its block meanwhile "active_pending_free" in a snapshot).
  void (*free_requested)(void* ptr, std::size_t size, int device, void* stream);
  void (*free_completed)(void* ptr, std::size_t size, int device);
  void (*oom)(std::size_t size, int device, std::size_t device_free);
  void (*empty_cache)();
};
const tracker* current_tracker();

// Whether `stream` (a cudaStream_t) is capturing a CUDA graph now.
bool capturing(void* stream);

// The per-device counters and memory fractions (_torch_hooks_counters.cpp, torch-free): null and
// 1.0 for a device out of range.
class device_counters;
device_counters* counters_of(int device);
void remember_memory_fraction(int device, double fraction);
double memory_fraction(int device);

// A request served or freed: counted, and shown to PyTorch's profiler while it records memory
// (_torch_hooks_stats.cpp). A free that record_stream defers leaves its block active (`still_active`)
// until count_inactive, when the block goes back to refpool.
void count_alloc(void* ptr, int device, std::size_t size);
void count_free(void* ptr, int device, std::size_t size, bool still_active);
void count_inactive(int device, std::size_t size);
// Caching off (torch.cuda.caching_allocator_enable(False), refpool_allocator_set_caching(0), or
// REFPOOL_NO_CACHING=on): requests no private pool takes are the driver's, and counted nowhere, as
// PyTorch's allocator counts nothing then. Such a request is remembered until its free, which counts
// nothing either, whatever the setting by then (_torch_hooks_counters.cpp, torch-free).
void note_uncounted(void* ptr);
bool forget_uncounted(void* ptr);  // true if ptr was remembered (then forgotten); one atomic load while none is
// A request refpool could not serve: counts it (num_ooms), shows it to the tracker and to PyTorch's
// out-of-memory observers (device, bytes, the device's cap: its memory fraction of the total or the
// total, its free bytes), and returns the start of PyTorch's message ("CUDA out of memory. Tried to
// allocate ..."), which refpool's own message follows.
std::string out_of_memory(int device, std::size_t size);

// Requests served by private pools (_torch_hooks_pools.cpp). The capture filter refpool calls for
// a request notes, on the requesting thread, the pool it accepted the request for.
void note_routed(pool_name pool);
pool_name take_routed();  // the pool the last request of this thread was routed to, and forgets it
void track_pool_allocation(void* ptr, std::size_t size, int device, void* stream, pool_name pool);
void untrack_pool_allocation(void* ptr);  // nothing if ptr is no pool's

// Frees deferred by Tensor.record_stream, as PyTorch's allocator defers them
// (_torch_hooks_deferred.cpp). Streams are cudaStream_t. record_stream notes a use; the free hook
// takes a block's uses and, for uses on streams other than its allocation's (none capturing), defers
// its free until events recorded on them complete: `counted` counts the free (the block still
// active) before any thread can give the block back, and once the events are done `free_now`
// (refpool's free, counting the block inactive) runs with the block's device and size, once a block.
// Requests free the completed ones while any are pending; empty_cache and a retry after out of
// memory wait for all of them. A CUDA error checking an event keeps its block pending and is thrown
// (c10::Error) once the completed ones are freed.
// noexcept: `counted` runs once the block is pending (a throw would have the caller free it again)
// and `free_now` on blocks already taken from the pending list (a throw would lose the rest).
using deferred_fn = void (*)(void* ptr, int device, std::size_t size) noexcept;
void note_stream_use(void* ptr, void* stream);
std::vector<void*> take_stream_uses(void* ptr);  // empty (one atomic load, mostly) when ptr was not recorded
// A block refpool just served has no use to note yet: a note for its address is stale (record_stream
// on memory refpool never served, as PyTorch's allocator ignores it) and goes. One atomic load when no
// noted address hashes where ptr does.
void forget_stream_uses(void* ptr);
bool defer_free(void* ptr, int device, std::size_t size, void* allocated_on, std::vector<void*>& uses,
                deferred_fn counted);  // true: deferred
bool frees_pending();
void free_completed(deferred_fn free_now);
void free_all_pending(deferred_fn free_now);

}  // namespace refpool_torch
