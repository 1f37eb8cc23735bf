// Runner of the GPU test programs: exits 77 (meson's "skipped") when no device of the runtime
// under test is usable, after saying why, so CI without a GPU counts these tests as skipped, not
// passed. Built once per runtime: CUDA, or HIP with REFPOOL_TEST_HIP defined.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#ifdef REFPOOL_TEST_HIP
#include <refpool/hip.hpp>
namespace runtime = refpool::hip;
constexpr const char* runtime_name = "HIP";
#else
#include <refpool/cuda.hpp>
namespace runtime = refpool::cuda;
constexpr const char* runtime_name = "CUDA";
#endif

int main(int argc, char** argv) {
  if (!runtime::available()) {
    std::printf("SKIP: no usable %s device: %s\n", runtime_name, runtime::unavailable_reason().c_str());
    return 77;
  }
  std::printf("%s: %s, driver %d\n", runtime_name, runtime::device_name(0).c_str(), runtime::driver_version());
  return Catch::Session().run(argc, argv);
}
