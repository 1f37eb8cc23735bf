// The GPU front end every runtime shares: owning streams, modules of kernels, launches, copies and
// fills, written once (lib/gpu/) over a table of the runtime's entry points. Users include
// refpool/cuda.hpp or refpool/hip.hpp, whose namespaces name these for their runtime
// (cuda::stream is gpu::basic_stream<gpu::runtime::cuda>) and add what differs.
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

/// Grid or block dimensions.
struct dims3 {
  unsigned x = 1, y = 1, z = 1;
};

/// A kernel of a loaded module of runtime R: the runtime's function handle and the module's
/// device. Valid while its module lives.
template <runtime R>
struct basic_kernel {
  void* function = nullptr;
  int device = 0;
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
[[nodiscard]] REFPOOL_API void* load_module(runtime r, int ordinal, std::string_view image);
REFPOOL_API void unload_module(runtime r, void* module, int ordinal) noexcept;
[[nodiscard]] REFPOOL_API void* module_function(runtime r, void* module, int ordinal, const char* name);
REFPOOL_API void launch(runtime r, void* function, int ordinal, dims3 grid, dims3 block, stream_ref s, void** args,
                        unsigned shared_bytes);
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

/// Kernels loaded on a device from an image: PTX or a cubin for CUDA (cuModuleLoadDataEx, JIT),
/// a code object for the device's gfx target for HIP (hipModuleLoadData). Move-only. Every call
/// runs with the module's device current, whatever device the calling thread has.
template <runtime R>
class basic_module {
 public:
  /// Throws `backend_error` on an image the runtime cannot load: for CUDA with the JIT log; for
  /// HIP one without code for the device's target (before HIP 5.4, which aborts the process on
  /// such an image, refpool reads the image's targets first and refuses it itself).
  basic_module(int ordinal, std::string_view image)
      : handle_(detail::load_module(R, ordinal, image)), device_(ordinal) {}
  ~basic_module() { detail::unload_module(R, handle_, device_); }
  basic_module(basic_module&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}
  basic_module& operator=(basic_module&&) = delete;
  basic_module(const basic_module&) = delete;
  basic_module& operator=(const basic_module&) = delete;

  /// The kernel named `name` (its extern "C" name). Throws `backend_error` if absent.
  [[nodiscard]] basic_kernel<R> function(const char* name) const {
    return {detail::module_function(R, handle_, device_, name), device_};
  }

 private:
  void* handle_ = nullptr;
  int device_ = 0;
};

}  // namespace refpool::gpu
