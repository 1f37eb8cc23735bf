// The HIP runtime's module calls, from the libamdhip64 refpool loaded. As refpool does for its own
// calls: a failed call's error is cleared (HIP 7 keeps it for the application's next check), no
// call is made once the process exits (HIP tears itself down then), and before HIP 5.4, which
// aborts the process on a code object without code for the device, the image is checked first.
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#define __HIP_DISABLE_CPP_FUNCTIONS__
#include <hip/hip_runtime_api.h>
#undef hipGetDeviceProperties  // ROCm 6 renames it (another layout); HIP 5.x's is read below

#include <refpool/error.hpp>
#include <refpool/hip.hpp>

#include "gpu_module_calls.hpp"
#include "hip_code_object.hpp"

namespace refpool::test::gpu_modules::calls {

namespace {

// HIP 5.2 and 5.3's hipDeviceProp_t (792 bytes, gcnArchName at 396), which their
// hipGetDeviceProperties fills.
struct device_properties_5 {
  alignas(8) char before[396];
  char gcnArchName[256];
  char after[140];
};
static_assert(sizeof(device_properties_5) == 792);

/// Oldest runtime that reports a code object without code for the device as an error.
constexpr int minimum_checked_load_version = 50'400'000;

struct runtime_calls {
  decltype(&::hipGetDevice) hipGetDevice = nullptr;
  decltype(&::hipSetDevice) hipSetDevice = nullptr;
  decltype(&::hipModuleLoadData) hipModuleLoadData = nullptr;
  decltype(&::hipModuleUnload) hipModuleUnload = nullptr;
  decltype(&::hipModuleGetFunction) hipModuleGetFunction = nullptr;
  decltype(&::hipModuleLaunchKernel) hipModuleLaunchKernel = nullptr;
  decltype(&::hipGetErrorName) hipGetErrorName = nullptr;
  decltype(&::hipGetErrorString) hipGetErrorString = nullptr;
  decltype(&::hipGetLastError) hipGetLastError = nullptr;
  decltype(&::hipStreamBeginCapture) hipStreamBeginCapture = nullptr;
  decltype(&::hipStreamEndCapture) hipStreamEndCapture = nullptr;
  decltype(&::hipGraphDestroy) hipGraphDestroy = nullptr;
  hipError_t (*hipGetDeviceProperties)(device_properties_5*, int) = nullptr;  // where present
  int version = 0;
};

bool exiting = false;  // set by an exit handler registered after HIP loaded: it runs before HIP's teardown

runtime_calls load() {
  // The library refpool loaded (it reported HIP available), among the names refpool tries.
  void* library = nullptr;
  for (const char* name : {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"})
    if ((library = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) != nullptr) break;
  if (library == nullptr) throw backend_unavailable("refpool test support: no libamdhip64 is loaded");
  runtime_calls c;
  const auto resolve = [&](const char* name, auto& slot, bool required = true) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(dlsym(library, name));
    if (slot == nullptr && required)
      throw backend_unavailable(fmt::format("refpool test support: the HIP runtime lacks {}", name));
  };
  decltype(&::hipRuntimeGetVersion) get_version = nullptr;
  resolve("hipRuntimeGetVersion", get_version);
  resolve("hipGetDevice", c.hipGetDevice);
  resolve("hipSetDevice", c.hipSetDevice);
  resolve("hipModuleLoadData", c.hipModuleLoadData);
  resolve("hipModuleUnload", c.hipModuleUnload);
  resolve("hipModuleGetFunction", c.hipModuleGetFunction);
  resolve("hipModuleLaunchKernel", c.hipModuleLaunchKernel);
  resolve("hipGetErrorName", c.hipGetErrorName);
  resolve("hipGetErrorString", c.hipGetErrorString);
  resolve("hipGetLastError", c.hipGetLastError);
  resolve("hipStreamBeginCapture", c.hipStreamBeginCapture);
  resolve("hipStreamEndCapture", c.hipStreamEndCapture);
  resolve("hipGraphDestroy", c.hipGraphDestroy);
  resolve("hipGetDeviceProperties", c.hipGetDeviceProperties, false);
  if (get_version(&c.version) != hipSuccess || c.version != refpool::hip::runtime_version())
    throw backend_unavailable(fmt::format("refpool test support: the loaded HIP runtime is {}, refpool's {}", c.version,
                                          refpool::hip::runtime_version()));
  std::atexit([] { exiting = true; });
  return c;
}

const runtime_calls& api() {
  static const runtime_calls c = load();
  return c;
}

template <class... Parameters, class... Arguments>
hipError_t call(hipError_t (*entry)(Parameters...), Arguments&&... arguments) {
  if (exiting) return hipErrorDeinitialized;
  const hipError_t result = entry(std::forward<Arguments>(arguments)...);
  if (result != hipSuccess) (void)api().hipGetLastError();
  return result;
}

std::string version_text(int v) { return fmt::format("{}.{}.{}", v / 10'000'000, v / 100'000 % 100, v % 100'000); }

// hipSuccess if `image` has code that runs on device `ordinal`; else hipErrorNoBinaryForGpu or
// hipErrorInvalidImage (neither format) with `*why` saying what the image and device have.
hipError_t check_code_object(int ordinal, std::string_view image, std::string* why) {
  const std::string version = version_text(api().version);
  if (api().hipGetDeviceProperties == nullptr) {
    *why = fmt::format("cannot check code objects on HIP {}: the runtime lacks hipGetDeviceProperties", version);
    return hipErrorNotSupported;
  }
  device_properties_5 properties{};
  if (const hipError_t r = call(api().hipGetDeviceProperties, &properties, ordinal); r != hipSuccess) {
    *why =
        fmt::format("cannot read device {}'s target (hipGetDeviceProperties: {})", ordinal, api().hipGetErrorName(r));
    return r;
  }
  const std::string_view device(properties.gcnArchName, strnlen(properties.gcnArchName, sizeof properties.gcnArchName));
  const std::string aborts = fmt::format(
      "HIP {} aborts the process on a code object without code for the device, so it is checked first; HIP {} and "
      "newer report it",
      version, version_text(minimum_checked_load_version));
  const auto targets = hip_code_object::code_object_targets(image);
  if (!targets) {
    *why = fmt::format(
        "cannot read what device {} ({}) would run: the image is neither a clang offload bundle nor an AMDGPU ELF ({})",
        ordinal, device, aborts);
    return hipErrorInvalidImage;
  }
  for (const std::string& target : *targets)
    if (hip_code_object::runs_on(target, device)) return hipSuccess;
  const std::string found = targets->empty() ? "no GPU" : fmt::format("{}", fmt::join(*targets, ", "));
  *why = fmt::format("the code object has no code for device {} ({}): it has code for {} ({})", ordinal, device, found,
                     aborts);
  return hipErrorNoBinaryForGpu;
}

status activate(int device, void** saved) {
  int current = 0;
  if (const hipError_t r = call(api().hipGetDevice, &current); r != hipSuccess) return r;
  *saved = reinterpret_cast<void*>(static_cast<std::intptr_t>(current));
  return current == device ? hipSuccess : call(api().hipSetDevice, device);
}

status restore(void* saved) {
  const int device = static_cast<int>(reinterpret_cast<std::intptr_t>(saved));
  int current = 0;
  if (const hipError_t r = call(api().hipGetDevice, &current); r != hipSuccess) return r;
  return current == device ? hipSuccess : call(api().hipSetDevice, device);
}

status load_module(void** module, int device, std::string_view image, std::string* details) {
  if (api().version < minimum_checked_load_version)
    if (const hipError_t r = check_code_object(device, image, details); r != hipSuccess) return r;
  return call(api().hipModuleLoadData, reinterpret_cast<hipModule_t*>(module), static_cast<const void*>(image.data()));
}

status unload(void* module) { return call(api().hipModuleUnload, static_cast<hipModule_t>(module)); }

status function(void** function, void* module, const char* name) {
  return call(api().hipModuleGetFunction, reinterpret_cast<hipFunction_t*>(function), static_cast<hipModule_t>(module),
              name);
}

status launch(void* function, dims3 grid, dims3 block, unsigned shared_bytes, void* stream, void** args) {
  return call(api().hipModuleLaunchKernel, static_cast<hipFunction_t>(function), grid.x, grid.y, grid.z, block.x,
              block.y, block.z, shared_bytes, static_cast<hipStream_t>(stream), args, static_cast<void**>(nullptr));
}

const char* error_name(status code) { return api().hipGetErrorName(static_cast<hipError_t>(code)); }
const char* error_string(status code) { return api().hipGetErrorString(static_cast<hipError_t>(code)); }

status begin_capture(void* stream) {
  return call(api().hipStreamBeginCapture, static_cast<hipStream_t>(stream), hipStreamCaptureModeRelaxed);
}

status end_capture(void* stream) {
  hipGraph_t graph = nullptr;
  const hipError_t r = call(api().hipStreamEndCapture, static_cast<hipStream_t>(stream), &graph);
  if (graph != nullptr) (void)call(api().hipGraphDestroy, graph);
  return r;
}

}  // namespace

const table& hip() {
  (void)api();  // throws if the runtime cannot be found
  static const table t{"HIP",
                       activate,
                       restore,
                       load_module,
                       unload,
                       function,
                       launch,
                       error_name,
                       error_string,
                       begin_capture,
                       end_capture,
                       "hipSetDevice",
                       "hipModuleLoadData",
                       "hipModuleGetFunction",
                       "hipModuleLaunchKernel"};
  return t;
}

}  // namespace refpool::test::gpu_modules::calls
