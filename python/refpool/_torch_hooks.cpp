// refpool's hooks for PyTorch's CUDAPluggableAllocator, compiled at run time against the PyTorch in
// use (refpool/_torch_hooks.py; docs/frameworks.md, "How the hooks are built"). Never part of
// refpool's build: refpool has no build dependency on PyTorch.
//
// Why a component built against PyTorch: the graph-pool hooks take C++ types (c10's MempoolId_t
// and std::function<bool(cudaStream_t)>) and torch.OutOfMemoryError is raised only for a thrown
// c10::OutOfMemoryError. Everything else is librefpool's C API, whose functions Python hands over
// once (refpool_torch_hooks_bind), so this library links nothing of refpool and uses the very
// librefpool the refpool package loaded.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
// The loader retries with REFPOOL_NO_PLUGGABLE_HEADER should that header not compile outside PyTorch.
#if !defined(REFPOOL_NO_PLUGGABLE_HEADER) && __has_include(<torch/csrc/cuda/CUDAPluggableAllocator.h>)
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#define REFPOOL_HAVE_PLUGGABLE_HEADER 1
#endif

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>

namespace {

// refpool.h's types and values that these hooks use (part of refpool's stable C ABI).
constexpr int refpool_ok = 0;
constexpr int refpool_error_out_of_memory = 4;
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
};
refpool_api api{};
constexpr int api_size = sizeof(refpool_api) / sizeof(void*);

using capture_filter = std::function<bool(cudaStream_t)>;
using pool_hook = void(int, c10::cuda::MempoolId_t, capture_filter);
using pool_end_hook = void(int, c10::cuda::MempoolId_t);

// Throws what PyTorch turns into the matching Python exception.
void fail(int status, const char* what) {
  TORCH_CHECK_WITH(OutOfMemoryError, status != refpool_error_out_of_memory, api.last_error());
  TORCH_CHECK(false, what, ": ", api.last_error());
}

pool_id to_refpool(c10::cuda::MempoolId_t pool) { return {pool.first, pool.second}; }

// Whether `stream` is capturing now. Asked in relaxed mode, as c10 asks: a query under another
// thread's global-mode capture is refused otherwise.
bool capturing(cudaStream_t stream) {
  c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status == cudaStreamCaptureStatusActive;
}

int call_filter(void* context, void* stream) {
  return (*static_cast<capture_filter*>(context))(static_cast<cudaStream_t>(stream)) ? 1 : 0;
}

void drop_filter(void* context) { delete static_cast<capture_filter*>(context); }

}  // namespace

extern "C" {

/// Takes librefpool's functions (addresses, in IMPORTS order). Returns 0, or -1 if `count` is not
/// what this library expects (a package and hooks of different refpool versions).
int refpool_torch_hooks_bind(void* const* functions, int count) {
  if (count != api_size) return -1;
  static_assert(std::is_trivially_copyable_v<refpool_api>);
  std::memcpy(&api, functions, sizeof api);
  return 0;
}

/// PyTorch's alloc_fn: void*(size_t, int, cudaStream_t). Out of memory throws
/// c10::OutOfMemoryError (torch.OutOfMemoryError in Python) with refpool's message. A request on a
/// stream capturing into a private pool may reach the driver (the pool grows): CUDA allows that in
/// relaxed capture mode only, as PyTorch's own allocator does for cudaMalloc during capture.
void* refpool_torch_hooks_malloc(std::size_t size, int device, cudaStream_t stream) {
  void* out = nullptr;
  int status = refpool_ok;
  if (api.routing_to_pools() != 0 && capturing(stream)) {
    c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};
    status = api.alloc(size, device, stream, &out);
  } else {
    status = api.alloc(size, device, stream, &out);
  }
  if (status != refpool_ok) fail(status, "refpool could not allocate");
  return out;
}

/// PyTorch's free_fn: called from deleters, where an exception would end the process.
void refpool_torch_hooks_free(void* ptr, std::size_t, int, cudaStream_t) {
  if (api.free(ptr) != refpool_ok) std::fprintf(stderr, "%s\n", api.last_error());
}

/// set_record_stream_fn: Tensor.record_stream.
void refpool_torch_hooks_record_stream(void* ptr, cudaStream_t stream) {
  if (const int status = api.record_stream(ptr, stream); status != refpool_ok) fail(status, "record_stream");
}

/// set_reset_fn: torch.cuda.empty_cache().
void refpool_torch_hooks_empty_cache() {
  if (const int status = api.empty_cache(); status != refpool_ok) fail(status, "empty_cache");
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
}

/// set_begin_allocate_to_pool: a CUDA graph capture (or use_mem_pool) begins; requests whose
/// stream `filter` accepts go to private pool `pool` until the end hook.
void refpool_torch_hooks_begin_allocate_to_pool(int device, c10::cuda::MempoolId_t pool, capture_filter filter) {
  auto* kept = new capture_filter(std::move(filter));  // refpool owns it from the call on
  if (const int status = api.begin_pool(device, to_refpool(pool), call_filter, kept, drop_filter); status != refpool_ok)
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

}  // extern "C"

// The hooks have exactly the types PyTorch's setters take (torch/csrc/cuda/Module.cpp casts each
// address to a pointer to these function types).
namespace {
static_assert(std::is_same_v<decltype(&refpool_torch_hooks_begin_allocate_to_pool), pool_hook*>);
static_assert(std::is_same_v<decltype(&refpool_torch_hooks_end_allocate_to_pool), pool_end_hook*>);
static_assert(std::is_same_v<decltype(&refpool_torch_hooks_release_pool), pool_end_hook*>);
static_assert(std::is_same_v<decltype(&refpool_torch_hooks_malloc), void* (*)(std::size_t, int, cudaStream_t)>);
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
