// Where a GPU runtime cannot be used, every entry point says why with backend_unavailable, and the
// reason names the real cause: a build without the runtime, its library missing, or (where the
// library loads: Debian's libamdhip64-5 in CI) no device; with a fake HIP runtime, a runtime
// refused (REFPOOL_TEST_REASON: a part the reason must contain). Built once per runtime (tests
// 'cuda-unavailable', 'hip-unavailable', ...); skipped (77) where a device is present.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime_under_test.hpp"
#include "support/gpu_modules.hpp"

namespace {

namespace rt = refpool::test::rt;

bool contains(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

// Whether the runtime's library itself can be loaded here (the names refpool tries).
bool library_loads() {
#ifdef REFPOOL_TEST_HIP
  for (const char* name : {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"})
#else
  for (const char* name : {"libcuda.so.1"})
#endif
    if (dlopen(name, RTLD_NOW | RTLD_LOCAL) != nullptr) return true;
  return false;
}

// What the reason must say, given what this machine has.
bool reason_names_the_cause(const std::string& reason) {
  if (const char* expected = std::getenv("REFPOOL_TEST_REASON")) {
    std::printf("the reason must contain: %s\n", expected);
    return contains(reason, expected);
  }
  if (!refpool::test::compiled_in) return contains(reason, "built without " + std::string(refpool::test::runtime_name));
#ifdef REFPOOL_TEST_HIP
  if (library_loads()) {
    std::puts("the HIP runtime library loads here: the reason must be the missing GPU");
    return contains(reason, "no AMD GPU") && contains(reason, "libamdhip64") &&
           !contains(reason, "could not be loaded");
  }
  std::puts("no HIP runtime library here: the reason must say so");
  return contains(reason, "HIP runtime library could not be loaded") && contains(reason, "libamdhip64.so.5");
#else
  if (library_loads()) {
    std::puts("libcuda.so.1 loads here: the reason must be the driver or the missing device");
    return contains(reason, "NVIDIA driver") || contains(reason, "cuInit failed");
  }
  std::puts("no libcuda.so.1 here: the reason must say so");
  return contains(reason, "libcuda.so.1 could not be loaded");
#endif
}

}  // namespace

int main() {
  if (rt::available()) {
    std::printf("SKIP: a %s device is present\n", std::string(refpool::test::runtime_name).c_str());
    return 77;
  }
  const std::string reason = rt::unavailable_reason();
  std::printf("reason: %s\n", reason.c_str());
  bool ok = !reason.empty() && reason_names_the_cause(reason);
  const std::string said = std::string(refpool::test::runtime_name) + " is unavailable: " + reason;
  const std::vector<std::pair<const char*, std::function<void()>>> entry_points = {
      {"device(0)", [] { (void)rt::device(0); }},
      {"device(0, pinned_host)", [] { (void)rt::device(0, refpool::memory_kind::pinned_host); }},
      {"device_count()", [] { (void)rt::device_count(); }},
      {"driver_version()", [] { (void)rt::driver_version(); }},
      {"device_name(0)", [] { (void)rt::device_name(0); }},
      {"memory_info(0)", [] { (void)rt::memory_info(0); }},
      {"stream()", [] { rt::stream s; }},
      {"synchronize()", [] { rt::synchronize({}); }},
      {"retire_stream()", [] { rt::retire_stream({}); }},
      {"module()", [] { refpool::test::gpu_modules::module<rt::this_runtime> m(0, "code"); }},
      {"launch()",
       [] {
         refpool::test::gpu_modules::launch(refpool::test::gpu_modules::kernel<rt::this_runtime>{}, {1}, {1}, {},
                                            nullptr);
       }},
      {"copy()", [] { rt::copy(nullptr, nullptr, 0, {}); }},
      {"fill()", [] { rt::fill(nullptr, 0, 0, {}); }},
      {"copy_peer()", [] { rt::copy_peer(nullptr, 0, nullptr, 0, 0, {}); }},
#ifdef REFPOOL_TEST_HIP
      {"runtime_version()", [] { (void)rt::runtime_version(); }},
#endif
  };
  for (const auto& [what, call] : entry_points) {
    try {
      call();
      std::printf("%s did not throw backend_unavailable\n", what);
      ok = false;
    } catch (const refpool::backend_unavailable& e) {
      const bool right = contains(e.what(), said);
      std::printf("%s: %s%s\n", what, e.what(), right ? "" : "  <- does not give the reason");
      ok = ok && right;
    }
  }
  return ok ? 0 : 1;
}
