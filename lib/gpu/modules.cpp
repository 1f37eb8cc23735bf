// The front end's modules and launches (refpool/gpu.hpp). Every call runs with the module's device
// current: HIP's hipModuleGetFunction aborts the process otherwise (ROCm 5.2 to 6.3), and CUDA
// unloads a module from the current context.
#include <fmt/format.h>

#include "modules.hpp"
#include "runtime_api.hpp"

namespace refpool::gpu::detail {

namespace internal = refpool::detail::gpu;

void* load_module(runtime r, int ordinal, std::string_view image) {
  const internal::runtime_api& api = internal::usable(r);
  internal::device_guard guard(api, ordinal);
  internal::handle module = nullptr;
  std::string details;
  const internal::status code = api.module_load(&module, ordinal, image, &details);
  internal::check(
      api, code, api.module_load.name,
      fmt::format("device {}, {} B image{}{}", ordinal, image.size(), details.empty() ? "" : "; ", details));
  return module;
}

void unload_module(runtime r, void* module, int ordinal) noexcept {
  if (module == nullptr) return;
  try {
    const internal::runtime_api& api = internal::usable(r);
    internal::device_guard guard(api, ordinal);
    (void)api.module_unload(module);
  } catch (const std::exception&) {  // the device cannot be made current: the module goes with the process
  }
}

void* module_function(runtime r, void* module, int ordinal, const char* name) {
  const internal::runtime_api& api = internal::usable(r);
  internal::device_guard guard(api, ordinal);
  internal::handle function = nullptr;
  internal::check(api, api.module_function(&function, module, name), api.module_function.name, name);
  return function;
}

void launch(runtime r, void* function, int ordinal, dims3 grid, dims3 block, stream_ref s, void** args,
            unsigned shared_bytes) {
  const internal::runtime_api& api = internal::usable(r);
  internal::device_guard guard(api, ordinal);
  internal::check(
      api, api.launch(function, grid, block, shared_bytes, s.handle, args), api.launch.name,
      fmt::format("grid ({}, {}, {}), block ({}, {}, {})", grid.x, grid.y, grid.z, block.x, block.y, block.z));
}

}  // namespace refpool::gpu::detail
