// Where CUDA cannot be used (no driver, no device, or a build without CUDA), every entry point
// says why with backend_unavailable. Skipped (77) where a GPU is present.
#include <cstdio>
#include <string>

#include <refpool/refpool.hpp>

int main() {
  if (refpool::cuda::available()) {
    std::puts("SKIP: a CUDA device is present");
    return 77;
  }
  const std::string reason = refpool::cuda::unavailable_reason();
  std::printf("reason: %s\n", reason.c_str());
  if (reason.empty()) return 1;
  try {
    (void)refpool::cuda::device(0);
    std::puts("cuda::device(0) did not throw");
    return 1;
  } catch (const refpool::backend_unavailable& e) {
    std::printf("cuda::device(0): %s\n", e.what());
    if (std::string(e.what()).find(reason) == std::string::npos) return 1;
  }
  try {
    refpool::cuda::stream s;
    return 1;
  } catch (const refpool::backend_unavailable&) {
  }
  return 0;
}
