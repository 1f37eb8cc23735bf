// Kernel modules and launches for the GPU tests (they run kernels on pool buffers). Test tooling,
// not part of librefpool: built into the test-support library (test/support/meson.build), over the
// very runtime library refpool loaded. Each call throws `backend_unavailable` when runtime R cannot
// be used (the same reason refpool gives) and `backend_error` when the runtime call fails.
#pragma once

#include <string_view>
#include <utility>

#include <refpool/gpu.hpp>
#include <refpool/types.hpp>

namespace refpool::test::gpu_modules {

using refpool::gpu::runtime;

/// Grid or block dimensions.
struct dims3 {
  unsigned x = 1, y = 1, z = 1;
};

/// The entry points behind module and launch (gpu_modules.cpp).
namespace detail {
[[nodiscard]] void* load_module(runtime r, int ordinal, std::string_view image);
void unload_module(runtime r, void* module, int ordinal) noexcept;
[[nodiscard]] void* module_function(runtime r, void* module, int ordinal, const char* name);
void launch(runtime r, void* function, int ordinal, dims3 grid, dims3 block, stream_ref s, void** args,
            unsigned shared_bytes);
void begin_capture(runtime r, stream_ref s, int ordinal);
[[nodiscard]] int end_capture(runtime r, stream_ref s, int ordinal);
}  // namespace detail

/// A graph capture on `s` of device `ordinal` (relaxed mode: other threads' calls are not refused,
/// as in PyTorch's capture_error_mode="relaxed"), begun at construction; end() ends it, destroys
/// the graph and returns the runtime's status: 0 when the capture held, else why it broke
/// (invalidated, unjoined). Ended at destruction if end() was not called. Throws `backend_error`
/// when the capture cannot begin.
template <runtime R>
class capture {
 public:
  capture(stream_ref s, int ordinal) : stream_(s), device_(ordinal) { detail::begin_capture(R, s, ordinal); }
  ~capture() {
    if (!ended_) (void)detail::end_capture(R, stream_, device_);
  }
  capture(const capture&) = delete;
  capture& operator=(const capture&) = delete;
  [[nodiscard]] int end() {
    ended_ = true;
    return detail::end_capture(R, stream_, device_);
  }

 private:
  stream_ref stream_;
  int device_ = 0;
  bool ended_ = false;
};

/// A kernel of a loaded module of runtime R: the runtime's function handle and the module's
/// device. Valid while its module lives.
template <runtime R>
struct kernel {
  void* function = nullptr;
  int device = 0;
};

/// Kernels loaded on a device from an image: PTX or a cubin for CUDA (cuModuleLoadDataEx, JIT),
/// a code object for the device's gfx target for HIP (hipModuleLoadData). Move-only. Every call
/// runs with the module's device current, whatever device the calling thread has.
template <runtime R>
class module {
 public:
  /// Throws `backend_error` on an image the runtime cannot load: for CUDA with the JIT log; for
  /// HIP one without code for the device's target (before HIP 5.4, which aborts the process on
  /// such an image, the image's targets are read first and it is refused here).
  module(int ordinal, std::string_view image) :handle_(detail::load_module(R, ordinal, image)), device_(ordinal) {}
  ~module() { detail::unload_module(R, handle_, device_); }
  module(module&& other) noexcept :handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}
  module& operator=(module&&) = delete;
  module(const module&) = delete;
  module& operator=(const module&) = delete;

  /// The kernel named `name` (its extern "C" name). Throws `backend_error` if absent.
  [[nodiscard]] kernel<R> function(const char* name) const {
    return {detail::module_function(R, handle_, device_, name), device_};
  }

 private:
  void* handle_ = nullptr;
  int device_ = 0;
};

/// Launches `k` on `s` with `args` (pointers to each argument, as cuLaunchKernel and
/// hipModuleLaunchKernel take them), with the kernel's device current.
template <runtime R>
void launch(const kernel<R>& k, dims3 grid, dims3 block, stream_ref s, void** args, unsigned shared_bytes = 0) {
  detail::launch(R, k.function, k.device, grid, block, s, args, shared_bytes);
}

/// Launches `k` with the arguments given by value.
template <runtime R, class... Args>
void launch_with(const kernel<R>& k, dims3 grid, dims3 block, stream_ref s, Args... args) {
  void* pointers[] = {static_cast<void*>(&args)..., nullptr};
  launch(k, grid, block, s, pointers);
}

using cuda_module = module<runtime::cuda>;
using cuda_kernel = kernel<runtime::cuda>;
using hip_module = module<runtime::hip>;
using hip_kernel = kernel<runtime::hip>;

}  // namespace refpool::test::gpu_modules
