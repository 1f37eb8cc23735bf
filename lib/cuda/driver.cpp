// Loading libcuda.so.1 and its entry points, once per process.
#include "driver.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "../gpu/loaded_runtime.hpp"
#include "../gpu/runtime_api.hpp"

namespace refpool::detail::cuda {

namespace {

struct loaded : gpu::loaded_runtime<driver_api> {
  std::vector<CUcontext> contexts;
  std::unique_ptr<std::once_flag[]> context_once;
};

loaded load() {
  loaded out;
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    out.failure = fmt::format("libcuda.so.1 could not be loaded (is the NVIDIA driver installed?): {}",
                              why != nullptr ? why : "unknown reason");
    return out;
  }
  // Never dlclose: blocks and contexts may be used until exit.
  using get_proc_t = decltype(&::cuGetProcAddress);
  auto get_proc = reinterpret_cast<get_proc_t>(dlsym(library, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    out.failure = fmt::format("the NVIDIA driver is too old: it lacks cuGetProcAddress_v2 (CUDA {}.{} or newer needed)",
                              minimum_driver_version / 1000, minimum_driver_version % 1000 / 10);
    return out;
  }
  driver_api& api = out.api;
  const auto resolve = [&](const char* name, void** slot, int version) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    const CUresult r = get_proc(name, slot, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    return r == CUDA_SUCCESS && found == CU_GET_PROC_ADDRESS_SUCCESS && *slot != nullptr;
  };
  if (!resolve("cuDriverGetVersion", reinterpret_cast<void**>(&api.cuDriverGetVersion), 2020) ||
      api.cuDriverGetVersion(&api.version) != CUDA_SUCCESS) {
    out.failure = "the NVIDIA driver does not report its version";
    return out;
  }
  if (api.version < minimum_driver_version) {
    out.failure = fmt::format("the NVIDIA driver is too old: it supports CUDA {}.{}, refpool needs {}.{} or newer",
                              api.version / 1000, api.version % 1000 / 10, minimum_driver_version / 1000,
                              minimum_driver_version % 1000 / 10);
    return out;
  }
#define REFPOOL_CUDA_RESOLVE(name, abi)                                                                             \
  if (!resolve(#name, reinterpret_cast<void**>(&api.name), abi)) {                                                  \
    out.failure =                                                                                                   \
        fmt::format("the NVIDIA driver (CUDA {}.{}) lacks {}", api.version / 1000, api.version % 1000 / 10, #name); \
    return out;                                                                                                     \
  }
  REFPOOL_CUDA_DRIVER_SYMBOLS(REFPOOL_CUDA_RESOLVE)
#undef REFPOOL_CUDA_RESOLVE
  const CUresult init = api.cuInit(0);
  if (init == CUDA_ERROR_NO_DEVICE ||
      (init == CUDA_SUCCESS && api.cuDeviceGetCount(&api.device_count) == CUDA_SUCCESS && api.device_count == 0)) {
    out.failure = "the NVIDIA driver is installed but there is no CUDA device";
    return out;
  }
  if (init != CUDA_SUCCESS) {
    const char* name = nullptr;
    api.cuGetErrorName(init, &name);
    out.failure = fmt::format("cuInit failed: {} ({})", name != nullptr ? name : "unknown", static_cast<int>(init));
    return out;
  }
  out.contexts.assign(static_cast<std::size_t>(api.device_count), nullptr);
  out.context_once = std::make_unique<std::once_flag[]>(static_cast<std::size_t>(api.device_count));
  return out;
}

loaded& state() {
  static loaded& instance = *new loaded(load());  // never destroyed: frees come from static destructors
  return instance;
}

}  // namespace

const driver_api& driver() { return gpu::usable_entries(state(), "CUDA"); }

const std::string& failure() noexcept { return gpu::load_failure(state, "the CUDA driver could not be loaded"); }

int device_count() { return driver().device_count; }

int version() { return driver().version; }

CUcontext context(int ordinal) {
  const driver_api& api = driver();
  if (ordinal < 0 || ordinal >= api.device_count)
    throw backend_unavailable(
        fmt::format("refpool: CUDA device {} does not exist ({} device(s) present)", ordinal, api.device_count));
  loaded& s = state();
  const auto index = static_cast<std::size_t>(ordinal);
  std::call_once(s.context_once[index], [&] {
    CUdevice device = 0;
    check(api.cuDeviceGet(&device, ordinal), "cuDeviceGet", fmt::format("device {}", ordinal));
    check(api.cuDevicePrimaryCtxRetain(&s.contexts[index], device), "cuDevicePrimaryCtxRetain",
          fmt::format("device {}", ordinal));
  });
  return s.contexts[index];
}

void check(CUresult result, const char* call, const std::string& details) {
  if (result != CUDA_SUCCESS) gpu::throw_error(table(), static_cast<int>(result), call, details);
}

}  // namespace refpool::detail::cuda
