// The entry points a GPU runtime (CUDA driver API, HIP runtime) provides to refpool, as a table of
// plain functions returning the runtime's status code. Everything GPU is written once over it in
// lib/gpu/: the resource (gpu_resource.cpp), the process-wide backends (backend_registry.cpp) and
// the public front end of refpool/gpu.hpp (devices, streams, copies). Only lib/cuda/ and lib/hip/
// include their vendor headers, to load the runtime and fill the table in. (Kernel modules, which
// only the GPU tests use, are test tooling: test/support/gpu_modules.hpp.)
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include <refpool/backend.hpp>
#include <refpool/gpu.hpp>
#include <refpool/resource.hpp>
#include <refpool/virtual_memory.hpp>

namespace refpool::detail::gpu {

using status = int;
using handle = void*;  // a stream, event or saved context of the runtime
using runtime_id = refpool::gpu::runtime;

/// Whether a stream captures a graph (cuStreamGetCaptureInfo, hipStreamGetCaptureInfo).
enum class capture_status { none, active, invalidated };
/// A thread's capture mode (cuThreadExchangeStreamCaptureMode): in `global` (the default) and
/// `per_thread`, a capture forbids "potentially unsafe" calls (allocating, mapping, freeing).
enum class capture_mode { global, per_thread, relaxed };

/// One entry point: the function, and the runtime call it makes for messages ("cuMemAlloc").
template <class F>
struct entry;
template <class... Args>
struct entry<status (*)(Args...)> {
  status (*function)(Args...) = nullptr;
  std::string_view name;
  status operator()(Args... args) const { return function(args...); }
};

/// The calls of a runtime, in order: X(name, function type). Each runtime defines, for every
/// name, a function of that name and type and a constant `<name>_call` naming the runtime call it
/// makes ("cuMemAlloc"), and fills its table with REFPOOL_GPU_TABLE_ENTRY. What they do:
/// - activate makes `device` current on this thread, `*saved` receiving what to give restore;
/// - memory_info is of the current device; keep_pool_memory sets the device's stream-ordered pool
///   to keep what it frees (as refpool's cache does) instead of returning it at every sync;
/// - event_create makes an event without timing (it only orders streams); stream_create a
///   non-blocking stream on the current device;
/// - vm_*: virtual memory (virtual_memory.cpp) of device memory pinned to `device`: whether the
///   device has it, the minimum granularity, address ranges reserved and freed, physical
///   allocations created and released, mapped (at offset 0, whole) and unmapped, and made
///   readable and writable by `device`;
/// - stream_capture: whether `stream` captures and the id of its capture (0 when it does not);
///   never called with the null stream, which the runtimes answer with an error (and CUDA with
///   the capture invalidated) while a blocking stream captures;
/// - exchange_capture_mode sets this thread's capture mode to `*mode`, `*mode` receiving the old one.
#define REFPOOL_GPU_ENTRIES(X)                                                                                \
  X(activate, status (*)(int device, handle* saved))                                                          \
  X(restore, status (*)(handle saved))                                                                        \
  X(driver_version, status (*)(int* version))                                                                 \
  X(device_name, status (*)(int device, char* name, std::size_t size))                                        \
  X(memory_info, status (*)(std::size_t * free, std::size_t * total))                                         \
  X(keep_pool_memory, status (*)(int device))                                                                 \
  X(mem_alloc, status (*)(void** ptr, std::size_t bytes))                                                     \
  X(mem_free, status (*)(void* ptr))                                                                          \
  X(mem_alloc_async, status (*)(void** ptr, std::size_t bytes, handle stream))                                \
  X(mem_free_async, status (*)(void* ptr, handle stream))                                                     \
  X(host_alloc, status (*)(void** ptr, std::size_t bytes))                                                    \
  X(host_free, status (*)(void* ptr))                                                                         \
  X(event_create, status (*)(handle * event))                                                                 \
  X(event_destroy, status (*)(handle event))                                                                  \
  X(event_record, status (*)(handle event, handle stream))                                                    \
  X(stream_wait_event, status (*)(handle stream, handle event))                                               \
  X(stream_create, status (*)(handle * stream))                                                               \
  X(stream_destroy, status (*)(handle stream))                                                                \
  X(stream_synchronize, status (*)(handle stream))                                                            \
  X(stream_capture, status (*)(handle stream, capture_status * capture, unsigned long long* id))              \
  X(exchange_capture_mode, status (*)(capture_mode * mode))                                                   \
  X(device_synchronize, status (*)())                                                                         \
  X(copy, status (*)(void* dst, const void* src, std::size_t bytes, handle stream))                           \
  X(fill, status (*)(void* dst, unsigned char value, std::size_t bytes, handle stream))                       \
  X(copy_peer,                                                                                                \
    status (*)(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes, handle stream)) \
  X(vm_supported, status (*)(int device, bool* supported))                                                    \
  X(vm_granularity, status (*)(int device, std::size_t* granularity))                                         \
  X(vm_reserve, status (*)(void** ptr, std::size_t bytes, std::size_t alignment))                             \
  X(vm_free, status (*)(void* ptr, std::size_t bytes))                                                        \
  X(vm_create, status (*)(handle * physical, std::size_t bytes, int device))                                  \
  X(vm_release, status (*)(handle physical))                                                                  \
  X(vm_map, status (*)(void* ptr, std::size_t bytes, handle physical))                                        \
  X(vm_unmap, status (*)(void* ptr, std::size_t bytes))                                                       \
  X(vm_set_access, status (*)(void* ptr, std::size_t bytes, int device))

/// A runtime's table, from the functions it defines with the names of the fields below and of
/// the entries above (and the entries' `<name>_call` constants): a runtime lacking one does not
/// compile. NAME is "CUDA", PREFIX "cuda", SUCCESS and OUT_OF_MEMORY the runtime's codes.
#define REFPOOL_GPU_TABLE(NAME, PREFIX, SUCCESS, OUT_OF_MEMORY)                                                     \
  {                                                                                                                 \
    .name = NAME, .prefix = PREFIX, .success = SUCCESS, .out_of_memory = OUT_OF_MEMORY, .failure = failure,         \
    .device_count = device_count, .version = version, .kind_unavailable = kind_unavailable, .torn_down = torn_down, \
    .context_gone = context_gone, REFPOOL_GPU_ENTRIES(REFPOOL_GPU_TABLE_ENTRY).error_name = error_name,             \
    .error_string = error_string                                                                                    \
  }
#define REFPOOL_GPU_TABLE_ENTRY(name, ...) .name = {name, name##_call},

struct runtime_api {
  std::string_view name;    ///< "CUDA", "HIP": the start of messages
  std::string_view prefix;  ///< "cuda", "hip": backend names ("hip:0 device")
  status success = 0;
  status out_of_memory = 0;

  /// Why the runtime cannot be used, empty when it can; loads it at the first call. Never throws.
  const std::string& (*failure)() noexcept = nullptr;
  /// Valid once failure() is empty:
  int (*device_count)() = nullptr;
  int (*version)() = nullptr;  ///< CUDA: the driver's (cuDriverGetVersion); HIP: the runtime's
  /// Why the runtime cannot serve memory of `kind` (empty if it can).
  std::string (*kind_unavailable)(memory_kind kind) = nullptr;
  /// True once the runtime may be torn down (the process is exiting): frees are skipped, the
  /// memory goes with the process. Always false for a runtime that reports calls after its
  /// teardown as errors (CUDA: CUDA_ERROR_DEINITIALIZED).
  bool (*torn_down)() noexcept = nullptr;
  /// True for the codes a call returns once the device's context (or the whole runtime) is gone,
  /// as at exit after the runtime's teardown: no work of it is in flight any more.
  bool (*context_gone)(status code) noexcept = nullptr;

#define REFPOOL_GPU_DECLARE_ENTRY(name, ...) entry<__VA_ARGS__> name;
  REFPOOL_GPU_ENTRIES(REFPOOL_GPU_DECLARE_ENTRY)
#undef REFPOOL_GPU_DECLARE_ENTRY

  const char* (*error_name)(status) = nullptr;
  const char* (*error_string)(status) = nullptr;
};

/// The table of runtime `id`.
const runtime_api& table(runtime_id id);
/// The table of runtime `id` if it can be used; else throws `backend_unavailable` saying why.
const runtime_api& usable(runtime_id id);
/// Throws `backend_unavailable` unless `api`'s runtime (usable) has device `ordinal`.
void check_device(const runtime_api& api, int ordinal);

/// Throws `backend_error`: "<runtime> error NAME (code): description, in CALL (DETAILS)".
[[noreturn]] void throw_error(const runtime_api& api, status code, std::string_view call, std::string_view details);

/// Throws as above unless `code` is success.
inline void check(const runtime_api& api, status code, std::string_view call, std::string_view details = {}) {
  if (code != api.success) throw_error(api, code, call, details);
}

/// Makes a device current for a scope, restoring the previous one after. Throws
/// `backend_unavailable` for a device the runtime does not have.
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

/// Sets this thread's capture mode to relaxed for a scope, restoring the previous one after, so
/// that a graph capture in global mode (on any thread) does not make the runtime refuse the calls
/// that allocate, map, unmap or free memory (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), as PyTorch's
/// allocator does around cudaMalloc. Never around a synchronisation: a wait during a capture must
/// still be refused. If the runtime refuses the exchange, the mode is left as it was. Never throws.
class relaxed_capture_mode {
 public:
  explicit relaxed_capture_mode(const runtime_api& api) noexcept;
  ~relaxed_capture_mode();
  relaxed_capture_mode(const relaxed_capture_mode&) = delete;
  relaxed_capture_mode& operator=(const relaxed_capture_mode&) = delete;

 private:
  const runtime_api& api_;
  capture_mode saved_ = capture_mode::relaxed;
  bool exchanged_ = false;
};

/// Streams destroyed after refpool synchronised them. Blocks may still name such a stream as the
/// one they were last used on; ordering after it is unnecessary (its work is done) and passing its
/// handle to the runtime again would be invalid, so the resource skips it. A new stream that gets a
/// retired handle's address is revived. Thread-safe.
void retire_stream(handle stream);
void revive_stream(handle stream);

/// Holds retirement off while it lives, so that a stream it finds not retired stays valid until it
/// ends: a thread that retires and then destroys its stream waits for every holder that may be
/// using it (a cross-stream reuse recording an event on it, a free ordered on it). Hold it around
/// the check and the runtime calls that use the stream. Thread-safe; readers do not exclude each
/// other.
class retirement_lock {
 public:
  retirement_lock();
  ~retirement_lock();
  retirement_lock(const retirement_lock&) = delete;
  retirement_lock& operator=(const retirement_lock&) = delete;
  /// Whether `stream` was retired; the default (null) stream never is.
  [[nodiscard]] bool retired(handle stream) const;
};

/// The reserve/commit interface of `device`'s memory (virtual_memory.cpp), or nullptr when the
/// device has no virtual memory management (or asking fails). Thread-safe.
std::unique_ptr<virtual_memory> make_virtual_memory(const runtime_api& api, int device) noexcept;

/// The resource for `kind` memory (device, device_async, pinned_host) of `device`; for device
/// memory, address_space() is make_virtual_memory's, made at the first call.
/// Stream safety: order_streams records an event on the producer and makes the consumer wait, when
/// both streams are outside any capture or in the same one; otherwise it throws
/// `stream_order_unavailable` and enqueues nothing (docs/design.md, "Stream safety"). synchronize
/// throws it too when the device's wait fails because a stream captures (the wait broke that
/// capture: the runtime does not say beforehand whether any stream of the device captures).
std::shared_ptr<resource> make_resource(const runtime_api& api, int device, memory_kind kind, std::string name);

/// The process-wide backend for `kind` memory on `device` of `api`'s runtime, named
/// "<prefix>:<device> <kind>" ("hip:0 device"): made at first use and the same handle at every
/// later call, so caches key their blocks by it. Before the device_async backend is made, the
/// device's pool is set to keep what it frees. The caller has checked that `device` exists.
/// Thread-safe; when making a backend throws, nothing is kept.
/// Throws `backend_unavailable` for `memory_kind::host` (that is refpool::host_backend()).
backend shared_backend(const runtime_api& api, int device, memory_kind kind);

}  // namespace refpool::detail::gpu

/// The tables of the runtimes: lib/cuda/ and lib/hip/ where compiled in, else lib/gpu/compiled_out.cpp.
namespace refpool::detail::cuda {
const gpu::runtime_api& table();
}  // namespace refpool::detail::cuda
namespace refpool::detail::hip {
const gpu::runtime_api& table();
}  // namespace refpool::detail::hip
