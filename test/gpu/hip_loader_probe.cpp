// Which HIP runtime refpool loads, in a process of its own (the loader runs once per process and
// reads LD_LIBRARY_PATH as the process started), with the fake runtimes Meson puts on that path.
//   --preload NAME        the application loads NAME itself first (dlopen, RTLD_GLOBAL)
//   --expect-version N    refpool's HIP is usable and reports version N
//   --expect-reason TEXT  refpool's HIP is unusable and the reason contains TEXT
//   --exit-with-hip-objects  statics made before refpool loads HIP (so destroyed after the
//                         runtime's own teardown at exit) hold an idle block, a stream and a module
// Always checked: exactly one libamdhip64 is loaded in the end (never a second runtime).
// Prints what it finds; exits 0 when every expectation holds.
#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <refpool/refpool.hpp>

#include "fake_hip/code_object.hpp"
#include "support/gpu_modules.hpp"

namespace {

std::vector<std::string> loaded_runtimes() {
  std::vector<std::string> out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        const std::string path = info->dlpi_name != nullptr ? info->dlpi_name : "";
        if (path.find("libamdhip64") != std::string::npos)
          static_cast<std::vector<std::string>*>(data)->push_back(path);
        return 0;
      },
      &out);
  return out;
}

// Statics constructed before HIP is loaded, filled after: their destructors run after HIP's
// teardown (registered when the library loads), as a program's globals would.
void exit_with_hip_objects() {
  static refpool::alloc_cache cache{refpool::cache_options{}};
  static std::optional<refpool::hip::stream> stream;
  static std::optional<refpool::test::gpu_modules::hip_module> module;
  if (!refpool::hip::available()) return;
  stream.emplace(0);
  const std::string code = fake_hip::make_bundle({{"hipv4-amdgcn-amd-amdhsa--gfx90a", fake_hip::kernels({"fill_u8"})}});
  module.emplace(0, code);
  refpool::scope sc(cache);
  auto block = refpool::allocate(refpool::hip::device(0), 4096, *stream);
  std::puts("at exit: an idle block in a static cache, a static stream and a static module");
}

}  // namespace

int main(int argc, char** argv) {
  bool ok = true;
  const char* expect_version = nullptr;
  const char* expect_reason = nullptr;
  for (int i = 1; i < argc; i += 2) {
    const std::string option = argv[i];
    if (option == "--exit-with-hip-objects") {
      exit_with_hip_objects();
      --i;
    } else if (i + 1 == argc) {
      std::printf("%s needs a value\n", option.c_str());
      return 1;
    } else if (option == "--preload") {
      if (dlopen(argv[i + 1], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
        std::printf("the application could not load %s: %s\n", argv[i + 1], dlerror());
        return 1;
      }
    } else if (option == "--expect-version") {
      expect_version = argv[i + 1];
    } else if (option == "--expect-reason") {
      expect_reason = argv[i + 1];
    } else {
      std::printf("unknown option %s\n", option.c_str());
      return 1;
    }
  }
  const bool available = refpool::hip::available();
  const std::string reason = refpool::hip::unavailable_reason();
  std::printf("available: %s\nreason: %s\n", available ? "yes" : "no", reason.c_str());
  if (available) std::printf("version: %d\n", refpool::hip::runtime_version());
  if (expect_version != nullptr) {
    const bool right = available && refpool::hip::runtime_version() == std::atoi(expect_version);
    std::printf("expected version %s: %s\n", expect_version, right ? "yes" : "NO");
    ok = ok && right;
  }
  if (expect_reason != nullptr) {
    const bool right = !available && reason.find(expect_reason) != std::string::npos;
    std::printf("expected a reason containing \"%s\": %s\n", expect_reason, right ? "yes" : "NO");
    ok = ok && right;
  }
  const auto runtimes = loaded_runtimes();
  for (const auto& path : runtimes) std::printf("loaded: %s\n", path.c_str());
  if (runtimes.size() != 1) {
    std::printf("expected exactly one HIP runtime in the process, found %zu\n", runtimes.size());
    ok = false;
  }
  return ok ? 0 : 1;
}
