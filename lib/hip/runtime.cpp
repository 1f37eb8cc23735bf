// Loading libamdhip64 and its entry points, once per process.
#include "runtime.hpp"

#include <dlfcn.h>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::detail::hip {

namespace {

struct loaded {
  runtime_api api;
  std::string failure;  // why the runtime cannot be used; empty on success
};

std::string version_text(int version) {
  return fmt::format("{}.{}.{}", version / 10'000'000, version / 100'000 % 100, version % 100'000);
}

loaded load() {
  loaded out;
  runtime_api& api = out.api;
  void* library = nullptr;
  std::string errors;
  for (const char* name : library_names) {
    library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      api.library = name;
      break;
    }
    const char* why = dlerror();
    errors += fmt::format("{}{}", errors.empty() ? "" : "; ", why != nullptr ? why : name);
  }
  if (library == nullptr) {
    out.failure = fmt::format("the HIP runtime library could not be loaded (is libamdhip64 installed: Debian's "
                              "libamdhip64-5, or ROCm?): {}",
                              errors);
    return out;
  }
  // Never dlclose: blocks and streams may be used until exit.
  const auto resolve = [&](const char* name, void** slot) {
    *slot = dlsym(library, name);
    if (*slot == nullptr)
      out.failure = fmt::format("the HIP runtime {}{} lacks {}", api.library,
                                api.version != 0 ? " (HIP " + version_text(api.version) + ")" : "", name);
    return *slot != nullptr;
  };
  if (!resolve("hipRuntimeGetVersion", reinterpret_cast<void**>(&api.hipRuntimeGetVersion))) return out;
  if (api.hipRuntimeGetVersion(&api.version) != hipSuccess) {
    out.failure = fmt::format("the HIP runtime {} does not report its version", api.library);
    return out;
  }
  if (api.version < minimum_runtime_version) {
    out.failure = fmt::format("the HIP runtime {} is too old: HIP {}, refpool needs {} or newer", api.library,
                              version_text(api.version), version_text(minimum_runtime_version));
    return out;
  }
#define REFPOOL_HIP_RESOLVE(name) \
  if (!resolve(#name, reinterpret_cast<void**>(&api.name))) return out;
#define REFPOOL_HIP_RESOLVE_TYPED(name, type) REFPOOL_HIP_RESOLVE(name)
  REFPOOL_HIP_RUNTIME_SYMBOLS(REFPOOL_HIP_RESOLVE, REFPOOL_HIP_RESOLVE_TYPED)
#undef REFPOOL_HIP_RESOLVE
#undef REFPOOL_HIP_RESOLVE_TYPED
  const std::string loaded_text = fmt::format("{}, HIP {}", api.library, version_text(api.version));
  const hipError_t count = api.hipGetDeviceCount(&api.device_count);
  if (count == hipErrorNoDevice || (count == hipSuccess && api.device_count <= 0)) {
    out.failure = fmt::format("the HIP runtime loaded ({}) but there is no AMD GPU (hipGetDeviceCount: {})",
                              loaded_text, count == hipSuccess ? "0 devices" : api.hipGetErrorName(count));
  } else if (count != hipSuccess) {
    out.failure = fmt::format("hipGetDeviceCount failed: {} ({}): {} ({})", api.hipGetErrorName(count),
                              static_cast<int>(count), api.hipGetErrorString(count), loaded_text);
  }
  if (!out.failure.empty()) api.device_count = 0;
  return out;
}

const loaded& state() {
  static const loaded instance = load();
  return instance;
}

}  // namespace

const runtime_api& runtime() {
  const loaded& s = state();
  if (!s.failure.empty()) throw backend_unavailable(fmt::format("refpool: HIP is unavailable: {}", s.failure));
  return s.api;
}

std::string unavailable_reason() noexcept {
  try {
    return state().failure;
  } catch (...) {
    return "the HIP runtime could not be loaded";
  }
}

void check_device(int ordinal) {
  const runtime_api& api = runtime();
  if (ordinal < 0 || ordinal >= api.device_count)
    throw backend_unavailable(
        fmt::format("refpool: HIP device {} does not exist ({} device(s) present)", ordinal, api.device_count));
}

}  // namespace refpool::detail::hip
