// The libFuzzer entry point (clang, -fsanitize=fuzzer). Prints the operation count at exit, which
// run_bounded.sh reads.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "harness.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit(refpool::test::fuzz::print_totals);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  refpool::test::fuzz::run_input(data, size);
  return 0;
}
