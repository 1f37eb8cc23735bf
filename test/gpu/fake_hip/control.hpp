// What the fake HIP runtime (test/gpu/fake_amdhip64.cpp) shows a test about the calls refpool
// made into it. The test finds it with dlsym(..., "refpool_fake_hip_control") in the loaded fake.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace fake_hip {

/// One call into the fake runtime: the entry point, the calling thread's current device when it
/// was made, the object it was about (stream, module, pointer; may be null) and what it returned.
struct call {
  std::string name;
  int device = 0;
  const void* object = nullptr;
  int result = 0;
};

struct control {
  /// Every call since the last clear_calls(), in order.
  std::vector<call> (*calls)();
  void (*clear_calls)();
  /// What the real runtime would have crashed or aborted on (a module call on another device, a
  /// destroyed stream, a call after teardown, ...), one sentence each, in order.
  std::vector<std::string> (*violations)();
  void (*clear_violations)();
  /// Device memory (plain, stream-ordered and physical virtual-memory allocations) in use.
  std::size_t (*device_bytes_in_use)(int device);
  /// Makes the next `count` calls of entry point `name` ("hipMemMap") return `error` (a
  /// hipError_t) and do nothing else; a count of 0 ends it. For failure tests of every call.
  void (*fail_calls)(const char* name, int error, int count);
  /// Runs `hook` on the calling thread at the start of every call of entry point `name`, before
  /// the call looks at the runtime's state (so another thread may change it meanwhile); a null
  /// hook ends it. For tests of what happens between refpool's check and its call.
  void (*before_calls)(const char* name, void (*hook)());
};

}  // namespace fake_hip

extern "C" const fake_hip::control* refpool_fake_hip_control();
