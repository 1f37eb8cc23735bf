// The application's side of a test against the fake HIP runtime: the fake library refpool loaded,
// HIP calls made directly (as an application that uses HIP itself would), and the fake's record.
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "control.hpp"

namespace fake_hip {

/// The libamdhip64 this process has loaded (refpool loads it at first use).
inline void* library() {
  for (const char* name : {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"})
    if (void* handle = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) return handle;
  throw std::runtime_error("no libamdhip64 is loaded");
}

/// The entry point `name` of the loaded runtime, with type F (e.g. `int(int)` for hipSetDevice).
template <class F>
F* symbol(const char* name) {
  void* entry = dlsym(library(), name);
  if (entry == nullptr) throw std::runtime_error(std::string("the loaded libamdhip64 lacks ") + name);
  return reinterpret_cast<F*>(entry);
}

/// What the fake recorded.
inline const control& fake() { return *symbol<const control*()>("refpool_fake_hip_control")(); }

/// How many of `calls` went to entry point `name` ("hipMalloc").
inline std::size_t count_calls(const std::vector<call>& calls, std::string_view name) {
  return static_cast<std::size_t>(
      std::count_if(calls.begin(), calls.end(), [&](const call& c) { return c.name == name; }));
}

}  // namespace fake_hip
