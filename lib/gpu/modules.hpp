// Kernel modules and launches on a GPU runtime, for refpool's GPU tests (they run kernels on pool
// buffers): not installed, not API. The functions are exported from librefpool so that test
// programs linked against the shared library reach them (test/support/gpu_modules.hpp).
#pragma once

#include <string_view>
#include <utility>

#include <refpool/detail/export.hpp>
#include <refpool/gpu.hpp>
#include <refpool/types.hpp>

namespace refpool::gpu {

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

/// The library's entry points behind basic_module and launch (lib/gpu/modules.cpp). Each throws
/// `backend_unavailable` when runtime R cannot be used and `backend_error` when a call fails.
namespace detail {
[[nodiscard]] REFPOOL_API void* load_module(runtime r, int ordinal, std::string_view image);
REFPOOL_API void unload_module(runtime r, void* module, int ordinal) noexcept;
[[nodiscard]] REFPOOL_API void* module_function(runtime r, void* module, int ordinal, const char* name);
REFPOOL_API void launch(runtime r, void* function, int ordinal, dims3 grid, dims3 block, stream_ref s, void** args,
                        unsigned shared_bytes);
}  // namespace detail

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

/// Launches `k` on `s` with `args` (pointers to each argument, as cuLaunchKernel and
/// hipModuleLaunchKernel take them), with the kernel's device current.
template <runtime R>
void launch(const basic_kernel<R>& k, dims3 grid, dims3 block, stream_ref s, void** args, unsigned shared_bytes = 0) {
  detail::launch(R, k.function, k.device, grid, block, s, args, shared_bytes);
}

/// Launches `k` with the arguments given by value.
template <runtime R, class... Args>
void launch_with(const basic_kernel<R>& k, dims3 grid, dims3 block, stream_ref s, Args... args) {
  void* pointers[] = {static_cast<void*>(&args)..., nullptr};
  launch(k, grid, block, s, pointers);
}

}  // namespace refpool::gpu
