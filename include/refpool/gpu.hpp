// The GPU front end every runtime shares: owning streams, copies and fills, written once (lib/gpu/)
// over a table of the runtime's entry points. Users include refpool/cuda.hpp or refpool/hip.hpp,
// whose namespaces name these for their runtime (cuda::stream is gpu::basic_stream<gpu::runtime::cuda>)
// and add what differs. (Kernel modules and launches, which only refpool's GPU tests use, are test
// tooling outside the library: test/support/gpu_modules.hpp.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <refpool/backend.hpp>
#include <refpool/detail/export.hpp>
#include <refpool/types.hpp>

namespace refpool::gpu {

/// The GPU runtimes refpool drives.
enum class runtime : std::uint8_t {
  cuda,  ///< the CUDA driver API (libcuda.so.1)
  hip,   ///< the HIP runtime (libamdhip64)
};

/// The library's entry points behind the inline API below and in the runtime namespaces (exported,
/// but not API). Each throws `backend_unavailable` when runtime R cannot be used (naming why) and
/// `backend_error` when a call fails.
namespace detail {
[[nodiscard]] REFPOOL_API bool available(runtime r) noexcept;
[[nodiscard]] REFPOOL_API std::string unavailable_reason(runtime r);
[[nodiscard]] REFPOOL_API int device_count(runtime r);
[[nodiscard]] REFPOOL_API int runtime_version(runtime r);
[[nodiscard]] REFPOOL_API int driver_version(runtime r);
[[nodiscard]] REFPOOL_API std::string device_name(runtime r, int ordinal);
[[nodiscard]] REFPOOL_API std::pair<std::size_t, std::size_t> memory_info(runtime r, int ordinal);
[[nodiscard]] REFPOOL_API backend device(runtime r, int ordinal, memory_kind kind);
[[nodiscard]] REFPOOL_API void* create_stream(runtime r, int ordinal);
REFPOOL_API void destroy_stream(runtime r, void* stream) noexcept;
REFPOOL_API void synchronize(runtime r, stream_ref s, int ordinal);
REFPOOL_API void retire_stream(runtime r, stream_ref s, int ordinal);
REFPOOL_API void copy(runtime r, void* dst, const void* src, std::size_t bytes, stream_ref s, int ordinal);
REFPOOL_API void fill(runtime r, void* dst, unsigned char value, std::size_t bytes, stream_ref s, int ordinal);
REFPOOL_API void copy_peer(runtime r, void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                           stream_ref s);
}  // namespace detail

/// An owning, non-blocking stream of runtime R on a device. Move-only. Thread-safe to use. Its
/// destructor waits for the stream's work and retires it (see retire_stream in the runtime's
/// namespace) before destroying it. Throws `backend_unavailable`, `backend_error` on creation.
template <runtime R>
class basic_stream {
 public:
  explicit basic_stream(int ordinal = 0) : handle_(detail::create_stream(R, ordinal)), device_(ordinal) {}
  ~basic_stream() { detail::destroy_stream(R, handle_); }
  basic_stream(basic_stream&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}
  basic_stream& operator=(basic_stream&& other) noexcept {
    if (this != &other) {
      detail::destroy_stream(R, handle_);
      handle_ = std::exchange(other.handle_, nullptr);
      device_ = other.device_;
    }
    return *this;
  }
  basic_stream(const basic_stream&) = delete;
  basic_stream& operator=(const basic_stream&) = delete;

  [[nodiscard]] stream_ref ref() const noexcept { return {handle_}; }
  operator stream_ref() const noexcept { return ref(); }  // NOLINT: a stream is used as its ref
  [[nodiscard]] int device() const noexcept { return device_; }
  /// Waits for all work on the stream. Throws `backend_error` (e.g. a kernel fault).
  void synchronize() const { detail::synchronize(R, ref(), device_); }

 private:
  void* handle_ = nullptr;
  int device_ = 0;
};

}  // namespace refpool::gpu
