// Kernel modules and launches (gpu_modules.hpp), written once over a runtime's module calls. Every
// call runs with the module's device current: HIP's hipModuleGetFunction aborts the process
// otherwise (ROCm 5.2 to 6.3), and CUDA unloads a module from the current context.
#include "gpu_modules.hpp"

#include <exception>

#include <fmt/format.h>

#include <refpool/config.hpp>
#include <refpool/error.hpp>

#include "gpu_module_calls.hpp"

namespace refpool::test::gpu_modules::detail {

namespace {

using calls::status;

// The runtime's calls once refpool can use it; else refpool's own reason, as refpool throws it.
const calls::table& usable(runtime r) {
  const std::string_view name = r == runtime::cuda ? "CUDA" : "HIP";
  if (!refpool::gpu::detail::available(r))
    throw backend_unavailable(
        fmt::format("refpool: {} is unavailable: {}", name, refpool::gpu::detail::unavailable_reason(r)));
#if REFPOOL_HAS_CUDA
  if (r == runtime::cuda) return calls::cuda();
#endif
#if REFPOOL_HAS_HIP
  if (r == runtime::hip) return calls::hip();
#endif
  throw backend_unavailable(fmt::format("refpool: {} is unavailable: not built in", name));  // available() said no
}

[[noreturn]] void throw_error(const calls::table& api, status code, std::string_view call, std::string_view details) {
  const char* name = api.error_name(code);
  const char* text = api.error_string(code);
  throw backend_error(fmt::format("refpool: {} error {} ({}): {}, in {} ({})", api.name, name ? name : "unknown", code,
                                  text ? text : "no description", call, details),
                      code);
}

void check(const calls::table& api, status code, std::string_view call, std::string_view details) {
  if (code != 0) throw_error(api, code, call, details);
}

// Makes a device current for a scope, restoring the previous one after.
class device_guard {
 public:
  device_guard(runtime r, const calls::table& api, int device) : api_(api) {
    const int count = refpool::gpu::detail::device_count(r);
    if (device < 0 || device >= count)
      throw backend_unavailable(
          fmt::format("refpool: {} device {} does not exist ({} device(s) present)", api.name, device, count));
    check(api_, api_.activate(device, &saved_), api_.activate_call, fmt::format("device {}", device));
  }
  ~device_guard() { (void)api_.restore(saved_); }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  const calls::table& api_;
  void* saved_ = nullptr;
};

}  // namespace

void* load_module(runtime r, int ordinal, std::string_view image) {
  const calls::table& api = usable(r);
  device_guard guard(r, api, ordinal);
  void* module = nullptr;
  std::string details;
  const status code = api.load(&module, ordinal, image, &details);  // before `details` is formatted
  check(api, code, api.load_call,
        fmt::format("device {}, {} B image{}{}", ordinal, image.size(), details.empty() ? "" : "; ", details));
  return module;
}

void unload_module(runtime r, void* module, int ordinal) noexcept {
  if (module == nullptr) return;
  try {
    const calls::table& api = usable(r);
    device_guard guard(r, api, ordinal);
    (void)api.unload(module);
  } catch (const std::exception&) {  // the device cannot be made current: the module goes with the process
  }
}

void* module_function(runtime r, void* module, int ordinal, const char* name) {
  const calls::table& api = usable(r);
  device_guard guard(r, api, ordinal);
  void* function = nullptr;
  check(api, api.function(&function, module, name), api.function_call, name);
  return function;
}

void launch(runtime r, void* function, int ordinal, dims3 grid, dims3 block, stream_ref s, void** args,
            unsigned shared_bytes) {
  const calls::table& api = usable(r);
  device_guard guard(r, api, ordinal);
  check(api, api.launch(function, grid, block, shared_bytes, s.handle, args), api.launch_call,
        fmt::format("grid ({}, {}, {}), block ({}, {}, {})", grid.x, grid.y, grid.z, block.x, block.y, block.z));
}

void begin_capture(runtime r, stream_ref s, int ordinal) {
  const calls::table& api = usable(r);
  device_guard guard(r, api, ordinal);
  check(api, api.begin_capture(s.handle), "begin capture", fmt::format("stream {}", s.handle));
}

int end_capture(runtime r, stream_ref s, int ordinal) {
  const calls::table& api = usable(r);
  device_guard guard(r, api, ordinal);
  return api.end_capture(s.handle);
}

}  // namespace refpool::test::gpu_modules::detail
