// The HIP backend: device, stream-ordered and pinned memory through the HIP runtime (AMD GPUs),
// which refpool loads at run time (libamdhip64.so.6, .so.5 or .so), so one binary runs with or
// without it. Also the few runtime services numerical code needs around the pool: streams, code
// object modules, launches, copies. The same API as refpool/cuda.hpp, over the same shared GPU
// resource. Without a usable runtime every function here throws `backend_unavailable` saying why;
// `available()` asks without throwing. A build without HIP support links and throws the same way.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include <refpool/backend.hpp>
#include <refpool/types.hpp>

namespace refpool::hip {

// Everything declared here is part of librefpool's ABI (it is built with hidden visibility).
#pragma GCC visibility push(default)

/// True when the runtime loaded and has at least one AMD GPU. Never throws.
[[nodiscard]] bool available() noexcept;
/// Empty when available(); otherwise why not: built without HIP, libamdhip64 missing, runtime
/// too old or lacking an entry point, no AMD GPU.
[[nodiscard]] std::string unavailable_reason();

/// Number of HIP devices. Throws `backend_unavailable`.
[[nodiscard]] int device_count();
/// Runtime version as HIP encodes it (major * 10'000'000 + minor * 100'000 + patch; 50221153 is
/// 5.2.21153). Throws `backend_unavailable`.
[[nodiscard]] int runtime_version();
/// Driver version as hipDriverGetVersion reports it (on AMD, encoded as runtime_version()).
/// Throws `backend_unavailable`, `backend_error`.
[[nodiscard]] int driver_version();
/// The device's name. Throws `backend_unavailable`, `backend_error`.
[[nodiscard]] std::string device_name(int ordinal);
/// Free and total device memory in bytes (hipMemGetInfo).
[[nodiscard]] std::pair<std::size_t, std::size_t> memory_info(int ordinal);

/// The process-wide backend for memory of `kind` on device `ordinal`: `memory_kind::device`
/// (hipMalloc), `device_async` (hipMallocAsync on the request's stream, from the device's
/// default pool) or `pinned_host` (hipHostMalloc, portable). Every call returns the same handle
/// for the same arguments, so caches key their blocks by it. Thread-safe.
/// Throws `backend_unavailable` (no runtime, no such device) or `backend_error`.
[[nodiscard]] backend device(int ordinal = 0, memory_kind kind = memory_kind::device);

/// An owning, non-blocking HIP stream on a device. Move-only. Thread-safe to use.
class stream {
 public:
  explicit stream(int ordinal = 0);
  ~stream();
  stream(stream&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}
  stream& operator=(stream&& other) noexcept;
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;

  [[nodiscard]] stream_ref ref() const noexcept { return {handle_}; }
  operator stream_ref() const noexcept { return ref(); }  // NOLINT: a stream is used as its ref
  [[nodiscard]] int device() const noexcept { return device_; }
  /// Waits for all work on the stream. Throws `backend_error` (e.g. a kernel fault).
  void synchronize() const;

 private:
  void* handle_ = nullptr;
  int device_ = 0;
};

/// Waits for all work on `s` (the null stream when null) of device `ordinal`.
void synchronize(stream_ref s, int ordinal = 0);

/// Call before destroying a stream you created yourself and used with refpool (hip::stream does
/// this itself): waits for its work and tells every cache never to order after it again (HIP 7
/// turns calls on a destroyed stream into crashes). As cuda::retire_stream.
void retire_stream(stream_ref s, int ordinal = 0);

/// A kernel of a loaded module.
struct kernel {
  void* function = nullptr;
  int device = 0;
};

/// Grid or block dimensions.
struct dims3 {
  unsigned x = 1, y = 1, z = 1;
};

/// Kernels loaded from a code object (hipcc --genco for the device's gfx target) with
/// hipModuleLoadData on a device. Move-only.
class module {
 public:
  /// Throws `backend_error` on an image the runtime cannot load (e.g. for another gfx target).
  module(int ordinal, std::string_view image);
  ~module();
  module(module&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}
  module& operator=(module&&) = delete;
  module(const module&) = delete;
  module& operator=(const module&) = delete;

  /// The kernel named `name` (extern "C" name). Throws `backend_error` if absent.
  [[nodiscard]] kernel function(const char* name) const;

 private:
  void* handle_ = nullptr;
  int device_ = 0;
};

/// Launches `k` on `s` with `args` (pointers to each argument, as hipModuleLaunchKernel takes them).
void launch(const kernel& k, dims3 grid, dims3 block, stream_ref s, void** args, unsigned shared_bytes = 0);

/// Launches `k` with the arguments given by value.
template <class... Args>
void launch_with(const kernel& k, dims3 grid, dims3 block, stream_ref s, Args... args) {
  void* pointers[] = {static_cast<void*>(&args)..., nullptr};
  launch(k, grid, block, s, pointers);
}

/// Copies `bytes` between any two addresses the runtime knows (host, device, pinned;
/// hipMemcpyDefault), ordered on `s`. With pageable host memory the call may return only when
/// the copy is done.
void copy(void* dst, const void* src, std::size_t bytes, stream_ref s, int ordinal = 0);
/// Sets `bytes` at device address `dst` to `value`, ordered on `s`.
void fill(void* dst, unsigned char value, std::size_t bytes, stream_ref s, int ordinal = 0);
/// Copies between devices (hipMemcpyPeerAsync), ordered on `s` (a stream of either device).
void copy_peer(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes, stream_ref s);

#pragma GCC visibility pop

}  // namespace refpool::hip
