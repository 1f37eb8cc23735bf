// Runner of the GPU test programs: exits 77 (meson's "skipped") when no device of the runtime
// under test is usable, after saying why, so CI without a GPU counts these tests as skipped, not
// passed. Built once per runtime: CUDA, or HIP with REFPOOL_TEST_HIP defined.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "runtime_under_test.hpp"

int main(int argc, char** argv) {
  namespace rt = gpu_test::rt;
  const std::string name(gpu_test::runtime_name);
  if (!rt::available()) {
    std::printf("SKIP: no usable %s device: %s\n", name.c_str(), rt::unavailable_reason().c_str());
    return 77;
  }
  std::printf("%s: %s, driver %d\n", name.c_str(), rt::device_name(0).c_str(), rt::driver_version());
  return Catch::Session().run(argc, argv);
}
