// Loading libamdhip64 and its entry points, once per process: the runtime the process already
// has, else the newest installed of the majors refpool was reviewed against.
#include "runtime.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iterator>

#include <fmt/format.h>

#include "../gpu/loaded_runtime.hpp"

namespace refpool::detail::hip {

namespace {

using loaded = gpu::loaded_runtime<runtime_api>;

// "5, 6 and 7"
std::string reviewed_text() {
  std::string out;
  for (std::size_t i = 0; i < std::size(reviewed_majors); ++i)
    out += fmt::format("{}{}", i == 0 ? "" : i + 1 == std::size(reviewed_majors) ? " and " : ", ", reviewed_majors[i]);
  return out;
}

// Why the runtime loaded by `name` cannot be used, judged by the version it reports; empty if it can.
std::string refusal(const runtime_api& api, library_name name) {
  const int major = api.version / 10'000'000;
  if (name.major != 0 && major != name.major)
    return fmt::format("the HIP runtime {} is HIP {}, not HIP {} as its name says", api.library,
                       version_text(api.version), name.major);
  if (std::find(std::begin(reviewed_majors), std::end(reviewed_majors), major) == std::end(reviewed_majors))
    return fmt::format(
        "the HIP runtime {} is HIP {}: refpool supports HIP {} (the releases it was reviewed against, "
        "docs/hip.md)",
        api.library, version_text(api.version), reviewed_text());
  if (api.version < minimum_runtime_version)
    return fmt::format("the HIP runtime {} is too old: HIP {}, refpool needs {} or newer", api.library,
                       version_text(api.version), version_text(minimum_runtime_version));
  return {};
}

// Checks and resolves the runtime `library`, loaded by `name`. Never dlclose()d: blocks and
// streams may be used until exit, and an already loaded runtime is the application's.
loaded use(void* library, library_name name, bool already_loaded) {
  loaded out;
  runtime_api& api = out.api;
  api.library = name.name;
  api.already_loaded = already_loaded;
  const auto resolve = [&](const char* symbol, void** slot) {
    *slot = dlsym(library, symbol);
    if (*slot == nullptr)
      out.failure = fmt::format("the HIP runtime {}{} lacks {}", api.library,
                                api.version != 0 ? " (HIP " + version_text(api.version) + ")" : "", symbol);
    return *slot != nullptr;
  };
  if (!resolve("hipRuntimeGetVersion", reinterpret_cast<void**>(&api.hipRuntimeGetVersion))) return out;
  if (api.hipRuntimeGetVersion(&api.version) != hipSuccess) {
    out.failure = fmt::format("the HIP runtime {} does not report its version", api.library);
  } else if (std::string why = refusal(api, name); !why.empty()) {
    out.failure = std::move(why);
    if (already_loaded)
      out.failure += fmt::format(
          " (this process already has {} loaded: refpool uses that runtime or none, since a "
          "second one would know nothing of the application's streams and pointers)",
          api.library);
  }
  if (!out.failure.empty()) return out;
#define REFPOOL_HIP_RESOLVE(symbol) \
  if (!resolve(#symbol, reinterpret_cast<void**>(&api.symbol))) return out;
#define REFPOOL_HIP_RESOLVE_TYPED(symbol, type) REFPOOL_HIP_RESOLVE(symbol)
  REFPOOL_HIP_RUNTIME_SYMBOLS(REFPOOL_HIP_RESOLVE, REFPOOL_HIP_RESOLVE_TYPED)
#undef REFPOOL_HIP_RESOLVE
#undef REFPOOL_HIP_RESOLVE_TYPED
#define REFPOOL_HIP_RESOLVE_OPTIONAL(symbol) \
  api.symbol = reinterpret_cast<decltype(api.symbol)>(dlsym(library, #symbol));
#define REFPOOL_HIP_RESOLVE_OPTIONAL_TYPED(symbol, type) REFPOOL_HIP_RESOLVE_OPTIONAL(symbol)
  REFPOOL_HIP_OPTIONAL_SYMBOLS(REFPOOL_HIP_RESOLVE_OPTIONAL, REFPOOL_HIP_RESOLVE_OPTIONAL_TYPED)
#undef REFPOOL_HIP_RESOLVE_OPTIONAL
#undef REFPOOL_HIP_RESOLVE_OPTIONAL_TYPED
  const std::string loaded_text = fmt::format("{}, HIP {}", api.library, version_text(api.version));
  const hipError_t count = api.hipGetDeviceCount(&api.device_count);
  if (count == hipErrorNoDevice || (count == hipSuccess && api.device_count <= 0)) {
    out.failure = fmt::format("the HIP runtime loaded ({}) but there is no AMD GPU (hipGetDeviceCount: {})",
                              loaded_text, count == hipSuccess ? "0 devices" : api.hipGetErrorName(count));
  } else if (count != hipSuccess) {
    out.failure = fmt::format("hipGetDeviceCount failed: {} ({}): {} ({})", api.hipGetErrorName(count),
                              static_cast<int>(count), api.hipGetErrorString(count), loaded_text);
  }
  if (count != hipSuccess) (void)api.hipGetLastError();  // as call() does (runtime.hpp)
  if (!out.failure.empty()) api.device_count = 0;
  return out;
}

std::atomic<bool> exiting{false};

// Registered after the runtime's library is loaded, so it runs before the runtime's teardown.
void mark_exiting() { exiting = true; }

loaded load() {
  for (const library_name& name : library_names)
    if (void* library = dlopen(name.name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
      std::atexit(mark_exiting);
      return use(library, name, true);
    }
  std::string errors;
  for (const library_name& name : library_names) {
    if (void* library = dlopen(name.name, RTLD_NOW | RTLD_LOCAL)) {
      std::atexit(mark_exiting);
      return use(library, name, false);
    }
    const char* why = dlerror();
    errors += fmt::format("{}{}", errors.empty() ? "" : "; ", why != nullptr ? why : name.name);
  }
  loaded out;
  out.failure = fmt::format(
      "the HIP runtime library could not be loaded (is libamdhip64 installed: Debian's "
      "libamdhip64-5, or ROCm?): {}",
      errors);
  return out;
}

const loaded& state() {
  static const loaded& instance = *new loaded(load());  // never destroyed: frees come from static destructors
  return instance;
}

}  // namespace

bool process_exiting() noexcept { return exiting.load(std::memory_order_relaxed); }

std::string version_text(int version) {
  return fmt::format("{}.{}.{}", version / 10'000'000, version / 100'000 % 100, version % 100'000);
}

const runtime_api& runtime() { return gpu::usable_entries(state(), "HIP"); }

const std::string& failure() noexcept { return gpu::load_failure(state, "the HIP runtime could not be loaded"); }

int device_count() { return runtime().device_count; }

int version() { return runtime().version; }

}  // namespace refpool::detail::hip
