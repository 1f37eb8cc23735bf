// The table of a runtime this build does not contain (-Dcuda=disabled, -Dhip=disabled, or its
// header not found): everything links, and every call says why it cannot work.
#include <refpool/config.hpp>

#include "runtime_api.hpp"

namespace refpool::detail::gpu {

#if !REFPOOL_HAS_CUDA || !REFPOOL_HAS_HIP
// Only failure() is ever called: every front-end call checks it first.
static runtime_api compiled_out(std::string_view name, const std::string& (*failure)() noexcept) {
  runtime_api api;
  api.name = name;
  api.failure = failure;
  return api;
}
#endif

}  // namespace refpool::detail::gpu

#if !REFPOOL_HAS_CUDA
const refpool::detail::gpu::runtime_api& refpool::detail::cuda::table() {
  static const gpu::runtime_api api = gpu::compiled_out("CUDA", []() noexcept -> const std::string& {
    static const std::string& why =  // never destroyed: asked from static destructors too
        *new std::string("refpool was built without CUDA support (no cuda.h found, or -Dcuda=disabled)");
    return why;
  });
  return api;
}
#endif

#if !REFPOOL_HAS_HIP
const refpool::detail::gpu::runtime_api& refpool::detail::hip::table() {
  static const gpu::runtime_api api = gpu::compiled_out("HIP", []() noexcept -> const std::string& {
    static const std::string& why =  // never destroyed: asked from static destructors too
        *new std::string("refpool was built without HIP support (no hip/hip_runtime_api.h found, or -Dhip=disabled)");
    return why;
  });
  return api;
}
#endif
