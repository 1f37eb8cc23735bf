// The few entry points a GPU runtime (CUDA driver API, HIP runtime) provides to refpool, as a
// table of plain functions returning the runtime's status code. One implementation of the GPU
// resource (gpu_resource.cpp) serves every runtime through it; only lib/cuda/ and lib/hip/
// include their vendor headers to fill it in.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include <refpool/backend.hpp>
#include <refpool/resource.hpp>

namespace refpool::detail::gpu {

using status = int;
using handle = void*;  // a stream, event or saved context of the runtime

struct runtime_api {
  std::string_view runtime;  ///< "CUDA", "HIP": the prefix of messages
  status success = 0;
  status out_of_memory = 0;

  /// Makes `device` current on this thread; `*saved` receives what to give `restore`.
  status (*activate)(int device, handle* saved) = nullptr;
  status (*restore)(handle saved) = nullptr;

  status (*mem_alloc)(void** ptr, std::size_t bytes) = nullptr;
  status (*mem_free)(void* ptr) = nullptr;
  status (*mem_alloc_async)(void** ptr, std::size_t bytes, handle stream) = nullptr;
  status (*mem_free_async)(void* ptr, handle stream) = nullptr;
  status (*host_alloc)(void** ptr, std::size_t bytes) = nullptr;
  status (*host_free)(void* ptr) = nullptr;

  status (*event_create)(handle* event) = nullptr;  ///< without timing: used only to order streams
  status (*event_destroy)(handle event) = nullptr;
  status (*event_record)(handle event, handle stream) = nullptr;
  status (*stream_wait_event)(handle stream, handle event) = nullptr;

  const char* (*error_name)(status) = nullptr;
  const char* (*error_string)(status) = nullptr;

  /// True once the runtime may be torn down (the process is exiting): frees are skipped, the
  /// memory goes with the process. Null for a runtime that reports calls after its teardown as
  /// errors (CUDA: CUDA_ERROR_DEINITIALIZED).
  bool (*torn_down)() noexcept = nullptr;
};

/// Throws `backend_error`: "<runtime> error NAME (code): description, in CALL (DETAILS)".
[[noreturn]] void throw_error(const runtime_api& api, status code, std::string_view call, std::string_view details);

/// Throws as above unless `code` is success.
inline void check(const runtime_api& api, status code, std::string_view call, std::string_view details = {}) {
  if (code != api.success) throw_error(api, code, call, details);
}

/// Makes a device current for a scope, restoring the previous one after.
class device_guard {
 public:
  device_guard(const runtime_api& api, int device);
  ~device_guard();
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  const runtime_api& api_;
  handle saved_ = nullptr;
};

/// Streams destroyed after refpool synchronised them. Blocks may still name such a stream as the
/// one they were last used on; ordering after it is unnecessary (its work is done) and passing its
/// handle to the runtime again would be invalid, so the resource skips it. A new stream that gets a
/// retired handle's address is revived. Thread-safe.
void retire_stream(handle stream);
void revive_stream(handle stream);
bool stream_retired(handle stream);

/// The resource for `kind` memory (device, device_async, pinned_host) of `device`.
/// Stream safety: order_streams records an event on the producer and makes the consumer wait.
std::shared_ptr<resource> make_resource(const runtime_api& api, int device, memory_kind kind, std::string name);

/// The process-wide backend for `kind` memory on `device` of `api`'s runtime, named
/// "<prefix>:<device> <kind>" ("hip:0 device"): made at first use and the same handle at every
/// later call, so caches key their blocks by it. Before the device_async backend is made,
/// `keep_pool_memory(device)` (when given) sets up the runtime's stream-ordered pool. The caller
/// has checked that `device` exists. Thread-safe; when making a backend throws, nothing is kept.
/// Throws `backend_unavailable` for `memory_kind::host` (that is refpool::host_backend()).
backend shared_backend(const runtime_api& api, std::string_view prefix, int device, memory_kind kind,
                       void (*keep_pool_memory)(int device) = nullptr);

}  // namespace refpool::detail::gpu
