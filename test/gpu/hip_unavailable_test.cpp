// Where HIP cannot be used, every entry point says why with backend_unavailable, and the reason
// names the real cause: a build without HIP, no HIP runtime library, or (where the runtime is
// installed, as Debian's libamdhip64-5 is in CI) no AMD GPU; with a fake runtime library, a runtime
// too old or lacking an entry point. Skipped (77) where an AMD GPU is present.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <refpool/refpool.hpp>

namespace {

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

#if REFPOOL_HAS_HIP
// Whether the HIP runtime library itself can be loaded here (the names refpool tries).
bool runtime_library_loads() {
  for (const char* name : {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"})
    if (dlopen(name, RTLD_NOW | RTLD_LOCAL) != nullptr) return true;
  return false;
}
#endif

template <class F>
bool throws_unavailable(const char* what, F f) {
  try {
    f();
  } catch (const refpool::backend_unavailable& e) {
    std::printf("%s: %s\n", what, e.what());
    return contains(e.what(), "HIP is unavailable: ") && contains(e.what(), refpool::hip::unavailable_reason().c_str());
  }
  std::printf("%s did not throw backend_unavailable\n", what);
  return false;
}

}  // namespace

int main() {
  if (refpool::hip::available()) {
    std::puts("SKIP: an AMD GPU is present");
    return 77;
  }
  const std::string reason = refpool::hip::unavailable_reason();
  std::printf("reason: %s\n", reason.c_str());
  bool ok = !reason.empty();
#if REFPOOL_HAS_HIP
  if (const char* expected = std::getenv("REFPOOL_TEST_HIP_REASON")) {  // a fake runtime (fake_amdhip64.cpp)
    std::printf("the reason must contain: %s\n", expected);
    ok = ok && contains(reason, expected);
  } else if (runtime_library_loads()) {
    std::puts("the HIP runtime library loads here: the reason must be the missing GPU");
    ok = ok && contains(reason, "no AMD GPU") && contains(reason, "libamdhip64") && !contains(reason, "could not be loaded");
  } else {
    std::puts("no HIP runtime library here: the reason must say so");
    ok = ok && contains(reason, "HIP runtime library could not be loaded") && contains(reason, "libamdhip64.so.5");
  }
#else
  ok = ok && contains(reason, "built without HIP");
#endif
  ok = throws_unavailable("hip::device(0)", [] { (void)refpool::hip::device(0); }) && ok;
  ok = throws_unavailable("hip::device_count()", [] { (void)refpool::hip::device_count(); }) && ok;
  ok = throws_unavailable("hip::stream()", [] { refpool::hip::stream s; }) && ok;
  ok = throws_unavailable("hip::copy()", [] { refpool::hip::copy(nullptr, nullptr, 0, {}); }) && ok;
  ok = throws_unavailable("hip::retire_stream()", [] { refpool::hip::retire_stream({}); }) && ok;
  return ok ? 0 : 1;
}
