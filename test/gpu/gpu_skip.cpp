// Linked whole into every GPU test program (whose main is Catch2's, test/catch_main.cpp): before
// main runs, exits 77 (meson's "skipped") when no device of the runtime under test is usable,
// after saying why, so CI without a GPU counts these tests as skipped, not passed. Built once per
// runtime: CUDA, or HIP with REFPOOL_TEST_HIP defined. Not a Catch2 runner of its own, so Catch2's
// implementation is compiled once for all test programs.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime_under_test.hpp"

namespace {

const bool device_checked = [] {
  namespace rt = refpool::test::rt;
  const std::string name(refpool::test::runtime_name);
  if (!rt::available()) {
    std::printf("SKIP: no usable %s device: %s\n", name.c_str(), rt::unavailable_reason().c_str());
    std::fflush(stdout);
    std::exit(77);
  }
  std::printf("%s: %s, driver %d\n", name.c_str(), rt::device_name(0).c_str(), rt::driver_version());
  return true;
}();

}  // namespace
