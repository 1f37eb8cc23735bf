// The CUDA driver's module calls, from the libcuda.so.1 refpool loaded, resolved the way refpool
// resolves its own (cuGetProcAddress_v2, at the ABI of CUDA 12.0, which cuda.h's prototypes declare:
// the headers' CUDA_VERSION may name a newer ABI with other parameters, lib/cuda/driver.hpp).
#include <dlfcn.h>

#include <type_traits>

#include <fmt/format.h>

#include <cuda.h>

#include <refpool/error.hpp>

#include "gpu_module_calls.hpp"

namespace refpool::test::gpu_modules::calls {

namespace {

struct driver {
  decltype(&::cuCtxGetCurrent) cuCtxGetCurrent = nullptr;
  decltype(&::cuCtxSetCurrent) cuCtxSetCurrent = nullptr;
  decltype(&::cuDeviceGet) cuDeviceGet = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) cuDevicePrimaryCtxRetain = nullptr;
  decltype(&::cuModuleLoadDataEx) cuModuleLoadDataEx = nullptr;
  decltype(&::cuModuleUnload) cuModuleUnload = nullptr;
  decltype(&::cuModuleGetFunction) cuModuleGetFunction = nullptr;
  decltype(&::cuLaunchKernel) cuLaunchKernel = nullptr;
  decltype(&::cuGetErrorName) cuGetErrorName = nullptr;
  decltype(&::cuGetErrorString) cuGetErrorString = nullptr;
};

driver load() {
  // RTLD_NOLOAD: only the library refpool has loaded (refpool reported CUDA available).
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  auto get_proc =
      library ? reinterpret_cast<decltype(&::cuGetProcAddress)>(dlsym(library, "cuGetProcAddress_v2")) : nullptr;
  if (get_proc == nullptr) throw backend_unavailable("refpool test support: libcuda.so.1 is not loaded");
  driver d;
  const auto resolve = [&](const char* name, auto& slot) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    void* p = nullptr;
    if (get_proc(name, &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS || p == nullptr)
      throw backend_unavailable(fmt::format("refpool test support: the CUDA driver lacks {}", name));
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(p);
  };
  resolve("cuCtxGetCurrent", d.cuCtxGetCurrent);
  resolve("cuCtxSetCurrent", d.cuCtxSetCurrent);
  resolve("cuDeviceGet", d.cuDeviceGet);
  resolve("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain);
  resolve("cuModuleLoadDataEx", d.cuModuleLoadDataEx);
  resolve("cuModuleUnload", d.cuModuleUnload);
  resolve("cuModuleGetFunction", d.cuModuleGetFunction);
  resolve("cuLaunchKernel", d.cuLaunchKernel);
  resolve("cuGetErrorName", d.cuGetErrorName);
  resolve("cuGetErrorString", d.cuGetErrorString);
  return d;
}

const driver& api() {
  static const driver d = load();
  return d;
}

// The device's primary context, the one refpool's memory lives in (retained once, for the process).
status activate(int device, void** saved) {
  CUdevice dev = 0;
  CUcontext wanted = nullptr, current = nullptr;
  if (CUresult r = api().cuDeviceGet(&dev, device); r != CUDA_SUCCESS) return r;
  if (CUresult r = api().cuDevicePrimaryCtxRetain(&wanted, dev); r != CUDA_SUCCESS) return r;
  if (CUresult r = api().cuCtxGetCurrent(&current); r != CUDA_SUCCESS) return r;
  *saved = current;
  return current == wanted ? CUDA_SUCCESS : api().cuCtxSetCurrent(wanted);
}

status restore(void* saved) {
  CUcontext current = nullptr;
  api().cuCtxGetCurrent(&current);
  return current == saved ? CUDA_SUCCESS : api().cuCtxSetCurrent(static_cast<CUcontext>(saved));
}

status load_module(void** module, int, std::string_view image, std::string* details) {
  const std::string text(image);  // PTX must end in a NUL
  char log[4096] = {};
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {log, reinterpret_cast<void*>(sizeof log)};
  const CUresult r = api().cuModuleLoadDataEx(reinterpret_cast<CUmodule*>(module), text.c_str(), 2, options, values);
  if (r != CUDA_SUCCESS) *details = fmt::format("JIT log: {}", log);
  return r;
}

status unload(void* module) { return api().cuModuleUnload(static_cast<CUmodule>(module)); }

status function(void** function, void* module, const char* name) {
  return api().cuModuleGetFunction(reinterpret_cast<CUfunction*>(function), static_cast<CUmodule>(module), name);
}

status launch(void* function, dims3 grid, dims3 block, unsigned shared_bytes, void* stream, void** args) {
  return api().cuLaunchKernel(static_cast<CUfunction>(function), grid.x, grid.y, grid.z, block.x, block.y, block.z,
                              shared_bytes, static_cast<CUstream>(stream), args, nullptr);
}

const char* error_name(status code) {
  const char* name = nullptr;
  return api().cuGetErrorName(static_cast<CUresult>(code), &name) == CUDA_SUCCESS ? name : nullptr;
}

const char* error_string(status code) {
  const char* text = nullptr;
  return api().cuGetErrorString(static_cast<CUresult>(code), &text) == CUDA_SUCCESS ? text : nullptr;
}

}  // namespace

const table& cuda() {
  (void)api();  // throws if the driver cannot be found
  static const table t{"CUDA",
                       activate,
                       restore,
                       load_module,
                       unload,
                       function,
                       launch,
                       error_name,
                       error_string,
                       "cuCtxSetCurrent",
                       "cuModuleLoadDataEx",
                       "cuModuleGetFunction",
                       "cuLaunchKernel"};
  return t;
}

}  // namespace refpool::test::gpu_modules::calls
