// A stand-in libamdhip64.so.6 for hip_unavailable_test: it reports the HIP version in
// $REFPOOL_FAKE_HIP_VERSION and has no other entry point, so refpool must say the runtime is too
// old, or name the first entry point it lacks.
#include <cstdlib>

extern "C" __attribute__((visibility("default"))) int hipRuntimeGetVersion(int* version) {
  const char* text = std::getenv("REFPOOL_FAKE_HIP_VERSION");
  *version = text != nullptr ? std::atoi(text) : 0;
  return 0;  // hipSuccess
}
