// Runner of the GPU test programs: exits 77 (meson's "skipped") when no CUDA device is usable,
// after saying why, so CI without a GPU counts these tests as skipped, not passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include <refpool/cuda.hpp>

int main(int argc, char** argv) {
  if (!refpool::cuda::available()) {
    std::printf("SKIP: no usable CUDA device: %s\n", refpool::cuda::unavailable_reason().c_str());
    return 77;
  }
  std::printf("CUDA: %s, driver %d\n", refpool::cuda::device_name(0).c_str(), refpool::cuda::driver_version());
  return Catch::Session().run(argc, argv);
}
