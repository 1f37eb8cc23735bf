// The module calls of one GPU runtime, taken from the library refpool loaded (never a second copy:
// modules must live in the contexts refpool's memory lives in). gpu_modules.cpp is written once over
// this table; gpu_module_calls_cuda.cpp and gpu_module_calls_hip.cpp fill it in where the runtime's
// header was found at build time.
#pragma once

#include <string>
#include <string_view>

#include "gpu_modules.hpp"

namespace refpool::test::gpu_modules::calls {

using status = int;

/// One runtime's calls, each returning the runtime's status code (0 is success).
struct table {
  std::string_view name;  ///< "CUDA", "HIP": the start of messages
  /// Makes `device` current on this thread, `*saved` receiving what restore takes.
  status (*activate)(int device, void** saved);
  status (*restore)(void* saved);
  /// Loads `image` on the current device `device`; `*details` receives a JIT log or why the image
  /// was refused.
  status (*load)(void** module, int device, std::string_view image, std::string* details);
  status (*unload)(void* module);
  status (*function)(void** function, void* module, const char* name);
  status (*launch)(void* function, dims3 grid, dims3 block, unsigned shared_bytes, void* stream, void** args);
  const char* (*error_name)(status);
  const char* (*error_string)(status);
  /// A graph capture on `stream` (relaxed mode, so that no other thread's call is refused), and
  /// its end: the graph is destroyed at once; the status says whether the capture held.
  status (*begin_capture)(void* stream);
  status (*end_capture)(void* stream);
  /// The runtime calls each entry makes, for messages ("cuModuleLoadDataEx").
  std::string_view activate_call, load_call, function_call, launch_call;
};

/// The table of a runtime refpool has loaded (refpool::gpu::detail::available(r) is true). Throws
/// `backend_unavailable` when the loaded library cannot be found or the runtime's header was
/// missing at build time.
const table& cuda();
const table& hip();

}  // namespace refpool::test::gpu_modules::calls
