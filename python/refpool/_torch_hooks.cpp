// refpool's hooks for PyTorch's CUDAPluggableAllocator, compiled at run time against the PyTorch in
// use (refpool/_torch_hooks.py; docs/frameworks.md, "How the hooks are built"). Never part of
// refpool's build: refpool has no build dependency on PyTorch.
//
// Why a component built against PyTorch: the graph-pool hooks take C++ types (c10's MempoolId_t
// and std::function<bool(cudaStream_t)>) and torch.OutOfMemoryError is raised only for a thrown
// c10::OutOfMemoryError. Everything else is librefpool's C API, whose functions Python hands over
// once (refpool_torch_hooks_bind), so this library links nothing of refpool and uses the very
// librefpool the refpool package loaded. Beside the hooks, the library keeps what PyTorch's
// allocator would report and the pluggable interface cannot ask refpool: per-device statistics
// (_torch_hooks_stats.cpp, _torch_hooks_counters.cpp) and the requests private pools served
// (_torch_hooks_pools.cpp). Every PyTorch declaration used here, with its file and line, is in
// docs/frameworks.md ("How the hooks are built"); c10::cuda::MempoolId_t is c10::MempoolId_t in newer
// PyTorch, kept in namespace c10::cuda by CUDACachingAllocator.h, included first for that.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
// The loader retries with REFPOOL_NO_PLUGGABLE_HEADER should that header not compile outside PyTorch.
#if !defined(REFPOOL_NO_PLUGGABLE_HEADER) && __has_include(<torch/csrc/cuda/CUDAPluggableAllocator.h>)
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#define REFPOOL_HAVE_PLUGGABLE_HEADER 1
#endif

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "_torch_hooks.hpp"

namespace {

// refpool.h's types and values that these hooks use (part of refpool's stable C ABI).
constexpr int refpool_ok = 0;
constexpr int refpool_error_out_of_memory = 4;
constexpr std::size_t one_exa_byte = std::size_t{1} << 60;  // PyTorch's allocator refuses this much at once
struct pool_id {
  std::uint64_t first;
  std::uint64_t second;
};
using stream_filter = int (*)(void* context, void* stream);

// librefpool's functions, in the order of refpool/_torch_hooks.py's IMPORTS.
struct refpool_api {
  int (*alloc)(std::size_t, int, void*, void**);
  int (*free)(void*);
  const char* (*last_error)();
  int (*record_stream)(void*, void*);
  int (*empty_cache)();
  int (*set_device_limit)(int, std::size_t);
  int (*begin_pool)(int, pool_id, stream_filter, void*, void (*)(void*));
  int (*end_pool)(int, pool_id);
  int (*release_pool)(int, pool_id);
  int (*routing_to_pools)();
  int (*pool_take)(int, pool_id, void*, std::size_t, void*, void**);
  int (*caching)();
};
refpool_api api{};
constexpr int api_size = sizeof(refpool_api) / sizeof(void*);

std::atomic<const refpool_torch::tracker*> installed_tracker{nullptr};

using capture_filter = std::function<bool(cudaStream_t)>;
using pool_hook = void(int, c10::cuda::MempoolId_t, capture_filter);
using pool_end_hook = void(int, c10::cuda::MempoolId_t);

// What refpool owns for a route: PyTorch's filter and the pool it routes to.
struct route {
  capture_filter filter;
  refpool_torch::pool_name pool;
};

// Throws what PyTorch turns into the matching Python exception.
void fail(int status, const char* what) {
  TORCH_CHECK_WITH(OutOfMemoryError, status != refpool_error_out_of_memory, api.last_error());
  TORCH_CHECK(false, what, ": ", api.last_error());
}

pool_id to_refpool(c10::cuda::MempoolId_t pool) { return {pool.first, pool.second}; }

int call_filter(void* context, void* stream) {
  auto* r = static_cast<route*>(context);
  if (!r->filter(static_cast<cudaStream_t>(stream))) return 0;
  refpool_torch::note_routed(r->pool);  // refpool serves this request from r->pool
  return 1;
}

void drop_route(void* context) { delete static_cast<route*>(context); }

int accept_none(void*, void*) { return 0; }

// refpool's free of a block whose free was counted.
void free_to_refpool(void* ptr) {
  if (api.free(ptr) != refpool_ok) std::fprintf(stderr, "%s\n", api.last_error());
}

// refpool's free, its next user ordered after the streams `uses` (record_stream) by refpool.
void free_ordered(void* ptr, const std::vector<void*>& uses) {
  for (void* used_on : uses)
    if (api.record_stream(ptr, used_on) != refpool_ok) std::fprintf(stderr, "%s\n", api.last_error());
  free_to_refpool(ptr);
}

// A free record_stream defers, counted before any thread can give the block back: no longer
// allocated, still active. Runs under the deferred frees' mutex: reports, never throws.
void count_deferred_free(void* ptr, int device, std::size_t size) noexcept {
  try {
    refpool_torch::count_free(ptr, device, size, true);
  } catch (const std::exception& e) {  // the profiler's report; the count is made
    std::fprintf(stderr, "refpool: counting a deferred free: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "refpool: counting a deferred free: unknown exception\n");
  }
}

// A deferred free whose streams are done: the block is inactive (before refpool may hand it out
// again, so its next request counts after), then refpool's.
void free_deferred(void* ptr, int device, std::size_t size) noexcept {
  refpool_torch::count_inactive(device, size);
  if (const refpool_torch::tracker* t = refpool_torch::current_tracker()) t->free_completed(ptr, size, device);
  free_to_refpool(ptr);
}

// A checkpoint restore on this thread (refpool_torch_hooks_restore): its one request, made through
// PyTorch's allocator so that PyTorch records the block as its own, takes these bytes back.
struct restore_request {
  refpool_torch::pool_name pool;
  void* address;
};
thread_local const restore_request* restoring = nullptr;

int take_back(const restore_request& r, std::size_t size, int device, cudaStream_t stream, void** out,
              refpool_torch::pool_name& pool) {
  const int status = api.pool_take(device, pool_id{r.pool.first, r.pool.second}, r.address, size, stream, out);
  if (status == refpool_ok) {
    pool = r.pool;
    refpool_torch::track_pool_allocation(*out, size, device, stream, pool);
  }
  return status;
}

// Copies `what` into the caller's buffer (always terminated).
void write_message(const char* what, char* message, std::size_t capacity) {
  if (message != nullptr && capacity > 0) std::snprintf(message, capacity, "%s", what);
}

// A request of a thread routed to a private pool: the pool it went to is tracked (for
// checkPoolLiveAllocations and snapshots). Growing the pool calls the driver, which CUDA allows in
// relaxed capture mode only, as PyTorch's own allocator does for cudaMalloc during capture.
int alloc_while_routing(std::size_t size, int device, cudaStream_t stream, void** out, refpool_torch::pool_name& pool) {
  (void)refpool_torch::take_routed();  // a note left by a request that raced the start of a route
  int status = refpool_ok;
  if (refpool_torch::capturing(stream)) {
    c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};
    status = api.alloc(size, device, stream, out);
  } else {
    status = api.alloc(size, device, stream, out);
  }
  pool = refpool_torch::take_routed();
  if (status == refpool_ok && !pool.none() && *out != nullptr)
    refpool_torch::track_pool_allocation(*out, size, device, stream, pool);
  return status;
}

}  // namespace

namespace refpool_torch {
const tracker* current_tracker() { return installed_tracker.load(std::memory_order_acquire); }

// Asked in relaxed mode, as c10 asks: a query under another thread's global-mode capture is
// refused otherwise. An invalidated capture is still one until it ends: work on its stream
// (cudaEventRecord included) fails until then.
bool capturing(void* stream) {
  c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status));
  return status != cudaStreamCaptureStatusNone;
}
}  // namespace refpool_torch

extern "C" {

/// Takes librefpool's functions (addresses, in IMPORTS order). Returns 0, or -1 if `count` is not
/// what this library expects (a package and hooks of different refpool versions).
int refpool_torch_hooks_bind(void* const* functions, int count) {
  if (count != api_size) return -1;
  static_assert(std::is_trivially_copyable_v<refpool_api>);
  std::memcpy(&api, functions, sizeof api);
  return 0;
}

/// Installs (or, with NULL, removes) the observer of every request: the history library's.
void refpool_torch_hooks_set_tracker(const void* t) {
  installed_tracker.store(static_cast<const refpool_torch::tracker*>(t), std::memory_order_release);
}

/// PyTorch's alloc_fn: void*(size_t, int, cudaStream_t). Out of memory throws
/// c10::OutOfMemoryError (torch.OutOfMemoryError in Python) with refpool's message, after
/// PyTorch's out-of-memory observers saw it.
void* refpool_torch_hooks_malloc(std::size_t size, int device, cudaStream_t stream) {
  TORCH_CHECK_WITH(OutOfMemoryError, size < one_exa_byte,
                   "CUDA out of memory. Tried to allocate more than 1EB memory.");
  void* out = nullptr;
  refpool_torch::pool_name pool;
  const bool caching = api.caching() != 0;  // librefpool's setting (a request racing a change may see either)
  const bool routing = api.routing_to_pools() != 0;
  // Frees record_stream deferred whose streams are done (not while a capture routes: its events
  // could not be queried then), as PyTorch's allocator does before each request.
  if (!routing && refpool_torch::frees_pending())
    refpool_torch::free_completed(free_deferred);
  auto serve = [&] {
    return restoring != nullptr ? take_back(*restoring, size, device, stream, &out, pool)
           : routing            ? alloc_while_routing(size, device, stream, &out, pool)
                                : api.alloc(size, device, stream, &out);
  };
  int status = serve();
  if (status == refpool_error_out_of_memory && !routing && refpool_torch::frees_pending()) {
    refpool_torch::free_all_pending(free_deferred);  // out of memory: wait for them, and retry once
    status = serve();
  }
  if (status != refpool_ok) {
    if (status == refpool_error_out_of_memory) {
      const std::string detail = api.last_error();  // before observers, whose own calls may replace it
      TORCH_CHECK_WITH(OutOfMemoryError, false, refpool_torch::out_of_memory(device, size), detail);
    }
    fail(status, "refpool could not allocate");
  }
  if (out != nullptr) {
    refpool_torch::forget_stream_uses(out);
    if (!caching && pool.none()) {  // the driver's (caching_allocator_enable(False)): counted nowhere
      try {
        refpool_torch::note_uncounted(out);
      } catch (...) {
        free_to_refpool(out);
        throw;
      }
      return out;
    }
    refpool_torch::count_alloc(out, device, size);
    if (const refpool_torch::tracker* t = refpool_torch::current_tracker()) t->alloc(out, size, device, stream, pool);
  }
  return out;
}

/// PyTorch's free_fn: called from deleters, where an exception would end the process.
void refpool_torch_hooks_free(void* ptr, std::size_t size, int device, cudaStream_t stream) {
  if (ptr == nullptr) return;
  if (refpool_torch::forget_uncounted(ptr)) {  // served while caching was off: counted nowhere, never deferred
    std::vector<void*> uses;
    try {
      uses = refpool_torch::take_stream_uses(ptr);
    } catch (const std::exception& e) {  // no memory for the list: ordered after its own stream only
      std::fprintf(stderr, "refpool: record_stream's uses of a buffer served uncached: %s\n", e.what());
    }
    free_ordered(ptr, uses);
    return;
  }
  // Requested before a deferral can complete it on another thread; completed below if not deferred.
  const refpool_torch::tracker* t = refpool_torch::current_tracker();
  if (t != nullptr) t->free_requested(ptr, size, device, stream);
  refpool_torch::untrack_pool_allocation(ptr);
  std::vector<void*> uses;
  try {  // deferred: counted by defer_free (count_deferred_free), the block still active
    uses = refpool_torch::take_stream_uses(ptr);
    if (!uses.empty() && refpool_torch::defer_free(ptr, device, size, stream, uses, count_deferred_free)) return;
  } catch (const std::exception& e) {  // a CUDA error recording the events (or no memory): free now, ordered
    std::fprintf(stderr, "refpool: record_stream's deferred free: %s\n", e.what());
  }
  // Not deferred (no other stream, a stream captures, or the events could not be recorded): freed
  // and inactive now; refpool orders the next user's stream after the recorded ones.
  refpool_torch::count_free(ptr, device, size, false);
  if (t != nullptr) t->free_completed(ptr, size, device);
  free_ordered(ptr, uses);
}

/// set_record_stream_fn: Tensor.record_stream. The block's free waits for `stream`'s work then
/// (_torch_hooks_deferred.cpp), as with PyTorch's allocator. Never fails, as PyTorch's allocator
/// never fails for a pointer it did not serve: such a pointer is never freed here, and its note
/// (a few bytes) stays until refpool serves that address, which drops it (refpool_torch_hooks_malloc).
void refpool_torch_hooks_record_stream(void* ptr, cudaStream_t stream) {
  if (ptr != nullptr) refpool_torch::note_stream_use(ptr, stream);
}

/// set_reset_fn: torch.cuda.empty_cache(): frees record_stream deferred are waited for first.
void refpool_torch_hooks_empty_cache() {
  if (refpool_torch::frees_pending()) refpool_torch::free_all_pending(free_deferred);
  if (const int status = api.empty_cache(); status != refpool_ok) fail(status, "empty_cache");
  if (const refpool_torch::tracker* t = refpool_torch::current_tracker()) t->empty_cache();
}

/// set_memory_fraction_fn: torch.cuda.set_per_process_memory_fraction(fraction, device) caps what
/// refpool holds from the device at fraction * its total memory (1 or more: no cap).
void refpool_torch_hooks_set_memory_fraction(double fraction, int device) {
  std::size_t limit = std::numeric_limits<std::size_t>::max();
  if (fraction < 1.0) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    limit = static_cast<std::size_t>(fraction * static_cast<double>(total_bytes));
  }
  if (const int status = api.set_device_limit(device, limit); status != refpool_ok) fail(status, "memory fraction");
  refpool_torch::remember_memory_fraction(device, fraction);
}

/// set_begin_allocate_to_pool: a CUDA graph capture (or use_mem_pool) begins; requests whose
/// stream `filter` accepts go to private pool `pool` until the end hook.
void refpool_torch_hooks_begin_allocate_to_pool(int device, c10::cuda::MempoolId_t pool, capture_filter filter) {
  auto* kept = new route{std::move(filter), {pool.first, pool.second}};  // refpool owns it from the call on
  if (const int status = api.begin_pool(device, to_refpool(pool), call_filter, kept, drop_route); status != refpool_ok)
    fail(status, "beginAllocateToPool");
}

/// set_end_allocate_to_pool_fn: the capture ended.
void refpool_torch_hooks_end_allocate_to_pool(int device, c10::cuda::MempoolId_t pool) {
  if (const int status = api.end_pool(device, to_refpool(pool)); status != refpool_ok)
    fail(status, "endAllocateToPool");
}

/// set_release_pool: a graph using the pool is gone. Called from CUDAGraph's destructor: reports,
/// never throws.
void refpool_torch_hooks_release_pool(int device, c10::cuda::MempoolId_t pool) {
  if (api.release_pool(device, to_refpool(pool)) != refpool_ok) std::fprintf(stderr, "%s\n", api.last_error());
}

/// torch.cuda.MemPool under install() (refpool/_torch_mempool.py): makes private pool `pool` on
/// `device` if needed and takes one use of it, given back by the release hook. Returns 0, or -1
/// with refpool_last_error set.
int refpool_torch_hooks_hold_pool(int device, std::uint64_t first, std::uint64_t second) {
  const pool_id pool{first, second};
  if (api.begin_pool(device, pool, accept_none, nullptr, nullptr) != refpool_ok) return -1;
  return api.end_pool(device, pool) == refpool_ok ? 0 : -1;
}

/// torch._C._cuda_setCheckpointPoolState under install() (refpool/_torch_checkpoint.py): allocates
/// again, through PyTorch's allocator (which then knows the block, so raw_delete and storages'
/// deleters free it), the `size` bytes at `address` that private pool `pool` served before and are
/// idle in it now (refpool_allocator_pool_take). Returns 0, or -1 with the reason in `message`.
int refpool_torch_hooks_restore(int device, std::uint64_t first, std::uint64_t second, void* address,
                                std::size_t size, void* stream, char* message, std::size_t capacity) {
  const restore_request request{{first, second}, address};
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    restoring = &request;
    void* got = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(size, static_cast<cudaStream_t>(stream));
    restoring = nullptr;
    if (got == address) return 0;
    // Not ours: PyTorch's allocator is another one (refpool not installed). Give it back.
    c10::cuda::CUDACachingAllocator::raw_delete(got);
    write_message("refpool.torch: PyTorch's allocator is not refpool's (install() was not called)", message,
                  capacity);
  } catch (const c10::Error& e) {  // refpool's message, as fail() gave it, without PyTorch's backtrace
    restoring = nullptr;
    write_message(e.what_without_backtrace(), message, capacity);
  } catch (const std::exception& e) {
    restoring = nullptr;
    write_message(e.what(), message, capacity);
  }
  return -1;
}

/// The address of the memory of storage `storage` (a StorageImpl*, Python's storage._cdata).
void* refpool_torch_hooks_storage_pointer(std::uintptr_t storage) {
  return reinterpret_cast<c10::StorageImpl*>(storage)->data_ptr().get();
}

/// Storage `storage`, which refers to its memory without owning it (no deleter: CUDA graph trees'
/// outputs), owns it from now on: its memory goes back to PyTorch's allocator when the storage
/// goes, as a block re-allocated for it by setCheckpointPoolState does in PyTorch. Returns 0, or -1
/// with the reason in `message` when the storage has a deleter already.
int refpool_torch_hooks_adopt_storage(std::uintptr_t storage, int device, char* message, std::size_t capacity) {
  auto* s = reinterpret_cast<c10::StorageImpl*>(storage);
  if (s->data_ptr().get_context() != nullptr) {
    write_message("refpool.torch: setCheckpointPoolState: a storage to add a deleter to has one (Not expecting "
                  "deleter function)",
                  message, capacity);
    return -1;
  }
  void* ptr = s->data_ptr().get();
  s->set_data_ptr_noswap(c10::DataPtr(ptr, ptr, c10::cuda::CUDACachingAllocator::get()->raw_deleter(),
                                      c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device))));
  return 0;
}

}  // extern "C"

// The hooks have exactly the types PyTorch's setters take (torch/csrc/cuda/Module.cpp casts each
// address to a pointer to these function types).
namespace {
static_assert(std::is_same_v<decltype(&refpool_torch_hooks_begin_allocate_to_pool), pool_hook*>);
static_assert(std::is_same_v<decltype(&refpool_torch_hooks_end_allocate_to_pool), pool_end_hook*>);
static_assert(std::is_same_v<decltype(&refpool_torch_hooks_release_pool), pool_end_hook*>);
static_assert(std::is_same_v<decltype(&refpool_torch_hooks_malloc), void* (*)(std::size_t, int, cudaStream_t)>);
static_assert(std::is_same_v<decltype(&refpool_torch_hooks_free), void (*)(void*, std::size_t, int, cudaStream_t)>);
static_assert(std::is_same_v<decltype(&refpool_torch_hooks_record_stream), void (*)(void*, cudaStream_t)>);
static_assert(std::is_same_v<decltype(&refpool_torch_hooks_set_memory_fraction), void (*)(double, int)>);
static_assert(std::is_same_v<decltype(&refpool_torch_hooks_empty_cache), void (*)()>);
#ifdef REFPOOL_HAVE_PLUGGABLE_HEADER
using pluggable = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
static_assert(
    std::is_invocable_v<decltype(&pluggable::set_begin_allocate_to_pool), pluggable&, std::function<pool_hook>>);
static_assert(
    std::is_invocable_v<decltype(&pluggable::set_end_allocate_to_pool_fn), pluggable&, std::function<pool_end_hook>>);
static_assert(std::is_invocable_v<decltype(&pluggable::set_release_pool), pluggable&, std::function<pool_end_hook>>);
#endif
}  // namespace
